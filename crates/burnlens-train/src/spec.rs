//! The architecture of a run: the family's fresh model with `[model]`'s settings on top.

use std::path::PathBuf;

use burnlens_hf::{Family, FreshShape};
use burnlens_model::{AttentionSpan, Positional, TransformerConfig};
use serde::{Deserialize, Serialize};

use crate::config::{HfActivation, LayerAttention, ModelSection, PositionalKey, RunConfig};
use crate::error::{Result, TrainError};

/// The architecture of a run, saved as `model.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModelSpec {
    pub family: Family,
    pub config: TransformerConfig,
}

/// The architecture `[model]` describes for a vocabulary of `vocab` tokens.
pub fn model_spec(cfg: &RunConfig, vocab: usize) -> Result<ModelSpec> {
    let m = &cfg.model;
    let bad = |msg: String| TrainError::Config { path: PathBuf::from("[model]"), msg };
    let fam = m.family.unwrap_or(Family::Gpt2);
    let family = fam.model_type();
    let d_model = m.d_model.ok_or_else(|| bad("model.d_model is required (or model.from)".into()))?;
    let n_heads = m.n_heads.ok_or_else(|| bad("model.n_heads is required (or model.from)".into()))?;
    let n_layers = m.n_layers.ok_or_else(|| bad("model.n_layers is required (or model.from)".into()))?;
    if n_layers > burnlens_model::MAX_LAYERS {
        return Err(bad(format!("model.n_layers = {n_layers}; at most {} are supported", burnlens_model::MAX_LAYERS)));
    }
    if n_heads == 0 || d_model % n_heads != 0 {
        return Err(bad(format!("model.d_model = {d_model} must be a positive multiple of model.n_heads = {n_heads}")));
    }
    // The family's fresh model, then the run config's overrides.
    let n_ctx = m.context.unwrap_or(cfg.training.block_size);
    let mut config = fam.spec().fresh(&FreshShape { vocab, n_ctx, d_model, n_layers, n_heads });
    let rotary_family = config.positional == Positional::Rotary;
    set_spans(m, n_layers, &mut config.spans)?;
    if let Some(HfActivation(a)) = m.activation {
        config.activation = a;
    }
    config.positional = match (m.positional, rotary_family) {
        (None, _) => config.positional,
        (Some(PositionalKey::Rotary), true) => Positional::Rotary,
        (Some(PositionalKey::Residual), false) => Positional::Residual,
        (Some(PositionalKey::QueryKeyOnly), false) => Positional::QueryKeyOnly,
        (Some(p), _) => {
            let allowed = if rotary_family { "rotary" } else { "residual, query_key_only" };
            return Err(bad(format!("model.positional = {} is not one of {allowed} (for model.family = \"{family}\")", serde_json::json!(p))));
        }
    };
    if !rotary_family {
        for (key, set) in [
            ("n_kv_heads", m.n_kv_heads.is_some()),
            ("rotary_pct", m.rotary_pct.is_some()),
            ("rope_theta", m.rope_theta.is_some()),
            ("parallel_residual", m.parallel_residual.is_some()),
        ] {
            if set {
                return Err(bad(format!("model.{key} applies to the rotary families, not to model.family = \"{family}\"")));
            }
        }
    }
    let d_head = d_model / n_heads;
    for r in [config.rotary.as_mut(), config.rotary_local.as_mut()].into_iter().flatten() {
        if let Some(pct) = m.rotary_pct {
            r.dims = ((d_head as f64 * pct) as usize) & !1;
        }
    }
    if let (Some(theta), Some(r)) = (m.rope_theta, config.rotary.as_mut()) {
        r.base = theta;
    }
    if let Some(t) = m.tie_embeddings {
        config.untied_unembed = !t;
    }
    if let Some(p) = m.parallel_residual {
        config.parallel_residual = p;
    }
    if m.n_kv_heads.is_some() {
        config.n_kv_heads = m.n_kv_heads;
    }
    config.d_mlp = if m.attention_only { None } else { Some(m.d_mlp.unwrap_or(4 * d_model)) };
    config.scale_by_inverse_layer = m.scale_attn_by_inverse_layer_idx;
    config.dropout = cfg.training.dropout;
    config.validate().map_err(|e| bad(e.to_string()))?;
    Ok(ModelSpec { family: fam, config })
}

/// `model.attention` (one `global` / `local` per layer) and `model.window` over the
/// family's fresh spans.
fn set_spans(m: &ModelSection, n_layers: usize, spans: &mut Vec<AttentionSpan>) -> Result<()> {
    let bad = |msg: String| TrainError::Config { path: PathBuf::from("[model]"), msg };
    if let Some(kinds) = &m.attention {
        if kinds.len() != n_layers {
            return Err(bad(format!("model.attention lists {} layers but model.n_layers is {n_layers}", kinds.len())));
        }
        *spans = kinds
            .iter()
            .map(|k| match k {
                LayerAttention::Global => AttentionSpan::Global,
                LayerAttention::Local => AttentionSpan::Local(m.window.unwrap_or(256)),
            })
            .collect();
    } else if let Some(w) = m.window {
        for s in spans.iter_mut().filter(|s| matches!(s, AttentionSpan::Local(_))) {
            *s = AttentionSpan::Local(w);
        }
    }
    Ok(())
}
