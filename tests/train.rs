//! Training: exact resume, interruption, NaN handling, data, export and sampling.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use burn::tensor::Device;
use burnlens::hf::{Tokenizer, load_model};
use burnlens::model::{Sampling, generate};
use burnlens::train::data::{Dataset, Split};
use burnlens::train::{RunConfig, TrainError, TrainOptions, is_run_dir, load_any, load_run};
use common::*;

const TINY: &str = r#"
[model]
n_layers = 2
n_heads = 2
d_model = 32
context = 16
[data]
kind = "repeated_tokens"
vocab = 20
[training]
batch_size = 4
block_size = 16
steps = 16
lr_decay_steps = 16
warmup_steps = 2
learning_rate = 3e-3
eval_interval = 8
eval_batches = 2
checkpoint_interval = 8
dropout = 0.1
[output]
dir = "unused"
"#;

fn config(text: &str, dir: &Path, sets: &[&str]) -> RunConfig {
    let mut all: Vec<String> = vec![format!("output.dir={:?}", dir.display().to_string())];
    all.extend(sets.iter().map(|s| s.to_string()));
    RunConfig::parse(text, Path::new("test.toml"), &all).unwrap()
}

/// Burn's random generator is per device and shared by the whole process, so two runs that
/// must reproduce each other cannot train at the same time in one process (the CLI runs
/// one per process). Tests that train take this lock.
static ONE_RUN_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn train(cfg: &RunConfig, opts: &TrainOptions) -> Result<burnlens::train::RunSummary, TrainError> {
    let _guard = ONE_RUN_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    burnlens::train::train(cfg, opts, &mut burnlens::train::Silent)
}

/// Training losses by step from a run's metrics.jsonl.
fn losses(run: &Path) -> Vec<(u64, f64)> {
    run_metrics(run, "train").iter().map(|v| (v["step"].as_u64().unwrap(), v["loss"].as_f64().unwrap())).collect()
}

fn assert_same_curve(a: &[(u64, f64)], b: &[(u64, f64)]) {
    assert_eq!(a.len(), b.len(), "different numbers of steps: {a:?} vs {b:?}");
    for ((sa, la), (sb, lb)) in a.iter().zip(b) {
        assert_eq!(sa, sb);
        assert!((la - lb).abs() <= 1e-5, "step {sa}: {la} vs {lb}");
    }
}

/// Records what a session reports; breaks after step `stop_at`.
#[derive(Default)]
struct Recorder {
    events: Vec<String>,
    stop_at: Option<usize>,
}

impl burnlens::train::Observer for Recorder {
    fn started(&mut self, first: usize, total: usize, _log: usize) {
        self.events.push(format!("start {first}/{total}"));
    }
    fn step(&mut self, m: &burnlens::train::StepMetrics) -> std::ops::ControlFlow<()> {
        self.events.push(format!("step {}", m.step));
        if self.stop_at == Some(m.step) { std::ops::ControlFlow::Break(()) } else { std::ops::ControlFlow::Continue(()) }
    }
    fn evaluated(&mut self, step: usize, _val: f64) {
        self.events.push(format!("eval {step}"));
    }
    fn checkpointed(&mut self, step: usize, _dir: &Path) {
        self.events.push(format!("checkpoint {step}"));
    }
    fn finished(&mut self) {
        self.events.push("finished".into());
    }
}

