//! Attribution graphs against circuit-tracer itself (`scripts/gen_trace_fixtures.py`, run
//! through `cargo xtask trace-fixtures`): tiny GPT-2, Llama (GQA, skip connections,
//! `max_feature_nodes`) and Gemma 2 (soft-caps, post-norms, JumpReLU,
//! `ln2.hook_normalized`) checkpoints with random transcoders in circuit-tracer's own layout,
//! GPT-2 with a cross-layer transcoder, and Gemma 2 with transcoders in Gemma Scope's
//! `params.npz` layout.
//! The same active features, logit targets and probabilities, selected features, adjacency,
//! pruned nodes and edges, and scores. Bad transcoder folders get one-line errors.

mod common;

use std::path::{Path, PathBuf};

use burn::tensor::Device;
use burnlens::hf::load_model;
use burnlens::lens::Rule;
use burnlens::trace::{AttributeOptions, LogitTargets, TraceError, TranscoderSet, attribute};
use common::*;

const CASES: [&str; 8] = ["gpt2", "gpt2_clt", "llama_skip", "llama_topk", "gemma2", "gemma2_scope", "gpt2_trained", "gpt2_clt_trained"];

fn case_dir(name: &str) -> PathBuf {
    let dir = fixture("trace").join(name);
    assert!(dir.join("case.json").is_file(), "{}: missing (run `cargo xtask trace-fixtures`)", dir.display());
    dir
}

fn options(case: &serde_json::Value) -> AttributeOptions {
    AttributeOptions {
        targets: LogitTargets::Salient {
            max_n_logits: case["max_n_logits"].as_u64().unwrap() as usize,
            desired_prob: case["desired_logit_prob"].as_f64().unwrap() as f32,
        },
        batch_size: case["batch_size"].as_u64().unwrap() as usize,
        max_feature_nodes: case["max_feature_nodes"].as_u64().map(|n| n as usize),
        ..AttributeOptions::default()
    }
}

/// `max |a - b| / max |b|`.
fn rel(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    max_abs_diff(a, b) / max_abs(b).max(1e-30)
}

