//! Training data: character-level or BPE-tokenised text with a deterministic
//! train/validation split, and synthetic repeated-token sequences that need no file.

use std::path::{Path, PathBuf};

use burnlens_hf::Tokenizer;
use burnlens_model::Rng;
use serde_json::{Value, json};

use crate::config::{DataKind, DataSection};
use crate::error::{Result, TrainError};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    Train,
    Val,
}

enum Source {
    Tokens {
        train: Vec<u32>,
        val: Vec<u32>,
    },
    /// Random tokens `r` (length drawn from `min_len..=max_len`) repeated until the sequence
    /// is full: predicting the repeats pays only for a model that learned to look back at
    /// what followed the previous occurrence of the current token (induction).
    Repeated {
        vocab: usize,
        min_len: usize,
        max_len: usize,
    },
}

/// Everything the training loop draws batches from.
pub struct Dataset {
    pub tokenizer: Option<Tokenizer>,
    pub vocab_size: usize,
    source: Source,
    summary: Value,
}

fn data_err(path: &Path, msg: impl Into<String>) -> TrainError {
    TrainError::Data { path: path.to_path_buf(), msg: msg.into() }
}

/// What to say when a data file is missing: where a relative path was looked for, and how
/// to get the file.
fn missing_data_hint(path: &Path) -> String {
    let mut msg = String::from("no such file");
    if path.is_relative() {
        let cwd = std::env::current_dir().map(|d| d.display().to_string()).unwrap_or_else(|_| "?".into());
        msg.push_str(&format!(
            "; relative paths in a run config (and in --set) are resolved from the current directory ({cwd}), not from the config file's folder"
        ));
    }
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    if stem == "tinyshakespeare" || stem == "input" {
        msg.push_str(&format!(
            "; download it with `burnlens data fetch tinyshakespeare --out {}` (sha256-checked), or point data.path at a copy: --set data.path=PATH",
            path.display()
        ));
    } else {
        msg.push_str("; point data.path at the text file: --set data.path=PATH");
    }
    msg
}

/// Read a text file that must be non-empty UTF-8.
fn read_text(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => data_err(path, missing_data_hint(path)),
        _ => TrainError::io(path, e),
    })?;
    if bytes.is_empty() {
        return Err(data_err(path, "the data file is empty"));
    }
    String::from_utf8(bytes).map_err(|e| data_err(path, format!("not UTF-8 text (invalid byte at offset {})", e.utf8_error().valid_up_to())))
}

impl Dataset {
    /// Load what `[data]` describes; `block_size` is checked against the split sizes.
    pub fn load(d: &DataSection, block_size: usize) -> Result<Self> {
        let need_path = |what: &str| -> Result<PathBuf> {
            d.path.clone().ok_or_else(|| data_err(Path::new("[data]"), format!("data.path is required for kind = \"{what}\"")))
        };
        match d.kind {
            DataKind::Char | DataKind::Bpe => {
                let path = need_path(d.kind.name())?;
                let text = read_text(&path)?;
                let tokenizer = if d.kind == DataKind::Char {
                    Tokenizer::char_from_text(&text)
                } else {
                    let tok = d.tokenizer.clone().ok_or_else(|| data_err(&path, "data.tokenizer (a tokenizer.json) is required for kind = \"bpe\""))?;
                    Tokenizer::from_file(&tok)?
                };
                // Split the text, not the tokens, at the same character as nanoGPT.
                let n_chars = text.chars().count();
                let split_at = (n_chars as f64 * (1.0 - d.val_fraction)).floor() as usize;
                let byte_at = text.char_indices().nth(split_at).map_or(text.len(), |(b, _)| b);
                let (train_text, val_text) = text.split_at(byte_at);
                let train = tokenizer.encode(train_text)?;
                let val = tokenizer.encode(val_text)?;
                if train.is_empty() {
                    return Err(data_err(&path, "the text encodes to no tokens"));
                }
                for (name, part) in [("training", &train), ("validation", &val)] {
                    if part.len() <= block_size {
                        return Err(data_err(
                            &path,
                            format!("the {name} split has {} tokens; training.block_size = {block_size} needs at least {}", part.len(), block_size + 1),
                        ));
                    }
                }
                let summary = json!({
                    "kind": d.kind.name(), "path": path, "tokenizer": d.tokenizer, "val_fraction": d.val_fraction,
                    "split_at_char": split_at, "train_tokens": train.len(), "val_tokens": val.len(),
                    "vocab_size": tokenizer.vocab_size(),
                });
                Ok(Dataset { vocab_size: tokenizer.vocab_size(), tokenizer: Some(tokenizer), source: Source::Tokens { train, val }, summary })
            }
            DataKind::RepeatedTokens => {
                let vocab = d.vocab.unwrap_or(64);
                let max_len = d.repeat_len.unwrap_or(block_size.div_ceil(2));
                let min_len = d.min_repeat_len.unwrap_or((max_len / 2).max(2)).min(max_len);
                let at = Path::new("[data]");
                if vocab < 2 {
                    return Err(data_err(at, format!("data.vocab must be at least 2, found {vocab}")));
                }
                if max_len == 0 || min_len == 0 {
                    return Err(data_err(at, "data.repeat_len and data.min_repeat_len must be at least 1"));
                }
                let summary = json!({ "kind": "repeated_tokens", "vocab_size": vocab, "min_repeat_len": min_len, "repeat_len": max_len,
                                      "split": "train and validation batches come from separate random streams" });
                Ok(Dataset { tokenizer: None, vocab_size: vocab, source: Source::Repeated { vocab, min_len, max_len }, summary })
            }
        }
    }

    /// What was loaded, as recorded in the run directory (`data.json`).
    pub fn summary(&self) -> &Value {
        &self.summary
    }

    /// `batch` sequences of `block + 1` tokens, row-major: inputs are `[.., :block]`,
    /// targets `[.., 1:]`.
    pub fn batch(&self, split: Split, rng: &mut Rng, batch: usize, block: usize) -> Vec<i64> {
        let mut out = Vec::with_capacity(batch * (block + 1));
        match &self.source {
            Source::Tokens { train, val } => {
                let data = if split == Split::Train { train } else { val };
                for _ in 0..batch {
                    let start = rng.below((data.len() - block) as u64) as usize;
                    out.extend(data[start..start + block + 1].iter().map(|&t| t as i64));
                }
            }
            Source::Repeated { vocab, min_len, max_len } => {
                for _ in 0..batch {
                    let len = min_len + rng.below((max_len - min_len + 1) as u64) as usize;
                    let r: Vec<i64> = (0..len).map(|_| rng.below(*vocab as u64) as i64).collect();
                    out.extend(r.iter().cycle().take(block + 1));
                }
            }
        }
        out
    }
}
