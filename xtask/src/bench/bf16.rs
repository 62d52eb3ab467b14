//! `cargo xtask bench-bf16`: bf16 compute (`--compute bf16`) against f32 and against
//! PyTorch's bf16 in the same run — the products alone (burnlens's GEMM against
//! `torch.matmul` on bf16 tensors, oneDNN), training steps (against `torch.autocast` bf16 in
//! the lean nanoGPT peer), the nanoGPT shakespeare-char config trained for its 2,000 steps in
//! both dtypes (final validation losses), and an attribution graph (f32 against bf16).
//! The 8B-shaped forward passes against transformers bf16 are `cargo xtask bench-scale`'s
//! rows. Writes `target/bench/bf16.md`.

use std::process::Command;

use anyhow::Result;

use crate::machine::machine_report;
use crate::process::{data_dir, floats, root, run, run_json};
use crate::rounds::{Rounds, alternate, rounds_option};
use crate::venvs::{Venv, python};

/// The product shapes: a Llama-3.1-8B-shaped prefill of 128 tokens, GPT-2 small's forward
/// and its training step's products.
const GEMMS: [(&str, &str); 9] = [
    ("128x4096x4096", "8B attention q / out"),
    ("128x4096x14336", "8B MLP gate / up"),
    ("128x14336x4096", "8B MLP down"),
    ("128x4096x128256t", "8B unembedding"),
    ("128x768x2304", "GPT-2 qkv, forward 1x128"),
    ("128x3072x768", "GPT-2 MLP out"),
    ("1024x768x3072", "GPT-2 MLP in, 4x256"),
    ("256x768x50257t", "GPT-2 unembedding, training"),
    ("1536x1536x1536", "square"),
];

/// `[--rounds N]`: the products and training steps, their four sides alternating round by
/// round (each round starting with the next side) for N rounds (default 2), each ratio the
/// median of the rounds' own.
pub(crate) fn bench_bf16(args: Vec<String>) -> Result<()> {
    let (rounds, _) = rounds_option(args)?;
    let rounds = rounds.unwrap_or(2);
    let py = python(Venv::Main)?;
    run(Command::new(env!("CARGO")).current_dir(root()).args(["build", "--quiet", "--bin", "burnlens"]))?;
    let bin = root().join("target/debug/burnlens");
    let machine = machine_report(&bin)?;
    println!("{}", machine.text);
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).to_string();
    let mut report = format!("{}\n\n", machine.text);

    report.push_str(
        "| GEMM m×k×n | what | burnlens f32 GFLOP/s | burnlens bf16 | torch.matmul f32 | torch.matmul bf16 | burnlens bf16 / f32 | burnlens bf16 / torch bf16 |\n|---|---|---|---|---|---|---|---|\n",
    );
    for (shape, what) in GEMMS {
        let t = four_sides(rounds, &bin, &py, &["gemm", "--shape", shape, "--reps", "10"], &["gemm", "--shape", shape, "--reps", "10", "--threads", &threads])?;
        let dims: Vec<f64> = shape.trim_end_matches('t').split('x').filter_map(|d| d.parse().ok()).collect();
        let flops = 2.0 * dims.iter().product::<f64>();
        let [a, b, c, d] = [0, 1, 2, 3].map(|i| flops / t[i].median() / 1e9);
        println!("gemm {shape}: burnlens f32 {a:.0} bf16 {b:.0} | torch f32 {c:.0} bf16 {d:.0} GFLOP/s");
        report.push_str(&format!("| {shape} | {what} | {a:.0} | {b:.0} | {c:.0} | {d:.0} | {} | {} |\n", t[0].ratio_to(&t[1]), t[3].ratio_to(&t[1])));
    }

    report.push_str(
        "\n| training step | burnlens f32 | burnlens bf16 | torch f32 | torch autocast bf16 | burnlens bf16 / f32 | burnlens bf16 / torch bf16 |\n|---|---|---|---|---|---|---|\n",
    );
    for (shape, peer_shape) in [("shakespeare-char", "shakespeare-char"), ("gpt2", "gpt2")] {
        let t = four_sides(
            rounds,
            &bin,
            &py,
            &["train", "--train-shape", shape, "--reps", "2"],
            &["train-steps", "--train-shape", peer_shape, "--reps", "2", "--threads", &threads],
        )?;
        let [a, b, c, d] = [0, 1, 2, 3].map(|i| t[i].median());
        println!("train {shape}: burnlens f32 {a:.3} s bf16 {b:.3} s | torch f32 {c:.3} s autocast {d:.3} s");
        report.push_str(&format!(
            "| {shape} | {:.0} ms | {:.0} ms | {:.0} ms | {:.0} ms | {} | {} |\n",
            a * 1e3,
            b * 1e3,
            c * 1e3,
            d * 1e3,
            t[0].ratio_to(&t[1]),
            t[3].ratio_to(&t[1])
        ));
    }

    report.push_str(&shakespeare_run(&bin)?);
    report.push_str(&attribution(&bin)?);
    let out = root().join("target/bench/bf16.md");
    std::fs::create_dir_all(out.parent().expect("a parent"))?;
    std::fs::write(&out, &report)?;
    println!("\n{report}\nwritten to {}", out.display());
    Ok(())
}

