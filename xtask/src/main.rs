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
//! - `bench-dashboards [TOKENS] [FEATURES]`: feature dashboards against SAEDashboard on
//!   GPT-2 small's shape with a random 24,576-feature SAE (`scripts/bench_dashboards.py`).
//! - `bench-trace [TOKENS...]`: attribution graphs against circuit-tracer on GPT-2 small's
//!   shape with random 24k-feature transcoders (`scripts/bench_trace.py`).
//! - `bench-sae [STEPS] [ARCH...]`: SAE training against sae-lens on GPT-2 small's shape,
//!   24,576 features, TopK, BatchTopK, standard and JumpReLU unless named
//!   (`scripts/bench_sae.py`).
//! - `bench-bf16`: bf16 compute against f32 and PyTorch's bf16 (products, training steps,
//!   shakespeare-char's 2,000 steps, an attribution graph; `bench_bf16.rs`).
//! - `bench-mpi [STEPS] [GPT2_STEPS]`: data-parallel training, 2 MPI ranks × 1 thread
//!   against 1 process × 2 threads, on the shakespeare-char config and GPT-2 small's shape
//!   (steps/s, the all-reduce's share of a step, the final losses), and the all-reduce's
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
//!   `.ci/run` calls it.

mod bench_bf16;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The versions the committed fixtures were made with (see tests/fixtures/manifest.json).
const PY_PACKAGES: &[&str] = &["torch==2.9.0", "transformers==5.23.0", "safetensors", "numpy"];
/// The SAELens release the SAE fixtures were made with (its own dependencies, torch and
/// transformers held at the versions above).
const SAE_LENS: &str = "sae-lens==6.54.12";

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
    let missing = !Command::new(&python).args(["-c", "import torch, transformers, safetensors, numpy"]).status().map(|s| s.success()).unwrap_or(false);
    if missing {
        run(Command::new(&python).args(["-m", "pip", "install", "--quiet"]).args(PY_PACKAGES))?;
    }
    Ok(python)
}

/// How to build and run the `tch` backend against the CPU part of the PyPI torch 2.9.0
/// wheel in `.venv` (torch-sys 0.22 wants 2.9.0): a folder `target/libtorch-cpu` whose
/// `lib/` links only `libtorch_cpu.so`, `libc10.so` and `libgomp.so.1` (and names
/// `libtorch_cpu.so` `libtorch.so`, since the wheel's `libtorch.so` pulls in
/// `libtorch_cuda.so`), so torch-sys links no CUDA library; `include` is the wheel's. The
/// tch build has its own target directory, so switching features never rebuilds the main one.
struct TchEnv {
    vars: Vec<(String, String)>,
    target_dir: PathBuf,
}

fn tch_env() -> Result<TchEnv> {
    let python = venv()?;
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
    fn apply<'a>(&self, cmd: &'a mut Command) -> &'a mut Command {
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
fn parity_tch(extra: Vec<String>) -> Result<()> {
    let env = tch_env()?;
    let backends = std::env::var("BURNLENS_TEST_BACKENDS").unwrap_or_else(|_| "tch".into());
    run(env
        .apply(Command::new(env!("CARGO")).current_dir(root()).args(["test", "--features", "tch", "--test", "parity"]).args(&extra))
        .env("BURNLENS_TEST_BACKENDS", backends))
}

/// Train `configs/shakespeare-char-cpu.toml` with burnlens and the same configuration with
/// the lean PyTorch peer (`scripts/peer_nanogpt.py train`), one after the other on this
/// machine, and report wall time, tokens/s and validation loss side by side.
/// One training run of `bench_mpi`: its steps/s after the first two steps, the all-reduce's
/// share of that time and the last training loss.
fn mpi_run(ranks: usize, config: &Path, sets: &[String], run_dir: &Path) -> Result<(f64, f64, f64)> {
    let bin = root().join("target/debug/burnlens");
    let _ = std::fs::remove_dir_all(run_dir);
    let mut cmd = if ranks == 1 {
        Command::new(&bin)
    } else {
        let mut c = Command::new("mpiexec.mpich");
        c.args(["-n", &ranks.to_string()]).arg(&bin);
        c
    };
    // The machine's cores shared out: 2 threads for one process, 1 per rank for two.
    let threads = (std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2) / ranks).max(1);
    cmd.args(["train", "--quiet", "--config"]).arg(config).env("RAYON_NUM_THREADS", threads.to_string());
    for s in sets.iter().cloned().chain([format!("output.dir={:?}", run_dir.display().to_string())]) {
        cmd.args(["--set", &s]);
    }
    run(&mut cmd)?;
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(run_dir.join("metrics.jsonl"))?.lines().map(serde_json::from_str).collect::<Result<_, _>>()?;
    let train: Vec<&serde_json::Value> = lines.iter().filter(|v| v["kind"] == "train").collect();
    let (first, last) = (train.get(1).context("at least 3 steps")?, train.last().context("no steps")?);
    let f = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap_or(0.0);
    let seconds = f(last, "elapsed_s") - f(first, "elapsed_s");
    let steps = f(last, "step") - f(first, "step");
    let reduce: f64 = train.iter().skip(2).map(|v| f(v, "allreduce_s")).sum();
    Ok((steps / seconds, reduce / seconds, f(last, "loss")))
}

fn bench_mpi(args: Vec<String>) -> Result<()> {
    let steps: usize = args.first().map(|s| s.parse()).transpose()?.unwrap_or(200);
    let gpt2_steps: usize = args.get(1).map(|s| s.parse()).transpose()?.unwrap_or(8);
    if !ensure_mpi() {
        bail!("bench-mpi needs MPICH and the `mpi` feature's build dependencies");
    }
    // The dev profile, as the other training benchmarks (dependencies and the hot crates at
    // opt-level 3), and the build the tests made.
    run(Command::new(env!("CARGO")).current_dir(root()).args(["build", "--features", "mpi", "--bin", "burnlens"]))?;
    run(Command::new(env!("CARGO")).current_dir(root()).args(["build", "-p", "burnlens-dist", "--features", "mpi", "--example", "allreduce"]))?;
    run(Command::new("lscpu").arg("--extended=CPU,CORE,SOCKET,MAXMHZ"))?;
    let data = std::env::var("BURNLENS_DATA").map(PathBuf::from).unwrap_or_else(|_| root().join("../shared/data"));
    let out = root().join("target/bench/mpi");
    std::fs::create_dir_all(&out)?;
    let text = format!("data.path={:?}", data.join("tinyshakespeare.txt").display().to_string());
    let common = |n: usize| vec![text.clone(), format!("training.steps={n}"), format!("training.eval_interval={n}"), "output.export=false".into()];
    // GPT-2 small's shape on GPT-2's tokenizer, 4 × 128 tokens a step.
    let gpt2 = out.join("gpt2-small.toml");
    std::fs::write(
        &gpt2,
        format!(
            "[model]\nfamily = \"gpt2\"\nn_layers = 12\nn_heads = 12\nd_model = 768\ncontext = 1024\n[data]\nkind = \"bpe\"\ntokenizer = {:?}\n\
             [training]\nbatch_size = 4\nblock_size = 128\nwarmup_steps = 2\nlearning_rate = 6e-4\neval_batches = 1\ndropout = 0.0\n[output]\ndir = \"unused\"\n",
            data.join("gpt2/tokenizer.json").display().to_string()
        ),
    )?;
    let cases = [("shakespeare-char", root().join("configs/shakespeare-char-cpu.toml"), common(steps)), ("gpt2-small", gpt2, common(gpt2_steps))];
    let mut rows = Vec::new();
    for (name, config, sets) in &cases {
        let (one_rate, _, one_loss) = mpi_run(1, config, sets, &out.join(format!("{name}-1")))?;
        let (two_rate, share, two_loss) = mpi_run(2, config, sets, &out.join(format!("{name}-2")))?;
        rows.push(format!("| {name} | {one_rate:.3} | {two_rate:.3} | {:.2}x | {:.1}% | {one_loss:.5} / {two_loss:.5} |", two_rate / one_rate, 100.0 * share));
    }
    println!("| config | 1 process × 2 threads, steps/s | 2 ranks × 1 thread, steps/s | ratio | all-reduce share | final loss (1 / 2) |");
    println!("|---|---|---|---|---|---|");
    for r in rows {
        println!("{r}");
    }
    run(Command::new("mpiexec.mpich").args(["-n", "2"]).arg(root().join("target/debug/examples/allreduce")))?;
    Ok(())
}

