//! `burnlens`: the command-line face of the burnlens libraries. It parses arguments, picks a
//! device and calls the libraries; anything a library user could want lives there, not here.

mod commands;
mod output;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use burnlens_hf::HfError;
use burnlens_model::ModelError;
use burnlens_model::backend::BackendError;

/// GPT-2 and GPT-Neo on Burn: load Hugging Face checkpoints, run them, look inside.
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
        /// Model directory (config.json plus weights).
        #[arg(long)]
        model: std::path::PathBuf,
        #[command(flatten)]
        common: Common,
    },
    /// Run the model on one sequence of token ids and report or save the logits and loss.
    Logits {
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
    /// Save the activations whose TransformerLens-style names match a regex.
    Cache {
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
    let result = std::panic::catch_unwind(|| match cli.command {
        Command::Info { model, common } => commands::info(&model, &common),
        Command::Logits { model, ids, out, common } => commands::logits(&model, &ids, out.as_deref(), &common),
        Command::Cache { model, ids, names, out, common } => commands::cache(&model, &ids, &names, &out, &common),
    });
    match result {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(err)) => {
            eprintln!("error: {}", one_line(&format!("{err:#}")));
            if is_user_error(&err) { ExitCode::from(2) } else { ExitCode::from(1) }
        }
        Err(_) => ExitCode::from(1),
    }
}

fn is_user_error(err: &anyhow::Error) -> bool {
    err.chain().any(|c| c.is::<HfError>() || c.is::<ModelError>() || c.is::<BackendError>() || c.is::<UserError>())
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}
