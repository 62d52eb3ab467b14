//! `config.json`, translated into a [`TransformerConfig`] by the family its `model_type`
//! names (`crate::family`).
//!
//! Each family reads its own fields through [`Fields`] (`crate::fields`, the layer below
//! both this dispatch and the families).

use std::path::Path;

use burnlens_model::TransformerConfig;
#[cfg(test)]
use burnlens_model::{AttentionSpan, ScoreScale};
use serde_json::Value;

use crate::error::{HfError, Result};
use crate::fields::Fields;

pub use crate::family::Family;

/// A parsed `config.json`.
#[derive(Debug, Clone)]
pub struct HfConfig {
    pub family: Family,
    /// The architecture in burnlens terms.
    pub model: TransformerConfig,
    /// `torch_dtype` / `dtype` as recorded, if any.
    pub torch_dtype: Option<String>,
    /// `bos_token_id`, if any (GPT-2's is 50256) and inside the vocabulary.
    pub bos_token_id: Option<i64>,
    /// Things in the file that were ignored and that a user should hear about.
    pub warnings: Vec<String>,
}

/// Read and parse `path` (a `config.json`).
pub fn read_config(path: &Path) -> Result<HfConfig> {
    let text = std::fs::read_to_string(path).map_err(|e| HfError::io(path, e))?;
    parse_config(&text, path)
}

/// Parse the text of a `config.json`; `path` is only used in error messages.
pub fn parse_config(text: &str, path: &Path) -> Result<HfConfig> {
    let value: Value = serde_json::from_str(text).map_err(|e| HfError::Json { path: path.into(), msg: e.to_string() })?;
    let Value::Object(obj) = value else {
        return Err(HfError::Json { path: path.into(), msg: "expected a JSON object at the top level".into() });
    };
    let f = Fields::new(&obj, path);
    if f.get("model_type").is_none() {
        return Err(f.err("model_type", format!("is missing; expected one of {}", Family::supported().join(", "))));
    }
    let model_type = f.string("model_type", None)?;
    let family = Family::from_model_type(&model_type).ok_or_else(|| HfError::UnknownModelType {
        path: path.into(),
        found: model_type.clone(),
        supported: Family::supported(),
    })?;
    let model = family.spec().parse(&f)?;
    model.validate().map_err(|e| match e {
        burnlens_model::ModelError::Config { field, msg } => f.err(field, msg),
        other => HfError::Model(other),
    })?;
    let torch_dtype = f.opt_string(&["torch_dtype", "dtype"])?;
    let mut warnings = Vec::new();
    let raw_bos = f.get("bos_token_id").and_then(Value::as_i64);
    let bos_token_id = raw_bos.filter(|&b| b >= 0 && (b as usize) < model.vocab_size);
    if let (Some(b), None) = (raw_bos, bos_token_id) {
        warnings.push(format!(
            "{}: bos_token_id {b} lies outside the vocabulary of {} tokens; no BOS token is used (pass --bos ID to choose one)",
            path.display(),
            model.vocab_size
        ));
    }
    Ok(HfConfig { family, model, torch_dtype, bos_token_id, warnings })
}

#[cfg(test)]
mod tests {
    use super::*;
    use burnlens_model::ActivationFn;

    fn parse(text: &str) -> Result<HfConfig> {
        parse_config(text, Path::new("config.json"))
    }

    #[test]
    fn gpt2_defaults_fill_absent_fields() {
        let c = parse(r#"{"model_type": "gpt2", "n_inner": null}"#).unwrap();
        assert_eq!(c.family, Family::Gpt2);
        let m = c.model;
        assert_eq!((m.vocab_size, m.n_ctx, m.d_model, m.n_heads, m.d_head), (50257, 1024, 768, 12, 64));
        assert_eq!(m.d_mlp, Some(3072));
        assert_eq!(m.n_layers(), 12);
        assert_eq!(m.activation, ActivationFn::GeluNew);
        assert!(!m.scale_by_inverse_layer);
        assert_eq!(m.n_params().unwrap(), 124_439_808);
    }

    #[test]
    fn gpt2_legacy_n_ctx_and_inverse_layer_scale() {
        let c = parse(
            r#"{"model_type": "gpt2", "n_ctx": 64, "n_embd": 32, "n_head": 4, "n_layer": 2,
                          "scale_attn_by_inverse_layer_idx": true, "n_inner": 80}"#,
        )
        .unwrap();
        assert_eq!(c.model.n_ctx, 64);
        assert_eq!(c.model.d_mlp, Some(80));
        assert!((c.model.score_factor(1) - 1.0 / (8f64.sqrt() * 2.0)).abs() < 1e-12);
    }