fn bench_train() -> Result<()> {
    let py = venv()?;
    let data = std::env::var("BURNLENS_DATA").map(PathBuf::from).unwrap_or_else(|_| root().join("../shared/data"));
    let text = data.join("tinyshakespeare.txt");
    let steps: usize = std::env::var("BENCH_STEPS").ok().and_then(|s| s.parse().ok()).unwrap_or(2000);
    let config_path = root().join("configs/shakespeare-char-cpu.toml");
    let cfg: toml::Table = std::fs::read_to_string(&config_path)?.parse()?;
    let get = |t: &str, k: &str| cfg[t][k].clone();
    let out_dir = root().join("target/bench");
    std::fs::create_dir_all(&out_dir)?;
    let run_dir = out_dir.join("shakespeare-char-cpu");
    let _ = std::fs::remove_dir_all(&run_dir);

    let started = std::time::Instant::now();
    run(Command::new(env!("CARGO")).current_dir(root()).args(["run", "--quiet", "--", "train", "--config"]).arg(&config_path).args([
        "--quiet",
        "--set",
        &format!("data.path={:?}", text.display().to_string()),
        "--set",
        &format!("output.dir={:?}", run_dir.display().to_string()),
        "--set",
        &format!("training.steps={steps}"),
        "--set",
        "output.export=false",
    ]))?;
    let ours_wall = started.elapsed().as_secs_f64();
    let metrics = std::fs::read_to_string(run_dir.join("metrics.jsonl"))?;
    let lines: Vec<serde_json::Value> = metrics.lines().map(serde_json::from_str).collect::<Result<_, _>>()?;
    let last_train = lines.iter().rev().find(|v| v["kind"] == "train").context("no training metrics")?;
    let last_eval = lines.iter().rev().find(|v| v["kind"] == "eval").context("no evaluation")?;
    let ours_loop = last_train["elapsed_s"].as_f64().unwrap_or(f64::NAN);
    let ours_tps = last_train["tokens_per_s"].as_f64().unwrap_or(f64::NAN);
    let ours_val = last_eval["val_loss"].as_f64().unwrap_or(f64::NAN);

    let peer_cfg = serde_json::json!({
        "data_path": text, "steps": steps,
        "n_layers": get("model", "n_layers").as_integer(), "n_heads": get("model", "n_heads").as_integer(),
        "d_model": get("model", "d_model").as_integer(),
        "batch_size": get("training", "batch_size").as_integer(), "block_size": get("training", "block_size").as_integer(),
        "learning_rate": get("training", "learning_rate").as_float(), "min_lr": get("training", "min_lr").as_float(),
        "warmup_steps": get("training", "warmup_steps").as_integer(), "lr_decay_steps": get("training", "lr_decay_steps").as_integer(),
        "beta1": get("training", "beta1").as_float(), "beta2": get("training", "beta2").as_float(),
        "weight_decay": get("training", "weight_decay").as_float(), "grad_clip": get("training", "grad_clip").as_float(),
        "eval_batches": get("training", "eval_batches").as_integer(), "seed": get("training", "seed").as_integer(),
        "threads": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
    });
    let peer_cfg_path = out_dir.join("peer-train.json");
    std::fs::write(&peer_cfg_path, peer_cfg.to_string())?;
    let out = Command::new(&py).current_dir(root()).args(["scripts/peer_nanogpt.py", "train", "--config"]).arg(&peer_cfg_path).output()?;
    if !out.status.success() {
        bail!("peer failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let peer: serde_json::Value = serde_json::from_slice(out.stdout.trim_ascii())?;
    let peer_tps = peer["tokens_per_s"].as_f64().unwrap_or(f64::NAN);
    let report = format!(
        "# Training: nanoGPT CPU shakespeare-char ({steps} steps, batch 12 x block 64, 4 layers, 4 heads, d_model 128)\n\n{}\n\n\
         | | wall (s) | training loop (s) | tokens/s | val loss |\n|---|---|---|---|---|\n\
         | burnlens (flex) | {ours_wall:.1} | {ours_loop:.1} | {ours_tps:.0} | {ours_val:.4} |\n\
         | PyTorch lean peer ({} threads, torch {}) | - | {:.1} | {peer_tps:.0} | {:.4} |\n\n\
         burnlens / PyTorch tokens/s: {:.2}x\n",
        cpu_line(),
        peer["threads"],
        peer["torch"].as_str().unwrap_or("?"),
        peer["seconds"].as_f64().unwrap_or(f64::NAN),
        peer["val_loss"].as_f64().unwrap_or(f64::NAN),
        ours_tps / peer_tps
    );
    print!("{report}");
    std::fs::write(out_dir.join("train.md"), &report)?;
    println!("written to {}", out_dir.join("train.md").display());
    Ok(())
}

/// One benchmark row: the same workload for burnlens and the PyTorch peers.
struct Workload {
    label: String,
    burnlens: Vec<String>,
    peer: Vec<String>,
    rounds: usize,
    /// Also the lean model under `torch.compile` (forward and training).
    compile: bool,
    /// Run with a busy neighbour process (`yes > /dev/null`) on the machine, and add
    /// burnlens on one thread under the same load.
    contended: bool,
}

/// Who runs a workload: burnlens (`bench` subcommand of our binary), a PyTorch peer
/// (`scripts/peer_nanogpt.py --impl NAME`), burnlens on one thread, or burnlens on LibTorch.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Impl {
    Burnlens,
    BurnlensOneThread,
    Hf,
    Lean,
    Compile,
    Tch,
}

impl Impl {
    fn peer_name(self) -> Option<&'static str> {
        match self {
            Impl::Hf => Some("hf"),
            Impl::Lean => Some("lean"),
            Impl::Compile => Some("compile"),
            Impl::Burnlens | Impl::BurnlensOneThread | Impl::Tch => None,
        }
    }
}

/// A process that keeps one core busy while it lives (the "busy neighbour": a browser tab,
/// an IDE indexing, a notebook kernel); killed on drop.
struct BusyNeighbour(std::process::Child);

impl BusyNeighbour {
    fn start() -> Result<Self> {
        let child = Command::new("yes").stdout(std::process::Stdio::null()).spawn().context("starting `yes` as the busy neighbour")?;
        // Let the scheduler see it before the measurement starts.
        std::thread::sleep(std::time::Duration::from_millis(200));
        Ok(Self(child))
    }
}

