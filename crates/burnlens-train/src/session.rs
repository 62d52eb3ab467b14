//! A training run as a session of small steps: [`TrainSession::open`] (fresh, fine-tuned
//! from a Hugging Face model, or resumed from its run directory), then [`step`], [`evaluate`]
//! and [`checkpoint`] as often as wanted, and [`finish`] (the loss plot and the export).
//! [`train`] is the loop over them that the CLI and Python run; what happens is reported
//! to an [`Observer`], so the library prints nothing.
//!
//! Data parallel over the [`Ranks`] of an MPI job (`mpirun -n N burnlens train`): every rank
//! draws the same global batches from the same generator and takes its rows of each
//! ([`Ranks::rows`]), weights its loss by its share of the batch, and the gradients are
//! summed over ranks before the same clipping and optimizer step everywhere. So N ranks
//! follow the one-process run of the same config (up to the order of the sums), and a
//! checkpoint resumes with any N. Rank 0 alone writes the run directory; at each checkpoint
//! every rank compares a digest of its parameters with rank 0's.
//!
//! ```text
//! RUN_DIR/config.toml          the effective config (after --set)
//! RUN_DIR/model.json           the architecture and HF family
//! RUN_DIR/data.json            what was loaded and how it was split
//! RUN_DIR/char_vocab.json | tokenizer.json
//! RUN_DIR/metrics.jsonl        one line per step, one per evaluation
//! RUN_DIR/loss.svg             the loss curves
//! RUN_DIR/checkpoints/         see [`crate::checkpoint`]
//! RUN_DIR/hf/                  Hugging Face export
//! ```
//!
//! [`step`]: TrainSession::step
//! [`evaluate`]: TrainSession::evaluate
//! [`checkpoint`]: TrainSession::checkpoint
//! [`finish`]: TrainSession::finish

use std::ops::Range;
use std::path::PathBuf;

use std::time::Instant;

use burn::module::Module;
use burn::optim::{GradientsAccumulator, GradientsParams, ModuleOptimizer};
use burn::tensor::{Device, Int, Tensor, TensorData};
use burnlens_dist::Ranks;
use burnlens_hf::{ExportOptions, LoadOptions, WeightDtype, export_hf, load_model_with};
use burnlens_model::backend;
use burnlens_model::files::write_atomic;
use burnlens_model::read_back::read_together;
use burnlens_model::{Rng, Transformer, cross_entropy};
use serde_json::json;

use crate::checkpoint::{TrainState, checkpoint_dir, latest_checkpoint, load_run, save_checkpoint};
use crate::config::{RunConfig, TrainingSection};
use crate::data::{Dataset, Split};
use crate::data_parallel::{all_reduce_grads, broadcast_params, params_digest};
use crate::error::{Result, TrainError};
use crate::metrics::Metrics;
use crate::observer::{Observer, StepMetrics};
use crate::optim::{clip_global_norm, clip_to_norm, learning_rate, norm_of, optimizer, squared_norm};
use crate::spec::{ModelSpec, model_spec};

