//! Feature dashboards against SAEDashboard itself (`tests/fixtures/dashboards/`, written by
//! `scripts/gen_dashboard_fixtures.py` with sae-dashboard 0.8.0 on the tiny GPT-2 processed
//! as TransformerLens processes it, random SAEs, fixed tokens, BOS ignored): the same top
//! groups (window, position, shown tokens and activations), the same group titles (maximum,
//! quantile boundaries, the fraction each interval holds), quantile samples of the same sizes
//! drawn from the same intervals, histograms within one count per bin, equal logit tables.

mod common;

use burn::tensor::Device;
use burnlens::dashboards::{DashboardConfig, FeatureDashboard, FeatureSource, RunSpec, ScanPlace, run};
use burnlens::hf::load_model;
use burnlens::lens::sae::Sae;
use burnlens::lens::{ProcessOptions, process_weights};
use common::fixture;
use serde_json::Value;

fn floats(v: &Value) -> Vec<f64> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect()
}

fn ints(v: &Value) -> Vec<u64> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as u64).collect()
}

fn dashboards(case: &str, place: Option<ScanPlace>) -> (Vec<FeatureDashboard>, Value, Vec<Vec<u32>>) {
    let device = Device::flex();
    let dir = fixture("dashboards").join(case);
    let want: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let tokens: Vec<Vec<u32>> = serde_json::from_str(&std::fs::read_to_string(dir.join("tokens.json")).unwrap()).unwrap();
    let model = load_model(&fixture("gpt2"), &device).unwrap().model;
    let (opts, _) = ProcessOptions::all().allowed_for(&model.config);
    let model = process_weights(&model, opts).unwrap();
    let sae = Sae::load(&dir.join("sae"), &device).unwrap();
    let source = FeatureSource::new(&model, &sae, None).unwrap();
    let cfg = DashboardConfig { ignore_tokens: vec![0], ..DashboardConfig::default() };
    // The second pass reads the first's inputs back from disk (the spill), as the CLI does.
    let spill = std::env::temp_dir().join(format!("burnlens-dash-spill-{case}-{place:?}-{}", std::process::id()));
    let spec = RunSpec {
        cfg,
        tokens: (tokens.len() * tokens[0].len()) as u64,
        batch_windows: 7,
        spill: Some((spill.clone(), 1 << 30)),
        ranks: Default::default(),
        place,
    };
    let windows = tokens.clone();
    let out = run(&source, &spec, None, &mut || Ok(Box::new(burnlens::data::Counted::new(windows.clone().into_iter().map(Ok)))), &mut |_| {
        std::ops::ControlFlow::Continue(())
    })
    .unwrap();
    assert!(!out.ran_out);
    assert!(!spill.exists(), "the spill is removed at the end");
    (out.dashboards, want, tokens)
}

/// SAEDashboard's "INTERVAL a - b<br>CONTAINS p%" for an interval.
fn interval_title(lower: f32, upper: f32, contains: f64) -> String {
    format!("INTERVAL {lower:.3} - {upper:.3}<br>CONTAINS {:.3}%", contains * 100.0)
}

