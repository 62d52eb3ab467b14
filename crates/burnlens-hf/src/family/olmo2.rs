//! OLMo 2 (`Olmo2Config`, `Olmo2ForCausalLM`): Llama's shape with the norms after attention
//! and after the MLP instead of before (`post_attention_layernorm`,
//! `post_feedforward_layernorm`; as in TransformerLens they are `ln1` and `ln2`), and
//! QK-norm over the whole query and key projections.

use burnlens_model::{NormPlacement, QkNorm, TransformerConfig};
use serde_json::{Value, json};

use super::llama::{Defaults, fresh_common, json_common, parse_common, tensors_common};
use super::spec::{FamilySpec, FreshShape, Names};
use crate::error::Result;
use crate::fields::Fields;
use crate::layout::{Placement, Tensors};

pub struct Olmo2;

const DEFAULTS: Defaults = Defaults {
    hidden_size: 4096,
    heads: 32,
    layers: 32,
    intermediate: 11008,
    vocab: 50304,
    positions: 2048,
    eps: 1e-5,
    rope_theta: 10000.0,
    tie: false,
    head_dim: None,
};

impl FamilySpec for Olmo2 {
    fn names(&self) -> Names {
        Names { model_type: "olmo2", architecture: "Olmo2ForCausalLM", base_prefix: "model.", embed_name: "embed_tokens.weight" }
    }

    fn parse(&self, f: &Fields) -> Result<TransformerConfig> {
        let mut cfg = parse_common(f, DEFAULTS)?;
        let bias = f.bool("attention_bias", false)?;
        (cfg.qkv_bias, cfg.attn_out_bias) = (bias, bias);
        cfg.qk_norm = Some(QkNorm::Whole);
        cfg.norm_placement = NormPlacement::Post;
        Ok(cfg)
    }

    fn tensors(&self, cfg: &TransformerConfig, t: &mut Tensors) {
        let (q, k) = (cfg.n_heads * cfg.d_head, cfg.kv_heads() * cfg.d_head);
        tensors_common(cfg, t, |t, h, b| {
            t.norm(&format!("{h}.post_attention_layernorm"), &format!("{b}.ln1"));
            t.norm(&format!("{h}.post_feedforward_layernorm"), &format!("{b}.ln2"));
            t.norm_of_width(&format!("{h}.self_attn.q_norm"), &format!("{b}.attn.q_norm"), q, Placement::Same);
            t.norm_of_width(&format!("{h}.self_attn.k_norm"), &format!("{b}.attn.k_norm"), k, Placement::Same);
        });
    }

    fn config_json(&self, cfg: &TransformerConfig) -> std::result::Result<Value, String> {
        let mut v = json_common(cfg, "olmo2")?;
        if cfg.qk_norm != Some(QkNorm::Whole) || cfg.norm_placement != NormPlacement::Post {
            return Err("OLMo 2 has norms after attention and the MLP and a QK-norm over the whole projections".into());
        }
        if cfg.qkv_bias != cfg.attn_out_bias {
            return Err("OLMo 2's biases are q/k/v and output together (attention_bias)".into());
        }
        if super::spec::one_window(cfg)?.is_some() {
            return Err("OLMo 2 has no sliding window".into());
        }
        v["attention_bias"] = json!(cfg.qkv_bias);
        Ok(v)
    }

    fn fresh(&self, s: &FreshShape) -> TransformerConfig {
        TransformerConfig { qk_norm: Some(QkNorm::Whole), norm_placement: NormPlacement::Post, ..fresh_common(s) }
    }
}
