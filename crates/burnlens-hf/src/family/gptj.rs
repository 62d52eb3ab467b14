//! GPT-J (`GPTJConfig`, `GPTJForCausalLM`): rotary on the first `rotary_dim` dimensions of
//! each head in the interleaved ("rotate every two") form, attention and MLP in parallel
//! from one LayerNorm (`ln_1`), no q/k/v/o biases, MLP biases, an untied `lm_head` with a
//! bias.

use burnlens_model::{AttentionSpan, MlpKind, NormKind, Positional, Rotary, ScoreScale, TransformerConfig};
use serde_json::{Value, json};

use super::spec::{FamilySpec, FreshShape, Names};
use crate::error::Result;
use crate::fields::{Fields, activation, head_dim};
use crate::layout::{Placement, Tensors};

pub struct GptJ;

impl FamilySpec for GptJ {
    fn names(&self) -> Names {
        Names { model_type: "gptj", architecture: "GPTJForCausalLM", base_prefix: "transformer.", embed_name: "wte.weight" }
    }

    fn parse(&self, f: &Fields) -> Result<TransformerConfig> {
        let d_model = f.size(&["n_embd", "hidden_size"], 4096)?;
        let n_heads = f.size(&["n_head", "num_attention_heads"], 16)?;
        let n_layers = f.layers(&["n_layer", "num_hidden_layers"], 28)?;
        let d_head = head_dim(f, d_model, n_heads, "n_embd", "n_head")?;
        // transformers: rotary_dim None means the whole head.
        let dims = f.opt_size(&["rotary_dim"])?.unwrap_or(d_head);
        if dims % 2 != 0 || dims > d_head {
            return Err(f.err("rotary_dim", format!("= {dims} must be even and at most the head size {d_head}")));
        }
        if f.bool("tie_word_embeddings", false)? {
            return Err(f.err("tie_word_embeddings", "is true; GPT-J's lm_head has a bias of its own, burnlens reads untied GPT-J only"));
        }
        Ok(TransformerConfig {
            vocab_size: f.size(&["vocab_size"], 50400)?,
            n_ctx: f.size(&["n_positions", "max_position_embeddings"], 2048)?,
            d_model,
            n_heads,
            d_head,
            d_mlp: Some(f.opt_size(&["n_inner"])?.unwrap_or(4 * d_model)),
            spans: vec![AttentionSpan::Global; n_layers],
            activation: activation(f)?,
            layer_norm_eps: f.float("layer_norm_epsilon", 1e-5)?,
            ..fresh(d_model, n_heads, dims)
        })
    }

    fn tensors(&self, cfg: &TransformerConfig, t: &mut Tensors) {
        let (d, hd, m) = (cfg.d_model, cfg.n_heads * cfg.d_head, cfg.d_mlp.unwrap_or(4 * cfg.d_model));
        t.add("wte.weight".into(), vec![cfg.vocab_size, d], "embed.weight".into(), Placement::Same);
        for l in 0..cfg.n_layers() {
            let (h, b) = (format!("h.{l}"), format!("blocks.{l}"));
            t.norm(&format!("{h}.ln_1"), &format!("{b}.ln1"));
            t.split_qkv(&format!("{h}.attn"), &format!("{b}.attn"), ["q_proj", "k_proj", "v_proj"]);
            t.linear(&format!("{h}.attn.out_proj"), &format!("{b}.attn.out"), hd, d, cfg.attn_out_bias);
            t.linear(&format!("{h}.mlp.fc_in"), &format!("{b}.mlp.fc_in"), d, m, cfg.mlp_bias);
            t.linear(&format!("{h}.mlp.fc_out"), &format!("{b}.mlp.fc_out"), m, d, cfg.mlp_bias);
        }
        t.norm("ln_f", "ln_final");
        t.unembed("lm_head");
    }

    fn config_json(&self, cfg: &TransformerConfig) -> std::result::Result<Value, String> {
        let r = cfg.rotary.filter(|_| cfg.positional == Positional::Rotary && cfg.rotary.is_some_and(|r| r.interleaved));
        let r = r.ok_or("GPT-J uses interleaved rotary positions")?;
        if cfg.norm != NormKind::LayerNorm || cfg.mlp != MlpKind::Standard || !cfg.parallel_residual || !cfg.shared_norm {
            return Err("GPT-J has LayerNorm, a plain MLP and attention and MLP in parallel from one norm".into());
        }
        if cfg.qkv_bias || cfg.attn_out_bias || !cfg.mlp_bias || !cfg.untied_unembed || !cfg.unembed_bias {
            return Err("GPT-J has no attention biases, MLP biases and an untied lm_head with a bias".into());
        }
        if cfg.kv_heads() != cfg.n_heads || cfg.n_heads * cfg.d_head != cfg.d_model || cfg.spans.iter().any(|s| *s != AttentionSpan::Global) {
            return Err("GPT-J has one key/value head per query head, n_heads * d_head = d_model and global attention".into());
        }
        Ok(json!({
            "n_positions": cfg.n_ctx,
            "n_embd": cfg.d_model,
            "n_layer": cfg.n_layers(),
            "n_head": cfg.n_heads,
            "n_inner": cfg.d_mlp,
            "rotary_dim": r.dims,
            "activation_function": cfg.activation.hf_name(),
            "layer_norm_epsilon": cfg.layer_norm_eps,
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "attn_pdrop": 0.0,
        }))
    }

    /// A quarter of each head rotated (GPT-J 6B: 64 of 256).
    fn fresh(&self, s: &FreshShape) -> TransformerConfig {
        let d_head = s.d_model / s.n_heads.max(1);
        TransformerConfig {
            spans: vec![AttentionSpan::Global; s.n_layers],
            vocab_size: s.vocab,
            n_ctx: s.n_ctx,
            ..fresh(s.d_model, s.n_heads, ((d_head as f64 * 0.25) as usize).max(2) & !1)
        }
    }
}

/// GPT-J's settings for a `d_model` model of `n_heads` heads rotating `dims` of each.
fn fresh(d_model: usize, n_heads: usize, dims: usize) -> TransformerConfig {
    TransformerConfig {
        score_scale: ScoreScale::InvSqrtDHead,
        qkv_bias: false,
        positional: Positional::Rotary,
        rotary: Some(Rotary { dims, base: 10000.0, scaling: None, interleaved: true }),
        parallel_residual: true,
        shared_norm: true,
        untied_unembed: true,
        unembed_bias: true,
        attn_out_bias: false,
        mlp_bias: true,
        ..TransformerConfig::gpt2_like(1, 1, d_model, 1, n_heads)
    }
}
