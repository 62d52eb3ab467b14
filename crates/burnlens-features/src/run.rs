//! A training run of one SAE on a corpus: the run directory holds the configuration
//! (`config.json`), a checkpoint written atomically every `checkpoint_every` steps
//! (`checkpoint.safetensors`: parameters, Adam's moments, the dead-feature counters, the
//! mixing buffer's rows and, in its metadata, the step, the data position and the shuffling
//! state), `metrics.jsonl` (a line per logged step) and, at the end, the SAE in SAELens's
//! layout (`sae/cfg.json` + `sae/sae_weights.safetensors`). Run again with the same
//! configuration after an interruption (SIGKILL included), it resumes from the checkpoint
//! and ends bit-identical to an uninterrupted run: the same batches in the same order.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use burn::tensor::{Device, Tensor, TensorData};
use burnlens_model::{HookPoint, Rng, Transformer};
use safetensors::Dtype;
use serde::{Deserialize, Serialize};

use crate::architecture::Architecture;
use crate::inference::{SaeSite, inference_sae};
use crate::params::{DECODER_INIT_NORM, SaeParams};
use crate::store::{ActivationStore, StoreConfig, StoreError, WindowSource};
use crate::trainer::{SaeTrainer, StepReport, TrainerConfig};

/// Everything a run depends on (its `config.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SaeRunConfig {
    /// The TransformerLens hook name the SAE reads.
    pub hook: String,
    pub d_sae: usize,
    pub architecture: Architecture,
    pub trainer: TrainerConfig,
    pub store: StoreConfig,
    /// Training steps (batches of `store.train_batch_size_tokens`).
    pub steps: usize,
    pub seed: u64,
    pub checkpoint_every: usize,
    /// Log a metrics line every this many steps.
    pub log_every: usize,
}

/// A problem with a run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("{path}: {msg}")]
    File { path: PathBuf, msg: String },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0}")]
    Config(String),
}

fn file_err(path: &Path, e: impl std::fmt::Display) -> RunError {
    RunError::File { path: path.to_path_buf(), msg: e.to_string() }
}

/// How a run ended.
#[derive(Debug, Clone, Serialize)]
pub struct RunSummary {
    pub steps: usize,
    /// Steps this invocation took (fewer than `steps` after a resume).
    pub steps_now: usize,
    pub resumed_from: Option<usize>,
    pub tokens: u64,
    pub last: Option<StepReport>,
    pub dead_features: usize,
    /// Whether the corpus ran out before `steps`.
    pub data_ran_out: bool,
    pub sae_dir: PathBuf,
}

const CHECKPOINT: &str = "checkpoint.safetensors";
const CONFIG: &str = "config.json";
const METRICS: &str = "metrics.jsonl";