/// How a session is opened, besides the run config.
#[derive(Debug, Clone, Default)]
pub struct TrainOptions {
    /// `--backend`, used when the config has no `[backend]`.
    pub backend_flag: Option<String>,
    /// Continue the run in the config's `output.dir` from its latest checkpoint.
    pub resume: bool,
    /// The processes training together (this one alone by default).
    pub ranks: Ranks,
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

/// Train as `cfg` says, reporting to `observer`. Returns when the steps are done, or with
/// [`TrainError::Interrupted`] after checkpointing on Ctrl-C or when the observer breaks.
pub fn train(cfg: &RunConfig, opts: &TrainOptions, observer: &mut dyn Observer) -> Result<RunSummary> {
    let mut session = TrainSession::open(cfg, opts, observer)?;
    let t = &cfg.training;
    observer.started(session.steps_done(), t.steps, t.log_interval.max(1));
    let mut observer_broke = false;
    while !session.is_done() {
        // Every rank stops at the same step, whichever was asked.
        if session.stop_agreed(burnlens_model::stop::stop_requested() || observer_broke)? {
            return Err(session.interrupt()?);
        }
        let m = session.step()?;
        observer_broke = observer.step(&m).is_break();
        if session.evaluation_due() {
            let val = session.evaluate()?;
            observer.evaluated(m.step, val);
        }
        if session.checkpoint_due() {
            let dir = session.checkpoint()?;
            observer.checkpointed(m.step, &dir);
        }
    }
    if observer_broke {
        return Err(session.interrupt()?);
    }
    observer.finished();
    session.finish(observer)
}

/// An open run: the model, its optimizer, the data and the loop's state.
pub struct TrainSession {
    cfg: RunConfig,
    spec: ModelSpec,
    /// `None` only inside [`TrainSession::step`], while the optimizer owns the model.
    model: Option<Transformer>,
    optim: ModuleOptimizer,
    data: Dataset,
    ad: Device,
    state: TrainState,
    /// `metrics.jsonl`, on the rank that writes (rank 0).
    metrics: Option<Metrics>,
    ranks: Ranks,
    first_step: usize,
    started: Instant,
    last_loss: f64,
    /// The newest complete checkpoint and its step.
    last_checkpoint: Option<(usize, PathBuf)>,
}

impl TrainSession {
    /// Open the run `cfg` describes: its run directory laid out (or, with `opts.resume`, its
    /// latest checkpoint loaded), the data loaded and checked against the model. With
    /// several ranks, each opens its own and they agree before any training: a rank that
    /// failed reports its error, the others name it.
    pub fn open(cfg: &RunConfig, opts: &TrainOptions, observer: &mut dyn Observer) -> Result<Self> {
        let opened = Self::open_here(cfg, opts, observer);
        let shared = opts.ranks.agree(opened.as_ref().map(|_| ()).map_err(|e| e.to_string()));
        let mut session = opened?;
        shared?;
        if session.ranks.size() > 1 {
            // Burn draws a fresh model's parameters when they are first read, from the
            // generator the first step seeds: draw them now from rank 0's seed of that step,
            // as the one-process run's first forward pass does (the same values when no
            // dropout draws in between), and send rank 0's to every rank (reading them to
            // send them draws them).
            session.ad.seed(step_seed(cfg.training.seed, session.state.step, 0));
            let model = session.model.take().expect("opened with its model");
            session.model = Some(broadcast_params(&session.ranks, model)?);
        }
        Ok(session)
    }

    fn open_here(cfg: &RunConfig, opts: &TrainOptions, observer: &mut dyn Observer) -> Result<Self> {
        burnlens_model::kernels::set_compute(cfg.training.compute);
        let ranks = opts.ranks.clone();
        if cfg.training.batch_size < ranks.size() {
            return Err(TrainError::Config {
                path: PathBuf::from("[training]"),
                msg: format!("training.batch_size = {} cannot be shared by {} ranks: each needs at least one row", cfg.training.batch_size, ranks.size()),
            });
        }
        let name = backend::resolve_name(&[cfg.backend.name.as_deref(), opts.backend_flag.as_deref()]);
        let ad = backend::device(&name, cfg.backend.device)?.autodiff();
        let existing = latest_checkpoint(&cfg.output.dir)?;
        if existing.is_some() && !opts.resume {
            return Err(TrainError::Config {
                path: cfg.output.dir.clone(),
                msg: "already holds a training run; continue it with --resume or choose another output.dir".into(),
            });
        }
        let data = Dataset::load(&cfg.data, cfg.training.block_size)?;
        let (spec, model, optim, state) = match existing.as_ref().filter(|_| opts.resume) {
            Some(_) => resumed(cfg, &ad)?,
            None if opts.resume => {
                return Err(TrainError::Checkpoint { path: cfg.output.dir.clone(), msg: "nothing to resume: no checkpoint in this run directory".into() });
            }
            None => fresh(cfg, &data, &ad, observer)?,
        };
        check_fits(cfg, &spec, &data)?;
        let metrics = if ranks.is_writer() {
            prepare_run_dir(cfg, opts.resume, &spec, &data)?;
            Some(Metrics::open(&cfg.output.dir, state.step)?)
        } else {
            None
        };
        let last_checkpoint = existing.map(|dir| (state.step, dir));
        Ok(TrainSession {
            cfg: cfg.clone(),
            spec,
            model: Some(model),
            optim,
            data,
            ad,
            first_step: state.step,
            state,
            metrics,
            ranks,
            started: Instant::now(),
            last_loss: f64::NAN,
            last_checkpoint,
        })
    }

