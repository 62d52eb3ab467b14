//! `burnlens`: the command-line face of the burnlens libraries. It parses arguments, picks a
//! device and calls the libraries; anything a library user could want lives there, not here.

mod analyze;
mod attribute;
mod bench;
mod cache;
mod cache_activations;
mod commands;
mod dashboards;
mod eval_sae;
mod export;
mod graph;
mod induction;
mod info;
mod lens;
mod logits;
mod output;
mod patch;
mod progress;
mod qk;
mod sae;
mod sample;
mod tokenize;
mod train;
mod train_sae;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use burnlens_hf::HfError;
use burnlens_model::ModelError;
use burnlens_model::backend::BackendError;
use burnlens_train::TrainError;

/// GPT-2, GPT-Neo, GPT-NeoX (Pythia), GPT-J, the Llama family, Qwen3, OLMo 2, Phi-3 and
/// Gemma 2/3 on Burn: load Hugging Face checkpoints (a directory or a Hub id), run them,
/// train them, look inside, trace circuits.
#[derive(Parser)]
#[command(name = "burnlens", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Options every command that runs a model shares.
#[derive(clap::Args, Clone)]
pub struct Common {
    /// Backend: flex (default), ndarray, wgpu, tch, cuda. Overrides BURNLENS_BACKEND.
    #[arg(long, global = true)]
    pub backend: Option<String>,
    /// Device index for GPU backends.
    #[arg(long, global = true)]
    pub device_index: Option<usize>,
    /// The dtype a loaded model's weight matrices are kept in: auto (as the checkpoint
    /// stores them), f32, bf16 or f16. Activations are f32 either way (see --compute).
    #[arg(long, global = true, default_value = "auto")]
    pub dtype: burnlens_hf::WeightDtype,
    /// The arithmetic of the products: f32 (default, exact, on a GPU too), bf16 (operands
    /// rounded to bf16, sums in f32; fast on CPUs with AVX512_BF16) or tf32 (a GPU's tensor
    /// cores, TF32 where it has them; f32 on the CPU). Residual stream, norms, attention's
    /// softmax, losses and every output stay f32. Overrides BURNLENS_COMPUTE.
    #[arg(long, global = true)]
    pub compute: Option<burnlens_model::kernels::Compute>,
}

/// The sequence a command runs on: text through the model's tokenizer, or token ids.
#[derive(clap::Args, Clone)]
pub struct Input {
    /// Text, encoded with the model's tokenizer (tokenizer.json, or char_vocab.json of a run).
    #[arg(long, conflicts_with = "ids")]
    pub text: Option<String>,
    /// Comma-separated token ids, e.g. 464,3616,286.
    #[arg(long)]
    pub ids: Option<String>,
}

