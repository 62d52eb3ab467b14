//! Where feature activations come from: the model run over windows (stopping after the
//! SAE's layer) and the SAE's encoder on its hook's activations, read back to the host for
//! the features asked for.

use burn::tensor::{Int, Tensor, TensorData};
use burnlens_lens::sae::Sae;
use burnlens_model::Transformer;

use crate::batch::ActBatch;
use crate::error::DashboardError;

pub struct FeatureSource<'a> {
    pub model: &'a Transformer,
    /// The SAE with its decoder norms folded into the encoder ([`fold_decoder_norms`]).
    pub sae: Sae,
    /// The features' ids, in the order their columns are kept.
    pub features: Vec<usize>,
}

impl<'a> FeatureSource<'a> {
    /// A source of `features` (every feature when `None`); an id past the SAE's width is an
    /// error naming it.
    pub fn new(model: &'a Transformer, sae: &Sae, features: Option<Vec<usize>>) -> Result<Self, DashboardError> {
        sae.check_model(model)?;
        let d_sae = sae.cfg.d_sae;
        let features = features.unwrap_or_else(|| (0..d_sae).collect());
        if let Some(bad) = features.iter().find(|&&f| f >= d_sae) {
            return Err(DashboardError::Input(format!("feature {bad} does not exist: the SAE has {d_sae} features (0-{})", d_sae - 1)));
        }
        if features.is_empty() {
            return Err(DashboardError::Input("no features were asked for".into()));
        }
        Ok(FeatureSource { model, sae: fold_decoder_norms(sae), features })
    }

    fn all(&self) -> bool {
        self.features.len() == self.sae.cfg.d_sae && self.features.iter().enumerate().all(|(i, &f)| i == f)
    }

    /// The activations of `windows` (corpus index of the first: `first_window`).
    pub fn batch(&self, windows: &[Vec<u32>], first_window: u64) -> Result<ActBatch, DashboardError> {
        let hook = self.sae.hook_point();
        let x = burnlens_features::pass::pass(self.model, &[hook], windows)?.remove(0);
        let mut f = self.sae.encode(x);
        if !self.all() {
            let idx: Vec<i64> = self.features.iter().map(|&i| i as i64).collect();
            let n = idx.len();
            f = f.select(1, Tensor::<1, Int>::from_data(TensorData::new(idx, [n]), &self.model.device()));
        }
        let acts = f.into_data().try_to_vec::<f32>().map_err(|e| DashboardError::Input(format!("feature activations: {e:?}")))?;
        Ok(ActBatch { acts, n_features: self.features.len(), tokens: windows.concat(), seq_len: windows[0].len(), first_window })
    }
}

/// The SAE SAEDashboard reads (`fold_W_dec_norm` before anything else): each decoder row
/// scaled to norm 1 and the encoder column, bias and threshold scaled up by the norm, so a
/// feature's activation is measured along a unit direction. A TopK SAE that does not rescale
/// its selection by the decoder norms is left as it is (folding would change what it
/// selects; SAEDashboard refuses it).
pub fn fold_decoder_norms(sae: &Sae) -> Sae {
    use burnlens_lens::sae::Architecture;
    let mut s = sae.clone();
    if matches!(s.cfg.architecture, Architecture::TopK { rescale_acts_by_decoder_norm: false, .. }) {
        return s;
    }
    let n = s.cfg.d_sae;
    let norms = s.w_dec.clone().powf_scalar(2.0).sum_dim(1).sqrt().clamp_min(1e-8).reshape([n]);
    s.w_dec = s.w_dec / norms.clone().reshape([n, 1]);
    s.w_enc = s.w_enc * norms.clone().reshape([1, n]);
    s.b_enc = s.b_enc * norms.clone();
    s.threshold = s.threshold.map(|t| t * norms);
    s
}
