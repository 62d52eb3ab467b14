//! Sparse autoencoders in SAELens's layout: parity with the `sae-lens` package (fixtures made
//! by scripts/gen_sae_fixtures.py), run on the model fixtures' hook points, spliced into the
//! forward pass, saved and loaded back, and bad directories refused by name.

mod common;

use burn::tensor::{Device, Tensor, TensorData};
use burnlens::hf::load_model;
use burnlens::lens::Rule;
use burnlens::lens::sae::{Normalize, Sae, features, run_sae};
use common::*;

const SAE_FIXTURES: &[&str] = &[
    "standard_gpt2_resid",
    "jumprelu_llama_resid",
    "topk_pythia_resid",
    "layernorm_gpt2_hook_z",
    "constnorm_qwen2_mlp_out",
    "legacy_topk_gpt_neo_resid",
    "burnlens_topk_trained_gpt2_char",
    "burnlens_batchtopk_trained_gpt2_char",
    GEMMA_SCOPE,
];
/// A Gemma Scope SAE in its release layout (params.npz, no cfg.json; scripts/gen_gemma_scope_fixture.py).
const GEMMA_SCOPE: &str = "gemma_scope/gemma-scope-2b-pt-res/layer_1/width_96/average_l0_5";

fn sae_dir(name: &str) -> std::path::PathBuf {
    fixture("sae").join(name)
}

fn model_of(name: &str) -> String {
    let meta: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(sae_dir(name).join("meta.json")).unwrap()).unwrap();
    meta["model"].as_str().unwrap().to_string()
}

fn host(t: Tensor<2>) -> Vec<f32> {
    t.into_data().try_into_vec_as::<f32>().unwrap()
}

/// On every test backend (flex; also wgpu in a `--features wgpu` build, where a TopK SAE
/// decodes through the sparse kernel).
#[test]
fn feature_activations_and_reconstructions_match_sae_lens() {
    assert!(!backends().is_empty(), "no test backend runs here");
    for ((backend, device), fixture) in backends().into_iter().flat_map(|b| SAE_FIXTURES.iter().map(move |n| (b.clone(), *n))) {
        let name = &format!("{fixture} on {backend}");
        let sae = Sae::load(&sae_dir(fixture), &device).unwrap();
        let e = read_safetensors(&sae_dir(fixture).join("expected.safetensors"));
        let x = &e["sae_in"];
        let input = Tensor::<2>::from_data(TensorData::new(x.f32.clone(), [x.shape[0], x.shape[1]]), &device);
        let (f, r) = sae.forward(input);
        let (f, r) = (host(f), host(r));
        let want_f = &e["feature_acts"].f32;
        let want_r = &e["sae_out"].f32;
        let df = max_abs_diff(&f, want_f) / max_abs(want_f).max(1.0);
        let dr = max_abs_diff(&r, want_r) / max_abs(want_r).max(1.0);
        eprintln!("{name}: {:?} features rel {df:.2e}, reconstruction rel {dr:.2e}", sae.cfg.architecture);
        assert!(df <= 1e-5, "{name}: feature activations differ from sae-lens by {df}");
        assert!(dr <= 1e-5, "{name}: reconstructions differ from sae-lens by {dr}");
        // Exactly the same features are active.
        let active = |v: &[f32]| v.iter().map(|&a| a > 0.0).collect::<Vec<_>>();
        assert_eq!(active(&f), active(want_f), "{name}: the set of active features");
    }
}

