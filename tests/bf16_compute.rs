//! bf16 compute (`--compute bf16`): the linear layers' products with both operands rounded to
//! bf16 and f32 sums, everything else f32. On every family's parity fixture — the f32
//! checkpoints (weights rounded once into kept columns) and their bf16 copies (weights read in
//! place) — the logits stay within 1e-3 nats (KL divergence per position) of the f32 result
//! with the same top-1 token at ≥ 99% of positions, and are closer to it than `transformers`
//! run in bfloat16 on the same bf16 checkpoint (`scripts/gen_bf16_compute_fixtures.py`).
//!
//! On a CPU without AVX512_BF16 (and under `BURNLENS_ISA=baseline`, which the test command
//! also runs) `--compute bf16` runs f32 arithmetic; these tests ask for the emulated products
//! there (`BURNLENS_BF16=emulate`: operands rounded, f32 arithmetic, the portable
//! reference), so the bounds are checked on every machine. One test per process-wide
//! setting: the model-level checks share one test.

mod common;

use std::path::Path;

use burn::tensor::{Int, Tensor, TensorData};
use burnlens::hf::load_model;
use burnlens::model::kernels::{Compute, bf16_path, set_compute};
use burnlens::model::{Sampling, Transformer, generate};
use common::*;

/// Per position: `KL(softmax(p) ‖ softmax(q))` in nats, and whether the argmaxes agree.
fn compare(p: &[f32], q: &[f32], vocab: usize) -> Vec<(f64, bool)> {
    let log_softmax = |row: &[f32]| {
        let max = row.iter().fold(f64::NEG_INFINITY, |m, &x| m.max(x as f64));
        let lse = max + row.iter().map(|&x| (x as f64 - max).exp()).sum::<f64>().ln();
        row.iter().map(|&x| x as f64 - lse).collect::<Vec<f64>>()
    };
    let argmax = |row: &[f32]| row.iter().enumerate().fold(0, |b, (i, &x)| if x > row[b] { i } else { b });
    p.chunks_exact(vocab)
        .zip(q.chunks_exact(vocab))
        .map(|(p, q)| {
            let (lp, lq) = (log_softmax(p), log_softmax(q));
            let kl = lp.iter().zip(&lq).map(|(a, b)| a.exp() * (a - b)).sum::<f64>();
            (kl, argmax(p) == argmax(q))
        })
        .collect()
}

struct Measured {
    max_kl: f64,
    mean_kl: f64,
    top1: f64,
}

fn measure(p: &[f32], q: &[f32], vocab: usize) -> Measured {
    let per = compare(p, q, vocab);
    let n = per.len() as f64;
    Measured {
        max_kl: per.iter().map(|x| x.0).fold(0.0, f64::max),
        mean_kl: per.iter().map(|x| x.0).sum::<f64>() / n,
        top1: per.iter().filter(|x| x.1).count() as f64 / n,
    }
}

fn flex() -> burn::tensor::Device {
    burnlens::model::backend::device("flex", None).unwrap()
}

/// The logits of `ids` (`[batch, seq]`, row-major) in `compute`.
fn logits(model: &Transformer, ids: &[i64], batch: usize, compute: Compute) -> Vec<f32> {
    bf16_path::set_emulated(true);
    set_compute(compute);
    let x = Tensor::<2, Int>::from_data(TensorData::new(ids.to_vec(), [batch, ids.len() / batch]), &model.device());
    let out = model.forward(x).into_data().try_into_vec_as::<f32>().unwrap();
    set_compute(Compute::F32);
    out
}

/// The fixture's model, and its f32 logits on the fixture's ids checked against
/// `transformers`' f32 logits.
fn load_checked(dir: &Path) -> (Transformer, Vec<i64>, Vec<f32>) {
    let expected = read_safetensors(&dir.join("expected.safetensors"));
    let model = load_model(dir, &flex()).unwrap_or_else(|e| panic!("{}: {e}", dir.display())).model;
    let ids = expected["ids"].i64.clone();
    let f32_logits = logits(&model, &ids, 1, Compute::F32);
    let d = max_abs_diff(&f32_logits, &expected["logits"].f32);
    assert!(d <= 1e-4, "{}: the f32 run is off transformers' f32 logits by {d:e}", dir.display());
    (model, ids, f32_logits)
}

