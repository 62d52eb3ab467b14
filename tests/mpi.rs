//! Data-parallel training over MPI ranks on loopback (`mpiexec -n N burnlens train`): N = 2
//! and 3 follow the one-process run, every rank's parameters stay bit-identical, a rank
//! that cannot read its data is named before training, a killed rank ends the job and the
//! run resumes with another N, and a rank that hangs is named by every other rank. A command
//! that cannot share its work (analyze) refuses several ranks instead of racing. SAE
//! training over ranks: `mpi_features.rs`.
//!
//! Needs the binary built with `--features mpi` and MPICH's `mpiexec` (what `cargo xtask
//! test` installs and builds); without them these tests fail under CI and skip elsewhere.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::mpi_jobs::{launch, mpiexec, rank_pids, ranks_gone, run, wait_ended};
use common::{assert_close, read_safetensors, run_metrics};

/// A model small enough for a debug build; no dropout, so ranks and one process draw the
/// same computation; two micro-batches per step; batch 6 splits 3+3 and 2+2+2.
const CONFIG: &str = r#"
[model]
n_layers = 2
n_heads = 2
d_model = 32
context = 16
[data]
kind = "repeated_tokens"
vocab = 20
[training]
batch_size = 6
grad_accum = 2
block_size = 16
steps = 16
lr_decay_steps = 16
warmup_steps = 2
learning_rate = 3e-3
eval_interval = 8
eval_batches = 2
checkpoint_interval = 8
dropout = 0.0
[output]
dir = "unused"
"#;

fn write_config(dir: &Path, steps: usize) -> PathBuf {
    let path = dir.join("run.toml");
    let text = CONFIG.replace("steps = 16\nlr_decay_steps = 16", &format!("steps = {steps}\nlr_decay_steps = {steps}"));
    std::fs::write(&path, text).unwrap();
    path
}

fn train_args(config: &Path, run: &Path) -> Vec<String> {
    vec![
        "train".into(),
        "--config".into(),
        config.display().to_string(),
        "--set".into(),
        format!("output.dir={:?}", run.display().to_string()),
        "--quiet".into(),
    ]
}

/// Per-step training losses and the final evaluation equal within `tol` relative, and each
/// exported weight tensor within `tol` relative in L2 norm. Except the keys' bias (the middle
/// third of GPT-2's `c_attn.bias`): softmax does not change when a query's scores all shift
/// by the same amount, so its gradient is zero up to rounding, and Adam turns that rounding
/// noise, which the order of any sum changes, into full-sized steps. The queries' bias (its
/// first third) is nearly so: its gradient only sees how the keys differ from their mean, so
/// it is compared on its own within ten times `tol` (on an AVX2 Zen 3 its two-rank run ended
/// 1.49e-6 from the one process's, every other tensor within 3e-7).
fn assert_same_run(a: &Path, b: &Path, tol: f64) {
    let (la, lb) = (run_metrics(a, "train"), run_metrics(b, "train"));
    assert_eq!(la.len(), lb.len());
    for (x, y) in la.iter().zip(&lb) {
        let (x, y) = (x["loss"].as_f64().unwrap(), y["loss"].as_f64().unwrap());
        assert!((x - y).abs() <= tol * x.abs(), "{}: training loss {x} vs {}: {y}", a.display(), b.display());
    }
    let (ea, eb) = (run_metrics(a, "eval"), run_metrics(b, "eval"));
    let (x, y) = (ea.last().unwrap()["val_loss"].as_f64().unwrap(), eb.last().unwrap()["val_loss"].as_f64().unwrap());
    assert!((x - y).abs() <= tol * x.abs(), "validation loss {x} vs {y}");
    let (wa, wb) = (read_safetensors(&a.join("hf/model.safetensors")), read_safetensors(&b.join("hf/model.safetensors")));
    assert_eq!(wa.len(), wb.len());
    for (name, t) in &wa {
        let (x, y) = (&t.f32[..], &wb[name].f32[..]);
        if name.ends_with("attn.c_attn.bias") {
            let d = x.len() / 3;
            assert_close(&format!("{name} (queries)"), &x[..d], &y[..d], 10.0 * tol);
            assert_close(&format!("{name} (values)"), &x[2 * d..], &y[2 * d..], tol);
        } else {
            assert_close(name, x, y, tol);
        }
    }
}

