//! The README's test command (`cargo xtask test`, which `.ci/run` calls): the formatting,
//! what a fresh machine lacks installed, clippy (the `cuda` feature too, and `cuda,fusion` on
//! the model crate), the tests, and the portable-path rerun.

use std::process::Command;

use anyhow::{Context, Result};

use crate::packages::{ensure_browser, ensure_mpi};
use crate::process::{root, run};
use crate::venvs::{Venv, python};

/// The formatting check: `cargo fmt --check` with the repository's `rustfmt.toml`, rustfmt
/// installed through rustup first where it is missing.
pub(crate) fn check_format() -> Result<()> {
    let has_fmt = || Command::new(env!("CARGO")).args(["fmt", "--version"]).output().map(|o| o.status.success()).unwrap_or(false);
    if !has_fmt() {
        run(Command::new("rustup").args(["component", "add", "rustfmt"]))?;
    }
    run(Command::new(env!("CARGO")).current_dir(root()).args(["fmt", "--all", "--check"])).context("the code is not formatted: run `cargo fmt --all`")
}

/// Clippy on every crate, test and example with the features the tests build and `cuda`
/// (compiled here so that it cannot rot, though no test runs it without a GPU), warnings as
/// errors (the lints allowed are listed, with reasons, in the workspace's Cargo.toml). A
/// check build: it shares no artifacts with the test build.
pub(crate) fn check_lints(features: &[&str]) -> Result<()> {
    let has_clippy = || Command::new(env!("CARGO")).args(["clippy", "--version"]).output().map(|o| o.status.success()).unwrap_or(false);
    if !has_clippy() {
        run(Command::new("rustup").args(["component", "add", "clippy"]))?;
    }
    run(Command::new(env!("CARGO")).current_dir(root()).args(["clippy", "--workspace", "--all-targets"]).args(features).args(["--", "-D", "warnings"]))
        .context("clippy found warnings: fix them (or allow the lint, with its reason, in Cargo.toml's [workspace.lints.clippy])")
}

/// Format, install, lint, test. `args` go to `cargo test`; with none, everything runs.
pub(crate) fn test(args: Vec<String>) -> Result<()> {
    if args.is_empty() {
        check_format()?;
    }
    ensure_browser()?;
    // One build, with the `mpi` feature, for every test and rerun below: a second feature
    // set would rebuild every crate above burnlens-train.
    let features: &[&str] = if ensure_mpi() { &["--features", "mpi"] } else { &[] };
    let python = python(Venv::Tests)?;
    if args.is_empty() {
        crate::cuda_llvm::ensure().context("the LLVM the `cuda` feature builds with")?;
        let mut lint = features.to_vec();
        lint.extend(["--features", "cuda"]);
        check_lints(&lint)?;
        // The GPU kernels again with Burn's fusion (`Cube` is then `Fusion<CubeBackend>`): the
        // one crate the feature changes, so that neither variant can rot.
        run(Command::new(env!("CARGO")).current_dir(root()).args([
            "clippy",
            "-p",
            "burnlens-model",
            "--lib",
            "--features",
            "cuda,fusion",
            "--",
            "-D",
            "warnings",
        ]))
        .context("clippy found warnings in the fused GPU build")?;
        // The developer tasks' own tests (the fixture recipes, the LLVM's folder name).
        run(Command::new(env!("CARGO")).current_dir(root()).args(["test", "--quiet", "-p", "xtask"]))?;
    }
    run(Command::new(env!("CARGO")).current_dir(root()).arg("test").args(features).args(&args).env("BURNLENS_PYTHON", python))?;
    if args.is_empty() {
        // Once more on the portable path a Mac or any non-x86 machine runs: no AVX2 /
        // AVX-512 bodies, no packed weights (the same test binaries, nothing rebuilt).
        println!("== kernel, parity and half-weight tests on the portable path (BURNLENS_ISA=baseline)");
        // Selected by target, not by `-p burnlens-model`: `-p` changes feature unification and
        // so rebuilt Burn on a fresh machine (15 minutes of cold CI); the same packages as the
        // run above reuse its build. `--lib` runs every crate's unit tests on that path.
        let rerun =
            |tests: &[&str]| run(Command::new(env!("CARGO")).current_dir(root()).arg("test").args(features).args(tests).env("BURNLENS_ISA", "baseline"));
        rerun(&["--test", "kernels", "--lib"])?;
        // Not bf16 training's two 400-step runs: on this path they took 110 s of CI's time; the
        // same bf16 products are checked by the forward tests of the file.
        rerun(&["--test", "parity", "--test", "half", "--test", "bf16_compute", "--", "--skip", "training_in_bf16_follows_the_f32_loss_curve"])?;
    }
    Ok(())
}
