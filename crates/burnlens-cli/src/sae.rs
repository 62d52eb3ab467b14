//! `burnlens sae`: run a sparse autoencoder on its hook point.

use anyhow::Result;

use crate::commands::{ids_and_labels, load_model_args, load_sae, report_err};
use crate::{Common, Input, ModelArgs};

/// Run a sparse autoencoder saved in SAELens's layout on its hook point: reconstruction,
/// L0, explained variance, top features per token, loss with the SAE spliced in.
#[derive(clap::Args, Clone)]
pub struct SaeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// SAE directory (cfg.json and sae_weights.safetensors), or a folder of a Hub
    /// repository as `org/name[@revision][:folder]` (SAELens releases keep one SAE per
    /// folder, e.g. `jbloom/GPT2-Small-SAEs-Reformatted:blocks.8.hook_resid_pre`).
    #[arg(long)]
    pub sae: std::path::PathBuf,
    #[command(flatten)]
    pub input: Input,
    /// Features to list per position.
    #[arg(long, default_value_t = 5)]
    pub top: usize,
    #[arg(long)]
    pub out: std::path::PathBuf,
    #[command(flatten)]
    pub common: Common,
}

pub fn run(a: &SaeArgs) -> Result<()> {
    let (args, sae_dir, input, top, out, common) = (&a.model, a.sae.as_path(), &a.input, a.top, a.out.as_path(), &a.common);
    let m = load_model_args(args, common)?;
    let (ids, tokens) = ids_and_labels(&m, input, "")?;
    let (sae_dir, sae) = load_sae(&sae_dir.to_string_lossy(), &m.model.device())?;
    let sae_dir = &sae_dir;
    let run = burnlens_lens::run_sae(&m.model, &sae, &ids, top)?;
    let d_sae = sae.cfg.d_sae;
    let report = burnlens_lens::tool_reports::SaeReport { ids, tokens, sae: sae.cfg.clone(), run };
    burnlens_lens::tool_reports::write_sae(out, &report, &format!("burnlens SAE {} on {}", sae_dir.display(), m.dir.display())).map_err(report_err(out))?;
    let r = &report.run;
    println!(
        "SAE on {} ({:?}, d_sae {}): mean L0 {:.2}, MSE {:.5}, explained variance {:.4}",
        r.hook_name, sae.cfg.architecture, d_sae, r.mean_l0, r.mse, r.explained_variance
    );
    if let (Some(c), Some(w), Some(z)) = (r.loss_clean, r.loss_with_sae, r.loss_zero_ablated) {
        println!(
            "loss {c:.4}, with the SAE spliced in {w:.4}, hook zero-ablated {z:.4} (recovered {})",
            r.loss_recovered.map_or("n/a".into(), |v| format!("{v:.3}"))
        );
    }
    println!("wrote {}", out.join("index.html").display());
    Ok(())
}
