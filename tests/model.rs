//! Properties of the canonical model that do not need Hugging Face: padding, the KV cache,
//! the local window, and random initialisation.

mod common;

use burn::module::Module;
use burn::tensor::{Device, Int, Tensor, TensorData};
use burnlens::hf::load_model;
use burnlens::model::HookPoint;
use burnlens::model::{AttentionSpan, Forward, Hooks, KvCache, Stop, TransformerConfig};
use common::*;

fn to_vec(t: Tensor<3>) -> Vec<f32> {
    t.into_data().try_into_vec_as::<f32>().unwrap()
}

#[test]
fn left_padded_batch_matches_unpadded_runs() {
    for name in ["gpt2", "gpt_neo_local", "pythia_like", "llama_gqa", "qwen2_tied", "mistral_window"] {
        let device = Device::flex();
        let model = load_model(&fixture(name), &device).unwrap().model;
        let a: Vec<i64> = vec![5, 9, 33, 2, 7, 120, 64, 8, 1, 3, 77, 41];
        let b: Vec<i64> = vec![11, 12, 13, 14, 15];
        let t = a.len();
        let pad = t - b.len();
        let mut ids = a.clone();
        ids.extend(std::iter::repeat_n(0, pad).chain(b.iter().copied()));
        let mask: Vec<Vec<bool>> = vec![vec![true; t], (0..t).map(|i| i >= pad).collect()];
        let batch = Tensor::<2, Int>::from_data(TensorData::new(ids, [2, t]), &device);
        let padded = model.forward_with(Forward::new(batch).padding(&mask));
        let v = padded.dims()[2];
        let padded = to_vec(padded);

        let alone_a = to_vec(model.forward(model.ids_tensor(&a)));
        let alone_b = to_vec(model.forward(model.ids_tensor(&b)));
        let d_a = max_abs_diff(&padded[..t * v], &alone_a);
        let d_b = max_abs_diff(&padded[(t + pad) * v..], &alone_b);
        assert!(d_a <= 1e-4 && d_b <= 1e-4, "{name}: padded vs alone differ by {d_a:e} / {d_b:e}");
        assert!(padded.iter().all(|x| x.is_finite()), "{name}: padding produced non-finite logits");
    }
}

#[test]
fn kv_cache_gives_the_same_logits_as_a_full_pass() {
    for name in ["gpt2_inverse_layer", "gpt_neo_local", "pythia_like", "llama_gqa", "qwen2_tied", "mistral_window"] {
        let model = load_model(&fixture(name), &Device::flex()).unwrap().model;
        let ids: Vec<i64> = (0..20).map(|i| (i * 37 % 128) as i64).collect();
        let full = to_vec(model.forward(model.ids_tensor(&ids)));
        let v = model.config.vocab_size;
        let mut cache = KvCache::new();
        // A 7-token prefix, then one token at a time.
        let mut got = to_vec(model.forward_cached(model.ids_tensor(&ids[..7]), &mut cache));
        for i in 7..ids.len() {
            got.extend(to_vec(model.forward_cached(model.ids_tensor(&ids[i..i + 1]), &mut cache)));
        }
        assert_eq!(cache.len(), ids.len());
        let d = max_abs_diff(&got, &full);
        assert!(d <= 1e-4, "{name}: cached vs full logits differ by {d:e}");
        assert_eq!(got.len(), ids.len() * v);
    }
}

