//! `config.json`, translated into a [`TransformerConfig`] by the family its `model_type`
//! names (`crate::family`).
//!
//! Each family reads its own fields through [`Fields`]: absent fields take the defaults of
//! the family's `transformers` config class, so a config written by any version of
//! `save_pretrained`, or a hand-written minimal one, reads the way `transformers` reads it.
//! Rotary settings are read from transformers 5's `rope_parameters` and from the older
//! `rope_theta` / `rope_scaling` / `rotary_pct` / `rotary_emb_base` fields.

use std::path::{Path, PathBuf};

use burnlens_model::{ActivationFn, RopeScaling, Rotary, TransformerConfig};
#[cfg(test)]
use burnlens_model::{AttentionSpan, ScoreScale};
use serde_json::{Map, Value};

use crate::error::{HfError, Result};

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
    let f = Fields { obj: &obj, path: path.to_path_buf() };
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

/// Rotary settings as read from a config, before they are checked against the head size.
pub(crate) struct RopeFields {
    pub base: f64,
    pub fraction: f64,
    pub scaling: Option<RopeScaling>,
}

impl RopeFields {
    pub(crate) fn into_rotary(self, f: &Fields, d_head: usize) -> Result<Rotary> {
        // HF rounds down: int(head_dim * partial_rotary_factor).
        let dims = (d_head as f64 * self.fraction) as usize;
        if dims < 2 || dims % 2 != 0 {
            return Err(f.err("partial_rotary_factor", format!("gives {dims} rotary dimensions of a {d_head}-wide head; expected an even number of at least 2")));
        }
        if !(self.base.is_finite() && self.base > 1.0) {
            return Err(f.err("rope_theta", format!("must be a number above 1, found {}", self.base)));
        }
        Ok(Rotary { dims, base: self.base, scaling: self.scaling, interleaved: false })
    }
}

pub(crate) fn head_dim(f: &Fields, d_model: usize, n_heads: usize, d_name: &str, h_name: &str) -> Result<usize> {
    if d_model % n_heads != 0 {
        return Err(f.err(d_name, format!("= {d_model} is not divisible by {h_name} = {n_heads}")));
    }
    Ok(d_model / n_heads)
}

pub(crate) fn activation(f: &Fields) -> Result<ActivationFn> {
    activation_named(f, "activation_function", "gelu_new")
}

pub(crate) fn activation_named(f: &Fields, field: &str, default: &str) -> Result<ActivationFn> {
    let name = f.string(field, Some(default))?;
    ActivationFn::from_hf_name(&name)
        .ok_or_else(|| f.err(field, format!("\"{name}\" is not supported; expected one of {}", ActivationFn::HF_NAMES.join(", "))))
}

/// Typed access to the fields of a JSON object, with errors naming the file and field.
pub struct Fields<'a> {
    obj: &'a Map<String, Value>,
    path: PathBuf,
}

