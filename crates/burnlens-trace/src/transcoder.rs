//! Transcoders: a sparse, wider stand-in for each MLP that reads the MLP's input and predicts
//! its output, `out ≈ act(x W_encᵀ + b_enc) W_dec + b_dec (+ skip)`.
//!
//! A per-layer transcoder (PLT) writes only its own layer's MLP output; a cross-layer
//! transcoder (CLT) has one decoder for its own layer and one for every later layer, and a
//! layer's MLP output is predicted by the features of that layer and all earlier ones.
//! Each layer's transcoder is a [`Dictionary`] (burnlens-lens's one sparse dictionary):
//! `W_enc [d_model, features]` (circuit-tracer's `[features, d_model]` transposed at load),
//! each decoder `[features, d_model]`, circuit-tracer's rules (ReLU, JumpReLU and TopK
//! keeping the chosen values' signs). The skip connection is the matrix `M` of `skip = x · M`
//! (a PLT file's `W_skip` is applied as `x · W_skipᵀ`, so `M = W_skipᵀ`; a CLT's as
//! `x · W_skip`).

use burn::tensor::{Device, Int, Tensor, TensorData};
use burnlens_lens::dictionary::Dictionary;

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

/// One transcoder per layer, and where they read and write.
#[derive(Debug, Clone)]
pub struct TranscoderSet {
    pub layers: Vec<Dictionary>,
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

/// Host indices as a [`Tensor`] of rank 1 on `device` (for `select`).
pub(crate) fn indices(values: Vec<i64>, device: &Device) -> Tensor<1, Int> {
    let n = values.len();
    Tensor::from_data(TensorData::new(values, [n]), device)
}

/// The feature activations `[pos, features]` of a layer's transcoder on inputs
/// `x: [pos, d_model]`, read back to the host.
pub(crate) fn host_activations(t: &Dictionary, x: Tensor<2>) -> Vec<f32> {
    t.encode(x).into_data().try_into_vec_as::<f32>().expect("f32")
}
