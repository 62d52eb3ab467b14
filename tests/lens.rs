//! Looking inside: circuits, composition, weight processing, interventions, detectors.

mod common;

use burn::tensor::{Device, Tensor};
use burnlens::hf::load_model;
use burnlens::lens::circuits::{all_head_weights, full_ov, ov, qk};
use burnlens::lens::{Ablation, Detector, ProcessOptions, ablate_heads, composition_scores, head_scores, patch, process_weights, run_with_cache};
use burnlens::model::HookPoint;
use burnlens::model::{Hooks, Transformer};
use common::*;

fn model(name: &str) -> Transformer {
    load_model(&fixture(name), &Device::flex()).unwrap().model
}

fn ids_for(m: &Transformer) -> Vec<i64> {
    (0..18).map(|i| ((i * 37 + 5) % m.config.vocab_size) as i64).collect()
}

fn logprobs(m: &Transformer, ids: &[i64]) -> Vec<f32> {
    let logits = m.forward(m.ids_tensor(ids));
    burn::tensor::activation::log_softmax(logits, 2).into_data().try_into_vec_as::<f32>().unwrap()
}

#[test]
fn qk_and_ov_circuits_reproduce_scores_and_head_outputs() {
    for name in all_fixtures() {
        let m = model(name);
        let ids = ids_for(&m);
        let cache = run_with_cache(&m, &ids, |n| {
            n.name().ends_with("ln1.hook_normalized") || n.name().ends_with("hook_resid_pre") || n.name().ends_with("attn.hook_result")
        });
        for (l, w) in all_head_weights(&m).iter().enumerate() {
            // What attention reads: ln1's output, or the stream itself when the norms come after (OLMo 2).
            let x: Tensor<2> = if m.config.norm_placement == burnlens::model::NormPlacement::Post {
                cache.get(&format!("blocks.{l}.hook_resid_pre")).unwrap().rank3().unwrap().squeeze_dim(0)
            } else {
                m.blocks[l].ln1.finish(cache.get(&format!("blocks.{l}.ln1.hook_normalized")).unwrap().rank3().unwrap().squeeze_dim(0))
            };
            let qk = qk(w);
            let ov = ov(w);
            for h in 0..m.config.n_heads {
                // x QK xᵀ equals (x W_Q)(x W_K)ᵀ without biases.
                let q_nob = x.clone().matmul(w.w_q.clone().narrow(0, h, 1).squeeze_dim(0));
                let k_nob = x.clone().matmul(w.w_k.clone().narrow(0, h, 1).squeeze_dim(0));
                let want = q_nob.matmul(k_nob.transpose());
                let got = x.clone().matmul(qk.ab_one(h)).matmul(x.clone().transpose());
                let scale = want.clone().abs().max().into_scalar::<f32>().max(1.0);
                assert!((got - want).abs().max().into_scalar::<f32>() <= 1e-4 * scale, "{name} L{l}H{h} QK");
                // The cached per-head result is pattern · (x OV + b_V W_O).
                let result: Tensor<2> =
                    cache.get(&format!("blocks.{l}.attn.hook_result")).unwrap().rank4().unwrap().narrow(2, h, 1).squeeze_dim::<3>(2).squeeze_dim(0);
                let ov_h = ov.ab_one(h);
                let x_ov = x.clone().matmul(ov_h);
                let bias = w.b_v.clone().narrow(0, h, 1).matmul(w.w_o.clone().narrow(0, h, 1).squeeze_dim(0));
                let pat_cache = run_with_cache(&m, &ids, |n| n == format!("blocks.{l}.attn.hook_pattern"));
                let pattern: Tensor<2> =
                    pat_cache.get(&format!("blocks.{l}.attn.hook_pattern")).unwrap().rank4().unwrap().narrow(1, h, 1).squeeze_dim::<3>(1).squeeze_dim(0);
                let rebuilt = pattern.matmul(x_ov) + bias;
                let d = (rebuilt - result.clone()).abs().max().into_scalar::<f32>();
                assert!(d <= 1e-5 * result.abs().max().into_scalar::<f32>().max(1.0), "{name} L{l}H{h} OV: {d}");
            }
        }
    }
}

