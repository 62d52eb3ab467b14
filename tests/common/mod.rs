//! Helpers shared by the integration tests: fixtures, expected outputs, backends.
#![allow(dead_code)]

pub mod hub_server;
pub mod mpi_jobs;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use burn::tensor::Device;

/// `tests/fixtures/<name>`.
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

/// Every parity fixture the generator writes.
pub const FIXTURES: &[&str] = &[
    "gpt2",
    "gpt2_inverse_layer",
    "gpt_neo_local",
    "gpt2_legacy_bin",
    "gpt2_f16",
    "gpt_neo_bf16",
    "gpt2_sharded_f64",
    "pythia_like",
    "neox_sequential",
    "llama_gqa",
    "qwen2_tied",
    "mistral_window",
    "qwen3_qknorm",
    "olmo2_postnorm",
    "gptj_interleaved",
    "gemma2_softcap",
    "gemma3_local_rope",
    "phi3_fused",
];

/// Models trained and exported by burnlens, recorded by `transformers`.
pub const EXPORT_FIXTURES: &[&str] = &[
    "trained_gpt2_char",
    "trained_gpt_neo_char",
    "trained_llama_char",
    "trained_pythia_char",
    "trained_qwen3_char",
    "trained_olmo2_char",
    "trained_gptj_char",
    "trained_gemma2_char",
    "trained_gemma3_char",
    "trained_phi3_char",
];

/// The bf16 copy of each family's fixture (`tests/fixtures/bf16`, `cargo xtask
/// half-fixtures`): name and directory, by name.
pub fn half_fixtures() -> Vec<(String, PathBuf)> {
    let root = fixture("bf16");
    let mut out: Vec<(String, PathBuf)> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e} (run `cargo xtask half-fixtures`)", root.display()))
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("config.json").is_file())
        .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
        .collect();
    out.sort();
    out
}

/// Every fixture.
pub fn all_fixtures() -> Vec<&'static str> {
    FIXTURES.iter().chain(EXPORT_FIXTURES).copied().collect()
}

/// Backends the tests run on: `BURNLENS_TEST_BACKENDS` (comma-separated) if set, else every
/// backend compiled into this build that runs a small computation here (flex in the
/// default build; ndarray, wgpu, tch, cuda when their features are on and a device answers).
pub fn backends() -> Vec<(String, Device)> {
    let names: Vec<String> = match std::env::var("BURNLENS_TEST_BACKENDS") {
        Ok(list) => list.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect(),
        Err(_) => burnlens::model::backend::probe_all().into_iter().filter(|r| r.compiled && r.probe.is_ok()).map(|r| r.name.to_string()).collect(),
    };
    names
        .into_iter()
        .map(|n| {
            let device = burnlens::model::backend::device(&n, None).unwrap_or_else(|e| panic!("{e}"));
            (n, device)
        })
        .collect()
}

/// The GPU backends this build has, each with its device (wgpu, cuda): what the GPU kernels'
/// tests run on.
#[allow(dead_code)]
pub fn gpu_devices() -> Vec<(&'static str, Device)> {
    ["wgpu", "cuda"]
        .into_iter()
        .filter(|n| burnlens::model::backend::is_compiled(n))
        .map(|n| (n, burnlens::model::backend::device(n, None).unwrap_or_else(|e| panic!("{n}: {e}"))))
        .collect()
}

/// A tensor read back from a safetensors file, as f32 (or i64 for ids).
pub struct Stored {
    pub shape: Vec<usize>,
    pub f32: Vec<f32>,
    pub i64: Vec<i64>,
}

/// All tensors of a safetensors file.
pub fn read_safetensors(path: &Path) -> HashMap<String, Stored> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("valid safetensors");
    st.tensors()
        .into_iter()
        .map(|(name, view)| {
            let data = view.data();
            let (f, i) = match view.dtype() {
                safetensors::Dtype::F32 => (data.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect(), vec![]),
                safetensors::Dtype::I64 => (vec![], data.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect()),
                safetensors::Dtype::F64 => (data.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap()) as f32).collect(), vec![]),
                // Masks are stored as bytes.
                safetensors::Dtype::U8 => (data.iter().map(|&b| b as f32).collect(), vec![]),
                other => panic!("unexpected dtype {other:?} for {name}"),
            };
            (name.to_string(), Stored { shape: view.shape().to_vec(), f32: f, i64: i })
        })
        .collect()
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

