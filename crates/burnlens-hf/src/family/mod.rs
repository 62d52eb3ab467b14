//! The model families burnlens reads and writes, one file each, behind [`FamilySpec`].
//!
//! A family's file owns everything about it: its `model_type`, the prefix of its base
//! model's tensors, how its `config.json` reads into a [`TransformerConfig`] and is written
//! back, its tensor table (import and export both read it) and the defaults of a fresh model
//! for training. The [`registry!`] below lists them; [`Family`], the list of supported
//! `model_type`s in errors, the legacy-buffer prefixes and the run config's `model.family`
//! all come from it. Adding a family is one file here plus one registry line.

use burnlens_model::TransformerConfig;

use crate::layout::{Entry, Tensors};
pub use spec::{FamilySpec, FreshShape, Names};

mod gemma;
mod gpt2;
mod gpt_neo;
mod gpt_neox;
mod gptj;
mod llama;
mod olmo2;
mod phi3;
mod qwen3;
pub mod spec;

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

    /// The full name of `e` in this family's files (under the base-model prefix or not).
    pub fn full_name(self, e: &Entry) -> String {
        if e.prefixed { format!("{}{}", self.base_prefix(), e.hf) } else { e.hf.clone() }
    }

    /// The tensors a checkpoint of this family with architecture `cfg` must hold (a tied
    /// `lm_head.weight` is optional and not listed).
    pub fn entries(self, cfg: &TransformerConfig) -> Vec<Entry> {
        let mut t = Tensors::new(cfg);
        self.spec().tensors(cfg, &mut t);
        t.into_entries()
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

/// Buffers older HF versions saved next to the weights; never parameters.
pub fn is_legacy_buffer(name: &str) -> bool {
    let mut prefixes: Vec<&str> = Family::ALL.iter().map(|f| f.base_prefix()).collect();
    prefixes.sort();
    prefixes.dedup();
    let name = prefixes.iter().fold(name, |n, p| n.strip_prefix(p).unwrap_or(n));
    let Some(rest) = name.strip_prefix("h.").or_else(|| name.strip_prefix("layers.")) else { return false };
    let Some((layer, tail)) = rest.split_once('.') else { return false };
    layer.parse::<usize>().is_ok()
        && [
            "attn.bias",
            "attn.masked_bias",
            "attn.attention.bias",
            "attn.attention.masked_bias",
            "attention.bias",
            "attention.masked_bias",
            "attention.rotary_emb.inv_freq",
            "self_attn.rotary_emb.inv_freq",
        ]
        .contains(&tail)
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
