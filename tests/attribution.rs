//! Gradients at hook points (against central finite differences), attribution patching
//! against activation patching, the residual stream decomposed, direct logit attribution
//! (the pieces sum to the logits) and the logit lens, on every family's fixture.

mod common;

use burn::tensor::{Device, Tensor, TensorData};
use burnlens::hf::load_model;
use burnlens::lens::patching::{NodeKind, nodes};
use burnlens::lens::{
    Metric, activation_patching, attribution_patching, compare_patching, decompose_resid, direct_logit_attribution, hook_gradients, logit_lens, run_with_cache,
    stack_head_results,
};
use burnlens::model::HookPoint;
use burnlens::model::{Activation, Hooks, Transformer};
use common::*;

fn model(name: &str) -> Transformer {
    load_model(&fixture(name), &Device::flex()).unwrap().model
}

fn ids_for(m: &Transformer, salt: usize) -> Vec<i64> {
    (0..14).map(|i| ((i * 37 + 5 + salt * (i % 3)) % m.config.vocab_size) as i64).collect()
}

fn vec_of(a: &Activation) -> Vec<f32> {
    a.to_vec()
}

/// The metric with `eps · u` added to the activation at `name`.
fn nudged(m: &Transformer, ids: &[i64], metric: &Metric, name: &str, u: &[f32], eps: f32) -> f64 {
    let device = m.device();
    let mut hooks = Hooks::none().with_edit(
        |n| n == name,
        |_, act| match act {
            Activation::Rank3(x) => {
                let d = Tensor::<3>::from_data(TensorData::new(u.iter().map(|v| v * eps).collect(), x.dims()), &device);
                Activation::Rank3(x + d)
            }
            Activation::Rank4(x) => {
                let d = Tensor::<4>::from_data(TensorData::new(u.iter().map(|v| v * eps).collect(), x.dims()), &device);
                Activation::Rank4(x + d)
            }
        },
    );
    metric.value(m, ids, &mut hooks)
}

#[test]
fn gradients_at_hook_points_match_central_finite_differences() {
    let mut worst: f64 = 0.0;
    for name in [
        "gpt2",
        "gpt_neo_local",
        "pythia_like",
        "llama_gqa",
        "qwen2_tied",
        "mistral_window",
        "qwen3_qknorm",
        "olmo2_postnorm",
        "gptj_interleaved",
        "gemma2_softcap",
        "gemma3_local_rope",
    ] {
        let m = model(name);
        let ids = ids_for(&m, 0);
        let v = m.config.vocab_size as i64;
        let last = m.config.n_layers() - 1;
        let points = [
            "hook_embed".to_string(),
            "blocks.0.hook_resid_pre".to_string(),
            "blocks.0.attn.hook_z".to_string(),
            "blocks.0.attn.hook_pattern".to_string(),
            format!("blocks.{last}.hook_resid_pre"),
            format!("blocks.{last}.attn.hook_v"),
            format!("blocks.{last}.hook_resid_post"),
        ];
        let metrics = [Metric::LogitDiff { pos: None, right: 3 % v, wrong: 11 % v }, Metric::LogProb { pos: Some(6), token: 7 % v }, Metric::Loss { from: 2 }];
        for (mi, metric) in metrics.iter().enumerate() {
            let wanted = |n: HookPoint| points.iter().any(|p| n == *p);
            let g = hook_gradients(&m, &ids, &wanted, metric).unwrap();
            assert_eq!(g.gradients.len(), points.len(), "{name}: a gradient for every chosen point");
            let plain = metric.value(&m, &ids, &mut Hooks::none());
            assert!((g.metric - plain).abs() <= 1e-4 * plain.abs().max(1.0), "{name}: the delta leaves the forward pass unchanged");
            for (pi, point) in points.iter().enumerate() {
                let grad = vec_of(&g.gradients[&HookPoint::parse(point).unwrap()]);
                assert_eq!(g.gradients[&HookPoint::parse(point).unwrap()].dims(), g.activations[&HookPoint::parse(point).unwrap()].dims());
                let u = uniform(g.gradients[&HookPoint::parse(point).unwrap()].dims().iter().product(), (mi * 100 + pi) as u64 + 1);
                let analytic: f64 = grad.iter().zip(&u).map(|(a, b)| *a as f64 * *b as f64).sum();
                let eps = 2e-3;
                let fd = (nudged(&m, &ids, metric, point, &u, eps) - nudged(&m, &ids, metric, point, &u, -eps)) / (2.0 * eps as f64);
                // Relative to the gradient's own size along random directions (|g|·|u|/√n
                // would be the expected |g·u|), so that an accidentally tiny g·u is not
                // held to an impossible relative standard.
                let g_norm = grad.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
                let u_norm = u.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
                let scale = analytic.abs().max(g_norm * u_norm / (u.len() as f64).sqrt()).max(1e-6);
                let err = (analytic - fd).abs() / scale;
                eprintln!("{name} {metric:?} {point}: analytic {analytic:.6e} fd {fd:.6e} rel {err:.2e}");
                worst = worst.max(err);
                assert!(err < 2e-2, "{name} {} {point}: analytic {analytic} vs finite difference {fd} (rel {err})", metric.describe());
            }
        }
    }
    eprintln!("worst relative error of a gradient against central differences: {worst:.2e}");
}

