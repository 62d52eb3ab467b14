//! `cargo xtask bench-sae`: SAE training against sae-lens.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Result, bail};
use serde_json::Value;

use crate::machine::machine_report;
use crate::process::{peak_rss, root, run, timed_rss};
use crate::rounds::{Rounds, order, rounds_option};
use crate::venvs::{Venv, python};

/// The random GPT-2 small the SAE benchmarks read (`target/bench/gpt2-small`), made by
/// transformers (seed 0) if it is not there yet.
pub(crate) fn bench_model() -> Result<std::path::PathBuf> {
    let model = root().join("target/bench/gpt2-small");
    if !model.join("model.safetensors").is_file() {
        let py = python(Venv::SaeLens)?;
        run(Command::new(&py).args(["-c", "import sys, torch; from transformers import GPT2Config, GPT2LMHeadModel; torch.manual_seed(0); GPT2LMHeadModel(GPT2Config()).save_pretrained(sys.argv[1])"]).arg(&model))?;
    }
    Ok(model)
}

/// SAE training against sae-lens (`scripts/bench_sae.py`): the random GPT-2 small of `bench`
/// (`target/bench/gpt2-small`), `blocks.6.hook_resid_pre`, 24,576 features, batches of 32
/// windows of 128 random tokens (4,096 activations), a mixing buffer of two model passes, the
/// same threads; TopK (k = 32) and standard, burnlens and sae-lens alternating round by round
/// (each round starting with the other side, [`order`]), one process per run (peak RSS by
/// /usr/bin/time), seconds per step over the steady steps (after two); the ratio is the
/// median of the rounds' own ratios. Arguments: `[--rounds N]` (default 1), steps per run
/// (default 6), architectures. Writes `target/bench/sae.json` and prints a table.
pub(crate) fn bench_sae(args: Vec<String>) -> Result<()> {
    let (rounds, args) = rounds_option(args)?;
    let py = python(Venv::SaeLens)?;
    let model = bench_model()?;
    run(Command::new(env!("CARGO")).current_dir(root()).args(["build", "--quiet", "--bin", "burnlens"]))?;
    let bin = root().join("target/debug/burnlens");
    let machine = machine_report(&bin)?;
    println!("{}", machine.text);
    let steps: usize = args.first().map(|a| a.parse()).transpose()?.unwrap_or(6);
    let archs: Vec<&str> = if args.len() > 1 { args[1..].iter().map(String::as_str).collect() } else { vec!["topk", "batchtopk", "standard", "jumprelu"] };
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2).to_string();
    let runs = Runs { bin, py, model, steps, threads, rss_file: root().join("target/bench/sae-rss.txt") };
    let mut results = Vec::new();
    let mut table = String::from(
        "| architecture | tool | s / step | model passes / step | rest / step | SAE products | activations / s | peak RSS | burnlens faster by |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for arch in archs {
        let (mut sides, mut times): ([Vec<Value>; 2], [Rounds; 2]) = Default::default();
        for round in 0..rounds.unwrap_or(1) {
            for side in order(2, round) {
                let v = if side == 0 { runs.burnlens(arch)? } else { runs.sae_lens(arch)? };
                println!("{v}");
                times[side].push(vec![v["seconds_per_step"].as_f64().unwrap_or(f64::NAN)]);
                sides[side].push(v);
            }
        }
        let ratio = times[1].ratio_to(&times[0]);
        for (v, r) in [(summary(&sides[0]), ratio), (summary(&sides[1]), String::new())] {
            table.push_str(&row(arch, &v, &r));
            results.push(v);
        }
    }
    println!("\n{table}");
    std::fs::write(
        root().join("target/bench/sae.json"),
        serde_json::to_string_pretty(&serde_json::json!({"machine": machine.text, "results": results, "table": table}))?,
    )?;
    Ok(())
}

/// What every run of [`bench_sae`] shares.
struct Runs {
    bin: PathBuf,
    py: PathBuf,
    model: PathBuf,
    steps: usize,
    threads: String,
    rss_file: PathBuf,
}

impl Runs {
    /// The peak RSS `/usr/bin/time` wrote for the last run, in bytes.
    fn peak(&self) -> f64 {
        peak_rss(&self.rss_file)
    }