impl Drop for BusyNeighbour {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn run_json(cmd: &mut Command) -> Result<serde_json::Value> {
    let out = cmd.output().with_context(|| format!("starting {cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().rev().find(|l| l.starts_with('{')).context("no JSON line")?;
    Ok(serde_json::from_str(line)?)
}

/// The numbers of the array `key` of a bench report.
fn floats(v: &serde_json::Value, key: &str) -> Result<Vec<f64>> {
    Ok(v[key].as_array().with_context(|| format!("the report has no array {key:?}"))?.iter().filter_map(|x| x.as_f64()).collect())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() { f64::NAN } else { v[v.len() / 2] }
}

/// Every workload on burnlens, HF `transformers`, the lean PyTorch model and (forward,
/// training) the lean model under `torch.compile`, alternating, same weights (a random GPT-2
/// small saved by `transformers`), same threads; the training step again beside a busy
/// neighbour process. Writes `target/bench/report.md`.
fn bench(args: Vec<String>) -> Result<()> {
    let with_tch = args.iter().any(|a| a == "--tch");
    let only: Vec<String> = args.into_iter().filter(|a| a != "--tch").collect();
    let py = venv()?;
    let out_dir = root().join("target/bench");
    std::fs::create_dir_all(&out_dir)?;
    let model = out_dir.join("gpt2-small");
    if !model.join("model.safetensors").is_file() {
        run(Command::new(&py)
            .args([
                "-c",
                "import sys, torch; from transformers import GPT2Config, GPT2LMHeadModel; torch.manual_seed(0); \
             GPT2LMHeadModel(GPT2Config()).save_pretrained(sys.argv[1])",
            ])
            .arg(&model))?;
    }
    run(Command::new(env!("CARGO")).current_dir(root()).args(["build", "--quiet", "--bin", "burnlens"]))?;
    let bin = root().join("target/debug/burnlens");
    // burnlens on LibTorch's CPU backend: the same binary built with `--features tch`.
    let tch = if with_tch {
        let env = tch_env()?;
        run(env.apply(Command::new(env!("CARGO")).current_dir(root()).args(["build", "--quiet", "--bin", "burnlens", "--features", "tch"])))?;
        let bin = env.target_dir.join("debug/burnlens");
        Some((env, bin))
    } else {
        None
    };
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).to_string();
    let m = model.display().to_string();
    let w = |label: &str, args: &[&str], rounds: usize| {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let mut burn = args.clone();
        let mut peer = args.clone();
        if args[0] == "train" {
            peer[0] = "train-steps".into();
        }
        if ["forward", "generate", "load"].contains(&args[0].as_str()) {
            burn.extend(["--model".to_string(), m.clone()]);
            peer.extend(["--model".to_string(), m.clone()]);
        }
        if let Some(i) = burn.iter().position(|a| a == "--new") {
            burn[i] = "--new-tokens".into();
        }
        let compile = ["forward", "train"].contains(&args[0].as_str()) && !args.iter().any(|a| a == "bf16");
        Workload { label: label.into(), burnlens: burn, peer, rounds, compile, contended: false }
    };
    let mut workloads = vec![
        w("forward 1x128", &["forward", "--batch", "1", "--seq", "128", "--reps", "3"], 3),
        w("forward 4x256", &["forward", "--batch", "4", "--seq", "256", "--reps", "2"], 2),
        w("generate 16+64 (KV cache)", &["generate", "--new", "64", "--reps", "1"], 2),
        // The same weights kept in bf16 (PyTorch peers in bf16 too).
        w("generate 16+64 bf16 (KV cache)", &["generate", "--new", "64", "--reps", "1", "--dtype", "bf16"], 2),
        w("forward 1x128 bf16", &["forward", "--batch", "1", "--seq", "128", "--reps", "3", "--dtype", "bf16"], 3),
        w("train nanoGPT CPU config", &["train", "--reps", "2"], 2),
        Workload { label: "train, busy neighbour".into(), contended: true, compile: false, ..w("", &["train", "--reps", "2"], 2) },
        w("train shakespeare-char 6x384 ctx 256 b8", &["train", "--train-shape", "shakespeare-char", "--reps", "2"], 2),
        w("train GPT-2 small ctx 256 b1", &["train", "--train-shape", "gpt2", "--reps", "2"], 2),
        w("load GPT-2 small", &["load"], 3),
    ];
    for t in [128, 512, 1024, 2048, 4096] {
        // Short rows take milliseconds: enough repetitions that a median is not one
        // scheduler hiccup on a shared 2-vCPU machine.
        let reps = match t {
            128 => "30",
            512 => "8",
            4096 => "1",
            _ => "3",
        };
        workloads.push(w(&format!("attention seq {t}"), &["attention", "--seq", &t.to_string(), "--reps", reps], 2));
    }
    if !only.is_empty() {
        workloads.retain(|w| only.iter().any(|o| w.label.starts_with(o.as_str())));
    }
    let machine = machine_report(&bin)?;
    println!("{}", machine.text);
    let mut table = String::from(
        "| workload | burnlens | HF transformers | lean PyTorch | torch.compile | burnlens / HF | burnlens / lean | burnlens / compile | GFLOP/s burnlens / HF / lean |",
    );
    table.push_str(if tch.is_some() {
        " burnlens on tch | tch / lean |\n|---|---|---|---|---|---|---|---|---|---|---|\n"
    } else {
        "\n|---|---|---|---|---|---|---|---|---|\n"
    });
    let mut notes = String::new();
    let mut burnlens_times: Vec<(String, f64)> = Vec::new();
    for wl in &workloads {
        let mut impls = vec![Impl::Burnlens, Impl::Hf, Impl::Lean];
        if wl.compile {
            impls.push(Impl::Compile);
        }
        if wl.contended {
            impls.push(Impl::BurnlensOneThread);
        }
        if tch.is_some() {
            impls.push(Impl::Tch);
        }
        let mut results: Vec<(Impl, Vec<f64>, serde_json::Value)> = impls.iter().map(|&i| (i, vec![], serde_json::Value::Null)).collect();
        for _ in 0..wl.rounds {
            for (which, times, last) in results.iter_mut() {
                let _neighbour = if wl.contended { Some(BusyNeighbour::start()?) } else { None };
                let v = match *which {
                    Impl::Burnlens => run_json(Command::new(&bin).arg("bench").args(&wl.burnlens))?,
                    Impl::BurnlensOneThread => run_json(Command::new(&bin).arg("bench").args(&wl.burnlens).env("RAYON_NUM_THREADS", "1"))?,
                    Impl::Tch => {
                        let (env, tch_bin) = tch.as_ref().expect("tch built");
                        run_json(env.apply(Command::new(tch_bin).arg("bench").args(&wl.burnlens).args(["--backend", "tch"])))?
                    }
                    peer => run_json(Command::new(&py).current_dir(root()).arg("scripts/peer_nanogpt.py").args(&wl.peer).args([
                        "--impl",
                        peer.peer_name().expect("a PyTorch peer"),
                        "--threads",
                        &threads,
                    ]))?,
                };
                times.extend(floats(&v, "times")?);
                *last = v;
            }
        }
        // Both sides must have measured the same model and batch.
        for key in ["params", "tokens"] {
            let seen: Vec<(Impl, f64)> = results.iter().filter_map(|(i, _, v)| Some((*i, v[key].as_f64()?))).collect();
            if let Some(&(_, want)) = seen.first()
                && let Some((other, got)) = seen.iter().find(|(_, got)| *got != want)
            {
                anyhow::bail!("{}: burnlens reports {key} = {want}, {other:?} reports {got}: the two sides measured different shapes", wl.label);
            }
        }
        let load = wl.burnlens[0] == "load";
        let cell = |which: Impl| -> Option<(f64, String)> {
            let (_, times, last) = results.iter().find(|r| r.0 == which)?;
            let t = median(times.to_vec());
            Some(if load {
                let rss = last["peak_rss_bytes"].as_f64().unwrap_or(f64::NAN) - last["rss_before_bytes"].as_f64().unwrap_or(0.0);
                let size = last["checkpoint_bytes"].as_f64().unwrap_or(f64::NAN);
                (t, format!("{t:.2} s, +{:.0} MB RSS ({:.2}x ckpt)", rss / 1e6, rss / size))
            } else {
                let tokens = last["tokens"].as_f64().unwrap_or(f64::NAN);
                (t, format!("{:.0} tok/s ({:.1} ms)", tokens / t, t * 1e3))
            })
        };
        let (tb, cb) = cell(Impl::Burnlens).expect("burnlens ran");
        let (th, ch) = cell(Impl::Hf).expect("HF ran");
        let (tl, cl) = cell(Impl::Lean).expect("lean ran");
        let compiled = cell(Impl::Compile);
        let first = &results[0].2;
        // Achieved compute (or, for decoding, memory traffic) of each implementation.
        let rate = |t: f64| -> String {
            if let Some(f) = first["flops"].as_f64() {
                format!("{:.0}", f / t / 1e9)
            } else if let Some(bytes) = first["weight_bytes_per_token"].as_f64() {
                let tokens = first["tokens"].as_f64().unwrap_or(f64::NAN);
                format!("{:.1} GB/s", bytes * tokens / t / 1e9)
            } else {
                "-".into()
            }
        };
        let rates = format!("{} / {} / {}", rate(tb), rate(th), rate(tl));
        if let Some(f) = first["flops"].as_f64()
            && !wl.contended
        {
            notes.push_str(&format!(
                "- {}: {:.1} GFLOP per run; burnlens at {:.0}% of the measured GEMM rate\n",
                wl.label,
                f / 1e9,
                100.0 * f / tb / 1e9 / machine.gemm_gflops
            ));
        }
        if let Some(bytes) = first["weight_bytes_per_token"].as_f64() {
            let tokens = first["tokens"].as_f64().unwrap_or(f64::NAN);
            let pct = |t: f64| 100.0 * bytes * tokens / t / 1e9 / machine.read_gbps;
            notes.push_str(&format!(
                "- {}: {:.0} MB of weights per token; burnlens reads {:.1} GB/s = {:.0}% of the measured read bandwidth ({:.1} GB/s; copy {:.1} GB/s counting bytes read and written); HF {:.0}%, lean PyTorch {:.0}%\n",
                wl.label, bytes / 1e6, bytes * tokens / tb / 1e9, pct(tb), machine.read_gbps, machine.copy_gbps, pct(th), pct(tl)
            ));
        }
        if let Some(faults) = first["page_faults_per_step"].as_f64() {
            let last = first["page_faults_last_step"].as_f64().map_or(String::new(), |l| format!(", {l:.0} in the last"));
            let warm = first["page_faults_warm_up"].as_array().map_or(String::new(), |w| {
                format!(
                    " (in the untimed warm-up steps: {})",
                    w.iter().map(|v| v.as_f64().map_or("?".into(), |f| format!("{f:.0}"))).collect::<Vec<_>>().join(", ")
                )
            });
            notes.push_str(&format!("- {}: burnlens {faults:.0} page faults per timed step{last}{warm}\n", wl.label));
        }
        if let Some((t1, c1)) = cell(Impl::BurnlensOneThread) {
            notes.push_str(&format!(
                "- {}: with `yes > /dev/null` running, burnlens on {threads} threads {cb}, on one thread {c1}: **{:.2}x** the one-thread step (target ≤ 1.2x); lean PyTorch {cl}\n",
                wl.label,
                tb / t1
            ));
        }
        // Ratios of speed: > 1 means burnlens is faster.
        let (cc, rc) = match &compiled {
            Some((tc, cc)) => (cc.clone(), format!("{:.2}x", tc / tb)),
            None => ("-".into(), "-".into()),
        };
        table.push_str(&format!("| {} | {cb} | {ch} | {cl} | {cc} | {:.2}x | {:.2}x | {rc} | {rates} |", wl.label, th / tb, tl / tb));
        if let Some((tt, ct)) = cell(Impl::Tch) {
            table.push_str(&format!(" {ct} | {:.2}x |", tl / tt));
        }
        table.push('\n');
        burnlens_times.push((wl.label.clone(), tb));
        println!("{}: burnlens {cb} | HF {ch} | lean {cl} | compile {cc}", wl.label);
        if wl.burnlens[0] == "attention" {
            notes.push_str(&format!(
                "- {}: scores tensor {} MB; peak RSS burnlens {:.0} MB, lean {:.0} MB\n",
                wl.label,
                first["scores_bytes"].as_f64().unwrap_or(0.0) / 1e6,
                first["peak_rss_bytes"].as_f64().unwrap_or(0.0) / 1e6,
                results.iter().find(|r| r.0 == Impl::Lean).map(|r| r.2["peak_rss_bytes"].as_f64().unwrap_or(0.0)).unwrap_or(0.0) / 1e6
            ));
        }
    }
    // Half weights against f32 ones, burnlens alone: decoding reads half the bytes.
    let time_of = |label: &str| burnlens_times.iter().find(|(l, _)| l == label).map(|(_, t)| *t);
    for (f32_row, bf16_row, target) in
        [("generate 16+64 (KV cache)", "generate 16+64 bf16 (KV cache)", "≥ 1.8x"), ("forward 1x128", "forward 1x128 bf16", "≥ 0.9x")]
    {
        if let (Some(a), Some(b)) = (time_of(f32_row), time_of(bf16_row)) {
            let paired = paired_half_ratio(&bin, workloads.iter().find(|w| w.label == bf16_row).expect("the row ran"))?;
            notes.push_str(&format!(
                "- {bf16_row}: burnlens with bf16 weights at **{:.2}x** its speed with f32 weights (rows above; target {target}); \
                 alternating f32 and bf16 runs, median of {PAIRS} pairs: **{paired:.2}x**\n",
                a / b
            ));
        }
    }
    // The products under the forward pass and the training step, alone: burnlens's GEMM
    // against torch.matmul (MKL/oneDNN) on the same shapes, GFLOP/s.
    let mut gemm_table = String::new();
    let mut blas_name = String::from("OpenBLAS");
    if only.is_empty() || only.iter().any(|o| o.starts_with("gemm")) {
        gemm_table.push_str("\n| GEMM m×k×n | what | burnlens GFLOP/s (weight packed once) | gemm repacking per call | torch.matmul GFLOP/s | OpenBLAS (numpy) GFLOP/s | burnlens / torch | burnlens / OpenBLAS |\n|---|---|---|---|---|---|---|---|\n");
        for (shape, what) in [
            ("128x768x2304", "qkv, forward 1x128"),
            ("128x768x768", "attention out"),
            ("128x768x3072", "MLP in"),
            ("128x3072x768", "MLP out"),
            ("128x768x50257t", "tied unembedding (W_Eᵀ view)"),
            ("1024x768x2304", "qkv, forward 4x256"),
            ("768x128x384", "qkv, nanoGPT training"),
            ("1536x1536x1536", "square"),
        ] {
            let (mut ours, mut repacking, mut theirs, mut blas) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for _ in 0..3 {
                let v = run_json(Command::new(&bin).args(["bench", "gemm", "--shape", shape, "--reps", "20"]))?;
                ours.extend(floats(&v, "times")?);
                repacking.extend(floats(&v, "times_repacking")?);
                let v = run_json(Command::new(&py).current_dir(root()).args([
                    "scripts/peer_nanogpt.py",
                    "gemm",
                    "--impl",
                    "lean",
                    "--shape",
                    shape,
                    "--reps",
                    "20",
                    "--threads",
                    &threads,
                ]))?;
                theirs.extend(floats(&v, "times")?);
                let v = run_json(
                    Command::new(&py)
                        .current_dir(root())
                        .args(["scripts/peer_nanogpt.py", "gemm", "--impl", "openblas", "--shape", shape, "--reps", "20"])
                        .env("OPENBLAS_NUM_THREADS", &threads),
                )?;
                blas_name = v["blas"].as_str().unwrap_or("OpenBLAS").to_string();
                blas.extend(floats(&v, "times")?);
            }
            let dims: Vec<f64> = shape.trim_end_matches('t').split('x').filter_map(|d| d.parse().ok()).collect();
            let flops = 2.0 * dims.iter().product::<f64>();
            let (a, r, b, o) = (flops / median(ours) / 1e9, flops / median(repacking) / 1e9, flops / median(theirs) / 1e9, flops / median(blas) / 1e9);
            println!("gemm {shape}: burnlens {a:.0} GFLOP/s (repacking {r:.0}) | torch.matmul {b:.0} GFLOP/s | {blas_name} {o:.0} GFLOP/s");
            gemm_table.push_str(&format!("| {shape} | {what} | {a:.0} | {r:.0} | {b:.0} | {o:.0} | {:.2}x | {:.2}x |\n", a / b, a / o));
        }
        gemm_table.push_str(&format!(
            "\nOpenBLAS: {blas_name}, the build numpy's wheel bundles, `OPENBLAS_NUM_THREADS={threads}`; every product after 0.3 s of warm-up.\n"
        ));
    }
    let torch =
        Command::new(&py).args(["-c", "import torch, transformers; print(torch.__version__, transformers.__version__, torch.get_num_threads())"]).output()?;
    let report = format!(
        "# burnlens benchmarks\n\nGPT-2 small shape, fp32, random weights (one checkpoint for all), {threads} threads; \
         medians; ratios are speed ratios (above 1: burnlens faster). torch, transformers, default threads: {}\n\n{}\n\n{table}\n{notes}{gemm_table}",
        String::from_utf8_lossy(&torch.stdout).trim(),
        machine.text
    );
    std::fs::write(out_dir.join("report.md"), &report)?;
    println!("\n{report}\nwritten to {}", out_dir.join("report.md").display());
    Ok(())
}

/// `lscpu` as fields, and the widest vector ISA its flags name.
struct Lscpu(String);

impl Lscpu {
    fn read() -> Self {
        Lscpu(Command::new("lscpu").output().map(|o| String::from_utf8_lossy(&o.stdout).to_string()).unwrap_or_default())
    }