/// The session's small steps, driven by hand, are the loop `train` runs: the same losses,
/// and the observer hears every step, evaluation and checkpoint in order.
#[test]
fn a_session_driven_step_by_step_is_the_training_loop() {
    let _guard = ONE_RUN_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().unwrap();
    let (looped, by_hand) = (tmp.path().join("loop"), tmp.path().join("hand"));
    let sets = ["training.steps=6", "training.eval_interval=3", "training.checkpoint_interval=2"];
    let mut rec = Recorder::default();
    burnlens::train::train(&config(TINY, &looped, &sets), &TrainOptions::default(), &mut rec).unwrap();
    assert_eq!(
        rec.events.join(", "),
        "start 0/6, step 1, step 2, checkpoint 2, step 3, eval 3, step 4, checkpoint 4, step 5, step 6, eval 6, checkpoint 6, finished"
    );

    let mut s = burnlens::train::TrainSession::open(&config(TINY, &by_hand, &sets), &TrainOptions::default(), &mut rec).unwrap();
    let mut seen = Vec::new();
    while !s.is_done() {
        let m = s.step().unwrap();
        assert_eq!(m.step, s.steps_done());
        seen.push((m.step, s.evaluation_due(), s.checkpoint_due()));
        if s.evaluation_due() {
            s.evaluate().unwrap();
        }
        if s.checkpoint_due() {
            s.checkpoint().unwrap();
        }
    }
    assert_eq!(seen, [(1, false, false), (2, false, true), (3, true, false), (4, false, true), (5, false, false), (6, true, true)]);
    let summary = s.finish(&mut rec).unwrap();
    assert_eq!(summary.steps, 6);
    assert_same_curve(&losses(&looped), &losses(&by_hand));
    assert_eq!(load_run(&by_hand, &burn::tensor::Device::flex()).unwrap().state.step, 6);
}

/// An observer that breaks (Python's `on_step` raising) stops the run after a checkpoint of
/// that step, and the run resumes from it onto the uninterrupted curve.
#[test]
fn an_observer_that_breaks_stops_after_a_checkpoint_and_the_run_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let (full, part) = (tmp.path().join("full"), tmp.path().join("part"));
    train(&config(TINY, &full, &[]), &TrainOptions::default()).unwrap();
    let e = {
        let _guard = ONE_RUN_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let mut rec = Recorder { stop_at: Some(5), ..Default::default() };
        burnlens::train::train(&config(TINY, &part, &[]), &TrainOptions::default(), &mut rec).unwrap_err()
    };
    let TrainError::Interrupted { step, checkpoint } = e else { panic!("expected an interruption, got {e}") };
    assert_eq!(step, 5);
    assert!(checkpoint.ends_with("step-000005"), "{}", checkpoint.display());
    train(&config(TINY, &part, &[]), &TrainOptions { resume: true, ..Default::default() }).unwrap();
    assert_same_curve(&losses(&full), &losses(&part));
}

#[test]
fn resumed_run_repeats_the_uninterrupted_loss_curve() {
    let tmp = tempfile::tempdir().unwrap();
    let full = tmp.path().join("full");
    let s = train(&config(TINY, &full, &[]), &TrainOptions::default()).unwrap();
    assert_eq!(s.steps, 16);

    let part = tmp.path().join("part");
    train(&config(TINY, &part, &["training.steps=8"]), &TrainOptions::default()).unwrap();
    let first_half = losses(&part);
    assert_eq!(first_half.len(), 8);
    let opts = TrainOptions { resume: true, ..Default::default() };
    train(&config(TINY, &part, &[]), &opts).unwrap();
    let a = losses(&full);
    let b = losses(&part);
    assert_same_curve(&a, &b);
    assert!(full.join("loss.svg").is_file() && full.join("checkpoints/LATEST").is_file());
}

#[test]
fn training_on_shakespeare_lowers_the_loss() {
    let Some(data) = shared_data() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let text = data.join("tinyshakespeare.txt").display().to_string();
    let cfg = config(
        &std::fs::read_to_string("configs/tiny-char.toml").unwrap(),
        &tmp.path().join("run"),
        &[&format!("data.path={text:?}"), "training.steps=60", "output.export=false"],
    );
    let s = train(&cfg, &TrainOptions::default()).unwrap();
    let curve = losses(&s.run_dir);
    let first = curve[0].1;
    assert!((first - 65f64.ln()).abs() < 0.3, "an untrained char model starts near ln(65): {first}");
    let val = s.final_val_loss.unwrap();
    assert!(val < first - 0.8, "validation loss after 60 steps: {val}, first training loss {first}");
}

#[test]
fn a_finished_run_directory_is_not_overwritten() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    train(&config(TINY, &dir, &["training.steps=2"]), &TrainOptions::default()).unwrap();
    let before = std::fs::read(dir.join("checkpoints/LATEST")).unwrap();
    let e = train(&config(TINY, &dir, &["training.steps=2"]), &TrainOptions::default()).unwrap_err();
    assert!(e.to_string().contains("already holds a training run; continue it with --resume"), "{e}");
    assert_eq!(std::fs::read(dir.join("checkpoints/LATEST")).unwrap(), before);
}

