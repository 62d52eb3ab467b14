//! `cargo xtask bench-train`: nanoGPT's shakespeare-char training against the lean PyTorch peer.

use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::machine::cpu_line;
use crate::process::{data_dir, root, run};
use crate::venvs::{Venv, python};

/// Train `configs/shakespeare-char-cpu.toml` with burnlens and the same configuration with
/// the lean PyTorch peer (`scripts/peer_nanogpt.py train`), one after the other on this
/// machine, and report wall time, tokens/s and validation loss side by side.
pub(crate) fn bench_train() -> Result<()> {
    let py = python(Venv::Main)?;
    let data = data_dir();
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