/// Text the model writes itself: `n` samples at temperature 1 from the fixture's first
/// tokens, each as long as its context.
fn own_text(model: &Transformer, prompt: &[i64], n: usize) -> Vec<i64> {
    let len = model.config.n_ctx;
    let mut out = Vec::new();
    for seed in 0..n as u64 {
        let s = Sampling { max_new_tokens: len - 4, temperature: 1.0, seed, ..Sampling::default() };
        let mut seq = prompt[..4].to_vec();
        seq.extend(generate(model, &seq, &s).unwrap());
        seq.resize(len, prompt[0]);
        out.extend(seq);
    }
    out
}

#[test]
fn bf16_compute_keeps_trained_models_within_1e3_nats_of_f32_and_every_family_closer_than_transformers_bf16() {
    println!("bf16 products on {}", if bf16_path::native() { bf16_path::path().name() } else { "the portable reference (no bf16 instructions taken here)" });
    let mut failures = Vec::new();
    // The bounds, on models with trained logits: 8 samples of each model's own text, its
    // whole context each (256 positions).
    for &name in EXPORT_FIXTURES {
        let (model, ids, _) = load_checked(&fixture(name));
        let text = own_text(&model, &ids, 8);
        let vocab = model.config.vocab_size;
        let m = measure(&logits(&model, &text, 8, Compute::F32), &logits(&model, &text, 8, Compute::Bf16), vocab);
        println!("{name:<22} burnlens bf16 vs f32: KL max {:.2e} mean {:.2e}, top-1 {:.4} of {} positions", m.max_kl, m.mean_kl, m.top1, text.len());
        if m.max_kl > 1e-3 {
            failures.push(format!("{name}: KL divergence {:.2e} nats at some position > 1e-3", m.max_kl));
        }
        if m.top1 < 0.99 {
            failures.push(format!("{name}: top-1 agrees at {:.1}% of positions < 99%", 100.0 * m.top1));
        }
    }
    // Every family on its random parity fixture (logits tens of nats wide, top tokens near
    // ties: no absolute bound means much there), in f32 and as a bf16 checkpoint: closer to
    // the f32 logits than transformers in bfloat16 on the same bf16 checkpoint.
    let families = half_fixtures();
    assert!(families.len() >= 12, "expected a bf16 copy of every family's fixture, found {}", families.len());
    for (name, bf16_dir) in &families {
        for (what, dir) in [("f32 weights", fixture(name)), ("bf16 weights", bf16_dir.clone())] {
            let (model, ids, reference) = load_checked(&dir);
            let ours = logits(&model, &ids, 1, Compute::Bf16);
            assert!(max_abs_diff(&reference, &ours) > 0.0, "{name} ({what}): bf16 compute gave the f32 logits exactly: it did not run");
            let vocab = model.config.vocab_size;
            let m = measure(&reference, &ours, vocab);
            let mut line = format!("{name:<18} {what:<12} burnlens bf16: KL max {:.2e} mean {:.2e} top-1 {:.2}", m.max_kl, m.mean_kl, m.top1);
            if what == "bf16 weights" {
                let hf = read_safetensors(&dir.join("transformers_bf16.safetensors"));
                let t = measure(&reference, &hf["logits"].f32, vocab);
                line += &format!("   transformers bf16: KL max {:.2e} mean {:.2e} top-1 {:.2}", t.max_kl, t.mean_kl, t.top1);
                if m.mean_kl >= t.mean_kl || m.max_kl >= t.max_kl {
                    failures.push(format!(
                        "{name}: burnlens bf16 (KL mean {:.2e}, max {:.2e}) is not closer to f32 than transformers bf16 ({:.2e}, {:.2e})",
                        m.mean_kl, m.max_kl, t.mean_kl, t.max_kl
                    ));
                }
            }
            println!("{line}");
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_cli_takes_compute_as_a_flag_or_from_the_environment_and_refuses_a_bad_name() {
    let dir = fixture("trained_llama_char");
    let d = dir.to_str().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let run = |args: &[&str], env: Option<&str>| {
        let out = tmp.path().join("logits.json");
        let mut all = vec!["logits", "--model", d, "--ids", "3,1,4,1,5,9,2,6,5,3,5,8", "--out", out.to_str().unwrap()];
        all.extend_from_slice(args);
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_burnlens"));
        cmd.args(&all).env("BURNLENS_BF16", "emulate");
        if let Some(v) = env {
            cmd.env("BURNLENS_COMPUTE", v);
        }
        let o = cmd.output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out).unwrap()).unwrap();
        let logits =
            v["logits"].as_array().unwrap().iter().flat_map(|r| r.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32)).collect::<Vec<f32>>();
        (logits, String::from_utf8_lossy(&o.stderr).into_owned())
    };
    let (f32_logits, _) = run(&[], None);
    let (bf16_logits, _) = run(&["--compute", "bf16"], None);
    let (from_env, _) = run(&[], Some("bf16"));
    let (flag_wins, _) = run(&["--compute", "f32"], Some("bf16"));
    let vocab = f32_logits.len() / 12;
    let m = measure(&f32_logits, &bf16_logits, vocab);
    assert!(max_abs_diff(&f32_logits, &bf16_logits) > 0.0 && m.max_kl <= 1e-3 && m.top1 == 1.0, "KL {:.2e}, top-1 {}", m.max_kl, m.top1);
    assert_eq!(from_env, bf16_logits, "BURNLENS_COMPUTE=bf16 is --compute bf16");
    assert_eq!(flag_wins, f32_logits, "--compute overrides BURNLENS_COMPUTE");
    let (_, warned) = run(&[], Some("fp8"));
    assert!(warned.contains("BURNLENS_COMPUTE") && warned.contains("expected one of f32, bf16"), "{warned}");
    assert_exit(&burnlens(&["logits", "--model", d, "--ids", "1,2", "--compute", "fp8"]), 2, "expected one of f32, bf16");
}

