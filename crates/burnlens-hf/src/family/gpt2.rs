//! GPT-2 (`GPT2Config`, `GPT2LMHeadModel`): learned positions, LayerNorm, `Conv1D` weights
//! already `[in, out]`, Q, K and V fused in `c_attn`, tied unembedding.

use burnlens_model::{AttentionSpan, MlpKind, NormKind, Positional, ScoreScale, TransformerConfig};
use serde_json::{Value, json};

use super::spec::{FamilySpec, FreshShape, Names};
use crate::error::Result;
use crate::fields::{Fields, activation, head_dim};
use crate::layout::{Placement, Tensors};

pub struct Gpt2;

impl FamilySpec for Gpt2 {
    fn names(&self) -> Names {
        Names { model_type: "gpt2", architecture: "GPT2LMHeadModel", base_prefix: "transformer.", embed_name: "wte.weight" }
    }

    fn parse(&self, f: &Fields) -> Result<TransformerConfig> {
        let d_model = f.size(&["n_embd"], 768)?;
        let n_heads = f.size(&["n_head"], 12)?;
        let n_layers = f.layers(&["n_layer"], 12)?;
        if f.bool("add_cross_attention", false)? {
            return Err(f.err("add_cross_attention", "is true; burnlens supports decoder-only GPT-2 without cross-attention"));
        }
        Ok(TransformerConfig {
            vocab_size: f.size(&["vocab_size"], 50257)?,
            n_ctx: f.size(&["n_positions", "n_ctx"], 1024)?,
            d_model,
            n_heads,
            d_head: head_dim(f, d_model, n_heads, "n_embd", "n_head")?,
            d_mlp: Some(f.opt_size(&["n_inner"])?.unwrap_or(4 * d_model)),
            spans: vec![AttentionSpan::Global; n_layers],
            score_scale: if f.bool("scale_attn_weights", true)? { ScoreScale::InvSqrtDHead } else { ScoreScale::None },
            scale_by_inverse_layer: f.bool("scale_attn_by_inverse_layer_idx", false)?,
            activation: activation(f)?,
            layer_norm_eps: f.float("layer_norm_epsilon", 1e-5)?,
            ..TransformerConfig::gpt2_like(1, 1, 1, 1, 1)
        })
    }

    fn tensors(&self, cfg: &TransformerConfig, t: &mut Tensors) {
        use Placement::Same;
        let (d, hd, m) = (cfg.d_model, cfg.n_heads * cfg.d_head, cfg.d_mlp.unwrap_or(4 * cfg.d_model));
        classic_embeddings(cfg, t);
        for l in 0..cfg.n_layers() {
            let (h, b) = (format!("h.{l}"), format!("blocks.{l}"));
            t.norm(&format!("{h}.ln_1"), &format!("{b}.ln1"));
            t.norm(&format!("{h}.ln_2"), &format!("{b}.ln2"));
            t.add(format!("{h}.attn.c_attn.weight"), vec![d, 3 * hd], format!("{b}.attn.qkv.weight"), Same);
            t.add(format!("{h}.attn.c_attn.bias"), vec![3 * hd], format!("{b}.attn.qkv.bias"), Same);
            t.add(format!("{h}.attn.c_proj.weight"), vec![hd, d], format!("{b}.attn.out.weight"), Same);
            t.add(format!("{h}.attn.c_proj.bias"), vec![d], format!("{b}.attn.out.bias"), Same);
            t.add(format!("{h}.mlp.c_fc.weight"), vec![d, m], format!("{b}.mlp.fc_in.weight"), Same);
            t.add(format!("{h}.mlp.c_proj.weight"), vec![m, d], format!("{b}.mlp.fc_out.weight"), Same);
            t.add(format!("{h}.mlp.c_fc.bias"), vec![m], format!("{b}.mlp.fc_in.bias"), Same);
            t.add(format!("{h}.mlp.c_proj.bias"), vec![d], format!("{b}.mlp.fc_out.bias"), Same);
        }
        t.norm("ln_f", "ln_final");
    }

    fn config_json(&self, cfg: &TransformerConfig) -> std::result::Result<Value, String> {
        classic_rules(cfg, "GPT-2")?;
        if cfg.spans.iter().any(|s| *s != AttentionSpan::Global) {
            return Err("GPT-2 has only global attention layers".into());
        }
        if !cfg.qkv_bias {
            return Err("GPT-2 has q/k/v biases".into());
        }
        Ok(json!({
            "n_positions": cfg.n_ctx,
            "n_ctx": cfg.n_ctx,
            "n_embd": cfg.d_model,
            "n_layer": cfg.n_layers(),
            "n_head": cfg.n_heads,
            "n_inner": cfg.d_mlp,
            "activation_function": cfg.activation.hf_name(),
            "layer_norm_epsilon": cfg.layer_norm_eps,
            "scale_attn_weights": cfg.score_scale == ScoreScale::InvSqrtDHead,
            "scale_attn_by_inverse_layer_idx": cfg.scale_by_inverse_layer,
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "attn_pdrop": 0.0,
        }))
    }

    fn fresh(&self, s: &FreshShape) -> TransformerConfig {
        TransformerConfig::gpt2_like(s.vocab, s.n_ctx, s.d_model, s.n_layers, s.n_heads)
    }
}

/// GPT-2's and GPT-Neo's token and learned position embeddings (`wte`, `wpe`).
pub(super) fn classic_embeddings(cfg: &TransformerConfig, t: &mut Tensors) {
    t.add("wte.weight".into(), vec![cfg.vocab_size, cfg.d_model], "embed.weight".into(), Placement::Same);
    t.add("wpe.weight".into(), vec![cfg.n_ctx, cfg.d_model], "pos_embed.weight".into(), Placement::Same);
}

/// What GPT-2 and GPT-Neo share and Hugging Face cannot express otherwise: learned
/// positions, LayerNorm, a plain MLP with biases, sequential residuals, tied unembedding.
pub(super) fn classic_rules(cfg: &TransformerConfig, name: &str) -> std::result::Result<(), String> {
    if cfg.untied_unembed {
        return Err(format!("the unembedding is untied (its own W_U); Hugging Face {name} ties it to the embedding"));
    }
    if cfg.positional != Positional::Residual
        || cfg.norm != NormKind::LayerNorm
        || cfg.mlp != MlpKind::Standard
        || cfg.parallel_residual
        || cfg.kv_heads() != cfg.n_heads
    {
        return Err(format!("{name} has learned positions, LayerNorm, a plain MLP, sequential residuals and one key/value head per query head"));
    }
    if !cfg.attn_out_bias || !cfg.mlp_bias {
        return Err(format!("{name} has output and MLP biases"));
    }
    if cfg.n_heads * cfg.d_head != cfg.d_model {
        return Err(format!("n_heads * d_head = {} must equal d_model = {}", cfg.n_heads * cfg.d_head, cfg.d_model));
    }
    Ok(())
}
