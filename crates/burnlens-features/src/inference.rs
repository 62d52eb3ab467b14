//! A trained SAE as SAELens saves it for inference (`save_inference_model`): TopK and
//! BatchTopK SAEs trained on rescaled pre-activations get the decoder norms folded into the
//! encoder (`b_enc·‖W_dec‖`, `W_enc·‖W_dec‖`, `W_dec/‖W_dec‖`); BatchTopK SAEs become JumpReLU
//! SAEs whose threshold is the learnt batch threshold; the others are saved as they are.

use burn::tensor::Tensor;
use burnlens_lens::sae::{Architecture as Inference, Normalize, Sae, SaeConfig};

use crate::architecture::Architecture;
use crate::params::SaeParams;

/// What a trained SAE reads and how it was trained, for its `cfg.json`.
pub struct SaeSite<'a> {
    pub hook_name: &'a str,
    pub model_name: Option<String>,
    /// A transcoder (its input is not offset by `b_dec`).
    pub transcoder: bool,
}

/// The inference SAE of trained parameters `p` (BatchTopK: `topk_threshold` its threshold).
pub fn inference_sae(arch: &Architecture, p: &SaeParams, topk_threshold: f64, site: SaeSite) -> Sae {
    let is_transcoder = site.transcoder;
    let (d_in, d_sae) = p.dims();
    let mut p = p.clone();
    if arch.topk().is_some_and(|t| t.rescale_acts_by_decoder_norm) {
        let norms = p.decoder_norms();
        p.b_enc = p.b_enc * norms.clone();
        p.w_dec = p.w_dec / norms.clone().reshape([d_sae, 1]);
        p.w_enc = p.w_enc * norms.reshape([1, d_sae]);
    }
    let (architecture, threshold) = match arch {
        Architecture::Standard { .. } => (Inference::Standard, None),
        Architecture::TopK(t) => (Inference::TopK { k: t.k as usize, rescale_acts_by_decoder_norm: false }, None),
        Architecture::BatchTopK { .. } => (Inference::JumpRelu, Some(Tensor::<1>::full([d_sae], topk_threshold as f32, &p.b_enc.device()))),
        Architecture::JumpRelu(_) => (Inference::JumpRelu, p.threshold.clone()),
    };
    let cfg = SaeConfig {
        d_in,
        d_sae,
        architecture,
        // Transcoders take no b_dec from their input (their b_dec is the output's).
        apply_b_dec_to_input: !is_transcoder,
        normalize_activations: Normalize::None,
        hook_name: site.hook_name.to_string(),
        reshape_hook_z: site.hook_name.ends_with("hook_z"),
        model_name: site.model_name,
    };
    Sae { cfg, w_enc: p.w_enc, b_enc: p.b_enc, w_dec: p.w_dec, b_dec: p.b_dec, threshold }
}
