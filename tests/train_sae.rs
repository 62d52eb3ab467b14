//! `burnlens train-sae` end to end: a run on a corpus file, a run killed with SIGKILL and
//! resumed that ends bit-identical to an uninterrupted one, and bad input refused in one line.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{assert_bad_input, burnlens, fixture};

const MODEL: &str = "tests/fixtures/trained_gpt2_char";

fn args<'a>(out: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec!["train-sae", "--model", MODEL, "--hook", "blocks.1.hook_resid_pre", "--d-sae", "64", "--batch", "4", "--seq-len", "16", "--out", out];
    a.extend_from_slice(extra);
    a
}

#[test]
fn a_corpus_run_writes_an_sae_in_saelens_layout_and_metrics() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let corpus = fixture("data").join("corpus.parquet");
    let o = burnlens(&args(out.to_str().unwrap(), &["--architecture", "jumprelu", "--l0", "0.01", "--steps", "12", "--data", corpus.to_str().unwrap()]));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // On the CPU backend the steps take the host passes, and the summary says so.
    let said = String::from_utf8_lossy(&o.stdout);
    assert!(said.contains("each step ran as the hand-written passes over host memory"), "{said}");
    let cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out.join("sae/cfg.json")).unwrap()).unwrap();
    assert_eq!(cfg["architecture"], "jumprelu");
    assert_eq!(cfg["metadata"]["hook_name"], "blocks.1.hook_resid_pre");
    let st = std::fs::read(out.join("sae/sae_weights.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&st).unwrap();
    assert_eq!(st.tensor("threshold").unwrap().shape(), [64]);
    let lines = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    let last: serde_json::Value = serde_json::from_str(lines.lines().last().unwrap()).unwrap();
    assert_eq!(last["step"], 12);
    assert!(last["mse_loss"].as_f64().is_some() && last["l0_loss"].as_f64().is_some(), "{last}");
    // The SAE runs on the model through `burnlens sae`.
    let report = tmp.path().join("report");
    let o = burnlens(&["sae", "--model", MODEL, "--sae", out.join("sae").to_str().unwrap(), "--ids", "1,2,3,4,5", "--out", report.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // SAELens's metrics of it over windows of the same corpus.
    let metrics = tmp.path().join("metrics.json");
    let eval = |batches: &str| {
        burnlens(&[
            "eval-sae",
            "--model",
            MODEL,
            "--sae",
            out.join("sae").to_str().unwrap(),
            "--data",
            corpus.to_str().unwrap(),
            "--seq-len",
            "16",
            "--batches",
            batches,
            "--batch-size",
            "4",
            "--out",
            metrics.to_str().unwrap(),
        ])
    };
    let o = eval("3");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let m: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&metrics).unwrap()).unwrap();
    let ev = m["metrics"]["reconstruction_quality"]["explained_variance"].as_f64().unwrap();
    assert!(ev.is_finite() && ev <= 1.0, "{m}");
    assert_eq!(m["metrics"]["token_stats"]["total_tokens_eval_sparsity_variance"], 3 * 4 * 16);
    assert_eq!(m["feature_metrics"]["feature_density"].as_array().unwrap().len(), 64);
    assert!(m["metrics"]["model_performance_preservation"]["ce_loss_score"].as_f64().is_some());
    // More windows than the corpus holds: said in one line, nothing written.
    std::fs::remove_file(&metrics).unwrap();
    assert_bad_input(&eval("1000"), "ran out after");
    assert!(!metrics.exists());
}

fn weights(dir: &Path) -> Vec<u8> {
    std::fs::read(dir.join("sae/sae_weights.safetensors")).unwrap()
}

#[test]
fn a_run_killed_mid_way_resumes_and_ends_bit_identical() {
    let tmp = tempfile::tempdir().unwrap();
    let extra = ["--architecture", "topk", "--k", "4", "--steps", "1500", "--checkpoint-every", "100", "--data", "random", "--seed", "5"];
    let whole = tmp.path().join("whole");
    let o = burnlens(&args(whole.to_str().unwrap(), &extra));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    let killed = tmp.path().join("killed");
    let a = args(killed.to_str().unwrap(), &extra);
    let mut child = Command::new(env!("CARGO_BIN_EXE_burnlens")).args(&a).env_remove("BURNLENS_BACKEND").spawn().unwrap();
    let ckpt = killed.join("checkpoints/LATEST");
    let t0 = Instant::now();
    while !ckpt.exists() && t0.elapsed() < Duration::from_secs(120) {
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(30));
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(ckpt.exists(), "a checkpoint was written before the kill");
    assert!(!killed.join("sae").exists(), "killed before the end (make the run longer if this fails)");
    let o = burnlens(&a);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(stdout.contains("resumed at step"), "{stdout}");
    assert!(weights(&whole) == weights(&killed), "the resumed run's SAE differs from the uninterrupted run's");
}

#[test]
fn bad_input_is_one_line_naming_what_is_wrong() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let out = out.to_str().unwrap();
    assert_bad_input(&burnlens(&["train-sae", "--model", MODEL, "--hook", "blocks.9.hook_resid_pre", "--out", out]), "blocks.9.hook_resid_pre");
    let long = ["train-sae", "--model", MODEL, "--hook", "blocks.1.hook_resid_pre", "--seq-len", "100000", "--out", out];
    assert_bad_input(&burnlens(&long), "context_size");
    let corpus = fixture("data").join("corpus.parquet");
    assert_bad_input(&burnlens(&args(out, &["--data", corpus.to_str().unwrap(), "--column", "body"])), "`body`");
    assert_bad_input(&burnlens(&args(out, &["--architecture", "gated"])), "'gated'");
    // A coefficient given to an architecture it does not belong to is refused, not ignored.
    assert_bad_input(&burnlens(&args(out, &["--architecture", "topk", "--l1", "0.5"])), "l1: the sparsity coefficient of standard, not of topk");
    assert_bad_input(&burnlens(&args(out, &["--data", "no/such-dataset-here"])), "no/such-dataset-here");
    // A run directory holding another run's configuration is not overwritten.
    assert!(burnlens(&args(out, &["--steps", "2"])).status.success());
    let before = std::fs::read(Path::new(out).join("config.json")).unwrap();
    assert_bad_input(&burnlens(&args(out, &["--steps", "3"])), "another configuration");
    assert_eq!(std::fs::read(Path::new(out).join("config.json")).unwrap(), before);
}

