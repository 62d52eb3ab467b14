//! `cargo xtask bench-mpi`: data-parallel training (`train`, and `train-sae` on GPT-2 small's
//! shape) over MPI ranks against one process.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::packages::ensure_mpi;
use crate::process::{data_dir, root, run};
use crate::rounds::{Rounds, order, rounds_option};

/// The dev binary on `ranks` ranks (one plain process for 1), the machine's cores shared
/// out: 2 threads for one process, 1 per rank for two.
fn on_ranks(ranks: usize) -> Command {
    let bin = root().join("target/debug/burnlens");
    let mut cmd = if ranks == 1 {
        Command::new(&bin)
    } else {
        let mut c = Command::new("mpiexec.mpich");
        c.args(["-n", &ranks.to_string()]).arg(&bin);
        c
    };
    let threads = (std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2) / ranks).max(1);
    cmd.env("RAYON_NUM_THREADS", threads.to_string());
    cmd
}

/// One training run of `bench_mpi`: its steps/s after the first two steps, the all-reduce's
/// share of that time and the last training loss.
pub(crate) fn mpi_run(ranks: usize, config: &Path, sets: &[String], run_dir: &Path) -> Result<(f64, f64, f64)> {
    let _ = std::fs::remove_dir_all(run_dir);
    let mut cmd = on_ranks(ranks);
    cmd.args(["train", "--quiet", "--config"]).arg(config);
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

/// One `train-sae` run of `bench_mpi` on `ranks` ranks (the cores shared out): a TopK SAE of
/// 24,576 features on the random GPT-2 small's `blocks.6.hook_resid_pre`, 4,096 activations
/// a step. Over the steady steps (from the third): steps/s, and the shares of that time in
/// the all-reduce and in the store (model passes, and over ranks their activations'
/// gathering); the last loss.
fn sae_run(ranks: usize, steps: usize, run_dir: &Path) -> Result<[f64; 4]> {
    let model = crate::bench::sae::bench_model()?;
    let _ = std::fs::remove_dir_all(run_dir);
    let mut cmd = on_ranks(ranks);
    cmd.args(["train-sae", "--model"]).arg(&model).args(["--hook", "blocks.6.hook_resid_pre", "--architecture", "topk", "--k", "32", "--d-sae", "24576"]);
    cmd.args([
        "--steps",
        &steps.to_string(),
        "--batch",
        "32",
        "--seq-len",
        "128",
        "--n-batches-in-buffer",
        "2",
        "--data",
        "random",
        "--checkpoint-every",
        "100000",
    ]);
    cmd.arg("--out").arg(run_dir);
    run(&mut cmd)?;
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(run_dir.join("metrics.jsonl"))?.lines().map(serde_json::from_str).collect::<Result<_, _>>()?;
    let (first, last) = (lines.get(1).context("at least 3 steps")?, lines.last().context("no steps")?);
    let f = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap_or(0.0);
    let seconds = f(last, "elapsed_s") - f(first, "elapsed_s");
    let reduce: f64 = lines.iter().skip(2).map(|v| f(v, "allreduce_s")).sum();
    let store = f(last, "store_s") - f(first, "store_s");
    Ok([(f(last, "step") - f(first, "step")) / seconds, reduce / seconds, store / seconds, f(last, "loss")])
}

/// `[--rounds N] [STEPS] [GPT2_STEPS] [SAE_STEPS]`: the training cases with one process and
/// two ranks alternating for N rounds (default 1), the ratio the median of the rounds' own;
/// `train-sae` and the all-reduce once.
pub(crate) fn bench_mpi(args: Vec<String>) -> Result<()> {
    let (rounds, args) = rounds_option(args)?;
    let rounds = rounds.unwrap_or(1);
    let steps: usize = args.first().map(|s| s.parse()).transpose()?.unwrap_or(200);
    let gpt2_steps: usize = args.get(1).map(|s| s.parse()).transpose()?.unwrap_or(8);
    let sae_steps: usize = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(8);
    if !ensure_mpi() {
        bail!("bench-mpi needs MPICH and the `mpi` feature's build dependencies");
    }
    // The dev profile, as the other training benchmarks (dependencies and the hot crates at
    // opt-level 3), and the build the tests made.
    run(Command::new(env!("CARGO")).current_dir(root()).args(["build", "--features", "mpi", "--bin", "burnlens"]))?;
    run(Command::new(env!("CARGO")).current_dir(root()).args(["build", "-p", "burnlens-dist", "--features", "mpi", "--example", "allreduce"]))?;
    run(Command::new("lscpu").arg("--extended=CPU,CORE,SOCKET,MAXMHZ"))?;
    let data = data_dir();
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
        // One process and two ranks alternating, each round starting with the other side.
        let (mut runs, mut times): ([Vec<(f64, f64, f64)>; 2], [Rounds; 2]) = Default::default();
        for round in 0..rounds {
            for side in order(2, round) {
                let run = mpi_run(side + 1, config, sets, &out.join(format!("{name}-{}", side + 1)))?;
                times[side].push(vec![1.0 / run.0]);
                runs[side].push(run);
            }
        }
        let middle = |runs: &[(f64, f64, f64)]| {
            let mut r = runs.to_vec();
            r.sort_by(|a, b| a.0.total_cmp(&b.0));
            r[(r.len() - 1) / 2]
        };
        let ((one_rate, _, one_loss), (two_rate, share, two_loss)) = (middle(&runs[0]), middle(&runs[1]));
        let ratio = times[0].ratio_to(&times[1]);
        rows.push(format!("| {name} | {one_rate:.3} | {two_rate:.3} | {ratio} | {:.1}% | {one_loss:.5} / {two_loss:.5} |", 100.0 * share));
    }
    println!("| config | 1 process × 2 threads, steps/s | 2 ranks × 1 thread, steps/s | ratio | all-reduce share | final loss (1 / 2) |");
    println!("|---|---|---|---|---|---|");
    for r in rows {
        println!("{r}");
    }
    let [one_rate, _, one_store, one_loss] = sae_run(1, sae_steps, &out.join("sae-1"))?;
    let [two_rate, reduce, two_store, two_loss] = sae_run(2, sae_steps, &out.join("sae-2"))?;
    println!(
        "\n| train-sae | 1 process × 2 threads, steps/s | 2 ranks × 1 thread, steps/s | ratio | all-reduce share | store share (1 / 2) | final loss (1 / 2) |"
    );
    println!("|---|---|---|---|---|---|---|");
    println!(
        "| TopK, 24,576 features, 4,096 activations | {one_rate:.4} | {two_rate:.4} | {:.2}x | {:.1}% | {:.1}% / {:.1}% | {one_loss:.4} / {two_loss:.4} |",
        two_rate / one_rate,
        100.0 * reduce,
        100.0 * one_store,
        100.0 * two_store
    );
    run(Command::new("mpiexec.mpich").args(["-n", "2"]).arg(root().join("target/debug/examples/allreduce")))?;
    Ok(())
}
