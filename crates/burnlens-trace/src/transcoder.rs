//! Transcoders: a sparse, wider stand-in for each MLP that reads the MLP's input and predicts
//! its output, `out ≈ act(x W_encᵀ + b_enc) W_dec + b_dec (+ skip)`.
//!
//! A per-layer transcoder (PLT) writes only its own layer's MLP output; a cross-layer
//! transcoder (CLT) has one decoder for its own layer and one for every later layer, and a
//! layer's MLP output is predicted by the features of that layer and all earlier ones.
//! Weights keep circuit-tracer's orientation: `W_enc [features, d_model]`, each decoder
//! `[features, d_model]`. The skip connection is kept as the matrix `M` of `skip = x · M`
//! (a PLT file's `W_skip` is applied as `x · W_skipᵀ`, so `M = W_skipᵀ`; a CLT's as
//! `x · W_skip`).

use burn::tensor::{Device, Tensor, TensorData};

use crate::TraceError;

/// Where a transcoder reads the MLP's input, by the name circuit-tracer's config uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputHook {
    /// `hook_resid_mid`: the residual stream before the MLP's norm.
    ResidMid,
    /// `ln2.hook_normalized` as TransformerLens 2 defines it: a LayerNorm's output after its
    /// gain and bias, an RMSNorm's before its gain.
    Ln2Normalized,
    /// `mlp.hook_in`: what the MLP reads (the norm's output, gain applied).
    MlpIn,
}

/// Where a transcoder's prediction is compared with the MLP, and its features write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputHook {
    /// `hook_mlp_out`: what the MLP adds to the residual stream (after Gemma's post-norm).
    MlpOut,
    /// `mlp.hook_out`: the MLP's own output, before any norm that follows it.
    MlpHookOut,
}

impl InputHook {
    /// Every name [`parse`](Self::parse) accepts.
    pub const NAMES: &'static str = "hook_resid_mid, ln2.hook_normalized, mlp.hook_in";

    pub fn parse(name: &str) -> Result<Self, TraceError> {
        match name {
            "hook_resid_mid" => Ok(InputHook::ResidMid),
            "ln2.hook_normalized" => Ok(InputHook::Ln2Normalized),
            "mlp.hook_in" => Ok(InputHook::MlpIn),
            other => Err(TraceError::Input(format!("feature_input_hook `{other}` is not one of {}", Self::NAMES))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            InputHook::ResidMid => "hook_resid_mid",
            InputHook::Ln2Normalized => "ln2.hook_normalized",
            InputHook::MlpIn => "mlp.hook_in",
        }
    }
}

impl OutputHook {
    /// Every name [`parse`](Self::parse) accepts.
    pub const NAMES: &'static str = "hook_mlp_out, mlp.hook_out";

    pub fn parse(name: &str) -> Result<Self, TraceError> {
        match name {
            "hook_mlp_out" => Ok(OutputHook::MlpOut),
            "mlp.hook_out" => Ok(OutputHook::MlpHookOut),
            other => Err(TraceError::Input(format!("feature_output_hook `{other}` is not one of {}", Self::NAMES))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            OutputHook::MlpOut => "hook_mlp_out",
            OutputHook::MlpHookOut => "mlp.hook_out",
        }
    }
}

/// The sparsifying non-linearity of the features.
#[derive(Debug, Clone, PartialEq)]
pub enum FeatureActivation {
    Relu,
    /// `x · [x > θ]`, one threshold per feature.
    JumpRelu {
        threshold: Vec<f32>,
    },
    /// The `k` largest pre-activations of each position kept, the rest zero.
    TopK {
        k: usize,
    },
}

impl FeatureActivation {
    /// Apply to one position's pre-activations in place.
    pub fn apply(&self, pre: &mut [f32]) {
        match self {
            FeatureActivation::Relu => pre.iter_mut().for_each(|x| *x = x.max(0.0)),
            FeatureActivation::JumpRelu { threshold } => {
                for (x, t) in pre.iter_mut().zip(threshold) {
                    if !(*x > *t) {
                        *x = 0.0;
                    }
                }
            }
            FeatureActivation::TopK { k } => {
                if *k >= pre.len() {
                    return;
                }
                let mut order: Vec<usize> = (0..pre.len()).collect();
                order.select_nth_unstable_by(*k, |&a, &b| pre[b].total_cmp(&pre[a]));
                for &i in &order[*k..] {
                    pre[i] = 0.0;
                }
            }
        }
    }
}

/// One layer's transcoder.
#[derive(Debug, Clone)]
pub struct Transcoder {
    /// `[features, d_model]`
    pub w_enc: Tensor<2>,
    /// `[features]`
    pub b_enc: Tensor<1>,
    /// Decoders `[features, d_model]`: `w_dec[k]` writes layer `l + k` (one for a PLT).
    pub w_dec: Vec<Tensor<2>>,
    /// `[d_model]`, added to this layer's reconstruction.
    pub b_dec: Tensor<1>,
    /// `M [d_model, d_model]` of `skip = x · M` for this layer's input and output.
    pub w_skip: Option<Tensor<2>>,
    pub activation: FeatureActivation,
}

impl Transcoder {
    pub fn n_features(&self) -> usize {
        self.w_enc.dims()[0]
    }

    pub fn d_model(&self) -> usize {
        self.w_enc.dims()[1]
    }

    /// Feature activations `[pos, features]` of the inputs `x: [pos, d_model]`, on the host.
    pub fn activations(&self, x: Tensor<2>) -> Vec<f32> {
        let f = self.n_features();
        let pre = x.matmul(self.w_enc.clone().transpose()) + self.b_enc.clone().reshape([1, f]);
        let mut v: Vec<f32> = pre.into_data().try_into_vec_as::<f32>().expect("f32");
        v.chunks_mut(f).for_each(|row| self.activation.apply(row));
        v
    }

    /// The skip term `x · M` `[pos, d_model]`, if the transcoder has one.
    pub fn skip(&self, x: Tensor<2>) -> Option<Tensor<2>> {
        self.w_skip.as_ref().map(|w| x.matmul(w.clone()))
    }
}

/// One transcoder per layer, and where they read and write.
#[derive(Debug, Clone)]
pub struct TranscoderSet {
    pub layers: Vec<Transcoder>,
    pub input: InputHook,
    pub output: OutputHook,
    /// The name of the set on Neuronpedia (circuit-tracer's `scan`), if given.
    pub scan: Option<String>,
    /// Whether features write to later layers too (a cross-layer transcoder).
    pub cross_layer: bool,
}

impl TranscoderSet {
    pub fn n_layers(&self) -> usize {
        self.layers.len()
    }

    /// Whether the transcoders have skip connections (all or none do).
    pub fn has_skip(&self) -> bool {
        self.layers.first().is_some_and(|t| t.w_skip.is_some())
    }
}

/// A host tensor of any rank as a [`Tensor`] of rank `D` on `device`.
pub(crate) fn tensor<const D: usize>(values: Vec<f32>, shape: [usize; D], device: &Device) -> Tensor<D> {
    Tensor::from_data(TensorData::new(values, shape), device)
}
