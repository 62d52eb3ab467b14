//! `burnlens info`: describe a model directory.

use anyhow::Result;

use crate::Common;
use crate::commands::load;

/// Describe a Hugging Face model directory: family, sizes, attention spans, dtype.
#[derive(clap::Args, Clone)]
pub struct InfoArgs {
    /// Model directory (config.json plus weights) or Hugging Face Hub id (`gpt2`,
    /// `EleutherAI/pythia-70m`, `org/name@revision`), downloaded into the HF cache.
    #[arg(long)]
    pub model: std::path::PathBuf,
    #[command(flatten)]
    pub common: Common,
}

pub fn run(a: &InfoArgs) -> Result<()> {
    let dir = crate::progress::model_dir(&a.model)?;
    let (dir, common) = (dir.as_path(), &a.common);
    let loaded = load(dir, common)?;
    for (label, text) in burnlens_hf::describe::describe(&loaded) {
        println!("{:<13}{text}", format!("{label}:"));
    }
    Ok(())
}