impl<'a> Fields<'a> {
    /// Fields of `obj`, errors still naming this file.
    pub(crate) fn with<'b>(&self, obj: &'b Map<String, Value>) -> Fields<'b> {
        Fields { obj, path: self.path.clone() }
    }

    /// The whole JSON object.
    pub(crate) fn raw(&self) -> &'a Map<String, Value> {
        self.obj
    }

    /// Whether the key is in the file at all (even as `null`).
    pub(crate) fn obj_has(&self, name: &str) -> bool {
        self.obj.contains_key(name)
    }

    pub(crate) fn err(&self, field: &str, msg: impl Into<String>) -> HfError {
        HfError::Field { path: self.path.clone(), field: field.to_string(), msg: msg.into() }
    }

    /// The value of a field, treating JSON `null` as absent.
    pub(crate) fn get(&self, name: &str) -> Option<&Value> {
        self.obj.get(name).filter(|v| !v.is_null())
    }

    /// The first of `names` that is present.
    pub(crate) fn first(&self, names: &[&str]) -> Option<(String, &Value)> {
        names.iter().find_map(|n| self.get(n).map(|v| (n.to_string(), v)))
    }

    pub(crate) fn opt_uint(&self, names: &[&str]) -> Result<Option<(String, u64)>> {
        match self.first(names) {
            None => Ok(None),
            Some((name, v)) => match v.as_u64() {
                Some(n) => Ok(Some((name, n))),
                None => Err(self.err(&name, format!("must be a non-negative integer, found {v}"))),
            },
        }
    }

    /// A size that must be at least 1.
    pub(crate) fn opt_size(&self, names: &[&str]) -> Result<Option<usize>> {
        match self.opt_uint(names)? {
            Some((name, 0)) => Err(self.err(&name, "must be at least 1, found 0")),
            Some((_, n)) => Ok(Some(n as usize)),
            None => Ok(None),
        }
    }

    pub(crate) fn size(&self, names: &[&str], default: usize) -> Result<usize> {
        Ok(self.opt_size(names)?.unwrap_or(default))
    }

    /// A count that may be any non-negative integer.
    pub(crate) fn count(&self, names: &[&str], default: usize) -> Result<usize> {
        Ok(self.opt_uint(names)?.map_or(default, |(_, n)| n as usize))
    }

    /// A layer count: any non-negative integer up to [`burnlens_model::MAX_LAYERS`].
    pub(crate) fn layers(&self, names: &[&str], default: usize) -> Result<usize> {
        match self.opt_uint(names)? {
            Some((name, n)) if n > burnlens_model::MAX_LAYERS as u64 => {
                Err(self.err(&name, format!("= {n} layers; at most {} are supported", burnlens_model::MAX_LAYERS)))
            }
            Some((_, n)) => Ok(n as usize),
            None => Ok(default),
        }
    }

    pub(crate) fn float(&self, name: &str, default: f64) -> Result<f64> {
        match self.get(name) {
            None => Ok(default),
            Some(v) => v.as_f64().ok_or_else(|| self.err(name, format!("must be a number, found {v}"))),
        }
    }

    pub(crate) fn bool(&self, name: &str, default: bool) -> Result<bool> {
        match self.get(name) {
            None => Ok(default),
            Some(v) => v.as_bool().ok_or_else(|| self.err(name, format!("must be true or false, found {v}"))),
        }
    }

    pub(crate) fn string(&self, name: &str, default: Option<&str>) -> Result<String> {
        match (self.get(name), default) {
            (Some(Value::String(s)), _) => Ok(s.clone()),
            (Some(v), _) => Err(self.err(name, format!("must be a string, found {v}"))),
            (None, Some(d)) => Ok(d.to_string()),
            (None, None) => Err(self.err(name, format!("is missing; expected one of {}", Family::supported().join(", ")))),
        }
    }

    /// Rotary settings from `rope_parameters` (transformers 5) or the older fields: the base
    /// from `rope_theta` or `legacy_base`, the rotated fraction of each head from
    /// `partial_rotary_factor` or `legacy_fraction`, scaling from `rope_type` / `rope_scaling`.
    pub(crate) fn rope(&self, legacy_base: &[&str], base: f64, legacy_fraction: &[&str], fraction: f64) -> Result<RopeFields> {
        let params = match self.get("rope_parameters") {
            None => None,
            Some(Value::Object(o)) => Some(o),
            Some(v) => return Err(self.err("rope_parameters", format!("must be an object, found {v}"))),
        };
        let num = |obj: Option<&Map<String, Value>>, names: &[&str], field: &str| -> Result<Option<f64>> {
            for n in names {
                let v = match obj {
                    Some(o) => o.get(*n).filter(|v| !v.is_null()),
                    None => self.get(n),
                };
                if let Some(v) = v {
                    return v.as_f64().map(Some).ok_or_else(|| self.err(field, format!("`{n}` must be a number, found {v}")));
                }
            }
            Ok(None)
        };
        let mut names_base = vec!["rope_theta"];
        names_base.extend_from_slice(legacy_base);
        let mut names_fraction = vec!["partial_rotary_factor"];
        names_fraction.extend_from_slice(legacy_fraction);
        let base = match num(params, &["rope_theta"], "rope_parameters")? {
            Some(b) => b,
            None => num(None, &names_base, "rope_theta")?.unwrap_or(base),
        };
        let fraction = match num(params, &["partial_rotary_factor"], "rope_parameters")? {
            Some(x) => x,
            None => num(None, &names_fraction, "partial_rotary_factor")?.unwrap_or(fraction),
        };
        // Scaling: inside rope_parameters (transformers 5) or in rope_scaling.
        let (scaling_obj, field) = match (params, self.get("rope_scaling")) {
            (Some(p), _) => (Some(p), "rope_parameters"),
            (None, Some(Value::Object(o))) => (Some(o), "rope_scaling"),
            (None, Some(v)) => return Err(self.err("rope_scaling", format!("must be an object, found {v}"))),
            (None, None) => (None, "rope_scaling"),
        };
        let scaling = match scaling_obj {
            None => None,
            Some(o) => {
                let kind = o.get("rope_type").or_else(|| o.get("type")).and_then(Value::as_str).unwrap_or("default");
                let get = |n: &str| -> Result<f64> {
                    o.get(n).and_then(Value::as_f64).ok_or_else(|| self.err(field, format!("`{n}` is missing or not a number (needed by rope_type \"{kind}\")")))
                };
                match kind {
                    "default" => None,
                    "linear" => Some(RopeScaling::Linear { factor: get("factor")? }),
                    "llama3" => Some(RopeScaling::Llama3 {
                        factor: get("factor")?,
                        low_freq_factor: get("low_freq_factor")?,
                        high_freq_factor: get("high_freq_factor")?,
                        original_max_position: get("original_max_position_embeddings")? as usize,
                    }),
                    other => {
                        return Err(self.err(field, format!("has rope_type \"{other}\"; burnlens implements default, linear and llama3")));
                    }
                }
            }
        };
        Ok(RopeFields { base, fraction, scaling })
    }

    pub(crate) fn opt_string(&self, names: &[&str]) -> Result<Option<String>> {
        match self.first(names) {
            None => Ok(None),
            Some((_, Value::String(s))) => Ok(Some(s.clone())),
            Some((name, v)) => Err(self.err(&name, format!("must be a string, found {v}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(m.n_params(), 124_439_808);
    }

    #[test]
    fn gpt2_legacy_n_ctx_and_inverse_layer_scale() {
        let c = parse(r#"{"model_type": "gpt2", "n_ctx": 64, "n_embd": 32, "n_head": 4, "n_layer": 2,
                          "scale_attn_by_inverse_layer_idx": true, "n_inner": 80}"#)
        .unwrap();
        assert_eq!(c.model.n_ctx, 64);
        assert_eq!(c.model.d_mlp, Some(80));
        assert!((c.model.score_factor(1) - 1.0 / (8f64.sqrt() * 2.0)).abs() < 1e-12);
    }

    #[test]
    fn gpt_neo_attention_types_expand() {
        let c = parse(r#"{"model_type": "gpt_neo", "hidden_size": 64, "num_heads": 4, "num_layers": 3,
                          "attention_types": [[["global", "local"], 1], [["local"], 1]], "window_size": 5}"#)
        .unwrap();
        assert_eq!(c.model.spans, vec![AttentionSpan::Global, AttentionSpan::Local(5), AttentionSpan::Local(5)]);
        assert_eq!(c.model.score_scale, ScoreScale::None);
        assert!(!c.model.qkv_bias);
        assert_eq!(c.model.d_mlp, Some(256));
    }

    #[test]
    fn gpt_neo_125m_defaults() {
        let c = parse(r#"{"model_type": "gpt_neo", "hidden_size": 768, "num_heads": 12, "num_layers": 12,
                          "attention_types": [[["global", "local"], 6]]}"#)
        .unwrap();
        assert_eq!(c.model.spans[1], AttentionSpan::Local(256));
        assert_eq!(c.model.n_ctx, 2048);
        assert_eq!(c.model.n_params(), 125_198_592);
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
        assert!(msg(r#"{"model_type": "gpt_neo", "num_layers": 2, "attention_types": [[["global", "local"], 2]]}"#)
            .contains("describes 4 layers but num_layers is 2"));
        assert!(msg(r#"{"model_type": "gpt_neo", "num_layers": 2, "window_size": 0, "attention_types": [[["global", "local"], 1]]}"#)
            .contains("`window_size` is 0"));
        assert!(msg("{not json").contains("config.json: not valid JSON"));
        // Phi-3-mini-128k's long-context rope is named, not silently run as plain rope.
        assert!(msg(r#"{"model_type": "phi3", "rope_scaling": {"type": "longrope", "short_factor": [1.0], "long_factor": [1.0]}}"#)
            .contains("has rope_type \"longrope\"; burnlens implements default, linear and llama3"));
        assert!(msg(r#"{"model_type": "gptj", "n_embd": 64, "n_head": 4, "rotary_dim": 20}"#).contains("`rotary_dim` = 20 must be even and at most the head size 16"));
        assert!(msg(r#"{"model_type": "gemma2", "use_bidirectional_attention": true}"#).contains("causal decoders only"));
    }
}

