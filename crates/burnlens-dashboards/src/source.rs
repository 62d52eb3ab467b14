//! Where feature activations come from: the model run over windows (stopping after the last
//! layer read), then an SAE's encoder at its hook, or every layer's transcoder (a per-layer
//! set or a cross-layer transcoder, circuit-tracer's) at its input, for the features asked
//! for, one column each (a few features of a wide SAE or transcoder set
//! are the only ones encoded: the others' columns are never computed).

use burn::tensor::{Int, Tensor, TensorData};
use burnlens_lens::Dictionary;
use burnlens_lens::sae::Sae;
use burnlens_model::Transformer;
use burnlens_trace::TranscoderSet;

use crate::batch::ActBatch;
use crate::dashboard::FeatureKey;
use crate::error::DashboardError;

/// What turns the model's activations into features.
pub enum Encoder {
    /// An SAE, its decoder norms folded into the encoder as SAEDashboard folds them
    /// ([`Dictionary::fold_decoder_norms`](burnlens_lens::Dictionary::fold_decoder_norms)).
    Sae(Sae),
    /// Transcoders, one encoder per layer; their activations are circuit-tracer's (nothing
    /// folded), so they read as the attribution graph's nodes do.
    Transcoders(TranscoderSet),
}

impl Encoder {
    /// Features per layer (all of them for an SAE).
    pub fn per_layer(&self) -> usize {
        match self {
            Encoder::Sae(s) => s.cfg.d_sae,
            Encoder::Transcoders(t) => t.layers[0].d_sae(),
        }
    }

    pub fn n_layers(&self) -> usize {
        match self {
            Encoder::Sae(_) => 1,
            Encoder::Transcoders(t) => t.n_layers(),
        }
    }

    /// The key of column id `flat` (`layer · per_layer + index`).
    pub fn key(&self, flat: usize) -> FeatureKey {
        match self {
            Encoder::Sae(_) => FeatureKey { layer: None, index: flat },
            Encoder::Transcoders(_) => FeatureKey { layer: Some(flat / self.per_layer()), index: flat % self.per_layer() },
        }
    }
}

pub struct FeatureSource<'a> {
    pub model: &'a Transformer,
    pub encoder: Encoder,
    /// Column ids (`layer · per_layer + index`), in the order their columns are kept.
    pub features: Vec<usize>,
    /// Each feature's column in the encoder's output (an SAE cut down to the features asked
    /// for has them in order).
    columns: Vec<usize>,
    /// A few features of wide transcoders: each layer's transcoder cut down to them (in the
    /// order asked for), so a batch encodes and reads back only those columns; empty when
    /// every feature is asked for, or when the rule needs every feature (TopK).
    cut: Vec<Dictionary>,
}

impl<'a> FeatureSource<'a> {
    /// A source of an SAE's `features` (every feature when `None`); an id past the SAE's
    /// width is an error naming it.
    pub fn new(model: &'a Transformer, sae: &Sae, features: Option<Vec<usize>>) -> Result<Self, DashboardError> {
        sae.check_model(model)?;
        // SAEDashboard reads the SAE with its decoder norms folded (`fold_W_dec_norm` before
        // anything else: a feature's activation measured along a unit direction; a TopK SAE
        // that does not rescale its choice is left as it is, SAEDashboard refuses it).
        let mut source = Self::with(model, Encoder::Sae(sae.with_dict(sae.dict.fold_decoder_norms())), features)?;
        // A few features of a wide SAE: encode only those (a TopK SAE needs every feature to
        // choose its k).
        let idx = source.index_tensor(source.features.iter().copied());
        let n = source.features.len();
        if let Encoder::Sae(s) = &mut source.encoder
            && !matches!(s.cfg.architecture, burnlens_lens::Rule::TopK { .. })
            && n < s.cfg.d_sae
        {
            *s = s.with_dict(s.dict.restrict(idx));
            source.columns = (0..n).collect();
        }
        Ok(source)
    }

    /// A source of a transcoder set's features: `features` are indices within each layer
    /// (every feature of every layer when `None`).
    pub fn transcoders(model: &'a Transformer, set: TranscoderSet, features: Option<Vec<usize>>) -> Result<Self, DashboardError> {
        set.check(&model.config).map_err(|e| DashboardError::Input(e.to_string()))?;
        let mut source = Self::with(model, Encoder::Transcoders(set), features)?;
        let d = source.encoder.per_layer();
        let asked: Vec<usize> = source.features.iter().filter(|&&f| f < d).copied().collect();
        if let Encoder::Transcoders(set) = &source.encoder
            && asked.len() < d
            && set.layers.iter().all(|t| !matches!(t.rule, burnlens_lens::Rule::TopK { .. }))
        {
            let idx = source.index_tensor(asked.into_iter());
            source.cut = set.layers.iter().map(|t| t.restrict(idx.clone())).collect();
        }
        Ok(source)
    }

