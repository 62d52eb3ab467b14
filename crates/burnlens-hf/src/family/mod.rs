//! The model families burnlens reads and writes, one file each, behind [`FamilySpec`].
//!
//! A family's file owns everything about it: its `model_type`, the prefix of its base
//! model's tensors, how its `config.json` reads into a [`TransformerConfig`] and is written
//! back, its tensor table (import and export both read it) and the defaults of a fresh model
//! for training. The [`registry!`] below lists them; [`Family`], the list of supported
//! `model_type`s in errors, the legacy-buffer prefixes and the run config's `model.family`
//! all come from it. Adding a family is one file here plus one registry line.

use burnlens_model::TransformerConfig;
use serde_json::Value;

use crate::config::Fields;
use crate::error::Result;
use crate::layout::Tensors;

mod gemma;
mod gpt2;
mod gpt_neo;
mod gpt_neox;
mod gptj;
mod llama;
mod olmo2;
mod phi3;
mod qwen3;

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

/// Declares [`Family`] from `Variant => spec` lines: the enum, [`Family::ALL`] and
/// [`Family::spec`].
macro_rules! registry {
    ($($(#[$doc:meta])* $variant:ident => $spec:expr,)*) => {
        /// A model family, named in files by its `model_type` (`gpt2`, `gpt_neo`, ...).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Family {
            $($(#[$doc])* $variant,)*
        }

        impl Family {
            /// Every family, in the order errors list them.
            pub const ALL: &'static [Family] = &[$(Family::$variant),*];

            /// The family's definition.
            pub fn spec(self) -> &'static dyn FamilySpec {
                match self {
                    $(Family::$variant => &$spec,)*
                }
            }
        }
    };
}

registry! {
    Gpt2 => gpt2::Gpt2,
    GptNeo => gpt_neo::GptNeo,
    /// GPT-NeoX (Pythia).
    GptNeoX => gpt_neox::GptNeoX,
    /// Llama 1–3, TinyLlama, SmolLM.
    Llama => llama::LLAMA,
    Qwen2 => llama::QWEN2,
    Mistral => llama::MISTRAL,
    Qwen3 => qwen3::Qwen3,
    Olmo2 => olmo2::Olmo2,
    GptJ => gptj::GptJ,
    Gemma2 => gemma::GEMMA2,
    Gemma3 => gemma::GEMMA3,
    Phi3 => phi3::Phi3,
}

impl Family {
    /// `model_type` values understood, in the order they are listed in errors.
    pub fn supported() -> Vec<&'static str> {
        Self::ALL.iter().map(|f| f.model_type()).collect()
    }

    pub fn model_type(self) -> &'static str {
        self.spec().names().model_type
    }

    pub fn from_model_type(s: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|f| f.model_type() == s)
    }

    /// The prefix of the base model's tensors in a `*ForCausalLM` checkpoint.
    pub fn base_prefix(self) -> &'static str {
        self.spec().names().base_prefix
    }

    /// The HF name of the token embedding (without the prefix).
    pub fn embed_name(self) -> &'static str {
        self.spec().names().embed_name
    }
}

impl std::fmt::Display for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.model_type())
    }
}

impl serde::Serialize for Family {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.model_type())
    }
}

impl<'de> serde::Deserialize<'de> for Family {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Family::from_model_type(&s)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown family \"{s}\"; expected one of {}", Family::supported().join(", "))))
    }
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
    let types: Vec<&str> = cfg.spans.iter().map(|s| if matches!(s, burnlens_model::AttentionSpan::Local(_)) { "sliding_attention" } else { "full_attention" }).collect();
    serde_json::json!(types)
}

/// The activation's name as the rotary families' `hidden_act` spells it.
pub(crate) fn hidden_act(a: burnlens_model::ActivationFn) -> &'static str {
    if a == burnlens_model::ActivationFn::Silu { "silu" } else { a.hf_name() }
}

#[cfg(test)]
mod tests {
    use super::Family;

    /// Every family's `model_type` reads back as that family, and serde uses the same names.
    #[test]
    fn names_agree_everywhere() {
        for &f in Family::ALL {
            assert_eq!(Family::from_model_type(f.model_type()), Some(f));
            assert_eq!(serde_json::to_value(f).unwrap(), serde_json::Value::from(f.model_type()));
            assert_eq!(serde_json::from_value::<Family>(serde_json::Value::from(f.model_type())).unwrap(), f);
            assert_eq!(f.to_string(), f.model_type());
        }
        assert_eq!(Family::supported().len(), Family::ALL.len());
        assert_eq!(Family::from_model_type("falcon"), None);
        let err = serde_json::from_value::<Family>(serde_json::Value::from("falcon")).unwrap_err().to_string();
        assert!(err.contains("unknown family \"falcon\""), "{err}");
    }
}