#[test]
fn graphs_equal_circuit_tracers() {
    let device = Device::flex();
    for name in CASES {
        let dir = case_dir(name);
        let case: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("case.json")).unwrap()).unwrap();
        let want = read_safetensors(&dir.join("expected.safetensors"));
        let model = load_model(&dir.join("model"), &device).unwrap_or_else(|e| panic!("{name}: {e}")).model;
        let set = TranscoderSet::load(&dir.join("transcoders"), &device).unwrap_or_else(|e| panic!("{name}: {e}"));
        let ids: Vec<i64> = case["ids"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect();
        let g = attribute(&model, &set, &ids, &options(&case)).unwrap_or_else(|e| panic!("{name}: {e}"));

        assert_eq!(g.input_tokens, want["input_tokens"].i64, "{name}: input tokens");
        let active: Vec<i64> = g.active_features.iter().flatten().copied().collect();
        assert_eq!(active, want["active_features"].i64, "{name}: active features (layer, pos, feature)");
        assert!(rel(&g.activation_values, &want["activation_values"].f32) < 1e-5, "{name}: activation values");
        assert_eq!(g.logit_token_ids, want["logit_token_ids"].i64, "{name}: logit targets");
        assert!(rel(&g.logit_probabilities, &want["logit_probabilities"].f32) < 1e-5, "{name}: logit probabilities");
        assert_eq!(g.selected_features, want["selected_features"].i64, "{name}: selected features");
        let adj = rel(&g.dense_adjacency(), &want["adjacency_matrix"].f32);
        eprintln!("{name}: {} nodes, adjacency rel diff {adj:e}, max {}", g.n_nodes(), max_abs(&g.rows));
        assert!(adj < 1e-4, "{name}: adjacency differs by {adj:e} (relative to its largest entry)");

        // With no room for the attention patterns, each backward pass recomputes them.
        let lean = attribute(&model, &set, &ids, &AttributeOptions { pattern_budget: 0, ..options(&case) }).unwrap();
        assert_eq!(lean.selected_features, g.selected_features, "{name}: recomputed patterns select the same features");
        let lean_adj = rel(&lean.rows, &g.rows);
        assert!(lean_adj < 1e-5, "{name}: recomputed patterns change the rows by {lean_adj:e}");
        // With no room for the rows, they live in a mapped temporary file: the same graph.
        let mapped = attribute(&model, &set, &ids, &AttributeOptions { row_budget: 0, ..options(&case) }).unwrap();
        assert!(mapped.rows.is_mapped() && !g.rows.is_mapped(), "{name}: row budget");
        assert_eq!(mapped, g, "{name}: rows in a mapped file change the graph");
        assert_eq!(mapped.prune(0.8, 0.98).unwrap(), g.prune(0.8, 0.98).unwrap(), "{name}: pruning from mapped rows");

        let node_t = case["node_threshold"].as_f64().unwrap() as f32;
        let edge_t = case["edge_threshold"].as_f64().unwrap() as f32;
        let pruned = g.prune(node_t, edge_t).unwrap();
        let mask = |v: &[bool]| v.iter().map(|&b| b as i64).collect::<Vec<_>>();
        let want_nodes: Vec<i64> = want["node_mask"].f32.iter().map(|&x| x as i64).collect();
        assert_eq!(mask(&pruned.node_mask), want_nodes, "{name}: pruned node set");
        let n = g.n_nodes();
        let edges: Vec<i64> = (0..n * n).map(|i| g.node_row(i / n).is_some_and(|r| pruned.edge_mask[r * n + i % n]) as i64).collect();
        let want_edges: Vec<i64> = want["edge_mask"].f32.iter().map(|&x| x as i64).collect();
        assert_eq!(edges, want_edges, "{name}: pruned edge set");
        assert!(rel(&pruned.cumulative_scores, &want["cumulative_scores"].f32) < 1e-5, "{name}: cumulative scores");
        let (replacement, completeness) = g.scores().unwrap();
        let scores = &want["scores"].f32;
        assert!(
            (replacement - scores[0]).abs() < 1e-5 && (completeness - scores[1]).abs() < 1e-5,
            "{name}: scores ({replacement}, {completeness}) against {scores:?}"
        );
    }
}

/// Copy a fixture's transcoder folder to a temporary directory to break it.
fn broken_copy(name: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let src = case_dir(name).join("transcoders");
    for e in std::fs::read_dir(&src).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), tmp.path().join(e.file_name())).unwrap();
    }
    let dir = tmp.path().to_path_buf();
    (tmp, dir)
}

fn load_err(dir: &Path) -> String {
    let e: TraceError = TranscoderSet::load(dir, &Device::flex()).expect_err("a broken folder is refused");
    let msg = e.to_string();
    assert!(!msg.contains('\n'), "one line: {msg}");
    msg
}