    /// Optimizer steps completed so far (a resumed run counts its earlier ones).
    pub fn steps_done(&self) -> usize {
        self.state.step
    }

    /// Whether `training.steps` are done.
    pub fn is_done(&self) -> bool {
        self.state.step >= self.cfg.training.steps
    }

    /// The model as trained so far.
    pub fn model(&self) -> &Transformer {
        self.model.as_ref().expect("the model is back after every step")
    }

    /// The run's architecture and family.
    pub fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    /// One optimizer step over `training.grad_accum` micro-batches; its line is appended to
    /// `metrics.jsonl`. A non-finite loss stops the run without applying the step.
    pub fn step(&mut self) -> Result<StepMetrics> {
        let t = &self.cfg.training;
        let step = self.state.step;
        self.ad.seed(step_seed(t.seed, step, self.ranks.rank()));
        let lr = learning_rate(t, step);
        let model = self.model.take().expect("the model is back after every step");
        let rows = self.ranks.rows(t.batch_size);
        let (mut grads, loss_sum) = accumulate(&model, &self.data, &mut self.state.rng, t, &self.ad, rows);
        // One process: the loss and the gradients' squared norm come back in one read, made
        // once every backward is enqueued (over ranks the norm waits for the summed gradients).
        let norm_sq = if self.ranks.size() == 1 { squared_norm(&model, &grads) } else { None };
        let read: Vec<f32> = read_together(std::iter::once(loss_sum).chain(norm_sq).collect()).into_iter().map(|v| v[0]).collect();
        let mut loss = read[0] as f64;
        let reduce_started = Instant::now();
        let reduced = self.all_reduce(&model, &mut grads, &mut loss, step);
        let reduce_s = reduce_started.elapsed().as_secs_f64();
        if let Err(e) = reduced {
            self.model = Some(model);
            return Err(e);
        }
        if !loss.is_finite() {
            self.model = Some(model);
            return Err(TrainError::NonFinite { step, loss, checkpoint: self.last_checkpoint.as_ref().map(|(_, dir)| dir.clone()) });
        }
        let grad_norm = match read.get(1) {
            Some(&squared) => {
                let norm = norm_of(squared);
                clip_to_norm(&model, &mut grads, norm, t.grad_clip);
                norm
            }
            None => clip_global_norm(&model, &mut grads, t.grad_clip),
        };
        self.model = Some(self.optim.step(lr, model, grads));
        let tokens_per_step = (t.batch_size * t.block_size * t.grad_accum) as u64;
        self.state.tokens_seen += tokens_per_step;
        self.state.step += 1;
        self.last_loss = loss;
        let elapsed_s = self.started.elapsed().as_secs_f64();
        let tokens_per_s = (self.state.step - self.first_step) as f64 * tokens_per_step as f64 / elapsed_s.max(1e-9);
        let m = StepMetrics { step: self.state.step, total: t.steps, loss, lr, grad_norm, tokens_per_s, elapsed_s };
        let mut line = m.to_json();
        if self.ranks.size() > 1 {
            // The all-reduce's time, waiting for the slowest rank included.
            line["allreduce_s"] = json!(reduce_s);
        }
        self.record(line)?;
        Ok(m)
    }

