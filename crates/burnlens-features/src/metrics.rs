//! A run's `metrics.jsonl`: a line per logged step and site, with SAELens's loss names and
//! where the time went (over several ranks, the step's all-reduce too).

use std::path::Path;

use crate::config::{RunError, SaeRunConfig, file_err};
use crate::trainer::StepReport;

/// Seconds since this invocation started: in all (`elapsed_s`), and waiting for activations
/// (`store_s`: the model passes and the mixing buffer).
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    pub elapsed_s: f64,
    pub store_s: f64,
}

/// A line per site: the step's loss terms, and the [`Clock`].
pub fn append_metrics(path: &Path, cfg: &SaeRunConfig, reports: &[StepReport], clock: Clock) -> Result<(), RunError> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).map_err(|e| file_err(path, e))?;
    for (r, name) in reports.iter().zip(cfg.trainer_names()) {
        let mut line = serde_json::json!({ "step": r.step + 1, "hook": name, "loss": r.loss, "lr": r.lr, "l0": r.l0, "dead_features": r.dead, "coefficient": r.coefficient, "elapsed_s": clock.elapsed_s, "store_s": clock.store_s });
        for (t, v) in &r.losses {
            line[t.name()] = (*v).into();
        }
        if let (Some(exposed), Some(total)) = (r.allreduce_s, r.allreduce_total_s) {
            line["allreduce_s"] = exposed.into();
            line["allreduce_total_s"] = total.into();
        }
        writeln!(f, "{line}").map_err(|e| file_err(path, e))?;
    }
    Ok(())
}
