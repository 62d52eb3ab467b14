//! `config.json` of the supported families, translated into a [`TransformerConfig`].
//!
//! Absent fields take the defaults of the family's `transformers` config class
//! (`GPT2Config`, `GPTNeoConfig`, `GPTNeoXConfig`, `LlamaConfig`, `Qwen2Config`,
//! `MistralConfig`), so a config written by any version of `save_pretrained`, or a
//! hand-written minimal one, reads the way `transformers` reads it. Rotary settings are read
//! from transformers 5's `rope_parameters` and from the older `rope_theta` / `rope_scaling` /
//! `rotary_pct` / `rotary_emb_base` fields.

use std::path::{Path, PathBuf};

use burnlens_model::{ActivationFn, AttentionSpan, MlpKind, NormKind, Positional, RopeScaling, Rotary, ScoreScale, TransformerConfig};
use serde_json::{Map, Value};

use crate::error::{HfError, Result};

/// The model families burnlens reads and writes; in run configs and `model.json` by their
/// `model_type` (`gpt2`, `gpt_neo`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Family {
    #[serde(rename = "gpt2")]
    Gpt2,
    #[serde(rename = "gpt_neo")]
    GptNeo,
    /// GPT-NeoX (Pythia).
    #[serde(rename = "gpt_neox")]
    GptNeoX,
    /// Llama 1–3, TinyLlama, SmolLM.
    #[serde(rename = "llama")]
    Llama,
    #[serde(rename = "qwen2")]
    Qwen2,
    #[serde(rename = "mistral")]
    Mistral,
}

impl Family {
    /// Every family, in the order errors list them: the one list the others derive from.
    pub const ALL: [Family; 6] = [Family::Gpt2, Family::GptNeo, Family::GptNeoX, Family::Llama, Family::Qwen2, Family::Mistral];

    /// `model_type` values understood, in the order they are listed in errors.
    pub fn supported() -> Vec<&'static str> {
        Self::ALL.iter().map(|f| f.model_type()).collect()
    }

    pub fn model_type(self) -> &'static str {
        match self {
            Family::Gpt2 => "gpt2",
            Family::GptNeo => "gpt_neo",
            Family::GptNeoX => "gpt_neox",
            Family::Llama => "llama",
            Family::Qwen2 => "qwen2",
            Family::Mistral => "mistral",
        }
    }

    pub fn from_model_type(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.model_type() == s)
    }

    /// The prefix of the base model's tensors in a `*ForCausalLM` checkpoint.
    pub fn base_prefix(self) -> &'static str {
        match self {
            Family::Gpt2 | Family::GptNeo => "transformer.",
            Family::GptNeoX => "gpt_neox.",
            Family::Llama | Family::Qwen2 | Family::Mistral => "model.",
        }
    }

    /// The HF name of the token embedding (without the prefix).
    pub fn embed_name(self) -> &'static str {
        match self {
            Family::Gpt2 | Family::GptNeo => "wte.weight",
            Family::GptNeoX => "embed_in.weight",
            Family::Llama | Family::Qwen2 | Family::Mistral => "embed_tokens.weight",
        }
    }
}

impl std::fmt::Display for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.model_type())
    }
}

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
    let model = match family {
        Family::Gpt2 => gpt2(&f)?,
        Family::GptNeo => gpt_neo(&f)?,
        Family::GptNeoX => gpt_neox(&f)?,
        Family::Llama | Family::Qwen2 | Family::Mistral => llama(&f, family)?,
    };
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

fn gpt2(f: &Fields) -> Result<TransformerConfig> {
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
        qkv_bias: true,
        activation: activation(f)?,
        layer_norm_eps: f.float("layer_norm_epsilon", 1e-5)?,
        positional: Positional::Residual,
        ..classic_defaults()
    })
}

/// The settings GPT-2 and GPT-Neo share: LayerNorm, learned positions, biases, tied
/// unembedding, plain MLP.
fn classic_defaults() -> TransformerConfig {
    TransformerConfig::gpt2_like(1, 1, 1, 1, 1)
}