fn check_case(case: &str) {
    let (got, want, tokens) = dashboards(case, None);
    let want = want["features"].as_array().unwrap();
    assert_eq!(got.len(), want.len());
    let (mut compared_top, mut compared_samples) = (0, 0);
    for (g, w) in got.iter().zip(want) {
        let f = g.feature;
        assert_eq!(f as u64, w["feature"].as_u64().unwrap());
        let groups = w["groups"].as_array().unwrap();
        // The top group: every nonzero example, in order (zeros tie, and torch.topk orders
        // ties as it likes).
        assert_eq!(groups[0]["title"].as_str().unwrap(), format!("TOP ACTIVATIONS<br>MAX = {:.3}", g.max), "feature {f}");
        let top_want: Vec<&Value> = groups[0]["examples"].as_array().unwrap().iter().filter(|e| floats(&e["acts"])[5] > 0.0).collect();
        let top_got: Vec<_> = g.top.iter().filter(|e| e.value > 0.0).collect();
        assert_eq!(top_got.len(), top_want.len(), "feature {f}: nonzero examples in the top group");
        for (e, x) in top_got.iter().zip(&top_want) {
            assert_eq!((e.window, e.position as u64), (x["window"].as_u64().unwrap(), x["position"].as_u64().unwrap()), "feature {f} top");
            assert_eq!(e.tokens.iter().map(|&t| t as u64).collect::<Vec<_>>(), ints(&x["tokens"]), "feature {f} top tokens");
            for (a, b) in e.acts.iter().zip(floats(&x["acts"])) {
                assert!((*a as f64 - b).abs() < 1e-4 + 1e-5 * b.abs(), "feature {f} top acts {:?} vs {:?}", e.acts, x["acts"]);
            }
            compared_top += 1;
        }
        // The quantile groups: titles equal; samples as many, from the interval.
        assert_eq!(g.quantiles.len() + 1, groups.len());
        for (q, x) in g.quantiles.iter().zip(&groups[1..]) {
            assert_eq!(interval_title(q.lower, q.upper, q.contains), x["title"].as_str().unwrap(), "feature {f}");
            assert_eq!(q.examples.len(), x["examples"].as_array().unwrap().len(), "feature {f}: {}", x["title"]);
            for e in &q.examples {
                assert!(e.value >= q.lower && e.value <= q.upper, "feature {f}: sample {} outside [{}, {}]", e.value, q.lower, q.upper);
                assert_eq!(e.tokens[5], tokens[e.window as usize][e.position]);
                compared_samples += 1;
            }
        }
        // Histograms: within one count per bin, bars at the same values.
        let title = w["acts_histogram"]["title"].as_str().map(str::to_string);
        assert_eq!(
            title,
            (g.acts_histogram.heights.iter().sum::<u64>() > 0).then(|| format!("ACTIVATIONS<br>DENSITY = {:.3}%", g.density * 100.0)),
            "feature {f}"
        );
        for (h, w, what) in [(&g.acts_histogram, &w["acts_histogram"], "acts"), (&g.logits.histogram, &w["logits_histogram"], "logits")] {
            let (heights, values) = (ints(&w["heights"]), floats(&w["values"]));
            assert_eq!(h.heights.len(), heights.len(), "feature {f} {what} bins");
            assert!(h.heights.iter().zip(&heights).all(|(a, b)| a.abs_diff(*b) <= 1), "feature {f} {what}: {:?} vs {heights:?}", h.heights);
            assert!(h.values.iter().zip(&values).all(|(a, b)| (a - b).abs() <= 2e-5), "feature {f} {what}: {:?} vs {values:?}", h.values);
        }
        // Logit tables: the same tokens, values within float error.
        for (rows, ids, vals) in [(&g.logits.top, "top_token_ids", "top_logits"), (&g.logits.bottom, "bottom_token_ids", "bottom_logits")] {
            assert_eq!(rows.iter().map(|r| r.0 as u64).collect::<Vec<_>>(), ints(&w[ids]), "feature {f} {ids}");
            assert!(rows.iter().zip(floats(&w[vals])).all(|(r, v)| (r.1 as f64 - v).abs() < 1e-4), "feature {f} {vals}");
        }
    }
    assert!(compared_top > 10 * got.len() && compared_samples > 20 * got.len(), "{case}: {compared_top} top examples, {compared_samples} samples compared");
}

#[test]
fn standard_sae_on_the_residual_stream_equals_saedashboard() {
    check_case("standard_resid");
}

#[test]
fn jumprelu_sae_on_mlp_neurons_equals_saedashboard() {
    check_case("jumprelu_mlp_post");
}