    /// Sum the step's gradients and loss over the ranks (nothing with one).
    fn all_reduce(&self, model: &Transformer, grads: &mut GradientsParams, loss: &mut f64, step: usize) -> Result<()> {
        if self.ranks.size() == 1 {
            return Ok(());
        }
        all_reduce_grads(&self.ranks, model, grads, step).map_err(|e| self.rank_error(e))?;
        let mut l = [*loss];
        self.ranks.sum_f64(&mut l, &format!("the loss all-reduce of step {}", step + 1)).map_err(|e| self.rank_error(e))?;
        *loss = l[0];
        Ok(())
    }

    /// Whether any rank asks to stop before the next step (`stop` is this rank's answer).
    pub fn stop_agreed(&self, stop: bool) -> Result<bool> {
        self.ranks.any(stop, &format!("agreeing whether to stop after step {}", self.state.step)).map_err(|e| self.rank_error(e))
    }

    /// A failure between ranks, with the last checkpoint to resume from.
    fn rank_error(&self, error: burnlens_dist::DistError) -> TrainError {
        TrainError::Rank { error, checkpoint: self.last_checkpoint.as_ref().map(|(_, d)| d.clone()) }
    }

    /// A line of `metrics.jsonl` (on the writing rank).
    fn record(&mut self, line: serde_json::Value) -> Result<()> {
        match &mut self.metrics {
            Some(m) => m.record(line),
            None => Ok(()),
        }
    }

    /// The processes this run trains on.
    pub fn ranks(&self) -> &Ranks {
        &self.ranks
    }

    /// Whether the step just done is one `training.eval_interval` asks to evaluate after
    /// (the last step always is).
    pub fn evaluation_due(&self) -> bool {
        let (done, t) = (self.state.step, &self.cfg.training);
        done % t.eval_interval.max(1) == 0 || done == t.steps
    }

    /// Whether the step just done is one `training.checkpoint_interval` (default the
    /// evaluation interval) asks to checkpoint after (the last step always is).
    pub fn checkpoint_due(&self) -> bool {
        let (done, t) = (self.state.step, &self.cfg.training);
        done % t.checkpoint_interval.unwrap_or(t.eval_interval).max(1) == 0 || done == t.steps
    }

    /// The mean validation loss now over `training.eval_batches` batches (the same batches
    /// at every evaluation), recorded in `metrics.jsonl`.
    pub fn evaluate(&mut self) -> Result<f64> {
        let t = &self.cfg.training;
        let rows = self.ranks.rows(t.batch_size);
        let batches = ValBatches { seed: t.seed, n: t.eval_batches, batch: t.batch_size, block: t.block_size };
        let mut sum = [evaluate_rows(&self.model().valid(), &self.data, &batches, rows)];
        self.ranks.sum_f64(&mut sum, &format!("the validation loss after step {}", self.state.step)).map_err(|e| self.rank_error(e))?;
        let val = sum[0] / t.eval_batches as f64;
        self.state.last_val_loss = Some(val);
        self.record(json!({"kind": "eval", "step": self.state.step, "val_loss": val, "train_loss": self.last_loss}))?;
        Ok(val)
    }

    /// A complete checkpoint of the steps done so far (written by rank 0, once every rank's
    /// parameters are seen to equal rank 0's); the loss plot is redrawn.
    pub fn checkpoint(&mut self) -> Result<PathBuf> {
        let step = self.state.step;
        if self.ranks.size() > 1 {
            let digest = params_digest(self.model());
            let what = format!("the parameters after step {step}");
            self.ranks.check_equal(&digest, &what).map_err(|e| self.rank_error(e))?;
            let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
            self.record(json!({"kind": "ranks", "step": step, "ranks": self.ranks.size(), "params_sha256": hex}))?;
        }
        let dir = match &self.metrics {
            Some(metrics) => {
                let dir = save_checkpoint(&self.cfg.output.dir, self.model(), &self.optim, &self.state)?;
                metrics.plot().ok();
                dir
            }
            None => checkpoint_dir(&self.cfg.output.dir, step),
        };
        self.last_checkpoint = Some((step, dir.clone()));
        Ok(dir)
    }