/// The last validation loss a `burnlens train` run recorded in its `metrics.jsonl`, at full
/// precision (its printed line rounds to four decimals, where an f32 and a bf16 run can agree).
fn final_val_loss(run_dir: &std::path::Path) -> f64 {
    let evals = run_metrics(run_dir, "eval");
    evals.last().and_then(|v| v["val_loss"].as_f64()).unwrap_or_else(|| panic!("no validation loss in {}: {evals:?}", run_dir.display()))
}

#[test]
fn training_in_bf16_follows_the_f32_loss_curve_on_shakespeare_char() {
    // nanoGPT's CPU shakespeare-char config, 400 of its 2,000 steps (the whole run is in
    // BENCHMARKS.md: within 0.04% of f32's final validation loss).
    let Some(data) = shared_data() else { return };
    let text = data.join("tinyshakespeare.txt");
    let tmp = tempfile::tempdir().unwrap();
    let run = |compute: &str| {
        let dir = tmp.path().join(compute);
        let o = burnlens_with_env(
            &[("BURNLENS_BF16", "emulate")],
            &[
                "train",
                "--config",
                "configs/shakespeare-char-cpu.toml",
                "--set",
                &format!("data.path={:?}", text.display().to_string()),
                "--set",
                &format!("output.dir={:?}", dir.display().to_string()),
                "--set",
                "training.steps=400",
                "--set",
                "training.lr_decay_steps=400",
                "--set",
                "training.eval_interval=200",
                "--set",
                "output.export=false",
                "--compute",
                compute,
                "--quiet",
            ],
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let config = std::fs::read_to_string(dir.join("config.toml")).unwrap();
        assert!(config.contains(&format!("compute = \"{compute}\"")), "the run records its compute dtype:\n{config}");
        assert!(String::from_utf8_lossy(&o.stdout).contains("validation loss "), "the run prints its validation loss");
        final_val_loss(&dir)
    };
    let (f32_loss, bf16_loss) = (run("f32"), run("bf16"));
    println!("shakespeare-char, 400 steps: validation loss f32 {f32_loss:.6}, bf16 {bf16_loss:.6}");
    assert!(f32_loss < 2.6, "the f32 run learned little: {f32_loss}");
    assert!(bf16_loss != f32_loss && (bf16_loss - f32_loss).abs() <= 0.01 * f32_loss, "bf16 {bf16_loss} vs f32 {f32_loss}: more than 1% apart");
}
