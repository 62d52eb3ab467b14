//! `cargo xtask bench-trace`: attribution graphs against circuit-tracer.

use std::process::Command;

use anyhow::Result;

use crate::machine::machine_report;
use crate::process::{peak_rss, root, run, run_json, timed_rss};
use crate::venvs::{Venv, python};

/// Attribution graphs against circuit-tracer (`scripts/bench_trace.py`): GPT-2 small's
/// shape with random 24,576-feature transcoders (`target/trace-bench`, made once), the same
/// token prompt of each length, `max_feature_nodes` 512, each tool at the batch sizes given
/// (its best is reported), one process per run so the peak RSS is that run's. Arguments:
/// prompt lengths (default 64 256 1024). Writes `target/bench/trace.json` and prints a table.
pub(crate) fn bench_trace(args: Vec<String>) -> Result<()> {
    let py = python(Venv::Trace)?;
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
            let out = timed_rss(&rss_file)
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
            let rss = peak_rss(&rss_file);
            let v = match (out.status.success(), seconds) {
                (true, Some(s)) => {
                    serde_json::json!({"tool": "burnlens", "tokens": n, "batch": b, "seconds": s, "peak_rss": rss, "active_features": active})
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