    /// Checkpoint (unless this step already is) and say where: the error an interrupted run
    /// ends with.
    pub fn interrupt(&mut self) -> Result<TrainError> {
        let step = self.state.step;
        let checkpoint = match &self.last_checkpoint {
            Some((s, dir)) if *s == step => dir.clone(),
            _ => self.checkpoint()?,
        };
        Ok(TrainError::Interrupted { step, checkpoint })
    }

    /// The loss plot, and with `output.export` the model as a Hugging Face directory `hf/`
    /// (a note to `observer`, not an error, when the architecture has no HF form).
    pub fn finish(self, observer: &mut dyn Observer) -> Result<RunSummary> {
        let run_dir = self.cfg.output.dir.clone();
        if let Some(metrics) = &self.metrics {
            metrics.plot()?;
        }
        let seconds = self.started.elapsed().as_secs_f64();
        let t = &self.cfg.training;
        let steps_run = self.state.step.saturating_sub(self.first_step);
        let tokens = steps_run as f64 * (t.batch_size * t.block_size * t.grad_accum) as f64;
        let exported = export_trained(&self, observer)?;
        Ok(RunSummary {
            run_dir,
            steps: t.steps,
            final_train_loss: self.last_loss,
            final_val_loss: self.state.last_val_loss,
            tokens_per_s: tokens / seconds.max(1e-9),
            seconds,
            exported,
        })
    }
}

/// The generator's seed for `step` on `rank`: dropout masks depend only on the run's seed,
/// the step and the rank, so a resumed run draws the same.
fn step_seed(seed: u64, step: usize, rank: usize) -> u64 {
    seed.wrapping_mul(1_000_003).wrapping_add(step as u64).wrapping_add((rank as u64) << 32)
}

/// The model, optimizer and loop state of the run directory's latest checkpoint.
fn resumed(cfg: &RunConfig, ad: &Device) -> Result<(ModelSpec, Transformer, ModuleOptimizer, TrainState)> {
    let run = load_run(&cfg.output.dir, ad)?;
    let optim_path = run.checkpoint.join("optim.bpk");
    let optim = optimizer(&cfg.training).load(&optim_path).map_err(|e| TrainError::Checkpoint { path: optim_path, msg: e.to_string() })?;
    Ok((run.spec, run.model, optim, run.state))
}

/// A new run: fine-tuned from an HF model (`model.from`) or fresh from the run config.
fn fresh(cfg: &RunConfig, data: &Dataset, ad: &Device, observer: &mut dyn Observer) -> Result<(ModelSpec, Transformer, ModuleOptimizer, TrainState)> {
    let t = &cfg.training;
    let (spec, model) = match &cfg.model.from {
        Some(from) => {
            // A directory, or a Hub id fetched into the Hugging Face cache.
            let dir = burnlens_hf::resolve_model(&from.to_string_lossy(), &mut |p| observer.download(p))?;
            // Training keeps f32 master weights: a half checkpoint fine-tunes from an f32 copy.
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

/// Check that the data fits the model.
fn check_fits(cfg: &RunConfig, spec: &ModelSpec, data: &Dataset) -> Result<()> {
    let t = &cfg.training;
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
    Ok(())
}

/// Lay out a new run directory (a resumed one already has all of it; settings given at
/// resume, more steps say, become the run's).
fn prepare_run_dir(cfg: &RunConfig, resume: bool, spec: &ModelSpec, data: &Dataset) -> Result<()> {
    let run_dir = &cfg.output.dir;
    std::fs::create_dir_all(run_dir.join("checkpoints")).map_err(|e| TrainError::io(run_dir, e))?;
    write_atomic(&run_dir.join("config.toml"), cfg.to_toml().as_bytes())?;
    if !resume {
        write_atomic(&run_dir.join("model.json"), serde_json::to_string_pretty(spec).expect("json").as_bytes())?;
        write_atomic(&run_dir.join("data.json"), serde_json::to_string_pretty(data.summary()).expect("json").as_bytes())?;
        if let Some(tok) = &data.tokenizer {
            tok.save(run_dir)?;
        }
    }
    Ok(())
}

/// `grad_accum` micro-batches' gradients, summed, and their mean loss (`[1]`, on the device,
/// not read), over this rank's `rows` of each batch, weighted by their share of it (all
/// rows: weight one).
fn accumulate(model: &Transformer, data: &Dataset, rng: &mut Rng, t: &TrainingSection, ad: &Device, rows: Range<usize>) -> (GradientsParams, Tensor<1>) {
    let mut accum = GradientsAccumulator::<Transformer>::new();
    let mut loss_sum: Option<Tensor<1>> = None;
    let share = rows.len() as f64 / t.batch_size as f64;
    for _ in 0..t.grad_accum {
        let seqs = data.batch(Split::Train, rng, t.batch_size, t.block_size);
        let (x, y) = inputs_targets(take_rows(seqs, &rows, t.block_size), rows.len(), t.block_size, ad);
        let loss = cross_entropy(model.forward(x), y) * share / t.grad_accum as f64;
        let value = loss.clone().inner().reshape([1]);
        loss_sum = Some(match loss_sum {
            Some(sum) => sum + value,
            None => value,
        });
        let grads = GradientsParams::from_grads(loss.backward(), model);
        accum.accumulate(model, grads);
    }
    (accum.grads(), loss_sum.expect("at least one micro-batch"))
}

/// With `output.export`, the trained model as an HF directory `hf/`.
fn export_trained(s: &TrainSession, observer: &mut dyn Observer) -> Result<Option<PathBuf>> {
    if !s.cfg.output.export || !s.ranks.is_writer() {
        return Ok(None);
    }
    let family = s.spec.family;
    match burnlens_hf::check_exportable(&s.spec.config, family) {
        Ok(()) => {
            let out = s.cfg.output.dir.join("hf");
            export_hf(&s.model().valid(), family, &out, &ExportOptions { tokenizer: s.data.tokenizer.as_ref(), dtype: WeightDtype::F32 })?;
            Ok(Some(out))
        }
        Err(e) => {
            observer.note(&format!("no Hugging Face export: {e}"));
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
    evaluate_rows(model, data, &ValBatches { seed, n, batch, block }, 0..batch) / n as f64
}

/// The validation batches an evaluation draws: `n` of `batch` rows of `block` tokens.
#[derive(Clone, Copy)]
struct ValBatches {
    seed: u64,
    n: usize,
    batch: usize,
    block: usize,
}

/// The validation batches' losses over `rows` of each, weighted by their share, summed.
fn evaluate_rows(model: &Transformer, data: &Dataset, b: &ValBatches, rows: Range<usize>) -> f64 {
    let ValBatches { seed, n, batch, block } = *b;
    let mut rng = Rng::new(seed ^ 0x005E_ED0F_E7A1);
    let device = model.device();
    let share = rows.len() as f64 / batch as f64;
    let mut total = 0.0;
    for _ in 0..n {
        let seqs = take_rows(data.batch(Split::Val, &mut rng, batch, block), &rows, block);
        let (x, y) = inputs_targets(seqs, rows.len(), block, &device);
        total += (cross_entropy(model.forward(x), y) * share).into_scalar::<f32>() as f64;
    }
    total
}

/// Rows `rows` of a batch of `block + 1`-token rows.
fn take_rows(mut seqs: Vec<i64>, rows: &Range<usize>, block: usize) -> Vec<i64> {
    let width = block + 1;
    seqs.truncate(rows.end * width);
    seqs.drain(..rows.start * width);
    seqs
}