#[test]
fn gradients_taken_together_equal_gradients_taken_one_point_at_a_time() {
    let m = model("gpt2");
    let ids = ids_for(&m, 0);
    let metric = Metric::LogitDiff { pos: None, right: 5, wrong: 9 };
    let both = hook_gradients(&m, &ids, &|n| n == "blocks.0.hook_resid_pre" || n == "blocks.1.hook_resid_pre", &metric).unwrap();
    for point in ["blocks.0.hook_resid_pre", "blocks.1.hook_resid_pre"] {
        let alone = hook_gradients(&m, &ids, &|n| n == point, &metric).unwrap();
        let d = max_abs_diff(&vec_of(&both.gradients[&HookPoint::parse(point).unwrap()]), &vec_of(&alone.gradients[&HookPoint::parse(point).unwrap()]));
        assert!(d <= 1e-5 * max_abs(&vec_of(&alone.gradients[&HookPoint::parse(point).unwrap()])).max(1e-3), "{point}: {d}");
    }
    // Later positions cannot reach the metric at an earlier position.
    let early = Metric::LogProb { pos: Some(3), token: 1 };
    let g = hook_gradients(&m, &ids, &|n| n == "blocks.1.hook_resid_pre", &early).unwrap();
    let grad = vec_of(&g.gradients[&HookPoint::parse("blocks.1.hook_resid_pre").unwrap()]);
    let d = m.config.d_model;
    assert!(grad[4 * d..].iter().all(|&x| x == 0.0), "causality: no gradient after the metric's position");
    assert!(grad[..4 * d].iter().any(|&x| x != 0.0));
}

#[test]
fn attribution_patching_estimates_activation_patching() {
    for name in ["gpt2", "pythia_like", "llama_gqa"] {
        let m = model(name);
        let clean = ids_for(&m, 0);
        let mut corrupted = clean.clone();
        corrupted[4] = (corrupted[4] + 1) % m.config.vocab_size as i64;
        let metric = Metric::LogitDiff { pos: None, right: 3, wrong: 11 };
        let ns = nodes(&m, clean.len(), &NodeKind::ALL);
        let (base, exact) = activation_patching(&m, &clean, &corrupted, &metric, &ns).unwrap();
        let (base2, approx) = attribution_patching(&m, &clean, &corrupted, &metric, &ns).unwrap();
        assert!((base - base2).abs() < 1e-4 * base.abs().max(1.0));
        // Positions before the corrupted token see the same activations (up to the order
        // of float sums): both estimates are zero there.
        for (n, (e, a)) in ns.iter().zip(exact.iter().zip(&approx)) {
            if n.kind == NodeKind::ResidPre && n.index < 4 {
                assert!(e.abs() < 1e-5 && a.abs() < 1e-5, "{name} {}: {e} {a}", n.label());
            }
        }
        // Patching the whole residual stream at the first layer is patching the input: the
        // effect is the corrupted metric minus the clean one.
        let corrupted_metric = metric.value(&m, &corrupted, &mut Hooks::none());
        let at4 = ns.iter().position(|n| n.kind == NodeKind::ResidPre && n.layer == 0 && n.index == 4).unwrap();
        assert!(
            (exact[at4] - (corrupted_metric - base)).abs() < 1e-4 * (corrupted_metric - base).abs().max(1.0),
            "{name}: {} vs {}",
            exact[at4],
            corrupted_metric - base
        );
        let r = compare_patching(&m, &clean, &corrupted, &metric, &NodeKind::ALL, true).unwrap();
        eprintln!("{name}: correlation {:?} by kind {:?}", r.correlation, r.correlation_by_kind);
        assert!(r.correlation.unwrap() > 0.5, "{name}: attribution vs activation patching correlation {:?}", r.correlation);
    }
}

