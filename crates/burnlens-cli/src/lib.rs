//! `burnlens`: the command-line face of the burnlens libraries. It parses arguments, picks a
//! device and calls the libraries; anything a library user could want lives there, not here.

mod bench;
mod cache_activations;
mod commands;
mod dashboards;
mod eval_sae;
mod export;
mod output;
mod progress;
mod sample;
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
    /// stores them), f32, bf16 or f16. Compute and activations are f32 either way.
    #[arg(long, global = true, default_value = "auto")]
    pub dtype: burnlens_hf::WeightDtype,
    /// The arithmetic of the linear layers' products: f32 (default, exact) or bf16 (operands
    /// rounded to bf16, sums in f32; fast on CPUs with AVX512_BF16). Residual stream, norms,
    /// attention, losses and every output stay f32. Overrides BURNLENS_COMPUTE.
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

/// What an attribution graph explains and how it is built and pruned (circuit-tracer's
/// arguments and defaults).
#[derive(clap::Args, Clone)]
pub struct GraphArgs {
    /// Transcoders: a folder with circuit-tracer's config.yaml and layer files, or a Hub
    /// repository org/name[@revision][:folder].
    #[arg(long)]
    pub transcoders: String,
    /// Explain the most probable next tokens, at most this many...
    #[arg(long, default_value_t = 10)]
    pub max_n_logits: usize,
    /// ...until their probabilities sum to this.
    #[arg(long, default_value_t = 0.95)]
    pub desired_logit_prob: f32,
    /// Explain these next tokens instead (comma-separated ids or one-token texts).
    #[arg(long)]
    pub targets: Option<String>,
    /// Target nodes per backward pass.
    #[arg(long, default_value_t = 512)]
    pub batch_size: usize,
    /// Compute rows for at most this many features, the most influential first (all by default).
    #[arg(long)]
    pub max_feature_nodes: Option<usize>,
    /// Keep the nodes holding this share of the influence on the logits.
    #[arg(long, default_value_t = 0.8)]
    pub node_threshold: f32,
    /// Keep the edges holding this share of it.
    #[arg(long, default_value_t = 0.98)]
    pub edge_threshold: f32,
    /// Keep every layer's attention pattern while they fit in this many GB; past it they are
    /// recomputed for each backward pass (less memory, more time).
    #[arg(long, default_value_t = 4.0)]
    pub pattern_memory_gb: f64,
    /// Keep the adjacency rows in memory while they fit in this many GB; past it they live in
    /// a mapped temporary file under TMPDIR (bounded by the disk, not by RAM).
    #[arg(long, default_value_t = 8.0)]
    pub rows_memory_gb: f64,
    /// Feature dashboards of these transcoders (`burnlens dashboards --transcoders --out
    /// DIR`): each feature node carries its top examples and logit effects in graph.json and
    /// graph.html.
    #[arg(long)]
    pub features: Option<std::path::PathBuf>,
}

