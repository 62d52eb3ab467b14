//! `burnlens tokenize`: how the model's tokenizer splits a text.

use std::path::Path;

use anyhow::Result;
use burnlens_hf::Tokenizer;
use serde_json::json;

use crate::UserError;

/// Show how the model's tokenizer splits a text: ids and string tokens.
#[derive(clap::Args, Clone)]
pub struct TokenizeArgs {
    /// Model directory, Hub id or burnlens run directory (its tokenizer is used).
    #[arg(long)]
    pub model: std::path::PathBuf,
    #[arg(long)]
    pub text: String,
    /// Print JSON ({"ids", "tokens"}) instead of two lines.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: &TokenizeArgs) -> Result<()> {
    let dir = crate::progress::model_dir(&a.model)?;
    let (dir, text, as_json) = (dir.as_path(), a.text.as_str(), a.json);
    let tok = match load_tokenizer(dir)? {
        Some(t) => t,
        None => return Err(UserError(format!("{}: no tokenizer.json (or char_vocab.json of a burnlens run) to tokenize with", dir.display())).into()),
    };
    let ids: Vec<u32> = tok.encode(text)?;
    let tokens: Vec<String> = ids.iter().map(|&i| tok.decode(&[i])).collect();
    if as_json {
        println!("{}", json!({ "ids": ids, "tokens": tokens }));
    } else {
        println!("ids:    {}", ids.iter().map(u32::to_string).collect::<Vec<_>>().join(","));
        println!("tokens: {}", tokens.iter().map(|s| format!("{s:?}")).collect::<Vec<_>>().join(" "));
        println!("{} tokens ({} tokenizer)", ids.len(), tok.kind());
    }
    Ok(())
}

/// The tokenizer of a model or run directory, without loading weights.
fn load_tokenizer(dir: &Path) -> Result<Option<Tokenizer>> {
    // A run directory keeps its tokenizer beside its checkpoints, as a model directory does.
    Ok(Tokenizer::find_in_dir(dir).transpose()?)
}
