//! `cargo xtask bench-dashboards`: feature dashboards against SAEDashboard.

use std::process::Command;

use anyhow::{Result, bail};

use crate::machine::machine_report;
use crate::process::{root, run};
use crate::venvs::{Venv, python};

/// Feature dashboards against SAEDashboard (`scripts/bench_dashboards.py`): the random GPT-2
/// small of `bench`, a random standard SAE of 24,576 features at `blocks.6.hook_resid_pre`
/// (about 2% density), random windows of 128 tokens, the same threads. burnlens makes every
/// feature's dashboard; SAEDashboard (which re-runs the model for each batch of 256
/// features) makes FEATURES features' and its time for all is its per-batch time times 96,
/// as stated in the table. Arguments: TOKENS (default 8192) and FEATURES (default 512).
/// Peak RSS of both by /usr/bin/time; writes `target/bench/dashboards.json`.
pub(crate) fn bench_dashboards(args: Vec<String>) -> Result<()> {
    let py = python(Venv::Dash)?;
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