#[test]
fn configs_old_and_new_are_read_as_sae_lens_reads_them() {
    let device = Device::flex();
    let cfg = |n: &str| Sae::load(&sae_dir(n), &device).unwrap().cfg;
    assert_eq!(cfg("topk_pythia_resid").architecture, Rule::top_k(6, true));
    assert_eq!(cfg("jumprelu_llama_resid").architecture, Rule::JUMP_RELU);
    let old = cfg("legacy_topk_gpt_neo_resid");
    assert_eq!(old.architecture, Rule::top_k(5, false));
    assert_eq!(old.hook_name, "blocks.1.hook_resid_pre");
    assert_eq!(old.normalize_activations, Normalize::None);
    let z = cfg("layernorm_gpt2_hook_z");
    assert!(z.reshape_hook_z && !z.apply_b_dec_to_input);
    assert_eq!(z.normalize_activations, Normalize::LayerNorm);
    assert_eq!(cfg("standard_gpt2_resid").hook_name, "blocks.1.hook_resid_pre");
}

#[test]
fn saes_run_on_the_models_own_activations() {
    let device = Device::flex();
    for name in SAE_FIXTURES {
        let sae = Sae::load(&sae_dir(name), &device).unwrap();
        let model = load_model(&fixture(&model_of(name)), &device).unwrap().model;
        let e = read_safetensors(&sae_dir(name).join("expected.safetensors"));
        let ids = &e["ids"].i64;
        let f = host(features(&model, &sae, ids).unwrap());
        let want = &e["feature_acts"].f32;
        let d = max_abs_diff(&f, want) / max_abs(want).max(1.0);
        eprintln!("{name} on {}: features from burnlens's activations rel {d:.2e}", model_of(name));
        assert!(d <= 1e-4, "{name}: {d}");
        let run = run_sae(&model, &sae, ids, 5).unwrap();
        let want_l0: Vec<usize> = want.chunks(sae.cfg.d_sae).map(|r| r.iter().filter(|&&a| a > 0.0).count()).collect();
        assert_eq!(run.l0, want_l0, "{name}: L0 per position");
        if let Rule::TopK { k, .. } = sae.cfg.architecture {
            assert!(run.l0.iter().all(|&l| l <= k));
        }
        // Explained variance from the sae-lens reconstruction of the same inputs.
        let (x, r) = (&e["sae_in"].f32, &e["sae_out"].f32);
        let d_in = sae.cfg.d_in;
        let n = x.len() / d_in;
        let mean: Vec<f64> = (0..d_in).map(|j| (0..n).map(|i| x[i * d_in + j] as f64).sum::<f64>() / n as f64).collect();
        let err: f64 = x.iter().zip(r).map(|(a, b)| (*a as f64 - *b as f64).powi(2)).sum();
        let tot: f64 = x.iter().enumerate().map(|(i, a)| (*a as f64 - mean[i % d_in]).powi(2)).sum();
        assert!((run.explained_variance - (1.0 - err / tot)).abs() < 1e-3, "{name}: explained variance {} vs {}", run.explained_variance, 1.0 - err / tot);
        // Splicing the reconstruction in changes the loss; the top features are the largest.
        let (clean, with) = (run.loss_clean.unwrap(), run.loss_with_sae.unwrap());
        assert!(clean.is_finite() && with.is_finite() && (clean - with).abs() > 1e-6, "{name}: {clean} {with}");
        // The strongest feature is the one with the largest activation anywhere.
        let best = (0..want.len()).max_by(|&a, &b| want[a].total_cmp(&want[b])).unwrap();
        let (f, acts) = run.strongest_feature.clone().unwrap();
        assert_eq!(f, best % sae.cfg.d_sae, "{name}: strongest feature");
        assert!((acts[best / sae.cfg.d_sae] - want[best] as f64).abs() < 1e-3 * (want[best] as f64).max(1.0));
        // The per-position loss increases average to the change of the mean loss.
        let inc: Vec<f64> = run.loss_increase.iter().flatten().copied().collect();
        assert_eq!(inc.len(), ids.len() - 1);
        let mean = inc.iter().sum::<f64>() / inc.len() as f64;
        assert!((mean - (with - clean)).abs() < 1e-4 * (with - clean).abs().max(1.0), "{name}: {mean} vs {}", with - clean);
        for (p, top) in run.top_features.iter().enumerate() {
            let row = &want[p * sae.cfg.d_sae..(p + 1) * sae.cfg.d_sae];
            if let Some(&(i, a)) = top.first() {
                assert!((a - row.iter().cloned().fold(0.0, f32::max) as f64).abs() < 1e-3 * a.abs().max(1.0), "{name} pos {p}: top feature {i}");
            }
        }
    }
}

