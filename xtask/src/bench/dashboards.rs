//! `cargo xtask bench-dashboards`: feature dashboards against SAEDashboard.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Result, bail};
use serde_json::Value;

use crate::machine::machine_report;
use crate::process::{peak_rss, root, run, timed_rss};
use crate::rounds::{Rounds, order, rounds_option};
use crate::venvs::{Venv, python};

/// Feature dashboards against SAEDashboard (`scripts/bench_dashboards.py`): the random GPT-2
/// small of `bench`, a random standard SAE of 24,576 features at `blocks.6.hook_resid_pre`
/// (about 2% density), random windows of 128 tokens, the same threads. burnlens makes every
/// feature's dashboard; SAEDashboard (which re-runs the model for each batch of 256
/// features) makes FEATURES features' and its time for all is its per-batch time times 96,
/// as stated in the table. Arguments: `[--rounds N]` (default 1: with more, the sides
/// alternate, each round starting with the other, and the ratio is the median of the rounds'
/// own), TOKENS (default 8192) and FEATURES (default 512).
/// Peak RSS of both by /usr/bin/time; writes `target/bench/dashboards.json`.
pub(crate) fn bench_dashboards(args: Vec<String>) -> Result<()> {
    let (rounds, args) = rounds_option(args)?;
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
    let runs = Runs { bin, py, model, sae, tokens, features, threads, rss_file: root().join("target/bench/dash-rss.txt") };
    let (mut ours, mut peers) = (Vec::new(), Vec::new());
    let (mut our_times, mut peer_times) = (Rounds::default(), Rounds::default());
    for round in 0..rounds.unwrap_or(1) {
        for side in order(2, round) {
            if side == 0 {
                let o = runs.burnlens()?;
                our_times.push(vec![o.compute()]);
                ours.push(o);
            } else {
                let p = runs.saedashboard()?;
                peer_times.push(vec![p.all(d_sae)]);
                peers.push(p);
            }
        }
    }
    // The table shows the round whose time is the median of each side's, and the ratio of
    // the rounds' own ratios.
    let ours = median_run(ours, Ours::compute);
    let peer = median_run(peers, |p| p.all(d_sae));
    let (p1, p2, lg, compute, ours_rss, said, run_json) = (ours.p1, ours.p2, ours.lg, ours.compute(), ours.rss, ours.said.clone(), ours.json.clone());
    let (p, peer_rss, per_batch, peer_all) = (peer.json.clone(), peer.rss, peer.per_batch(), peer.all(d_sae));
    let table = format!(
        "| tool | features | tokens | passes (s) | logit effects (s) | compute (s) | all 24,576 features (s) | tokens/s per pass | peak RSS (GB) | burnlens faster by |\n|---|---|---|---|---|---|---|---|---|---|\n\
         | burnlens | 24,576 | {tokens} | {p1:.1} + {p2:.1} | {lg:.1} | {compute:.1} | {compute:.1} | {:.0} | {ours_rss:.2} | {} |\n\
         | SAEDashboard 0.8.0 | {features} | {} | - | - | {:.1} | {peer_all:.0} (96 × {per_batch:.1}) | - | {peer_rss:.2} | |\n",
        tokens as f64 / (p1.max(p2)),
        peer_times.ratio_to(&our_times),
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

/// What every run of [`bench_dashboards`] shares.
struct Runs {
    bin: PathBuf,
    py: PathBuf,
    model: PathBuf,
    sae: PathBuf,
    tokens: u64,
    features: usize,
    threads: String,
    rss_file: PathBuf,
}

/// One burnlens run: its passes' seconds, peak RSS (GB), what it printed, its `run.json`.
struct Ours {
    p1: f64,
    p2: f64,
    lg: f64,
    rss: f64,
    said: String,
    json: Value,
}

impl Ours {
    /// Seconds of computing: both passes and the logit effects.
    fn compute(&self) -> f64 {
        self.p1 + self.p2 + self.lg
    }
}

/// One SAEDashboard run: what it printed last, peak RSS (GB).
struct Peer {
    json: Value,
    rss: f64,
}

impl Peer {
    fn per_batch(&self) -> f64 {
        self.json["seconds_per_batch"].as_f64().unwrap_or(f64::NAN)
    }

    /// Its time for every feature: the per-batch time times the batches of 256 features.
    fn all(&self, d_sae: usize) -> f64 {
        self.per_batch() * d_sae.div_ceil(256) as f64
    }
}

impl Runs {
    /// The peak RSS of the last run, in GB.
    fn peak(&self) -> f64 {
        peak_rss(&self.rss_file) / 1e9
    }

    fn burnlens(&self) -> Result<Ours> {
        let out = root().join("target/bench/dash-run");
        let _ = std::fs::remove_dir_all(&out);
        let ours = timed_rss(&self.rss_file)
            .arg(&self.bin)
            .args(["dashboards", "--process-weights", "--data", "random", "--seq-len", "128", "--tokens", &self.tokens.to_string(), "--model"])
            .arg(&self.model)
            .arg("--sae")
            .arg(&self.sae)
            .arg("--out")
            .arg(&out)
            .env("RAYON_NUM_THREADS", &self.threads)
            .output()?;
        if !ours.status.success() {
            bail!("burnlens dashboards failed: {}", String::from_utf8_lossy(&ours.stderr));
        }
        let json: Value = serde_json::from_str(&std::fs::read_to_string(out.join("run.json"))?)?;
        let secs = |k: &str| json["run"]["seconds"][k].as_f64().unwrap_or(f64::NAN);
        Ok(Ours {
            p1: secs("first_pass"),
            p2: secs("second_pass"),
            lg: secs("logits"),
            rss: self.peak(),
            said: String::from_utf8_lossy(&ours.stdout).to_string(),
            json,
        })
    }

    fn saedashboard(&self) -> Result<Peer> {
        let peer = timed_rss(&self.rss_file)
            .arg(&self.py)
            .current_dir(root())
            .arg("scripts/bench_dashboards.py")
            .arg("run")
            .arg(&self.model)
            .arg(&self.sae)
            .args([&self.tokens.to_string(), &self.features.to_string(), &self.threads])
            .output()?;
        let json: Value = serde_json::from_str(String::from_utf8_lossy(&peer.stdout).lines().last().unwrap_or("{}"))?;
        Ok(Peer { json, rss: self.peak() })
    }
}

/// The run whose time (by `time`) is the median of the runs' (the lower middle one of an
/// even count).
fn median_run<T>(mut runs: Vec<T>, time: impl Fn(&T) -> f64) -> T {
    runs.sort_by(|a, b| time(a).total_cmp(&time(b)));
    runs.swap_remove((runs.len() - 1) / 2)
}
