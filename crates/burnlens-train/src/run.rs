//! A training run: its directory, checkpoints and the loop.
//!
//! ```text
//! RUN_DIR/config.toml          the effective config (after --set)
//! RUN_DIR/model.json           the architecture and HF family
//! RUN_DIR/data.json            what was loaded and how it was split
//! RUN_DIR/char_vocab.json | tokenizer.json
//! RUN_DIR/metrics.jsonl        one line per step, one per evaluation
//! RUN_DIR/loss.svg             the loss curves
//! RUN_DIR/checkpoints/step-000500/{model.bpk, optim.bpk, state.json}
//! RUN_DIR/checkpoints/LATEST   name of the newest complete checkpoint
//! RUN_DIR/hf/                  Hugging Face export
//! ```
//!
//! A checkpoint is written into a temporary directory and renamed into place, and `LATEST`
//! is replaced atomically after that, so a crash at any moment leaves the previous complete
//! checkpoint loadable.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use burn::module::Module;
use burn::optim::{GradientsAccumulator, GradientsParams, ModuleOptimizer};
use burn::tensor::{Device, Int, Tensor, TensorData};
use burn_store::{BurnpackStore, ModuleSnapshot};
use burnlens_hf::{ExportOptions, Family, FreshShape, LoadOptions, Tokenizer, WeightDtype, export_hf, load_model_with};
use burnlens_model::backend;
use burnlens_model::{ActivationFn, AttentionSpan, Positional, Rng, Transformer, TransformerConfig, cross_entropy};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::config::{ModelSection, RunConfig, TrainingSection};
use crate::data::{Dataset, Split};
use crate::error::{Result, TrainError};
use crate::optim::{clip_global_norm, learning_rate, optimizer};
use crate::plot::write_loss_svg;

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Ask a running loop to checkpoint and stop at the next step (what Ctrl-C does).
pub fn request_stop() {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Install the Ctrl-C / SIGTERM handler that calls [`request_stop`]. Safe to call twice.
pub fn install_interrupt_handler() {
    let _ = ctrlc::set_handler(request_stop);
}

/// The architecture of a run, saved as `model.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModelSpec {
    pub family: Family,
    pub config: TransformerConfig,
}

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

/// How a run ended.
#[derive(Debug, Clone)]
pub struct RunSummary {
    pub run_dir: PathBuf,
    pub steps: usize,
    pub final_train_loss: f64,
    pub final_val_loss: Option<f64>,
    pub tokens_per_s: f64,
    pub seconds: f64,
    pub exported: Option<PathBuf>,
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    burnlens_hf::write_atomic(path, bytes).map_err(|e| TrainError::io(path, e))
}

/// Resolve the device: `[backend]` in the config, else the flag, else `BURNLENS_BACKEND`.
pub fn run_device(cfg: &RunConfig, flag: Option<&str>) -> Result<Device> {
    let name = backend::resolve_name(&[cfg.backend.name.as_deref(), flag]);
    Ok(backend::device(&name, cfg.backend.device)?)
}

