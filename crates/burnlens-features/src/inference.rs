//! A trained SAE as SAELens saves it for inference (`save_inference_model`): TopK and
//! BatchTopK SAEs trained on rescaled pre-activations get the decoder norms folded into the
//! encoder (`b_enc·‖W_dec‖`, `W_enc·‖W_dec‖`, `W_dec/‖W_dec‖`); BatchTopK SAEs become JumpReLU
//! SAEs whose threshold is the learnt batch threshold; the others are saved as they are.

use burn::tensor::Tensor;
use burnlens_lens::dictionary::{Dictionary, Rule};
use burnlens_lens::sae::{Normalize, Sae, SaeConfig};

use crate::architecture::Architecture;

/// What a trained SAE reads and how it was trained, for its `cfg.json`.
pub struct SaeSite<'a> {
    pub hook_name: &'a str,
    pub model_name: Option<String>,
}

/// The inference SAE of trained parameters `p` (BatchTopK: `topk_threshold` its threshold).
pub fn inference_sae(arch: &Architecture, p: &Dictionary, topk_threshold: f64, site: SaeSite) -> Sae {
    let (d_in, d_sae) = (p.d_in(), p.d_sae());
    let dict = match arch {
        Architecture::Standard { .. } | Architecture::JumpRelu(_) => p.clone(),
        Architecture::TopK(_) => p.fold_decoder_norms(),
        Architecture::BatchTopK { .. } => {
            let mut d = p.fold_decoder_norms();
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
