//! `burnlens cache-activations`: run a model over a corpus once and keep its activations at
//! some hook points on disk (`features::cache`'s layout), so that SAEs train from them
//! without the model (`train-sae --from-cache`).

use std::path::PathBuf;

use anyhow::Result;
use burnlens_data::CorpusOptions;
use burnlens_dist::DistError;
use burnlens_features::{CacheJob, write_cache};
use burnlens_model::HookPoint;

use crate::{Common, ModelArgs, UserError};

/// `burnlens cache-activations` options.
#[derive(clap::Args)]
pub struct CacheActivationsArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Hook points, comma-separated (e.g. blocks.1.hook_resid_pre,blocks.1.hook_mlp_out).
    #[arg(long)]
    pub hook: String,
    #[command(flatten)]
    pub corpus: CorpusOptions,
    /// Windows per model pass (a training run from the cache uses the same as its
    /// --store-batch).
    #[arg(long, default_value_t = 16)]
    pub batch: usize,
    /// Model passes per shard file.
    #[arg(long, default_value_t = 64)]
    pub chunks_per_shard: usize,
    /// Stop after this many windows (default: the whole corpus; needed for synthetic data).
    #[arg(long)]
    pub windows: Option<u64>,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// The cache folder (cache.json and shard_*.safetensors); run again to continue.
    #[arg(long)]
    pub out: PathBuf,
    #[command(flatten)]
    pub common: Common,
}

pub fn run(a: &CacheActivationsArgs) -> Result<()> {
    let m = crate::commands::load_model_args(&a.model, &a.common)?;
    let hooks = a
        .hook
        .split(',')
        .map(|h| HookPoint::parse(h.trim()).ok_or_else(|| UserError(format!("--hook: `{}` is not a hook point name", h.trim()))))
        .collect::<Result<Vec<_>, _>>()?;
    if a.batch == 0 || a.chunks_per_shard == 0 {
        return Err(UserError("--batch and --chunks-per-shard must be positive".into()).into());
    }
    if a.windows.is_none() && burnlens_data::Synthetic::parse(&a.corpus.data).is_some() {
        return Err(UserError(format!("--data {}: synthetic windows never end; give --windows", a.corpus.data)).into());
    }
    let known = burnlens_model::hook_points(&m.model.config);
    if let Some(h) = hooks.iter().find(|h| !known.contains(h)) {
        return Err(UserError(format!("--hook: the model has no hook point `{}`", h.name())).into());
    }
    let windows = a.corpus.windows(m.corpus_model(), a.seed, &burnlens_hf::Hub::from_env())?;
    let job = CacheJob {
        model: &m.model,
        hooks,
        context_size: a.corpus.seq_len,
        windows_per_chunk: a.batch,
        chunks_per_shard: a.chunks_per_shard,
        max_windows: a.windows,
        // One of several ranks when an MPI launcher started this process: each computes its
        // share of the shards, rank 0 writes the index.
        ranks: burnlens_dist::Ranks::from_launcher()?,
    };
    let start = std::time::Instant::now();
    let writer = job.ranks.is_writer();
    let index = write_cache(&a.out, &job, windows, &mut |n| {
        if writer {
            eprintln!("{n} windows cached ({:.0} tokens/s)", (n as usize * a.corpus.seq_len) as f64 / start.elapsed().as_secs_f64().max(1e-9));
        }
    });
    let index = match index {
        Ok(index) => index,
        Err(burnlens_features::StoreError::Ranks(e @ (DistError::Unanswered { .. } | DistError::Diverged { .. }))) => crate::commands::end_job(&job.ranks, &e),
        Err(e) => return Err(e.into()),
    };
    if !writer {
        return Ok(());
    }
    let rows = index.chunks() * index.windows_per_chunk * index.context_size;
    println!("cached {} hook(s) over at most {rows} tokens in {} shard(s): {}", index.hooks.len(), index.shards.len(), a.out.display());
    Ok(())
}