#[test]
fn nan_loss_stops_and_keeps_the_last_good_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    let cfg = config(
        TINY,
        &dir,
        &["training.learning_rate=1e30", "training.warmup_steps=0", "training.checkpoint_interval=1", "training.dropout=0.0", "training.grad_clip=0.0"],
    );
    let e = train(&cfg, &TrainOptions::default()).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, TrainError::NonFinite { .. }), "{msg}");
    assert!(msg.contains("stopped without saving it. The last good checkpoint is"), "{msg}");
    let run = load_run(&dir, &Device::flex()).unwrap();
    assert!(run.state.step >= 1, "a checkpoint before the bad step survives");
}

#[test]
fn char_and_bpe_data_split_as_nanogpt() {
    let Some(data) = shared_data() else { return };
    let text = data.join("tinyshakespeare.txt");
    let tok = data.join("gpt2/tokenizer.json");
    let bpe = Tokenizer::from_file(&tok).unwrap();
    assert_eq!(bpe.encode("The meaning of life is").unwrap(), vec![464, 3616, 286, 1204, 318]);
    assert_eq!(bpe.encode("Hello world").unwrap(), vec![15496, 995]);
    assert_eq!(bpe.vocab_size(), 50257);

    let section = |kind: &str| {
        let t = format!("kind = {kind:?}\npath = {:?}\ntokenizer = {:?}\n", text.display().to_string(), tok.display().to_string());
        toml::from_str::<burnlens::train::config::DataSection>(&t).unwrap()
    };
    let chars = Dataset::load(&section("char"), 64).unwrap();
    assert_eq!(chars.vocab_size, 65);
    assert_eq!((chars.summary()["train_tokens"].as_u64(), chars.summary()["val_tokens"].as_u64()), (Some(1_003_854), Some(111_540)));
    let bpe = Dataset::load(&section("bpe"), 64).unwrap();
    assert_eq!((bpe.summary()["train_tokens"].as_u64(), bpe.summary()["val_tokens"].as_u64()), (Some(301_966), Some(36_059)));

    // Batches are windows of the split, drawn reproducibly.
    let mut r1 = burnlens::model::Rng::new(5);
    let mut r2 = burnlens::model::Rng::new(5);
    assert_eq!(chars.batch(Split::Train, &mut r1, 3, 64), chars.batch(Split::Train, &mut r2, 3, 64));
}

#[test]
fn export_loads_back_with_the_same_logits() {
    let Some(data) = shared_data() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let text = data.join("tinyshakespeare.txt").display().to_string();
    for family in ["gpt2", "gpt_neo"] {
        let dir = tmp.path().join(family);
        let mut sets = vec![format!("data.path={text:?}"), format!("model.family={family:?}"), "training.steps=3".to_string()];
        if family == "gpt_neo" {
            sets.push("model.window=5".into());
        }
        let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
        let cfg = config(&std::fs::read_to_string("configs/tiny-char.toml").unwrap(), &dir, &sets);
        let s = train(&cfg, &TrainOptions::default()).unwrap();
        let hf = s.exported.expect("exported");
        assert!(hf.join("config.json").is_file() && hf.join("char_vocab.json").is_file());
        let run = load_run(&dir, &Device::flex()).unwrap();
        let again = load_model(&hf, &Device::flex()).unwrap();
        assert_eq!(again.hf.family.to_string(), family);
        assert_eq!(again.model.config, run.model.config);
        let ids: Vec<i64> = (0..20).map(|i| (i * 7 % 65) as i64).collect();
        let a: Vec<f32> = run.model.forward(run.model.ids_tensor(&ids)).into_data().try_into_vec_as::<f32>().unwrap();
        let b: Vec<f32> = again.model.forward(again.model.ids_tensor(&ids)).into_data().try_into_vec_as::<f32>().unwrap();
        assert_eq!(max_abs_diff(&a, &b), 0.0, "{family}: re-imported export differs");
        // The run and its export, each loaded as "any model": told apart by their layout.
        assert!(is_run_dir(&dir) && !is_run_dir(&hf));
        let opts = burnlens::hf::LoadOptions::default();
        let (from_run, from_hf) = (load_any(&dir, &Device::flex(), &opts).unwrap(), load_any(&hf, &Device::flex(), &opts).unwrap());
        assert_eq!(from_run.model.config, from_hf.model.config);
        assert!(from_run.tokenizer.is_some() && from_hf.tokenizer.is_some(), "{family}: the char vocabulary travels with both");
        let c: Vec<f32> = from_hf.model.forward(from_hf.model.ids_tensor(&ids)).into_data().try_into_vec_as::<f32>().unwrap();
        assert_eq!(max_abs_diff(&a, &c), 0.0);
    }
}

