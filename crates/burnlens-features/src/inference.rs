//! A trained SAE as SAELens saves it for inference (`save_inference_model`): TopK and
//! BatchTopK SAEs trained on rescaled pre-activations get the decoder norms folded into the
//! encoder (`b_enc·‖W_dec‖`, `W_enc·‖W_dec‖`, `W_dec/‖W_dec‖`); BatchTopK SAEs become JumpReLU
//! SAEs whose threshold is the learnt batch threshold; the others are saved as they are.

use burn::tensor::Tensor;
use burnlens_lens::dictionary::{Dictionary, Rule};
use burnlens_lens::sae::{Normalize, Sae, SaeConfig};

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
    let (d_in, d_sae) = p.dims();
    let trained = |rule: Rule, threshold: Option<Tensor<1>>| Dictionary {
        w_enc: p.w_enc.clone(),
        b_enc: p.b_enc.clone(),
        w_dec: vec![p.w_dec.clone()],
        b_dec: p.b_dec.clone(),
        threshold,
        w_skip: None,
        rule,
        // Transcoders take no b_dec from their input (their b_dec is the output's).
        subtract_b_dec: !site.transcoder,
    };
    let dict = match arch {
        Architecture::Standard { .. } => trained(Rule::Relu, None),
        Architecture::JumpRelu(_) => trained(Rule::JUMP_RELU, p.threshold.clone()),
        // Folding turns a choice on rescaled pre-activations into a plain one.
        Architecture::TopK(t) => trained(Rule::top_k(t.k as usize, t.rescale_acts_by_decoder_norm), None).fold_decoder_norms(),
        Architecture::BatchTopK { topk: t, .. } => {
            // The batch threshold was learnt on the rescaled scores, which the folded
            // pre-activations equal: it is set after the fold, unscaled (as SAELens does).
            let mut d = trained(Rule::top_k(t.k as usize, t.rescale_acts_by_decoder_norm), None).fold_decoder_norms();
            d.rule = Rule::JUMP_RELU;
            d.threshold = Some(Tensor::<1>::full([d_sae], topk_threshold as f32, &p.b_enc.device()));
            d
        }
    };
    let cfg = SaeConfig {
        d_in,
        d_sae,
        architecture: dict.rule,
        apply_b_dec_to_input: dict.subtract_b_dec,
        normalize_activations: Normalize::None,
        hook_name: site.hook_name.to_string(),
        reshape_hook_z: site.hook_name.ends_with("hook_z"),
        model_name: site.model_name,
    };
    Sae::new(cfg, dict)
}
