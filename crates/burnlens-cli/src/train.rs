//! `burnlens train`: train a model as a TOML run config says (`train::train`), with a
//! progress line; on N ranks when an MPI launcher started it (`mpiexec -n N burnlens train`),
//! rank 0 printing and writing.

use std::path::PathBuf;

use anyhow::Result;
use burnlens_dist::{DistError, Ranks};
use burnlens_train::{RunConfig, TrainError, TrainOptions};

use crate::commands::end_job;
use crate::{Common, UserError};

/// `burnlens train` options.
#[derive(clap::Args)]
pub struct TrainArgs {
    /// Run config. Optional with --resume (the run's own config.toml is used).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Override a config key, e.g. --set training.steps=200 (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub sets: Vec<String>,
    /// Continue the run in this directory from its latest checkpoint.
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// Only errors and the final summary.
    #[arg(long)]
    pub quiet: bool,
    #[command(flatten)]
    pub common: Common,
}

/// The run config: the given file, or the resumed run's own (its directory kept).
fn run_config(a: &TrainArgs) -> Result<RunConfig> {
    // `--compute` is `training.compute`, set over the file's.
    let mut sets = a.sets.clone();
    sets.extend(a.common.compute.map(|c| format!("training.compute={:?}", c.name())));
    Ok(match (&a.config, &a.resume) {
        (_, Some(run)) => {
            // The run directory stays where it is, whatever its config says.
            sets.push(format!("output.dir={:?}", run.display().to_string()));
            RunConfig::load(&run.join("config.toml"), &sets)?
        }
        (Some(path), None) => RunConfig::load(path, &sets)?,
        (None, None) => return Err(UserError("train: give --config FILE (or --resume RUN_DIR)".into()).into()),
    })
}

pub fn run(a: &TrainArgs) -> Result<()> {
    let cfg = run_config(a)?;
    burnlens_model::stop::install_interrupt_handler();
    // One of several ranks when an MPI launcher started this process (`mpiexec -n N`).
    let ranks = Ranks::from_launcher()?;
    let opts = TrainOptions { backend_flag: a.common.backend.clone(), resume: a.resume.is_some(), ranks: ranks.clone() };
    let s = match burnlens_train::train(&cfg, &opts, &mut crate::progress::TrainProgress::new(a.quiet || !ranks.is_writer())) {
        Ok(s) => s,
        // A rank that is lost or diverged: say so here, then end every rank of the job.
        Err(e @ TrainError::Rank { error: DistError::Unanswered { .. } | DistError::Diverged { .. }, .. }) => end_job(&ranks, &e),
        Err(e) => return Err(e.into()),
    };
    if !ranks.is_writer() {
        return Ok(());
    }
    println!(
        "trained {} steps in {:.1}s ({:.0} tokens/s): final train loss {:.4}, validation loss {}",
        s.steps,
        s.seconds,
        s.tokens_per_s,
        s.final_train_loss,
        s.final_val_loss.map_or("n/a".into(), |v| format!("{v:.4}"))
    );
    println!("run directory: {}", s.run_dir.display());
    if let Some(hf) = s.exported {
        println!("Hugging Face export: {}", hf.display());
    }
    Ok(())
}