#[test]
fn full_ov_circuit_is_w_e_ov_w_u() {
    let m = model("gpt2");
    let w = &all_head_weights(&m)[1];
    let f = full_ov(&m, w);
    assert_eq!(f.shape(), [4, 128, 128]);
    assert_eq!(f.inner(), 8);
    let full = f.ab_one(2);
    let we = m.embed.weight.val();
    let direct = we.clone().matmul(ov(w).ab_one(2)).matmul(we.transpose());
    let scale = direct.clone().abs().max().into_scalar::<f32>();
    assert!((full - direct).abs().max().into_scalar::<f32>() <= 1e-4 * scale);
}

#[test]
fn composition_scores_are_zero_unless_the_first_head_is_earlier() {
    let m = model("gpt_neo_local");
    let c = composition_scores(&m);
    let (l, h) = (c.n_layers, c.n_heads);
    for l1 in 0..l {
        for h1 in 0..h {
            for l2 in 0..l {
                for h2 in 0..h {
                    let i = c.index(l1, h1, l2, h2);
                    for s in [c.q[i], c.k[i], c.v[i]] {
                        if l1 >= l2 {
                            assert_eq!(s, 0.0);
                        } else {
                            assert!(s > 0.0 && s < 1.0, "{s}");
                        }
                    }
                }
            }
        }
    }
    // Random matrices score about 1/sqrt(d_model).
    assert!((c.random_baseline / c.inverse_sqrt_d_model - 1.0).abs() < 0.35, "{} vs {}", c.random_baseline, c.inverse_sqrt_d_model);
}

#[test]
fn weight_processing_keeps_log_probabilities_and_centres_weights() {
    for name in all_fixtures() {
        let m = model(name);
        let ids = ids_for(&m);
        let before = logprobs(&m, &ids);
        // What TransformerLens would drop for this architecture is refused by name.
        let (opts, dropped) = ProcessOptions::all().allowed_for(&m.config);
        if !dropped.is_empty() {
            let err = process_weights(&m, ProcessOptions::all()).unwrap_err().to_string();
            assert!(dropped.iter().any(|d| err.contains(d.as_str())), "{name}: {err}");
            println!("process {name:<22} dropped: {dropped:?}");
        }
        let p = process_weights(&m, opts).unwrap();
        let after = logprobs(&p, &ids);
        let d = max_abs_diff(&before, &after);
        println!("process {name:<22} max |Δ log p| {d:.2e}");
        assert!(d <= 1e-4, "{name}: processing changed log-probabilities by {d:e}");
        // Writing weights are centred only where a LayerNorm reads them (RMSNorm would see the mean).
        let we: Vec<f32> = p.embed.weight.val().mean_dim(1).into_data().try_into_vec_as().unwrap();
        let layer_norm = m.config.norm == burnlens::model::NormKind::LayerNorm;
        assert_eq!(max_abs(&we) < 1e-5, layer_norm, "{name}: W_E rows centred iff the model has LayerNorms");
        let wu: Vec<f32> = p.w_u().0.mean_dim(1).into_data().try_into_vec_as().unwrap();
        assert_eq!(max_abs(&wu) < 1e-5, opts.center_unembed, "{name}: W_U centred over the vocabulary iff center_unembed ran");
        for w in all_head_weights(&p) {
            let bv: Vec<f32> = w.b_v.into_data().try_into_vec_as().unwrap();
            assert!(bv.iter().all(|&x| x == 0.0), "{name}: b_V not folded");
        }
        let ln: Vec<f32> = p.blocks[0].ln1.weight.val().into_data().try_into_vec_as().unwrap();
        assert_eq!(ln.iter().all(|&x| x == 1.0), opts.fold_ln, "{name}: ln1 folded iff fold_ln ran");
        // Each step alone also keeps the outputs.
        for opts in [
            ProcessOptions { fold_ln: true, ..Default::default() },
            ProcessOptions { center_writing_weights: true, ..Default::default() },
            ProcessOptions { center_unembed: true, ..Default::default() },
            ProcessOptions { fold_value_biases: true, ..Default::default() },
        ] {
            if opts.check(&m.config).is_err() {
                continue;
            }
            let one = process_weights(&m, opts).unwrap();
            assert!(max_abs_diff(&before, &logprobs(&one, &ids)) <= 1e-4, "{name}: {opts:?}");
        }
    }
}