    fn field(&self, name: &str) -> String {
        self.0.lines().find(|l| l.starts_with(name)).and_then(|l| l.split_once(':')).map(|(_, v)| v.trim().to_string()).unwrap_or_else(|| "?".into())
    }

    fn simd(&self) -> &'static str {
        let flags = self.field("Flags");
        let has = |f: &str| flags.split_whitespace().any(|x| x == f);
        if has("avx512f") {
            "AVX-512"
        } else if has("avx2") {
            "AVX2"
        } else {
            "SSE"
        }
    }
}

/// `Machine: VENDOR MODEL (family, model; N CPUs; ISA)` from `lscpu`, for every report.
fn cpu_line() -> String {
    let l = Lscpu::read();
    format!(
        "Machine: {} {} (family {}, model {}; {} CPUs; {})",
        l.field("Vendor ID"),
        l.field("Model name"),
        l.field("CPU family"),
        l.field("Model:"),
        l.field("CPU(s)"),
        l.simd()
    )
}

/// The machine a bench ran on: `lscpu`, burnlens's GEMM rate on a large square product,
/// and the copy bandwidth.
struct Machine {
    text: String,
    gemm_gflops: f64,
    copy_gbps: f64,
    /// Read bandwidth from huge pages, where packed and converted weights live.
    read_gbps: f64,
    /// From the ordinary heap's 4 KB pages (a memory-mapped checkpoint's pages are those).
    read_gbps_heap: f64,
}

fn machine_report(bin: &Path) -> Result<Machine> {
    let lscpu = Lscpu::read();
    let field = |name: &str| lscpu.field(name);
    let simd = lscpu.simd();
    let mhz = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| c.lines().find(|l| l.starts_with("cpu MHz")).and_then(|l| l.split(':').nth(1)).and_then(|v| v.trim().parse::<f64>().ok()))
        .unwrap_or(f64::NAN);
    let cpus: f64 = field("CPU(s)").parse().unwrap_or(f64::NAN);
    // Two FMA pipes per core of the vector width (fp32 lanes x 2 flops x 2 pipes).
    let per_cycle = match simd {
        "AVX-512" => 64.0,
        "AVX2" => 32.0,
        _ => 16.0,
    };
    let peak = cpus * mhz / 1e3 * per_cycle;
    let m = run_json(Command::new(bin).args(["bench", "machine"]))?;
    let gemm = m["gemm_gflops"].as_f64().unwrap_or(f64::NAN);
    let text = format!(
        "Machine: {} {} ({} CPUs, {} thread(s) per core, {simd}, {:.0} MHz); theoretical fp32 peak {peak:.0} GFLOP/s \
         (assuming two FMA pipes of full width per core). Measured by burnlens on this run: GEMM 1536³ {gemm:.0} GFLOP/s \
         with {} threads ({:.0} on one), read bandwidth {:.1} GB/s on huge pages (where packed and converted weights live; {:.1} on the ordinary heap), copy bandwidth {:.1} GB/s (bytes read + written); kernels compiled for {}. \
         The clock in /proc/cpuinfo is the nominal one: a measured GEMM rate above the theoretical peak means the cores run faster.",
        field("Vendor ID"),
        field("Model name"),
        field("CPU(s)"),
        field("Thread(s) per core"),
        mhz,
        m["threads"],
        m["gemm_gflops_one_thread"].as_f64().unwrap_or(f64::NAN),
        m["read_gbps"].as_f64().unwrap_or(f64::NAN),
        m["read_gbps_heap"].as_f64().unwrap_or(f64::NAN),
        m["copy_gbps"].as_f64().unwrap_or(f64::NAN),
        m["isa"].as_str().unwrap_or("?"),
    );
    let g = |k: &str| m[k].as_f64().unwrap_or(f64::NAN);
    Ok(Machine { text, gemm_gflops: gemm, copy_gbps: g("copy_gbps"), read_gbps: g("read_gbps"), read_gbps_heap: g("read_gbps_heap") })
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
    let rotary = |name: &str, config: &str| -> Result<PathBuf> {
        let run_dir = work.join(name);
        run(Command::new(env!("CARGO")).current_dir(root()).args(["run", "--quiet", "--", "train", "--config", config, "--quiet"]).args([
            "--set",
            &format!("data.path={:?}", text.display().to_string()),
            "--set",
            &format!("output.dir={:?}", run_dir.display().to_string()),
            "--set",
            "training.steps=30",
        ]))?;
        Ok(run_dir.join("hf"))
    };
    let llama = rotary("llama", "configs/tiny-llama-char.toml")?;
    let pythia = rotary("pythia", "configs/tiny-pythia-char.toml")?;
    // The newer families, each from its own fresh defaults on the tiny character config.
    let mut newer = Vec::new();
    for (name, family) in [
        ("trained_qwen3_char", "qwen3"),
        ("trained_olmo2_char", "olmo2"),
        ("trained_gptj_char", "gptj"),
        ("trained_gemma2_char", "gemma2"),
        ("trained_gemma3_char", "gemma3_text"),
        ("trained_phi3_char", "phi3"),
    ] {
        newer.push((name, train(family, &["training.steps=30".into(), format!("model.family={family:?}")])?));
    }
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
    Ok(Exports {
        char_models: [vec![("trained_gpt2_char", gpt2), ("trained_gpt_neo_char", neo), ("trained_llama_char", llama), ("trained_pythia_char", pythia)], newer]
            .concat(),
        bpe_model: bpe,
    })
}

