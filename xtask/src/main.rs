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

struct Exports {
    char_models: Vec<(&'static str, PathBuf)>,
    bpe_model: PathBuf,
}

/// Train tiny models with burnlens itself and export them, for `transformers` to load.
fn train_exports() -> Result<Exports> {
    let data = std::env::var("BURNLENS_DATA").map(PathBuf::from).unwrap_or_else(|_| root().join("../shared/data"));
    let text = data.join("tinyshakespeare.txt");
    if !text.is_file() {
        bail!("{} not found: set BURNLENS_DATA to the reference data directory", text.display());
    }
    let work = root().join("target/xtask-exports");
    let _ = std::fs::remove_dir_all(&work);
    let train = |name: &str, sets: &[String]| -> Result<PathBuf> {
        let run_dir = work.join(name);
        let mut cmd = Command::new(env!("CARGO"));
        cmd.current_dir(root()).args(["run", "--quiet", "--", "train", "--config", "configs/tiny-char.toml", "--quiet"]);
        cmd.args(["--set", &format!("data.path={:?}", text.display().to_string())]);
        cmd.args(["--set", &format!("output.dir={:?}", run_dir.display().to_string())]);
        for s in sets {
            cmd.args(["--set", s]);
        }
        run(&mut cmd)?;
        Ok(run_dir.join("hf"))
    };
    let gpt2 = train("gpt2", &["training.steps=30".into()])?;
    let neo = train("gpt_neo", &["training.steps=30".into(), "model.family=\"gpt_neo\"".into(), "model.window=5".into()])?;
    let bpe = train(
        "bpe",
        &[
            "data.kind=\"bpe\"".into(),
            format!("data.tokenizer={:?}", data.join("gpt2/tokenizer.json").display().to_string()),
            "model.d_model=8".into(),
            "model.n_heads=2".into(),
            "training.steps=2".into(),
        ],
    )?;
    Ok(Exports { char_models: vec![("trained_gpt2_char", gpt2), ("trained_gpt_neo_char", neo)], bpe_model: bpe })
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
            let exports = train_exports()?;
            let mut cmd = Command::new(py);
            cmd.current_dir(root()).args(["scripts/gen_fixtures.py", "--out", "tests/fixtures"]);
            for (name, dir) in &exports.char_models {
                cmd.arg("--export").arg(format!("{name}={}", dir.display()));
            }
            cmd.arg("--bpe-export").arg(&exports.bpe_model);
            run(&mut cmd)?;
        }
        _ => bail!("usage: cargo xtask <fixtures|venv>"),
    }
    Ok(())
}
