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
//!
//! Over the ranks of an MPI job ([`Run::ranks`]), every rank holds the one process's batches
//! (each runs its share of every model pass, [`ActivationStore::shared_by`]) and its rows'
//! part of each step ([`crate::share`]); rank 0 alone writes the run directory, whose
//! `config.json` records the ranks (`"ranks": N`, not part of what a resume compares: a
//! run resumes with any number of ranks), and every rank reads the checkpoint it resumes from.

use std::path::{Path, PathBuf};
use std::time::Instant;

use burn::tensor::Device;
use burnlens_dist::Ranks;
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
use crate::tensor_pass::PassPath;
use crate::trainer::{SaeTrainer, StepReport, params_digest};
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

/// A run: its directory, its configuration, and the processes that share it.
pub struct Run<'a> {
    pub dir: &'a Path,
    pub cfg: &'a SaeRunConfig,
    /// [`Ranks::single`] for one process.
    pub ranks: Ranks,
    /// The steps' pass, by device when `None` ([`PassPath::for_device`]).
    pub path: Option<PassPath>,
}

impl<'a> Run<'a> {
    /// A run of this process alone.
    pub fn alone(dir: &'a Path, cfg: &'a SaeRunConfig) -> Self {
        Run { dir, cfg, ranks: Ranks::single(), path: None }
    }
}

/// Train (or resume) the run in `run.dir` on activations from `source`. `on_step` sees every
/// step's reports (one per site); when it breaks (on any rank), the run stops after writing
/// its checkpoint, to be resumed.
pub fn train(run: Run, source: Source, on_step: &mut OnStep) -> Result<RunSummary, RunError> {
    let Run { dir, cfg, ranks, path } = run;
    // Everything is checked, on every rank, before anything is written.
    let prepared = prepare(dir, cfg, source, &ranks);
    let shared = ranks.agree(prepared.as_ref().map(|_| ()).map_err(|e| e.to_string()));
    let (mut store, model_name, units) = prepared?;
    shared?;
    if ranks.is_writer() {
        write_config(dir, cfg, ranks.size())?;
    }
    let started = start_trainers(dir, cfg, &units, &mut store);
    let shared = ranks.agree(started.as_ref().map(|_| ()).map_err(|e| e.to_string()));
    let (trainers, resumed_from) = started?;
    shared?;
    let mut trainers: Vec<SaeTrainer> = trainers.into_iter().map(|t| t.shared_by(ranks.clone()).chosen_path(path)).collect();
    let first = trainers[0].step;
    let end = steps(Steps { dir, cfg, ranks: &ranks, units: &units }, &mut trainers, &mut store, on_step)?;
    let checkpoint = save(dir, &ranks, &trainers, &store)?;
    let outputs = if end.stopped || !ranks.is_writer() { Vec::new() } else { write_outputs(dir, cfg, &trainers, model_name)? };
    Ok(RunSummary {
        steps: trainers[0].step,
        steps_now: trainers[0].step - first,
        resumed_from,
        tokens: trainers[0].step as u64 * cfg.store.train_batch_size_tokens as u64,
        last: end.last,
        dead_features: trainers.iter().map(|t| t.dead().iter().filter(|&&d| d).count()).collect(),
        data_ran_out: end.data_ran_out,
        stopped: end.stopped,
        outputs,
        checkpoint,
    })
}

/// The store (shared by the ranks), the model's name and the units, with the run's
/// configuration checked against its directory; nothing written.
fn prepare<'s>(dir: &Path, cfg: &SaeRunConfig, source: Source<'s>, ranks: &Ranks) -> Result<(ActivationStore<'s>, Option<String>, Vec<Unit>), RunError> {
    let h = hooks(cfg)?;
    let seed = cfg.seed ^ 0x6d69_7869;
    let (store, model_name) = match source {
        Source::Model { model, windows, model_name } => (ActivationStore::new(model, h.points.clone(), windows, cfg.store, seed)?, model_name),
        Source::Cache { dir, device } => {
            let names: Vec<String> = h.points.iter().map(|p| p.name()).collect();
            (ActivationStore::from_cache(CacheReader::open(&dir, &names)?, cfg.store, seed, device)?, None)
        }
    };
    if cfg.d_sae == 0 || cfg.steps == 0 {
        return Err(RunError::Config("d_sae and steps must be positive".into()));
    }
    if cfg.store.train_batch_size_tokens < ranks.size() {
        let n = cfg.store.train_batch_size_tokens;
        return Err(RunError::Config(format!("a batch of {n} tokens cannot be shared by {} ranks: each needs at least one", ranks.size())));
    }
    check_config(dir, cfg)?;
    let units = units(cfg, &h, &store.widths, &store.device);
    Ok((store.shared_by(ranks.clone()), model_name, units))
}

/// What the step loop reads.
struct Steps<'a> {
    dir: &'a Path,
    cfg: &'a SaeRunConfig,
    ranks: &'a Ranks,
    units: &'a [Unit],
}

