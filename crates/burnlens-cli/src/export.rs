//! `burnlens export`: the latest checkpoint of a training run as a Hugging Face model
//! directory (`train::export_run`).

use std::path::PathBuf;

use anyhow::Result;

/// `burnlens export` options.
#[derive(clap::Args)]
pub struct ExportArgs {
    #[arg(long)]
    pub run: PathBuf,
    #[arg(long)]
    pub out: PathBuf,
    /// The dtype of the tensors written: auto (f32, as trained), f32, bf16 or f16.
    #[arg(long, default_value = "auto")]
    pub dtype: burnlens_hf::WeightDtype,
}

pub fn run(a: &ExportArgs) -> Result<()> {
    burnlens_train::export_run(&a.run, &a.out, a.dtype)?;
    println!("exported {} to {}", a.run.display(), a.out.display());
    Ok(())
}
