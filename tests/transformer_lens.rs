//! The attribution tools against TransformerLens itself: gradients at hook points,
//! attribution and activation patching, direct logit attribution and the logit lens on the
//! gpt2, pythia_like (GPT-NeoX: partial rotary, parallel residual) and llama_gqa (RMSNorm,
//! gated MLP, grouped-query attention, Llama 3 rope scaling) parity fixtures, as
//! `scripts/gen_tl_fixtures.py` recorded them with unprocessed `HookedTransformer`s built
//! from the same `transformers` weights.

mod common;

use burn::tensor::Device;
use burnlens::hf::load_model;
use burnlens::lens::patching::{NodeKind, nodes};
use burnlens::lens::residual::apply_final_norm;
use burnlens::lens::{
    Metric, activation_patching, attribution_patching, decompose_resid, direct_logit_attribution, hook_gradients, logit_lens, residual_components,
};
use burnlens::model::{HookPoint, Transformer};
use common::*;

struct Tl {
    st: std::collections::HashMap<String, Stored>,
    meta: serde_json::Value,
}

/// The fixtures TransformerLens was run on.
const MODELS: &[&str] = &["gpt2", "pythia_like", "llama_gqa"];

/// TransformerLens's record for fixture `name`, and the model burnlens loads from it.
fn load(name: &str) -> (Tl, Transformer) {
    let dir = fixture("tl");
    let t = Tl {
        st: read_safetensors(&dir.join(format!("{name}.safetensors"))),
        meta: serde_json::from_str(&std::fs::read_to_string(dir.join(format!("{name}.json"))).unwrap()).unwrap(),
    };
    (t, load_model(&fixture(name), &Device::flex()).unwrap().model)
}

/// `max |a − b| / max(|b|, floor)`.
fn rel(a: &[f32], b: &[f32], floor: f32) -> f32 {
    max_abs_diff(a, b) / max_abs(b).max(floor)
}

fn f32s(v: &[f64]) -> Vec<f32> {
    v.iter().map(|&x| x as f32).collect()
}

fn metric(t: &Tl) -> Metric {
    Metric::LogitDiff { pos: None, right: t.meta["right"].as_i64().unwrap(), wrong: t.meta["wrong"].as_i64().unwrap() }
}