/// Train (or resume) the run in `dir` on `model`'s activations from `windows` (made anew
/// for a resumed run, which skips what it had read). `on_step` sees every step's report.
pub fn train(dir: &Path, cfg: &SaeRunConfig, model: &Transformer, model_name: Option<String>, windows: WindowSource, on_step: &mut dyn FnMut(&StepReport, &Progress)) -> Result<RunSummary, RunError> {
    let hook = HookPoint::parse(&cfg.hook).ok_or_else(|| RunError::Config(format!("hook `{}`: not a hook point name", cfg.hook)))?;
    // Everything is checked before anything is written.
    let mut store = ActivationStore::new(model, vec![hook], windows, cfg.store, cfg.seed ^ 0x6d69_7869)?;
    if cfg.d_sae == 0 || cfg.steps == 0 {
        return Err(RunError::Config("d_sae and steps must be positive".into()));
    }
    std::fs::create_dir_all(dir).map_err(|e| file_err(dir, e))?;
    let cfg_path = dir.join(CONFIG);
    let cfg_text = serde_json::to_string_pretty(cfg).expect("config serialises");
    match std::fs::read_to_string(&cfg_path) {
        Ok(old) if old != cfg_text => return Err(file_err(&cfg_path, "this run directory holds a run with another configuration; use a new directory (or delete it)")),
        Ok(_) => {}
        Err(_) => burnlens_model::files::write_atomic(&cfg_path, cfg_text.as_bytes()).map_err(|e| file_err(&cfg_path, e))?,
    }
    let device = model.device();
    let d_in = store.widths[0];
    let ckpt = dir.join(CHECKPOINT);
    let (mut trainer, resumed_from) = if ckpt.is_file() {
        let t = load_checkpoint(&ckpt, cfg, &mut store, d_in, &device)?;
        let at = t.step;
        (t, Some(at))
    } else {
        let params = SaeParams::init(&cfg.architecture, d_in, cfg.d_sae, Some(DECODER_INIT_NORM), &mut Rng::new(cfg.seed), &device);
        (SaeTrainer::new(cfg.architecture, cfg.trainer, params), None)
    };
    let metrics_path = dir.join(METRICS);
    let start = Instant::now();
    let first = trainer.step;
    let mut last = None;
    let mut data_ran_out = false;
    while trainer.step < cfg.steps {
        let Some(batch) = store.next_batch()? else {
            data_ran_out = true;
            break;
        };
        let report = trainer.train_step(batch.into_iter().next().expect("one hook"));
        let done = trainer.step - first;
        let progress = Progress { step: trainer.step, steps: cfg.steps, tokens_per_s: (done * cfg.store.train_batch_size_tokens) as f64 / start.elapsed().as_secs_f64().max(1e-9), seconds_left: start.elapsed().as_secs_f64() / done as f64 * (cfg.steps - trainer.step) as f64 };
        on_step(&report, &progress);
        if trainer.step % cfg.log_every.max(1) == 0 || trainer.step == cfg.steps {
            append_metrics(&metrics_path, &report)?;
        }
        if trainer.step % cfg.checkpoint_every.max(1) == 0 && trainer.step < cfg.steps {
            save_checkpoint(&ckpt, &trainer, &store)?;
        }
        last = Some(report);
    }
    save_checkpoint(&ckpt, &trainer, &store)?;
    let sae_dir = dir.join("sae");
    let sae = inference_sae(&cfg.architecture, &trainer.params, trainer.topk_threshold, SaeSite { hook_name: &cfg.hook, model_name });
    sae.save(&sae_dir).map_err(|e| file_err(&sae_dir, e))?;
    Ok(RunSummary {
        steps: trainer.step,
        steps_now: trainer.step - first,
        resumed_from,
        tokens: trainer.step as u64 * cfg.store.train_batch_size_tokens as u64,
        last,
        dead_features: trainer.dead().iter().filter(|&&d| d).count(),
        data_ran_out,
        sae_dir,
    })
}

/// Where a run stands, for a progress line.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    pub step: usize,
    pub steps: usize,
    pub tokens_per_s: f64,
    pub seconds_left: f64,
}

fn append_metrics(path: &Path, r: &StepReport) -> Result<(), RunError> {
    use std::io::Write;
    let mut line = serde_json::json!({ "step": r.step + 1, "loss": r.loss, "lr": r.lr, "l0": r.l0, "dead_features": r.dead, "coefficient": r.coefficient });
    for (t, v) in &r.losses {
        line[t.name()] = (*v).into();
    }
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).map_err(|e| file_err(path, e))?;
    writeln!(f, "{line}").map_err(|e| file_err(path, e))
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn tensor_bytes<const D: usize>(t: &Tensor<D>) -> (Vec<usize>, Vec<u8>) {
    (t.dims().to_vec(), f32_bytes(&t.to_data().try_into_vec_as::<f32>().expect("f32")))
}

/// The checkpoint: one safetensors file, written atomically.
fn save_checkpoint(path: &Path, t: &SaeTrainer, store: &ActivationStore) -> Result<(), RunError> {
    let mut tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for (prefix, p) in [("param", &t.params), ("adam_m", &t.adam.m), ("adam_v", &t.adam.v)] {
        for (name, v) in p.named() {
            let (shape, bytes) = tensor_bytes(&v);
            tensors.push((format!("{prefix}.{name}"), Dtype::F32, shape, bytes));
        }
    }
    let u64s = |v: Vec<u64>| (vec![v.len()], v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>());
    let (s, b) = u64s(t.since_fired.iter().map(|&x| x as u64).collect());
    tensors.push(("since_fired".into(), Dtype::U64, s, b));
    let (s, b) = u64s(t.fired_tokens.clone());
    tensors.push(("fired_tokens".into(), Dtype::U64, s, b));
    let w = store.buffer.width;
    let serving: Vec<f32> = store.buffer.serving.iter().flatten().copied().collect();
    for (name, rows) in [("buffer.storage", &store.buffer.storage), ("buffer.serving", &serving)] {
        tensors.push((name.into(), Dtype::F32, vec![rows.len() / w, w], f32_bytes(rows)));
    }
    let meta = serde_json::json!({
        "step": t.step,
        "adam_t": t.adam.t,
        "topk_threshold": t.topk_threshold,
        "windows_read": store.windows_read,
        "rng": store.buffer.rng,
        "serving_batches": store.buffer.serving.len(),
    });
    let views: Vec<(String, safetensors::tensor::TensorView)> =
        tensors.iter().map(|(n, d, s, b)| (n.clone(), safetensors::tensor::TensorView::new(*d, s.clone(), b).expect("consistent view"))).collect();
    let metadata = HashMap::from([("state".to_string(), meta.to_string())]);
    let bytes = safetensors::serialize(views, Some(metadata)).map_err(|e| file_err(path, e))?;
    burnlens_model::files::write_atomic(path, &bytes).map_err(|e| file_err(path, e))
}

