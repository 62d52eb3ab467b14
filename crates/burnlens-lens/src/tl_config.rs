//! The architecture under TransformerLens's names: the fields of its
//! `HookedTransformerConfig` that describe a loaded model (`n_layers`, `d_head`,
//! `normalization_type`, `positional_embedding_type`, ...), with its values (`"LN"`/`"RMS"`,
//! `"standard"`/`"shortformer"`/`"rotary"`, a soft cap of `-1.0` for none). Python's
//! `model.cfg` is this.

use burnlens_model::{ActivationFn, AttentionSpan, MlpKind, NormKind, Positional, TransformerConfig};
use serde::Serialize;

/// A model's configuration as TransformerLens names it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TlConfig {
    pub n_layers: usize,
    pub n_heads: usize,
    pub d_model: usize,
    pub d_head: usize,
    /// `None` for attention-only models.
    pub d_mlp: Option<usize>,
    pub d_vocab: usize,
    /// The unembedding's width (`d_vocab`: burnlens models predict their own vocabulary).
    pub d_vocab_out: usize,
    pub n_ctx: usize,
    /// Heads of keys and values (`n_heads` without grouped-query attention).
    pub n_key_value_heads: usize,
    pub eps: f64,
    /// `LN` or `RMS`.
    pub normalization_type: &'static str,
    /// `standard` (learned, added to the stream), `shortformer` (learned, queries and keys
    /// only) or `rotary`.
    pub positional_embedding_type: &'static str,
    /// `gelu_new`, `gelu`, `gelu_fast`, `relu`, `quick_gelu` or `silu`.
    pub act_fn: &'static str,
    pub attn_only: bool,
    pub gated_mlp: bool,
    pub parallel_attn_mlp: bool,
    /// `-1.0` when scores are not capped.
    pub attn_scores_soft_cap: f64,
    /// `-1.0` when logits are not capped.
    pub output_logits_soft_cap: f64,
    /// Whether the final norm is an RMSNorm.
    pub final_rms: bool,
    /// Rotated dimensions of each head (`None` without rotary positions).
    pub rotary_dim: Option<usize>,
    /// The rotary base (TransformerLens's default, 10000, without rotary positions).
    pub rotary_base: f64,
    /// GPT-J's interleaved rotary (pairs of adjacent dimensions).
    pub rotary_adjacent_pairs: bool,
    /// Whether any layer attends over a local window.
    pub use_local_attn: bool,
    /// `global` / `local` per layer where any layer is local, else `None`.
    pub attn_types: Option<Vec<&'static str>>,
    /// The local window, where a layer has one.
    pub window_size: Option<usize>,
}

impl TlConfig {
    pub fn of(c: &TransformerConfig) -> Self {
        let window_size = c.spans.iter().find_map(|s| match s {
            AttentionSpan::Local(w) => Some(*w),
            AttentionSpan::Global => None,
        });
        let span_name = |s: &AttentionSpan| if *s == AttentionSpan::Global { "global" } else { "local" };
        TlConfig {
            n_layers: c.n_layers(),
            n_heads: c.n_heads,
            d_model: c.d_model,
            d_head: c.d_head,
            d_mlp: c.d_mlp,
            d_vocab: c.vocab_size,
            d_vocab_out: c.vocab_size,
            n_ctx: c.n_ctx,
            n_key_value_heads: c.kv_heads(),
            eps: c.layer_norm_eps,
            normalization_type: match c.norm {
                NormKind::LayerNorm => "LN",
                NormKind::RmsNorm => "RMS",
            },
            positional_embedding_type: match c.positional {
                Positional::Residual => "standard",
                Positional::QueryKeyOnly => "shortformer",
                Positional::Rotary => "rotary",
            },
            act_fn: match c.activation {
                ActivationFn::GeluNew => "gelu_new",
                ActivationFn::Gelu => "gelu",
                ActivationFn::GeluFast => "gelu_fast",
                ActivationFn::Relu => "relu",
                ActivationFn::QuickGelu => "quick_gelu",
                ActivationFn::Silu => "silu",
            },
            attn_only: c.d_mlp.is_none(),
            gated_mlp: c.mlp == MlpKind::Gated,
            parallel_attn_mlp: c.parallel_residual,
            attn_scores_soft_cap: c.attn_softcap.unwrap_or(-1.0),
            output_logits_soft_cap: c.final_softcap.unwrap_or(-1.0),
            final_rms: c.norm == NormKind::RmsNorm,
            rotary_dim: c.rotary.map(|r| r.dims),
            rotary_base: c.rotary.map_or(10000.0, |r| r.base),
            rotary_adjacent_pairs: c.rotary.is_some_and(|r| r.interleaved),
            use_local_attn: window_size.is_some(),
            attn_types: window_size.map(|_| c.spans.iter().map(span_name).collect()),
            window_size,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpt2_and_a_llama_shape_under_transformer_lens_names() {
        let gpt2 = TlConfig::of(&TransformerConfig::gpt2_like(50, 16, 32, 2, 4));
        assert_eq!((gpt2.n_layers, gpt2.n_heads, gpt2.d_head, gpt2.d_vocab, gpt2.n_ctx), (2, 4, 8, 50, 16));
        assert_eq!((gpt2.normalization_type, gpt2.positional_embedding_type, gpt2.act_fn), ("LN", "standard", "gelu_new"));
        assert_eq!((gpt2.n_key_value_heads, gpt2.gated_mlp, gpt2.attn_only, gpt2.output_logits_soft_cap), (4, false, false, -1.0));
        let mut c = TransformerConfig::gpt2_like(50, 16, 32, 2, 4);
        (c.norm, c.positional, c.activation, c.mlp, c.n_kv_heads, c.final_softcap) =
            (NormKind::RmsNorm, Positional::Rotary, ActivationFn::Silu, MlpKind::Gated, Some(2), Some(30.0));
        let llama = TlConfig::of(&c);
        assert_eq!((llama.normalization_type, llama.positional_embedding_type, llama.act_fn), ("RMS", "rotary", "silu"));
        assert_eq!((llama.n_key_value_heads, llama.gated_mlp, llama.output_logits_soft_cap), (2, true, 30.0));
        assert_eq!((gpt2.rotary_dim, gpt2.attn_types.clone(), gpt2.final_rms), (None, None, false));
        c.spans = vec![AttentionSpan::Local(8), AttentionSpan::Global];
        let local = TlConfig::of(&c);
        assert_eq!((local.window_size, local.attn_types, local.use_local_attn), (Some(8), Some(vec!["local", "global"]), true));
    }
}