/// Model options shared by the commands that look inside.
#[derive(clap::Args, Clone)]
pub struct ModelArgs {
    /// Model directory (config.json plus weights), Hugging Face Hub id (`gpt2`,
    /// `EleutherAI/pythia-70m`, `org/name@revision`) or burnlens run directory.
    #[arg(long)]
    pub model: std::path::PathBuf,
    /// Fold norms, centre writing weights and the unembedding, fold value biases first (as
    /// TransformerLens's `from_pretrained` does); the logits do not change.
    #[arg(long)]
    pub process_weights: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Describe a Hugging Face model directory: family, sizes, attention spans, dtype.
    Info(Box<info::InfoArgs>),
    /// Run the model on one sequence of token ids and report or save the logits and loss.
    Logits(Box<logits::LogitsArgs>),
    /// Train a model as a TOML run config says (see configs/); on N ranks under `mpiexec -n N`.
    Train(Box<train::TrainArgs>),
    /// Write the latest checkpoint of a run as a Hugging Face model directory.
    Export(export::ExportArgs),
    /// Generate text (or token ids) from a model directory or a run directory.
    Sample(Box<sample::SampleArgs>),
    /// Write an interpretability report: per-token log-probabilities, attention viewer, head
    /// detectors, OV copying and composition scores (index.html and report.json).
    Analyze(Box<analyze::AnalyzeArgs>),
    /// Show how the model's tokenizer splits a text: ids and string tokens.
    Tokenize(Box<tokenize::TokenizeArgs>),
    /// Activation patching of heads, residual positions and MLPs from a corrupted run into
    /// the clean one, beside attribution patching (its gradient estimate), with their
    /// correlation (report.json and index.html).
    Patch(Box<patch::PatchArgs>),
    /// Direct logit attribution: what every head, MLP and embedding writes along a logit (or
    /// logit difference), summing to the model's logits (report.json and index.html).
    Attribute(Box<attribute::AttributeArgs>),
    /// An attribution graph (circuit-tracer's method): transcoders stand in for the MLPs,
    /// attention patterns and norm scales are frozen, and every direct effect between
    /// features, errors, tokens and the top logits is measured. Writes graph.safetensors,
    /// graph.json (the schema Neuronpedia's viewer loads) and graph.html. Token ids are
    /// attributed as given; text gets the model's BOS first.
    Graph(Box<graph::GraphArgs>),
    /// QK attributions of one head: each score it attends with as a sum of terms over pairs
    /// of parts of the query's and key's residual streams (transcoder features, errors,
    /// tokens, earlier heads' outputs), norm scales frozen as in attribution graphs; prints
    /// the top terms and writes every (query, key) row as JSON.
    Qk(Box<qk::QkArgs>),
    /// The logit lens: every layer's residual stream read through the final norm and the
    /// unembedding (report.json and index.html).
    Lens(Box<lens::LensArgs>),
    /// Train an SAE (standard, topk, batchtopk or jumprelu, as SAELens trains them) on a
    /// model's activations at one hook point, streamed from a dataset through a mixing buffer;
    /// resumable; the SAE is saved in SAELens's layout.
    TrainSae(Box<train_sae::TrainSaeArgs>),
    /// SAELens's evaluation metrics of an SAE (CE loss and KL scores with the SAE spliced in,
    /// explained variance, L0, shrinkage, feature density) over windows of a corpus.
    EvalSae(Box<eval_sae::EvalSaeArgs>),
    /// Feature dashboards as SAEDashboard makes them (top and quantile groups of examples,
    /// activation and logit histograms, logit tables) for an SAE's features over a corpus,
    /// streamed; written as an offline HTML browser, Neuronpedia JSON and circuit-tracer's
    /// feature files.
    Dashboards(Box<dashboards::DashboardsArgs>),
    /// Keep a model's activations at hook points over a corpus on disk, for training SAEs
    /// without the model (`train-sae --from-cache`).
    CacheActivations(Box<cache_activations::CacheActivationsArgs>),
    /// Run a sparse autoencoder saved in SAELens's layout on its hook point: reconstruction,
    /// L0, explained variance, top features per token, loss with the SAE spliced in.
    Sae(Box<sae::SaeArgs>),
    /// The repeated-random-tokens induction experiment: [BOS] + r + r.
    Induction(Box<induction::InductionArgs>),
    /// List the backends this binary was built with and whether each works here.
    Backends,
    /// Download a model from the Hugging Face Hub into the HF cache without running it.
    Download {
        /// Hub id: `gpt2`, `EleutherAI/pythia-70m`, `org/name@revision`.
        id: String,
    },
    /// Time one benchmark workload (JSON on stdout); `cargo xtask bench` runs them all
    /// against the PyTorch peers.
    Bench {
        #[command(flatten)]
        args: bench::BenchArgs,
        #[command(flatten)]
        common: Common,
    },
    /// Datasets: `burnlens data fetch tinyshakespeare`.
    Data {
        #[command(subcommand)]
        action: DataAction,
    },
    /// Save activations by TransformerLens hook name.
    Cache(Box<cache::CacheArgs>),
}

#[derive(Subcommand)]
enum DataAction {
    /// Download a known corpus and check its sha256.
    Fetch {
        /// Dataset name: tinyshakespeare.
        name: String,
        /// Where to write it (default: data/<name>.txt).
        #[arg(long)]
        out: Option<std::path::PathBuf>,
    },
}

/// A problem with what the user asked for (exit code 2), as opposed to a failure of ours.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UserError(pub String);

