//! A training run's checkpoints, in the format of every long run
//! ([`burnlens_model::checkpoints`]: a directory per checkpoint written whole and renamed,
//! `LATEST` after it, two kept):
//!
//! ```text
//! RUN_DIR/checkpoints/step-000500/{state.json, model.bpk, optim.bpk}
//! ```

use std::path::{Path, PathBuf};

use burn::optim::ModuleOptimizer;
use burn::tensor::Device;
use burn_store::{BurnpackStore, ModuleSnapshot};
use burnlens_hf::{ExportOptions, Tokenizer, WeightDtype, export_hf};
use burnlens_model::checkpoints::{Checkpoints, read_state};
use burnlens_model::{Rng, Transformer};
use serde::{Deserialize, Serialize};

use crate::config::RunConfig;
use crate::error::{Result, TrainError};
use crate::spec::ModelSpec;

/// What a checkpoint records besides the weights and optimizer state.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrainState {
    /// Number of optimizer steps completed.
    pub step: usize,
    /// State of the batch sampler's generator after `step` steps.
    pub rng: Rng,
    pub tokens_seen: u64,
    pub last_val_loss: Option<f64>,
}

/// A run directory's latest complete checkpoint, if any.
pub fn latest_checkpoint(run_dir: &Path) -> Result<Option<PathBuf>> {
    Checkpoints::of_run(run_dir).latest().map_err(|e| TrainError::Checkpoint { path: e.path, msg: e.source.to_string() })
}

/// Everything a run directory holds that is needed to use its model.
pub struct LoadedRun {
    pub config: RunConfig,
    pub spec: ModelSpec,
    pub model: Transformer,
    pub tokenizer: Option<Tokenizer>,
    pub checkpoint: PathBuf,
    pub state: TrainState,
}

/// Load the model of the latest checkpoint of `run_dir` onto `device`.
pub fn load_run(run_dir: &Path, device: &Device) -> Result<LoadedRun> {
    let config = RunConfig::load(&run_dir.join("config.toml"), &[])?;
    let spec_path = run_dir.join("model.json");
    let text = std::fs::read_to_string(&spec_path).map_err(|e| TrainError::io(&spec_path, e))?;
    let spec: ModelSpec = serde_json::from_str(&text).map_err(|e| TrainError::Checkpoint { path: spec_path.clone(), msg: e.to_string() })?;
    let checkpoint = latest_checkpoint(run_dir)?
        .ok_or_else(|| TrainError::Checkpoint { path: run_dir.to_path_buf(), msg: "no checkpoint yet (checkpoints/LATEST is missing)".into() })?;
    let mut model = spec.config.init(device)?;
    let weights = checkpoint.join("model.bpk");
    let mut store = BurnpackStore::from_file(&weights);
    model.load_from(&mut store).map_err(|e| TrainError::Checkpoint { path: weights.clone(), msg: e.to_string() })?;
    let state: TrainState = read_state(&checkpoint).map_err(|e| TrainError::Checkpoint { path: e.path, msg: e.source.to_string() })?;
    let tokenizer = Tokenizer::find_in_dir(run_dir).transpose()?;
    Ok(LoadedRun { config, spec, model, tokenizer, checkpoint, state })
}

/// Export the latest checkpoint of `run_dir` to `out` as a Hugging Face model, its tensors
/// in `dtype` (`auto`: f32, the dtype it was trained in).
pub fn export_run(run_dir: &Path, out: &Path, dtype: WeightDtype) -> Result<()> {
    let run = load_run(run_dir, &Device::flex())?;
    export_hf(&run.model, run.spec.family, out, &ExportOptions { tokenizer: run.tokenizer.as_ref(), dtype })?;
    Ok(())
}

/// Where the checkpoint of `step` is (or will be) written.
pub fn checkpoint_dir(run_dir: &Path, step: usize) -> PathBuf {
    Checkpoints::of_run(run_dir).dir(step as u64)
}

/// Write a complete checkpoint of `state.step` and point `LATEST` at it.
pub fn save_checkpoint(run_dir: &Path, model: &Transformer, optim: &ModuleOptimizer, state: &TrainState) -> Result<PathBuf> {
    Checkpoints::of_run(run_dir).save(state.step as u64, state, |dir| {
        let fail = |path: &Path, msg: String| TrainError::Checkpoint { path: path.to_path_buf(), msg };
        let weights = dir.join("model.bpk");
        model.save_into(&mut BurnpackStore::from_file(&weights).overwrite(true)).map_err(|e| fail(&weights, e.to_string()))?;
        let optim_path = dir.join("optim.bpk");
        optim.save(&optim_path).map_err(|e| fail(&optim_path, e.to_string()))
    })
}
