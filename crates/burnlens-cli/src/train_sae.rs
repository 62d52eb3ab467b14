//! `burnlens train-sae`: train SAEs on a model's activations at one or more hook points (or a
//! transcoder per layer), streamed from a corpus (or synthetic windows) through the
//! activation store, in a resumable run directory; SAEs are written in SAELens's layout under
//! `OUT/sae`, transcoders in circuit-tracer's under `OUT/transcoders`.

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::Result;
use burnlens_data::CorpusOptions;
use burnlens_dist::{DistError, Ranks};
use burnlens_features::{CacheIndex, Progress, Run, RunError, RunOptions, SaeRunConfig, Source, StepReport};

use crate::{Common, ModelArgs, UserError};

/// `burnlens train-sae` options: the model, the run's options (`features::RunOptions`), the
/// corpus (`data::CorpusOptions`) and the run directory.
#[derive(clap::Args)]
pub struct TrainSaeArgs {
    /// Model directory, Hub id or burnlens run directory (not needed with --from-cache).
    #[arg(long, required_unless_present = "from_cache")]
    pub model: Option<PathBuf>,
    /// Fold norms and centre weights first (as TransformerLens's `from_pretrained`).
    #[arg(long)]
    pub process_weights: bool,
    /// Train from an activation cache (`cache-activations`) instead of model passes: its
    /// windows per pass and tokens per window are the run's.
    #[arg(long, conflicts_with = "model")]
    pub from_cache: Option<PathBuf>,
    /// Take the run's and the corpus's options from a TOML file instead of the flags: a
    /// `[run]` table with the flags' names (`hook`, `architecture`, `k`, `steps`, ...) and a
    /// `[corpus]` table (`data`, `column`, `seq_len`, `prepend_bos`); unnamed keys keep their
    /// defaults, unknown keys are refused.
    #[arg(long)]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub run: RunOptions,
    #[command(flatten)]
    pub corpus: CorpusOptions,
    /// How each step's pass runs: `host` (the hand-written passes over host memory, the CPU
    /// backend's default) or `tensors` (Burn's autodiff on the model's device, a GPU's
    /// default); by the device when not given. Both give the same steps.
    #[arg(long = "pass", value_enum)]
    pub pass: Option<burnlens_features::PassPath>,
    /// Run directory: config.json, checkpoints/, metrics.jsonl, and sae/ (SAELens's
    /// layout) or transcoders/ (circuit-tracer's). Running again with the same options resumes.
    #[arg(long)]
    pub out: PathBuf,
    #[command(flatten)]
    pub common: Common,
}

/// `--config`'s file.
#[derive(serde::Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
struct ConfigFile {
    run: RunOptions,
    corpus: CorpusOptions,
}

pub fn run(a: &TrainSaeArgs) -> Result<()> {
    let Some(path) = &a.config else { return run_with(a, &a.run, &a.corpus) };
    let text = std::fs::read_to_string(path).map_err(|e| UserError(format!("{}: {e}", path.display())))?;
    let file: ConfigFile = toml::from_str(&text).map_err(|e| UserError(format!("{}: {}", path.display(), e.message())))?;
    run_with(a, &file.run, &file.corpus)
}

fn run_with(a: &TrainSaeArgs, options: &RunOptions, corpus: &CorpusOptions) -> Result<()> {
    if let Some(dir) = &a.from_cache {
        let index = CacheIndex::read(dir)?;
        let mut run = options.clone();
        run.store_batch = Some(index.windows_per_chunk);
        // The widest hook's width stands in for d_model; layers are the cache's.
        let width = index.widths.iter().copied().max().unwrap_or(0);
        let layers = index.hooks.iter().filter_map(|h| burnlens_model::HookPoint::parse(h).and_then(|p| p.layer())).max().map_or(0, |l| l + 1);
        let cfg = run.config(width, layers, index.context_size)?;
        let source = Source::Cache { dir: dir.clone(), device: crate::commands::device_of(&a.common)? };
        return train(a, options, &cfg, source);
    }
    let model_args = ModelArgs { model: a.model.clone().expect("clap requires --model without --from-cache"), process_weights: a.process_weights };
    let m = crate::commands::load_model_args(&model_args, &a.common)?;
    let cfg = options.config(m.model.config.d_model, m.model.config.n_layers(), corpus.seq_len)?;
    let windows = corpus.windows(m.corpus_model(), options.seed, &burnlens_hf::Hub::from_env())?;
    let model_name = Some(m.dir.display().to_string());
    train(a, options, &cfg, Source::Model { model: &m.model, windows, model_name })
}

