//! A training run on a corpus of one or more SAEs, or of a transcoder per layer, all fed by
//! one model pass per batch of windows: the run directory holds the configuration
//! (`config.json`), a checkpoint written atomically every `checkpoint_every` steps
//! (`checkpoint.safetensors`: parameters, Adam's moments, the dead-feature counters, the
//! mixing buffer's rows and, in its metadata, the step, the data position and the shuffling
//! state), `metrics.jsonl` (a line per logged step and site) and, at the end, the SAE in
//! SAELens's layout (`sae/cfg.json` + `sae/sae_weights.safetensors`; `sae/{hook}/` for each
//! of several) or the transcoders in circuit-tracer's per-layer layout (`transcoders/`). Run again with the same
//! configuration after an interruption (SIGKILL included), it resumes from the checkpoint
//! and ends bit-identical to an uninterrupted run: the same batches in the same order.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use burn::tensor::{Device, Tensor, TensorData};
use burnlens_model::{HookPoint, Rng, Transformer};
use safetensors::Dtype;
use serde::Serialize;

use crate::cache::CacheReader;
use crate::config::{RunError, SaeRunConfig, file_err};
use crate::cross_layer::Blocks;
use crate::outputs::write_outputs;
use crate::params::{DECODER_INIT_NORM, Shape, Trainable, init};
use crate::pass::WindowSource;
use crate::store::ActivationStore;
use crate::trainer::{Batch, SaeTrainer, StepReport};
use burnlens_lens::dictionary::Dictionary;

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
}

const CHECKPOINT: &str = "checkpoint.safetensors";
/// The checkpoint's layout: 2 holds a skip transcoder's `W_skip` as the dictionary does,
/// `[d_in, d_out]` (1, unmarked, held it transposed).
const FORMAT: u64 = 2;
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
    let ckpt = dir.join(CHECKPOINT);
    let (mut trainers, resumed_from) = start_trainers(&ckpt, cfg, &units, &mut store)?;
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
            save_checkpoint(&ckpt, &trainers, &store)?;
        }
        last = reports;
    }
    save_checkpoint(&ckpt, &trainers, &store)?;
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