    #[test]
    fn gpt_neo_attention_types_expand() {
        let c = parse(
            r#"{"model_type": "gpt_neo", "hidden_size": 64, "num_heads": 4, "num_layers": 3,
                          "attention_types": [[["global", "local"], 1], [["local"], 1]], "window_size": 5}"#,
        )
        .unwrap();
        assert_eq!(c.model.spans, vec![AttentionSpan::Global, AttentionSpan::Local(5), AttentionSpan::Local(5)]);
        assert_eq!(c.model.score_scale, ScoreScale::None);
        assert!(!c.model.qkv_bias);
        assert_eq!(c.model.d_mlp, Some(256));
    }

    #[test]
    fn gpt_neo_125m_defaults() {
        let c = parse(
            r#"{"model_type": "gpt_neo", "hidden_size": 768, "num_heads": 12, "num_layers": 12,
                          "attention_types": [[["global", "local"], 6]]}"#,
        )
        .unwrap();
        assert_eq!(c.model.spans[1], AttentionSpan::Local(256));
        assert_eq!(c.model.n_ctx, 2048);
        assert_eq!(c.model.n_params().unwrap(), 125_198_592);
    }

    #[test]
    fn errors_name_the_field() {
        let msg = |t: &str| parse(t).unwrap_err().to_string();
        assert!(msg(r#"{"model_type": "falcon"}"#).contains("unsupported model_type \"falcon\"; supported: gpt2, gpt_neo, gpt_neox, llama, qwen2, mistral"));
        assert!(msg(r#"{"n_embd": 5}"#).contains("`model_type` is missing"));
        assert!(msg(r#"{"model_type": "gpt2", "n_embd": 10, "n_head": 4}"#).contains("`n_embd` = 10 is not divisible by n_head = 4"));
        assert!(msg(r#"{"model_type": "gpt2", "n_layer": -2}"#).contains("`n_layer` must be a non-negative integer, found -2"));
        assert!(msg(r#"{"model_type": "gpt2", "n_layer": 0}"#).contains("`n_layers` must be at least 1"));
        assert!(msg(r#"{"model_type": "gpt2", "activation_function": "tanh"}"#).contains("\"tanh\" is not supported"));
        assert!(
            msg(r#"{"model_type": "gpt_neo", "num_layers": 2, "attention_types": [[["global", "local"], 2]]}"#)
                .contains("describes 4 layers but num_layers is 2")
        );
        assert!(
            msg(r#"{"model_type": "gpt_neo", "num_layers": 2, "window_size": 0, "attention_types": [[["global", "local"], 1]]}"#)
                .contains("`window_size` is 0")
        );
        assert!(msg("{not json").contains("config.json: not valid JSON"));
        // Phi-3-mini-128k's long-context rope is named, not silently run as plain rope.
        assert!(
            msg(r#"{"model_type": "phi3", "rope_scaling": {"type": "longrope", "short_factor": [1.0], "long_factor": [1.0]}}"#)
                .contains("has rope_type \"longrope\"; burnlens implements default, linear and llama3")
        );
        assert!(
            msg(r#"{"model_type": "gptj", "n_embd": 64, "n_head": 4, "rotary_dim": 20}"#)
                .contains("`rotary_dim` = 20 must be even and at most the head size 16")
        );
        assert!(msg(r#"{"model_type": "gemma2", "use_bidirectional_attention": true}"#).contains("causal decoders only"));
    }
}