/// The architecture `[model]` describes for a vocabulary of `vocab` tokens.
pub fn model_spec(cfg: &RunConfig, vocab: usize) -> Result<ModelSpec> {
    let m = &cfg.model;
    let bad = |msg: String| TrainError::Config { path: PathBuf::from("[model]"), msg };
    let fam = m.family.unwrap_or(Family::Gpt2);
    let family = fam.model_type();
    let d_model = m.d_model.ok_or_else(|| bad("model.d_model is required (or model.from)".into()))?;
    let n_heads = m.n_heads.ok_or_else(|| bad("model.n_heads is required (or model.from)".into()))?;
    let n_layers = m.n_layers.ok_or_else(|| bad("model.n_layers is required (or model.from)".into()))?;
    if n_layers > burnlens_model::MAX_LAYERS {
        return Err(bad(format!("model.n_layers = {n_layers}; at most {} are supported", burnlens_model::MAX_LAYERS)));
    }
    if n_heads == 0 || d_model % n_heads != 0 {
        return Err(bad(format!("model.d_model = {d_model} must be a positive multiple of model.n_heads = {n_heads}")));
    }
    // The family's fresh model, then the run config's overrides.
    let n_ctx = m.context.unwrap_or(cfg.training.block_size);
    let mut config = fam.spec().fresh(&FreshShape { vocab, n_ctx, d_model, n_layers, n_heads });
    let rotary_family = config.positional == Positional::Rotary;
    set_spans(m, n_layers, &mut config.spans)?;
    if let Some(a) = &m.activation {
        config.activation = ActivationFn::from_hf_name(a)
            .ok_or_else(|| bad(format!("model.activation = \"{a}\" is not one of {}", ActivationFn::HF_NAMES.join(", "))))?;
    }
    config.positional = match m.positional.as_deref() {
        None => config.positional,
        Some("rotary") if rotary_family => Positional::Rotary,
        Some("residual") if !rotary_family => Positional::Residual,
        Some("query_key_only") if !rotary_family => Positional::QueryKeyOnly,
        Some(p) => {
            let allowed = if rotary_family { "rotary" } else { "residual, query_key_only" };
            return Err(bad(format!("model.positional = \"{p}\" is not one of {allowed} (for model.family = \"{family}\")")));
        }
    };
    if !rotary_family {
        for (key, set) in [("n_kv_heads", m.n_kv_heads.is_some()), ("rotary_pct", m.rotary_pct.is_some()), ("rope_theta", m.rope_theta.is_some()), ("parallel_residual", m.parallel_residual.is_some())] {
            if set {
                return Err(bad(format!("model.{key} applies to the rotary families, not to model.family = \"{family}\"")));
            }
        }
    }
    let d_head = d_model / n_heads;
    for r in [config.rotary.as_mut(), config.rotary_local.as_mut()].into_iter().flatten() {
        if let Some(pct) = m.rotary_pct {
            r.dims = ((d_head as f64 * pct) as usize) & !1;
        }
    }
    if let (Some(theta), Some(r)) = (m.rope_theta, config.rotary.as_mut()) {
        r.base = theta;
    }
    if let Some(t) = m.tie_embeddings {
        config.untied_unembed = !t;
    }
    if let Some(p) = m.parallel_residual {
        config.parallel_residual = p;
    }
    if m.n_kv_heads.is_some() {
        config.n_kv_heads = m.n_kv_heads;
    }
    config.d_mlp = if m.attention_only { None } else { Some(m.d_mlp.unwrap_or(4 * d_model)) };
    config.scale_by_inverse_layer = m.scale_attn_by_inverse_layer_idx;
    config.dropout = cfg.training.dropout;
    config.validate().map_err(|e| bad(e.to_string()))?;
    Ok(ModelSpec { family: fam, config })
}

