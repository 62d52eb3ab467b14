//! SAE evaluation against sae-lens's own `run_evals` (every metric on, BOS excluded;
//! `tests/fixtures/sae_eval/`, written by `scripts/gen_sae_eval_fixtures.py` on the SAE
//! fixtures and their models run by TransformerLens): every metric and every per-feature
//! value within 1e-4 relative.

mod common;

use burn::tensor::Device;
use burnlens::features::{EvalInput, evaluate};
use burnlens::hf::load_model;
use burnlens::lens::sae::Sae;
use common::fixture;
use serde_json::Value;

fn close(got: f64, want: f64, what: &str) {
    assert!((got - want).abs() <= 1e-4 * want.abs().max(1e-3), "{what}: {got} vs sae-lens {want}");
}

#[test]
fn metrics_equal_saelens_run_evals() {
    metrics_equal_saelens_on(&Device::flex());
}

/// On a GPU backend (the feature activations reduced on the device): the same metrics. wgpu
/// runs on Mesa's lavapipe where there is no GPU; neither feature is built in CI.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
#[test]
fn on_a_gpu_backend_the_metrics_still_equal_saelens() {
    for name in ["wgpu", "cuda"].into_iter().filter(|n| burnlens::model::backend::is_compiled(n)) {
        metrics_equal_saelens_on(&burnlens::model::backend::device(name, None).unwrap_or_else(|e| panic!("{name}: {e}")));
    }
}

fn metrics_equal_saelens_on(device: &Device) {
    let device = device.clone();
    for case in ["standard_gpt2_resid", "layernorm_gpt2_hook_z", "jumprelu_llama_resid"] {
        let dir = fixture("sae_eval").join(case);
        let tokens: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("tokens.json")).unwrap()).unwrap();
        let want: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("metrics.json")).unwrap()).unwrap();
        let model = load_model(&fixture(tokens["model"].as_str().unwrap()), &device).unwrap().model;
        let sae = Sae::load(&fixture("sae").join(case), &device).unwrap();
        let batches: Vec<Vec<Vec<u32>>> = serde_json::from_value(tokens["batches"].clone()).unwrap();
        let bos = tokens["bos"].as_u64().unwrap() as u32;
        let (metrics, features) = evaluate(&EvalInput { model: &model, sae: &sae, batches: &batches, ignore_tokens: &[bos] }).unwrap();
        let got = serde_json::to_value(&metrics).unwrap();
        let mut n = 0;
        for (group, values) in want["metrics"].as_object().unwrap() {
            for (name, v) in values.as_object().unwrap() {
                let g = got[group][name].as_f64().unwrap_or_else(|| panic!("{case}: no {group}.{name} in {got}"));
                close(g, v.as_f64().unwrap(), &format!("{case} {group}.{name}"));
                n += 1;
            }
        }
        assert_eq!(n, 19, "{case}: every metric of run_evals compared");
        let got = serde_json::to_value(&features).unwrap();
        for (name, v) in want["feature_metrics"].as_object().unwrap() {
            let (g, w) = (got[name].as_array().unwrap(), v.as_array().unwrap());
            assert_eq!(g.len(), w.len(), "{case} {name}");
            for (i, (a, b)) in g.iter().zip(w).enumerate() {
                close(a.as_f64().unwrap(), b.as_f64().unwrap(), &format!("{case} {name}[{i}]"));
            }
        }
    }
}