/// A GPU's passes (reductions and comparisons on the device, only the columns that can enter
/// a top group or a quantile sample read back), run here by the CPU backend: the same
/// dashboards as the host's passes, exactly.
#[test]
fn the_passes_on_the_device_make_the_host_passes_dashboards() {
    for case in ["standard_resid", "jumprelu_mlp_post"] {
        let (host, ..) = dashboards(case, Some(ScanPlace::Host));
        let (device, ..) = dashboards(case, Some(ScanPlace::Device));
        assert!(host.iter().any(|d| d.top.iter().filter(|e| e.value > 0.0).count() > 5), "{case}: features fire");
        assert_eq!(device, host, "{case}");
    }
}

/// The fields of SAEDashboard 0.8.0's `NeuronpediaDashboardFeature.to_dict` and
/// `NeuronpediaDashboardActivation.to_dict` (without DFA), and of circuit-tracer 0.5.0's
/// frontend `feature_models.Model`.
const NEURONPEDIA_FEATURE: &[&str] = &[
    "feature_index",
    "neuron_alignment_indices",
    "neuron_alignment_values",
    "neuron_alignment_l1",
    "correlated_neurons_indices",
    "correlated_neurons_l1",
    "correlated_neurons_pearson",
    "correlated_features_indices",
    "correlated_features_l1",
    "correlated_features_pearson",
    "neg_str",
    "neg_values",
    "pos_str",
    "pos_values",
    "frac_nonzero",
    "freq_hist_data_bar_values",
    "freq_hist_data_bar_heights",
    "logits_hist_data_bar_heights",
    "logits_hist_data_bar_values",
    "n_prompts_total",
    "n_tokens_in_prompt",
    "dataset",
    "decoder_weights_dist",
    "activations",
    "vector",
];
const NEURONPEDIA_ACTIVATION: &[&str] = &["bin_min", "bin_max", "bin_contains", "tokens", "values", "qualifying_token_index"];
const CIRCUIT_TRACER_FEATURE: &[&str] = &[
    "transcoder_id",
    "index",
    "examples_quantiles",
    "top_logits",
    "bottom_logits",
    "act_min",
    "act_max",
    "quantile_values",
    "histogram",
    "activation_frequency",
];

fn keys(v: &Value) -> Vec<String> {
    let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
    k.sort();
    k
}

fn sorted(names: &[&str]) -> Vec<String> {
    let mut k: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    k.sort();
    k
}

