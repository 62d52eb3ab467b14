//! Text to token ids and back: a character vocabulary built from a text file, or any Hugging
//! Face `tokenizer.json` (GPT-2's byte-level BPE) through the `tokenizers` crate.

use std::path::{Path, PathBuf};

use crate::error::{HfError, Result};

/// File name of a character vocabulary saved next to a model.
pub const CHAR_VOCAB_FILE: &str = "char_vocab.json";
/// File name of a Hugging Face tokenizer.
pub const HF_TOKENIZER_FILE: &str = "tokenizer.json";

#[derive(Clone)]
pub enum Tokenizer {
    /// One id per distinct character, in sorted order (as nanoGPT's `prepare.py`).
    Char { chars: Vec<char> },
    /// A Hugging Face tokenizer and the file it came from.
    Hf { inner: Box<tokenizers::Tokenizer>, path: PathBuf },
}

impl Tokenizer {
    /// The character vocabulary of `text`.
    pub fn char_from_text(text: &str) -> Self {
        let mut chars: Vec<char> = text.chars().collect();
        chars.sort_unstable();
        chars.dedup();
        Tokenizer::Char { chars }
    }

    /// Read a `tokenizer.json` or a `char_vocab.json`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let err = |msg: String| HfError::Tokenizer { path: path.to_path_buf(), msg };
        if path.file_name().is_some_and(|n| n == CHAR_VOCAB_FILE) {
            let text = std::fs::read_to_string(path).map_err(|e| HfError::io(path, e))?;
            let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| err(format!("not valid JSON: {e}")))?;
            let chars = v["chars"]
                .as_array()
                .and_then(|a| a.iter().map(|c| c.as_str().and_then(|s| s.chars().next())).collect::<Option<Vec<_>>>())
                .ok_or_else(|| err("expected {\"chars\": [\"a\", \"b\", ...]}".into()))?;
            return Ok(Tokenizer::Char { chars });
        }
        if !path.is_file() {
            return Err(HfError::io(path, std::io::Error::new(std::io::ErrorKind::NotFound, "no such tokenizer file")));
        }
        let inner = tokenizers::Tokenizer::from_file(path).map_err(|e| err(format!("not a readable tokenizer.json: {e}")))?;
        Ok(Tokenizer::Hf { inner: Box::new(inner), path: path.to_path_buf() })
    }

    /// The tokenizer saved in a model or run directory, if there is one.
    pub fn find_in_dir(dir: &Path) -> Option<Result<Self>> {
        [HF_TOKENIZER_FILE, CHAR_VOCAB_FILE].iter().map(|f| dir.join(f)).find(|p| p.is_file()).map(|p| Self::from_file(&p))
    }

    /// Number of ids the tokenizer can produce.
    pub fn vocab_size(&self) -> usize {
        match self {
            Tokenizer::Char { chars } => chars.len(),
            Tokenizer::Hf { inner, .. } => inner.get_vocab_size(true),
        }
    }

    /// `"char"` or `"bpe"` (any HF tokenizer).
    pub fn kind(&self) -> &'static str {
        match self {
            Tokenizer::Char { .. } => "char",
            Tokenizer::Hf { .. } => "bpe",
        }
    }

    /// Token ids of `text`. A character outside a char vocabulary is an error naming it.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        match self {
            Tokenizer::Char { chars } => text
                .chars()
                .enumerate()
                .map(|(i, c)| {
                    chars.binary_search(&c).map(|id| id as u32).map_err(|_| HfError::Tokenizer {
                        path: PathBuf::from(CHAR_VOCAB_FILE),
                        msg: format!("character {c:?} at position {i} is not in the vocabulary of {} characters", chars.len()),
                    })
                })
                .collect(),
            Tokenizer::Hf { inner, path } => inner
                .encode(text, false)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| HfError::Tokenizer { path: path.clone(), msg: format!("cannot encode text: {e}") }),
        }
    }

    /// Text of token ids (ids the tokenizer does not know are skipped).
    pub fn decode(&self, ids: &[u32]) -> String {
        match self {
            Tokenizer::Char { chars } => ids.iter().filter_map(|&i| chars.get(i as usize)).collect(),
            Tokenizer::Hf { inner, .. } => inner.decode(ids, false).unwrap_or_default(),
        }
    }

    /// Save into `dir` as `tokenizer.json` or `char_vocab.json`; returns the file written.
    pub fn save(&self, dir: &Path) -> Result<PathBuf> {
        match self {
            Tokenizer::Char { chars } => {
                let path = dir.join(CHAR_VOCAB_FILE);
                let strings: Vec<String> = chars.iter().map(|c| c.to_string()).collect();
                let doc = serde_json::json!({ "kind": "char", "chars": strings });
                crate::files::write_atomic(&path, serde_json::to_string_pretty(&doc).expect("json").as_bytes())?;
                Ok(path)
            }
            Tokenizer::Hf { path: src, .. } => {
                let path = dir.join(HF_TOKENIZER_FILE);
                std::fs::copy(src, &path).map_err(|e| HfError::io(&path, e))?;
                Ok(path)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn char_vocab_round_trips_and_rejects_unknown_characters() {
        let t = Tokenizer::char_from_text("hello world");
        assert_eq!(t.vocab_size(), 8);
        let ids = t.encode("hold").unwrap();
        assert_eq!(t.decode(&ids), "hold");
        let e = t.encode("hex").unwrap_err().to_string();
        assert!(e.contains("character 'x' at position 2 is not in the vocabulary of 8 characters"), "{e}");
        let dir = std::env::temp_dir().join(format!("burnlens-charvocab-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let saved = Tokenizer::from_file(&t.save(&dir).unwrap()).unwrap();
        assert_eq!(saved.encode("hold").unwrap(), ids);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