fn load_checkpoint(path: &Path, cfg: &SaeRunConfig, store: &mut ActivationStore, d_in: usize, device: &Device) -> Result<SaeTrainer, RunError> {
    let bad = |msg: String| file_err(path, msg);
    let bytes = std::fs::read(path).map_err(|e| file_err(path, e))?;
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).map_err(|e| bad(format!("not a readable checkpoint: {e}")))?;
    let st = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| bad(format!("not a readable checkpoint: {e}")))?;
    let state: serde_json::Value = header.metadata().as_ref().and_then(|m| m.get("state")).and_then(|s| serde_json::from_str(s).ok()).ok_or_else(|| bad("has no training state".into()))?;
    let f32s = |name: &str| -> Result<(Vec<usize>, Vec<f32>), RunError> {
        let v = st.tensor(name).map_err(|_| bad(format!("has no tensor `{name}`")))?;
        Ok((v.shape().to_vec(), v.data().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes"))).collect()))
    };
    let u64s = |name: &str| -> Result<Vec<u64>, RunError> {
        let v = st.tensor(name).map_err(|_| bad(format!("has no tensor `{name}`")))?;
        Ok(v.data().chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect())
    };
    let init = SaeParams::init(&cfg.architecture, d_in, cfg.d_sae, None, &mut Rng::new(0), device);
    let read = |prefix: &str| -> Result<SaeParams, RunError> {
        let mut err = None;
        let p = init.map(|name, like| match f32s(&format!("{prefix}.{name}")) {
            Ok((shape, v)) if shape.iter().product::<usize>() == like.dims().iter().product::<usize>() => Tensor::from_data(TensorData::new(v, like.dims()), device),
            Ok((shape, _)) => {
                err.get_or_insert(bad(format!("tensor `{prefix}.{name}` has shape {shape:?}, the configuration gives {:?}", like.dims())));
                like
            }
            Err(e) => {
                err.get_or_insert(e);
                like
            }
        });
        err.map_or(Ok(p), Err)
    };
    let mut t = SaeTrainer::new(cfg.architecture, cfg.trainer, read("param")?);
    t.adam.m = read("adam_m")?;
    t.adam.v = read("adam_v")?;
    let num = |k: &str| state[k].as_u64().ok_or_else(|| bad(format!("training state has no `{k}`")));
    t.adam.t = num("adam_t")?;
    t.step = num("step")? as usize;
    t.topk_threshold = state["topk_threshold"].as_f64().unwrap_or(0.0);
    t.since_fired = u64s("since_fired")?.into_iter().map(|x| x as u32).collect();
    t.fired_tokens = u64s("fired_tokens")?;
    if t.since_fired.len() != cfg.d_sae {
        return Err(bad(format!("holds {} features, the configuration {}", t.since_fired.len(), cfg.d_sae)));
    }
    store.skip_windows(num("windows_read")?)?;
    let w = store.buffer.width;
    let (_, storage) = f32s("buffer.storage")?;
    let (_, serving) = f32s("buffer.serving")?;
    let batch = store.buffer.batch_size * w;
    store.buffer.storage = storage;
    store.buffer.serving = serving.chunks(batch.max(1)).map(|c| c.to_vec()).collect();
    store.buffer.rng = serde_json::from_value(state["rng"].clone()).map_err(|e| bad(format!("training state `rng`: {e}")))?;
    Ok(t)
}