#[test]
fn two_and_three_ranks_follow_the_one_process_run() {
    let Some(mpiexec) = mpiexec() else { return };
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), 16);
    let one = dir.path().join("one");
    run(&mut launch(&mpiexec, 1, &train_args(&config, &one)));
    for ranks in [2, 3] {
        let many = dir.path().join(format!("ranks-{ranks}"));
        run(&mut launch(&mpiexec, ranks, &train_args(&config, &many)));
        assert_same_run(&one, &many, 1e-6);
        // At every checkpoint (steps 8 and 16) every rank's parameter digest equalled rank 0's
        // (the run stops otherwise), and rank 0 recorded it.
        let checks = run_metrics(&many, "ranks");
        assert_eq!(checks.iter().map(|c| c["step"].as_u64().unwrap()).collect::<Vec<_>>(), [8, 16]);
        assert!(checks.iter().all(|c| c["ranks"] == ranks && c["params_sha256"].as_str().is_some_and(|h| h.len() == 64)));
        // Only rank 0 wrote: one line per step.
        assert_eq!(run_metrics(&many, "train").len(), 16);
    }
}

#[test]
fn a_rank_that_cannot_read_its_data_is_named_before_training() {
    let Some(mpiexec) = mpiexec() else { return };
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), 16);
    let run_dir = dir.path().join("run");
    let bin = env!("CARGO_BIN_EXE_burnlens");
    let good = train_args(&config, &run_dir);
    let mut bad = good.clone();
    bad.extend(["--set".into(), "data.kind=\"char\"".into(), "--set".into(), "data.path=\"/nonexistent/corpus.txt\"".into()]);
    // MPMD: rank 0 with readable data, rank 1 without.
    let out =
        Command::new(&mpiexec).args(["-n", "1", bin]).args(&good).args([":", "-n", "1", bin]).args(&bad).env("BURNLENS_RANK_TIMEOUT", "20").output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("error: /nonexistent/corpus.txt: no such file"), "rank 1 reports its own error: {stderr}");
    assert!(stderr.contains("error: rank 1 of 2: /nonexistent/corpus.txt: no such file"), "rank 0 names rank 1: {stderr}");
    let metrics = std::fs::read_to_string(run_dir.join("metrics.jsonl")).unwrap_or_default();
    assert!(!run_dir.join("checkpoints/LATEST").exists() && metrics.trim().is_empty(), "no step was taken");
}

#[test]
fn a_malformed_rank_timeout_is_refused_on_every_rank() {
    let Some(mpiexec) = mpiexec() else { return };
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), 16);
    let out = launch(&mpiexec, 2, &train_args(&config, &dir.path().join("run"))).env("BURNLENS_RANK_TIMEOUT", "soon").output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    let lines: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error: ")).collect();
    assert_eq!(lines.len(), 2, "one line from each rank: {stderr}");
    assert!(lines.iter().all(|l| l.contains("BURNLENS_RANK_TIMEOUT=\"soon\": expected a positive number of seconds")), "{stderr}");
}

/// What the command line of a run into `run_dir` holds.
fn dir_arg(run_dir: &Path) -> String {
    format!("output.dir={:?}", run_dir.display().to_string())
}

/// Start a long job on `ranks` ranks and wait until its first checkpoint is written.
fn start_long_job(mpiexec: &Path, ranks: usize, config: &Path, run_dir: &Path, timeout_s: &str) -> (Child, Vec<u32>) {
    let mut child = launch(mpiexec, ranks, &train_args(config, run_dir))
        .env("BURNLENS_RANK_TIMEOUT", timeout_s)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while !run_dir.join("checkpoints/LATEST").exists() {
        assert!(start.elapsed() < Duration::from_secs(120), "no checkpoint after 120 s");
        assert!(child.try_wait().unwrap().is_none(), "the job ended early");
        std::thread::sleep(Duration::from_millis(20));
    }
    let pids = rank_pids(&dir_arg(run_dir));
    assert_eq!(pids.len(), ranks, "rank processes: {pids:?}");
    (child, pids)
}