#[test]
fn gradients_at_hook_points_match_transformer_lens_backward_hooks() {
    for name in MODELS {
        let (t, m) = load(name);
        let ids = &t.st["ids"].i64;
        let names: Vec<String> = t.meta["grad_hooks"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect();
        let g = hook_gradients(&m, ids, &|n| names.iter().any(|x| n == *x), &metric(&t)).unwrap();
        assert!((g.metric as f32 - t.st["metric"].f32[0]).abs() < 1e-4);
        for n in &names {
            let want = &t.st[&format!("grad.{n}")];
            assert_eq!(g.gradients[&HookPoint::parse(n).unwrap()].dims(), want.shape, "{n}");
            let r = rel(&g.gradients[&HookPoint::parse(n).unwrap()].to_vec(), &want.f32, 1e-6);
            eprintln!("{name} grad {n}: rel {r:.2e}");
            assert!(r < 1e-4, "{name} {n}: {r}");
        }
    }
}

#[test]
fn attribution_and_activation_patching_match_transformer_lens() {
    for name in MODELS {
        let (t, m) = load(name);
        let (clean, corrupted) = (&t.st["ids"].i64, &t.st["corrupted_ids"].i64);
        let metric = metric(&t);
        for (kind, attr_key, patch_key) in
            [(NodeKind::Head, "attr_head", "patch_head"), (NodeKind::ResidPre, "attr_resid", "patch_resid"), (NodeKind::Mlp, "attr_mlp", "patch_mlp")]
        {
            let ns = nodes(&m, clean.len(), &[kind]);
            let (_, attr) = attribution_patching(&m, clean, corrupted, &metric, &ns).unwrap();
            let (_, patched) = activation_patching(&m, clean, corrupted, &metric, &ns).unwrap();
            // Nodes come layer by layer, heads or positions within: TransformerLens's [L, N] row-major.
            let (ra, rp) = (rel(&f32s(&attr), &t.st[attr_key].f32, 1e-3), rel(&f32s(&patched), &t.st[patch_key].f32, 1e-3));
            eprintln!("{name} {kind:?}: attribution rel {ra:.2e}, activation patching rel {rp:.2e}");
            assert!(ra < 1e-4 && rp < 1e-4, "{name} {kind:?}: {ra} {rp}");
        }
    }
}

#[test]
fn direct_logit_attribution_and_the_logit_lens_match_transformer_lens() {
    for name in MODELS {
        let (t, m) = load(name);
        let ids = &t.st["ids"].i64;
        let (right, wrong) = (t.meta["right"].as_i64().unwrap(), t.meta["wrong"].as_i64().unwrap());
        let last = ids.len() - 1;
        // Per head (stack_head_results, apply_ln=True).
        let dla = direct_logit_attribution(&m, ids, right, Some(wrong));
        let heads: Vec<f32> =
            dla.labels.iter().zip(&dla.contributions).filter(|(l, _)| l.contains('H') && !l.contains('_')).map(|(_, c)| c[last] as f32).collect();
        let r = rel(&heads, &t.st["dla_heads"].f32, 1e-3);
        eprintln!("{name} direct logit attribution per head: rel {r:.2e}");
        assert!(r < 1e-4, "{r}");
        // decompose_resid, apply_ln=True.
        let comps = decompose_resid(&m, ids, None);
        let labels: Vec<String> =
            t.meta["decompose_labels"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().replace(|c: char| c.is_ascii_digit(), "")).collect();
        assert_eq!(comps.labels.len(), labels.len());
        let (_, scale) = residual_components(&m, ids);
        let normed = apply_final_norm(&m, comps.stack, scale);
        let (w_u, _) = m.w_u();
        let d = m.config.d_model;
        let dir = w_u.clone().narrow(1, right as usize, 1) - w_u.narrow(1, wrong as usize, 1);
        let [n, tt, _] = normed.dims();
        let along: Vec<f32> = normed.reshape([n * tt, d]).matmul(dir).into_data().try_into_vec_as::<f32>().unwrap();
        let at_last: Vec<f32> = (0..n).map(|i| along[i * tt + last]).collect();
        let r = rel(&at_last, &t.st["dla_decompose"].f32, 1e-3);
        eprintln!("{name} decompose_resid along the logit difference: rel {r:.2e}");
        assert!(r < 1e-4, "{r}");
        // The logit lens (accumulated_resid, final norm recomputed per layer).
        let lens = logit_lens(&m, ids, 1, None);
        let want = &t.st["lens_logprobs"];
        let (layers, v) = (want.shape[0], want.shape[2]);
        assert_eq!(lens.layers.len(), layers);
        let mut worst: f64 = 0.0;
        for li in 0..layers {
            for p in 0..ids.len() - 1 {
                let row = &want.f32[(li * ids.len() + p) * v..(li * ids.len() + p + 1) * v];
                let w = row[ids[p + 1] as usize] as f64;
                worst = worst.max((lens.target_logprob[li][p].unwrap() - w).abs());
                let arg = (0..v).max_by(|&a, &b| row[a].total_cmp(&row[b])).unwrap();
                assert_eq!(lens.top[li][p][0].0, arg as i64, "layer {li} pos {p}: top token");
            }
        }
        eprintln!("{name} logit lens: max |Δ log p| {worst:.2e}");
        assert!(worst < 1e-4, "{name}: {worst}");
    }
}

/// Every norm's `hook_scale` and `hook_normalized` as TransformerLens fills them: a
/// LayerNorm's after its gain and bias, an RMSNorm's before its gain.
#[test]
fn norm_hooks_match_transformer_lens() {
    for name in MODELS {
        let (t, m) = load(name);
        let hooks: Vec<String> = t.meta["norm_hooks"]
            .as_array()
            .expect("norm_hooks recorded by scripts/gen_tl_fixtures.py")
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect();
        assert!(hooks.iter().any(|h| h == "ln_final.hook_normalized"), "{name}: {hooks:?}");
        let cache = burnlens::lens::run_with_cache(&m, &t.st["ids"].i64, |n| hooks.iter().any(|h| n == *h));
        for h in &hooks {
            let want = &t.st[&format!("cache.{h}")];
            let got = cache.get(h).unwrap_or_else(|| panic!("{name}: burnlens has no hook point {h}"));
            assert_eq!(got.dims(), want.shape, "{name} {h}");
            let r = rel(&got.to_vec(), &want.f32, 1e-6);
            eprintln!("{name} {h}: rel {r:.2e}");
            assert!(r < 1e-5, "{name} {h}: relative difference {r:e} from TransformerLens");
        }
    }
}

/// The newer families against TransformerLens (`scripts/gen_tl_family_fixtures.py`, built
/// with TransformerLens's own weight conversions): every hook point both define holds the
/// same values — the QK-norm hooks (TransformerLens keeps them as `[batch * pos * heads,
/// d_head]` rows, burnlens as `[batch, pos, heads, d_head]`, the same values in the same
/// order), Gemma 2's norms after attention and the MLP, GPT-J's rotary queries and keys.
/// The only TransformerLens points burnlens lacks are named here: `unembed.hook_in/out`,
/// and GPT-J's `ln2` (a copy of `ln1` in TransformerLens; burnlens has the one norm).
#[test]
fn newer_families_cache_what_transformer_lens_caches() {
    for name in ["qwen3_qknorm", "gptj_interleaved", "gemma2_softcap"] {
        let st = read_safetensors(&fixture("tl").join(format!("{name}.safetensors")));
        let model = load_model(&fixture(name), &Device::flex()).unwrap().model;
        let ours = burnlens::model::hook_names(&model.config);
        let ids = &st["ids"].i64;
        let cache = burnlens::lens::run_with_cache(&model, ids, |_| true);
        let mut compared = 0;
        let mut worst = 0f32;
        for (key, want) in &st {
            let Some(hook) = key.strip_prefix("cache.") else { continue };
            if !ours.iter().any(|n| n == hook) {
                let tl_only = hook.starts_with("unembed.") || (name == "gptj_interleaved" && hook.contains(".ln2."));
                assert!(tl_only, "{name}: TransformerLens has `{hook}`, burnlens does not");
                continue;
            }
            let got = cache.get(hook).unwrap().to_vec();
            assert_eq!(got.len(), want.f32.len(), "{name} {hook}: {:?} vs {:?}", cache.get(hook).unwrap().dims(), want.shape);
            let r = rel(&got, &want.f32, 1e-6);
            worst = worst.max(r);
            assert!(r < 1e-4, "{name} {hook}: relative difference {r:e} from TransformerLens");
            compared += 1;
        }
        let logits = model.forward(model.ids_tensor(ids)).into_data().try_into_vec_as::<f32>().unwrap();
        assert!(rel(&logits, &st["logits"].f32, 1e-6) < 1e-5, "{name}: logits");
        println!("{name}: {compared} hook points equal TransformerLens's (worst relative difference {worst:.1e})");
        assert!(compared >= 40, "{name}: only {compared} hook points compared");
    }
}
