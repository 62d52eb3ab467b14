//! Phi-3 (`Phi3Config`, `Phi3ForCausalLM`): Llama's shape with Q, K and V fused in one
//! `qkv_proj` (rows Q | K | V, the canonical layout transposed) and the gated MLP's gate and
//! up projections fused in `gate_up_proj` (gate rows first), an optional sliding window on
//! every layer, and partial rotary. Rope scaling types other than default, linear and
//! llama3 (Phi-3's `longrope`, `su`, `yarn`) are refused by name.

use burnlens_model::{AttentionSpan, TransformerConfig};
use serde_json::{Value, json};

use super::llama::{Defaults, fresh_common, json_common, parse_common};
use super::spec::{FamilySpec, FreshShape, Names};
use crate::error::Result;
use crate::fields::Fields;
use crate::layout::{Placement, Tensors};

pub struct Phi3;

const DEFAULTS: Defaults = Defaults {
    hidden_size: 3072,
    heads: 32,
    layers: 32,
    intermediate: 8192,
    vocab: 32064,
    positions: 4096,
    eps: 1e-5,
    rope_theta: 10000.0,
    tie: false,
    head_dim: None,
};

impl FamilySpec for Phi3 {
    fn names(&self) -> Names {
        Names { model_type: "phi3", architecture: "Phi3ForCausalLM", base_prefix: "model.", embed_name: "embed_tokens.weight" }
    }

    fn parse(&self, f: &Fields) -> Result<TransformerConfig> {
        if f.get("head_dim").is_some() {
            return Err(f.err("head_dim", "is set; Phi-3's heads are hidden_size / num_attention_heads wide"));
        }
        let mut cfg = parse_common(f, DEFAULTS)?;
        if let Some(w) = f.opt_size(&["sliding_window"])? {
            cfg.spans = vec![AttentionSpan::Local(w); cfg.n_layers()];
        }
        Ok(cfg)
    }

    fn tensors(&self, cfg: &TransformerConfig, t: &mut Tensors) {
        let (d, hd, m) = (cfg.d_model, cfg.n_heads * cfg.d_head, cfg.d_mlp.unwrap_or(4 * cfg.d_model));
        t.add("embed_tokens.weight".into(), vec![cfg.vocab_size, d], "embed.weight".into(), Placement::Same);
        for l in 0..cfg.n_layers() {
            let (h, b) = (format!("layers.{l}"), format!("blocks.{l}"));
            t.norm(&format!("{h}.input_layernorm"), &format!("{b}.ln1"));
            t.norm(&format!("{h}.post_attention_layernorm"), &format!("{b}.ln2"));
            t.add(format!("{h}.self_attn.qkv_proj.weight"), vec![cfg.qkv_width(), d], format!("{b}.attn.qkv.weight"), Placement::Transposed);
            t.linear(&format!("{h}.self_attn.o_proj"), &format!("{b}.attn.out"), hd, d, false);
            let gate_up = format!("{h}.mlp.gate_up_proj.weight");
            t.add(gate_up.clone(), vec![2 * m, d], format!("{b}.mlp.fc_gate.weight"), Placement::Rows { start: 0, rows: m });
            t.add(gate_up, vec![2 * m, d], format!("{b}.mlp.fc_in.weight"), Placement::Rows { start: m, rows: m });
            t.linear(&format!("{h}.mlp.down_proj"), &format!("{b}.mlp.fc_out"), m, d, false);
        }
        t.norm("norm", "ln_final");
        t.unembed("lm_head");
    }

    fn config_json(&self, cfg: &TransformerConfig) -> std::result::Result<Value, String> {
        let mut v = json_common(cfg, "phi3")?;
        if cfg.qkv_bias || cfg.attn_out_bias || cfg.mlp_bias {
            return Err("Phi-3 has no biases".into());
        }
        if cfg.n_heads * cfg.d_head != cfg.d_model {
            return Err(format!(
                "Phi-3's heads are d_model / n_heads wide; n_heads * d_head = {} differs from d_model = {}",
                cfg.n_heads * cfg.d_head,
                cfg.d_model
            ));
        }
        let window = super::spec::one_window(cfg)?;
        if window.is_some() && cfg.spans.contains(&AttentionSpan::Global) {
            return Err("Phi-3 slides its window over every layer or none".into());
        }
        let o = v.as_object_mut().expect("object");
        o.remove("head_dim");
        o.insert("sliding_window".into(), json!(window));
        o.insert("original_max_position_embeddings".into(), json!(cfg.n_ctx));
        Ok(v)
    }

    fn fresh(&self, s: &FreshShape) -> TransformerConfig {
        fresh_common(s)
    }
}
