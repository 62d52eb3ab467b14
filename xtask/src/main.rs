//! Developer tasks: `cargo xtask <task>`.
//!
//! - `fixtures`: make `.venv` with torch and transformers from PyPI (pinned below) and
//!   regenerate the Hugging Face parity fixtures in `tests/fixtures` with
//!   `scripts/gen_fixtures.py`. Needs network access to PyPI; never run in CI.
//! - `sae-fixtures`: add `sae-lens` (pinned below) to the venv and regenerate the sparse
//!   autoencoder fixtures in `tests/fixtures/sae` with `scripts/gen_sae_fixtures.py`, and
//!   the TransformerLens references of the attribution tools in `tests/fixtures/tl` with
//!   `scripts/gen_tl_fixtures.py`.
//! - `features-fixtures`: with sae-lens in the venv (and pyarrow), regenerate the corpus
//!   windows in `tests/fixtures/data` (`scripts/gen_data_fixtures.py`) and the SAE training
//!   steps in `tests/fixtures/sae_train` (`scripts/gen_sae_train_fixtures.py`) and sae-lens's
//!   `run_evals` in `tests/fixtures/sae_eval` (`scripts/gen_sae_eval_fixtures.py`).
//! - `trace-fixtures`: make `target/venv-trace` with circuit-tracer (pinned below) and
//!   regenerate the attribution-graph fixtures in `tests/fixtures/trace` with
//!   `scripts/gen_trace_fixtures.py`.
//! - `dashboard-fixtures`: make `target/venv-dash` with sae-dashboard (pinned below) and
//!   regenerate the feature-dashboard fixtures in `tests/fixtures/dashboards` with
//!   `scripts/gen_dashboard_fixtures.py`.
//! - `bench-dashboards [--rounds N] [TOKENS] [FEATURES]`: feature dashboards against SAEDashboard on
//!   GPT-2 small's shape with a random 24,576-feature SAE (`scripts/bench_dashboards.py`).
//! - `bench-trace [TOKENS...]`: attribution graphs against circuit-tracer on GPT-2 small's
//!   shape with random 24k-feature transcoders (`scripts/bench_trace.py`).
//! - `bench-sae [--rounds N] [STEPS] [ARCH...]`: SAE training against sae-lens on GPT-2
//!   small's shape, 24,576 features, TopK, BatchTopK, standard and JumpReLU unless named
//!   (`scripts/bench_sae.py`); with N rounds, the sides alternate and the ratio is the median
//!   of the rounds' own.
//! - `bench-bf16 [--rounds N]`: bf16 compute against f32 and PyTorch's bf16 (products, training steps,
//!   shakespeare-char's 2,000 steps, an attribution graph; `bench_bf16.rs`).
//! - `bench-mpi [--rounds N] [STEPS] [GPT2_STEPS] [SAE_STEPS]`: data-parallel training, 2 MPI ranks × 1
//!   thread against 1 process × 2 threads, on the shakespeare-char config and GPT-2 small's
//!   shape (steps/s, the all-reduce's share of a step, the final losses), `train-sae` of a
//!   TopK SAE (24,576 features) on the random GPT-2 small the same way, and the all-reduce's
//!   bandwidth on loopback beside one core's copy bandwidth (`burnlens-dist`'s `allreduce`
//!   example). Builds the binary with the `mpi` feature (dev profile, as the tests).
//! - `venv`: only make the venv.
//! - `test`: the README's test command: check the formatting (`cargo fmt --all --check`,
//!   `rustfmt.toml`), install what the tests need that a fresh machine lacks (Debian's
//!   chromium and chromedriver for the browser tests; MPICH, its headers, libclang and
//!   pkg-config for the `mpi` feature and its multi-process tests; as root or through
//!   passwordless sudo), run clippy with warnings as errors, then `cargo test --features
//!   mpi` with any further arguments (and the portable-path rerun of the kernel, parity and
//!   half-weight tests on the same build).
//!   `.ci/run` calls it. It also installs the LLVM the `cuda` feature links (below) and runs
//!   clippy with `cuda` too, so that feature compiles in CI.
//! - `cuda-llvm`: install the LLVM that `cargo build --features cuda` links, from PyPI, where
//!   that build's own script would download it (`cuda_llvm.rs`); prints its folder.
//!
//! One file a concern: `process` (running commands), `venvs` (the Python environments),
//! `packages` (Debian's), `cuda_llvm`, `fixtures` (the recipes, as data), `test_runner`,
//! `machine` (what a benchmark ran on), `rounds` (a bench's rounds and their ratios), `tch`
//! (the LibTorch build), `bench/` (one driver a file).

mod bench;
mod cuda_llvm;
mod fixtures;
mod machine;
mod packages;
mod process;
mod rounds;
mod tch;
mod test_runner;
mod venvs;

use anyhow::{Result, bail};

fn main() -> Result<()> {
    let task = std::env::args().nth(1).unwrap_or_default();
    let rest: Vec<String> = std::env::args().skip(2).collect();
    if let Some(recipe) = fixtures::RECIPES.iter().find(|r| r.task == task) {
        return fixtures::make(recipe, &rest);
    }
    match task.as_str() {
        "venv" => println!("{}", venvs::python(venvs::Venv::Main)?.display()),
        "cuda-llvm" => println!("{}", cuda_llvm::ensure()?.display()),
        "test" => test_runner::test(rest)?,
        "bench-train" => bench::train::bench_train()?,
        "bench" => bench::model::bench(rest)?,
        "bench-python" => bench::python::bench_python()?,
        "bench-scale" => bench::scale::bench_scale(rest)?,
        "bench-bf16" => bench::bf16::bench_bf16(rest)?,
        "bench-trace" => bench::trace::bench_trace(rest)?,
        "bench-sae" => bench::sae::bench_sae(rest)?,
        "bench-dashboards" => bench::dashboards::bench_dashboards(rest)?,
        "bench-mpi" => bench::mpi::bench_mpi(rest)?,
        "parity-tch" => tch::parity_tch(rest)?,
        _ => bail!(
            "usage: cargo xtask <test [CARGO TEST ARGS]|{}|venv|cuda-llvm|bench [--rounds N] [WORKLOAD...]|bench-train|bench-scale [MODEL...]|bench-bf16 [--rounds N]|bench-trace [TOKENS...]|bench-sae [--rounds N] [STEPS] [ARCH...]|bench-dashboards [--rounds N] [TOKENS] [FEATURES]|bench-mpi [--rounds N] [STEPS] [GPT2_STEPS] [SAE_STEPS]|parity-tch>",
            fixtures::RECIPES.iter().map(|r| if r.task == "trace-fixtures" { "trace-fixtures [CASE...]" } else { r.task }).collect::<Vec<_>>().join("|")
        ),
    }
    Ok(())
}
