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
use burnlens::lens::dictionary::Dictionary;
use burnlens::model::{Activation, AttnHook, BlockHook, Forward, HookPoint, Hooks, LayerHook, NormHook, NormSite, Stop};
use burnlens::trace::{AttributeOptions, InputHook, LogitTargets, OutputHook, Replacement, TraceError, TranscoderSet, attribute, attribute_on};
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

/// On every backend the build can run (`BURNLENS_TEST_BACKENDS` to choose; the GPU check
/// runs it on wgpu and cuda): the graph's tensors stay on that device.
#[test]
fn graphs_equal_circuit_tracers() {
    for (backend, device) in backends() {
        graphs_equal_circuit_tracers_on(&backend, &device);
    }
}

fn graphs_equal_circuit_tracers_on(backend: &str, device: &Device) {
    for name in CASES {
        let name = &format!("{name} on {backend}");
        let dir = case_dir(name.split(' ').next().unwrap());
        let case: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("case.json")).unwrap()).unwrap();
        let want = read_safetensors(&dir.join("expected.safetensors"));
        let model = load_model(&dir.join("model"), device).unwrap_or_else(|e| panic!("{name}: {e}")).model;
        let set = TranscoderSet::load(&dir.join("transcoders"), device).unwrap_or_else(|e| panic!("{name}: {e}"));
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

        // The host's storage choices (patterns recomputed, rows in a file), checked once.
        if burnlens::model::backend::is_host(device) {
            same_graph_with_less_memory(name, &model, &set, &ids, &options(&case), &g);
        }

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

