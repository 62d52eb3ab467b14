//! `cargo xtask bench`: the model's workloads (forward, decoding, training steps, attention)
//! against HF transformers, the lean PyTorch model and `torch.compile`.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result};

use crate::machine::machine_report;
use crate::process::{floats, median, root, run, run_json};
use crate::rounds::{Rounds, order, rounds_option};
use crate::tch::tch_env;
use crate::venvs::{Venv, python};

/// One benchmark row: the same workload for burnlens and the PyTorch peers.
pub(crate) struct Workload {
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
pub(crate) enum Impl {
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
pub(crate) struct BusyNeighbour(std::process::Child);

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

/// Every workload on burnlens, HF `transformers`, the lean PyTorch model and (forward,
/// training) the lean model under `torch.compile`, alternating, same weights (a random GPT-2
/// small saved by `transformers`), same threads; the training step again beside a busy
/// neighbour process. Writes `target/bench/report.md`.
pub(crate) fn bench(args: Vec<String>) -> Result<()> {
    let with_tch = args.iter().any(|a| a == "--tch");
    let (rounds_override, args) = rounds_option(args)?;
    let only: Vec<String> = args.into_iter().filter(|a| a != "--tch").collect();
    let py = python(Venv::Main)?;
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
        Workload { label: label.into(), burnlens: burn, peer, rounds: rounds_override.unwrap_or(rounds), compile, contended: false }
    };
    let mut workloads = vec![
        w("forward 1x128", &["forward", "--batch", "1", "--seq", "128", "--reps", "3"], 3),
        w("forward 4x256", &["forward", "--batch", "4", "--seq", "256", "--reps", "2"], 2),
        w("generate 16+64 (KV cache)", &["generate", "--new", "64", "--reps", "1"], 2),
        // The same weights kept in bf16 (PyTorch peers in bf16 too).
        w("generate 16+64 bf16 (KV cache)", &["generate", "--new", "64", "--reps", "1", "--dtype", "bf16"], 2),
        w("forward 1x128 bf16", &["forward", "--batch", "1", "--seq", "128", "--reps", "3", "--dtype", "bf16"], 3),
        // The same, with burnlens's products in bf16 as PyTorch's are (`--compute bf16`: bf16
        // products accumulated in f32, where the CPU's bf16 path is faster than f32; the
        // rest of the pass stays f32 — PyTorch keeps its activations in bf16 too).
        Workload {
            label: "forward 1x128 bf16 compute".into(),
            burnlens: ["forward", "--batch", "1", "--seq", "128", "--reps", "3", "--dtype", "bf16", "--compute", "bf16", "--model", &m]
                .map(String::from)
                .to_vec(),
            ..w("", &["forward", "--batch", "1", "--seq", "128", "--reps", "3", "--dtype", "bf16"], 3)
        },
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
        let mut results: Vec<(Impl, Rounds, serde_json::Value)> = impls.iter().map(|&i| (i, Rounds::default(), serde_json::Value::Null)).collect();
        for round in 0..wl.rounds {
            for i in order(results.len(), round) {
                let (which, times, last) = &mut results[i];
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
                times.push(floats(&v, "times")?);
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
            let t = times.median();
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
        // Speed ratios (above 1: burnlens faster), each the median of the rounds' own
        // ratios: a slow minute of the machine moves one round, not the row.
        let times_of = |which: Impl| &results.iter().find(|r| r.0 == which).expect("it ran").1;
        let ratio = |peer: Impl| times_of(peer).ratio_to(times_of(Impl::Burnlens));
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
            Some((_, cc)) => (cc.clone(), ratio(Impl::Compile)),
            None => ("-".into(), "-".into()),
        };
        table.push_str(&format!("| {} | {cb} | {ch} | {cl} | {cc} | {} | {} | {rc} | {rates} |", wl.label, ratio(Impl::Hf), ratio(Impl::Lean)));
        if let Some((_, ct)) = cell(Impl::Tch) {
            table.push_str(&format!(" {ct} | {} |", times_of(Impl::Lean).ratio_to(times_of(Impl::Tch))));
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
    for (f32_row, bf16_row, target) in [
        ("generate 16+64 (KV cache)", "generate 16+64 bf16 (KV cache)", "≥ 1.8x"),
        ("forward 1x128", "forward 1x128 bf16", "≥ 0.9x"),
        ("forward 1x128", "forward 1x128 bf16 compute", "≥ 1.7x where the bf16 path is chosen, else ≥ 1.0x"),
    ] {
        if let (Some(a), Some(b)) = (time_of(f32_row), time_of(bf16_row)) {
            let paired = paired_half_ratio(&bin, workloads.iter().find(|w| w.label == bf16_row).expect("the row ran"))?;
            let what = if bf16_row.ends_with("compute") { "bf16 weights and `--compute bf16`" } else { "bf16 weights" };
            notes.push_str(&format!(
                "- {bf16_row}: burnlens with {what} at **{:.2}x** its speed with f32 weights (rows above; target {target}); \
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
            let (mut ours, mut repacking, mut theirs, mut blas) = (Rounds::default(), Rounds::default(), Rounds::default(), Rounds::default());
            for round in 0..rounds_override.unwrap_or(3) {
                for side in order(3, round) {
                    match side {
                        0 => {
                            let v = run_json(Command::new(&bin).args(["bench", "gemm", "--shape", shape, "--reps", "20"]))?;
                            ours.push(floats(&v, "times")?);
                            repacking.push(floats(&v, "times_repacking")?);
                        }
                        1 => {
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
                            theirs.push(floats(&v, "times")?);
                        }
                        _ => {
                            let v = run_json(
                                Command::new(&py)
                                    .current_dir(root())
                                    .args(["scripts/peer_nanogpt.py", "gemm", "--impl", "openblas", "--shape", shape, "--reps", "20"])
                                    .env("OPENBLAS_NUM_THREADS", &threads),
                            )?;
                            blas_name = v["blas"].as_str().unwrap_or("OpenBLAS").to_string();
                            blas.push(floats(&v, "times")?);
                        }
                    }
                }
            }
            let dims: Vec<f64> = shape.trim_end_matches('t').split('x').filter_map(|d| d.parse().ok()).collect();
            let flops = 2.0 * dims.iter().product::<f64>();
            let rate = |t: &Rounds| flops / t.median() / 1e9;
            let (a, r, b, o) = (rate(&ours), rate(&repacking), rate(&theirs), rate(&blas));
            println!("gemm {shape}: burnlens {a:.0} GFLOP/s (repacking {r:.0}) | torch.matmul {b:.0} GFLOP/s | {blas_name} {o:.0} GFLOP/s");
            gemm_table.push_str(&format!("| {shape} | {what} | {a:.0} | {r:.0} | {b:.0} | {o:.0} | {} | {} |\n", theirs.ratio_to(&ours), blas.ratio_to(&ours)));
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

/// Pairs of burnlens runs for [`paired_half_ratio`].
pub(crate) const PAIRS: usize = 5;

/// bf16 weights against f32 ones, measured in pairs: the bf16 workload and the same
/// workload with `--dtype f32` (and f32 compute) run one right after the other, [`PAIRS`]
/// times, either first in turn; the median of the pairs' speed ratios. (The table's rows run
/// minutes apart, and on the 2-vCPU virtual machines the second core is sometimes slow to
/// take work for minutes at a time — the kernel pool's revoked seats show it — which moved a
/// row's time by 20%.)
pub(crate) fn paired_half_ratio(bin: &Path, wl: &Workload) -> Result<f64> {
    let mut f32_args = wl.burnlens.clone();
    let i = f32_args.iter().position(|a| a == "--dtype").context("a bf16 workload names --dtype")?;
    f32_args[i + 1] = "f32".into();
    // The f32 side computes in f32 too.
    if let Some(j) = f32_args.iter().position(|a| a == "--compute") {
        f32_args.drain(j..j + 2);
    }
    let mut ratios = Vec::new();
    for pair in 0..PAIRS {
        // Either side first in turn ([`crate::rounds::order`]).
        let mut times = [0.0; 2];
        for side in crate::rounds::order(2, pair) {
            let args = if side == 0 { &f32_args } else { &wl.burnlens };
            times[side] = median(floats(&run_json(Command::new(bin).arg("bench").args(args))?, "times")?);
        }
        ratios.push(times[0] / times[1]);
    }
    Ok(median(ratios))
}
