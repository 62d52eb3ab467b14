//! Developer tasks: `cargo xtask <task>`.
//!
//! - `fixtures`: make `.venv` with torch and transformers from PyPI (pinned below) and
//!   regenerate the Hugging Face parity fixtures in `tests/fixtures` with
//!   `scripts/gen_fixtures.py`. Needs network access to PyPI; never run in CI.
//! - `venv`: only make the venv.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The versions the committed fixtures were made with (see tests/fixtures/manifest.json).
const PY_PACKAGES: &[&str] = &["torch==2.9.0", "transformers==5.23.0", "safetensors", "numpy"];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask sits in the workspace").to_path_buf()
}

fn run(cmd: &mut Command) -> Result<()> {
    eprintln!("+ {cmd:?}");
    let status = cmd.status().with_context(|| format!("starting {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed with {status}");
    }
    Ok(())
}

/// `.venv/bin/python`, creating the venv and installing the packages if needed.
fn venv() -> Result<PathBuf> {
    let venv = root().join(".venv");
    let python = venv.join("bin/python");
    if !python.exists() {
        run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
    }
    let missing = !Command::new(&python)
        .args(["-c", "import torch, transformers, safetensors, numpy"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if missing {
        run(Command::new(&python).args(["-m", "pip", "install", "--quiet"]).args(PY_PACKAGES))?;
    }
    Ok(python)
}

fn main() -> Result<()> {
    let task = std::env::args().nth(1).unwrap_or_default();
    match task.as_str() {
        "venv" => {
            let py = venv()?;
            println!("{}", py.display());
        }
        "fixtures" => {
            let py = venv()?;
            run(Command::new(py).current_dir(root()).args(["scripts/gen_fixtures.py", "--out", "tests/fixtures"]))?;
        }
        _ => bail!("usage: cargo xtask <fixtures|venv>"),
    }
    Ok(())
}
