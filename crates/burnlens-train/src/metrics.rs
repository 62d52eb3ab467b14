//! `metrics.jsonl` (one line per step and per evaluation) and the loss plot drawn from it.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::{Result, TrainError};
use crate::plot::write_loss_svg;
use burnlens_model::files::write_atomic;

/// `metrics.jsonl`, appended a line at a time, and the lines so far for the loss plot.
pub(crate) struct Metrics {
    path: PathBuf,
    file: std::fs::File,
    history: Vec<serde_json::Value>,
    svg: PathBuf,
}

impl Metrics {
    /// The run's metrics up to `step` (a resumed run's later lines are dropped), open for
    /// appending.
    pub(crate) fn open(run_dir: &Path, step: usize) -> Result<Self> {
        let path = run_dir.join("metrics.jsonl");
        let history = read_metrics(&path, step)?;
        let file = std::fs::OpenOptions::new().create(true).append(true).open(&path).map_err(|e| TrainError::io(&path, e))?;
        Ok(Metrics { path, file, history, svg: run_dir.join("loss.svg") })
    }

    pub(crate) fn record(&mut self, line: serde_json::Value) -> Result<()> {
        writeln!(self.file, "{line}").map_err(|e| TrainError::io(&self.path, e))?;
        self.history.push(line);
        Ok(())
    }

    /// `loss.svg` from the lines so far.
    pub(crate) fn plot(&self) -> std::result::Result<(), burnlens_model::files::FileError> {
        write_loss_svg(&self.svg, &self.history)
    }
}

/// The metrics of steps before `upto` (a resumed run rewrites the rest).
fn read_metrics(path: &Path, upto: usize) -> Result<Vec<serde_json::Value>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(TrainError::io(path, e)),
    };
    let kept: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["step"].as_u64().is_some_and(|s| s as usize <= upto))
        .collect();
    let body: String = kept.iter().map(|v| format!("{v}\n")).collect();
    write_atomic(path, body.as_bytes())?;
    Ok(kept)
}