#[test]
fn residual_components_sum_to_the_stream_and_logit_attribution_sums_to_the_logits() {
    for name in all_fixtures() {
        let m = model(name);
        let ids = ids_for(&m, 1);
        let n = m.config.n_layers();
        let cache =
            run_with_cache(&m, &ids, |s| s.name().ends_with("hook_resid_pre") || s.name().ends_with("hook_resid_post") || s.name().ends_with("hook_attn_out"));
        let first = |s: &str| -> Vec<f32> {
            let a = cache.get(s).unwrap().to_vec();
            a[..ids.len() * m.config.d_model].to_vec()
        };
        // decompose_resid
        for layer in [Some(n - 1), None] {
            let c = decompose_resid(&m, &ids, layer);
            let want = match layer {
                Some(l) => first(&format!("blocks.{l}.hook_resid_pre")),
                None => first(&format!("blocks.{}.hook_resid_post", n - 1)),
            };
            let got = c.sum().into_data().try_into_vec_as::<f32>().unwrap();
            let err = max_abs_diff(&got, &want);
            assert!(err <= 1e-4 * max_abs(&want).max(1.0), "{name} decompose_resid({layer:?}): {err}");
            assert_eq!(c.labels[0], "embed");
        }
        // stack_head_results + b_O = attention output
        let heads = stack_head_results(&m, &ids, Some(1));
        assert_eq!(heads.labels.len(), m.config.n_heads);
        let b_o = burnlens::lens::head_weights(&m.blocks[0].attn).b_o;
        let d = m.config.d_model;
        let got = (heads.sum() + b_o.reshape([1, d])).into_data().try_into_vec_as::<f32>().unwrap();
        let want = first("blocks.0.hook_attn_out");
        assert!(max_abs_diff(&got, &want) <= 1e-4 * max_abs(&want).max(1.0), "{name} stack_head_results");
        // Direct logit attribution: logit and logit difference.
        for wrong in [None, Some(2)] {
            let dla = direct_logit_attribution(&m, &ids, 1, wrong);
            eprintln!("{name} wrong={wrong:?}: components {} max error {:.2e}", dla.labels.len(), dla.max_error);
            assert!(dla.max_error <= 1e-4, "{name}: components sum to the logits within {}", dla.max_error);
            assert_eq!(dla.contributions.len(), dla.labels.len());
            let heads = dla.labels.iter().filter(|l| l.contains('H') && !l.contains('_')).count();
            assert_eq!(heads, n * m.config.n_heads, "{name}: one component per head");
        }
    }
}

#[test]
fn the_logit_lens_ends_at_the_models_own_prediction() {
    for name in ["gpt2", "gpt_neo_local", "pythia_like", "llama_gqa", "trained_gpt2_char"] {
        let m = model(name);
        let ids = ids_for(&m, 2);
        let lens = logit_lens(&m, &ids, 3, None);
        let n = m.config.n_layers();
        assert_eq!(lens.layers.len(), n + 1);
        let logits = m.forward(m.ids_tensor(&ids));
        let v = m.config.vocab_size;
        let lp: Vec<f32> = burn::tensor::activation::log_softmax(logits, 2).into_data().try_into_vec_as().unwrap();
        for p in 0..ids.len() - 1 {
            let want = lp[p * v + ids[p + 1] as usize] as f64;
            let got = lens.target_logprob[n][p].unwrap();
            assert!((got - want).abs() < 1e-4, "{name} pos {p}: {got} vs {want}");
            // The top token is the argmax of the model's logits.
            let row = &lp[p * v..(p + 1) * v];
            let arg = (0..v).max_by(|&a, &b| row[a].total_cmp(&row[b])).unwrap();
            assert_eq!(lens.top[n][p][0].0, arg as i64);
            assert!(lens.top[n][p][0].1 >= lens.top[n][p][1].1);
            let rank = lens.target_rank[n][p].unwrap();
            assert_eq!(rank, row.iter().filter(|&&x| x > row[ids[p + 1] as usize]).count());
        }
        assert!(lens.target_logprob[n][ids.len() - 1].is_none());
        // Earlier layers are different readings.
        assert!((lens.target_logprob[0][0].unwrap() - lens.target_logprob[n][0].unwrap()).abs() > 1e-6);
    }
}

#[test]
fn gradients_and_attribution_agree_on_every_backend() {
    let metric = Metric::LogitDiff { pos: None, right: 3, wrong: 11 };
    let mut reference: Option<(Vec<f32>, f64)> = None;
    for (backend, device) in backends() {
        let m = load_model(&fixture("llama_gqa"), &device).unwrap().model;
        let ids = ids_for(&m, 0);
        let g = hook_gradients(&m, &ids, &|n| n == "blocks.1.hook_resid_pre", &metric).unwrap();
        let grad = vec_of(&g.gradients[&HookPoint::parse("blocks.1.hook_resid_pre").unwrap()]);
        let dla = direct_logit_attribution(&m, &ids, 3, Some(11));
        assert!(dla.max_error <= 1e-4, "{backend}: {}", dla.max_error);
        match &reference {
            None => reference = Some((grad, g.metric)),
            Some((want, metric_value)) => {
                let d = max_abs_diff(&grad, want) / max_abs(want).max(1e-6);
                assert!(d < 1e-4, "{backend}: gradient differs from the first backend by {d}");
                assert!((g.metric - metric_value).abs() < 1e-4);
            }
        }
    }
}