/// The tiny Llama- and Pythia-style configs train (the loss falls), resume exactly, export
/// as their Hugging Face family and load back with identical logits.
#[test]
fn llama_and_pythia_style_configs_train_resume_and_export() {
    let Some(data) = shared_data() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let text = data.join("tinyshakespeare.txt").display().to_string();
    for (config_file, family) in [("configs/tiny-llama-char.toml", "llama"), ("configs/tiny-pythia-char.toml", "gpt_neox")] {
        let toml = std::fs::read_to_string(config_file).unwrap();
        let full = tmp.path().join(format!("{family}-full"));
        let sets = [format!("data.path={text:?}"), "training.steps=12".into(), "training.eval_interval=6".into(), "training.checkpoint_interval=6".into()];
        let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
        let s = train(&config(&toml, &full, &sets), &TrainOptions::default()).unwrap();
        let curve = losses(&full);
        assert!(curve.last().unwrap().1 < curve[0].1 - 0.3, "{family}: loss did not fall: {curve:?}");
        // Exact resume.
        let part = tmp.path().join(format!("{family}-part"));
        let mut first = sets.clone();
        first[1] = "training.steps=6";
        train(&config(&toml, &part, &first), &TrainOptions::default()).unwrap();
        train(&config(&toml, &part, &sets), &TrainOptions { resume: true, ..Default::default() }).unwrap();
        assert_same_curve(&losses(&full), &losses(&part));
        // Export and reload.
        let hf = s.exported.expect("exported");
        let again = load_model(&hf, &Device::flex()).unwrap();
        assert_eq!(again.hf.family.to_string(), family);
        let run = load_run(&full, &Device::flex()).unwrap();
        assert_eq!(again.model.config, run.model.config);
        let ids: Vec<i64> = (0..24).map(|i| (i * 7 % 65) as i64).collect();
        let a: Vec<f32> = run.model.forward(run.model.ids_tensor(&ids)).into_data().try_into_vec_as::<f32>().unwrap();
        let b: Vec<f32> = again.model.forward(again.model.ids_tensor(&ids)).into_data().try_into_vec_as::<f32>().unwrap();
        assert_eq!(max_abs_diff(&a, &b), 0.0, "{family}: re-imported export differs");
    }
}

#[test]
fn greedy_decoding_with_and_without_the_cache_agree_and_sampling_is_seeded() {
    for name in ["gpt2", "gpt_neo_local", "pythia_like", "llama_gqa", "mistral_window"] {
        let model = load_model(&fixture(name), &Device::flex()).unwrap().model;
        let prompt = [3i64, 14, 15, 92, 65];
        let greedy = Sampling { max_new_tokens: 20, temperature: 0.0, ..Default::default() };
        let cached = generate(&model, &prompt, &greedy).unwrap();
        let uncached = generate(&model, &prompt, &Sampling { use_cache: false, ..greedy.clone() }).unwrap();
        assert_eq!(cached, uncached, "{name}");
        assert_eq!(cached.len(), 20);
        // The fixtures' logits are huge (peaked on purpose): a high temperature spreads them.
        let hot = Sampling { max_new_tokens: 20, temperature: 30.0, top_k: Some(20), top_p: Some(0.95), seed: 9, ..Default::default() };
        let a = generate(&model, &prompt, &hot).unwrap();
        assert_eq!(a, generate(&model, &prompt, &hot).unwrap(), "same seed, same tokens");
        assert_ne!(a, generate(&model, &prompt, &Sampling { seed: 10, ..hot.clone() }).unwrap(), "another seed differs");
        // The context (32) caps the output.
        let long = generate(&model, &prompt, &Sampling { max_new_tokens: 100, ..greedy }).unwrap();
        assert_eq!(long.len(), 32 + 1 - prompt.len());
    }
}