    fn with(model: &'a Transformer, encoder: Encoder, features: Option<Vec<usize>>) -> Result<Self, DashboardError> {
        let d = encoder.per_layer();
        let ids = features.unwrap_or_else(|| (0..d).collect());
        if let Some(bad) = ids.iter().find(|&&f| f >= d) {
            let what = if matches!(encoder, Encoder::Sae(_)) { "the SAE" } else { "each layer's transcoder" };
            return Err(DashboardError::Input(format!("feature {bad} does not exist: {what} has {d} features (0-{})", d - 1)));
        }
        if ids.is_empty() {
            return Err(DashboardError::Input("no features were asked for".into()));
        }
        let features: Vec<usize> = (0..encoder.n_layers()).flat_map(|l| ids.iter().map(move |&i| l * d + i)).collect();
        Ok(FeatureSource { model, encoder, columns: features.clone(), features, cut: Vec::new() })
    }

    /// The activations of `windows` (corpus index of the first: `first_window`), read back.
    pub fn batch(&self, windows: &[Vec<u32>], first_window: u64) -> Result<ActBatch, DashboardError> {
        let inputs = self.inputs(windows)?;
        crate::device_batch::read_back(self.encode(inputs), windows, first_window)
    }

    /// What the encoders read for `windows`, each `[tokens, width]` (one model pass): the
    /// SAE's hook, or every layer's transcoder input.
    pub fn inputs(&self, windows: &[Vec<u32>]) -> Result<Vec<Tensor<2>>, DashboardError> {
        match &self.encoder {
            Encoder::Sae(sae) => Ok(burnlens_lens::hook_pass::hook_activations(self.model, &[sae.hook_point()], windows)?),
            Encoder::Transcoders(set) => {
                let ids = burnlens_lens::hook_pass::window_ids(self.model, windows)?;
                burnlens_trace::layer_inputs(self.model, set, ids).map_err(|e| DashboardError::Input(e.to_string()))
            }
        }
    }

    /// The width of each of [`Self::inputs`].
    pub fn input_widths(&self) -> Vec<usize> {
        match &self.encoder {
            Encoder::Sae(sae) => vec![sae.cfg.d_in],
            Encoder::Transcoders(set) => vec![set.layers[0].d_in(); set.n_layers()],
        }
    }

    /// The features' activations from the encoders' inputs, `[tokens, features]` in the
    /// order of [`Self::features`], on the inputs' device.
    pub fn encode(&self, inputs: Vec<Tensor<2>>) -> Tensor<2> {
        match &self.encoder {
            Encoder::Sae(sae) => {
                let x = inputs.into_iter().next().expect("the SAE's input");
                let f = sae.encode(x);
                let in_order = self.features.len() == sae.cfg.d_sae && self.columns.iter().enumerate().all(|(i, &c)| i == c);
                if in_order { f } else { f.select(1, self.index_tensor(self.columns.iter().copied())) }
            }
            Encoder::Transcoders(set) => {
                // Every layer shows the same features (`Self::with`), in the order asked for.
                let d = self.encoder.per_layer();
                let ids: Vec<usize> = self.features[..self.features.len() / set.n_layers()].to_vec();
                let every = ids.iter().enumerate().all(|(i, &f)| i == f) && ids.len() == d;
                let layers = inputs.into_iter().enumerate().map(|(l, x)| match self.cut.get(l) {
                    // Cut down, the layer's columns are the features asked for, in order.
                    Some(cut) => cut.encode(x),
                    None if every => set.layers[l].encode(x),
                    None => set.layers[l].encode(x).select(1, self.index_tensor(ids.iter().copied())),
                });
                Tensor::cat(layers.collect(), 1)
            }
        }
    }

    fn index_tensor(&self, ids: impl Iterator<Item = usize>) -> Tensor<1, Int> {
        let v: Vec<i64> = ids.map(|i| i as i64).collect();
        let n = v.len();
        Tensor::from_data(TensorData::new(v, [n]), &self.model.device())
    }

    /// Each feature's direction in the residual stream `[features, d_model]`: an SAE's
    /// decoder row carried there from its hook; a transcoder's decoders summed over the
    /// layers they write (its whole direct write to the stream).
    pub fn resid_directions(&self) -> Result<Tensor<2>, DashboardError> {
        match &self.encoder {
            Encoder::Sae(sae) => {
                let w_dec = sae.dict.decoder().clone().select(0, self.index_tensor(self.columns.iter().copied()));
                crate::logits::resid_directions(self.model, sae.hook_point(), w_dec).map_err(DashboardError::Input)
            }
            Encoder::Transcoders(set) => {
                let d = self.encoder.per_layer();
                let rows: Vec<Tensor<2>> = (0..set.n_layers())
                    .filter_map(|l| {
                        let mine: Vec<usize> = self.features.iter().filter(|f| **f / d == l).map(|f| f % d).collect();
                        (!mine.is_empty()).then(|| {
                            let idx = self.index_tensor(mine.into_iter());
                            set.layers[l].w_dec.iter().map(|w| w.clone().select(0, idx.clone())).reduce(|a, b| a + b).expect("a decoder")
                        })
                    })
                    .collect();
                Ok(Tensor::cat(rows, 0))
            }
        }
    }
}