/// The trainers from the checkpoint `ckpt` (and the step it was at), or fresh ones.
fn start_trainers(ckpt: &Path, cfg: &SaeRunConfig, units: &[Unit], store: &mut ActivationStore) -> Result<(Vec<SaeTrainer>, Option<usize>), RunError> {
    let device = store.device.clone();
    if ckpt.is_file() {
        let t = load_checkpoint(ckpt, cfg, units, store, &device)?;
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

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn tensor_bytes<const D: usize>(t: &Tensor<D>) -> (Vec<usize>, Vec<u8>) {
    (t.dims().to_vec(), f32_bytes(&t.to_data().try_into_vec_as::<f32>().expect("f32")))
}

type Entry = (String, Dtype, Vec<usize>, Vec<u8>);

/// The checkpoint: one safetensors file, written atomically. Site `i`'s tensors are
/// `site{i}.param.*`, `site{i}.adam_m.*`, `site{i}.adam_v.*`, `site{i}.since_fired`,
/// `site{i}.fired_tokens`.
fn save_checkpoint(path: &Path, trainers: &[SaeTrainer], store: &ActivationStore) -> Result<(), RunError> {
    let mut tensors: Vec<Entry> = Vec::new();
    let u64s = |v: Vec<u64>| (vec![v.len()], v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>());
    for (i, t) in trainers.iter().enumerate() {
        for (prefix, p) in [("param", &t.params), ("adam_m", &t.adam.m), ("adam_v", &t.adam.v)] {
            for (name, v) in p.named() {
                let (shape, bytes) = tensor_bytes(&v);
                tensors.push((format!("site{i}.{prefix}.{name}"), Dtype::F32, shape, bytes));
            }
        }
        let (s, b) = u64s(t.since_fired.iter().map(|&x| x as u64).collect());
        tensors.push((format!("site{i}.since_fired"), Dtype::U64, s, b));
        let (s, b) = u64s(t.fired_tokens.clone());
        tensors.push((format!("site{i}.fired_tokens"), Dtype::U64, s, b));
    }
    let w = store.buffer.width;
    let serving: Vec<f32> = store.buffer.serving.iter().flatten().copied().collect();
    for (name, rows) in [("buffer.storage", &store.buffer.storage), ("buffer.serving", &serving)] {
        tensors.push((name.into(), Dtype::F32, vec![rows.len() / w, w], f32_bytes(rows)));
    }
    let meta = serde_json::json!({
        "format": FORMAT,
        "step": trainers[0].step,
        "adam_t": trainers.iter().map(|t| t.adam.t).collect::<Vec<_>>(),
        "topk_threshold": trainers.iter().map(|t| t.topk_threshold).collect::<Vec<_>>(),
        "position": store.position,
        "rng": store.buffer.rng,
    });
    let files: Vec<burnlens_model::files::FileTensor> =
        tensors.iter().map(|(n, d, s, b)| burnlens_model::files::FileTensor { name: n, dtype: *d, shape: s.clone(), bytes: b }).collect();
    let metadata = HashMap::from([("state".to_string(), meta.to_string())]);
    Ok(burnlens_model::files::write_safetensors(path, &files, Some(metadata))?)
}

/// A checkpoint's tensors and training state.
struct Saved<'a> {
    path: &'a Path,
    st: safetensors::SafeTensors<'a>,
    state: serde_json::Value,
}

impl Saved<'_> {
    fn bad(&self, msg: String) -> RunError {
        file_err(self.path, msg)
    }

    fn f32s(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>), RunError> {
        let v = self.st.tensor(name).map_err(|_| self.bad(format!("has no tensor `{name}`")))?;
        Ok((v.shape().to_vec(), v.data().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes"))).collect()))
    }

    fn u64s(&self, name: &str) -> Result<Vec<u64>, RunError> {
        let v = self.st.tensor(name).map_err(|_| self.bad(format!("has no tensor `{name}`")))?;
        Ok(v.data().chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect())
    }

    fn num(&self, key: &str, i: Option<usize>) -> Result<serde_json::Value, RunError> {
        let v = &self.state[key];
        let v = match i {
            Some(i) => &v[i],
            None => v,
        };
        if v.is_null() { Err(self.bad(format!("training state has no `{key}`"))) } else { Ok(v.clone()) }
    }

    /// Parameters shaped like `like`, from tensors `{prefix}.{name}`.
    fn params(&self, prefix: &str, like: &Dictionary, device: &Device) -> Result<Dictionary, RunError> {
        let mut err = None;
        let p = like.map(|name, like| match self.f32s(&format!("{prefix}.{name}")) {
            Ok((shape, v)) if shape == like.dims() => Tensor::from_data(TensorData::new(v, like.dims()), device),
            Ok((shape, _)) => {
                err.get_or_insert(self.bad(format!("tensor `{prefix}.{name}` has shape {shape:?}, the configuration gives {:?}", like.dims())));
                like
            }
            Err(e) => {
                err.get_or_insert(e);
                like
            }
        });
        err.map_or(Ok(p), Err)
    }
}

fn load_checkpoint(path: &Path, cfg: &SaeRunConfig, units: &[Unit], store: &mut ActivationStore, device: &Device) -> Result<Vec<SaeTrainer>, RunError> {
    let bytes = std::fs::read(path).map_err(|e| file_err(path, e))?;
    let unreadable = |e: safetensors::SafeTensorError| file_err(path, format!("not a readable checkpoint: {e}"));
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).map_err(unreadable)?;
    let state = header
        .metadata()
        .as_ref()
        .and_then(|m| m.get("state"))
        .and_then(|s| serde_json::from_str(s).ok())
        .ok_or_else(|| file_err(path, "has no training state"))?;
    let saved = Saved { path, st: safetensors::SafeTensors::deserialize(&bytes).map_err(unreadable)?, state };
    if saved.state["format"].as_u64() != Some(FORMAT) && units.iter().any(|u| u.shape.skip) {
        return Err(saved.bad("was written by an older burnlens, its W_skip transposed; remove it to start again".into()));
    }
    let step = saved.num("step", None)?.as_u64().unwrap_or(0) as usize;
    let mut trainers = Vec::with_capacity(units.len());
    for (i, unit) in units.iter().enumerate() {
        let like = init(&cfg.architecture, unit.shape, None, &mut Rng::new(0), device);
        let prefix = format!("site{i}");
        let mut t = unit.trainer(cfg, saved.params(&format!("{prefix}.param"), &like, device)?);
        t.adam.m = saved.params(&format!("{prefix}.adam_m"), &like, device)?;
        t.adam.v = saved.params(&format!("{prefix}.adam_v"), &like, device)?;
        t.adam.t = saved.num("adam_t", Some(i))?.as_u64().unwrap_or(0);
        t.topk_threshold = saved.num("topk_threshold", Some(i))?.as_f64().unwrap_or(0.0);
        t.step = step;
        t.since_fired = saved.u64s(&format!("{prefix}.since_fired"))?.into_iter().map(|x| x as u32).collect();
        t.fired_tokens = saved.u64s(&format!("{prefix}.fired_tokens"))?;
        if t.since_fired.len() != unit.shape.d_sae {
            return Err(saved.bad(format!("holds {} features, the configuration {}", t.since_fired.len(), unit.shape.d_sae)));
        }
        trainers.push(t);
    }
    store.skip_to(saved.num("position", None)?.as_u64().unwrap_or(0))?;
    let w = store.buffer.width;
    let batch = store.buffer.batch_size * w;
    store.buffer.storage = saved.f32s("buffer.storage")?.1;
    store.buffer.serving = saved.f32s("buffer.serving")?.1.chunks(batch.max(1)).map(|c| c.to_vec()).collect();
    store.buffer.rng = serde_json::from_value(saved.num("rng", None)?).map_err(|e| saved.bad(format!("training state `rng`: {e}")))?;
    Ok(trainers)
}