fn gpt_neo(f: &Fields) -> Result<TransformerConfig> {
    let d_model = f.size(&["hidden_size"], 2048)?;
    let n_heads = f.size(&["num_heads"], 16)?;
    let n_layers = f.layers(&["num_layers"], 24)?;
    let window = f.count(&["window_size"], 256)?;
    let kinds = attention_layers(f)?;
    if kinds.len() != n_layers {
        return Err(f.err(
            "attention_types",
            format!("describes {} layers but num_layers is {n_layers}; they must agree", kinds.len()),
        ));
    }
    let spans = kinds
        .iter()
        .map(|k| if k == "local" { AttentionSpan::Local(window) } else { AttentionSpan::Global })
        .collect();
    if window == 0 && kinds.iter().any(|k| k == "local") {
        return Err(f.err("window_size", "is 0; a local attention layer needs a window of at least 1 token"));
    }
    Ok(TransformerConfig {
        vocab_size: f.size(&["vocab_size"], 50257)?,
        n_ctx: f.size(&["max_position_embeddings"], 2048)?,
        d_model,
        n_heads,
        d_head: head_dim(f, d_model, n_heads, "hidden_size", "num_heads")?,
        d_mlp: Some(f.opt_size(&["intermediate_size"])?.unwrap_or(4 * d_model)),
        spans,
        score_scale: ScoreScale::None,
        scale_by_inverse_layer: false,
        qkv_bias: false,
        activation: activation(f)?,
        layer_norm_eps: f.float("layer_norm_epsilon", 1e-5)?,
        positional: Positional::Residual,
        ..classic_defaults()
    })
}

/// GPT-NeoX (Pythia): rotary on the first `rotary_pct` of each head, parallel residual by
/// default, untied `embed_out`.
fn gpt_neox(f: &Fields) -> Result<TransformerConfig> {
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
        score_scale: ScoreScale::InvSqrtDHead,
        scale_by_inverse_layer: false,
        qkv_bias: bias,
        activation: activation_named(f, "hidden_act", "gelu")?,
        layer_norm_eps: f.float("layer_norm_eps", 1e-5)?,
        positional: Positional::Rotary,
        dropout: 0.0,
        untied_unembed: !f.bool("tie_word_embeddings", false)?,
        unembed_bias: false,
        norm: NormKind::LayerNorm,
        mlp: MlpKind::Standard,
        n_kv_heads: None,
        parallel_residual: f.bool("use_parallel_residual", true)?,
        rotary: Some(rope.into_rotary(f, d_head)?),
        attn_out_bias: bias,
        mlp_bias: true,
    })
}

/// Llama, Qwen2 and Mistral: RMSNorm, rotary over whole heads, gated SiLU MLP, grouped-query
/// attention; Qwen2 has q/k/v biases; Mistral and Qwen2 may slide a window.
fn llama(f: &Fields, family: Family) -> Result<TransformerConfig> {
    let d_model = f.size(&["hidden_size"], 4096)?;
    let n_heads = f.size(&["num_attention_heads"], 32)?;
    let n_layers = f.layers(&["num_hidden_layers"], 32)?;
    let n_kv = f.size(&["num_key_value_heads"], n_heads)?;
    let d_head = match f.opt_size(&["head_dim"])? {
        Some(d) => d,
        None => head_dim(f, d_model, n_heads, "hidden_size", "num_attention_heads")?,
    };
    let rope = f.rope(&[], 10000.0, &[], 1.0)?;
    let attention_bias = f.bool("attention_bias", false)?;
    let (qkv_bias, out_bias) = match family {
        Family::Qwen2 => (true, false),
        _ => (attention_bias, attention_bias),
    };
    let spans = sliding_windows(f, family, n_layers)?;
    Ok(TransformerConfig {
        vocab_size: f.size(&["vocab_size"], 32000)?,
        n_ctx: f.size(&["max_position_embeddings"], 2048)?,
        d_model,
        n_heads,
        d_head,
        d_mlp: Some(f.size(&["intermediate_size"], 11008)?),
        spans,
        score_scale: ScoreScale::InvSqrtDHead,
        scale_by_inverse_layer: false,
        qkv_bias,
        activation: activation_named(f, "hidden_act", "silu")?,
        layer_norm_eps: f.float("rms_norm_eps", 1e-6)?,
        positional: Positional::Rotary,
        dropout: 0.0,
        untied_unembed: !f.bool("tie_word_embeddings", false)?,
        unembed_bias: false,
        norm: NormKind::RmsNorm,
        mlp: MlpKind::Gated,
        n_kv_heads: Some(n_kv),
        parallel_residual: false,
        rotary: Some(rope.into_rotary(f, d_head)?),
        attn_out_bias: out_bias,
        mlp_bias: f.bool("mlp_bias", false)?,
    })
}