/// Debian's chromium and chromedriver, installed if missing (as root, or with passwordless
/// sudo). Where neither works the browser tests will say what is missing.
fn ensure_browser() -> Result<()> {
    let present = || Path::new("/usr/bin/chromium").exists() && Path::new("/usr/bin/chromedriver").exists();
    if present() || std::env::var_os("BURNLENS_SKIP_BROWSER").is_some() {
        return Ok(());
    }
    eprintln!("installing chromium and chromium-driver (Debian packages) for the browser tests");
    if !(apt_install(&["chromium", "chromium-driver"]) && present()) {
        eprintln!(
            "warning: could not install chromium and chromium-driver (needs root or passwordless sudo); \
             the browser tests will fail: install them, or set BURNLENS_SKIP_BROWSER=1 to skip those tests"
        );
    }
    Ok(())
}

/// Debian's packages for the `mpi` feature and its multi-process tests: MPICH (its
/// `mpiexec` runs as root and puts more ranks than cores on loopback without the flags Open
/// MPI needs for both), its headers for the `mpi` crate's C shim, and libclang and
/// pkg-config for its bindgen build script. Whether the `mpi` feature can be built.
fn ensure_mpi() -> bool {
    let present = || {
        let ok = |cmd: &mut Command| cmd.output().map(|o| o.status.success()).unwrap_or(false);
        let libclang = std::fs::read_dir("/usr/lib")
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with("llvm-") && e.path().join("lib/libclang.so").exists());
        ok(Command::new("pkg-config").args(["--exists", "mpich"])) && ok(Command::new("mpiexec.mpich").arg("--version")) && libclang
    };
    if present() {
        return true;
    }
    eprintln!("installing mpich, libmpich-dev, libclang-dev and pkg-config (Debian packages) for the MPI tests");
    if apt_install(&["mpich", "libmpich-dev", "libclang-dev", "pkg-config"]) && present() {
        return true;
    }
    eprintln!(
        "warning: could not install MPICH, its headers and libclang (needs root or passwordless sudo); \
         testing without the `mpi` feature: the MPI tests will fail"
    );
    false
}

/// `apt-get install` as root or through passwordless sudo; whether it succeeded.
fn apt_install(packages: &[&str]) -> bool {
    let is_root = Command::new("id").arg("-u").output().map(|o| o.stdout.trim_ascii() == b"0").unwrap_or(false);
    let apt = |args: &[&str]| -> bool {
        let mut cmd = if is_root {
            Command::new("apt-get")
        } else {
            let mut c = Command::new("sudo");
            c.args(["-n", "apt-get"]);
            c
        };
        cmd.args(args).env("DEBIAN_FRONTEND", "noninteractive").status().map(|s| s.success()).unwrap_or(false)
    };
    apt(&["update", "-qq"]) && apt(&["install", "-y", "-qq"].iter().chain(packages).copied().collect::<Vec<_>>())
}

/// circuit-tracer and the versions it installs beside torch 2.9 (its TransformerLens and
/// transformers are older than `.venv`'s, so it has a venv of its own, `target/venv-trace`);
/// `datasets` and `pyarrow` held where they import with the numpy 1.x TransformerLens 2 wants.
const TRACE_PACKAGES: &[&str] =
    &["torch==2.9.0", "circuit-tracer==0.5.0", "transformer-lens==2.18.0", "transformers==4.57.3", "nnsight==0.6.1", "datasets<4", "pyarrow<18"];

/// `target/venv-trace/bin/python` with [`TRACE_PACKAGES`], made if missing.
fn venv_trace() -> Result<PathBuf> {
    let venv = root().join("target/venv-trace");
    let python = venv.join("bin/python");
    if !python.exists() {
        run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
    }
    let has = Command::new(&python).args(["-c", "import circuit_tracer, transformer_lens"]).status().map(|s| s.success()).unwrap_or(false);
    if !has {
        run(Command::new(&python).args(["-m", "pip", "install", "--quiet"]).args(TRACE_PACKAGES))?;
    }
    Ok(python)
}

/// SAEDashboard and what it runs on: its own venv, as its transformers must be older than
/// 4.57 (and its TransformerLens wants numpy 1.x, so pyarrow is held below 18).
const DASH_PACKAGES: &[&str] = &["torch==2.9.0", "sae-dashboard==0.8.0", "sae-lens==6.54.12", "transformers<4.57", "pyarrow<18"];

/// `target/venv-dash/bin/python` with [`DASH_PACKAGES`], made if missing.
fn venv_dash() -> Result<PathBuf> {
    let venv = root().join("target/venv-dash");
    let python = venv.join("bin/python");
    if !python.exists() {
        run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
    }
    let has = Command::new(&python).args(["-c", "import sae_dashboard, sae_lens"]).status().map(|s| s.success()).unwrap_or(false);
    if !has {
        run(Command::new(&python).args(["-m", "pip", "install", "--quiet"]).args(DASH_PACKAGES))?;
    }
    Ok(python)
}

/// Feature dashboards against SAEDashboard (`scripts/bench_dashboards.py`): the random GPT-2
/// small of `bench`, a random standard SAE of 24,576 features at `blocks.6.hook_resid_pre`
/// (about 2% density), random windows of 128 tokens, the same threads. burnlens makes every
/// feature's dashboard; SAEDashboard (which re-runs the model for each batch of 256
/// features) makes FEATURES features' and its time for all is its per-batch time times 96,
/// as stated in the table. Arguments: TOKENS (default 8192) and FEATURES (default 512).
/// Peak RSS of both by /usr/bin/time; writes `target/bench/dashboards.json`.
fn bench_dashboards(args: Vec<String>) -> Result<()> {
    let py = venv_dash()?;
    let model = root().join("target/bench/gpt2-small");
    if !model.join("model.safetensors").is_file() {
        run(Command::new(&py).args(["-c", "import sys, torch; from transformers import GPT2Config, GPT2LMHeadModel; torch.manual_seed(0); GPT2LMHeadModel(GPT2Config()).save_pretrained(sys.argv[1])"]).arg(&model))?;
    }
    let (hook, d_sae) = ("blocks.6.hook_resid_pre", 24576usize);
    let sae = root().join("target/bench/dash-sae");
    if !sae.join("cfg.json").is_file() {
        run(Command::new(&py).current_dir(root()).args(["scripts/bench_dashboards.py", "make-sae"]).arg(&model).arg(&sae).args([&d_sae.to_string(), hook]))?;
    }
    run(Command::new(env!("CARGO")).current_dir(root()).args(["build", "--quiet", "--bin", "burnlens"]))?;
    let bin = root().join("target/debug/burnlens");
    let machine = machine_report(&bin)?;
    println!("{}", machine.text);
    let tokens: u64 = args.first().map(|a| a.parse()).transpose()?.unwrap_or(8192);
    let features: usize = args.get(1).map(|a| a.parse()).transpose()?.unwrap_or(512);
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2).to_string();
    let rss_file = root().join("target/bench/dash-rss.txt");
    let peak = || -> f64 {
        std::fs::read_to_string(&rss_file).ok().and_then(|t| t.lines().last().and_then(|l| l.trim().parse::<f64>().ok())).unwrap_or(f64::NAN) / 1e6
    };
    let out = root().join("target/bench/dash-run");
    let _ = std::fs::remove_dir_all(&out);
    let ours = Command::new("/usr/bin/time")
        .args(["-f", "%M", "-o"])
        .arg(&rss_file)
        .arg(&bin)
        .args(["dashboards", "--process-weights", "--data", "random", "--seq-len", "128", "--tokens", &tokens.to_string(), "--model"])
        .arg(&model)
        .arg("--sae")
        .arg(&sae)
        .arg("--out")
        .arg(&out)
        .env("RAYON_NUM_THREADS", &threads)
        .output()?;
    if !ours.status.success() {
        bail!("burnlens dashboards failed: {}", String::from_utf8_lossy(&ours.stderr));
    }
    let ours_rss = peak();
    let run_json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out.join("run.json"))?)?;
    let secs = |k: &str| run_json["run"]["seconds"][k].as_f64().unwrap_or(f64::NAN);
    let (p1, p2, lg) = (secs("first_pass"), secs("second_pass"), secs("logits"));
    let compute = p1 + p2 + lg;
    let said = String::from_utf8_lossy(&ours.stdout).to_string();
    let peer = Command::new("/usr/bin/time")
        .args(["-f", "%M", "-o"])
        .arg(&rss_file)
        .arg(&py)
        .current_dir(root())
        .arg("scripts/bench_dashboards.py")
        .arg("run")
        .arg(&model)
        .arg(&sae)
        .args([&tokens.to_string(), &features.to_string(), &threads])
        .output()?;
    let p: serde_json::Value = serde_json::from_str(String::from_utf8_lossy(&peer.stdout).lines().last().unwrap_or("{}"))?;
    let peer_rss = peak();
    let per_batch = p["seconds_per_batch"].as_f64().unwrap_or(f64::NAN);
    let peer_all = per_batch * d_sae.div_ceil(256) as f64;
    let table = format!(
        "| tool | features | tokens | passes (s) | logit effects (s) | compute (s) | all 24,576 features (s) | tokens/s per pass | peak RSS (GB) | burnlens faster by |\n|---|---|---|---|---|---|---|---|---|---|\n\
         | burnlens | 24,576 | {tokens} | {p1:.1} + {p2:.1} | {lg:.1} | {compute:.1} | {compute:.1} | {:.0} | {ours_rss:.2} | {:.1}x |\n\
         | SAEDashboard 0.8.0 | {features} | {} | - | - | {:.1} | {peer_all:.0} (96 × {per_batch:.1}) | - | {peer_rss:.2} | |\n",
        tokens as f64 / (p1.max(p2)),
        peer_all / compute,
        p["tokens"],
        p["seconds"].as_f64().unwrap_or(f64::NAN),
    );
    println!("{table}\nburnlens: {said}");
    std::fs::write(
        root().join("target/bench/dashboards.json"),
        serde_json::json!({"machine": machine.text, "burnlens": run_json, "saedashboard": p, "table": table}).to_string(),
    )?;
    Ok(())
}