#[test]
fn the_command_writes_every_format_and_says_when_the_corpus_runs_out() {
    use common::{assert_bad_input, burnlens};
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("dash");
    let corpus = fixture("data").join("corpus.parquet");
    let sae = fixture("sae").join("burnlens_topk_trained_gpt2_char");
    let (model, corpus, sae, out_s) = ("tests/fixtures/trained_gpt2_char", corpus.to_str().unwrap(), sae.to_str().unwrap(), out.to_str().unwrap());
    let base = ["dashboards", "--model", model, "--sae", sae, "--data", corpus, "--seq-len", "16", "--out", out_s];
    let o = burnlens(&[&base[..], &["--tokens", "1000", "--features", "0-9,40"]].concat());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let run: Value = serde_json::from_str(&std::fs::read_to_string(out.join("run.json")).unwrap()).unwrap();
    assert_eq!((run["tokens"].as_u64(), run["features"].as_u64()), (Some(1008), Some(11)), "1000 tokens are 63 windows of 16");
    let batch: Value = serde_json::from_str(&std::fs::read_to_string(out.join("neuronpedia/batch-0.json")).unwrap()).unwrap();
    assert_eq!(keys(&batch), sorted(&["model_id", "layer", "sae_set", "sae_id_suffix", "features"]));
    let features = batch["features"].as_array().unwrap();
    assert_eq!(features.iter().map(|f| f["feature_index"].as_u64().unwrap()).collect::<Vec<_>>(), [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 40]);
    for f in features {
        assert_eq!(keys(f), sorted(NEURONPEDIA_FEATURE));
        let acts = f["activations"].as_array().unwrap();
        assert!(!acts.is_empty());
        for a in acts {
            assert_eq!(keys(a), sorted(NEURONPEDIA_ACTIVATION));
            assert_eq!(a["tokens"].as_array().unwrap().len(), 11);
            assert_eq!(a["qualifying_token_index"], 5);
        }
        // The tokens are the char model's characters.
        assert!(f["pos_str"].as_array().unwrap().iter().all(|s| s.as_str().unwrap().chars().count() == 1));
    }
    for id in [0, 40] {
        let ct: Value = serde_json::from_str(&std::fs::read_to_string(out.join(format!("circuit-tracer/{id}.json"))).unwrap()).unwrap();
        assert_eq!(keys(&ct), sorted(CIRCUIT_TRACER_FEATURE));
        assert_eq!(ct["index"], id);
        let own = burnlens::dashboards::read_feature(&out, burnlens::dashboards::FeatureKey { layer: None, index: id }).unwrap().unwrap();
        assert_eq!(ct["examples_quantiles"][0]["examples"].as_array().unwrap().len(), own.top.len());
        assert!(out.join(format!("html/features/{id}.js")).is_file());
    }
    assert!(burnlens::dashboards::read_feature(&out, burnlens::dashboards::FeatureKey { layer: None, index: 11 }).unwrap().is_none());
    let index = std::fs::read_to_string(out.join("html/index.html")).unwrap();
    assert!(index.contains("burnlensFeature") && !index.contains("/*INDEX*/"));

    // Whole windows: every example shows the window but its first token, centred where it is.
    let o = burnlens(&[&base[..], &["--tokens", "1000", "--features", "0-3", "--whole-window"]].concat());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let batch: Value = serde_json::from_str(&std::fs::read_to_string(out.join("neuronpedia/batch-0.json")).unwrap()).unwrap();
    let own = burnlens::dashboards::read_feature(&out, burnlens::dashboards::FeatureKey { layer: None, index: 2 }).unwrap().unwrap();
    let first = &batch["features"][2]["activations"][0];
    assert_eq!(first["tokens"].as_array().unwrap().len(), 15);
    assert_eq!(first["qualifying_token_index"].as_u64().unwrap() as usize, own.top[0].position - 1);
    assert_eq!(own.top[0].acts[own.top[0].position - 1], own.top[0].value);

    // More tokens than the corpus holds: the run says so and writes what it read.
    let o = burnlens(&[&base[..], &["--tokens", "100000000", "--features", "0-3"]].concat());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let said = String::from_utf8_lossy(&o.stdout);
    assert!(said.contains("the dataset ran out after"), "{said}");
    let run: Value = serde_json::from_str(&std::fs::read_to_string(out.join("run.json")).unwrap()).unwrap();
    assert_eq!(run["run"]["ran_out"], true);
    assert!(run["tokens"].as_u64().unwrap() > 1008);

    // Bad input: one line, exit 2.
    assert_bad_input(&burnlens(&[&base[..], &["--features", "96"]].concat()), "feature 96 does not exist: the SAE has 96 features");
    assert_bad_input(&burnlens(&[&base[..], &["--features", "7-x"]].concat()), "features: `7-x`");
    assert_bad_input(&burnlens(&[&base[..], &["--before", "9", "--after", "9"]].concat()), "before 9 and after 9");
    assert_bad_input(&burnlens(&[&base[..], &["--quantile-size", "0"]].concat()), "quantile_size and tokens must be positive");
}