fn train(a: &TrainSaeArgs, options: &RunOptions, cfg: &SaeRunConfig, source: Source) -> Result<()> {
    // Ctrl-C / SIGTERM: checkpoint, stop, exit 130; the same command resumes.
    burnlens_model::stop::install_interrupt_handler();
    // One of several ranks when an MPI launcher started this process.
    let ranks = Ranks::from_launcher()?;
    let device = match &source {
        Source::Model { model, .. } => model.device(),
        Source::Cache { device, .. } => device.clone(),
    };
    let path = burnlens_features::PassPath::of_step(a.pass, &device);
    let tty = std::io::stderr().is_terminal() && ranks.is_writer();
    let mut on_step = |r: &[StepReport], p: &Progress| {
        if tty && (p.step.is_multiple_of(10) || p.step == p.steps) {
            eprint!("\rstep {}/{}  loss {:.4}  L0 {:.1}  {:.0} tokens/s  {:.0} s left   ", p.step, p.steps, r[0].loss, r[0].l0, p.tokens_per_s, p.seconds_left);
        }
        if burnlens_model::stop::stop_requested() { std::ops::ControlFlow::Break(()) } else { std::ops::ControlFlow::Continue(()) }
    };
    let s = match burnlens_features::train(Run { dir: &a.out, cfg, ranks: ranks.clone(), path: a.pass }, source, &mut on_step) {
        Ok(s) => s,
        Err(RunError::Ranks(e @ (DistError::Unanswered { .. } | DistError::Diverged { .. }))) => crate::commands::end_job(&ranks, &e),
        Err(e) => return Err(e.into()),
    };
    if tty {
        eprintln!();
    }
    if !ranks.is_writer() {
        return Ok(());
    }
    if s.stopped {
        return Err(burnlens_train::TrainError::Interrupted { step: s.steps, checkpoint: s.checkpoint }.into());
    }
    if let Some(from) = s.resumed_from {
        println!("resumed at step {from} from {}", burnlens_model::checkpoints::Checkpoints::of_run(&a.out).dir(from as u64).display());
    }
    if s.data_ran_out {
        println!("the dataset ran out after {} steps of {}; what was trained so far is saved", s.steps, cfg.steps);
    }
    for ((r, name), dead) in s.last.iter().zip(cfg.trainer_names()).zip(&s.dead_features) {
        let terms: Vec<String> = r.losses.iter().map(|(t, v)| format!("{} {v:.4}", t.name())).collect();
        println!("{name}: step {}, loss {:.4} ({}), L0 {:.2}, dead features {dead}", r.step + 1, r.loss, terms.join(", "), r.l0);
    }
    let (n, what) = match (options.transcoders, cfg.cross_layer) {
        (_, true) => (1, format!("cross-layer transcoder over {} layers", cfg.sites.len())),
        (true, false) => (cfg.sites.len(), "transcoders".to_string()),
        (false, false) => (cfg.sites.len(), "SAEs".to_string()),
    };
    println!("trained {n} {} {what} ({} features per layer or SAE) over {} activations", cfg.architecture.name(), cfg.d_sae, s.tokens);
    println!("each step ran as {} ({device:?})", path.describe());
    let outs: Vec<String> = s.outputs.iter().map(|p| p.display().to_string()).collect();
    println!(
        "wrote {} ({}), metrics.jsonl and checkpoints/ in {}",
        outs.join(", "),
        if options.transcoders { "circuit-tracer's layout" } else { "SAELens's layout" },
        a.out.display()
    );
    Ok(())
}