#[test]
fn a_killed_rank_ends_the_job_and_the_run_resumes_with_other_ranks() {
    let Some(mpiexec) = mpiexec() else { return };
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), 120);
    let run_dir = dir.path().join("run");
    let (child, pids) = start_long_job(&mpiexec, 3, &config, &run_dir, "10");
    Command::new("kill").args(["-9", &pids[1].to_string()]).status().unwrap();
    let out = wait_ended(child, Duration::from_secs(20));
    let (status, stderr) = (out.status, String::from_utf8_lossy(&out.stderr));
    assert!(!status.success(), "{stderr}");
    assert!(ranks_gone(&dir_arg(&run_dir)), "every rank ended");
    // The last checkpoint is complete: resume it on 2 ranks to the end, and the run equals
    // one process's from the start.
    let latest = std::fs::read_to_string(run_dir.join("checkpoints/LATEST")).unwrap();
    assert!(latest.trim() < "step-000120", "killed before the end: {latest}");
    let resume = vec!["train".into(), "--resume".into(), run_dir.display().to_string(), "--quiet".into()];
    run(&mut launch(&mpiexec, 2, &resume));
    let one = dir.path().join("one");
    run(&mut launch(&mpiexec, 1, &train_args(&config, &one)));
    assert_same_run(&one, &run_dir, 1e-4);
}

#[test]
fn a_hung_rank_is_named_by_every_other_rank_within_the_timeout() {
    let Some(mpiexec) = mpiexec() else { return };
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), 100_000);
    let run_dir = dir.path().join("run");
    let (child, pids) = start_long_job(&mpiexec, 3, &config, &run_dir, "2");
    Command::new("kill").args(["-STOP", &pids[1].to_string()]).status().unwrap();
    // 2 s of timeout, 3 s of probing, 1 s for every rank to report.
    let out = wait_ended(child, Duration::from_secs(30));
    let (status, stderr) = (out.status, String::from_utf8_lossy(&out.stderr));
    assert!(!status.success());
    for rank in [0, 2] {
        let line =
            stderr.lines().find(|l| l.starts_with(&format!("error: rank {rank} of 3: "))).unwrap_or_else(|| panic!("no error from rank {rank}: {stderr}"));
        assert!(line.contains("did not complete within 2 s; rank 1 does not answer"), "{line}");
        assert!(line.contains("the last checkpoint is") && line.contains("checkpoints/step-"), "{line}");
    }
    assert!(ranks_gone(&dir_arg(&run_dir)), "every rank ended, the stopped one too");
}

/// A feature's dashboard file without its quantile groups' samples (drawn at random, so
/// equal only in distribution), and each group's sample size and values.
fn dashboard_parts(path: &Path) -> (serde_json::Value, Vec<(usize, Vec<f64>, f64, f64)>) {
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut samples = Vec::new();
    for q in v["quantiles"].as_array_mut().expect("quantile groups") {
        let examples = q["examples"].take();
        let values: Vec<f64> = examples.as_array().unwrap().iter().map(|e| e["value"].as_f64().unwrap()).collect();
        samples.push((values.len(), values, q["lower"].as_f64().unwrap(), q["upper"].as_f64().unwrap()));
    }
    (v, samples)
}