/// The cache writes each step's keys in place into buffers it grows: a copy of a cache
/// must not see the other's later steps, and steps of several tokens work as single ones.
#[test]
fn a_cloned_kv_cache_continues_on_its_own() {
    for name in ["gpt2_inverse_layer", "llama_gqa"] {
        let model = load_model(&fixture(name), &Device::flex()).unwrap().model;
        let v = model.config.vocab_size;
        let a: Vec<i64> = (0..14).map(|i| (i * 37 % 128) as i64).collect();
        let b: Vec<i64> = a[..5].iter().copied().chain((5..14).map(|i| (i * 11 % 128) as i64)).collect();
        let mut cache_a = KvCache::new();
        model.forward_cached(model.ids_tensor(&a[..5]), &mut cache_a);
        let mut cache_b = cache_a.clone();
        // `a` in steps of 3, 1, 5 tokens; `b` one token at a time, interleaved with `a`.
        let mut got_a = Vec::new();
        let mut got_b = Vec::new();
        let mut ib = 5;
        for (start, n) in [(5, 3), (8, 1), (9, 5)] {
            got_a.extend(to_vec(model.forward_cached(model.ids_tensor(&a[start..start + n]), &mut cache_a)));
            for _ in 0..n {
                got_b.extend(to_vec(model.forward_cached(model.ids_tensor(&b[ib..ib + 1]), &mut cache_b)));
                ib += 1;
            }
        }
        for (what, got, ids) in [("a", got_a, &a), ("b", got_b, &b)] {
            let full = to_vec(model.forward(model.ids_tensor(ids)));
            let d = max_abs_diff(&got, &full[5 * v..]);
            assert!(d <= 1e-4, "{name}, sequence {what}: cached vs full logits differ by {d:e}");
        }
    }
}

#[test]
fn local_window_hides_exactly_the_keys_outside_it() {
    let mut cfg = TransformerConfig::gpt2_like(50, 16, 16, 2, 2);
    cfg.spans = vec![AttentionSpan::Local(3), AttentionSpan::Global];
    let model = cfg.init(&Device::flex()).unwrap();
    let ids: Vec<i64> = (0..10).collect();
    let mut hooks = Hooks::capture(|n| n.name().ends_with("hook_pattern"));
    model.forward_hooked(model.ids_tensor(&ids), &mut hooks);
    let local = hooks.cache[&HookPoint::parse("blocks.0.attn.hook_pattern").unwrap()].to_vec();
    let global = hooks.cache[&HookPoint::parse("blocks.1.attn.hook_pattern").unwrap()].to_vec();
    let t = ids.len();
    for h in 0..2 {
        for q in 0..t {
            let row = |p: &[f32]| p[(h * t + q) * t..(h * t + q + 1) * t].to_vec();
            let (l, g) = (row(&local), row(&global));
            for k in 0..t {
                let visible = k <= q && q < k + 3;
                assert_eq!(l[k] > 0.0, visible, "local h{h} q{q} k{k}: {}", l[k]);
                assert_eq!(g[k] > 0.0, k <= q, "global h{h} q{q} k{k}");
                if !visible {
                    assert_eq!(l[k], 0.0, "masked entries must be exactly zero");
                }
            }
            assert!((l.iter().sum::<f32>() - 1.0).abs() < 1e-5);
        }
    }
}

#[test]
fn random_init_follows_hf_statistics() {
    let cfg = TransformerConfig::gpt2_like(1000, 64, 128, 4, 4);
    let model = cfg.init(&Device::flex()).unwrap();
    assert_eq!(model.num_params() as u128, cfg.n_params().unwrap());
    let std = |t: Tensor<2>| {
        let v: Vec<f32> = t.into_data().try_into_vec_as::<f32>().unwrap();
        let m = v.iter().sum::<f32>() / v.len() as f32;
        (v.iter().map(|x| (x - m) * (x - m)).sum::<f32>() / v.len() as f32).sqrt()
    };
    let s_embed = std(model.embed.weight.val());
    let s_qkv = std(model.blocks[0].attn.qkv.weight.val());
    let s_out = std(model.blocks[0].attn.out.weight.val());
    assert!((s_embed - 0.02).abs() < 0.002, "{s_embed}");
    assert!((s_qkv - 0.02).abs() < 0.002, "{s_qkv}");
    let want = 0.02 / (8f32).sqrt();
    assert!((s_out - want).abs() < 0.001, "residual projections should have std {want}, got {s_out}");
    let b: Vec<f32> = model.blocks[0].attn.qkv.bias.as_ref().unwrap().val().into_data().try_into_vec_as::<f32>().unwrap();
    assert!(b.iter().all(|&x| x == 0.0));
}

