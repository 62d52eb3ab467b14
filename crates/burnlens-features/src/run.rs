//! A training run on a corpus of one or more SAEs, or of a transcoder per layer, all fed by
//! one model pass per batch of windows: the run directory holds the configuration
//! (`config.json`), a checkpoint every `checkpoint_every` steps (`checkpoints/`, see
//! [`crate::checkpoint`]: parameters, Adam's moments, the dead-feature counters, the mixing
//! buffer's rows, the step, the data position and the shuffling state), `metrics.jsonl`
//! ([`crate::metrics`]) and, at the end, the SAE in SAELens's layout (`sae/cfg.json` +
//! `sae/sae_weights.safetensors`; `sae/{hook}/` for each of several) or the transcoders in
//! circuit-tracer's per-layer layout (`transcoders/`). Each trainer reads what its unit says
//! ([`crate::units`]). Run again with the same configuration after an interruption (SIGKILL
//! included), it resumes from the checkpoint and ends bit-identical to an uninterrupted
//! run: the same batches in the same order.

use std::path::{Path, PathBuf};
use std::time::Instant;

use burn::tensor::Device;
use burnlens_model::{Rng, Transformer};
use serde::Serialize;

use crate::cache::CacheReader;
use crate::checkpoint;
use crate::config::{RunError, SaeRunConfig, file_err};
use crate::metrics::{Clock, append_metrics};
use crate::outputs::write_outputs;
use crate::params::{DECODER_INIT_NORM, init};
use crate::pass::WindowSource;
use crate::store::ActivationStore;
use crate::trainer::{SaeTrainer, StepReport};
use crate::units::{Unit, hooks, units};

/// How a run ended.
#[derive(Debug, Clone, Serialize)]
pub struct RunSummary {
    pub steps: usize,
    /// Steps this invocation took (fewer than `steps` after a resume).
    pub steps_now: usize,
    pub resumed_from: Option<usize>,
    pub tokens: u64,
    /// Each site's last step.
    pub last: Vec<StepReport>,
    /// Each site's dead features at the end.
    pub dead_features: Vec<usize>,
    /// Whether the corpus ran out before `steps`.
    pub data_ran_out: bool,
    /// Whether `on_step` asked to stop (the checkpoint is written; nothing else).
    pub stopped: bool,
    /// Where the SAEs (or the transcoder set) were written.
    pub outputs: Vec<PathBuf>,
    /// The last checkpoint's directory.
    pub checkpoint: PathBuf,
}

const CONFIG: &str = "config.json";
const METRICS: &str = "metrics.jsonl";

/// Where a run's activations come from.
pub enum Source<'a> {
    /// `model`'s passes over `windows` (from their start: a resumed run seeks them to where
    /// it stood); `model_name` goes into the SAEs' configs.
    Model { model: &'a Transformer, windows: WindowSource<'a>, model_name: Option<String> },
    /// An activation cache's folder, read on `device` ([`crate::cache`]).
    Cache { dir: PathBuf, device: Device },
}