#[derive(Subcommand)]
enum Command {
    /// Describe a Hugging Face model directory: family, sizes, attention spans, dtype.
    Info {
        /// Model directory (config.json plus weights) or Hugging Face Hub id (`gpt2`,
        /// `EleutherAI/pythia-70m`, `org/name@revision`), downloaded into the HF cache.
        #[arg(long)]
        model: std::path::PathBuf,
        #[command(flatten)]
        common: Common,
    },
    /// Run the model on one sequence of token ids and report or save the logits and loss.
    Logits {
        #[command(flatten)]
        model: ModelArgs,
        #[command(flatten)]
        input: Input,
        /// Write `.json` ({"ids", "tokens", "logits", "loss"}) or `.safetensors` (the tensors).
        #[arg(long)]
        out: Option<std::path::PathBuf>,
        #[command(flatten)]
        common: Common,
    },
    /// Train a model as a TOML run config says (see configs/); on N ranks under `mpiexec -n N`.
    Train(Box<train::TrainArgs>),
    /// Write the latest checkpoint of a run as a Hugging Face model directory.
    Export(export::ExportArgs),
    /// Generate text (or token ids) from a model directory or a run directory.
    Sample(Box<sample::SampleArgs>),
    /// Write an interpretability report: per-token log-probabilities, attention viewer, head
    /// detectors, OV copying and composition scores (index.html and report.json).
    Analyze {
        #[command(flatten)]
        model: ModelArgs,
        #[command(flatten)]
        input: Input,
        #[arg(long)]
        out: std::path::PathBuf,
        #[command(flatten)]
        common: Common,
    },
    /// Show how the model's tokenizer splits a text: ids and string tokens.
    Tokenize {
        /// Model directory, Hub id or burnlens run directory (its tokenizer is used).
        #[arg(long)]
        model: std::path::PathBuf,
        #[arg(long)]
        text: String,
        /// Print JSON ({"ids", "tokens"}) instead of two lines.
        #[arg(long)]
        json: bool,
    },
    /// Activation patching of heads, residual positions and MLPs from a corrupted run into
    /// the clean one, beside attribution patching (its gradient estimate), with their
    /// correlation (report.json and index.html).
    Patch {
        #[command(flatten)]
        model: ModelArgs,
        #[command(flatten)]
        input: Input,
        /// The corrupted sequence as text (same number of tokens as the clean one).
        #[arg(long, conflicts_with = "corrupted_ids")]
        corrupted_text: Option<String>,
        /// The corrupted sequence as token ids.
        #[arg(long)]
        corrupted_ids: Option<String>,
        /// `loss[:FROM]` (mean next-token loss from position FROM), `logprob:TOKEN[@POS]` or
        /// `logit-diff:RIGHT,WRONG[@POS]`; tokens are ids or text of one token; POS defaults
        /// to the last position.
        #[arg(long, default_value = "loss")]
        metric: String,
        /// Node kinds, comma-separated: head, resid_pre, mlp.
        #[arg(long, default_value = "head,resid_pre,mlp")]
        nodes: String,
        /// Only attribution patching (one forward/backward), no per-node forward passes.
        #[arg(long)]
        no_exact: bool,
        /// Denoising: run the corrupted sequence and patch in the clean activations (the
        /// gradient is then taken on the corrupted run), instead of the default noising
        /// (clean run, corrupted activations patched in). The linear estimate is poor where
        /// the base run's metric is saturated, so the direction matters.
        #[arg(long)]
        denoise: bool,
        #[arg(long)]
        out: std::path::PathBuf,
        #[command(flatten)]
        common: Common,
    },
    /// Direct logit attribution: what every head, MLP and embedding writes along a logit (or
    /// logit difference), summing to the model's logits (report.json and index.html).
    Attribute {
        #[command(flatten)]
        model: ModelArgs,
        #[command(flatten)]
        input: Input,
        /// The token whose logit is explained (id or text of one token).
        #[arg(long)]
        target: String,
        /// Explain logit[target] − logit[wrong] instead.
        #[arg(long)]
        wrong: Option<String>,
        /// The position to show in detail (default: the last).
        #[arg(long)]
        pos: Option<usize>,
        #[arg(long)]
        out: std::path::PathBuf,
        #[command(flatten)]
        common: Common,
    },
    /// An attribution graph (circuit-tracer's method): transcoders stand in for the MLPs,
    /// attention patterns and norm scales are frozen, and every direct effect between
    /// features, errors, tokens and the top logits is measured. Writes graph.safetensors,
    /// graph.json (the schema Neuronpedia's viewer loads) and graph.html. Token ids are
    /// attributed as given; text gets the model's BOS first.
    Graph {
        #[command(flatten)]
        model: ModelArgs,
        #[command(flatten)]
        input: Input,
        #[command(flatten)]
        graph: GraphArgs,
        #[arg(long)]
        out: std::path::PathBuf,
        #[command(flatten)]
        common: Common,
    },
    /// The logit lens: every layer's residual stream read through the final norm and the
    /// unembedding (report.json and index.html).
    Lens {
        #[command(flatten)]
        model: ModelArgs,
        #[command(flatten)]
        input: Input,
        /// A token to follow through the layers (default: each position's next token).
        #[arg(long)]
        target: Option<String>,
        /// How many top tokens to keep per layer and position.
        #[arg(long, default_value_t = 5)]
        top: usize,
        #[arg(long)]
        out: std::path::PathBuf,
        #[command(flatten)]
        common: Common,
    },
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
    Sae {
        #[command(flatten)]
        model: ModelArgs,
        /// SAE directory (cfg.json and sae_weights.safetensors), or a folder of a Hub
        /// repository as `org/name[@revision][:folder]` (SAELens releases keep one SAE per
        /// folder, e.g. `jbloom/GPT2-Small-SAEs-Reformatted:blocks.8.hook_resid_pre`).
        #[arg(long)]
        sae: std::path::PathBuf,
        #[command(flatten)]
        input: Input,
        /// Features to list per position.
        #[arg(long, default_value_t = 5)]
        top: usize,
        #[arg(long)]
        out: std::path::PathBuf,
        #[command(flatten)]
        common: Common,
    },
    /// The repeated-random-tokens induction experiment: [BOS] + r + r.
    Induction {
        /// Model directory (config.json plus weights) or Hugging Face Hub id (`gpt2`,
        /// `EleutherAI/pythia-70m`, `org/name@revision`), downloaded into the HF cache.
        #[arg(long)]
        model: std::path::PathBuf,
        /// Length of r.
        #[arg(long, default_value_t = 50)]
        len: usize,
        #[arg(long, default_value_t = 4)]
        batch: usize,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// BOS token id (default: the model's bos_token_id, none for burnlens runs).
        #[arg(long)]
        bos: Option<i64>,
        #[arg(long)]
        out: std::path::PathBuf,
        #[command(flatten)]
        common: Common,
    },
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
    Cache {
        #[command(flatten)]
        model: ModelArgs,
        #[command(flatten)]
        input: Input,
        /// Hook names, comma-separated and exact (`blocks.1.attn.hook_z,hook_embed`), or a
        /// regex matched against the whole name when prefixed with `re:`
        /// (`re:blocks\.[01]\.attn\.hook_(q|pattern)`).
        #[arg(long)]
        names: String,
        /// Also save the gradient of this metric at every named hook point (`grad.NAME`),
        /// from one backward pass: `loss[:FROM]`, `logprob:TOKEN[@POS]` or
        /// `logit-diff:RIGHT,WRONG[@POS]`.
        #[arg(long)]
        grad: Option<String>,
        /// Output `.safetensors` file.
        #[arg(long)]
        out: std::path::PathBuf,
        #[command(flatten)]
        common: Common,
    },
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
    let cli = Cli::parse();
    let dir = progress::model_dir;
    let result = std::panic::catch_unwind(|| match cli.command {
        Command::Info { model, common } => dir(&model).and_then(|m| commands::info(&m, &common)),
        Command::Logits { model, input, out, common } => commands::logits(&model, &input, out.as_deref(), &common),
        Command::Cache { model, input, names, grad, out, common } => commands::cache(&model, &input, &names, grad.as_deref(), &out, &common),
        Command::Tokenize { model, text, json } => dir(&model).and_then(|m| commands::tokenize(&m, &text, json)),
        Command::Patch { model, input, corrupted_text, corrupted_ids, metric, nodes, no_exact, denoise, out, common } => {
            let corrupted = Input { text: corrupted_text, ids: corrupted_ids };
            commands::patch(&model, &input, &corrupted, &metric, &nodes, !no_exact, denoise, &out, &common)
        }
        Command::Attribute { model, input, target, wrong, pos, out, common } => {
            commands::attribute(&model, &input, &target, wrong.as_deref(), pos, &out, &common)
        }
        Command::Graph { model, input, graph, out, common } => commands::graph(&model, &input, &graph, &out, &common),
        Command::Lens { model, input, target, top, out, common } => commands::lens(&model, &input, target.as_deref(), top, &out, &common),
        Command::TrainSae(args) => train_sae::run(&args),
        Command::EvalSae(args) => eval_sae::run(&args),
        Command::Dashboards(args) => dashboards::run(&args),
        Command::CacheActivations(args) => cache_activations::run(&args),
        Command::Sae { model, sae, input, top, out, common } => commands::sae(&model, &sae, &input, top, &out, &common),
        Command::Download { id } => commands::download(&id),
        Command::Train(args) => train::run(&args),
        Command::Export(args) => export::run(&args),
        Command::Sample(args) => sample::run(&args),
        Command::Data { action: DataAction::Fetch { name, out } } => commands::fetch(&name, out.as_deref()),
        Command::Backends => commands::backends(),
        Command::Bench { args, common } => commands::device_of(&common).and_then(|d| bench::run(&args, d, &burnlens_hf::LoadOptions::dtype(common.dtype))),
        Command::Analyze { model, input, out, common } => commands::analyze(&model, &input, &out, &common),
        Command::Induction { model, len, batch, seed, bos, out, common } => {
            dir(&model).and_then(|m| commands::induction(&m, len, batch, seed, bos, &out, &common))
        }
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