#[test]
fn activations_match_their_hugging_face_formulas() {
    use burnlens::model::{ActivationFn, activate};
    let xs: Vec<f32> = (-80..=80).map(|i| i as f32 * 0.1).collect();
    let erf = |x: f64| {
        // Abramowitz-Stegun 7.1.26 is too coarse; integrate instead (Simpson, fine grid).
        let n = 2000;
        let h = x / n as f64;
        let f = |t: f64| (-t * t).exp();
        let s: f64 = (0..=n)
            .map(|i| {
                f(i as f64 * h)
                    * if i == 0 || i == n {
                        1.0
                    } else if i % 2 == 1 {
                        4.0
                    } else {
                        2.0
                    }
            })
            .sum();
        2.0 / std::f64::consts::PI.sqrt() * s * h / 3.0
    };
    let reference = |a: ActivationFn, x: f64| match a {
        ActivationFn::GeluNew => 0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh()),
        ActivationFn::Gelu => 0.5 * x * (1.0 + erf(x / 2f64.sqrt())),
        ActivationFn::GeluFast => 0.5 * x * (1.0 + (x * 0.7978845608 * (1.0 + 0.044715 * x * x)).tanh()),
        ActivationFn::Relu => x.max(0.0),
        ActivationFn::QuickGelu => x / (1.0 + (-1.702 * x).exp()),
        ActivationFn::Silu => x / (1.0 + (-x).exp()),
    };
    let device = Device::flex();
    for a in [ActivationFn::GeluNew, ActivationFn::Gelu, ActivationFn::GeluFast, ActivationFn::Relu, ActivationFn::QuickGelu, ActivationFn::Silu] {
        let t = Tensor::<1>::from_data(TensorData::new(xs.clone(), [xs.len()]), &device);
        let got: Vec<f32> = activate(a, t).into_data().try_into_vec_as().unwrap();
        for (x, y) in xs.iter().zip(got) {
            let want = reference(a, *x as f64);
            assert!((y as f64 - want).abs() <= 2e-6 * want.abs().max(1.0), "{a:?}({x}) = {y}, expected {want}");
        }
    }
}

/// `hook_names(cfg)` (the one list the CLI, the lens tools and the docs take names from)
/// is exactly the hook points a forward pass visits, in the order it visits them.
#[test]
fn hook_names_are_the_points_a_forward_pass_visits_on_every_fixture() {
    for name in all_fixtures() {
        let model = load_model(&fixture(name), &Device::flex()).unwrap().model;
        let visited = std::cell::RefCell::new(Vec::<String>::new());
        let mut hooks = Hooks::none().with_edit(
            |_| true,
            |n, a| {
                visited.borrow_mut().push(n.to_string());
                a
            },
        );
        model.forward_hooked(model.ids_tensor(&[1, 2, 3]), &mut hooks);
        drop(hooks);
        assert_eq!(visited.into_inner(), burnlens::model::hook_names(&model.config), "{name}");
    }
}

