//! `cargo xtask bench-scale`: 8B- and 9B-shaped checkpoints against transformers in bf16.

use std::process::Command;

use anyhow::Result;

use crate::machine::machine_report;
use crate::process::{floats, root, run, run_json};
use crate::venvs::{Venv, python};

/// Models at the sizes interpretability works on, in bf16 (`scripts/make_scale_checkpoints.py`:
/// random weights with the shapes of Llama 3.1 8B and Gemma 2 9B, sharded as transformers
/// saves them, in `target/scale`, never committed): burnlens (`bench scale`: load, a
/// 128-token forward, a cache of every `hook_resid_post`, 32 greedy decoding steps) and
/// transformers in bf16 on the same checkpoint and threads, one after the other.
pub(crate) fn bench_scale(args: Vec<String>) -> Result<()> {
    let py = python(Venv::Main)?;
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
