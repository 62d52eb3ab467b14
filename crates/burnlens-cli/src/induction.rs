//! `burnlens induction`: the repeated-random-tokens experiment.

use anyhow::{Context, Result};

use crate::commands::load_any;
use crate::{Common, UserError};

/// The repeated-random-tokens induction experiment: [BOS] + r + r.
#[derive(clap::Args, Clone)]
pub struct InductionArgs {
    /// Model directory (config.json plus weights) or Hugging Face Hub id (`gpt2`,
    /// `EleutherAI/pythia-70m`, `org/name@revision`), downloaded into the HF cache.
    #[arg(long)]
    pub model: std::path::PathBuf,
    /// Length of r.
    #[arg(long, default_value_t = 50)]
    pub len: usize,
    #[arg(long, default_value_t = 4)]
    pub batch: usize,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// BOS token id (default: the model's bos_token_id, none for burnlens runs).
    #[arg(long)]
    pub bos: Option<i64>,
    #[arg(long)]
    pub out: std::path::PathBuf,
    #[command(flatten)]
    pub common: Common,
}

pub fn run(a: &InductionArgs) -> Result<()> {
    let dir = crate::progress::model_dir(&a.model)?;
    let (dir, len, batch, seed, bos, out, common) = (dir.as_path(), a.len, a.batch, a.seed, a.bos, a.out.as_path(), &a.common);
    let m = load_any(dir, common)?;
    let bos = bos.or(m.bos);
    let needed = 2 * len + usize::from(bos.is_some());
    if len < 2 {
        return Err(UserError(format!("--len must be at least 2, found {len}")).into());
    }
    if needed > m.model.config.n_ctx {
        return Err(UserError(format!(
            "--len {len}: the sequence [BOS] + r + r has {needed} tokens, more than the model's context of {}",
            m.model.config.n_ctx
        ))
        .into());
    }
    if batch == 0 {
        return Err(UserError("--batch must be at least 1".into()).into());
    }
    if let Some(b) = bos {
        m.model.check_ids(&[b]).context("--bos")?;
    }
    let r = burnlens_lens::report::induction_report(out, &m.model, len, batch, seed, bos)
        .map_err(|e| UserError(format!("{}: cannot write the report: {e}", out.display())))?;
    println!("mean log-probability: first half {:.3}, second half {:.3}", r.mean_logprob_first_half, r.mean_logprob_second_half);
    let mut best: Vec<(f64, usize, usize)> =
        r.induction_scores.iter().enumerate().flat_map(|(l, row)| row.iter().enumerate().map(move |(h, &v)| (v, l, h))).collect();
    best.sort_by(|a, b| b.0.total_cmp(&a.0));
    let shown: Vec<String> = best.iter().take(5).map(|(v, l, h)| format!("L{l}H{h} {v:.3}")).collect();
    println!("top induction heads: {}", shown.join(", "));
    println!("wrote {}", out.join("index.html").display());
    Ok(())
}