/// A transcoder set's feature activations, as the dashboards read them over a corpus, are the
/// attribution graph's (which equal circuit-tracer's): every active feature of a prompt's
/// graph has the same activation at the same position, and no other feature is active.
#[test]
fn transcoder_activations_equal_the_attribution_graphs() {
    use burnlens::trace::{AttributeOptions, TranscoderSet, attribute};
    let device = Device::flex();
    for case in ["gpt2", "gpt2_clt"] {
        let dir = fixture("trace").join(case);
        let model = load_model(&dir.join("model"), &device).unwrap().model;
        let set = TranscoderSet::load(&dir.join("transcoders"), &device).unwrap();
        let ids: Vec<i64> = vec![1, 17, 5, 60, 33, 2, 71, 12, 44];
        let graph = attribute(&model, &set, &ids, &AttributeOptions { zero_positions: 0, ..AttributeOptions::default() }).unwrap();
        let d = set.layers[0].d_sae();
        let source = FeatureSource::transcoders(&model, set, None).unwrap();
        let b = source.batch(&[ids.iter().map(|&i| i as u32).collect()], 0).unwrap();
        let mut active = 0;
        for (f, &[layer, pos, feat]) in graph.active_features.iter().enumerate() {
            let got = b.acts[pos as usize * b.n_features + layer as usize * d + feat as usize];
            let want = graph.activation_values[f];
            assert!((got - want).abs() <= 1e-5 * want.abs().max(1.0), "{case}: L{layer} #{feat} @{pos}: {got} vs the graph's {want}");
            active += 1;
        }
        assert_eq!(b.acts.iter().filter(|&&a| a != 0.0).count(), active, "{case}: the same features are active");
        assert!(active > 10);
        // A few features (the transcoders cut down to them, nothing else encoded) read as the
        // whole set's columns do.
        let ids_of = |k: usize| graph.active_features[k * graph.active_features.len() / 3][2] as usize;
        let some = vec![ids_of(2), 0, ids_of(1), ids_of(0)];
        let set = TranscoderSet::load(&dir.join("transcoders"), &device).unwrap();
        let cut = FeatureSource::transcoders(&model, set, Some(some.clone())).unwrap();
        let c = cut.batch(&[ids.iter().map(|&i| i as u32).collect()], 0).unwrap();
        assert_eq!(c.n_features, some.len() * graph.n_layers);
        let mut fired = 0;
        for r in 0..c.rows() {
            for l in 0..graph.n_layers {
                for (k, &f) in some.iter().enumerate() {
                    let (got, want) = (c.acts[r * c.n_features + l * some.len() + k], b.acts[r * b.n_features + l * d + f]);
                    assert!((got - want).abs() <= 1e-6 * want.abs().max(1.0), "{case}: L{l} #{f} @{r}: {got} cut down, {want} whole");
                    fired += (got != 0.0) as usize;
                }
            }
        }
        assert!(fired > 0, "{case}: some of the features asked for fire");
    }
}