#[test]
fn ablation_and_patching_change_exactly_what_they_should() {
    let m = model("gpt2");
    let ids = ids_for(&m);
    let clean = m.forward(m.ids_tensor(&ids));
    // Zero-ablating every head of layer 1 leaves only b_O as its attention output.
    let heads: Vec<(usize, usize)> = (0..4).map(|h| (1, h)).collect();
    let mut hooks = ablate_heads(Hooks::capture(|n| n == "blocks.1.hook_attn_out"), &heads, Ablation::Zero);
    let ablated = m.forward_hooked(m.ids_tensor(&ids), &mut hooks);
    let out: Vec<f32> = hooks.cache[&HookPoint::parse("blocks.1.hook_attn_out").unwrap()].to_vec();
    let b_o: Vec<f32> = m.blocks[1].attn.out.bias.as_ref().unwrap().val().into_data().try_into_vec_as().unwrap();
    for row in out.chunks(32) {
        assert!(max_abs_diff(row, &b_o) < 1e-6);
    }
    assert!((ablated - clean.clone()).abs().max().into_scalar::<f32>() > 1e-2, "ablation should change the logits");

    // Mean ablation with the clean run as reference: z of the head is its mean over positions.
    let reference = run_with_cache(&m, &ids, |n| n == "blocks.0.attn.hook_z");
    let mean_z: Vec<f32> = reference.get("blocks.0.attn.hook_z").unwrap().rank4().unwrap().narrow(2, 2, 1).mean_dim(1).into_data().try_into_vec_as().unwrap();
    let mut hooks = ablate_heads(Hooks::capture(|n| n == "blocks.0.attn.hook_z"), &[(0, 2)], Ablation::Mean(reference.activations.clone()));
    m.forward_hooked(m.ids_tensor(&ids), &mut hooks);
    let z = hooks.cache[&HookPoint::parse("blocks.0.attn.hook_z").unwrap()].rank4().unwrap();
    let head2: Vec<f32> = z.clone().narrow(2, 2, 1).into_data().try_into_vec_as().unwrap();
    for row in head2.chunks(8) {
        assert!(max_abs_diff(row, &mean_z) < 1e-6);
    }
    let before: Vec<f32> = reference.get("blocks.0.attn.hook_z").unwrap().rank4().unwrap().narrow(2, 0, 1).into_data().try_into_vec_as().unwrap();
    let after: Vec<f32> = z.narrow(2, 0, 1).into_data().try_into_vec_as().unwrap();
    assert_eq!(before, after, "other heads untouched");

    // Patching the whole residual stream from another prompt reproduces that prompt's logits.
    let other: Vec<i64> = ids.iter().map(|i| (i + 1) % 128).collect();
    let donor = run_with_cache(&m, &other, |n| n == "blocks.1.hook_resid_pre");
    let mut hooks = patch(Hooks::none(), HookPoint::parse("blocks.1.hook_resid_pre").unwrap(), donor.get("blocks.1.hook_resid_pre").unwrap().clone());
    let patched = m.forward_hooked(m.ids_tensor(&ids), &mut hooks);
    assert!((patched - donor.logits).abs().max().into_scalar::<f32>() < 1e-4);
}

#[test]
fn detectors_score_a_hand_made_previous_token_pattern() {
    // A sequence with repeats: duplicate and induction patterns are non-empty.
    let m = model("gpt2_legacy_bin");
    let toks: Vec<i64> = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6].to_vec();
    for d in Detector::ALL {
        let s = head_scores(&m, std::slice::from_ref(&toks), d);
        assert_eq!((s.len(), s[0].len()), (2, 4));
        assert!(s.iter().flatten().all(|&x| (0.0..=1.0).contains(&x)));
    }
    // The score is the attention mass on the detector pattern: check one head directly.
    let cache = run_with_cache(&m, &toks, |n| n == "blocks.1.attn.hook_pattern");
    let p = cache.pattern(1);
    let t = toks.len();
    let manual: f64 = (1..t).map(|q| p[(3 * t + q) * t + q - 1] as f64).sum::<f64>() / t as f64;
    let s = head_scores(&m, &[toks], Detector::PreviousToken);
    assert!((s[1][3] - manual).abs() < 1e-6, "{} vs {manual}", s[1][3]);
}