/// Per-layer spans of the Llama family: Mistral slides `sliding_window` over every layer
/// when it is set; Qwen2 follows `layer_types` (transformers 5) or `use_sliding_window` with
/// `max_window_layers` (layers from that index on slide).
fn sliding_windows(f: &Fields, family: Family, n_layers: usize) -> Result<Vec<AttentionSpan>> {
    let window = f.opt_size(&["sliding_window"])?;
    let local = |w: Option<usize>| -> Result<AttentionSpan> {
        w.map(AttentionSpan::Local).ok_or_else(|| f.err("sliding_window", "is missing but a layer uses sliding attention"))
    };
    if let Some(types) = f.get("layer_types") {
        let list = types.as_array().filter(|a| a.len() == n_layers).ok_or_else(|| {
            f.err("layer_types", format!("must list \"full_attention\" or \"sliding_attention\" for each of the {n_layers} layers"))
        })?;
        return list
            .iter()
            .map(|t| match t.as_str() {
                Some("full_attention") => Ok(AttentionSpan::Global),
                Some("sliding_attention") => local(window),
                _ => Err(f.err("layer_types", format!("has {t}; expected \"full_attention\" or \"sliding_attention\""))),
            })
            .collect();
    }
    match family {
        Family::Mistral => Ok(vec![window.map_or(AttentionSpan::Global, AttentionSpan::Local); n_layers]),
        Family::Qwen2 if f.bool("use_sliding_window", false)? => {
            let from = f.count(&["max_window_layers"], 28)?;
            (0..n_layers).map(|l| if l >= from { local(window) } else { Ok(AttentionSpan::Global) }).collect()
        }
        _ => Ok(vec![AttentionSpan::Global; n_layers]),
    }
}

/// Rotary settings as read from a config, before they are checked against the head size.
struct RopeFields {
    base: f64,
    fraction: f64,
    scaling: Option<RopeScaling>,
}

impl RopeFields {
    fn into_rotary(self, f: &Fields, d_head: usize) -> Result<Rotary> {
        // HF rounds down: int(head_dim * partial_rotary_factor).
        let dims = (d_head as f64 * self.fraction) as usize;
        if dims < 2 || dims % 2 != 0 {
            return Err(f.err("partial_rotary_factor", format!("gives {dims} rotary dimensions of a {d_head}-wide head; expected an even number of at least 2")));
        }
        if !(self.base.is_finite() && self.base > 1.0) {
            return Err(f.err("rope_theta", format!("must be a number above 1, found {}", self.base)));
        }
        Ok(Rotary { dims, base: self.base, scaling: self.scaling })
    }
}

/// GPT-Neo's per-layer attention kinds: `attention_types` (`[[["global", "local"], 12]]`)
/// expanded, checked against `attention_layers` when the file has both.
fn attention_layers(f: &Fields) -> Result<Vec<String>> {
    let expanded = match f.get("attention_types") {
        None => ["global", "local"].repeat(12).into_iter().map(String::from).collect(),
        Some(v) => {
            let bad = || f.err("attention_types", r#"must look like [[["global", "local"], 12]]: a list of [list of "global"/"local", repeat count]"#);
            let mut out = Vec::new();
            for item in v.as_array().ok_or_else(bad)? {
                let pair = item.as_array().filter(|p| p.len() == 2).ok_or_else(bad)?;
                let kinds = pair[0].as_array().ok_or_else(bad)?;
                let times = pair[1].as_u64().ok_or_else(bad)?;
                let kinds: Vec<String> = kinds.iter().map(|k| k.as_str().map(String::from).ok_or_else(bad)).collect::<Result<_>>()?;
                let total = (times as u128) * (kinds.len() as u128) + out.len() as u128;
                if total > burnlens_model::MAX_LAYERS as u128 {
                    return Err(f.err("attention_types", format!("expands to {total} layers; at most {} are supported", burnlens_model::MAX_LAYERS)));
                }
                for _ in 0..times {
                    out.extend(kinds.iter().cloned());
                }
            }
            out
        }
    };
    for k in &expanded {
        if k != "global" && k != "local" {
            return Err(f.err("attention_types", format!("has attention kind \"{k}\"; expected \"global\" or \"local\"")));
        }
    }
    if let Some(v) = f.get("attention_layers") {
        let listed: Option<Vec<&str>> = v.as_array().and_then(|a| a.iter().map(Value::as_str).collect());
        match listed {
            Some(l) if l == expanded.iter().map(String::as_str).collect::<Vec<_>>() => {}
            Some(_) => return Err(f.err("attention_layers", "disagrees with the expansion of attention_types")),
            None => return Err(f.err("attention_layers", "must be a list of \"global\"/\"local\" strings")),
        }
    }
    Ok(expanded)
}

fn head_dim(f: &Fields, d_model: usize, n_heads: usize, d_name: &str, h_name: &str) -> Result<usize> {
    if d_model % n_heads != 0 {
        return Err(f.err(d_name, format!("= {d_model} is not divisible by {h_name} = {n_heads}")));
    }
    Ok(d_model / n_heads)
}

fn activation(f: &Fields) -> Result<ActivationFn> {
    activation_named(f, "activation_function", "gelu_new")
}

fn activation_named(f: &Fields, field: &str, default: &str) -> Result<ActivationFn> {
    let name = f.string(field, Some(default))?;
    ActivationFn::from_hf_name(&name)
        .ok_or_else(|| f.err(field, format!("\"{name}\" is not supported; expected one of {}", ActivationFn::HF_NAMES.join(", "))))
}

/// Typed access to the fields of a JSON object, with errors naming the file and field.
struct Fields<'a> {
    obj: &'a Map<String, Value>,
    path: PathBuf,
}

