//! GPT-NeoX / Pythia (`GPTNeoXConfig`, `GPTNeoXForCausalLM`): rotary on the first
//! `rotary_pct` of each head, parallel residual by default, LayerNorm, Q, K, V fused per head
//! in `query_key_value`, untied `embed_out`.

use burnlens_model::{AttentionSpan, MlpKind, NormKind, Positional, Rotary, ScoreScale, TransformerConfig};
use serde_json::{Value, json};

use super::spec::{FamilySpec, FreshShape, Names};
use crate::error::Result;
use crate::fields::{Fields, activation_named, head_dim};
use crate::layout::{Placement, Tensors};

pub struct GptNeoX;

impl FamilySpec for GptNeoX {
    fn names(&self) -> Names {
        Names { model_type: "gpt_neox", architecture: "GPTNeoXForCausalLM", base_prefix: "gpt_neox.", embed_name: "embed_in.weight" }
    }

    fn parse(&self, f: &Fields) -> Result<TransformerConfig> {
        let d_model = f.size(&["hidden_size"], 6144)?;
        let n_heads = f.size(&["num_attention_heads"], 64)?;
        let n_layers = f.layers(&["num_hidden_layers"], 44)?;
        let d_head = head_dim(f, d_model, n_heads, "hidden_size", "num_attention_heads")?;
        let rope = f.rope(&["rotary_emb_base"], 10000.0, &["rotary_pct"], 0.25)?;
        let bias = f.bool("attention_bias", true)?;
        Ok(TransformerConfig {
            vocab_size: f.size(&["vocab_size"], 50432)?,
            n_ctx: f.size(&["max_position_embeddings"], 2048)?,
            d_model,
            n_heads,
            d_head,
            d_mlp: Some(f.opt_size(&["intermediate_size"])?.unwrap_or(4 * d_model)),
            spans: vec![AttentionSpan::Global; n_layers],
            qkv_bias: bias,
            activation: activation_named(f, "hidden_act", "gelu")?,
            layer_norm_eps: f.float("layer_norm_eps", 1e-5)?,
            positional: Positional::Rotary,
            untied_unembed: !f.bool("tie_word_embeddings", false)?,
            unembed_bias: false,
            parallel_residual: f.bool("use_parallel_residual", true)?,
            rotary: Some(rope.into_rotary(f, d_head)?),
            attn_out_bias: bias,
            mlp_bias: true,
            ..TransformerConfig::gpt2_like(1, 1, 1, 1, 1)
        })
    }

    fn tensors(&self, cfg: &TransformerConfig, t: &mut Tensors) {
        let (d, hd, m) = (cfg.d_model, cfg.n_heads * cfg.d_head, cfg.d_mlp.unwrap_or(4 * cfg.d_model));
        t.add("embed_in.weight".into(), vec![cfg.vocab_size, d], "embed.weight".into(), Placement::Same);
        for l in 0..cfg.n_layers() {
            let (h, b) = (format!("layers.{l}"), format!("blocks.{l}"));
            t.norm(&format!("{h}.input_layernorm"), &format!("{b}.ln1"));
            t.norm(&format!("{h}.post_attention_layernorm"), &format!("{b}.ln2"));
            let qkv = Placement::NeoxQkv { heads: cfg.n_heads, d_head: cfg.d_head };
            t.add(format!("{h}.attention.query_key_value.weight"), vec![3 * hd, d], format!("{b}.attn.qkv.weight"), qkv);
            if cfg.qkv_bias {
                t.add(format!("{h}.attention.query_key_value.bias"), vec![3 * hd], format!("{b}.attn.qkv.bias"), qkv);
            }
            t.linear(&format!("{h}.attention.dense"), &format!("{b}.attn.out"), hd, d, cfg.attn_out_bias);
            t.linear(&format!("{h}.mlp.dense_h_to_4h"), &format!("{b}.mlp.fc_in"), d, m, cfg.mlp_bias);
            t.linear(&format!("{h}.mlp.dense_4h_to_h"), &format!("{b}.mlp.fc_out"), m, d, cfg.mlp_bias);
        }
        t.norm("final_layer_norm", "ln_final");
        t.unembed("embed_out");
    }

    fn config_json(&self, cfg: &TransformerConfig) -> std::result::Result<Value, String> {
        let r = cfg.rotary.filter(|_| cfg.positional == Positional::Rotary).ok_or("GPT-NeoX uses rotary positions")?;
        if cfg.norm != NormKind::LayerNorm
            || cfg.mlp != MlpKind::Standard
            || cfg.kv_heads() != cfg.n_heads
            || cfg.spans.iter().any(|s| *s != AttentionSpan::Global)
        {
            return Err("GPT-NeoX has LayerNorm, a plain MLP, global attention and one key/value head per query head".into());
        }
        if cfg.qkv_bias != cfg.attn_out_bias || !cfg.mlp_bias {
            return Err("GPT-NeoX has q/k/v and output biases together (attention_bias) and MLP biases".into());
        }
        if cfg.n_heads * cfg.d_head != cfg.d_model {
            return Err(format!("n_heads * d_head = {} must equal d_model = {}", cfg.n_heads * cfg.d_head, cfg.d_model));
        }
        if cfg.score_scale != ScoreScale::InvSqrtDHead {
            return Err("GPT-NeoX scales attention scores by 1/sqrt(d_head)".into());
        }
        Ok(json!({
            "max_position_embeddings": cfg.n_ctx,
            "hidden_size": cfg.d_model,
            "num_hidden_layers": cfg.n_layers(),
            "num_attention_heads": cfg.n_heads,
            "intermediate_size": cfg.d_mlp,
            "hidden_act": super::spec::hidden_act(cfg.activation),
            "layer_norm_eps": cfg.layer_norm_eps,
            "use_parallel_residual": cfg.parallel_residual,
            "attention_bias": cfg.qkv_bias,
            "rope_parameters": {"rope_theta": r.base, "rope_type": "default", "partial_rotary_factor": r.dims as f64 / cfg.d_head as f64},
            "rotary_pct": r.dims as f64 / cfg.d_head as f64,
            "rotary_emb_base": r.base,
            "hidden_dropout": 0.0,
            "attention_dropout": 0.0,
        }))
    }

    /// Rotary on a quarter of each head, parallel residual, untied unembedding without bias.
    fn fresh(&self, s: &FreshShape) -> TransformerConfig {
        let d_head = s.d_model / s.n_heads.max(1);
        TransformerConfig {
            positional: Positional::Rotary,
            rotary: Some(Rotary { dims: ((d_head as f64 * 0.25) as usize) & !1, base: 10000.0, scaling: None, interleaved: false }),
            parallel_residual: true,
            untied_unembed: true,
            unembed_bias: false,
            ..TransformerConfig::gpt2_like(s.vocab, s.n_ctx, s.d_model, s.n_layers, s.n_heads)
        }
    }
}