/// `model.attention` (one `global` / `local` per layer) and `model.window` over the
/// family's fresh spans.
fn set_spans(m: &ModelSection, n_layers: usize, spans: &mut Vec<AttentionSpan>) -> Result<()> {
    let bad = |msg: String| TrainError::Config { path: PathBuf::from("[model]"), msg };
    if let Some(kinds) = &m.attention {
        if kinds.len() != n_layers {
            return Err(bad(format!("model.attention lists {} layers but model.n_layers is {n_layers}", kinds.len())));
        }
        *spans = kinds
            .iter()
            .map(|k| match k.as_str() {
                "global" => Ok(AttentionSpan::Global),
                "local" => Ok(AttentionSpan::Local(m.window.unwrap_or(256))),
                other => Err(bad(format!("model.attention has \"{other}\"; expected \"global\" or \"local\""))),
            })
            .collect::<Result<Vec<_>>>()?;
    } else if let Some(w) = m.window {
        for s in spans.iter_mut().filter(|s| matches!(s, AttentionSpan::Local(_))) {
            *s = AttentionSpan::Local(w);
        }
    }
    Ok(())
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

/// Export the latest checkpoint of `run_dir` as a Hugging Face directory.
/// Export the latest checkpoint of `run_dir` to `out` as a Hugging Face model, its tensors
/// in `dtype` (`auto`: f32, the dtype it was trained in).
pub fn export_run(run_dir: &Path, out: &Path, dtype: WeightDtype) -> Result<()> {
    let run = load_run(run_dir, &Device::flex())?;
    export_hf(&run.model, run.spec.family, out, &ExportOptions { tokenizer: run.tokenizer.as_ref(), dtype })?;
    Ok(())
}

/// Options of [`train`] that are not part of the run config.
#[derive(Debug, Clone, Default)]
pub struct TrainOptions {
    /// `--backend`, used when the config has no `[backend]`.
    pub backend_flag: Option<String>,
    /// Continue the run in the config's `output.dir` from its latest checkpoint.
    pub resume: bool,
    /// Print nothing but errors.
    pub quiet: bool,
    /// Called after every optimizer step with the metrics line of that step (`step`, `loss`,
    /// `lr`, `grad_norm`, `tokens_per_s`, `elapsed_s`); the Python API's `on_step`.
    pub on_step: Option<OnStep>,
}

/// A callback of [`TrainOptions::on_step`].
#[derive(Clone)]
pub struct OnStep(pub std::sync::Arc<dyn Fn(&serde_json::Value) + Send + Sync>);

impl std::fmt::Debug for OnStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OnStep(..)")
    }
}

/// Train as `cfg` says. Returns when the steps are done, or with
/// [`TrainError::Interrupted`] after checkpointing on Ctrl-C.
pub fn train(cfg: &RunConfig, opts: &TrainOptions) -> Result<RunSummary> {
    let run_dir = cfg.output.dir.clone();
    let t = &cfg.training;
    let device = run_device(cfg, opts.backend_flag.as_deref())?;
    let ad = device.clone().autodiff();

    let existing = existing_checkpoint(&run_dir, opts.resume)?;
    let data = Dataset::load(&cfg.data, t.block_size)?;

    let (spec, mut model, mut optim, state) = open_model(cfg, opts, &existing, &data, &ad)?;
    prepare_run_dir(cfg, opts, &spec, &data)?;
    let mut metrics = Metrics::open(&run_dir, state.step)?;

    let ckpt_every = t.checkpoint_interval.unwrap_or(t.eval_interval).max(1);
    let tokens_per_step = (t.batch_size * t.block_size * t.grad_accum) as u64;
    let mut rng = state.rng.clone();
    let mut tokens_seen = state.tokens_seen;
    let mut last_val = state.last_val_loss;
    let mut last_ckpt = existing;
    let mut last_loss = f64::NAN;
    let progress = Progress::new(t.steps, state.step, opts.quiet);
    let started = Instant::now();

    for step in state.step..t.steps {
        if INTERRUPTED.swap(false, Ordering::SeqCst) {
            let st = TrainState { step, rng: rng.clone(), tokens_seen, last_val_loss: last_val };
            let dir = save_checkpoint(&run_dir, &model, &optim, &st)?;
            metrics.plot().ok();
            return Err(TrainError::Interrupted { step, checkpoint: dir });
        }
        // Dropout masks depend only on the seed and the step, so a resumed run draws the same.
        ad.seed(t.seed.wrapping_mul(1_000_003).wrapping_add(step as u64));
        let lr = learning_rate(t, step);
        let (mut grads, loss_sum) = accumulate(&model, &data, &mut rng, t, &ad);
        if !loss_sum.is_finite() {
            return Err(TrainError::NonFinite { step, loss: loss_sum, checkpoint: last_ckpt });
        }
        let grad_norm = clip_global_norm(&model, &mut grads, t.grad_clip);
        model = optim.step(lr, model, grads);
        tokens_seen += tokens_per_step;
        last_loss = loss_sum;

        let done = step + 1;
        let elapsed = started.elapsed().as_secs_f64();
        let tps = (done - state.step) as f64 * tokens_per_step as f64 / elapsed.max(1e-9);
        let line = json!({"kind": "train", "step": done, "loss": loss_sum, "lr": lr, "grad_norm": grad_norm, "tokens_per_s": tps, "elapsed_s": elapsed});
        if let Some(OnStep(f)) = &opts.on_step {
            f(&line);
        }
        metrics.record(line)?;

        if done % t.eval_interval.max(1) == 0 || done == t.steps {
            let val = evaluate(&model.valid(), &data, t.seed, t.eval_batches, t.batch_size, t.block_size);
            last_val = Some(val);
            metrics.record(json!({"kind": "eval", "step": done, "val_loss": val, "train_loss": loss_sum}))?;
            progress.eval(done, val);
        }
        progress.step(done, loss_sum, tps, done % t.log_interval.max(1) == 0);
        if done % ckpt_every == 0 || done == t.steps {
            let st = TrainState { step: done, rng: rng.clone(), tokens_seen, last_val_loss: last_val };
            last_ckpt = Some(save_checkpoint(&run_dir, &model, &optim, &st)?);
            metrics.plot().ok();
        }
    }
    progress.finish();
    metrics.plot().map_err(|e| TrainError::io(run_dir.join("loss.svg"), e))?;

    let seconds = started.elapsed().as_secs_f64();
    let steps_run = t.steps.saturating_sub(state.step);
    let exported = export_trained(cfg, opts, &spec, &model, &data)?;
    Ok(RunSummary {
        run_dir,
        steps: t.steps,
        final_train_loss: last_loss,
        final_val_loss: last_val,
        tokens_per_s: steps_run as f64 * tokens_per_step as f64 / seconds.max(1e-9),
        seconds,
        exported,
    })
}