#[test]
fn graph_features_puts_each_feature_nodes_dashboard_into_the_graph() {
    use common::{assert_bad_input, burnlens};
    let tmp = tempfile::tempdir().unwrap();
    let (dash, graph) = (tmp.path().join("dash"), tmp.path().join("graph"));
    let case = fixture("trace").join("gpt2");
    let (model, tcs) = (case.join("model"), case.join("transcoders"));
    let (model, tcs, dash_s, graph_s) = (model.to_str().unwrap(), tcs.to_str().unwrap(), dash.to_str().unwrap(), graph.to_str().unwrap());
    let o = burnlens(&["dashboards", "--model", model, "--transcoders", tcs, "--data", "random", "--seq-len", "16", "--tokens", "4000", "--out", dash_s]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // Per layer: Neuronpedia batches, and circuit-tracer's files named as its viewer asks.
    let run: Value = serde_json::from_str(&std::fs::read_to_string(dash.join("run.json")).unwrap()).unwrap();
    assert_eq!(run["features"], 120);
    let b: Value = serde_json::from_str(&std::fs::read_to_string(dash.join("neuronpedia/layer-2/batch-0.json")).unwrap()).unwrap();
    assert_eq!((b["layer"].as_u64(), b["features"].as_array().unwrap().len()), (Some(2), 40));
    let ct: Value = serde_json::from_str(&std::fs::read_to_string(dash.join("circuit-tracer/12.json")).unwrap()).unwrap();
    assert_eq!(ct["index"], 12, "(layer 2, feature 2) pairs to 12");

    let base = ["graph", "--model", model, "--transcoders", tcs, "--ids", "1,17,5,60,33,2,71,12,44", "--out", graph_s];
    let o = burnlens(&[&base[..], &["--features", dash_s]].concat());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let g: Value = serde_json::from_str(&std::fs::read_to_string(graph.join("graph.json")).unwrap()).unwrap();
    let features: Vec<&Value> = g["nodes"].as_array().unwrap().iter().filter(|n| n["feature_type"] == "cross layer transcoder").collect();
    assert!(!features.is_empty());
    for n in &features {
        let id = n["node_id"].as_str().unwrap();
        let (layer, index) = id.split_once('_').map(|(l, r)| (l.parse().unwrap(), r.split('_').next().unwrap().parse().unwrap())).unwrap();
        let d = burnlens::dashboards::read_feature(&dash, burnlens::dashboards::FeatureKey { layer: Some(layer), index }).unwrap().unwrap();
        let shown = &n["dashboard"];
        assert_eq!(shown["examples"].as_array().unwrap().len(), d.top.len().min(5), "{id}");
        assert_eq!(shown["examples"][0]["acts"][5].as_f64().unwrap() as f32, d.top[0].value, "{id}: the top example's own activation");
        assert_eq!(shown["promotes"].as_array().unwrap().len(), 10);
        assert!(n["clerp"].as_str().unwrap().starts_with('→'), "{id}");
    }
    assert!(String::from_utf8_lossy(&o.stdout).contains(&format!("{0} of {0} feature nodes have dashboards", features.len())));
    assert!(std::fs::read_to_string(graph.join("graph.html")).unwrap().contains("\"dashboard\""));
    assert_bad_input(&burnlens(&[&base[..], &["--features", graph_s]].concat()), "not a folder written by `burnlens dashboards`");
}

/// A run killed with SIGKILL resumes from its last checkpoint and writes the same dashboards
/// (every feature's file byte for byte) as a run never interrupted; SIGINT saves and exits
/// 130; a checkpoint of another run is refused.
#[test]
fn a_killed_run_resumes_to_the_same_dashboards() {
    use common::{assert_bad_input, burnlens};
    use std::process::Command;
    use std::time::{Duration, Instant};
    let tmp = tempfile::tempdir().unwrap();
    let case = fixture("trace").join("gpt2");
    let (model, tcs) = (case.join("model"), case.join("transcoders"));
    let args = |out: &std::path::Path, tokens: &str| -> Vec<String> {
        ["dashboards", "--model", model.to_str().unwrap(), "--transcoders", tcs.to_str().unwrap(), "--data", "random", "--seq-len", "16"]
            .iter()
            .map(|s| s.to_string())
            .chain(["--tokens".into(), tokens.into(), "--checkpoint-every".into(), "0.1".into(), "--out".into(), out.display().to_string()])
            .collect()
    };
    let (whole, killed) = (tmp.path().join("whole"), tmp.path().join("killed"));
    let tokens = "400000";
    let a: Vec<String> = args(&whole, tokens);
    let o = burnlens(&a.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    let spawn = |sig: Option<&str>| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_burnlens")).args(args(&killed, tokens)).env_remove("BURNLENS_BACKEND").spawn().unwrap();
        let t0 = Instant::now();
        while !killed.join("checkpoints/LATEST").is_file() {
            assert!(t0.elapsed() < Duration::from_secs(30), "no checkpoint was written");
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(300));
        match sig {
            None => child.kill().unwrap(),
            Some(s) => assert!(Command::new("kill").args([s, &child.id().to_string()]).status().unwrap().success()),
        }
        child.wait().unwrap()
    };
    let status = spawn(None);
    assert!(!status.success());
    assert!(killed.join("checkpoints/LATEST").is_file(), "the run ended before it was killed");
    let status = spawn(Some("-INT"));
    assert_eq!(status.code(), Some(130), "Ctrl-C saves and exits 130");
    // Another run's settings meet this checkpoint: refused.
    let other: Vec<String> = args(&killed, "300000");
    assert_bad_input(&burnlens(&other.iter().map(String::as_str).collect::<Vec<_>>()), "a checkpoint of another run (its tokens differ)");
    let b: Vec<String> = args(&killed, tokens);
    let o = burnlens(&b.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("resumed in pass"), "{}", String::from_utf8_lossy(&o.stdout));
    assert!(!killed.join("checkpoints").exists(), "a finished run removes its checkpoints");
    let mut n = 0;
    for e in std::fs::read_dir(whole.join("features")).unwrap() {
        let name = e.unwrap().file_name();
        let (x, y) = (std::fs::read(whole.join("features").join(&name)).unwrap(), std::fs::read(killed.join("features").join(&name)).unwrap());
        assert!(x == y, "{name:?} differs after the resume");
        n += 1;
    }
    assert_eq!(n, 120);
}

/// A few features of an SAE (encoded alone) get the dashboards a run over all of them gives.
#[test]
fn a_feature_subset_equals_the_full_runs_dashboards() {
    let device = Device::flex();
    for case in ["standard_resid", "jumprelu_mlp_post"] {
        let dir = fixture("dashboards").join(case);
        let tokens: Vec<Vec<u32>> = serde_json::from_str(&std::fs::read_to_string(dir.join("tokens.json")).unwrap()).unwrap();
        let model = load_model(&fixture("gpt2"), &device).unwrap().model;
        let sae = Sae::load(&dir.join("sae"), &device).unwrap();
        let cfg = DashboardConfig { ignore_tokens: vec![0], ..DashboardConfig::default() };
        let spec = RunSpec { cfg, tokens: (tokens.len() * tokens[0].len()) as u64, batch_windows: 5, spill: None, ranks: Default::default(), place: None };
        let dash = |features: Option<Vec<usize>>| {
            let source = FeatureSource::new(&model, &sae, features).unwrap();
            run(&source, &spec, None, &mut || Ok(Box::new(burnlens::data::Counted::new(tokens.clone().into_iter().map(Ok)))), &mut |_| {
                std::ops::ControlFlow::Continue(())
            })
            .unwrap()
            .dashboards
        };
        let all = dash(None);
        let some = dash(Some(vec![30, 3, 17]));
        assert_eq!(some.iter().map(|d| d.feature).collect::<Vec<_>>(), [30, 3, 17]);
        for d in &some {
            let w = &all[d.feature];
            assert_eq!(
                d.top.iter().map(|e| (e.window, e.position)).collect::<Vec<_>>(),
                w.top.iter().map(|e| (e.window, e.position)).collect::<Vec<_>>(),
                "{case} {}",
                d.feature
            );
            assert!(d.top.iter().zip(&w.top).all(|(a, b)| (a.value - b.value).abs() <= 1e-5 * b.value.abs().max(1.0)));
            assert_eq!((d.acts_histogram.heights.clone(), d.density), (w.acts_histogram.heights.clone(), w.density), "{case} {}", d.feature);
            assert_eq!(d.logits.top.iter().map(|r| r.0).collect::<Vec<_>>(), w.logits.top.iter().map(|r| r.0).collect::<Vec<_>>());
            let samples = |x: &burnlens::dashboards::FeatureDashboard| {
                x.quantiles.iter().map(|q| q.examples.iter().map(|e| (e.window, e.position)).collect::<Vec<_>>()).collect::<Vec<_>>()
            };
            assert_eq!(samples(d), samples(w), "{case} {}: the same samples (seeded per feature)", d.feature);
        }
    }
}
