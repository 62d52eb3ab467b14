//! `burnlens sample`: generate text (or token ids) from a Hugging Face model directory, a Hub
//! id or a burnlens run directory (`model::generate`).

use std::path::PathBuf;

use anyhow::{Context, Result};
use burnlens_model::{Sampling, generate};
use burnlens_train::AnyModel;

use crate::commands::{load_any, parse_ids, token_err};
use crate::progress::model_dir;
use crate::{Common, UserError};

/// `burnlens sample` options.
#[derive(clap::Args)]
pub struct SampleArgs {
    /// Hugging Face model directory, Hub id or burnlens run directory.
    #[arg(long)]
    pub model: PathBuf,
    /// Prompt text (needs a tokenizer.json or char_vocab.json in the directory); `--text`
    /// is the same option, as in the other commands.
    #[arg(long, alias = "text", conflicts_with = "ids")]
    pub prompt: Option<String>,
    /// Prompt as comma-separated token ids.
    #[arg(long)]
    pub ids: Option<String>,
    #[arg(long, default_value_t = 64)]
    pub max_new_tokens: usize,
    /// 0 = greedy.
    #[arg(long, default_value_t = 1.0)]
    pub temperature: f64,
    #[arg(long)]
    pub top_k: Option<usize>,
    #[arg(long)]
    pub top_p: Option<f64>,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Recompute the whole prefix for every token instead of using the KV cache.
    #[arg(long)]
    pub no_cache: bool,
    #[command(flatten)]
    pub common: Common,
}

pub fn run(a: &SampleArgs) -> Result<()> {
    let s = Sampling {
        max_new_tokens: a.max_new_tokens,
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        seed: a.seed,
        stop_token: None,
        use_cache: !a.no_cache,
    };
    let m = load_any(&model_dir(&a.model)?, &a.common)?;
    let prompt_ids: Vec<i64> = match (&a.prompt, &a.ids) {
        (Some(text), _) => m.encode(text, false).map_err(|e| token_err("--prompt", "pass token ids with --ids", e))?,
        (None, Some(text)) => parse_ids(text, &m.model, "--ids")?,
        (None, None) => return Err(UserError("sample: give --prompt TEXT or --ids 1,2,3".into()).into()),
    };
    let AnyModel { model, tokenizer, .. } = m;
    model.check_ids(&prompt_ids).context("prompt")?;
    let new = generate(&model, &prompt_ids, &s)?;
    if new.len() < s.max_new_tokens {
        eprintln!("note: stopped after {} new tokens: the context of {} positions is full", new.len(), model.config.n_ctx);
    }
    match (&tokenizer, &a.prompt) {
        (Some(tok), Some(_)) => {
            let all: Vec<u32> = prompt_ids.iter().chain(&new).map(|&i| i as u32).collect();
            println!("{}", tok.decode(&all));
        }
        _ => {
            let text: Vec<String> = new.iter().map(|i| i.to_string()).collect();
            println!("{}", text.join(","));
            if let Some(tok) = &tokenizer {
                eprintln!("text: {:?}", tok.decode(&new.iter().map(|&i| i as u32).collect::<Vec<_>>()));
            }
        }
    }
    Ok(())
}