#[test]
fn bad_transcoder_folders_get_one_line_errors() {
    // A missing layer file.
    let (_t, dir) = broken_copy("gpt2");
    std::fs::remove_file(dir.join("layer_1.safetensors")).unwrap();
    let msg = load_err(&dir);
    assert!(msg.contains("layer_1.safetensors"), "{msg}");

    // An unknown hook.
    let (_t, dir) = broken_copy("gpt2");
    let cfg = std::fs::read_to_string(dir.join("config.yaml")).unwrap().replace("hook_resid_mid", "hook_resid_sideways");
    std::fs::write(dir.join("config.yaml"), cfg).unwrap();
    let msg = load_err(&dir);
    assert!(msg.contains("hook_resid_sideways") && msg.contains("hook_resid_mid"), "{msg}");

    // A per-layer set loads as its files say whatever activation its config names, in any
    // spelling (circuit-tracer ignores the field there); a CLT's must agree with its files.
    for spelling in ["jump_relu", "jumprelu", "JumpReLU", "relu"] {
        let (_t, dir) = broken_copy("gpt2");
        let cfg = std::fs::read_to_string(dir.join("config.yaml")).unwrap() + &format!("activation_function: {spelling}\n");
        std::fs::write(dir.join("config.yaml"), cfg).unwrap();
        let set = TranscoderSet::load(&dir, &Device::flex()).unwrap_or_else(|e| panic!("activation_function: {spelling}: {e}"));
        assert!(set.layers.iter().all(|t| t.rule == Rule::Relu && t.threshold.is_none()), "{spelling}: the files have no thresholds");
    }
    for (spelling, loads) in [("jumprelu", true), ("JumpReLU", true), ("relu", false)] {
        let (_t, dir) = broken_copy("gpt2_clt");
        let cfg = std::fs::read_to_string(dir.join("config.yaml")).unwrap() + &format!("activation_function: {spelling}\n");
        std::fs::write(dir.join("config.yaml"), cfg).unwrap();
        match TranscoderSet::load(&dir, &Device::flex()) {
            Ok(_) => assert!(loads, "a CLT with thresholds said to be {spelling}"),
            Err(e) => assert!(!loads && e.to_string().contains("has a threshold"), "{spelling}: {e}"),
        }
    }

    // An activation the files cannot have.
    for (extra, needle) in [
        ("activation_function: topk\ntop_k: 0\n", "top_k `0`"),
        ("activation_function: topk\n", "no `top_k` field"),
        ("activation_function: softmax\n", "relu, jump_relu (jumprelu) or topk"),
    ] {
        let (_t, dir) = broken_copy("gpt2");
        let cfg = std::fs::read_to_string(dir.join("config.yaml")).unwrap() + extra;
        std::fs::write(dir.join("config.yaml"), cfg).unwrap();
        let msg = load_err(&dir);
        assert!(msg.contains("config.yaml") && msg.contains(needle), "{msg}");
    }

    // A tensor of the wrong shape: layer 0's b_dec cut short.
    let (_t, dir) = broken_copy("gpt2");
    let path = dir.join("layer_0.safetensors");
    let st = read_safetensors(&path);
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for (k, v) in &st {
        let (shape, vals) = if k == "b_dec" { (vec![v.shape[0] - 1], v.f32[1..].to_vec()) } else { (v.shape.clone(), v.f32.clone()) };
        tensors.push((k.clone(), shape, vals.iter().flat_map(|x| x.to_le_bytes()).collect()));
    }
    let views: Vec<(String, safetensors::tensor::TensorView)> =
        tensors.iter().map(|(k, s, b)| (k.clone(), safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), b).unwrap())).collect();
    std::fs::write(&path, safetensors::serialize(views, None).unwrap()).unwrap();
    let msg = load_err(&dir);
    assert!(msg.contains("layer_0.safetensors") && msg.contains("b_dec") && msg.contains("[47]") && msg.contains("[48]"), "{msg}");

    // Transcoders for another model: GPT-2's (d_model 48, 3 layers) on the Gemma 2 fixture
    // fit, Llama's skip set on GPT-2 fits too; a set with a layer missing does not.
    let device = Device::flex();
    let model = load_model(&case_dir("gpt2").join("model"), &device).unwrap().model;
    let (_t, dir) = broken_copy("gpt2");
    std::fs::remove_file(dir.join("layer_2.safetensors")).unwrap();
    let cfg = std::fs::read_to_string(dir.join("config.yaml")).unwrap().replace("  - layer_2.safetensors\n", "");
    std::fs::write(dir.join("config.yaml"), cfg).unwrap();
    let set = TranscoderSet::load(&dir, &device).unwrap();
    let e = attribute(&model, &set, &[1, 5, 6], &AttributeOptions::default()).expect_err("2 layers of transcoders for 3 layers");
    assert!(e.to_string().contains("2 transcoder layers, the model has 3 layers"), "{e}");
}