/// The run directory's latest checkpoint; one there without `resume` is refused (a new run
/// never overwrites an old one).
fn existing_checkpoint(run_dir: &Path, resume: bool) -> Result<Option<PathBuf>> {
    let existing = latest_checkpoint(run_dir)?;
    if existing.is_some() && !resume {
        return Err(TrainError::Config { path: run_dir.to_path_buf(), msg: "already holds a training run; continue it with --resume or choose another output.dir".into() });
    }
    Ok(existing)
}

/// `metrics.jsonl`, appended a line at a time, and the lines so far for the loss plot.
struct Metrics {
    path: PathBuf,
    file: std::fs::File,
    history: Vec<serde_json::Value>,
    svg: PathBuf,
}

impl Metrics {
    /// The run's metrics up to `step` (a resumed run's later lines are dropped), open for
    /// appending.
    fn open(run_dir: &Path, step: usize) -> Result<Self> {
        let path = run_dir.join("metrics.jsonl");
        let history = read_metrics(&path, step)?;
        let file = std::fs::OpenOptions::new().create(true).append(true).open(&path).map_err(|e| TrainError::io(&path, e))?;
        Ok(Metrics { path, file, history, svg: run_dir.join("loss.svg") })
    }

    fn record(&mut self, line: serde_json::Value) -> Result<()> {
        writeln!(self.file, "{line}").map_err(|e| TrainError::io(&self.path, e))?;
        self.history.push(line);
        Ok(())
    }

    /// `loss.svg` from the lines so far.
    fn plot(&self) -> std::io::Result<()> {
        write_loss_svg(&self.svg, &self.history)
    }
}