/// Shortformer positions join the normalized stream as in TransformerLens: the query input
/// of every layer is `ln1(resid_pre) + pos_embed`; and LayerNorm folding, which could not
/// keep that, is refused.
#[test]
fn shortformer_queries_read_ln1_of_the_residual_plus_positions() {
    use burnlens::model::{Positional, TransformerConfig};
    let dev = Device::flex();
    let mut cfg = TransformerConfig::gpt2_like(11, 8, 16, 2, 2);
    cfg.d_mlp = None;
    cfg.positional = Positional::QueryKeyOnly;
    let m = cfg.init(&dev).unwrap();
    let ids = [3i64, 1, 4, 1, 5, 9];
    let (t, d, dh) = (ids.len(), 16, 8);
    let mut hooks = Hooks::capture(|n| n == "blocks.1.hook_resid_pre" || n == "hook_pos_embed" || n == "blocks.1.attn.hook_q");
    m.forward_hooked(m.ids_tensor(&ids), &mut hooks);
    let resid = hooks.cache[&HookPoint::parse("blocks.1.hook_resid_pre").unwrap()].to_vec();
    let pos = hooks.cache[&HookPoint::parse("hook_pos_embed").unwrap()].to_vec();
    let q = hooks.cache[&HookPoint::parse("blocks.1.attn.hook_q").unwrap()].to_vec(); // [1, t, head, d_head]
    let ln = &m.blocks[1].ln1;
    let g: Vec<f32> = ln.weight.val().into_data().try_to_vec::<f32>().unwrap();
    let b: Vec<f32> = ln.bias.as_ref().expect("LayerNorm bias").val().into_data().try_to_vec::<f32>().unwrap();
    let w = burnlens::lens::head_weights(&m.blocks[1].attn);
    let w_q: Vec<f32> = w.w_q.into_data().try_to_vec::<f32>().unwrap();
    let b_q: Vec<f32> = w.b_q.into_data().try_to_vec::<f32>().unwrap();
    let mut worst = 0f32;
    for i in 0..t {
        let x = &resid[i * d..(i + 1) * d];
        let mean = x.iter().sum::<f32>() / d as f32;
        let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / d as f32;
        let input: Vec<f32> = (0..d).map(|j| (x[j] - mean) / (var + ln.eps as f32).sqrt() * g[j] + b[j] + pos[i * d + j]).collect();
        for h in 0..2 {
            for e in 0..dh {
                let by_hand: f32 = (0..d).map(|j| input[j] * w_q[(h * d + j) * dh + e]).sum::<f32>() + b_q[h * dh + e];
                worst = worst.max((by_hand - q[(i * 2 + h) * dh + e]).abs());
            }
        }
    }
    assert!(worst < 1e-5, "hook_q differs from (ln1(resid) + pos) W_Q + b_Q by {worst}");

    let err = process_weights(&m, ProcessOptions::all()).unwrap_err().to_string();
    assert!(err.contains("query_key_only") && err.contains("fold_ln"), "{err}");
    let opts = ProcessOptions { fold_ln: false, ..ProcessOptions::all() };
    let p = process_weights(&m, opts).unwrap();
    let (a, b) = (logprobs(&m, &ids), logprobs(&p, &ids));
    let diff = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    assert!(diff < 1e-4, "centring without folding keeps log-probabilities: {diff}");
}