/// Train (or resume) the run in `dir` on activations from `source`. `on_step` sees every
/// step's reports (one per site); when it breaks, the run stops after writing its
/// checkpoint, to be resumed.
pub fn train(dir: &Path, cfg: &SaeRunConfig, source: Source, on_step: &mut OnStep) -> Result<RunSummary, RunError> {
    // Everything is checked before anything is written.
    let h = hooks(cfg)?;
    let seed = cfg.seed ^ 0x6d69_7869;
    let (mut store, model_name) = match source {
        Source::Model { model, windows, model_name } => (ActivationStore::new(model, h.points.clone(), windows, cfg.store, seed)?, model_name),
        Source::Cache { dir, device } => {
            let names: Vec<String> = h.points.iter().map(|p| p.name()).collect();
            (ActivationStore::from_cache(CacheReader::open(&dir, &names)?, cfg.store, seed, device)?, None)
        }
    };
    if cfg.d_sae == 0 || cfg.steps == 0 {
        return Err(RunError::Config("d_sae and steps must be positive".into()));
    }
    write_config(dir, cfg)?;
    let units = units(cfg, &h, &store.widths, &store.device);
    let (mut trainers, resumed_from) = start_trainers(dir, cfg, &units, &mut store)?;
    let metrics_path = dir.join(METRICS);
    let (start, mut store_s) = (Instant::now(), 0.0);
    let first = trainers[0].step;
    let mut last = Vec::new();
    let (mut data_ran_out, mut stopped) = (false, false);
    while trainers[0].step < cfg.steps {
        let fetch = Instant::now();
        let next = store.next_batch()?;
        store_s += fetch.elapsed().as_secs_f64();
        let Some(acts) = next else {
            data_ran_out = true;
            break;
        };
        let reports: Vec<StepReport> = trainers.iter_mut().zip(&units).map(|(t, u)| t.train_step(u.batch(&acts))).collect();
        let step = trainers[0].step;
        let done = (step - first) as f64;
        let elapsed = start.elapsed().as_secs_f64().max(1e-9);
        let progress = Progress {
            step,
            steps: cfg.steps,
            tokens_per_s: done * cfg.store.train_batch_size_tokens as f64 / elapsed,
            seconds_left: elapsed / done * (cfg.steps - step) as f64,
        };
        stopped = on_step(&reports, &progress).is_break();
        if step % cfg.log_every.max(1) == 0 || step == cfg.steps {
            append_metrics(&metrics_path, cfg, &reports, Clock { elapsed_s: elapsed, store_s })?;
        }
        if stopped {
            break;
        }
        if step % cfg.checkpoint_every.max(1) == 0 && step < cfg.steps {
            checkpoint::save(dir, &trainers, &store)?;
        }
        last = reports;
    }
    let checkpoint = checkpoint::save(dir, &trainers, &store)?;
    let outputs = if stopped { Vec::new() } else { write_outputs(dir, cfg, &trainers, model_name)? };
    Ok(RunSummary {
        steps: trainers[0].step,
        steps_now: trainers[0].step - first,
        resumed_from,
        tokens: trainers[0].step as u64 * cfg.store.train_batch_size_tokens as u64,
        last,
        dead_features: trainers.iter().map(|t| t.dead().iter().filter(|&&d| d).count()).collect(),
        data_ran_out,
        stopped,
        outputs,
        checkpoint,
    })
}

/// The run directory with its `config.json`: written if new, refused if it holds another
/// configuration.
fn write_config(dir: &Path, cfg: &SaeRunConfig) -> Result<(), RunError> {
    std::fs::create_dir_all(dir).map_err(|e| file_err(dir, e))?;
    let cfg_path = dir.join(CONFIG);
    let cfg_text = serde_json::to_string_pretty(cfg).expect("config serialises");
    match std::fs::read_to_string(&cfg_path) {
        Ok(old) if old != cfg_text => Err(file_err(&cfg_path, "this run directory holds a run with another configuration; use a new directory (or delete it)")),
        Ok(_) => Ok(()),
        Err(_) => Ok(burnlens_model::files::write_atomic(&cfg_path, cfg_text.as_bytes())?),
    }
}

/// The trainers from the run's latest checkpoint (and the step it was at), or fresh ones.
fn start_trainers(dir: &Path, cfg: &SaeRunConfig, units: &[Unit], store: &mut ActivationStore) -> Result<(Vec<SaeTrainer>, Option<usize>), RunError> {
    let device = store.device.clone();
    let sites: Vec<checkpoint::Site> = units
        .iter()
        .map(|u| checkpoint::Site { like: init(&cfg.architecture, u.shape, None, &mut Rng::new(0), &device), trainer: Box::new(move |p| u.trainer(cfg, p)) })
        .collect();
    if let Some(t) = checkpoint::load(dir, &sites, store)? {
        let at = t[0].step;
        return Ok((t, Some(at)));
    }
    let fresh = |(i, u): (usize, &Unit)| {
        let params = init(&cfg.architecture, u.shape, Some(DECODER_INIT_NORM), &mut Rng::new(cfg.seed.wrapping_add(i as u64)), &device);
        u.trainer(cfg, params)
    };
    Ok((units.iter().enumerate().map(fresh).collect(), None))
}

/// What a run calls after every step: `Break` stops it (checkpoint written, to resume).
pub type OnStep<'a> = dyn FnMut(&[StepReport], &Progress) -> std::ops::ControlFlow<()> + 'a;

/// Where a run stands, for a progress line.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    pub step: usize,
    pub steps: usize,
    pub tokens_per_s: f64,
    pub seconds_left: f64,
}