#[test]
fn a_saved_sae_loads_back_identically_and_keeps_its_hook() {
    let device = Device::flex();
    let tmp = tempfile::tempdir().unwrap();
    for name in ["jumprelu_llama_resid", "legacy_topk_gpt_neo_resid", "layernorm_gpt2_hook_z"] {
        let sae = Sae::load(&sae_dir(name), &device).unwrap();
        let out = tmp.path().join(name);
        sae.save(&out).unwrap();
        let back = Sae::load(&out, &device).unwrap();
        assert_eq!(format!("{:?}", back.cfg), format!("{:?}", sae.cfg), "{name}");
        let cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out.join("cfg.json")).unwrap()).unwrap();
        assert_eq!(cfg["metadata"]["hook_name"], sae.cfg.hook_name.as_str());
        let e = read_safetensors(&sae_dir(name).join("expected.safetensors"));
        let x = &e["sae_in"];
        let input = Tensor::<2>::from_data(TensorData::new(x.f32.clone(), [x.shape[0], x.shape[1]]), &device);
        assert_eq!(host(sae.encode(input.clone())), host(back.encode(input)));
    }
}

#[test]
fn bad_sae_directories_are_refused_by_name() {
    let device = Device::flex();
    let tmp = tempfile::tempdir().unwrap();
    let copy = |name: &str| {
        let d = tmp.path().join(name);
        std::fs::create_dir_all(&d).unwrap();
        for f in ["cfg.json", "sae_weights.safetensors"] {
            std::fs::copy(sae_dir("jumprelu_llama_resid").join(f), d.join(f)).unwrap();
        }
        d
    };
    let msg = |d: &std::path::Path| Sae::load(d, &device).unwrap_err().to_string();

    let d = tmp.path().join("empty");
    std::fs::create_dir_all(&d).unwrap();
    assert!(msg(&d).contains("cfg.json"), "{}", msg(&d));

    let d = copy("no_threshold");
    let mut cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(d.join("cfg.json")).unwrap()).unwrap();
    cfg["d_sae"] = 95.into();
    std::fs::write(d.join("cfg.json"), cfg.to_string()).unwrap();
    let m = msg(&d);
    assert!(m.contains("sae_weights.safetensors") && m.contains("W_enc") && m.contains("95"), "{m}");

    let d = copy("no_hook");
    let mut cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(d.join("cfg.json")).unwrap()).unwrap();
    cfg["metadata"].as_object_mut().unwrap().remove("hook_name");
    std::fs::write(d.join("cfg.json"), cfg.to_string()).unwrap();
    assert!(msg(&d).contains("hook_name"), "{}", msg(&d));

    let d = copy("bad_arch");
    let mut cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(d.join("cfg.json")).unwrap()).unwrap();
    cfg["architecture"] = "gated".into();
    std::fs::write(d.join("cfg.json"), cfg.to_string()).unwrap();
    assert!(msg(&d).contains("architecture") && msg(&d).contains("gated"), "{}", msg(&d));

    // Gemma Scope's layout without a release name or layer in its path, and with a
    // truncated params.npz.
    let params = std::fs::read(sae_dir(GEMMA_SCOPE).join("params.npz")).unwrap();
    let d = tmp.path().join("saes/layer_1");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("params.npz"), &params).unwrap();
    assert!(msg(&d).contains("cannot tell the hook point") && msg(&d).contains("-res, -mlp or -att"), "{}", msg(&d));
    let d = tmp.path().join("gemma-scope-2b-pt-mlp/layer_1/width_96");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("params.npz"), &params[..params.len() / 2]).unwrap();
    assert!(msg(&d).contains("params.npz"), "{}", msg(&d));
    std::fs::write(d.join("params.npz"), &params).unwrap();
    assert_eq!(Sae::load(&d, &device).unwrap().cfg.hook_name, "blocks.1.hook_mlp_out");

    // An SAE for a wider model than the one it is run on.
    let sae = Sae::load(&sae_dir("jumprelu_llama_resid"), &device).unwrap();
    let gpt2 = load_model(&fixture("gpt2"), &device).unwrap().model;
    let err = features(&gpt2, &sae, &[1, 2, 3]).unwrap_err().to_string();
    assert!(err.contains("d_in is 64") && err.contains("width 32"), "{err}");
}

