//! A training run on a corpus of one or more SAEs, or of a transcoder per layer, all fed by
//! one model pass per batch of windows: the run directory holds the configuration
//! (`config.json`), a checkpoint every `checkpoint_every` steps (`checkpoints/`, see
//! [`crate::checkpoint`]: parameters, Adam's moments, the dead-feature counters, the mixing
//! buffer's rows, the step, the data position and the shuffling state), `metrics.jsonl` (a line per logged step and site) and, at the end, the SAE in
//! SAELens's layout (`sae/cfg.json` + `sae/sae_weights.safetensors`; `sae/{hook}/` for each
//! of several) or the transcoders in circuit-tracer's per-layer layout (`transcoders/`). Run again with the same
//! configuration after an interruption (SIGKILL included), it resumes from the checkpoint
//! and ends bit-identical to an uninterrupted run: the same batches in the same order.

use std::path::{Path, PathBuf};
use std::time::Instant;

use burn::tensor::{Device, Tensor};
use burnlens_lens::dictionary::Dictionary;
use burnlens_model::{HookPoint, Rng, Transformer};
use serde::Serialize;

use crate::cache::CacheReader;
use crate::checkpoint;
use crate::config::{RunError, SaeRunConfig, file_err};
use crate::cross_layer::Blocks;
use crate::outputs::write_outputs;
use crate::params::{DECODER_INIT_NORM, Shape, init};
use crate::pass::WindowSource;
use crate::store::ActivationStore;
use crate::trainer::{Batch, SaeTrainer, StepReport};

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

/// The hook points a run reads, each once, and each site's (input, output) among them.
struct Hooks {
    points: Vec<HookPoint>,
    sites: Vec<(usize, Option<usize>)>,
}

fn hooks(cfg: &SaeRunConfig) -> Result<Hooks, RunError> {
    let mut points: Vec<HookPoint> = Vec::new();
    let mut index = |name: &str| -> Result<usize, RunError> {
        let h = HookPoint::parse(name).ok_or_else(|| RunError::Config(format!("hook `{name}`: not a hook point name")))?;
        Ok(points.iter().position(|p| *p == h).unwrap_or_else(|| {
            points.push(h);
            points.len() - 1
        }))
    };
    let sites = cfg.sites.iter().map(|s| Ok((index(&s.input)?, s.output.as_deref().map(&mut index).transpose()?))).collect::<Result<Vec<_>, RunError>>()?;
    if sites.is_empty() {
        return Err(RunError::Config("no hook point to train on".into()));
    }
    if cfg.cross_layer && sites.iter().any(|s| s.1.is_none()) {
        return Err(RunError::Config("cross_layer: every site of a cross-layer transcoder needs an output hook".into()));
    }
    Ok(Hooks { points, sites })
}

/// What one trainer reads: the hook points of its input (side by side) and of its target.
struct Unit {
    inputs: Vec<usize>,
    outputs: Option<Vec<usize>>,
    shape: Shape,
    blocks: Option<Blocks>,
}

/// One trainer per site, or one for all of them as a cross-layer transcoder.
fn units(cfg: &SaeRunConfig, h: &Hooks, widths: &[usize], device: &Device) -> Vec<Unit> {
    if cfg.cross_layer {
        let inputs: Vec<usize> = h.sites.iter().map(|s| s.0).collect();
        let outputs: Vec<usize> = h.sites.iter().filter_map(|s| s.1).collect();
        let blocks = Blocks::new(inputs.len(), widths[inputs[0]], widths[outputs[0]], cfg.d_sae, device);
        return vec![Unit { inputs, outputs: Some(outputs), shape: blocks.shape(), blocks: Some(blocks) }];
    }
    let unit = |&(i, o): &(usize, Option<usize>)| {
        let shape =
            Shape { d_in: widths[i], d_sae: cfg.d_sae, d_out: o.map_or(widths[i], |o| widths[o]), transcoder: o.is_some(), skip: cfg.skip && o.is_some() };
        Unit { inputs: vec![i], outputs: o.map(|o| vec![o]), shape, blocks: None }
    };
    h.sites.iter().map(unit).collect()
}

impl Unit {
    fn batch(&self, acts: &[Tensor<2>]) -> Batch {
        let side_by_side = |ix: &[usize]| match ix {
            [i] => acts[*i].clone(),
            _ => Tensor::cat(ix.iter().map(|&i| acts[i].clone()).collect(), 1),
        };
        Batch { x: side_by_side(&self.inputs), target: self.outputs.as_deref().map(side_by_side) }
    }

    fn trainer(&self, cfg: &SaeRunConfig, params: Dictionary) -> SaeTrainer {
        let t = SaeTrainer::new(cfg.architecture, cfg.trainer, params);
        match &self.blocks {
            Some(b) => t.cross_layer(b.clone()),
            None => t,
        }
    }
}

/// Where a run's activations come from.
pub enum Source<'a> {
    /// `model`'s passes over `windows` (made anew for a resumed run, which skips what it had
    /// read); `model_name` goes into the SAEs' configs.
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

/// Seconds since this invocation started: in all (`elapsed_s`), and waiting for activations
/// (`store_s`: the model passes and the mixing buffer).
#[derive(Debug, Clone, Copy)]
struct Clock {
    elapsed_s: f64,
    store_s: f64,
}

/// A line per site: the step's loss terms, and the [`Clock`].
fn append_metrics(path: &Path, cfg: &SaeRunConfig, reports: &[StepReport], clock: Clock) -> Result<(), RunError> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).map_err(|e| file_err(path, e))?;
    for (r, name) in reports.iter().zip(cfg.trainer_names()) {
        let mut line = serde_json::json!({ "step": r.step + 1, "hook": name, "loss": r.loss, "lr": r.lr, "l0": r.l0, "dead_features": r.dead, "coefficient": r.coefficient, "elapsed_s": clock.elapsed_s, "store_s": clock.store_s });
        for (t, v) in &r.losses {
            line[t.name()] = (*v).into();
        }
        writeln!(f, "{line}").map_err(|e| file_err(path, e))?;
    }
    Ok(())
}
