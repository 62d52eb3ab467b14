//! Feature dashboards against SAEDashboard itself (`tests/fixtures/dashboards/`, written by
//! `scripts/gen_dashboard_fixtures.py` with sae-dashboard 0.8.0 on the tiny GPT-2 processed
//! as TransformerLens processes it, random SAEs, fixed tokens, BOS ignored): the same top
//! groups (window, position, shown tokens and activations), the same group titles (maximum,
//! quantile boundaries, the fraction each interval holds), quantile samples of the same sizes
//! drawn from the same intervals, histograms within one count per bin, equal logit tables.

mod common;

use burn::tensor::Device;
use burnlens::dashboards::{DashboardConfig, FeatureDashboard, FeatureSource, RunSpec, run};
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

fn dashboards(case: &str) -> (Vec<FeatureDashboard>, Value, Vec<Vec<u32>>) {
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
    let spec = RunSpec { cfg, tokens: (tokens.len() * tokens[0].len()) as u64, batch_windows: 7 };
    let windows = tokens.clone();
    let out = run(&source, &spec, &mut || Ok(Box::new(windows.clone().into_iter().map(Ok))), &mut |_| {}).unwrap();
    assert!(!out.ran_out);
    (out.dashboards, want, tokens)
}

/// SAEDashboard's "INTERVAL a - b<br>CONTAINS p%" for an interval.
fn interval_title(lower: f32, upper: f32, contains: f64) -> String {
    format!("INTERVAL {lower:.3} - {upper:.3}<br>CONTAINS {:.3}%", contains * 100.0)
}

fn check_case(case: &str) {
    let (got, want, tokens) = dashboards(case);
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