/// The model, its optimiser and the loop's state: resumed from the run directory's last
/// checkpoint, fine-tuned from an HF model (`model.from`), or fresh from the run config.
fn open_model(cfg: &RunConfig, opts: &TrainOptions, existing: &Option<PathBuf>, data: &Dataset, ad: &Device) -> Result<(ModelSpec, Transformer, ModuleOptimizer, TrainState)> {
    let (run_dir, t) = (&cfg.output.dir, &cfg.training);
    match (existing, opts.resume) {
        (Some(_), true) => {
            let run = load_run(run_dir, ad)?;
            let optim_path = run.checkpoint.join("optim.bpk");
            let optim = optimizer(t).load(&optim_path).map_err(|e| TrainError::Checkpoint { path: optim_path, msg: e.to_string() })?;
            Ok((run.spec, run.model, optim, run.state))
        }
        (None, true) => Err(TrainError::Checkpoint { path: run_dir.clone(), msg: "nothing to resume: no checkpoint in this run directory".into() }),
        _ => {
            let (spec, model) = match &cfg.model.from {
                Some(spec) => {
                    // A directory, or a Hub id fetched into the Hugging Face cache.
                    let dir = burnlens_hf::resolve_model(&spec.to_string_lossy(), &mut |p| {
                        if let burnlens_hf::hub::Progress::Start { file, size, .. } = p {
                            eprintln!("downloading {file} ({size} bytes)");
                        }
                    })?;
                    // Training keeps f32 master weights: a half checkpoint fine-tunes from an
                    // f32 copy.
                    let loaded = load_model_with(&dir, ad, &LoadOptions::dtype(WeightDtype::F32))?;
                    (ModelSpec { family: loaded.hf.family, config: loaded.model.config.clone() }, loaded.model)
                }
                None => {
                    let spec = model_spec(cfg, data.vocab_size)?;
                    ad.seed(t.seed);
                    let model = spec.config.init(ad)?;
                    (spec, model)
                }
            };
            let state = TrainState { step: 0, rng: Rng::new(t.seed), tokens_seen: 0, last_val_loss: None };
            Ok((spec, model, optimizer(t), state))
        }
    }
}

/// Check that the data fits the model, then lay out a new run directory (a resumed one
/// already has all of it; settings given at resume, more steps say, become the run's).
fn prepare_run_dir(cfg: &RunConfig, opts: &TrainOptions, spec: &ModelSpec, data: &Dataset) -> Result<()> {
    let (run_dir, t) = (&cfg.output.dir, &cfg.training);
    if data.vocab_size > spec.config.vocab_size {
        return Err(TrainError::Config {
            path: cfg.data.tokenizer.clone().or(cfg.data.path.clone()).unwrap_or_default(),
            msg: format!("the data's vocabulary has {} tokens but the model's has only {}", data.vocab_size, spec.config.vocab_size),
        });
    }
    if t.block_size > spec.config.n_ctx {
        return Err(TrainError::Config {
            path: PathBuf::from("[training]"),
            msg: format!("training.block_size = {} is larger than the model's context of {} positions", t.block_size, spec.config.n_ctx),
        });
    }

    std::fs::create_dir_all(run_dir.join("checkpoints")).map_err(|e| TrainError::io(&run_dir, e))?;
    if !opts.resume {
        write_atomic(&run_dir.join("config.toml"), cfg.to_toml().as_bytes())?;
        write_atomic(&run_dir.join("model.json"), serde_json::to_string_pretty(spec).expect("json").as_bytes())?;
        write_atomic(&run_dir.join("data.json"), serde_json::to_string_pretty(data.summary()).expect("json").as_bytes())?;
        if let Some(tok) = &data.tokenizer {
            tok.save(&run_dir)?;
        }
    } else {
        // Settings given at resume (more steps, say) become the run's.
        write_atomic(&run_dir.join("config.toml"), cfg.to_toml().as_bytes())?;
    }
    Ok(())
}

/// `grad_accum` micro-batches' gradients, summed, and their mean loss.
fn accumulate(model: &Transformer, data: &Dataset, rng: &mut Rng, t: &TrainingSection, ad: &Device) -> (GradientsParams, f64) {
    let mut accum = GradientsAccumulator::<Transformer>::new();
    let mut loss_sum = 0.0;
    for _ in 0..t.grad_accum {
        let seqs = data.batch(Split::Train, rng, t.batch_size, t.block_size);
        let (x, y) = inputs_targets(seqs, t.batch_size, t.block_size, ad);
        let loss = cross_entropy(model.forward(x), y) / t.grad_accum as f64;
        loss_sum += loss.clone().into_scalar::<f32>() as f64;
        let grads = GradientsParams::from_grads(loss.backward(), model);
        accum.accumulate(model, grads);
    }
    (accum.grads(), loss_sum)
}