/// `.venv` with sae-lens (and so TransformerLens), torch and transformers held at the
/// versions above.
fn venv_with_sae_lens() -> Result<PathBuf> {
    let py = venv()?;
    let has = Command::new(&py).args(["-c", "import sae_lens, transformer_lens, pytest"]).status().map(|s| s.success()).unwrap_or(false);
    if !has {
        let constraints = root().join("target/py-constraints.txt");
        std::fs::create_dir_all(root().join("target"))?;
        std::fs::write(&constraints, PY_PACKAGES[..2].join("\n"))?;
        run(Command::new(&py).args(["-m", "pip", "install", "--quiet", "-c"]).arg(&constraints).args([SAE_LENS, "pytest"]))?;
    }
    Ok(py)
}

/// SAE training against sae-lens (`scripts/bench_sae.py`): the random GPT-2 small of `bench`
/// (`target/bench/gpt2-small`), `blocks.6.hook_resid_pre`, 24,576 features, batches of 32
/// windows of 128 random tokens (4,096 activations), a mixing buffer of two model passes, the
/// same threads; TopK (k = 32) and standard, burnlens and sae-lens alternating, one process per
/// run (peak RSS by /usr/bin/time), seconds per step over the steady steps (after two).
/// Arguments: steps per run (default 6). Writes `target/bench/sae.json` and prints a table.
fn bench_sae(args: Vec<String>) -> Result<()> {
    let py = venv_with_sae_lens()?;
    let model = root().join("target/bench/gpt2-small");
    if !model.join("model.safetensors").is_file() {
        run(Command::new(&py).args(["-c", "import sys, torch; from transformers import GPT2Config, GPT2LMHeadModel; torch.manual_seed(0); GPT2LMHeadModel(GPT2Config()).save_pretrained(sys.argv[1])"]).arg(&model))?;
    }
    run(Command::new(env!("CARGO")).current_dir(root()).args(["build", "--quiet", "--bin", "burnlens"]))?;
    let bin = root().join("target/debug/burnlens");
    let machine = machine_report(&bin)?;
    println!("{}", machine.text);
    let steps: usize = args.first().map(|a| a.parse()).transpose()?.unwrap_or(6);
    let archs: Vec<&str> = if args.len() > 1 { args[1..].iter().map(String::as_str).collect() } else { vec!["topk", "batchtopk", "standard", "jumprelu"] };
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2).to_string();
    let (hook, d_sae, k) = ("blocks.6.hook_resid_pre", "24576", "32");
    let rss_file = root().join("target/bench/sae-rss.txt");
    let peak = || -> f64 {
        std::fs::read_to_string(&rss_file).ok().and_then(|t| t.lines().last().and_then(|l| l.trim().parse::<f64>().ok())).unwrap_or(f64::NAN) * 1024.0
    };
    let mut results = Vec::new();
    let mut table = String::from(
        "| architecture | tool | s / step | model passes / step | rest / step | SAE products | activations / s | peak RSS | burnlens faster by |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for arch in archs {
        let out_dir = root().join("target/bench/sae-run");
        let _ = std::fs::remove_dir_all(&out_dir);
        let ours = Command::new("/usr/bin/time")
            .args(["-f", "%M", "-o"])
            .arg(&rss_file)
            .arg(&bin)
            .args(["train-sae", "--model"])
            .arg(&model)
            .args([
                "--hook",
                hook,
                "--architecture",
                arch,
                "--k",
                k,
                "--l1",
                "1",
                "--d-sae",
                d_sae,
                "--steps",
                &steps.to_string(),
                "--batch",
                "32",
                "--seq-len",
                "128",
            ])
            .args(["--n-batches-in-buffer", "2", "--data", "random", "--checkpoint-every", "100000", "--out"])
            .arg(&out_dir)
            .env("RAYON_NUM_THREADS", &threads)
            .output()?;
        if !ours.status.success() {
            bail!("burnlens train-sae failed: {}", String::from_utf8_lossy(&ours.stderr));
        }
        let lines: Vec<serde_json::Value> =
            std::fs::read_to_string(out_dir.join("metrics.jsonl"))?.lines().map(serde_json::from_str).collect::<Result<_, _>>()?;
        // Over the steady steps (from the third on): seconds per step, in all and in the store.
        let steady =
            |key: &str| (lines[lines.len() - 1][key].as_f64().unwrap_or(f64::NAN) - lines[1][key].as_f64().unwrap_or(f64::NAN)) / (lines.len() - 2) as f64;
        let per_step = steady("elapsed_s");
        // The SAE step's products: the encoder's alone for the sparse (TopK) passes, five
        // of that size for the dense ones.
        let products = 2.0 * 4096.0 * 768.0 * 24576.0 * if arch.contains("topk") { 1.0 } else { 5.0 };
        let b = serde_json::json!({"impl": "burnlens", "arch": arch, "seconds_per_step": per_step, "model_s_per_step": steady("store_s"), "sae_gflop": products / 1e9, "activations_per_s": 4096.0 / per_step, "peak_rss": peak()});
        let peer = Command::new("/usr/bin/time")
            .args(["-f", "%M", "-o"])
            .arg(&rss_file)
            .arg(&py)
            .current_dir(root())
            .args(["scripts/bench_sae.py"])
            .arg(&model)
            .args([arch, &steps.to_string(), d_sae, k, hook, &threads])
            .output()?;
        let mut p: serde_json::Value = serde_json::from_str(String::from_utf8_lossy(&peer.stdout).lines().last().unwrap_or("{}"))?;
        p["peak_rss"] = peak().into();
        let ratio = p["seconds_per_step"].as_f64().unwrap_or(f64::NAN) / per_step;
        for (v, r) in [(&b, format!("{ratio:.2}x")), (&p, String::new())] {
            let f = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
            let (step, model) = (f("seconds_per_step"), f("model_s_per_step"));
            let rate = if v["sae_gflop"].is_null() {
                String::from("–")
            } else {
                format!("{:.0} GFLOP, {:.0} GFLOP/s", f("sae_gflop"), f("sae_gflop") / (step - model))
            };
            table.push_str(&format!(
                "| {arch} | {} | {step:.2} | {model:.2} | {:.2} | {rate} | {:.0} | {:.2} GB | {r} |\n",
                v["impl"].as_str().unwrap_or("?"),
                step - model,
                f("activations_per_s"),
                f("peak_rss") / 1e9
            ));
        }
        println!("{b}\n{p}");
        results.push(b);
        results.push(p);
    }
    println!("\n{table}");
    std::fs::write(
        root().join("target/bench/sae.json"),
        serde_json::to_string_pretty(&serde_json::json!({"machine": machine.text, "results": results, "table": table}))?,
    )?;
    Ok(())
}