/// burnlens f32, burnlens bf16, torch f32, torch bf16 ([`alternate`]): `burnlens bench OURS
/// --compute C` and the lean peer's `THEIRS --dtype C`, their times by round.
fn four_sides(rounds: usize, bin: &std::path::Path, py: &std::path::Path, ours: &[&str], theirs: &[&str]) -> Result<Vec<Rounds>> {
    alternate(rounds, 4, |side| {
        let compute = ["f32", "bf16"][side % 2];
        let v = if side < 2 {
            run_json(Command::new(bin).arg("bench").args(ours).args(["--compute", compute]))?
        } else {
            peer(py, &[theirs, &["--dtype", compute]].concat())?
        };
        floats(&v, "times")
    })
}

/// The lean PyTorch peer (`scripts/peer_nanogpt.py CMD --impl lean ...`), its JSON report.
fn peer(py: &std::path::Path, args: &[&str]) -> Result<serde_json::Value> {
    run_json(Command::new(py).current_dir(root()).arg("scripts/peer_nanogpt.py").arg(args[0]).args(["--impl", "lean"]).args(&args[1..]))
}

/// nanoGPT's CPU shakespeare-char config, all 2,000 steps, in f32 and in bf16.
fn shakespeare_run(bin: &std::path::Path) -> Result<String> {
    let data = data_dir();
    let mut out = String::from("\n| shakespeare-char, 2,000 steps | final train loss | final validation loss | wall time |\n|---|---|---|---|\n");
    let mut losses = Vec::new();
    for compute in ["f32", "bf16"] {
        let dir = root().join(format!("target/bench/shakespeare-{compute}"));
        let _ = std::fs::remove_dir_all(&dir);
        let o = Command::new(bin)
            .args(["train", "--config", "configs/shakespeare-char-cpu.toml", "--quiet", "--compute", compute, "--set"])
            .arg(format!("data.path={:?}", data.join("tinyshakespeare.txt").display().to_string()))
            .arg("--set")
            .arg(format!("output.dir={:?}", dir.display().to_string()))
            .current_dir(root())
            .output()?;
        let text = String::from_utf8_lossy(&o.stdout).to_string();
        anyhow::ensure!(o.status.success(), "shakespeare-char in {compute}: {}", String::from_utf8_lossy(&o.stderr));
        let after = |key: &str| text.rsplit(key).next().and_then(|t| t.split(|c: char| !(c.is_ascii_digit() || c == '.')).next()).unwrap_or("?").to_string();
        let (train, val, secs) = (after("final train loss "), after("validation loss "), after(" steps in "));
        println!("shakespeare-char {compute}: train {train} val {val} in {secs} s");
        losses.push(val.parse::<f64>().unwrap_or(f64::NAN));
        out.push_str(&format!("| {compute} | {train} | {val} | {secs} s |\n"));
    }
    out.push_str(&format!("\nbf16's final validation loss is {:+.3}% of f32's.\n", 100.0 * (losses[1] / losses[0] - 1.0)));
    Ok(out)
}

/// `burnlens graph` on the trace benchmark's model (`cargo xtask bench-trace` makes it) at
/// 256 tokens, in f32 and in bf16.
fn attribution(bin: &std::path::Path) -> Result<String> {
    let py = python(Venv::Trace)?;
    let dir = root().join("target/trace-bench");
    if !dir.join("transcoders/config.yaml").is_file() {
        run(Command::new(&py).current_dir(root()).args(["scripts/bench_trace.py", "make"]).arg(&dir))?;
    }
    let ids = String::from_utf8(Command::new(&py).current_dir(root()).args(["scripts/bench_trace.py", "prompt", "256"]).output()?.stdout)?.trim().to_string();
    let mut out = String::from("\n| attribution graph, 256 tokens, batch 64 | f32 | bf16 | bf16 / f32 |\n|---|---|---|---|\n");
    let mut secs = Vec::new();
    for compute in ["f32", "bf16"] {
        let mut best = f64::INFINITY;
        for _ in 0..2 {
            let o = Command::new(bin)
                .args(["graph", "--model"])
                .arg(dir.join("model"))
                .arg("--transcoders")
                .arg(dir.join("transcoders"))
                .args(["--ids", &ids, "--batch-size", "64", "--max-feature-nodes", "512", "--compute", compute, "--out"])
                .arg(root().join(format!("target/bench/trace-graph-{compute}")))
                .output()?;
            anyhow::ensure!(o.status.success(), "graph in {compute}: {}", String::from_utf8_lossy(&o.stderr));
            let text = String::from_utf8_lossy(&o.stdout).to_string();
            let s = text.split("attributed in ").nth(1).and_then(|t| t.split(' ').next()).and_then(|t| t.parse::<f64>().ok()).unwrap_or(f64::NAN);
            best = best.min(s);
        }
        println!("graph 256 tokens {compute}: {best:.2} s");
        secs.push(best);
    }
    out.push_str(&format!("| time (best of 2) | {:.2} s | {:.2} s | {:.2}x faster |\n", secs[0], secs[1], secs[0] / secs[1]));
    Ok(out)
}