/// Every tool on the newer families: composition scores, detectors, the induction
/// experiment, circuits, the logit lens, patching (attribution beside activation) and direct
/// logit attribution, each checked for a property that holds whatever the weights.
#[test]
fn every_tool_runs_on_the_newer_families() {
    use burnlens::lens::{Metric, NodeKind, compare_patching, direct_logit_attribution, induction_experiment, logit_lens};
    for name in ["qwen3_qknorm", "olmo2_postnorm", "gptj_interleaved", "gemma2_softcap", "gemma3_local_rope", "phi3_fused"] {
        let m = model(name);
        let (l, h) = (m.config.n_layers(), m.config.n_heads);
        let ids: Vec<i64> = vec![5, 17, 33, 2, 90, 12, 7, 64, 5, 17];
        // Composition: zero unless the first head is earlier.
        let c = composition_scores(&m);
        for l1 in 0..l {
            for l2 in 0..=l1 {
                let i = c.index(l1, 0, l2, 0);
                assert_eq!((c.q[i], c.k[i], c.v[i]), (0.0, 0.0, 0.0), "{name}");
            }
        }
        // Detectors: scores are attention masses in [0, 1].
        for d in [Detector::PreviousToken, Detector::Induction, Detector::DuplicateToken] {
            let s = head_scores(&m, std::slice::from_ref(&ids), d);
            assert!(s.iter().flatten().all(|x| (-1e-6..=1.0 + 1e-6).contains(x)), "{name} {d:?}: {s:?}");
        }
        let report = induction_experiment(&m, 6, 2, 1, None);
        assert!(report.logprobs.iter().all(|x| x.is_finite() && *x <= 0.0), "{name}: induction log-probabilities");
        // Circuits: the OV circuit's eigenvalues exist for every head.
        for w in all_head_weights(&m) {
            assert_eq!(ov(&w).shape()[0], h, "{name}");
        }
        // The logit lens's last layer is the model's own prediction (after any soft-cap,
        // which keeps the order).
        let lens = logit_lens(&m, &ids, 3, None);
        let logits: Vec<f32> = m.forward(m.ids_tensor(&ids)).into_data().try_into_vec_as().unwrap();
        let v = m.config.vocab_size;
        for (p, top) in lens.top.last().unwrap().iter().enumerate() {
            let row = &logits[p * v..(p + 1) * v];
            let best = (0..v).max_by(|&a, &b| row[a].total_cmp(&row[b])).unwrap() as i64;
            assert_eq!(top[0].0, best, "{name}: logit lens at position {p}");
        }
        // Patching: a corrupted run equal to the clean one moves nothing, exactly.
        let metric = Metric::LogitDiff { pos: None, right: 3, wrong: 11 };
        let same = compare_patching(&m, &ids, &ids, &metric, &[NodeKind::Head, NodeKind::ResidPre, NodeKind::Mlp], true).unwrap();
        let (sp, sa) = (same.patched.clone().unwrap(), same.attribution.clone());
        assert!(
            sp.iter().chain(&sa).all(|e| e.abs() < 1e-6),
            "{name}: patching a run with itself: patched max {:e}, attribution max {:e}",
            sp.iter().fold(0f64, |a, e| a.max(e.abs())),
            sa.iter().fold(0f64, |a, e| a.max(e.abs()))
        );
        let mut corrupted = ids.clone();
        corrupted[4] = 91;
        let r = compare_patching(&m, &ids, &corrupted, &metric, &[NodeKind::ResidPre], true).unwrap();
        // Patching the whole stream at the changed position of layer 0 gives the corrupted metric.
        let p0 = r.nodes.iter().position(|n| n.layer == 0 && n.index == 4).unwrap();
        let full = r.patched.as_ref().unwrap()[p0] + r.clean_metric;
        assert!((full - r.corrupted_metric).abs() < 1e-3 * r.corrupted_metric.abs().max(1.0), "{name}: {full} vs {}", r.corrupted_metric);
        // DLA: the components sum to the logits (before any final soft-cap).
        let dla = direct_logit_attribution(&m, &ids, 3, Some(11));
        assert!(dla.max_error <= 1e-3, "{name}: DLA sums to the logits within {}", dla.max_error);
        assert_eq!(dla.final_softcap, m.config.final_softcap);
    }
}

/// A metric read from the final stream, unembedding only the positions it needs, is the
/// metric of the full logits (soft-capped models included).
#[test]
fn metrics_from_the_final_stream_equal_metrics_from_the_logits() {
    use burnlens::lens::Metric;
    for name in ["gpt2", "gemma2_softcap", "llama_gqa"] {
        let m = model(name);
        let ids: Vec<i64> = vec![5, 17, 33, 2, 90, 12, 7, 64];
        for metric in [
            Metric::LogitDiff { pos: None, right: 3, wrong: 11 },
            Metric::LogitDiff { pos: Some(2), right: 1, wrong: 4 },
            Metric::LogProb { pos: Some(5), token: 7 },
            Metric::Loss { from: 2 },
        ] {
            let full = metric.value(&m, &ids, &mut Hooks::none());
            let stream = m.forward_with(burnlens::model::Forward::new(m.ids_tensor(&ids)).stop(burnlens::model::Stop::FinalStream));
            let part = metric.eval_stream(&m, stream, &ids).into_scalar::<f32>() as f64;
            assert!((full - part).abs() <= 1e-5 * full.abs().max(1.0), "{name} {metric:?}: {full} vs {part}");
        }
    }
}