/// Attribution graphs against circuit-tracer (`scripts/bench_trace.py`): GPT-2 small's
/// shape with random 24,576-feature transcoders (`target/trace-bench`, made once), the same
/// token prompt of each length, `max_feature_nodes` 512, each tool at the batch sizes given
/// (its best is reported), one process per run so the peak RSS is that run's. Arguments:
/// prompt lengths (default 64 256 1024). Writes `target/bench/trace.json` and prints a table.
fn bench_trace(args: Vec<String>) -> Result<()> {
    let py = venv_trace()?;
    let dir = root().join("target/trace-bench");
    if !dir.join("transcoders/config.yaml").is_file() {
        run(Command::new(&py).current_dir(root()).args(["scripts/bench_trace.py", "make"]).arg(&dir))?;
    }
    run(Command::new(env!("CARGO")).current_dir(root()).args(["build", "--quiet", "--bin", "burnlens"]))?;
    let bin = root().join("target/debug/burnlens");
    let machine = machine_report(&bin)?;
    println!("{}", machine.text);
    let lengths: Vec<usize> = if args.is_empty() { vec![64, 256, 1024] } else { args.iter().map(|a| a.parse()).collect::<Result<_, _>>()? };
    let max_features = "512";
    let mut results = Vec::new();
    let mut table =
        String::from("| tokens | tool | batch size | attribution | peak RSS | active features | burnlens faster by |\n|---|---|---|---|---|---|---|\n");
    for n in lengths {
        let ids = String::from_utf8(Command::new(&py).current_dir(root()).args(["scripts/bench_trace.py", "prompt", &n.to_string()]).output()?.stdout)?
            .trim()
            .to_string();
        let mut best: Vec<(String, serde_json::Value)> = Vec::new();
        // circuit-tracer keeps every layer's attention pattern for each batch element: smaller
        // batches at long prompts, or it runs out of memory.
        let peer_batches: &[usize] = if n >= 1024 { &[8] } else { &[16, 64] };
        for &b in peer_batches {
            let v = run_json(Command::new(&py).current_dir(root()).args(["scripts/bench_trace.py", "run"]).arg(&dir).args([
                n.to_string(),
                b.to_string(),
                max_features.into(),
            ]))
            .unwrap_or_else(|e| serde_json::json!({"tool": "circuit-tracer", "batch": b, "failed": format!("{e:#}").lines().last().unwrap_or("").to_string()}));
            println!("{n} tokens circuit-tracer: {v}");
            results.push(v.clone());
            best.push(("circuit-tracer".into(), v));
        }
        for b in [16usize, 64] {
            let rss_file = root().join("target/bench/trace-rss.txt");
            std::fs::create_dir_all(root().join("target/bench"))?;
            let out = Command::new("/usr/bin/time")
                .args(["-f", "%M", "-o"])
                .arg(&rss_file)
                .arg(&bin)
                .args(["graph", "--model"])
                .arg(dir.join("model"))
                .arg("--transcoders")
                .arg(dir.join("transcoders"))
                .args(["--ids", &ids, "--batch-size", &b.to_string(), "--max-feature-nodes", max_features, "--out"])
                .arg(root().join("target/bench/trace-graph"))
                .output()?;
            let text = String::from_utf8_lossy(&out.stdout).to_string();
            let seconds = text.split("attributed in ").nth(1).and_then(|t| t.split(' ').next()).and_then(|t| t.parse::<f64>().ok());
            let active = text.split(" active features").next().and_then(|t| t.rsplit(' ').next()).and_then(|t| t.parse::<u64>().ok());
            let rss_kb: f64 = std::fs::read_to_string(&rss_file).ok().and_then(|t| t.lines().last().and_then(|l| l.trim().parse().ok())).unwrap_or(f64::NAN);
            let v = match (out.status.success(), seconds) {
                (true, Some(s)) => {
                    serde_json::json!({"tool": "burnlens", "tokens": n, "batch": b, "seconds": s, "peak_rss": rss_kb * 1024.0, "active_features": active})
                }
                _ => {
                    serde_json::json!({"tool": "burnlens", "tokens": n, "batch": b, "failed": String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or("").to_string()})
                }
            };
            println!("{n} tokens burnlens: {v}");
            results.push(v.clone());
            best.push(("burnlens".into(), v));
        }
        let fastest = |tool: &str| {
            best.iter()
                .filter(|(t, v)| t == tool && v["seconds"].is_number())
                .map(|(_, v)| v.clone())
                .min_by(|a, b| a["seconds"].as_f64().unwrap().total_cmp(&b["seconds"].as_f64().unwrap()))
        };
        let (ours, theirs) = (fastest("burnlens"), fastest("circuit-tracer"));
        for (name, v) in [("burnlens", &ours), ("circuit-tracer", &theirs)] {
            match v {
                Some(v) => {
                    let ratio = match (name, &ours, &theirs) {
                        ("burnlens", Some(o), Some(t)) => format!("{:.1}x", t["seconds"].as_f64().unwrap() / o["seconds"].as_f64().unwrap()),
                        _ => String::new(),
                    };
                    table.push_str(&format!(
                        "| {n} | {name} | {} | {:.1} s | {:.2} GB | {} | {ratio} |\n",
                        v["batch"],
                        v["seconds"].as_f64().unwrap(),
                        v["peak_rss"].as_f64().unwrap_or(f64::NAN) / 1e9,
                        v["active_features"]
                    ));
                }
                None => table.push_str(&format!("| {n} | {name} | | failed | | | |\n")),
            }
        }
    }
    std::fs::write(root().join("target/bench/trace.json"), serde_json::to_string_pretty(&serde_json::json!({"machine": machine.text, "results": results}))?)?;
    println!("\n{table}");
    Ok(())
}

/// The Python API against TransformerLens on GPT-2 small (`scripts/bench_python.py`): the
/// extension as the tests build it (dev profile, dependencies optimised as in release),
/// staged with the Python package into `target/bench/py`. Writes `target/bench/python.json`.
/// Models at the sizes interpretability works on, in bf16 (`scripts/make_scale_checkpoints.py`:
/// random weights with the shapes of Llama 3.1 8B and Gemma 2 9B, sharded as transformers
/// saves them, in `target/scale`, never committed): burnlens (`bench scale`: load, a
/// 128-token forward, a cache of every `hook_resid_post`, 32 greedy decoding steps) and
/// transformers in bf16 on the same checkpoint and threads, one after the other.
fn bench_scale(args: Vec<String>) -> Result<()> {
    let py = venv()?;
    let dir = root().join("target/scale");
    let models: Vec<String> = if args.is_empty() { vec!["llama31_8b".into(), "gemma2_9b".into()] } else { args };
    for m in &models {
        if !dir.join(m).join("model.safetensors.index.json").is_file() {
            run(Command::new(&py).current_dir(root()).args(["scripts/make_scale_checkpoints.py", "--out"]).arg(&dir).args(["--only", m]))?;
        }
    }
    run(Command::new(env!("CARGO")).current_dir(root()).args(["build", "--quiet", "--bin", "burnlens"]))?;
    let bin = root().join("target/debug/burnlens");
    let machine = machine_report(&bin)?;
    println!("{}", machine.text);
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).to_string();
    let mut table = String::from(
        "| model | impl | checkpoint | load | peak RSS (x checkpoint) | first forward | forward 128 tok | GFLOP/s (% of GEMM rate) | cache resid_post | decode 32 | decode GB/s (% of read bandwidth from 4 KB pages) |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for m in &models {
        let path = dir.join(m);
        let ours = run_json(Command::new(&bin).arg("bench").arg("scale").arg("--model").arg(&path).args(["--seq", "128", "--new-tokens", "32"]))?;
        println!("{m} burnlens: {ours}");
        // The same with bf16 arithmetic in the products (`--compute bf16`).
        let ours_bf16 =
            run_json(Command::new(&bin).arg("bench").arg("scale").arg("--model").arg(&path).args(["--seq", "128", "--new-tokens", "32", "--compute", "bf16"]))?;
        println!("{m} burnlens --compute bf16: {ours_bf16}");
        let size = ours["checkpoint_bytes"].as_f64().unwrap_or(f64::NAN);
        let (flops, bytes) = (ours["flops"].as_f64().unwrap_or(f64::NAN), ours["weight_bytes_per_token"].as_f64().unwrap_or(f64::NAN));
        let theirs = run_json(Command::new(&py).current_dir(root()).args(["scripts/peer_scale.py", "--model"]).arg(&path).args([
            "--seq",
            "128",
            "--new",
            "32",
            "--threads",
            &threads,
        ]));
        let theirs = match theirs {
            Ok(v) => v,
            Err(e) => {
                println!("{m} transformers failed: {e:#}");
                serde_json::json!({"failed": format!("{e:#}").lines().last().unwrap_or("").to_string()})
            }
        };
        println!("{m} transformers: {theirs}");
        for (name, v) in [("burnlens", &ours), ("burnlens --compute bf16", &ours_bf16), ("transformers bf16", &theirs)] {
            if let Some(why) = v["failed"].as_str() {
                table.push_str(&format!("| {m} | {name} | {:.2} GB | failed: {why} ||||||||\n", size / 1e9));
                continue;
            }
            let f = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
            let fwd = floats(v, "times")?.first().copied().unwrap_or(f64::NAN);
            let decode = f("decode_s") / f("decode_tokens");
            table.push_str(&format!(
                "| {m} | {name} | {:.2} GB | {:.1} s | {:.2} GB ({:.2}x) | {:.1} s | {:.1} s ({:.1} tok/s) | {:.0} ({:.0}%) | {:.1} s | {:.2} s/token ({:.2} tok/s) | {:.1} GB/s ({:.0}%) |\n",
                size / 1e9,
                f("load_s"),
                f("peak_rss_bytes") / 1e9,
                f("peak_rss_bytes") / size,
                f("first_forward_s"),
                fwd,
                128.0 / fwd,
                flops / fwd / 1e9,
                100.0 * flops / fwd / 1e9 / machine.gemm_gflops,
                f("cache_s"),
                decode,
                1.0 / decode,
                bytes / decode / 1e9,
                100.0 * bytes / decode / 1e9 / machine.read_gbps_heap
            ));
        }
    }
    println!("\n{table}");
    let out_dir = root().join("target/bench");
    std::fs::create_dir_all(&out_dir)?;
    std::fs::write(out_dir.join("scale.md"), format!("{}\n\n{table}", machine.text))?;
    println!("written to {}", out_dir.join("scale.md").display());
    Ok(())
}

/// Pairs of burnlens runs for [`paired_half_ratio`].
const PAIRS: usize = 5;

/// bf16 weights against f32 ones, measured in pairs: the bf16 workload and the same
/// workload with `--dtype f32` run one right after the other, [`PAIRS`] times; the median of
/// the pairs' speed ratios. (The table's rows run minutes apart, and on the 2-vCPU virtual
/// machines the second core is sometimes slow to take work for minutes at a time — the
/// kernel pool's revoked seats show it — which moved a row's time by 20%.)
fn paired_half_ratio(bin: &Path, wl: &Workload) -> Result<f64> {
    let mut f32_args = wl.burnlens.clone();
    let i = f32_args.iter().position(|a| a == "--dtype").context("a bf16 workload names --dtype")?;
    f32_args[i + 1] = "f32".into();
    let mut ratios = Vec::new();
    for _ in 0..PAIRS {
        let full = median(floats(&run_json(Command::new(bin).arg("bench").args(&f32_args))?, "times")?);
        let half = median(floats(&run_json(Command::new(bin).arg("bench").args(&wl.burnlens))?, "times")?);
        ratios.push(full / half);
    }
    Ok(median(ratios))
}

