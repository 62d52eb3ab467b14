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
    pub sae: &'a Sae,
    /// The features' ids, in the order their columns are kept.
    pub features: Vec<usize>,
}

impl<'a> FeatureSource<'a> {
    /// A source of `features` (every feature when `None`); an id past the SAE's width is an
    /// error naming it.
    pub fn new(model: &'a Transformer, sae: &'a Sae, features: Option<Vec<usize>>) -> Result<Self, DashboardError> {
        sae.check_model(model)?;
        let d_sae = sae.cfg.d_sae;
        let features = features.unwrap_or_else(|| (0..d_sae).collect());
        if let Some(bad) = features.iter().find(|&&f| f >= d_sae) {
            return Err(DashboardError::Input(format!("feature {bad} does not exist: the SAE has {d_sae} features (0-{})", d_sae - 1)));
        }
        if features.is_empty() {
            return Err(DashboardError::Input("no features were asked for".into()));
        }
        Ok(FeatureSource { model, sae, features })
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