/// Two JSON values equal up to `tol` relative on numbers.
fn json_close(a: &serde_json::Value, b: &serde_json::Value, tol: f64, at: &str) {
    use serde_json::Value;
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            assert!((x - y).abs() <= tol * y.abs().max(1e-3), "{at}: {x} against {y}");
        }
        (Value::Array(x), Value::Array(y)) => {
            assert_eq!(x.len(), y.len(), "{at}: lengths");
            x.iter().zip(y).enumerate().for_each(|(i, (x, y))| json_close(x, y, tol, &format!("{at}[{i}]")));
        }
        (Value::Object(x), Value::Object(y)) => {
            assert_eq!(x.keys().collect::<Vec<_>>(), y.keys().collect::<Vec<_>>(), "{at}: fields");
            x.iter().for_each(|(k, v)| json_close(v, &y[k], tol, &format!("{at}.{k}")));
        }
        _ => assert_eq!(a, b, "{at}"),
    }
}

#[test]
fn the_graph_command_writes_circuit_tracers_json() {
    for name in CASES {
        let dir = case_dir(name);
        let case: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("case.json")).unwrap()).unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join(name);
        let ids: Vec<String> = case["ids"].as_array().unwrap().iter().map(|v| v.to_string()).collect();
        let mut args: Vec<String> =
            ["graph", "--model", dir.join("model").to_str().unwrap(), "--transcoders", dir.join("transcoders").to_str().unwrap()].map(String::from).to_vec();
        args.extend(["--ids".into(), ids.join(",")]);
        args.extend(["--max-n-logits".into(), case["max_n_logits"].to_string(), "--desired-logit-prob".into(), case["desired_logit_prob"].to_string()]);
        args.extend(["--batch-size".into(), case["batch_size"].to_string(), "--out".into(), out.to_str().unwrap().into()]);
        if let Some(n) = case["max_feature_nodes"].as_u64() {
            args.extend(["--max-feature-nodes".into(), n.to_string()]);
        }
        let o = burnlens(&args.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(o.status.success(), "{name}: {}", String::from_utf8_lossy(&o.stderr));
        let got: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out.join("graph.json")).unwrap()).unwrap();
        let mut want: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("expected_graph.json")).unwrap()).unwrap();
        want["metadata"]["slug"] = serde_json::Value::String(name.into());
        json_close(&got, &want, 1e-4, name);
        // The whole graph, under circuit-tracer's tensor names.
        let saved = read_safetensors(&out.join("graph.safetensors"));
        let expected = read_safetensors(&dir.join("expected.safetensors"));
        for key in ["input_tokens", "active_features", "selected_features", "logit_token_ids"] {
            assert_eq!(saved[key].i64, expected[key].i64, "{name}: {key}");
        }
        assert!(rel(&saved["adjacency_matrix"].f32, &expected["adjacency_matrix"].f32) < 1e-4, "{name}: saved adjacency");
        assert!(out.join("graph.html").is_file());
    }
}

#[test]
fn the_graph_command_refuses_bad_input_with_one_line() {
    let dir = case_dir("gpt2");
    let (model, tc) = (dir.join("model"), dir.join("transcoders"));
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("g");
    let run = |extra: &[&str]| {
        let mut a = vec!["graph", "--model", model.to_str().unwrap(), "--out", out.to_str().unwrap()];
        a.extend_from_slice(extra);
        burnlens(&a)
    };
    assert_bad_input(&run(&["--transcoders", tmp.path().to_str().unwrap(), "--ids", "1,2,3"]), "config.yaml");
    assert_bad_input(&run(&["--transcoders", tc.to_str().unwrap(), "--ids", "1,2,300"]), "300");
    assert_bad_input(&run(&["--transcoders", tc.to_str().unwrap(), "--ids", "1,2,3", "--targets", "5,999"]), "999");
    assert_bad_input(&run(&["--transcoders", tc.to_str().unwrap(), "--ids", "1,2,3", "--node-threshold", "1.5"]), "node_threshold");
    assert!(!out.exists(), "nothing is written for a refused run");
}