/// With no room for the attention patterns each backward pass recomputes them, and with no
/// room for the rows they live in a mapped temporary file: the same graph.
fn same_graph_with_less_memory(
    name: &str,
    model: &burnlens::model::Transformer,
    set: &TranscoderSet,
    ids: &[i64],
    opts: &AttributeOptions,
    g: &burnlens::trace::Graph,
) {
    let lean = attribute(model, set, ids, &AttributeOptions { pattern_budget: 0, ..opts.clone() }).unwrap();
    assert_eq!(lean.selected_features, g.selected_features, "{name}: recomputed patterns select the same features");
    let lean_adj = rel(&lean.rows, &g.rows);
    assert!(lean_adj < 1e-5, "{name}: recomputed patterns change the rows by {lean_adj:e}");
    let mapped = attribute(model, set, ids, &AttributeOptions { row_budget: 0, ..opts.clone() }).unwrap();
    assert!(mapped.rows.is_mapped() && !g.rows.is_mapped(), "{name}: row budget");
    assert_eq!(&mapped, g, "{name}: rows in a mapped file change the graph");
    assert_eq!(mapped.prune(0.8, 0.98).unwrap(), g.prune(0.8, 0.98).unwrap(), "{name}: pruning from mapped rows");
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

// ---- QK attributions (`burnlens qk`, `trace::qk`) ----

/// A per-layer (or cross-layer) transcoder set of `f` random ReLU features for `model`, with
/// or without skip terms, reading `input` and writing `output`: about half the features
/// fire on any input.
fn random_set(model: &burnlens::model::Transformer, f: usize, cross_layer: bool, skip: bool, input: InputHook, output: OutputHook) -> TranscoderSet {
    let device = model.device();
    let (n, d) = (model.config.n_layers(), model.config.d_model);
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut normal = |len: usize, sd: f32| -> Vec<f32> {
        (0..len)
            .map(|_| {
                // Sum of uniforms: close enough to normal for random weights.
                (0..4)
                    .map(|_| {
                        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                        (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5
                    })
                    .sum::<f32>()
                    * sd
                    * 1.7
            })
            .collect()
    };
    let t2 = |v: Vec<f32>, s: [usize; 2]| burn::tensor::Tensor::<2>::from_data(burn::tensor::TensorData::new(v, s), &device);
    let t1 = |v: Vec<f32>| burn::tensor::Tensor::<1>::from_data(burn::tensor::TensorData::new(v.clone(), [v.len()]), &device);
    let layers = (0..n)
        .map(|l| Dictionary {
            w_enc: t2(normal(d * f, 1.0 / (d as f32).sqrt()), [d, f]),
            b_enc: t1(normal(f, 0.1)),
            w_dec: (0..if cross_layer { n - l } else { 1 }).map(|_| t2(normal(f * d, 0.2), [f, d])).collect(),
            b_dec: t1(normal(d, 0.1)),
            threshold: None,
            w_skip: skip.then(|| t2(normal(d * d, 0.05), [d, d])),
            rule: Rule::Relu,
            subtract_b_dec: false,
        })
        .collect();
    TranscoderSet { layers, input, output, scan: None, cross_layer }
}

/// The keys query `q` of `head` sees: causal, and inside a local window where the layer has one.
fn visible_pairs(model: &burnlens::model::Transformer, layer: usize, n_pos: usize) -> usize {
    let span = model.blocks[layer].attn.span;
    (0..n_pos).map(|q| (0..=q).filter(|&k| span.allows(q, k)).count()).sum()
}

/// The rows of one head add up: the parts to the model's residual stream, a row per
/// visible (query, key), each row's `top` listed terms plus its remainder — and its
/// feature × feature, error and other sums — to the model's own score within 1e-5 of the
/// largest.
fn check_qk_rows(at: &str, got: &burnlens::trace::QkHead, model: &burnlens::model::Transformer, layer: usize, n_pos: usize, top: usize) {
    assert!(got.residual_gap < 1e-5, "{at}: the parts miss the residual stream by {:e}", got.residual_gap);
    assert_eq!(got.rows.len(), visible_pairs(model, layer, n_pos), "{at}: one row per visible (query, key)");
    let largest = got.rows.iter().map(|r| r.score.abs()).fold(1e-6, f32::max);
    for r in &got.rows {
        let listed: f64 = r.terms.iter().map(|t| t.contribution as f64).sum();
        let total = (listed + r.remainder as f64) as f32;
        assert!((total - r.score).abs() <= 1e-5 * largest, "{at} ({}, {}): terms add up to {total}, the model's score is {}", r.query, r.key, r.score);
        let parts = r.feature_feature + r.error + r.other;
        assert!((parts - r.score).abs() <= 1e-5 * largest, "{at} ({}, {}): shares add up to {parts}, not {}", r.query, r.key, r.score);
        assert_eq!(r.terms.len(), top, "{at}: the top terms");
        assert!(r.terms.windows(2).all(|w| w[0].contribution.abs() >= w[1].contribution.abs()), "{at}: terms largest first");
        assert!(r.terms.iter().all(|t| t.query_node.pos() == r.query && t.key_node.pos() == r.key), "{at}: parts at their positions");
    }
}

/// QK rows add up ([`check_qk_rows`]) on every family tracing supports (sequential
/// blocks), with per-layer, skip and cross-layer transcoders writing before or after a
/// post-norm, and on every family without transcoders (parallel blocks too); transcoders
/// on parallel blocks are refused with one line.
///
/// On every backend the build can run (`BURNLENS_TEST_BACKENDS` to choose; the GPU check
/// runs it on wgpu and cuda): each layer's active features are listed where the transcoder
/// ran.
#[test]
fn qk_terms_add_up_to_the_models_scores_in_every_family() {
    for (backend, device) in backends() {
        qk_terms_add_up_on(&backend, &device);
    }
}

fn qk_terms_add_up_on(backend: &str, device: &Device) {
    use burnlens::trace::{QkNode, QkOptions, qk_attributions};
    let ids: Vec<i64> = vec![1, 17, 42, 5, 99, 17, 42, 63, 8, 17, 42];
    let families = [
        ("gpt2", false, true, InputHook::MlpIn, OutputHook::MlpOut),
        ("gpt_neo_local", false, false, InputHook::ResidMid, OutputHook::MlpOut),
        ("llama_gqa", true, false, InputHook::MlpIn, OutputHook::MlpOut),
        ("mistral_window", false, true, InputHook::Ln2Normalized, OutputHook::MlpOut),
        ("qwen2_tied", false, false, InputHook::MlpIn, OutputHook::MlpOut),
        ("qwen3_qknorm", false, true, InputHook::MlpIn, OutputHook::MlpOut),
        ("olmo2_postnorm", false, false, InputHook::ResidMid, OutputHook::MlpHookOut),
        ("phi3_fused", true, true, InputHook::MlpIn, OutputHook::MlpOut),
        ("gemma2_softcap", false, true, InputHook::Ln2Normalized, OutputHook::MlpHookOut),
        ("gemma3_local_rope", true, false, InputHook::MlpIn, OutputHook::MlpHookOut),
        ("neox_sequential", false, false, InputHook::MlpIn, OutputHook::MlpOut),
    ];
    for (name, cross_layer, skip, input, output) in families {
        let model = load_model(&fixture(name), device).unwrap_or_else(|e| panic!("{name}: {e}")).model;
        let set = random_set(&model, 24, cross_layer, skip, input, output);
        let n_layers = model.config.n_layers();
        for (layer, head) in [(n_layers - 1, 0), (n_layers - 1, model.config.n_heads - 1), (1, model.config.n_heads / 2)] {
            let opts = QkOptions { top_terms: 5, ..QkOptions::new(layer, head) };
            let got = qk_attributions(&model, Some(&set), &ids, &opts).unwrap_or_else(|e| panic!("{name} L{layer}.H{head}: {e}"));
            let at = format!("{name} L{layer}.H{head} on {backend}");
            check_qk_rows(&at, &got, &model, layer, ids.len(), 5);
            assert!(got.rows.iter().any(|r| r.feature_feature != 0.0 && r.error != 0.0), "{at}: features and errors both take part");
        }
    }
    // Without transcoders (each MLP's output one part), parallel blocks too.
    for (name, ..) in families
        .iter()
        .chain(&[("pythia_like", false, false, InputHook::MlpIn, OutputHook::MlpOut), ("gptj_interleaved", false, false, InputHook::MlpIn, OutputHook::MlpOut)])
    {
        let model = load_model(&fixture(name), device).unwrap().model;
        let layer = model.config.n_layers() - 1;
        let got = qk_attributions(&model, None, &ids, &QkOptions { top_terms: 4, ..QkOptions::new(layer, 0) }).unwrap();
        check_qk_rows(&format!("{name} without transcoders on {backend}"), &got, &model, layer, ids.len(), 4);
        assert!(got.rows.iter().any(|r| r.terms.iter().any(|t| matches!(t.key_node, QkNode::Mlp { .. }))), "{name}: MLP outputs take part");
    }
    for name in ["pythia_like", "gptj_interleaved"] {
        let model = load_model(&fixture(name), device).unwrap().model;
        let set = random_set(&model, 8, false, false, InputHook::MlpIn, OutputHook::MlpOut);
        let e = qk_attributions(&model, Some(&set), &ids, &QkOptions::new(1, 0)).unwrap_err().to_string();
        assert!(e.contains("parallel") && !e.contains('\n'), "{name}: transcoders on parallel blocks: {e}");
    }
}

/// The model's own score at (`q`, `k`) of `head` at `layer` with `u` added to the residual
/// stream entering the layer at `q` and `v` at `k`, every norm scale of the layer's attention
/// held at its value on the unchanged prompt (the frozen scales of the decomposition).
fn score_with(
    model: &burnlens::model::Transformer,
    ids: &[i64],
    at: (usize, usize, usize, usize),
    u: &[f32],
    v: &[f32],
    frozen: &std::collections::BTreeMap<HookPoint, Activation>,
) -> f32 {
    let (layer, head, q, k) = at;
    let device = model.device();
    let n = ids.len();
    let d = model.config.d_model;
    let mut delta = vec![0f32; n * d];
    delta[q * d..(q + 1) * d].copy_from_slice(u);
    delta[k * d..(k + 1) * d].iter_mut().zip(v).for_each(|(a, b)| *a += b);
    let delta = burn::tensor::Tensor::<3>::from_data(burn::tensor::TensorData::new(delta, [1, n, d]), &device);
    let scores = AttnHook::AttnScores.at(layer);
    let mut hooks = Hooks::capture(move |p| p == scores)
        .with_edit(move |p| p == BlockHook::ResidPre.at(layer), move |_, a| Activation::Rank3(a.rank3().unwrap() + delta.clone()))
        .with_edit(|p| frozen.contains_key(&p), |p, _| frozen[&p].clone());
    let ids_t = burn::tensor::Tensor::<2, burn::tensor::Int>::from_data(burn::tensor::TensorData::new(ids.to_vec(), [1, n]), &device);
    model.forward_with(Forward::new(ids_t).hooks(&mut hooks).stop(Stop::AfterBlock(layer)));
    let s = hooks.take_cache().remove(&scores).unwrap().rank4().unwrap();
    s.slice([0..1, head..head + 1, q..q + 1, k..k + 1]).into_data().try_into_vec_as::<f32>().unwrap()[0]
}

/// A term is what the pair it names adds to the score, through the model's own attention:
/// adding the query part once more at the query and the key part at the key (norm scales
/// frozen) changes the score by exactly the term beyond each one alone (the mixed second
/// difference of a bilinear form). Checked for token × token and the largest feature ×
/// feature term on GPT-2 (LayerNorm, position embeddings), Llama (rotary, grouped keys,
/// skip transcoders), Qwen3 (per-head QK-norm) and OLMo 2 (post-norms, QK-norm over all
/// heads).
#[test]
fn qk_terms_equal_the_models_second_differences() {
    use burnlens::trace::{QkNode, QkOptions, Replacement, qk_attributions};
    let device = Device::flex();
    let trace = |name: &str| {
        let dir = case_dir(name);
        let case: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("case.json")).unwrap()).unwrap();
        let ids: Vec<i64> = case["ids"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect();
        (load_model(&dir.join("model"), &device).unwrap().model, TranscoderSet::load(&dir.join("transcoders"), &device).unwrap(), ids)
    };
    let random = |name: &str| {
        let model = load_model(&fixture(name), &device).unwrap().model;
        let set = random_set(&model, 24, false, false, InputHook::MlpIn, OutputHook::MlpOut);
        (model, set, vec![1, 17, 42, 5, 99, 17, 42, 63])
    };
    let cases = [
        ("gpt2 (trace)", trace("gpt2")),
        ("llama_skip (trace)", trace("llama_skip")),
        ("qwen3_qknorm", random("qwen3_qknorm")),
        ("olmo2_postnorm", random("olmo2_postnorm")),
    ];
    for (name, (model, set, ids)) in cases {
        let n = ids.len();
        let (layer, head, q, k) = (model.config.n_layers() - 1, model.config.n_heads - 1, n - 1, n - 3);
        let got = qk_attributions(&model, Some(&set), &ids, &QkOptions { top_terms: usize::MAX, ..QkOptions::new(layer, head) }).unwrap();
        let row = got.rows.iter().find(|r| r.query == q && r.key == k).unwrap();
        // The frozen scales and the parts' vectors, from the model itself.
        let attn = &model.blocks[layer].attn;
        let mut points: Vec<HookPoint> = [NormSite::Ln1(layer), NormSite::QNorm(layer), NormSite::KNorm(layer)].map(|s| NormHook::Scale.of(s)).to_vec();
        points.push(HookPoint::Embed);
        let mut hooks = Hooks::capture(|p| points.contains(&p));
        let ids_t = burn::tensor::Tensor::<2, burn::tensor::Int>::from_data(burn::tensor::TensorData::new(ids.clone(), [1, n]), &device);
        model.forward_with(Forward::new(ids_t).hooks(&mut hooks).stop(Stop::AfterBlock(layer)));
        let mut frozen = hooks.take_cache();
        let embed: Vec<f32> = frozen.remove(&HookPoint::Embed).unwrap().rank3().unwrap().into_data().try_into_vec_as::<f32>().unwrap();
        let d = model.config.d_model;
        let replacement = Replacement::new(&model, &set, &ids, 1, u64::MAX).unwrap();
        let feature = |layer: usize, feature: usize, pos: usize| -> Vec<f32> {
            let a = replacement.active.iter().find(|a| (a.layer, a.feature, a.pos) == (layer, feature, pos)).unwrap().activation;
            let row: Vec<f32> = set.layers[layer].w_dec[0].clone().slice([feature..feature + 1, 0..d]).into_data().try_into_vec_as::<f32>().unwrap();
            row.iter().map(|x| x * a).collect()
        };
        let term = |f: &dyn Fn(&QkNode, &QkNode) -> bool| {
            row.terms.iter().filter(|t| f(&t.query_node, &t.key_node)).max_by(|a, b| a.contribution.abs().total_cmp(&b.contribution.abs())).unwrap().clone()
        };
        let tokens = term(&|a, b| matches!((a, b), (QkNode::Embedding { .. }, QkNode::Embedding { .. })));
        let features = term(&|a, b| matches!((a, b), (QkNode::Feature { .. }, QkNode::Feature { .. })));
        for t in [tokens, features] {
            let vector = |node: QkNode| match node {
                QkNode::Embedding { pos } => embed[pos * d..(pos + 1) * d].to_vec(),
                QkNode::Feature { layer, feature: f, pos } => feature(layer, f, pos),
                other => unreachable!("{other}"),
            };
            let (u, v, zero) = (vector(t.query_node), vector(t.key_node), vec![0f32; d]);
            let at = (layer, head, q, k);
            let s = |a: &[f32], b: &[f32]| score_with(&model, &ids, at, a, b, &frozen) as f64;
            let (s11, s10, s01, s00) = (s(&u, &v), s(&u, &zero), s(&zero, &v), s(&zero, &zero));
            let mixed = (s11 - s10 - s01 + s00) as f32;
            let size = [s11, s10, s01, s00].iter().fold(t.contribution.abs() as f64, |m, x| m.max(x.abs())) as f32;
            assert!((s00 as f32 - row.score).abs() <= 1e-5 * size, "{name}: unchanged score {s00} vs the row's {} (scale {})", row.score, attn.scale);
            assert!(
                (mixed - t.contribution).abs() <= 2e-5 * size,
                "{name}: {} · {}: the model's second difference {mixed} against the term {}",
                t.query_node,
                t.key_node,
                t.contribution
            );
        }
    }
}

#[test]
fn the_qk_command_writes_rows_and_refuses_bad_input_with_one_line() {
    let dir = case_dir("gpt2");
    let (model, tc) = (dir.join("model"), dir.join("transcoders"));
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("qk.json");
    let run = |extra: &[&str]| {
        let mut a =
            vec!["qk", "--model", model.to_str().unwrap(), "--transcoders", tc.to_str().unwrap(), "--ids", "1,5,9,5,9,12", "--out", out.to_str().unwrap()];
        a.extend_from_slice(extra);
        burnlens(&a)
    };
    let o = run(&["--layer", "1", "--head", "0", "--top-terms", "3"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rows: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 21, "every causal (query, key) of six tokens");
    for r in rows {
        let terms = r["terms"].as_array().unwrap();
        assert_eq!(terms.len(), 3);
        let sum: f64 = terms.iter().map(|t| t["contribution"].as_f64().unwrap()).sum::<f64>() + r["remainder"].as_f64().unwrap();
        let score = r["score"].as_f64().unwrap();
        assert!((sum - score).abs() < 1e-4 * score.abs().max(1.0), "{r}");
        assert!(terms[0]["query_node"]["kind"].is_string() && r["layer"] == 1 && r["head"] == 0, "{r}");
    }
    std::fs::remove_file(&out).unwrap();
    assert_bad_input(&run(&["--layer", "7", "--head", "0"]), "layer 7 is out of range");
    assert_bad_input(&run(&["--layer", "1", "--head", "99"]), "head 99 is out of range");
    assert!(!out.exists(), "nothing is written for a refused run");
}

/// Head loadings split every edge that crosses positions into its one-hop paths through each
/// head and the paths through several heads: on every circuit-tracer case they add up to
/// the edge weight, an edge with one attention layer between its source and target has no
/// multi-hop part (within 1e-5 of the row's largest edge: the one-hop paths computed
/// through each head are the whole edge), longer edges have one, a short list's `rest`
/// holds the other heads, and the pruned graph's edges are a subset.
#[test]
fn head_loadings_add_up_to_the_edges_they_carry() {
    use burnlens::trace::{head_loadings, node_position};
    let device = Device::flex();
    let (mut single, mut longer) = (0, 0);
    for name in CASES {
        let dir = case_dir(name);
        let case: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("case.json")).unwrap()).unwrap();
        let model = load_model(&dir.join("model"), &device).unwrap().model;
        let set = TranscoderSet::load(&dir.join("transcoders"), &device).unwrap();
        let ids: Vec<i64> = case["ids"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect();
        let opts = options(&case);
        let rm = Replacement::new(&model, &set, &ids, opts.zero_positions, opts.pattern_budget).unwrap();
        let g = attribute_on(&rm, &opts).unwrap();
        let (n_f, n_pos, n_layers) = (g.n_features(), g.n_pos(), g.n_layers);
        // The attention layers an edge crosses: above the source's first write, up to the
        // target's layer (a logit's: every layer).
        let first_write = |s: usize| -> Option<usize> {
            if s < n_f {
                Some(g.active_features[g.selected_features[s] as usize][0] as usize)
            } else if s < n_f + n_layers * n_pos {
                Some((s - n_f) / n_pos)
            } else {
                None
            }
        };
        let target_layer = |t: usize| if t < n_f { g.active_features[g.selected_features[t] as usize][0] as usize } else { n_layers - 1 };
        let all = head_loadings(&rm, &g, None, usize::MAX).unwrap();
        let crossing = (0..g.n_features() + g.n_logits())
            .map(|r| (0..g.n_nodes()).filter(|&s| g.row(r)[s] != 0.0 && node_position(&g, s) != node_position(&g, g.row_node(r))).count())
            .sum::<usize>();
        assert_eq!(all.len(), crossing, "{name}: every edge that crosses positions");
        for e in &all {
            let largest = max_abs(g.row(g.node_row(e.target).unwrap()));
            let sum: f64 = e.heads.iter().map(|h| h.weight as f64).sum::<f64>() + e.multi_hop as f64;
            assert!(
                (sum as f32 - e.weight).abs() <= 1e-5 * largest,
                "{name}: {} -> {}: heads and multi-hop add up to {sum}, the edge is {}",
                e.source,
                e.target,
                e.weight
            );
            assert_eq!(e.rest, 0.0);
            let layers = target_layer(e.target) + 1 - first_write(e.source).map_or(0, |l| l + 1);
            if layers == 1 {
                single += 1;
                assert!(e.multi_hop.abs() <= 1e-5 * largest, "{name}: {} -> {} crosses one attention layer, yet multi-hop {}", e.source, e.target, e.multi_hop);
            } else if e.multi_hop.abs() > 1e-4 * largest {
                longer += 1;
            }
        }
        let short = head_loadings(&rm, &g, None, 2).unwrap();
        for (e, s) in all.iter().zip(&short) {
            let largest = max_abs(g.row(g.node_row(e.target).unwrap()));
            let sum: f64 = s.heads.iter().map(|h| h.weight as f64).sum::<f64>() + (s.rest + s.multi_hop) as f64;
            assert!(
                s.heads.len() <= 2 && (sum as f32 - e.weight).abs() <= 1e-5 * largest,
                "{name}: two heads, the rest and multi-hop add up to {sum}, not {}",
                e.weight
            );
            assert_eq!(s.heads[..], e.heads[..s.heads.len()], "{name}: the largest heads first");
        }
        let pruned = g.prune(0.8, 0.98).unwrap();
        let kept = head_loadings(&rm, &g, Some(&pruned), 3).unwrap();
        assert!(!kept.is_empty() && kept.len() < all.len(), "{name}: {} kept of {}", kept.len(), all.len());
        let other = Replacement::new(&model, &set, &ids[..ids.len() - 1], opts.zero_positions, opts.pattern_budget).unwrap();
        let e = head_loadings(&other, &g, None, 3).unwrap_err().to_string();
        assert!(e.contains("another prompt"), "{name}: {e}");
    }
    assert!(single > 100 && longer > 100, "one-layer edges {single}, multi-hop edges {longer}");
}

/// `graph --qk` adds burnlens's extension to graph.json: each kept link that crosses
/// positions carries its heads (adding up to its weight with `heads_rest`), same-position
/// links none, and `qk` holds the rows of every listed head at its links' target positions,
/// each adding up to its score; circuit-tracer's fields are unchanged.
#[test]
fn the_graph_command_with_qk_adds_the_heads_of_each_link_and_their_qk_rows() {
    let dir = case_dir("llama_skip");
    let tmp = tempfile::tempdir().unwrap();
    let (plain, with) = (tmp.path().join("plain"), tmp.path().join("qk"));
    let (model, tc) = (dir.join("model"), dir.join("transcoders"));
    let run = |out: &Path, extra: &[&str]| {
        let mut a = vec!["graph", "--model", model.to_str().unwrap(), "--transcoders", tc.to_str().unwrap()];
        a.extend(["--ids", "1,17,5,60,17,5,71", "--out", out.to_str().unwrap()]);
        a.extend_from_slice(extra);
        let o = burnlens(&a);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_str::<serde_json::Value>(&std::fs::read_to_string(out.join("graph.json")).unwrap()).unwrap()
    };
    let (p, q) = (run(&plain, &[]), run(&with, &["--qk"]));
    assert!(p.get("qk").is_none() && p["links"].as_array().unwrap().iter().all(|l| l.get("heads").is_none()), "no extension without --qk");
    assert_eq!(p["nodes"], q["nodes"]);
    let ctx: std::collections::HashMap<&str, u64> =
        q["nodes"].as_array().unwrap().iter().map(|n| (n["node_id"].as_str().unwrap(), n["ctx_idx"].as_u64().unwrap())).collect();
    let rows = q["qk"].as_array().unwrap();
    let mut carried = 0;
    for (a, b) in p["links"].as_array().unwrap().iter().zip(q["links"].as_array().unwrap()) {
        assert_eq!((&a["source"], &a["target"], &a["weight"]), (&b["source"], &b["target"], &b["weight"]));
        let (s, t) = (ctx[b["source"].as_str().unwrap()], ctx[b["target"].as_str().unwrap()]);
        let Some(heads) = b["heads"].as_array() else {
            assert_eq!(s, t, "a link across positions has heads: {b}");
            continue;
        };
        carried += 1;
        assert_ne!(s, t);
        let sum: f64 = heads.iter().map(|h| h["weight"].as_f64().unwrap()).sum::<f64>() + b["heads_rest"].as_f64().unwrap() + b["multi_hop"].as_f64().unwrap();
        let w = b["weight"].as_f64().unwrap();
        assert!((sum - w).abs() <= 1e-4 * w.abs().max(1e-3), "{b}: heads add up to {sum}");
        for h in heads {
            assert!(
                rows.iter().any(|r| r["layer"] == h["layer"] && r["head"] == h["head"] && r["query"].as_u64() == Some(t) && r["key"].as_u64() == Some(s)),
                "the QK row of {h} from {t} to {s}"
            );
        }
    }
    assert!(carried > 0, "some kept links cross positions");
    for r in rows {
        let total: f64 = r["terms"].as_array().unwrap().iter().map(|t| t["contribution"].as_f64().unwrap()).sum::<f64>() + r["remainder"].as_f64().unwrap();
        assert!((total - r["score"].as_f64().unwrap()).abs() <= 1e-4 * r["score"].as_f64().unwrap().abs().max(1.0), "{r}");
    }
    // The graph's rows (its active features, one forward pass for every layer) are the `qk`
    // command's (the transcoders encoding again, a forward pass for the head's layer).
    let out = tmp.path().join("one.json");
    let r0 = &rows[rows.len() / 2];
    let (layer, head, query) = (r0["layer"].to_string(), r0["head"].to_string(), r0["query"].to_string());
    let mut a = vec!["qk", "--model", model.to_str().unwrap(), "--transcoders", tc.to_str().unwrap(), "--ids", "1,17,5,60,17,5,71"];
    a.extend(["--layer", &layer, "--head", &head, "--queries", &query, "--out", out.to_str().unwrap()]);
    let o = burnlens(&a);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let alone: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    for r in rows.iter().filter(|r| (r["layer"].to_string(), r["head"].to_string(), r["query"].to_string()) == (layer.clone(), head.clone(), query.clone())) {
        let same = alone.as_array().unwrap().iter().find(|x| x["key"] == r["key"]).expect("the key's row");
        json_close(&same["score"], &r["score"], 1e-6, "score");
        let (a, b) = (same["terms"].as_array().unwrap(), r["terms"].as_array().unwrap());
        assert_eq!((a[0]["query_node"].clone(), a[0]["key_node"].clone()), (b[0]["query_node"].clone(), b[0]["key_node"].clone()), "{same} vs {r}");
        let scale = r["score"].as_f64().unwrap().abs().max(1.0);
        for k in ["feature_feature", "error", "other", "remainder"] {
            let (x, y) = (same[k].as_f64().unwrap(), r[k].as_f64().unwrap());
            assert!((x - y).abs() <= 1e-5 * scale, "{k}: {x} alone, {y} in the graph");
        }
    }
}