/// `burnlens graph` on the fixture prompt with the transcoders in `dir`: its graph.json.
fn graph_json(model: &std::path::Path, dir: &std::path::Path, out: &std::path::Path) -> serde_json::Value {
    let (model, dir, out) = (model.to_str().unwrap(), dir.to_str().unwrap(), out.to_str().unwrap());
    let o = burnlens(&["graph", "--model", model, "--transcoders", dir, "--ids", "1,17,5,60,33,2,71,12,44", "--out", out]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_str(&std::fs::read_to_string(std::path::Path::new(out).join("graph.json")).unwrap()).unwrap()
}

#[test]
fn transcoders_trained_by_train_sae_load_as_a_set_and_are_traced_by_graph() {
    use burnlens::lens::Rule;
    use burnlens::trace::TranscoderSet;
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let model = fixture("trace").join("gpt2").join("model");
    let o = burnlens(&[
        "train-sae",
        "--model",
        model.to_str().unwrap(),
        "--transcoders",
        "--skip",
        "--architecture",
        "jumprelu",
        "--l0",
        "0.001",
        "--d-sae",
        "64",
        "--steps",
        "30",
        "--batch",
        "4",
        "--seq-len",
        "16",
        "--data",
        "random",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let dir = out.join("transcoders");
    let yaml = std::fs::read_to_string(dir.join("config.yaml")).unwrap();
    assert!(
        yaml.contains("model_kind: transcoder_set")
            && yaml.contains("feature_input_hook: ln2.hook_normalized")
            && yaml.contains("feature_output_hook: hook_mlp_out"),
        "{yaml}"
    );
    let set = TranscoderSet::load(&dir, &burn::tensor::Device::flex()).unwrap();
    assert_eq!(set.n_layers(), 3);
    assert!(set.layers.iter().all(|t| t.w_skip.is_some() && matches!(t.rule, Rule::JumpRelu { .. }) && t.d_sae() == 64));
    let g = graph_json(&model, &dir, &tmp.path().join("graph"));
    let features = g["nodes"].as_array().unwrap().iter().filter(|n| n["feature_type"] == "cross layer transcoder").count();
    assert!(features > 0, "the pruned graph keeps some of the trained features");
}

#[test]
fn a_cross_layer_transcoder_trained_by_train_sae_loads_as_a_clt_and_is_traced_by_graph() {
    use burnlens::lens::Rule;
    use burnlens::trace::TranscoderSet;
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let model = fixture("trace").join("gpt2").join("model");
    let mut a = vec!["train-sae", "--model", model.to_str().unwrap(), "--transcoders", "--cross-layer", "--architecture", "jumprelu"];
    a.extend(["--l0", "0.001", "--d-sae", "24", "--steps", "30", "--batch", "4", "--seq-len", "16", "--data", "random", "--out", out.to_str().unwrap()]);
    let o = burnlens(&a);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let dir = out.join("transcoders");
    let yaml = std::fs::read_to_string(dir.join("config.yaml")).unwrap();
    assert!(yaml.contains("model_kind: cross_layer_transcoder") && yaml.contains("activation_function: jump_relu"), "{yaml}");
    let set = TranscoderSet::load(&dir, &burn::tensor::Device::flex()).unwrap();
    assert!(set.cross_layer && set.n_layers() == 3);
    for (i, t) in set.layers.iter().enumerate() {
        assert!(matches!(t.rule, Rule::JumpRelu { .. }) && t.d_sae() == 24 && t.w_dec.len() == 3 - i);
        // Every decoder block was trained (none left at its masked zero).
        assert!(t.w_dec.iter().all(|w| w.clone().abs().sum().into_scalar::<f32>() > 0.0), "layer {i}");
    }
    let g = graph_json(&model, &dir, &tmp.path().join("graph"));
    assert!(g["nodes"].as_array().unwrap().iter().any(|n| n["feature_type"] == "cross layer transcoder"));
    // A CLT with a skip connection cannot be written in circuit-tracer's files: refused up front.
    let refused = tmp.path().join("refused");
    let o = burnlens(&[
        "train-sae",
        "--model",
        model.to_str().unwrap(),
        "--transcoders",
        "--cross-layer",
        "--skip",
        "--data",
        "random",
        "--out",
        refused.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!((o.status.code(), err.trim().lines().count()), (Some(2), 1), "{err}");
    assert!(err.contains("cross_layer") && !refused.exists(), "{err}");
}

#[test]
fn ctrl_c_checkpoints_exits_130_and_the_same_command_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let extra = ["--steps", "3000", "--checkpoint-every", "1000000", "--data", "random"];
    let a = args(out.to_str().unwrap(), &extra);
    let child = Command::new(env!("CARGO_BIN_EXE_burnlens")).args(&a).env_remove("BURNLENS_BACKEND").stderr(std::process::Stdio::piped()).spawn().unwrap();
    let metrics = out.join("metrics.jsonl");
    let t0 = Instant::now();
    while !metrics.exists() && t0.elapsed() < Duration::from_secs(120) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap().success());
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(130), "{err}");
    assert!(err.contains("interrupted at step") && err.contains("checkpoints/step-"), "{err}");
    assert!(out.join("checkpoints/LATEST").exists() && !out.join("sae").exists());
    let o = burnlens(&a);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("resumed at step"));
    assert!(out.join("sae/sae_weights.safetensors").exists());
}

#[test]
fn training_from_an_activation_cache_equals_training_from_the_model() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let o = burnlens(&[
        "cache-activations",
        "--model",
        MODEL,
        "--hook",
        "blocks.1.hook_resid_pre,blocks.0.hook_mlp_out",
        "--data",
        "random",
        "--seq-len",
        "16",
        "--batch",
        "4",
        "--windows",
        "400",
        "--chunks-per-shard",
        "7",
        "--seed",
        "3",
        "--out",
        cache.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let index: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(cache.join("cache.json")).unwrap()).unwrap();
    assert_eq!(index["complete"], true);
    assert_eq!(index["shards"].as_array().unwrap().len(), 15, "100 passes of 4 windows, 7 a shard: {index}");
    let train = ["--architecture", "topk", "--k", "4", "--steps", "30", "--seed", "3", "--checkpoint-every", "10"];
    let from_model = tmp.path().join("from-model");
    let mut a = args(from_model.to_str().unwrap(), &["--data", "random"]);
    a.extend_from_slice(&train);
    assert!(burnlens(&a).status.success());
    let from_cache = tmp.path().join("from-cache");
    let mut b = vec![
        "train-sae",
        "--from-cache",
        cache.to_str().unwrap(),
        "--hook",
        "blocks.1.hook_resid_pre",
        "--d-sae",
        "64",
        "--batch",
        "4",
        "--out",
        from_cache.to_str().unwrap(),
    ];
    b.extend_from_slice(&train);
    let o = burnlens(&b);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(weights(&from_model) == weights(&from_cache), "the SAE trained from the cache differs from the one trained from the model");
    // A hook the cache does not hold is named.
    let c = tmp.path().join("c");
    let bad = ["train-sae", "--from-cache", cache.to_str().unwrap(), "--hook", "blocks.1.hook_resid_post", "--out", c.to_str().unwrap()];
    assert_bad_input(&burnlens(&bad), "blocks.1.hook_resid_post");

    // A reader that seeks past k passes gives the passes after them (whole shards skipped).
    let hooks = ["blocks.1.hook_resid_pre".to_string()];
    let chunks = |dir: &Path, skip: u64| {
        let mut r = burnlens::features::CacheReader::open(dir, &hooks).unwrap();
        r.seek(skip).unwrap();
        std::iter::from_fn(move || r.next_chunk().unwrap()).collect::<Vec<_>>()
    };
    let all = chunks(&cache, 0);
    assert_eq!(all.len(), 100);
    for k in [1, 6, 7, 8, 50, 99, 100] {
        assert!(chunks(&cache, k) == all[k as usize..], "after seeking past {k} passes");
    }
    // An unfinished cache continues from the position its index kept: the same passes as
    // a cache written at once.
    let part = tmp.path().join("part");
    let cache_args = |windows: &'static str| -> Vec<String> {
        let mut v: Vec<String> =
            ["cache-activations", "--model", MODEL, "--hook", "blocks.1.hook_resid_pre", "--data", "random", "--seq-len", "16", "--batch", "4"]
                .map(String::from)
                .to_vec();
        v.extend(["--windows", windows, "--chunks-per-shard", "7", "--seed", "3", "--out", part.to_str().unwrap()].map(String::from));
        v
    };
    let run = |a: Vec<String>| burnlens(&a.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(run(cache_args("200")).status.success());
    let index_path = part.join("cache.json");
    let index = std::fs::read_to_string(&index_path).unwrap();
    assert!(index.contains("\"position\"") && index.contains("\"complete\": true"), "{index}");
    std::fs::write(&index_path, index.replace("\"complete\": true", "\"complete\": false")).unwrap();
    let o = run(cache_args("400"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(chunks(&part, 0) == all, "a continued cache holds the passes of one written at once");
}

#[test]
fn a_toml_config_gives_the_same_run_as_the_flags() {
    let tmp = tempfile::tempdir().unwrap();
    let by_flags = tmp.path().join("flags");
    let a = args(by_flags.to_str().unwrap(), &["--architecture", "batchtopk", "--k", "4", "--steps", "12", "--seed", "2", "--data", "random"]);
    assert!(burnlens(&a).status.success());
    let cfg = tmp.path().join("run.toml");
    std::fs::write(&cfg, "[run]\nhook = \"blocks.1.hook_resid_pre\"\nd_sae = 64\nbatch = 4\narchitecture = \"batchtopk\"\nk = 4\nsteps = 12\nseed = 2\n\n[corpus]\ndata = \"random\"\nseq_len = 16\n").unwrap();
    let by_file = tmp.path().join("file");
    let o = burnlens(&["train-sae", "--model", MODEL, "--config", cfg.to_str().unwrap(), "--out", by_file.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(weights(&by_flags) == weights(&by_file));
    std::fs::write(&cfg, "[run]\nhook = \"blocks.1.hook_resid_pre\"\nlearning_rate = 1.0\n").unwrap();
    let o = burnlens(&["train-sae", "--model", MODEL, "--config", cfg.to_str().unwrap(), "--out", tmp.path().join("x").to_str().unwrap()]);
    assert_bad_input(&o, "learning_rate");
}