/// With `output.export`, the trained model as an HF directory `hf/` (a note, not an error,
/// when the architecture has no HF family form).
fn export_trained(cfg: &RunConfig, opts: &TrainOptions, spec: &ModelSpec, model: &Transformer, data: &Dataset) -> Result<Option<PathBuf>> {
    if !cfg.output.export {
        return Ok(None);
    }
    let family = spec.family;
    match burnlens_hf::check_exportable(&spec.config, family) {
        Ok(()) => {
            let out = cfg.output.dir.join("hf");
            export_hf(&model.valid(), family, &out, &ExportOptions { tokenizer: data.tokenizer.as_ref(), dtype: WeightDtype::F32 })?;
            Ok(Some(out))
        }
        Err(e) => {
            if !opts.quiet {
                eprintln!("note: no Hugging Face export: {e}");
            }
            Ok(None)
        }
    }
}

/// Split `[batch, block + 1]` token rows into inputs and targets on `device`.
fn inputs_targets(seqs: Vec<i64>, batch: usize, block: usize, device: &Device) -> (Tensor<2, Int>, Tensor<2, Int>) {
    let all = Tensor::<2, Int>::from_data(TensorData::new(seqs, [batch, block + 1]), device);
    (all.clone().narrow(1, 0, block), all.narrow(1, 1, block))
}

/// Mean validation loss over `n` batches, the same batches at every evaluation.
pub fn evaluate(model: &Transformer, data: &Dataset, seed: u64, n: usize, batch: usize, block: usize) -> f64 {
    let mut rng = Rng::new(seed ^ 0x5EED_0F_E7A1);
    let device = model.device();
    let mut total = 0.0;
    for _ in 0..n {
        let (x, y) = inputs_targets(data.batch(Split::Val, &mut rng, batch, block), batch, block, &device);
        total += cross_entropy(model.forward(x), y).into_scalar::<f32>() as f64;
    }
    total / n as f64
}

fn save_checkpoint(run_dir: &Path, model: &Transformer, optim: &ModuleOptimizer, state: &TrainState) -> Result<PathBuf> {
    let root = run_dir.join("checkpoints");
    let name = format!("step-{:06}", state.step);
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

/// A progress line: redrawn in place on a terminal, plain lines otherwise.
struct Progress {
    total: usize,
    start: usize,
    tty: bool,
    quiet: bool,
    began: Instant,
}

impl Progress {
    fn new(total: usize, start: usize, quiet: bool) -> Self {
        Self { total, start, tty: std::io::stdout().is_terminal(), quiet, began: Instant::now() }
    }

    fn step(&self, done: usize, loss: f64, tps: f64, log_line: bool) {
        if self.quiet || (!self.tty && !log_line && done != self.total) {
            return;
        }
        let per_step = self.began.elapsed().as_secs_f64() / (done - self.start).max(1) as f64;
        let eta = per_step * (self.total - done) as f64;
        let width = 24;
        let filled = done * width / self.total.max(1);
        let text = format!(
            "step {done:>6}/{} [{}{}] loss {loss:.4}  {tps:>8.0} tok/s  ETA {}",
            self.total,
            "#".repeat(filled),
            ".".repeat(width - filled),
            fmt_secs(eta)
        );
        if self.tty {
            print!("\r{text}");
            let _ = std::io::stdout().flush();
        } else {
            println!("{text}");
        }
    }

    fn eval(&self, done: usize, val: f64) {
        if self.quiet {
            return;
        }
        if self.tty {
            println!();
        }
        println!("step {done:>6}: validation loss {val:.4}");
    }

    fn finish(&self) {
        if self.tty && !self.quiet {
            println!();
        }
    }
}

fn fmt_secs(s: f64) -> String {
    let s = s.max(0.0) as u64;
    if s >= 3600 { format!("{}h{:02}m", s / 3600, s % 3600 / 60) } else { format!("{}m{:02}s", s / 60, s % 60) }
}