/// How the step loop ended.
struct End {
    last: Vec<StepReport>,
    data_ran_out: bool,
    stopped: bool,
}

/// Steps until `cfg.steps`, the corpus's end or a stop, with the metrics and checkpoints.
fn steps(s: Steps, trainers: &mut [SaeTrainer], store: &mut ActivationStore, on_step: &mut OnStep) -> Result<End, RunError> {
    let Steps { dir, cfg, ranks, units } = s;
    let metrics_path = dir.join(METRICS);
    let (start, mut store_s) = (Instant::now(), 0.0);
    let first = trainers[0].step;
    let mut end = End { last: Vec::new(), data_ran_out: false, stopped: false };
    while trainers[0].step < cfg.steps {
        let fetch = Instant::now();
        let next = store.next_batch()?;
        store_s += fetch.elapsed().as_secs_f64();
        let Some(acts) = next else {
            end.data_ran_out = true;
            break;
        };
        let begun = trainers.iter_mut().zip(units).map(|(t, u)| t.begin_step(u.batch(&acts))).collect::<Result<Vec<_>, _>>()?;
        // The next batch is made while the step's all-reduce runs (over several ranks).
        if trainers[0].step + 1 < cfg.steps {
            let fetch = Instant::now();
            store.prefetch()?;
            store_s += fetch.elapsed().as_secs_f64();
        }
        let reports = trainers.iter_mut().zip(begun).map(|(t, b)| t.finish_step(b)).collect::<Result<Vec<StepReport>, _>>()?;
        let step = trainers[0].step;
        let done = (step - first) as f64;
        let elapsed = start.elapsed().as_secs_f64().max(1e-9);
        let progress = Progress {
            step,
            steps: cfg.steps,
            tokens_per_s: done * cfg.store.train_batch_size_tokens as f64 / elapsed,
            seconds_left: elapsed / done * (cfg.steps - step) as f64,
        };
        let asked = on_step(&reports, &progress).is_break();
        end.stopped = ranks.any(asked, &format!("agreeing whether to stop after step {step}"))?;
        if ranks.is_writer() && (step.is_multiple_of(cfg.log_every.max(1)) || step == cfg.steps) {
            append_metrics(&metrics_path, cfg, &reports, Clock { elapsed_s: elapsed, store_s })?;
        }
        if end.stopped {
            break;
        }
        if step.is_multiple_of(cfg.checkpoint_every.max(1)) && step < cfg.steps {
            save(dir, ranks, trainers, store)?;
        }
        end.last = reports;
    }
    Ok(end)
}

/// The checkpoint of the trainers' step, written by rank 0 once every rank's parameters are
/// seen to equal rank 0's; its directory.
fn save(dir: &Path, ranks: &Ranks, trainers: &[SaeTrainer], store: &ActivationStore) -> Result<PathBuf, RunError> {
    if ranks.size() > 1 {
        ranks.check_equal(&params_digest(trainers), &format!("the dictionaries after step {}", trainers[0].step))?;
    }
    if ranks.is_writer() {
        return checkpoint::save(dir, trainers, store);
    }
    Ok(burnlens_model::checkpoints::Checkpoints::of_run(dir).dir(trainers[0].step as u64))
}

/// `config.json`: the configuration, then the ranks that ran it (absent in a run written
/// before ranks were recorded).
#[derive(Serialize)]
struct Recorded<'a> {
    #[serde(flatten)]
    cfg: &'a SaeRunConfig,
    #[serde(skip_serializing_if = "Option::is_none")]
    ranks: Option<u64>,
}

fn config_text(cfg: &SaeRunConfig, ranks: Option<u64>) -> String {
    serde_json::to_string_pretty(&Recorded { cfg, ranks }).expect("config serialises")
}

/// The run directory with its `config.json`, recording `ranks` (the latest invocation's).
fn write_config(dir: &Path, cfg: &SaeRunConfig, ranks: usize) -> Result<(), RunError> {
    std::fs::create_dir_all(dir).map_err(|e| file_err(dir, e))?;
    Ok(burnlens_model::files::write_atomic(&dir.join(CONFIG), config_text(cfg, Some(ranks as u64)).as_bytes())?)
}

/// A run directory's `config.json` must be absent or hold `cfg` (its `ranks` aside): a
/// directory holding another run is refused.
fn check_config(dir: &Path, cfg: &SaeRunConfig) -> Result<(), RunError> {
    let path = dir.join(CONFIG);
    let Ok(old) = std::fs::read_to_string(&path) else { return Ok(()) };
    let ranks = serde_json::from_str::<serde_json::Value>(&old).ok().and_then(|v| v.get("ranks")?.as_u64());
    if old != config_text(cfg, ranks) {
        return Err(file_err(&path, "this run directory holds a run with another configuration; use a new directory (or delete it)"));
    }
    Ok(())
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