/// Run the command line in `std::env::args()`; the exit code is 0 on success, 2 for bad
/// input, 1 for an internal failure.
pub fn run() -> ExitCode {
    // Before anything large is allocated: blocks mapped under glibc's old threshold keep
    // being mapped afresh (82,000 page faults per GPT-2 training step against 28,000).
    burnlens_model::kernels::memory::keep_freed_memory();
    // One line, no backtrace, for anything that escapes as a panic: that is our bug.
    std::panic::set_hook(Box::new(|info| {
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        let at = info.location().map(|l| format!(" at {}:{}", l.file(), l.line())).unwrap_or_default();
        eprintln!("burnlens: internal error: {}{at}", one_line(&msg));
    }));
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => e.exit(),
        Err(e) => {
            // Clap's error in one line (its `[possible values: ...]` kept, its tip dropped), exit 2.
            let text = e.render().to_string();
            let parts: Vec<&str> = text
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with("For more information"))
                .map(|l| l.trim_start_matches("error: "))
                .collect();
            let _ = std::io::Write::write_all(&mut std::io::stderr(), format!("error: {}\n", parts.join(" ")).as_bytes());
            return ExitCode::from(2);
        }
    };
    if let Some(refused) = refuse_ranks(&cli.command) {
        let _ = std::io::Write::write_all(&mut std::io::stderr(), format!("error: {refused}\n").as_bytes());
        return ExitCode::from(2);
    }
    let result = std::panic::catch_unwind(|| match cli.command {
        Command::Info(a) => info::run(&a),
        Command::Logits(a) => logits::run(&a),
        Command::Cache(a) => cache::run(&a),
        Command::Tokenize(a) => tokenize::run(&a),
        Command::Patch(a) => patch::run(&a),
        Command::Attribute(a) => attribute::run(&a),
        Command::Graph(a) => graph::run(&a),
        Command::Qk(a) => qk::run(&a),
        Command::Lens(a) => lens::run(&a),
        Command::TrainSae(a) => train_sae::run(&a),
        Command::EvalSae(a) => eval_sae::run(&a),
        Command::Dashboards(a) => dashboards::run(&a),
        Command::CacheActivations(a) => cache_activations::run(&a),
        Command::Sae(a) => sae::run(&a),
        Command::Download { id } => commands::download(&id),
        Command::Train(a) => train::run(&a),
        Command::Export(a) => export::run(&a),
        Command::Sample(a) => sample::run(&a),
        Command::Data { action: DataAction::Fetch { name, out } } => commands::fetch(&name, out.as_deref()),
        Command::Backends => commands::backends(),
        Command::Bench { args, common } => commands::device_of(&common).and_then(|d| bench::run(&args, d, &burnlens_hf::LoadOptions::dtype(common.dtype))),
        Command::Analyze(a) => analyze::run(&a),
        Command::Induction(a) => induction::run(&a),
    });
    match result {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(err)) => {
            // One write, so that lines of several ranks (or processes) arrive whole.
            let _ = std::io::Write::write_all(&mut std::io::stderr(), format!("error: {}\n", one_line(&format!("{err:#}"))).as_bytes());
            ExitCode::from(exit_code(&err))
        }
        Err(_) => ExitCode::from(1),
    }
}

/// Under an MPI launcher with several ranks, a command that cannot share its work refuses
/// (every rank would run it in full, racing on one output); `train`, `dashboards` and
/// `cache-activations` share theirs.
fn refuse_ranks(command: &Command) -> Option<String> {
    let launch = burnlens_dist::launched().filter(|l| l.size > 1)?;
    if matches!(command, Command::Train(_) | Command::TrainSae(_) | Command::EvalSae(_) | Command::Dashboards(_) | Command::CacheActivations(_)) {
        return None;
    }
    let name = std::env::args().skip(1).find(|a| !a.starts_with('-')).unwrap_or_default();
    Some(format!(
        "rank {} of {}: `{name}` does not share its work between MPI ranks (each would run all of it into the same output); run it as one process, without mpiexec (train, train-sae, eval-sae, dashboards and cache-activations run over ranks)",
        launch.rank, launch.size
    ))
}

/// 130 after Ctrl-C (checkpoint written), 2 for bad input, 1 for everything else.
fn exit_code(err: &anyhow::Error) -> u8 {
    for c in err.chain() {
        if let Some(burnlens_dashboards::DashboardError::Interrupted(_)) = c.downcast_ref() {
            return 130;
        }
        if let Some(t) = c.downcast_ref::<TrainError>() {
            return match t {
                TrainError::Interrupted { .. } => 130,
                t if t.is_user_error() => 2,
                _ => 1,
            };
        }
        if let Some(d) = c.downcast_ref::<burnlens_dist::DistError>() {
            return if matches!(d, burnlens_dist::DistError::NoMpi { .. } | burnlens_dist::DistError::Peer { .. } | burnlens_dist::DistError::Setting(_)) {
                2
            } else {
                1
            };
        }
        if c.is::<HfError>()
            || c.is::<ModelError>()
            || c.is::<BackendError>()
            || c.is::<UserError>()
            || c.is::<burnlens_lens::SaeError>()
            || c.is::<burnlens_lens::MetricError>()
            || c.is::<burnlens_trace::TraceError>()
            || c.is::<burnlens_data::DataError>()
            || c.is::<burnlens_features::RunError>()
            || c.is::<burnlens_features::StoreError>()
            || c.is::<burnlens_features::EvalError>()
            || c.downcast_ref::<burnlens_dashboards::DashboardError>().is_some_and(|e| e.is_user_error())
        {
            return 2;
        }
    }
    1
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}
