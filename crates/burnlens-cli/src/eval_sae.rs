//! `burnlens eval-sae`: SAELens's `run_evals` metrics of an SAE on a model over windows of a
//! corpus, printed and written as JSON in SAELens's nesting. Under an MPI launcher
//! (`mpiexec -n N`) the ranks share the batches (`features::eval_ranks`) and rank 0 writes.

use std::path::PathBuf;

use anyhow::Result;
use burnlens_data::CorpusOptions;
use burnlens_dist::{DistError, Ranks};
use burnlens_features::{EvalError, EvalInput, evaluate_over};
use serde_json::json;

use crate::output::write_atomic;
use crate::{Common, ModelArgs, UserError};

/// `burnlens eval-sae` options.
#[derive(clap::Args)]
pub struct EvalSaeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// An SAE in SAELens's layout (a folder with cfg.json), Gemma Scope's params.npz folder,
    /// or a Hub release org/name[@revision]:folder.
    #[arg(long)]
    pub sae: String,
    #[command(flatten)]
    pub corpus: CorpusOptions,
    /// Batches evaluated (SAELens's n_eval_reconstruction_batches and
    /// n_eval_sparsity_variance_batches).
    #[arg(long, default_value_t = 10)]
    pub batches: usize,
    /// Windows per batch (SAELens's batch_size_prompts).
    #[arg(long, default_value_t = 8)]
    pub batch_size: usize,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// The JSON file written: {"metrics": ..., "feature_metrics": ...}.
    #[arg(long)]
    pub out: PathBuf,
    #[command(flatten)]
    pub common: Common,
}

pub fn run(a: &EvalSaeArgs) -> Result<()> {
    let m = crate::commands::load_model_args(&a.model, &a.common)?;
    let (_, sae) = crate::commands::load_sae(&a.sae, &m.model.device())?;
    if a.batches == 0 || a.batch_size == 0 {
        return Err(UserError("--batches and --batch-size must be positive".into()).into());
    }
    let mut windows = a.corpus.windows(m.corpus_model(), a.seed, &burnlens_hf::Hub::from_env())?;
    let batches = a.corpus.batches(&mut windows, a.batches, a.batch_size)?;
    let ignore: Vec<u32> = m.bos.map(|b| b as u32).into_iter().collect();
    // One of several ranks when an MPI launcher started this process.
    let ranks = Ranks::from_launcher()?;
    let (metrics, features) = match evaluate_over(&ranks, &EvalInput { model: &m.model, sae: &sae, batches: &batches, ignore_tokens: &ignore }) {
        Ok(m) => m,
        Err(EvalError::Ranks(e @ (DistError::Unanswered { .. } | DistError::Diverged { .. }))) => crate::commands::end_job(&ranks, &e),
        Err(e) => return Err(e.into()),
    };
    if !ranks.is_writer() {
        return Ok(());
    }
    let out = json!({ "metrics": metrics, "feature_metrics": features });
    write_atomic(&a.out, serde_json::to_string_pretty(&out)?.as_bytes())?;
    let (p, r, s) = (&metrics.model_performance_preservation, &metrics.reconstruction_quality, &metrics.sparsity);
    println!(
        "ce_loss_score {:.4} (clean {:.4}, with SAE {:.4}, ablated {:.4})",
        p.ce_loss_score, p.ce_loss_without_sae, p.ce_loss_with_sae, p.ce_loss_with_ablation
    );
    println!("kl_div_score {:.4}", metrics.model_behavior_preservation.kl_div_score);
    println!("explained variance {:.4}, MSE {:.5}, cosine {:.4}, L0 {:.2}, L1 {:.3}", r.explained_variance, r.mse, r.cossim, s.l0, s.l1);
    let dead = features.feature_density.iter().filter(|&&d| d == 0.0).count();
    println!(
        "{dead} of {} features never fired on {} tokens; wrote {}",
        features.feature_density.len(),
        metrics.token_stats.total_tokens_eval_sparsity_variance,
        a.out.display()
    );
    Ok(())
}