impl Fields<'_> {
    fn err(&self, field: &str, msg: impl Into<String>) -> HfError {
        HfError::Field { path: self.path.clone(), field: field.to_string(), msg: msg.into() }
    }

    /// The value of a field, treating JSON `null` as absent.
    fn get(&self, name: &str) -> Option<&Value> {
        self.obj.get(name).filter(|v| !v.is_null())
    }

    /// The first of `names` that is present.
    fn first(&self, names: &[&str]) -> Option<(String, &Value)> {
        names.iter().find_map(|n| self.get(n).map(|v| (n.to_string(), v)))
    }

    fn opt_uint(&self, names: &[&str]) -> Result<Option<(String, u64)>> {
        match self.first(names) {
            None => Ok(None),
            Some((name, v)) => match v.as_u64() {
                Some(n) => Ok(Some((name, n))),
                None => Err(self.err(&name, format!("must be a non-negative integer, found {v}"))),
            },
        }
    }

    /// A size that must be at least 1.
    fn opt_size(&self, names: &[&str]) -> Result<Option<usize>> {
        match self.opt_uint(names)? {
            Some((name, 0)) => Err(self.err(&name, "must be at least 1, found 0")),
            Some((_, n)) => Ok(Some(n as usize)),
            None => Ok(None),
        }
    }

    fn size(&self, names: &[&str], default: usize) -> Result<usize> {
        Ok(self.opt_size(names)?.unwrap_or(default))
    }

    /// A count that may be any non-negative integer.
    fn count(&self, names: &[&str], default: usize) -> Result<usize> {
        Ok(self.opt_uint(names)?.map_or(default, |(_, n)| n as usize))
    }

    /// A layer count: any non-negative integer up to [`burnlens_model::MAX_LAYERS`].
    fn layers(&self, names: &[&str], default: usize) -> Result<usize> {
        match self.opt_uint(names)? {
            Some((name, n)) if n > burnlens_model::MAX_LAYERS as u64 => {
                Err(self.err(&name, format!("= {n} layers; at most {} are supported", burnlens_model::MAX_LAYERS)))
            }
            Some((_, n)) => Ok(n as usize),
            None => Ok(default),
        }
    }

    fn float(&self, name: &str, default: f64) -> Result<f64> {
        match self.get(name) {
            None => Ok(default),
            Some(v) => v.as_f64().ok_or_else(|| self.err(name, format!("must be a number, found {v}"))),
        }
    }

    fn bool(&self, name: &str, default: bool) -> Result<bool> {
        match self.get(name) {
            None => Ok(default),
            Some(v) => v.as_bool().ok_or_else(|| self.err(name, format!("must be true or false, found {v}"))),
        }
    }

    fn string(&self, name: &str, default: Option<&str>) -> Result<String> {
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
    fn rope(&self, legacy_base: &[&str], base: f64, legacy_fraction: &[&str], fraction: f64) -> Result<RopeFields> {
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

    fn opt_string(&self, names: &[&str]) -> Result<Option<String>> {
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
    }
}

#[cfg(test)]
mod family_tests {
    use super::Family;

    /// Every family's `model_type` reads back as that family, and serde uses the same names.
    #[test]
    fn names_agree_everywhere() {
        for f in Family::ALL {
            assert_eq!(Family::from_model_type(f.model_type()), Some(f));
            assert_eq!(serde_json::to_value(f).unwrap(), serde_json::Value::from(f.model_type()));
            assert_eq!(f.to_string(), f.model_type());
        }
        assert_eq!(Family::supported().len(), Family::ALL.len());
        assert_eq!(Family::from_model_type("gemma2"), None);
    }
}