#[test]
fn saes_trained_on_streamed_activations_reconstruct_them_and_save_in_saelens_layout() {
    use burnlens::data::Synthetic;
    use burnlens::features::{Architecture as Train, LrSchedule, LrScheduler, SaeRunConfig, Site, Source, StoreConfig, TopKSettings, TrainerConfig, train};
    let device = Device::flex();
    let model = load_model(&fixture("trained_gpt2_char"), &device).unwrap().model;
    let tmp = tempfile::tempdir().unwrap();
    let mut topk = TopKSettings::new(8.0);
    topk.rescale_acts_by_decoder_norm = false;
    for architecture in [Train::Standard { l1_coefficient: 0.3, l1_warm_up_steps: 0 }, Train::TopK(topk)] {
        let cfg = SaeRunConfig {
            cross_layer: false,
            sites: vec![Site::sae("blocks.1.hook_resid_pre")],
            skip: false,
            d_sae: 128,
            architecture,
            trainer: TrainerConfig {
                lr: LrSchedule { lr: 3e-3, lr_end: 3e-4, scheduler: LrScheduler::Constant, warm_up_steps: 0, decay_steps: 60, total_steps: 300 },
                adam_beta1: 0.9,
                adam_beta2: 0.999,
                dead_feature_window: 1000,
            },
            store: StoreConfig { context_size: 24, store_batch_size_prompts: 8, n_batches_in_buffer: 4, train_batch_size_tokens: 8 * 24, mix_fraction: 0.5 },
            steps: 300,
            seed: 1,
            checkpoint_every: 1000,
            log_every: 15,
        };
        let dir = tmp.path().join(architecture.name());
        let windows = Box::new(burnlens::data::Counted::new(Synthetic::Random.windows(model.config.vocab_size, 24, 1).map(Ok)));
        let mut losses = Vec::new();
        let summary = train(burnlens::features::Run::alone(&dir, &cfg), Source::Model { model: &model, windows, model_name: None }, &mut |r, _| {
            losses.push(r[0].loss);
            std::ops::ControlFlow::Continue(())
        })
        .unwrap();
        let (first, last) = (losses[..10].iter().sum::<f64>() / 10.0, losses[290..].iter().sum::<f64>() / 10.0);
        assert!(last < 0.7 * first, "{architecture:?}: the loss falls ({first} -> {last})");
        assert_eq!(summary.tokens, 300 * 8 * 24);
        let sae = Sae::load(&summary.outputs[0], &device).unwrap();
        let ids: Vec<i64> = (0..24).map(|i| (i * 7 % 65) as i64).collect();
        let run = run_sae(&model, &sae, &ids, 3).unwrap();
        eprintln!("{architecture:?}: loss {first:.3} -> {last:.3}, explained variance {:.3}, L0 {:.1}", run.explained_variance, run.mean_l0);
        assert!(run.explained_variance > 0.7, "{architecture:?}: explained variance {}", run.explained_variance);
        match architecture {
            Train::TopK(t) => assert!(run.mean_l0 <= t.k + 1e-9),
            _ => assert!(run.mean_l0 < 64.0, "sparse: L0 {}", run.mean_l0),
        }
        assert!(run.loss_recovered.unwrap() > 0.5, "{architecture:?}: splicing the SAE keeps most of the loss: {:?}", run.loss_recovered);
    }
}