/// Every model imported from Hugging Face exports as its own family: the config.json written
/// for it parses back to the same configuration (the export check's round trip).
#[test]
fn every_fixture_round_trips_through_its_config_json() {
    for name in all_fixtures() {
        let loaded = load_model(&fixture(name), &Device::flex()).unwrap();
        burnlens::hf::check_exportable(&loaded.model.config, loaded.hf.family).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    // A setting the family cannot express is refused, naming it.
    let loaded = load_model(&fixture("gpt2"), &Device::flex()).unwrap();
    let mut cfg = loaded.model.config.clone();
    cfg.qkv_bias = false;
    let e = burnlens::hf::check_exportable(&cfg, loaded.hf.family).unwrap_err().to_string();
    assert!(e.contains("cannot export as gpt2") && e.contains("q/k/v biases"), "{e}");
}

/// Training through the newer families' settings: the parameter gradients autodiff gives
/// (burnlens's kernels on flex where they apply) match central finite differences of the
/// loss, for a Gemma-like block (QK-norm, attention and logit soft-caps, norms before and
/// after, scaled embedding, local rotary base, query_pre_attn_scalar), an OLMo-2-like one
/// (post-norms, whole-projection QK-norm) and a GPT-J-like one (interleaved partial rotary,
/// attention and MLP from one norm, unembedding bias).
#[test]
fn parameter_gradients_of_the_new_settings_match_finite_differences() {
    use burnlens::model::{NormPlacement, ParamInit, Positional, QkNorm, Rotary, ScoreScale, next_token_loss};
    let base = TransformerConfig::llama_like(24, 16, 16, 2, 2, 1);
    let rot = base.rotary.unwrap();
    let gemma = TransformerConfig {
        qk_norm: Some(QkNorm::PerHead),
        attn_softcap: Some(1.5),
        final_softcap: Some(2.5),
        norm_placement: NormPlacement::Sandwich,
        scale_embed: true,
        score_scale: ScoreScale::InvSqrtOf(12),
        spans: vec![AttentionSpan::Local(3), AttentionSpan::Global],
        rotary_local: Some(Rotary { base: 100.0, ..rot }),
        untied_unembed: false,
        ..base.clone()
    };
    let olmo = TransformerConfig { qk_norm: Some(QkNorm::Whole), norm_placement: NormPlacement::Post, ..base.clone() };
    let gptj = TransformerConfig {
        positional: Positional::Rotary,
        rotary: Some(Rotary { dims: 4, base: 10000.0, scaling: None, interleaved: true }),
        parallel_residual: true,
        shared_norm: true,
        untied_unembed: true,
        unembed_bias: true,
        qkv_bias: false,
        attn_out_bias: false,
        ..TransformerConfig::gpt2_like(24, 16, 16, 2, 2)
    };
    let ids: Vec<i64> = (0..10).map(|i| (i * 7 + 3) % 24).collect();
    // Deterministic values per parameter, large enough that the caps and norms bite.
    let values = |name: &str, n: usize| -> Vec<f32> {
        let mut s = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let u = ((s >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0;
                if name.contains("norm") || name.contains("ln") { 1.0 + 0.3 * u } else { 0.6 * u }
            })
            .collect()
    };
    let build = |cfg: &TransformerConfig, device: &Device, nudge: Option<(&str, &[f32], f32)>| {
        cfg.build(device, |name, shape, _| {
            let n = shape.iter().product();
            let mut v = values(name, n);
            if let Some((target, dir, eps)) = nudge
                && target == name
            {
                v.iter_mut().zip(dir).for_each(|(x, d)| *x += eps * d);
            }
            Ok::<_, burnlens::model::ModelError>(ParamInit::Data(TensorData::new(v, shape.to_vec())))
        })
        .unwrap()
    };
    let loss = |m: &burnlens::model::Transformer| -> f64 { next_token_loss(m.forward(m.ids_tensor(&ids)), m.ids_tensor(&ids)).into_scalar::<f32>() as f64 };
    let device = Device::flex();
    let ad = device.clone().autodiff();
    let mut worst = 0f64;
    for (arch, cfg) in [("gemma-like", gemma), ("olmo2-like", olmo), ("gptj-like", gptj)] {
        let m = build(&cfg, &ad, None);
        let l = next_token_loss(m.forward(m.ids_tensor(&ids)), m.ids_tensor(&ids));
        let grads = l.backward();
        let b0 = &m.blocks[0];
        let b1 = &m.blocks[1];
        let g1 = |p: &burn::module::Param<Tensor<1>>| p.grad(&grads).unwrap().into_data().try_into_vec_as::<f32>().unwrap();
        let g2 = |p: &burn::module::Param<Tensor<2>>| p.grad(&grads).unwrap().into_data().try_into_vec_as::<f32>().unwrap();
        let mut checks: Vec<(String, Vec<f32>)> = vec![
            ("embed.weight".into(), g2(&m.embed.weight)),
            ("blocks.0.attn.qkv.weight".into(), g2(&b0.attn.qkv.weight)),
            ("blocks.1.attn.out.weight".into(), g2(&b1.attn.out.weight)),
            ("blocks.1.mlp.fc_in.weight".into(), g2(&b1.mlp.as_ref().unwrap().fc_in.weight)),
            ("blocks.0.ln1.weight".into(), g1(&b0.ln1.weight)),
            ("ln_final.weight".into(), g1(&m.ln_final.weight)),
        ];
        if let Some(q) = &b0.attn.q_norm {
            checks.push(("blocks.0.attn.q_norm.weight".into(), g1(&q.weight)));
            checks.push(("blocks.1.attn.k_norm.weight".into(), g1(&b1.attn.k_norm.as_ref().unwrap().weight)));
        }
        if let Some(n) = &b1.ln1_post {
            checks.push(("blocks.1.ln1_post.weight".into(), g1(&n.weight)));
            checks.push(("blocks.0.ln2_post.weight".into(), g1(&b0.ln2_post.as_ref().unwrap().weight)));
        }
        if let Some(u) = &m.unembed {
            checks.push(("unembed.weight".into(), g2(&u.weight)));
            if let Some(b) = &u.bias {
                checks.push(("unembed.bias".into(), g1(b)));
            }
        }
        for (k, (name, grad)) in checks.iter().enumerate() {
            let dir: Vec<f32> = values(&format!("direction {k}"), grad.len()).iter().map(|x| x / 0.6).collect();
            let analytic: f64 = grad.iter().zip(&dir).map(|(g, d)| *g as f64 * *d as f64).sum();
            let eps = 1e-2;
            let up = loss(&build(&cfg, &device, Some((name, &dir, eps))));
            let down = loss(&build(&cfg, &device, Some((name, &dir, -eps))));
            let fd = (up - down) / (2.0 * eps as f64);
            let g_norm = grad.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
            let d_norm = dir.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
            let scale = analytic.abs().max(g_norm * d_norm / (dir.len() as f64).sqrt()).max(1e-5);
            let err = (analytic - fd).abs() / scale;
            println!("{arch:<11} {name:<28} analytic {analytic:+.5e}  finite difference {fd:+.5e}  rel {err:.1e}");
            assert!(g_norm > 0.0, "{arch} {name}: zero gradient");
            assert!(err < 3e-2, "{arch} {name}: analytic {analytic} vs finite difference {fd} (rel {err})");
            worst = worst.max(err);
        }
    }
    println!("worst relative error: {worst:.1e}");
}

/// Starting a forward pass at block `l` from the stream a full pass had there gives the full
/// pass's logits (activation patching runs each patched pass this way).
#[test]
fn a_pass_started_at_a_block_gives_the_full_pass_logits() {
    for name in ["gpt2", "llama_gqa", "gemma2_softcap", "gptj_interleaved"] {
        let model = load_model(&fixture(name), &Device::flex()).unwrap().model;
        let ids = [5i64, 17, 33, 2, 90, 12, 7];
        let mut hooks = Hooks::capture(|n| n.name().ends_with("hook_resid_pre"));
        let full = to_vec(model.forward_hooked(model.ids_tensor(&ids), &mut hooks));
        for l in 0..model.config.n_layers() {
            let start = hooks.cache[&HookPoint::parse(&format!("blocks.{l}.hook_resid_pre")).unwrap()].rank3().unwrap();
            // Hooks as in the full pass (an active hook takes the unfused path).
            let got = to_vec(model.forward_with(Forward::new(model.ids_tensor(&ids)).hooks(&mut Hooks::capture(|_| false)).start(l, start)));
            assert_eq!(got, full, "{name}: from block {l}");
        }
    }
}

/// The one entry point: its builder reaches every shorthand's pass, stopping at the final
/// stream gives what the unembedding reads, and a cache continues from where it stopped.
#[test]
fn forward_with_builds_every_pass() {
    let model = load_model(&fixture("gpt2"), &Device::flex()).unwrap().model;
    let ids = [5i64, 17, 33, 2, 90, 12, 7];
    let full = to_vec(model.forward_with(Forward::new(model.ids_tensor(&ids))));
    assert_eq!(full, to_vec(model.forward(model.ids_tensor(&ids))));
    let stream = model.forward_with(Forward::new(model.ids_tensor(&ids)).stop(Stop::FinalStream));
    assert_eq!(stream.dims(), [1, ids.len(), model.config.d_model]);
    // The final stream is what the unembedding reads: unembedded, it is the logits.
    assert_eq!(to_vec(model.soft_cap_logits(model.unembed(stream))), full);
    // Stopping after a block gives the stream leaving it, and visits no later hook point.
    let mut all = Hooks::capture(|_| true);
    let _ = model.forward_hooked(model.ids_tensor(&ids), &mut all);
    let resid_post = all.take_cache().remove(&HookPoint::parse("blocks.1.hook_resid_post").unwrap()).unwrap().rank3().unwrap();
    let mut seen = Hooks::capture(|_| true);
    let early = model.forward_with(Forward::new(model.ids_tensor(&ids)).hooks(&mut seen).stop(Stop::AfterBlock(1)));
    assert_eq!(to_vec(early), to_vec(resid_post));
    let names: Vec<String> = seen.take_cache().into_keys().map(|p| p.name()).collect();
    assert!(
        names.contains(&"blocks.1.hook_resid_post".to_string()) && !names.iter().any(|n| n.starts_with("blocks.2") || n.starts_with("ln_final")),
        "{names:?}"
    );
    let mut cache = KvCache::new();
    let _ = model.forward_with(Forward::new(model.ids_tensor(&ids[..4])).cache(&mut cache));
    let rest = to_vec(model.forward_with(Forward::new(model.ids_tensor(&ids[4..])).cache(&mut cache)));
    assert_eq!(cache.len(), ids.len());
    let tail = &full[4 * model.config.vocab_size..];
    let worst = rest.iter().zip(tail).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(worst < 1e-4, "cached continuation differs by {worst}");
}

#[test]
#[should_panic(expected = "padding with a KV cache is not supported")]
fn forward_with_refuses_padding_with_a_cache() {
    use burnlens::model::Forward;
    let model = load_model(&fixture("gpt2"), &Device::flex()).unwrap().model;
    let mask = vec![vec![true, true]];
    let mut cache = KvCache::new();
    let _ = model.forward_with(Forward::new(model.ids_tensor(&[1, 2])).padding(&mask).cache(&mut cache));
}

/// A pass that reads only the residual stream (the activation store's, `fusing_unhooked`)
/// keeps the fused attention and norms in every layer: its logits are the unhooked pass's,
/// bit for bit, where the same hooks without it write every layer out (other arithmetic:
/// close, not equal). A layer whose attention is hooked still writes it out.
#[test]
fn a_pass_reading_only_the_stream_keeps_the_fused_parts() {
    use burnlens::model::{AttnHook, BlockHook};
    for name in ["gpt2", "llama_gqa", "mistral_window"] {
        let model = load_model(&fixture(name), &Device::flex()).unwrap().model;
        let ids = [5i64, 17, 33, 2, 90, 12, 7, 64, 3];
        let last = model.config.n_layers() - 1;
        let stream = HookPoint::Block(last, BlockHook::ResidPost);
        let plain = to_vec(model.forward(model.ids_tensor(&ids)));
        let mut lean = Hooks::capture(|p| p == stream).fusing_unhooked();
        assert_eq!(to_vec(model.forward_hooked(model.ids_tensor(&ids), &mut lean)), plain, "{name}: a lean pass left the fused parts");
        assert!(lean.cache.contains_key(&stream), "{name}: the lean pass captured nothing");
        let written = to_vec(model.forward_hooked(model.ids_tensor(&ids), &mut Hooks::capture(|p| p == stream)));
        let d = max_abs_diff(&written, &plain);
        assert!(d <= 1e-4 && written != plain, "{name}: written-out attention differs by {d:e} (expected close, not equal)");
        // Layer 0's pattern hooked: written out there, every row a distribution.
        let pattern = HookPoint::Attn(0, AttnHook::Pattern);
        let mut one = Hooks::capture(|p| p == pattern).fusing_unhooked();
        let got = to_vec(model.forward_hooked(model.ids_tensor(&ids), &mut one));
        assert!(max_abs_diff(&got, &plain) <= 1e-4, "{name}: one layer written out");
        let p = one.cache[&pattern].rank4().unwrap();
        assert_eq!(p.dims()[2..], [ids.len(), ids.len()], "{name}");
        let rows = p.to_data().try_into_vec_as::<f32>().unwrap();
        assert!(rows.chunks(ids.len()).all(|r| (r.iter().sum::<f32>() - 1.0).abs() < 1e-5), "{name}: pattern rows");
    }
}