    fn burnlens(&self, arch: &str) -> Result<Value> {
        let (hook, d_sae, k) = (HOOK, D_SAE, K);
        let out_dir = root().join("target/bench/sae-run");
        let _ = std::fs::remove_dir_all(&out_dir);
        let ours = timed_rss(&self.rss_file)
            .arg(&self.bin)
            .args(["train-sae", "--model"])
            .arg(&self.model)
            .args(["--hook", hook, "--architecture", arch, "--k", k, "--d-sae", d_sae, "--steps", &self.steps.to_string(), "--batch", "32", "--seq-len", "128"])
            // The sparsity coefficient of the architectures that have one (1, as sae-lens's run).
            .args(match arch {
                "standard" => &["--l1", "1"][..],
                "jumprelu" => &["--l0", "1"][..],
                _ => &[],
            })
            .args(["--n-batches-in-buffer", "2", "--data", "random", "--checkpoint-every", "100000", "--out"])
            .arg(&out_dir)
            .env("RAYON_NUM_THREADS", &self.threads)
            .output()?;
        if !ours.status.success() {
            bail!("burnlens train-sae failed: {}", String::from_utf8_lossy(&ours.stderr));
        }
        let lines: Vec<Value> = std::fs::read_to_string(out_dir.join("metrics.jsonl"))?.lines().map(serde_json::from_str).collect::<Result<_, _>>()?;
        // Over the steady steps (from the third on): seconds per step, in all and in the store.
        let steady =
            |key: &str| (lines[lines.len() - 1][key].as_f64().unwrap_or(f64::NAN) - lines[1][key].as_f64().unwrap_or(f64::NAN)) / (lines.len() - 2) as f64;
        let per_step = steady("elapsed_s");
        // The SAE step's products: the encoder's alone for the sparse (TopK) passes, five
        // of that size for the dense ones.
        let products = 2.0 * 4096.0 * 768.0 * 24576.0 * if arch.contains("topk") { 1.0 } else { 5.0 };
        Ok(
            serde_json::json!({"impl": "burnlens", "arch": arch, "seconds_per_step": per_step, "model_s_per_step": steady("store_s"), "sae_gflop": products / 1e9, "activations_per_s": 4096.0 / per_step, "peak_rss": self.peak()}),
        )
    }

    fn sae_lens(&self, arch: &str) -> Result<Value> {
        let peer = timed_rss(&self.rss_file)
            .arg(&self.py)
            .current_dir(root())
            .args(["scripts/bench_sae.py"])
            .arg(&self.model)
            .args([arch, &self.steps.to_string(), D_SAE, K, HOOK, &self.threads])
            .output()?;
        let mut p: Value = serde_json::from_str(String::from_utf8_lossy(&peer.stdout).lines().last().unwrap_or("{}"))?;
        p["peak_rss"] = self.peak().into();
        Ok(p)
    }
}

const HOOK: &str = "blocks.6.hook_resid_pre";
const D_SAE: &str = "24576";
const K: &str = "32";

/// One side's runs in one: the median of each time (and the rate from the median step), the
/// largest peak RSS.
fn summary(runs: &[Value]) -> Value {
    let med = |k: &str| crate::process::median(runs.iter().filter_map(|v| v[k].as_f64()).collect());
    let mut v = runs[0].clone();
    for k in ["seconds_per_step", "model_s_per_step"] {
        v[k] = med(k).into();
    }
    v["activations_per_s"] = (4096.0 / med("seconds_per_step")).into();
    v["peak_rss"] = runs.iter().filter_map(|v| v["peak_rss"].as_f64()).fold(f64::NAN, f64::max).into();
    v["rounds"] = runs.len().into();
    v
}

/// The table's row for one side.
fn row(arch: &str, v: &Value, ratio: &str) -> String {
    let f = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    let (step, model) = (f("seconds_per_step"), f("model_s_per_step"));
    let rate =
        if v["sae_gflop"].is_null() { String::from("–") } else { format!("{:.0} GFLOP, {:.0} GFLOP/s", f("sae_gflop"), f("sae_gflop") / (step - model)) };
    format!(
        "| {arch} | {} | {step:.2} | {model:.2} | {:.2} | {rate} | {:.0} | {:.2} GB | {ratio} |\n",
        v["impl"].as_str().unwrap_or("?"),
        step - model,
        f("activations_per_s"),
        f("peak_rss") / 1e9
    )
}