fn bench_python() -> Result<()> {
    let py = venv_with_sae_lens()?;
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

/// What the Python API's tests run with: `.venv/bin/python` (made if missing) with numpy
/// and pytest (installed if missing; torch is not needed for them).
fn ensure_python_tests() -> Result<PathBuf> {
    let venv = root().join(".venv");
    let python = venv.join("bin/python");
    if !python.exists() {
        run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
    }
    let ready = Command::new(&python).args(["-c", "import numpy, pytest"]).status().map(|s| s.success()).unwrap_or(false);
    if !ready {
        run(Command::new(&python).args(["-m", "pip", "install", "--quiet", "numpy", "pytest"]))?;
    }
    Ok(python)
}

/// The README's test command: chromium for the browser tests, a Python with numpy and
/// pytest for the Python API's tests, then `cargo test` (which runs the pytest suite too).
/// The formatting check: `cargo fmt --check` with the repository's `rustfmt.toml`, rustfmt
/// installed through rustup first where it is missing.
fn check_format() -> Result<()> {
    let has_fmt = || Command::new(env!("CARGO")).args(["fmt", "--version"]).output().map(|o| o.status.success()).unwrap_or(false);
    if !has_fmt() {
        run(Command::new("rustup").args(["component", "add", "rustfmt"]))?;
    }
    run(Command::new(env!("CARGO")).current_dir(root()).args(["fmt", "--all", "--check"])).context("the code is not formatted: run `cargo fmt --all`")
}

/// Clippy on every crate, test and example with the features the tests build, warnings as
/// errors (the lints allowed are listed, with reasons, in the workspace's Cargo.toml). A
/// check build: it shares no artifacts with the test build, and checks Burn in about two
/// minutes on two cores.
fn check_lints(features: &[&str]) -> Result<()> {
    let has_clippy = || Command::new(env!("CARGO")).args(["clippy", "--version"]).output().map(|o| o.status.success()).unwrap_or(false);
    if !has_clippy() {
        run(Command::new("rustup").args(["component", "add", "clippy"]))?;
    }
    run(Command::new(env!("CARGO")).current_dir(root()).args(["clippy", "--workspace", "--all-targets"]).args(features).args(["--", "-D", "warnings"]))
        .context("clippy found warnings: fix them (or allow the lint, with its reason, in Cargo.toml's [workspace.lints.clippy])")
}

fn test(args: Vec<String>) -> Result<()> {
    if args.is_empty() {
        check_format()?;
    }
    ensure_browser()?;
    // One build, with the `mpi` feature, for every test and rerun below: a second feature
    // set would rebuild every crate above burnlens-train.
    let features: &[&str] = if ensure_mpi() { &["--features", "mpi"] } else { &[] };
    let python = ensure_python_tests()?;
    if args.is_empty() {
        check_lints(features)?;
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
        rerun(&["--test", "parity", "--test", "half", "--test", "bf16_compute"])?;
    }
    Ok(())
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
        "sae-fixtures" => {
            let py = venv_with_sae_lens()?;
            // SAEs trained by burnlens (TopK, and BatchTopK saved as JumpReLU) on a model trained
            // by burnlens, for sae-lens to read.
            let mut specs = Vec::new();
            for arch in ["topk", "batchtopk"] {
                let trained = root().join(format!("target/sae-export/{arch}_trained_gpt2_char"));
                let _ = std::fs::remove_dir_all(&trained);
                run(Command::new("cargo")
                    .current_dir(root())
                    .args([
                        "run",
                        "--quiet",
                        "--",
                        "train-sae",
                        "--model",
                        "tests/fixtures/trained_gpt2_char",
                        "--hook",
                        "blocks.1.hook_resid_pre",
                        "--architecture",
                        arch,
                        "--k",
                        "8",
                        "--d-sae",
                        "96",
                        "--steps",
                        "400",
                        "--batch",
                        "8",
                        "--seq-len",
                        "24",
                        "--seed",
                        "3",
                        "--out",
                    ])
                    .arg(&trained))?;
                specs.push(format!("burnlens_{arch}_trained_gpt2_char={}@trained_gpt2_char", trained.join("sae").display()));
            }
            run(Command::new(&py).current_dir(root()).arg("scripts/gen_sae_fixtures.py").args(&specs))?;
            // A Gemma Scope SAE in its release layout (params.npz), read by sae-lens's own loader.
            run(Command::new(&py).current_dir(root().join("scripts")).arg("gen_gemma_scope_fixture.py"))?;
            // TransformerLens (a dependency of sae-lens) on the gpt2 fixture: gradients,
            // patching, direct logit attribution, the logit lens.
            run(Command::new(&py).current_dir(root()).arg("scripts/gen_tl_fixtures.py"))?;
            // TransformerLens's caches on the newer families (QK-norm, post-norms, soft-caps).
            run(Command::new(py).current_dir(root()).arg("scripts/gen_tl_family_fixtures.py"))?;
        }
        "features-fixtures" => {
            // SAELens's own windows (tests/fixtures/data) and training steps
            // (tests/fixtures/sae_train); pyarrow writes the parquet corpora.
            let py = venv_with_sae_lens()?;
            run(Command::new(&py).args(["-m", "pip", "install", "--quiet", "pyarrow"]))?;
            run(Command::new(&py).current_dir(root()).arg("scripts/gen_data_fixtures.py"))?;
            run(Command::new(&py).current_dir(root()).arg("scripts/gen_sae_train_fixtures.py"))?;
            run(Command::new(py).current_dir(root()).arg("scripts/gen_sae_eval_fixtures.py"))?;
        }
        "half-fixtures" => {
            // bf16 copies of every family's fixture, with transformers' f32 run on each.
            let py = venv()?;
            run(Command::new(&py).current_dir(root()).args(["scripts/gen_half_fixtures.py", "--fixtures", "tests/fixtures"]))?;
            // transformers in bfloat16 on each copy, for the bf16-compute tests.
            run(Command::new(&py).current_dir(root()).args(["scripts/gen_bf16_compute_fixtures.py", "--fixtures", "tests/fixtures"]))?;
        }
        "trace-fixtures" => {
            // circuit-tracer's attribution graphs on tiny models with random transcoders.
            let py = venv_trace()?;
            // Transcoders trained by burnlens on the gpt2 case's model (JumpReLU, resid_mid ->
            // mlp_out): a per-layer set with W_skip for the gpt2_trained case, a cross-layer
            // transcoder for gpt2_clt_trained.
            let train = |dir: &str, kind: &str, d_sae: &str, seed: &str| -> Result<PathBuf> {
                let out = root().join(dir);
                let _ = std::fs::remove_dir_all(&out);
                run(Command::new("cargo")
                    .current_dir(root())
                    .args(["run", "--quiet", "--", "train-sae", "--model", "tests/fixtures/trace/gpt2/model", "--transcoders", kind])
                    .args(["--transcoder-input", "hook_resid_mid", "--transcoder-output", "hook_mlp_out", "--architecture", "jumprelu", "--l1", "0"])
                    .args(["--d-sae", d_sae, "--steps", "200", "--batch", "4", "--seq-len", "16", "--seed", seed, "--out"])
                    .arg(&out))?;
                Ok(out)
            };
            let trained = train("target/trained-transcoders", "--skip", "40", "4")?;
            let clt = train("target/trained-clt", "--cross-layer", "24", "5")?;
            run(Command::new(py)
                .current_dir(root())
                .args(["scripts/gen_trace_fixtures.py"])
                .args(std::env::args().skip(2))
                .env("BURNLENS_TRAINED_TRANSCODERS", trained.join("transcoders"))
                .env("BURNLENS_TRAINED_CLT", clt.join("transcoders")))?;
        }
        "dashboard-fixtures" => {
            // SAEDashboard's feature data on the gpt2 fixture with random SAEs.
            let py = venv_dash()?;
            run(Command::new(py).current_dir(root()).arg("scripts/gen_dashboard_fixtures.py"))?;
        }
        "test" => test(std::env::args().skip(2).collect())?,
        "bench-train" => bench_train()?,
        "bench" => bench(std::env::args().skip(2).collect())?,
        "bench-python" => bench_python()?,
        "bench-scale" => bench_scale(std::env::args().skip(2).collect())?,
        "bench-bf16" => bench_bf16::bench_bf16()?,
        "bench-trace" => bench_trace(std::env::args().skip(2).collect())?,
        "bench-sae" => bench_sae(std::env::args().skip(2).collect())?,
        "bench-dashboards" => bench_dashboards(std::env::args().skip(2).collect())?,
        "bench-mpi" => bench_mpi(std::env::args().skip(2).collect())?,
        "parity-tch" => parity_tch(std::env::args().skip(2).collect())?,
        _ => bail!(
            "usage: cargo xtask <test [CARGO TEST ARGS]|fixtures|half-fixtures|sae-fixtures|features-fixtures|trace-fixtures [CASE...]|dashboard-fixtures|venv|bench [WORKLOAD...]|bench-train|bench-scale [MODEL...]|bench-bf16|bench-trace [TOKENS...]|bench-sae [STEPS] [ARCH...]|bench-dashboards [TOKENS] [FEATURES]|bench-mpi [STEPS] [GPT2_STEPS]|parity-tch>"
        ),
    }
    Ok(())
}
