//! `cargo xtask bench-python`: the Python API against TransformerLens.

use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::machine::cpu_line;
use crate::process::{root, run};
use crate::venvs::{Venv, python};

/// The Python API against TransformerLens on GPT-2 small (`scripts/bench_python.py`): the
/// extension as the tests build it (dev profile, dependencies optimised as in release),
/// staged with the Python package into `target/bench/py`. Writes `target/bench/python.json`.
pub(crate) fn bench_python() -> Result<()> {
    let py = python(Venv::SaeLens)?;
    let out_dir = root().join("target/bench");
    let model = out_dir.join("gpt2-small");
    if !model.join("model.safetensors").is_file() {
        bail!("{} is missing: run `cargo xtask bench forward` first (it writes the random GPT-2 small)", model.display());
    }
    run(Command::new(env!("CARGO")).current_dir(root()).args(["test", "--workspace", "--no-run", "--quiet"]))?;
    let so = root().join("target/debug/deps/libburnlens_native.so");
    let pkg = out_dir.join("py/burnlens");
    std::fs::create_dir_all(&pkg)?;
    for entry in std::fs::read_dir(root().join("crates/burnlens-py/python/burnlens"))? {
        let entry = entry?;
        std::fs::copy(entry.path(), pkg.join(entry.file_name()))?;
    }
    std::fs::copy(&so, pkg.join("_native.abi3.so")).with_context(|| format!("copying {}", so.display()))?;
    let out = Command::new(&py).current_dir(root()).arg("scripts/bench_python.py").arg(&model).env("PYTHONPATH", out_dir.join("py")).output()?;
    if !out.status.success() {
        bail!("bench_python.py failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let mut report: serde_json::Value = serde_json::from_slice(&out.stdout).context("bench_python.py printed no JSON")?;
    report["machine"] = serde_json::Value::String(cpu_line());
    std::fs::write(out_dir.join("python.json"), serde_json::to_string_pretty(&report)?)?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