// ---- the CLI ---------------------------------------------------------------------------

fn write_config(dir: &Path, text: &str) -> PathBuf {
    let p = dir.join("run.toml");
    std::fs::write(&p, text.replace("dir = \"unused\"", &format!("dir = {:?}", dir.join("run").display().to_string()))).unwrap();
    p
}

#[test]
fn bad_training_inputs_are_one_line_errors_and_lose_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write_config(tmp.path(), TINY);
    let c = cfg.to_str().unwrap();
    let empty = tmp.path().join("empty.txt");
    std::fs::write(&empty, "").unwrap();
    let latin1 = tmp.path().join("latin1.txt");
    std::fs::write(&latin1, b"caf\xe9 au lait").unwrap();
    let e = empty.display().to_string();
    let l = latin1.display().to_string();
    assert_bad_input(&burnlens(&["train", "--config", c, "--set", "data.kind=char", "--set", "data.path=/no/such/file.txt"]), "/no/such/file.txt");
    assert_bad_input(&burnlens(&["train", "--config", c, "--set", "data.kind=char", "--set", &format!("data.path={e}")]), "the data file is empty");
    assert_bad_input(
        &burnlens(&["train", "--config", c, "--set", "data.kind=char", "--set", &format!("data.path={l}")]),
        "not UTF-8 text (invalid byte at offset 3)",
    );
    assert_bad_input(
        &burnlens(&["train", "--config", c, "--set", "training.block_size=64"]),
        "training.block_size = 64 is larger than the model's context (model.context = 16)",
    );
    assert_bad_input(&burnlens(&["train", "--config", c, "--set", "training.stepz=1"]), "training.stepz: unknown field `stepz`");
    assert_bad_input(&burnlens(&["train", "--config", c, "--set", "training.steps=-1"]), "training.steps: invalid value");
    // The family is typed: an unknown one is refused while the config is read, naming the key and the choices.
    assert_bad_input(
        &burnlens(&["train", "--config", c, "--set", "model.family=\"gpt5\""]),
        "model.family: unknown family \"gpt5\"; expected one of gpt2, gpt_neo, gpt_neox, llama, qwen2, mistral, qwen3, olmo2, gptj, gemma2, gemma3_text, phi3",
    );
    assert_bad_input(&burnlens(&["train", "--config", c, "--backend", "quantum"]), "unknown backend \"quantum\"");
    assert_bad_input(&burnlens(&["train", "--config", c, "--set", "backend.name=quantum"]), "unknown backend \"quantum\"");
    if let Some(data) = shared_data() {
        // A tokenizer with more ids than the model it fine-tunes.
        let fine_tune = format!(
            "[model]\nfrom = {:?}\n[data]\nkind = \"bpe\"\npath = {:?}\ntokenizer = {:?}\n[training]\nblock_size = 16\n[output]\ndir = {:?}\n",
            fixture("gpt2").display().to_string(),
            data.join("tinyshakespeare.txt").display().to_string(),
            data.join("gpt2/tokenizer.json").display().to_string(),
            tmp.path().join("ft").display().to_string()
        );
        let ft = tmp.path().join("ft.toml");
        std::fs::write(&ft, fine_tune).unwrap();
        assert_bad_input(&burnlens(&["train", "--config", ft.to_str().unwrap()]), "the data's vocabulary has 50257 tokens but the model's has only 128");
    }
    // None of that created or touched a run.
    assert!(!tmp.path().join("run/checkpoints/LATEST").exists());
    // A good run, then a bad restart of the same directory, keeps the checkpoint.
    let o = burnlens(&["train", "--config", c, "--set", "training.steps=2", "--quiet"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let latest = std::fs::read(tmp.path().join("run/checkpoints/LATEST")).unwrap();
    assert_bad_input(&burnlens(&["train", "--config", c]), "already holds a training run");
    assert_bad_input(&burnlens(&["train", "--resume", tmp.path().join("run").to_str().unwrap(), "--set", "training.bogus=1"]), "unknown field `bogus`");
    assert_eq!(std::fs::read(tmp.path().join("run/checkpoints/LATEST")).unwrap(), latest);
}

#[cfg(unix)]
#[test]
fn ctrl_c_checkpoints_exits_130_and_resume_finishes_the_same_curve() {
    let tmp = tempfile::tempdir().unwrap();
    let text = TINY
        .replace("steps = 16", "steps = 60")
        .replace("lr_decay_steps = 16", "lr_decay_steps = 60")
        .replace("checkpoint_interval = 8", "checkpoint_interval = 1000");
    let cfg = write_config(tmp.path(), &text);
    let run = tmp.path().join("run");
    let child = Command::new(env!("CARGO_BIN_EXE_burnlens"))
        .args(["train", "--config", cfg.to_str().unwrap(), "--quiet"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until a few steps are logged, then interrupt.
    let metrics = run.join("metrics.jsonl");
    let t0 = std::time::Instant::now();
    while std::fs::read_to_string(&metrics).map_or(0, |s| s.lines().count()) < 5 {
        assert!(t0.elapsed().as_secs() < 120, "training did not start");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert!(err.contains("interrupted at step") && err.contains("checkpoint written to"), "{err}");
    let stopped = load_run(&run, &Device::flex()).unwrap().state.step;
    assert!((4..60).contains(&stopped), "stopped at {stopped}");

    let o = burnlens(&["train", "--resume", run.to_str().unwrap(), "--quiet"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let reference = tmp.path().join("reference");
    train(&config(&text, &reference, &[]), &TrainOptions::default()).unwrap();
    assert_same_curve(&losses(&reference), &losses(&run));
}

#[test]
fn sample_cli_on_a_model_directory_and_a_run() {
    let o = burnlens(&["sample", "--model", fixture("gpt2").to_str().unwrap(), "--ids", "1,2,3", "--max-new-tokens", "5", "--temperature", "0"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let ids: Vec<i64> = String::from_utf8_lossy(&o.stdout).trim().split(',').map(|s| s.parse().unwrap()).collect();
    let model = load_model(&fixture("gpt2"), &Device::flex()).unwrap().model;
    let want = generate(&model, &[1, 2, 3], &Sampling { max_new_tokens: 5, ..Default::default() }).unwrap();
    assert_eq!(ids, want);
    assert_bad_input(
        &burnlens(&["sample", "--model", fixture("gpt2").to_str().unwrap(), "--prompt", "hi"]),
        "has no tokenizer.json or char_vocab.json; pass token ids with --ids",
    );
    assert_bad_input(
        &burnlens(&["sample", "--model", fixture("gpt2").to_str().unwrap(), "--ids", "1", "--top-p", "1.5"]),
        "`top_p` must be in (0, 1], found 1.5",
    );

    let Some(data) = shared_data() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let o = burnlens(&[
        "train",
        "--config",
        "configs/tiny-char.toml",
        "--quiet",
        "--set",
        &format!("data.path={:?}", data.join("tinyshakespeare.txt").display().to_string()),
        "--set",
        &format!("output.dir={:?}", run.display().to_string()),
        "--set",
        "training.steps=2",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = burnlens(&["sample", "--model", run.to_str().unwrap(), "--prompt", "ROMEO:", "--max-new-tokens", "10", "--seed", "1"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.starts_with("ROMEO:") && text.trim_end().chars().count() >= 16, "{text}");
    assert_bad_input(
        &burnlens(&["sample", "--model", run.to_str().unwrap(), "--prompt", "ROMEO€"]),
        "character '€' at position 5 is not in the vocabulary of 65 characters",
    );
    assert_bad_input(&burnlens(&["sample", "--model", run.to_str().unwrap(), "--prompt", ""]), "encodes to no tokens");
    let out = tmp.path().join("exported");
    let o = burnlens(&["export", "--run", run.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert!(o.status.success() && out.join("model.safetensors").is_file());
}
