//! A run directory's checkpoints: written whole into a temporary directory and renamed into
//! place, `LATEST` replaced atomically after that, so a crash at any moment leaves the
//! previous complete checkpoint loadable; the two newest are kept.
//!
//! ```text
//! RUN_DIR/checkpoints/step-000500/{model.bpk, optim.bpk, state.json}
//! RUN_DIR/checkpoints/LATEST   name of the newest complete checkpoint
//! ```

use std::path::{Path, PathBuf};

use burn::optim::ModuleOptimizer;
use burn::tensor::Device;
use burn_store::{BurnpackStore, ModuleSnapshot};
use burnlens_hf::{ExportOptions, Tokenizer, WeightDtype, export_hf};
use burnlens_model::{Rng, Transformer};
use serde::{Deserialize, Serialize};

use crate::config::RunConfig;
use crate::error::{Result, TrainError};
use crate::spec::ModelSpec;

pub(crate) use burnlens_model::files::write_atomic;

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
    let latest = run_dir.join("checkpoints/LATEST");
    match std::fs::read_to_string(&latest) {
        Ok(name) => {
            let dir = run_dir.join("checkpoints").join(name.trim());
            if !dir.join("state.json").is_file() {
                return Err(TrainError::Checkpoint { path: latest, msg: format!("names {}, which is not a complete checkpoint", dir.display()) });
            }
            Ok(Some(dir))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(TrainError::io(latest, e)),
    }
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
    let state_path = checkpoint.join("state.json");
    let text = std::fs::read_to_string(&state_path).map_err(|e| TrainError::io(&state_path, e))?;
    let state: TrainState = serde_json::from_str(&text).map_err(|e| TrainError::Checkpoint { path: state_path, msg: e.to_string() })?;
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
    run_dir.join("checkpoints").join(format!("step-{step:06}"))
}

/// Write a complete checkpoint of `state.step` and point `LATEST` at it.
pub fn save_checkpoint(run_dir: &Path, model: &Transformer, optim: &ModuleOptimizer, state: &TrainState) -> Result<PathBuf> {
    let root = run_dir.join("checkpoints");
    let name = format!("step-{:06}", state.step);
    debug_assert_eq!(root.join(&name), checkpoint_dir(run_dir, state.step));
    let tmp = root.join(format!(".tmp-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|e| TrainError::io(&tmp, e))?;
    let fail = |path: &Path, msg: String| TrainError::Checkpoint { path: path.to_path_buf(), msg };
    let weights = tmp.join("model.bpk");
    model.save_into(&mut BurnpackStore::from_file(&weights).overwrite(true)).map_err(|e| fail(&weights, e.to_string()))?;
    let optim_path = tmp.join("optim.bpk");
    optim.save(&optim_path).map_err(|e| fail(&optim_path, e.to_string()))?;
    write_atomic(&tmp.join("state.json"), serde_json::to_string_pretty(state).expect("json").as_bytes())?;
    for f in ["model.bpk", "optim.bpk"] {
        std::fs::File::open(tmp.join(f)).and_then(|f| f.sync_all()).map_err(|e| TrainError::io(tmp.join(f), e))?;
    }
    let dir = root.join(&name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(&tmp, &dir).map_err(|e| TrainError::io(&dir, e))?;
    write_atomic(&root.join("LATEST"), name.as_bytes())?;
    // Keep the two newest checkpoints.
    let mut old: Vec<PathBuf> = std::fs::read_dir(&root)
        .map_err(|e| TrainError::io(&root, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("step-")))
        .collect();
    old.sort();
    let keep = old.len().saturating_sub(2);
    for p in &old[..keep] {
        if *p != dir {
            let _ = std::fs::remove_dir_all(p);
        }
    }
    Ok(dir)
}
