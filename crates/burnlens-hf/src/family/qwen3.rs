//! Qwen3 (`Qwen3Config`, `Qwen3ForCausalLM`): Llama's shape with QK-norm (an RMSNorm over
//! each head's query and key, before rotary), `head_dim` independent of `hidden_size /
//! num_attention_heads`, q/k/v/o biases together (`attention_bias`) and an optional sliding
//! window from `max_window_layers` on.

use burnlens_model::{AttentionSpan, QkNorm, TransformerConfig};
use serde_json::{Value, json};

use super::llama::{Defaults, fresh_common, json_common, layer_types, parse_common, tensors_common};
use super::spec::{FamilySpec, FreshShape, Names};
use crate::error::Result;
use crate::fields::Fields;
use crate::layout::{Placement, Tensors};

pub struct Qwen3;

const DEFAULTS: Defaults = Defaults {
    hidden_size: 4096,
    heads: 32,
    layers: 32,
    intermediate: 22016,
    vocab: 151936,
    positions: 32768,
    eps: 1e-6,
    rope_theta: 10000.0,
    tie: false,
    head_dim: Some(128),
};

impl FamilySpec for Qwen3 {
    fn names(&self) -> Names {
        Names { model_type: "qwen3", architecture: "Qwen3ForCausalLM", base_prefix: "model.", embed_name: "embed_tokens.weight" }
    }

    fn parse(&self, f: &Fields) -> Result<TransformerConfig> {
        let mut cfg = parse_common(f, DEFAULTS)?;
        let bias = f.bool("attention_bias", false)?;
        (cfg.qkv_bias, cfg.attn_out_bias) = (bias, bias);
        cfg.qk_norm = Some(QkNorm::PerHead);
        // transformers: the window only counts with use_sliding_window.
        let window = if f.bool("use_sliding_window", false)? { Some(f.size(&["sliding_window"], 4096)?) } else { None };
        cfg.spans = match f.get("layer_types") {
            Some(_) => layer_types(f, cfg.n_layers(), window)?,
            None => {
                let from = f.count(&["max_window_layers"], 28)?;
                (0..cfg.n_layers())
                    .map(|l| match window {
                        Some(w) if l >= from => AttentionSpan::Local(w),
                        _ => AttentionSpan::Global,
                    })
                    .collect()
            }
        };
        Ok(cfg)
    }

    fn tensors(&self, cfg: &TransformerConfig, t: &mut Tensors) {
        let dh = cfg.d_head;
        tensors_common(cfg, t, |t, h, b| {
            t.norm(&format!("{h}.input_layernorm"), &format!("{b}.ln1"));
            t.norm(&format!("{h}.post_attention_layernorm"), &format!("{b}.ln2"));
            t.norm_of_width(&format!("{h}.self_attn.q_norm"), &format!("{b}.attn.q_norm"), dh, Placement::Same);
            t.norm_of_width(&format!("{h}.self_attn.k_norm"), &format!("{b}.attn.k_norm"), dh, Placement::Same);
        });
    }

    fn config_json(&self, cfg: &TransformerConfig) -> std::result::Result<Value, String> {
        let mut v = json_common(cfg, "qwen3")?;
        if cfg.qk_norm != Some(QkNorm::PerHead) {
            return Err("Qwen3 has a per-head QK-norm".into());
        }
        if cfg.qkv_bias != cfg.attn_out_bias {
            return Err("Qwen3's biases are q/k/v and output together (attention_bias)".into());
        }
        let window = super::spec::one_window(cfg)?;
        v["attention_bias"] = json!(cfg.qkv_bias);
        v["layer_types"] = super::spec::layer_types(cfg);
        v["use_sliding_window"] = json!(window.is_some());
        v["sliding_window"] = json!(window);
        v["max_window_layers"] = json!(cfg.spans.iter().position(|s| matches!(s, AttentionSpan::Local(_))).unwrap_or(cfg.n_layers()));
        Ok(v)
    }

    fn fresh(&self, s: &FreshShape) -> TransformerConfig {
        TransformerConfig { qk_norm: Some(QkNorm::PerHead), ..fresh_common(s) }
    }
}
