//! What a family is, the layer every family file stands on: the [`FamilySpec`] trait each
//! file implements, its [`Names`] in Hugging Face's files, the [`FreshShape`] of a new model,
//! and the `config.json` writers several families share. The registry (`mod.rs`) sits on
//! top and knows every family; this file knows none.

use burnlens_model::TransformerConfig;
use serde_json::Value;

use crate::error::Result;
use crate::fields::Fields;
use crate::layout::Tensors;

/// A family's names in Hugging Face's files.
#[derive(Debug, Clone, Copy)]
pub struct Names {
    /// `model_type` in `config.json`; also the family's name in run configs and `model.json`.
    pub model_type: &'static str,
    /// The `*ForCausalLM` class written into `architectures` on export.
    pub architecture: &'static str,
    /// The prefix of the base model's tensors in a `*ForCausalLM` checkpoint.
    pub base_prefix: &'static str,
    /// The HF name of the token embedding (without the prefix).
    pub embed_name: &'static str,
}

/// What defines a family.
pub trait FamilySpec: Sync {
    /// Its names in Hugging Face's files.
    fn names(&self) -> Names;
    /// `config.json` (absent fields at the defaults of the family's `transformers` config
    /// class) into burnlens's architecture.
    fn parse(&self, f: &Fields) -> Result<TransformerConfig>;
    /// The tensors a checkpoint of this family with architecture `cfg` holds.
    fn tensors(&self, cfg: &TransformerConfig, t: &mut Tensors);
    /// The family's fields of `config.json` for `cfg`, or in words why the family cannot
    /// hold it. (Whatever a rule forgets, the export's round trip catches.)
    fn config_json(&self, cfg: &TransformerConfig) -> std::result::Result<Value, String>;
    /// A fresh model of this family for training, before the run config's overrides.
    fn fresh(&self, shape: &FreshShape) -> TransformerConfig;
}

/// The sizes of a fresh model.
#[derive(Debug, Clone, Copy)]
pub struct FreshShape {
    pub vocab: usize,
    pub n_ctx: usize,
    pub d_model: usize,
    pub n_layers: usize,
    pub n_heads: usize,
}

/// `rope_parameters` of transformers 5 for `r` on a `d_head`-wide head.
pub(crate) fn rope_parameters(r: &burnlens_model::Rotary, d_head: usize) -> Value {
    use burnlens_model::RopeScaling;
    use serde_json::json;
    let mut p = json!({"rope_theta": r.base, "rope_type": "default"});
    if r.dims != d_head {
        p["partial_rotary_factor"] = json!(r.dims as f64 / d_head as f64);
    }
    match r.scaling {
        None => {}
        Some(RopeScaling::Linear { factor }) => {
            p["rope_type"] = json!("linear");
            p["factor"] = json!(factor);
        }
        Some(RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position }) => {
            p["rope_type"] = json!("llama3");
            p["factor"] = json!(factor);
            p["low_freq_factor"] = json!(low_freq_factor);
            p["high_freq_factor"] = json!(high_freq_factor);
            p["original_max_position_embeddings"] = json!(original_max_position);
        }
    }
    p
}

/// The one window size of the local layers, if any (an error naming them if they differ).
pub(crate) fn one_window(cfg: &TransformerConfig) -> std::result::Result<Option<usize>, String> {
    let mut windows: Vec<usize> = cfg.spans.iter().filter_map(|s| if let burnlens_model::AttentionSpan::Local(w) = s { Some(*w) } else { None }).collect();
    windows.dedup();
    match windows.len() {
        0 => Ok(None),
        1 => Ok(Some(windows[0])),
        _ => Err(format!("one sliding window size for all local layers, found {windows:?}")),
    }
}

/// `layer_types` of transformers 5: `full_attention` / `sliding_attention` per layer.
pub(crate) fn layer_types(cfg: &TransformerConfig) -> Value {
    let types: Vec<&str> =
        cfg.spans.iter().map(|s| if matches!(s, burnlens_model::AttentionSpan::Local(_)) { "sliding_attention" } else { "full_attention" }).collect();
    serde_json::json!(types)
}

/// The activation's name as the rotary families' `hidden_act` spells it.
pub(crate) fn hidden_act(a: burnlens_model::ActivationFn) -> &'static str {
    if a == burnlens_model::ActivationFn::Silu { "silu" } else { a.hf_name() }
}