#[test]
fn feature_interventions_equal_circuit_tracers() {
    use burnlens::trace::{Intervention, feature_intervention};
    let device = Device::flex();
    for name in CASES {
        let dir = case_dir(name);
        let case: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("case.json")).unwrap()).unwrap();
        let want = read_safetensors(&dir.join("intervention.safetensors"));
        let model = load_model(&dir.join("model"), &device).unwrap().model;
        let set = TranscoderSet::load(&dir.join("transcoders"), &device).unwrap();
        let ids: Vec<i64> = case["ids"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect();
        let ivs: Vec<Intervention> = want["index"]
            .i64
            .chunks(3)
            .zip(&want["value"].f32)
            .map(|(i, &value)| Intervention { layer: i[0] as usize, pos: i[1] as usize, feature: i[2] as usize, value })
            .collect();
        let out = feature_intervention(&model, &set, &ids, &ivs, true, 1).unwrap_or_else(|e| panic!("{name}: {e}"));
        let l = rel(&out.logits, &want["logits"].f32);
        assert!(l < 1e-4, "{name}: logits after the intervention differ by {l:e}");
        let acts: Vec<f32> = out.activations.concat();
        let a = rel(&acts, &want["activations"].f32);
        assert!(a < 1e-4, "{name}: activations after the intervention differ by {a:e}");
        // The intervention changed something: the plain run's logits differ.
        let plain = feature_intervention(&model, &set, &ids, &[], true, 1).unwrap();
        assert!(rel(&plain.logits, &want["logits"].f32) > 1e-4, "{name}: the intervention had no effect");
        // Layers up to the lowest intervened one read what they read without it (their
        // inputs are upstream of every change).
        let lowest = ivs.iter().map(|iv| iv.layer).min().unwrap();
        for l in 0..=lowest {
            assert_eq!(out.activations[l], plain.activations[l], "{name}: layer {l} is upstream of the interventions");
        }
    }
}

/// Transcoders that write `mlp.hook_out` on a model whose MLP output passes a norm (Gemma 2's
/// `post_feedforward_layernorm`): the output is recovered as the norm's normalized value times
/// its scale, and the backward pass goes through that norm with the same scale frozen. The
/// features read the same input either way, so they equal the `hook_mlp_out` graph's; the
/// scores differ (the errors and decoders live before the norm) and are finite.
#[test]
fn mlp_hook_out_through_a_post_norm_attributes() {
    let device = Device::flex();
    let dir = case_dir("gemma2");
    let case: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("case.json")).unwrap()).unwrap();
    let model = load_model(&dir.join("model"), &device).unwrap().model;
    let ids: Vec<i64> = case["ids"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect();
    let (_tmp, tc) = broken_copy("gemma2");
    let config = std::fs::read_to_string(tc.join("config.yaml")).unwrap();
    std::fs::write(tc.join("config.yaml"), config.replace("feature_output_hook: hook_mlp_out", "feature_output_hook: mlp.hook_out")).unwrap();
    let before = attribute(&model, &TranscoderSet::load(&dir.join("transcoders"), &device).unwrap(), &ids, &options(&case)).unwrap();
    let after = attribute(&model, &TranscoderSet::load(&tc, &device).unwrap(), &ids, &options(&case)).expect("mlp.hook_out before an RMSNorm attributes");
    assert_eq!(after.active_features, before.active_features);
    assert_eq!(after.activation_values, before.activation_values);
    let rows: &[f32] = &after.rows;
    assert!(rows.iter().all(|v| v.is_finite()) && rows.iter().any(|&v| v != 0.0), "finite, non-trivial attributions");
    assert_ne!(rows, &before.rows[..], "the output hook changes the errors, so the scores");
}