#[test]
fn dashboards_over_two_and_three_ranks_equal_one_process() {
    let Some(mpiexec) = mpiexec() else { return };
    let dir = tempfile::tempdir().unwrap();
    let case = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/trace/gpt2");
    let args = |out: &Path| -> Vec<String> {
        let (model, tcs) = (case.join("model"), case.join("transcoders"));
        let fixed = ["dashboards", "--data", "random", "--seq-len", "16", "--tokens", "12288", "--batch", "8", "--quantile-size", "4"];
        let mut a: Vec<String> = fixed.iter().map(|s| s.to_string()).collect();
        a.extend(["--model".into(), model.display().to_string(), "--transcoders".into(), tcs.display().to_string(), "--out".into(), out.display().to_string()]);
        a
    };
    let one = dir.path().join("one");
    run(&mut launch(&mpiexec, 1, &args(&one)));
    let mut names: Vec<_> = std::fs::read_dir(one.join("features")).unwrap().map(|e| e.unwrap().file_name()).collect();
    names.sort();
    assert!(names.len() > 10, "{names:?}");
    for ranks in [2, 3] {
        let many = dir.path().join(format!("ranks-{ranks}"));
        run(&mut launch(&mpiexec, ranks, &args(&many)));
        let mut theirs: Vec<_> = std::fs::read_dir(many.join("features")).unwrap().map(|e| e.unwrap().file_name()).collect();
        theirs.sort();
        assert_eq!(names, theirs);
        for name in &names {
            // Extremes, density, top groups (every example), histograms, quantile bounds and
            // counts, logit effects: exactly one process's.
            let (a, qa) = dashboard_parts(&one.join("features").join(name));
            let (b, qb) = dashboard_parts(&many.join("features").join(name));
            assert_eq!(a, b, "{ranks} ranks, {name:?}");
            // Quantile samples: as many, each from its interval.
            for ((na, _, lo, hi), (nb, values, _, _)) in qa.iter().zip(&qb) {
                assert_eq!(na, nb, "{ranks} ranks, {name:?}: sample sizes");
                assert!(values.iter().all(|v| *v >= lo - 1e-6 && *v <= hi + 1e-6), "{ranks} ranks, {name:?}: {values:?} outside [{lo}, {hi}]");
            }
        }
        // Only rank 0 wrote, and no rank left its spill file behind... the spill files are
        // each rank's own.
        assert!(many.join("html/index.html").is_file());
    }
}

#[test]
fn an_activation_cache_written_by_ranks_is_the_one_process_cache() {
    let Some(mpiexec) = mpiexec() else { return };
    let dir = tempfile::tempdir().unwrap();
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/trace/gpt2/model");
    let args = |out: &Path| -> Vec<String> {
        let fixed = ["cache-activations", "--data", "random", "--seq-len", "16", "--batch", "4", "--chunks-per-shard", "2", "--windows", "90"];
        let mut a: Vec<String> = fixed.iter().map(|s| s.to_string()).collect();
        a.extend(["--hook".into(), "blocks.0.hook_resid_pre,blocks.1.hook_mlp_out".into(), "--model".into(), model.display().to_string()]);
        a.extend(["--out".into(), out.display().to_string()]);
        a
    };
    let files = |d: &Path| -> Vec<(String, Vec<u8>)> {
        let mut f: Vec<_> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap())
            .map(|e| (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap()))
            .collect();
        f.sort();
        f
    };
    let one = dir.path().join("one");
    run(&mut launch(&mpiexec, 1, &args(&one)));
    let expected = files(&one);
    // 90 windows of 4 a pass, 2 passes a shard: 12 shards (the last of one short pass).
    assert_eq!(expected.len(), 13, "{:?}", expected.iter().map(|f| &f.0).collect::<Vec<_>>());
    for ranks in [2, 3] {
        let many = dir.path().join(format!("ranks-{ranks}"));
        run(&mut launch(&mpiexec, ranks, &args(&many)));
        let got = files(&many);
        assert_eq!(got.iter().map(|f| &f.0).collect::<Vec<_>>(), expected.iter().map(|f| &f.0).collect::<Vec<_>>(), "{ranks} ranks");
        for ((name, a), (_, b)) in expected.iter().zip(&got) {
            assert!(a == b, "{ranks} ranks: {name} differs from one process's");
        }
    }
}

#[test]
fn a_command_that_cannot_share_its_work_refuses_several_ranks_and_writes_nothing() {
    let Some(mpiexec) = mpiexec() else { return };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("report");
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/trace/gpt2/model");
    let args: Vec<String> =
        ["analyze", "--model", model.to_str().unwrap(), "--ids", "1,5,7,9", "--out", out.to_str().unwrap()].iter().map(|s| s.to_string()).collect();
    let o = launch(&mpiexec, 2, &args).output().unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "two ranks of analyze were not refused");
    let lines: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error: ")).collect();
    assert_eq!(lines.len(), 2, "one line from each rank: {stderr}");
    assert!(lines.iter().all(|l| l.contains("`analyze` does not share its work between MPI ranks")), "{stderr}");
    assert!(!out.exists(), "a refused job wrote {}", out.display());
    // The same command as one process runs.
    run(&mut launch(&mpiexec, 1, &args));
    assert!(out.read_dir().unwrap().next().is_some(), "one process wrote nothing in {}", out.display());
}