pub fn max_abs(a: &[f32]) -> f32 {
    a.iter().map(|x| x.abs()).fold(0.0, f32::max)
}

/// `x` within `tol` of `y` in relative L2 (`‖x − y‖ ≤ tol · ‖x‖`, in f64; a zero `x` must
/// equal `y`), the relative difference printed under `name`.
pub fn assert_close(name: &str, x: &[f32], y: &[f32], tol: f64) {
    assert_eq!(x.len(), y.len(), "{name}: {} values against {}", x.len(), y.len());
    let norm = |v: &mut dyn Iterator<Item = f64>| v.map(|x| x * x).sum::<f64>().sqrt();
    let diff = norm(&mut x.iter().zip(y).map(|(x, y)| (x - y) as f64));
    let size = norm(&mut x.iter().map(|&x| x as f64));
    eprintln!("{name}: {:.2e}", diff / size);
    assert!(diff <= tol * size, "{name}: differs by {diff} (norm {size}, tolerance {tol} relative)");
}

/// `../shared/data` or `BURNLENS_DATA`; `None` (with a note on stderr) if it is absent, and
/// a failure under CI (`CI` set), where a missing prerequisite must not pass as a skip.
pub fn shared_data() -> Option<PathBuf> {
    let dir = std::env::var("BURNLENS_DATA").map(PathBuf::from).unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data"));
    if dir.is_dir() {
        Some(dir)
    } else {
        missing_prerequisite(&format!("reference data not found at {} (set BURNLENS_DATA)", dir.display()));
        None
    }
}

/// A test's prerequisite is missing: a note and a skip on a developer's machine, a failure
/// under CI.
pub fn missing_prerequisite(what: &str) {
    if std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "false" && v != "0") {
        panic!("{what}: needed under CI");
    }
    eprintln!("skipping: {what}");
}

/// The lines of a run's `metrics.jsonl` of one `kind` (`train`, `eval`, ...), in order.
pub fn run_metrics(run: &Path, kind: &str) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap_or_else(|e| panic!("{}: {e}", run.join("metrics.jsonl").display()))
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["kind"] == kind)
        .collect()
}

/// Run the `burnlens` binary built for these tests, ignoring any `BURNLENS_BACKEND` of the
/// caller's environment.
pub fn burnlens(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_burnlens")).args(args).env_remove("BURNLENS_BACKEND").output().expect("run burnlens")
}

/// [`burnlens`] with some environment variables set.
pub fn burnlens_with_env(env: &[(&str, &str)], args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_burnlens")).args(args).env_remove("BURNLENS_BACKEND").envs(env.iter().copied()).output().expect("run burnlens")
}

/// A run refused as bad input: exit code 2 and exactly one line on stderr, `error: ...`,
/// containing `needle`, with no panic or backtrace.
pub fn assert_bad_input(o: &Output, needle: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "expected exit 2, got {:?}; stderr: {err}", o.status.code());
    assert_eq!(err.trim_end().lines().count(), 1, "expected a one-line error, got: {err}");
    assert!(err.starts_with("error: "), "{err}");
    assert!(err.contains(needle), "expected {needle:?} in: {err}");
    assert!(!err.contains("panicked") && !err.contains("backtrace"), "{err}");
}

/// A run that exits with `code` and exactly one `error:` line (warnings may come first)
/// containing `needle`, with no panic or backtrace.
pub fn assert_exit(o: &Output, code: i32, needle: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(code), "{err}");
    let error_lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(error_lines.len(), 1, "{err}");
    assert!(err.contains(needle), "expected {needle:?} in {err}");
    assert!(!err.contains("panicked") && !err.contains("RUST_BACKTRACE"), "{err}");
}

/// Copy fixture `name` into a fresh temporary directory.
pub fn copy_fixture(name: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join(name);
    std::fs::create_dir_all(&dir).unwrap();
    for entry in std::fs::read_dir(fixture(name)).unwrap() {
        let p = entry.unwrap().path();
        std::fs::copy(&p, dir.join(p.file_name().unwrap())).unwrap();
    }
    (tmp, dir)
}

/// The states of an xorshift generator started from `seed` (deterministic test values).
pub fn xorshift(seed: u64) -> impl Iterator<Item = u64> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    std::iter::repeat_with(move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    })
}

/// `n` deterministic pseudo-random values in [-1, 1] ([`xorshift`] from `seed`).
pub fn uniform(n: usize, seed: u64) -> Vec<f32> {
    xorshift(seed).take(n).map(|s| ((s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) as f32).collect()
}
