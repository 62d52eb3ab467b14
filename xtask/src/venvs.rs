//! The Python environments the fixture generators, the peers of the benchmarks and the Python
//! API's tests run in: which folder, which pinned packages, and one way to make any of them.

use std::path::PathBuf;
use std::process::Command;

use anyhow::Result;

use crate::process::{root, run};

/// The versions the committed fixtures were made with (see tests/fixtures/manifest.json).
pub(crate) const PY_PACKAGES: &[&str] = &["torch==2.9.0", "transformers==5.23.0", "safetensors", "numpy"];
/// The SAELens release the SAE fixtures were made with (its own dependencies, torch and
/// transformers held at the versions above).
const SAE_LENS: &str = "sae-lens==6.54.12";

/// circuit-tracer and the versions it installs beside torch 2.9 (its TransformerLens and
/// transformers are older than `.venv`'s, so it has a venv of its own, `target/venv-trace`);
/// `datasets` and `pyarrow` held where they import with the numpy 1.x TransformerLens 2 wants.
const TRACE_PACKAGES: &[&str] =
    &["torch==2.9.0", "circuit-tracer==0.5.0", "transformer-lens==2.18.0", "transformers==4.57.3", "nnsight==0.6.1", "datasets<4", "pyarrow<18"];

/// SAEDashboard and what it runs on: its own venv, as its transformers must be older than
/// 4.57 (and its TransformerLens wants numpy 1.x, so pyarrow is held below 18).
const DASH_PACKAGES: &[&str] = &["torch==2.9.0", "sae-dashboard==0.8.0", "sae-lens==6.54.12", "transformers<4.57", "pyarrow<18"];

/// A Python environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Venv {
    /// `.venv`: torch and transformers at the fixtures' versions.
    Main,
    /// `.venv` with sae-lens (and so TransformerLens) too, torch and transformers held.
    SaeLens,
    /// `target/venv-trace`: circuit-tracer.
    Trace,
    /// `target/venv-dash`: SAEDashboard.
    Dash,
    /// `.venv` with numpy and pytest only: the Python API's tests (no torch).
    Tests,
}

impl Venv {
    fn folder(self) -> PathBuf {
        match self {
            Venv::Main | Venv::SaeLens | Venv::Tests => root().join(".venv"),
            Venv::Trace => root().join("target/venv-trace"),
            Venv::Dash => root().join("target/venv-dash"),
        }
    }

    /// What `import` must find for the venv to be ready.
    fn imports(self) -> &'static str {
        match self {
            Venv::Main => "import torch, transformers, safetensors, numpy",
            Venv::SaeLens => "import sae_lens, transformer_lens, pytest",
            Venv::Trace => "import circuit_tracer, transformer_lens",
            Venv::Dash => "import sae_dashboard, sae_lens",
            Venv::Tests => "import numpy, pytest",
        }
    }
}

/// The venv's `bin/python`, made and filled with its packages where they are missing.
pub(crate) fn python(venv: Venv) -> Result<PathBuf> {
    if venv == Venv::SaeLens {
        python(Venv::Main)?;
    }
    let python = venv.folder().join("bin/python");
    if !python.exists() {
        run(Command::new("python3").args(["-m", "venv"]).arg(venv.folder()))?;
    }
    let ready = Command::new(&python).args(["-c", venv.imports()]).status().map(|s| s.success()).unwrap_or(false);
    if ready {
        return Ok(python);
    }
    let pip = || {
        let mut c = Command::new(&python);
        c.args(["-m", "pip", "install", "--quiet"]);
        c
    };
    match venv {
        Venv::Main => run(pip().args(PY_PACKAGES))?,
        Venv::SaeLens => {
            let constraints = root().join("target/py-constraints.txt");
            std::fs::create_dir_all(root().join("target"))?;
            std::fs::write(&constraints, PY_PACKAGES[..2].join("\n"))?;
            run(pip().arg("-c").arg(&constraints).args([SAE_LENS, "pytest"]))?;
        }
        Venv::Trace => run(pip().args(TRACE_PACKAGES))?,
        Venv::Dash => run(pip().args(DASH_PACKAGES))?,
        Venv::Tests => run(pip().args(["numpy", "pytest"]))?,
    }
    Ok(python)
}
