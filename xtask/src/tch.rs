//! The `tch` backend built against the CPU part of the venv's PyPI torch, and the parity suite on it
//! (`cargo xtask parity-tch`).

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::process::{root, run};
use crate::venvs::{Venv, python};

/// How to build and run the `tch` backend against the CPU part of the PyPI torch 2.9.0
/// wheel in `.venv` (torch-sys 0.22 wants 2.9.0): a folder `target/libtorch-cpu` whose
/// `lib/` links only `libtorch_cpu.so`, `libc10.so` and `libgomp.so.1` (and names
/// `libtorch_cpu.so` `libtorch.so`, since the wheel's `libtorch.so` pulls in
/// `libtorch_cuda.so`), so torch-sys links no CUDA library; `include` is the wheel's. The
/// tch build has its own target directory, so switching features never rebuilds the main one.
pub(crate) struct TchEnv {
    pub(crate) vars: Vec<(String, String)>,
    pub(crate) target_dir: PathBuf,
}

pub(crate) fn tch_env() -> Result<TchEnv> {
    let python = python(Venv::Main)?;
    let out = Command::new(&python)
        .args(["-c", "import torch, os, nvidia; print(torch.__version__); print(os.path.dirname(torch.__file__)); print(nvidia.__path__[0])"])
        .output()
        .context("asking the venv's torch for its version")?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let mut lines = text.lines();
    let (version, torch_dir, nvidia) = (lines.next().unwrap_or(""), PathBuf::from(lines.next().unwrap_or("")), PathBuf::from(lines.next().unwrap_or("")));
    if !version.starts_with("2.9.0") {
        bail!(
            "torch-sys 0.22 needs torch 2.9.0 but .venv has torch {version:?}; run: .venv/bin/pip install --no-deps torch==2.9.0 nvidia-cuda-runtime-cu12 nvidia-cuda-cupti-cu12"
        );
    }
    let dir = root().join("target/libtorch-cpu");
    let lib = dir.join("lib");
    std::fs::create_dir_all(&lib)?;
    let wheel_lib = torch_dir.join("lib");
    for (name, target) in [
        ("libtorch_cpu.so", "libtorch_cpu.so"),
        ("libtorch.so", "libtorch_cpu.so"),
        ("libc10.so", "libc10.so"),
        ("libgomp.so.1", "libgomp.so.1"),
        ("libgomp.so", "libgomp.so.1"),
    ] {
        let link = lib.join(name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(wheel_lib.join(target), &link)?;
    }
    let include = dir.join("include");
    let _ = std::fs::remove_file(&include);
    std::os::unix::fs::symlink(torch_dir.join("include"), &include)?;
    // libtorch_cpu.so needs libcudart and libcupti at load time even with no GPU in use.
    let ld = [lib.clone(), nvidia.join("cuda_runtime/lib"), nvidia.join("cuda_cupti/lib")]
        .iter()
        .map(|p| p.display().to_string())
        .chain(std::env::var("LD_LIBRARY_PATH").ok().filter(|s| !s.is_empty()))
        .collect::<Vec<_>>()
        .join(":");
    eprintln!("torch {version}: linking {} (CPU libraries only)", lib.display());
    Ok(TchEnv {
        vars: vec![("LIBTORCH".into(), dir.display().to_string()), ("LIBTORCH_CXX11_ABI".into(), "1".into()), ("LD_LIBRARY_PATH".into(), ld)],
        target_dir: root().join("target/tch"),
    })
}

impl TchEnv {
    pub(crate) fn apply<'a>(&self, cmd: &'a mut Command) -> &'a mut Command {
        cmd.env("CARGO_TARGET_DIR", &self.target_dir);
        for (k, v) in &self.vars {
            cmd.env(k, v);
        }
        cmd
    }
}

/// Build with the `tch` feature (see [`tch_env`]) and run the parity suite on LibTorch's CPU
/// device (`BURNLENS_TEST_BACKENDS=tch`; set it yourself to add others). Extra arguments go
/// to `cargo test`.
pub(crate) fn parity_tch(extra: Vec<String>) -> Result<()> {
    let env = tch_env()?;
    let backends = std::env::var("BURNLENS_TEST_BACKENDS").unwrap_or_else(|_| "tch".into());
    run(env
        .apply(Command::new(env!("CARGO")).current_dir(root()).args(["test", "--features", "tch", "--test", "parity"]).args(&extra))
        .env("BURNLENS_TEST_BACKENDS", backends))
}
