//! `burnlens`: the command-line face of the burnlens libraries. It parses arguments, picks a
//! device and calls the libraries; anything a library user could want lives there, not here.

mod bench;
mod commands;
mod output;
mod progress;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use burnlens_hf::HfError;
use burnlens_model::ModelError;
use burnlens_model::backend::BackendError;
use burnlens_train::TrainError;

/// GPT-2, GPT-Neo, GPT-NeoX (Pythia) and the Llama family on Burn: load Hugging Face
/// checkpoints (a directory or a Hub id), run them, train them, look inside.
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
        /// Model directory (config.json plus weights) or Hugging Face Hub id (`gpt2`,
        /// `EleutherAI/pythia-70m`, `org/name@revision`), downloaded into the HF cache.
        #[arg(long)]
        model: std::path::PathBuf,
        /// Comma-separated token ids, e.g. 464,3616,286.
        #[arg(long)]
        ids: String,
        /// Write `.json` ({"ids", "logits", "loss"}) or `.safetensors` (the same tensors).
        #[arg(long)]
        out: Option<std::path::PathBuf>,
        #[command(flatten)]
        common: Common,
    },
    /// Train a model as a TOML run config says (see configs/).
    Train {
        /// Run config. Optional with --resume (the run's own config.toml is used).
        #[arg(long)]
        config: Option<std::path::PathBuf>,
        /// Override a config key, e.g. --set training.steps=200 (repeatable).
        #[arg(long = "set", value_name = "KEY=VALUE")]
        sets: Vec<String>,
        /// Continue the run in this directory from its latest checkpoint.
        #[arg(long)]
        resume: Option<std::path::PathBuf>,
        /// Only errors and the final summary.
        #[arg(long)]
        quiet: bool,
        #[command(flatten)]
        common: Common,
    },
    /// Write the latest checkpoint of a run as a Hugging Face model directory.
    Export {
        #[arg(long)]
        run: std::path::PathBuf,
        #[arg(long)]
        out: std::path::PathBuf,
    },
    /// Generate text (or token ids) from a model directory or a run directory.
    Sample {
        /// Hugging Face model directory, Hub id or burnlens run directory.
        #[arg(long)]
        model: std::path::PathBuf,
        /// Prompt text (needs a tokenizer.json or char_vocab.json in the directory).
        #[arg(long, conflicts_with = "ids")]
        prompt: Option<String>,
        /// Prompt as comma-separated token ids.
        #[arg(long)]
        ids: Option<String>,
        #[arg(long, default_value_t = 64)]
        max_new_tokens: usize,
        /// 0 = greedy.
        #[arg(long, default_value_t = 1.0)]
        temperature: f64,
        #[arg(long)]
        top_k: Option<usize>,
        #[arg(long)]
        top_p: Option<f64>,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Recompute the whole prefix for every token instead of using the KV cache.
        #[arg(long)]
        no_cache: bool,
        #[command(flatten)]
        common: Common,
    },
    /// Write an interpretability report: attention viewer, head detectors, OV copying and
    /// composition scores (index.html and report.json).
    Analyze {
        /// Hugging Face model directory, Hub id or burnlens run directory.
        #[arg(long)]
        model: std::path::PathBuf,
        #[arg(long, conflicts_with = "ids")]
        text: Option<String>,
        #[arg(long)]
        ids: Option<String>,
        #[arg(long)]
        out: std::path::PathBuf,
        /// Fold LayerNorms, centre writing weights and the unembedding, fold value biases first.
        #[arg(long)]
        process_weights: bool,
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
    /// Save the activations whose TransformerLens-style names match a regex.
    Cache {
        /// Model directory (config.json plus weights) or Hugging Face Hub id (`gpt2`,
        /// `EleutherAI/pythia-70m`, `org/name@revision`), downloaded into the HF cache.
        #[arg(long)]
        model: std::path::PathBuf,
        /// Comma-separated token ids.
        #[arg(long)]
        ids: String,
        /// Regex over hook names, e.g. 'blocks\.0\.attn\.hook_(q|pattern)'.
        #[arg(long)]
        names: String,
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
        Command::Logits { model, ids, out, common } => dir(&model).and_then(|m| commands::logits(&m, &ids, out.as_deref(), &common)),
        Command::Cache { model, ids, names, out, common } => dir(&model).and_then(|m| commands::cache(&m, &ids, &names, &out, &common)),
        Command::Download { id } => commands::download(&id),
        Command::Train { config, sets, resume, quiet, common } => commands::train(config.as_deref(), &sets, resume.as_deref(), quiet, &common),
        Command::Export { run, out } => commands::export(&run, &out),
        Command::Sample { model, prompt, ids, max_new_tokens, temperature, top_k, top_p, seed, no_cache, common } => {
            let sampling = burnlens_model::Sampling { max_new_tokens, temperature, top_k, top_p, seed, stop_token: None, use_cache: !no_cache };
            dir(&model).and_then(|m| commands::sample(&m, prompt.as_deref(), ids.as_deref(), &sampling, &common))
        }
        Command::Data { action: DataAction::Fetch { name, out } } => commands::fetch(&name, out.as_deref()),
        Command::Backends => commands::backends(),
        Command::Bench { args, common } => commands::device_of(&common).and_then(|d| bench::run(&args, d)),
        Command::Analyze { model, text, ids, out, process_weights, common } => {
            dir(&model).and_then(|m| commands::analyze(&m, text.as_deref(), ids.as_deref(), &out, process_weights, &common))
        }
        Command::Induction { model, len, batch, seed, bos, out, common } => {
            dir(&model).and_then(|m| commands::induction(&m, len, batch, seed, bos, &out, &common))
        }
    });
    match result {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(err)) => {
            eprintln!("error: {}", one_line(&format!("{err:#}")));
            ExitCode::from(exit_code(&err))
        }
        Err(_) => ExitCode::from(1),
    }
}

/// 130 after Ctrl-C (checkpoint written), 2 for bad input, 1 for everything else.
fn exit_code(err: &anyhow::Error) -> u8 {
    for c in err.chain() {
        if let Some(t) = c.downcast_ref::<TrainError>() {
            return match t {
                TrainError::Interrupted { .. } => 130,
                t if t.is_user_error() => 2,
                _ => 1,
            };
        }
        if c.is::<HfError>() || c.is::<ModelError>() || c.is::<BackendError>() || c.is::<UserError>() {
            return 2;
        }
    }
    1
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}
