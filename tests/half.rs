//! Half-precision weights kept as stored: a bf16 copy of every family's parity fixture
//! (`scripts/gen_half_fixtures.py`, made by `transformers`) loaded with `--dtype auto` keeps
//! bf16 weight matrices, equals the same checkpoint widened to f32 on logits and every hook
//! point, equals `transformers` run in f32 on it, and decodes the same tokens. Bad files are
//! refused at load, and the lens tools and the CLI work on half weights.

mod common;

use std::collections::BTreeMap;

use burn::tensor::{DType, Device};
use burnlens::hf::{LoadOptions, LoadedModel, WeightDtype, load_model_with};
use burnlens::model::{Hooks, MASKED_SCORE, Sampling, Transformer, generate};
use common::*;

fn load(dir: &std::path::Path, dtype: WeightDtype, device: &Device) -> LoadedModel {
    load_model_with(dir, device, &LoadOptions::dtype(dtype)).unwrap_or_else(|e| panic!("{} as {dtype}: {e}", dir.display()))
}

/// Every hook point's values (and the logits, as `logits`).
fn capture_all(model: &Transformer, ids: &[i64]) -> BTreeMap<String, Vec<f32>> {
    let mut hooks = Hooks::capture(|_| true);
    let logits = model.forward_hooked(model.ids_tensor(ids), &mut hooks);
    let mut out: BTreeMap<String, Vec<f32>> = hooks.cache.iter().map(|(k, v)| (k.name(), v.to_vec())).collect();
    out.insert("logits".into(), logits.into_data().try_into_vec_as::<f32>().unwrap());
    out
}

/// `max |a - b| / max(1, max |b|)` over entries that are not masked scores.
fn rel_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let real = |x: &f32| *x != MASKED_SCORE && x.is_finite();
    let scale = b.iter().filter(|x| real(x)).map(|x| x.abs()).fold(1.0f32, f32::max);
    a.iter().zip(b).filter(|(_, y)| real(y)).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max) / scale
}

#[test]
fn every_family_in_bf16_equals_its_f32_widening_and_transformers() {
    let fixtures = half_fixtures();
    assert!(fixtures.len() >= 12, "expected a bf16 copy of every family's fixture, found {}", fixtures.len());
    let device = Device::flex();
    for (name, dir) in fixtures {
        let expected = read_safetensors(&dir.join("expected.safetensors"));
        let ids = &expected["ids"].i64;
        let half = load(&dir, WeightDtype::Auto, &device);
        let wide = load(&dir, WeightDtype::F32, &device);
        assert_eq!(half.info.dtypes, ["bf16"], "{name}: the copy is stored in bf16");
        assert_eq!(half.info.weight_dtype, "bf16", "{name}: auto keeps bf16 weights");
        assert_eq!(half.model.weight_dtype(), DType::BF16, "{name}");
        assert_eq!((wide.info.weight_dtype.as_str(), wide.model.weight_dtype()), ("f32", DType::F32), "{name}");

        // Logits and every hook point: half weights against the same weights widened.
        let (h, w) = (capture_all(&half.model, ids), capture_all(&wide.model, ids));
        assert_eq!(h.keys().collect::<Vec<_>>(), w.keys().collect::<Vec<_>>(), "{name}: the same hook points");
        assert!(h.len() > 20, "{name}: only {} hook points captured", h.len());
        let mut worst = (0.0f32, String::new());
        for (k, v) in &w {
            let d = rel_diff(&h[k], v);
            if d > worst.0 {
                worst = (d, k.clone());
            }
        }
        println!("{name:<18} bf16 vs f32: worst relative difference {:.2e} at {}", worst.0, worst.1);
        assert!(worst.0 <= 1e-5, "{name}: bf16 weights differ from their f32 widening by {:.2e} (relative) at {}", worst.0, worst.1);

        // Both against transformers in f32 on the bf16 checkpoint; the fused path too.
        let fast: Vec<f32> = half.model.forward(half.model.ids_tensor(ids)).into_data().try_into_vec_as::<f32>().unwrap();
        for (what, logits) in [("hooked", &h["logits"]), ("fused", &fast), ("f32", &w["logits"])] {
            let d = max_abs_diff(logits, &expected["logits"].f32);
            assert!(d <= 1e-4, "{name} ({what}): max |Δlogit| {d:e} against transformers");
        }
        let layers = half.model.config.n_layers();
        for l in 0..layers {
            let d = max_abs_diff(&h[&format!("blocks.{l}.attn.hook_pattern")], &expected[&format!("pattern.{l}")].f32);
            assert!(d <= 1e-5, "{name}: layer {l} pattern differs from transformers by {d:e}");
        }

        // Greedy decoding with the KV cache: the same tokens as transformers' full forward.
        let want = &expected["greedy"].i64;
        let s = Sampling { max_new_tokens: want.len(), ..Sampling::default() };
        assert_eq!(&generate(&half.model, &ids[..8], &s).unwrap(), want, "{name}: bf16 greedy decoding");
        assert_eq!(&generate(&wide.model, &ids[..8], &s).unwrap(), want, "{name}: f32 greedy decoding");
    }
}

#[test]
fn f16_and_bf16_conversions_on_load_follow_the_values() {
    // An f32 checkpoint asked for in half: rounded once to nearest, then computed in f32,
    // against the same model loaded in f32 (a bf16 rounding moves logits a little, not much).
    let dir = fixture("llama_gqa");
    let device = Device::flex();
    let f32m = load(&dir, WeightDtype::Auto, &device);
    assert_eq!(f32m.model.weight_dtype(), DType::F32, "auto keeps an f32 checkpoint f32");
    let ids = &read_safetensors(&dir.join("expected.safetensors"))["ids"].i64;
    let base = f32m.model.forward(f32m.model.ids_tensor(ids)).into_data().try_into_vec_as::<f32>().unwrap();
    for (dtype, want, tol) in [(WeightDtype::F16, DType::F16, 0.05), (WeightDtype::Bf16, DType::BF16, 0.4)] {
        let m = load(&dir, dtype, &device);
        assert_eq!(m.model.weight_dtype(), want);
        let got = m.model.forward(m.model.ids_tensor(ids)).into_data().try_into_vec_as::<f32>().unwrap();
        let d = max_abs_diff(&got, &base);
        assert!(d > 0.0 && d < tol, "{dtype}: logits moved by {d} (expected a rounding's worth, under {tol})");
    }
}

#[test]
fn bf16_weights_are_read_in_place_from_the_mapped_file() {
    let (_t, dir) = copy_fixture("bf16/llama_gqa");
    let file = dir.join("model.safetensors");
    let mapped = || std::fs::read_to_string("/proc/self/maps").unwrap().lines().any(|l| l.ends_with(file.to_str().unwrap()));
    let m = load(&dir, WeightDtype::Auto, &Device::flex());
    assert!(mapped(), "the bf16 checkpoint is mapped while the model lives");
    drop(m);
    assert!(!mapped(), "the mapping goes with the model");
    // Widened to f32, nothing is kept mapped.
    let m = load(&dir, WeightDtype::F32, &Device::flex());
    assert!(!mapped(), "an f32 load copies and converts");
    drop(m);
}

#[test]
fn a_truncated_half_checkpoint_is_refused_at_load() {
    let (_t, dir) = copy_fixture("bf16/llama_gqa");
    let file = dir.join("model.safetensors");
    let full = std::fs::read(&file).unwrap();
    for cut in [full.len() - 1, full.len() - 4096, full.len() / 2] {
        std::fs::write(&file, &full[..cut]).unwrap();
        let e = load_model_with(&dir, &Device::flex(), &LoadOptions::default()).err().expect("a truncated file loads").to_string();
        assert!(e.contains("model.safetensors") && (e.contains("truncated") || e.contains("ends at byte")), "cut at {cut}: {e}");
        assert_eq!(e.lines().count(), 1, "one line: {e}");
        assert_bad_input(&burnlens(&["logits", "--model", dir.to_str().unwrap(), "--ids", "1,2"]), "model.safetensors");
    }
}

#[cfg(feature = "ndarray")]
#[test]
fn a_backend_without_half_tensors_widens_auto_and_refuses_an_explicit_half() {
    #[allow(deprecated)]
    let nd = Device::ndarray();
    let dir = fixture("bf16/gpt2");
    let m = load(&dir, WeightDtype::Auto, &nd);
    assert_eq!(m.model.weight_dtype(), DType::F32);
    assert!(m.info.warnings.iter().any(|w| w.contains("widened to f32")), "{:?}", m.info.warnings);
    let e = load_model_with(&dir, &nd, &LoadOptions::dtype(WeightDtype::Bf16)).err().expect("ndarray holds no bf16").to_string();
    assert!(e.contains("cannot hold bf16"), "{e}");
}

#[test]
fn cli_dtype_flag_reports_and_refuses() {
    let dir = fixture("bf16/qwen3_qknorm");
    let d = dir.to_str().unwrap();
    let o = burnlens(&["info", "--model", d]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("dtype bf16") && text.contains("weights:     bf16 matrices"), "{text}");
    let o = burnlens(&["info", "--model", d, "--dtype", "f32"]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("weights:     f32 matrices"));
    assert_exit(&burnlens(&["info", "--model", d, "--dtype", "fp8"]), 2, "auto, f32, bf16, f16");
    #[cfg(feature = "ndarray")]
    assert_bad_input(&burnlens(&["info", "--model", d, "--dtype", "bf16", "--backend", "ndarray"]), "cannot hold bf16");

    // The same logits from a bf16 load and an f32 load, through the CLI.
    let tmp = tempfile::tempdir().unwrap();
    let run = |dtype: &str| {
        let out = tmp.path().join(format!("{dtype}.json"));
        let o = burnlens(&["logits", "--model", d, "--ids", "3,1,4,1,5,9,2,6", "--dtype", dtype, "--out", out.to_str().unwrap()]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out).unwrap()).unwrap();
        v["logits"].as_array().unwrap().iter().flat_map(|r| r.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32)).collect::<Vec<f32>>()
    };
    let (a, b) = (run("auto"), run("f32"));
    assert!(rel_diff(&a, &b) <= 1e-5, "{}", rel_diff(&a, &b));
}

#[test]
fn export_writes_the_dtype_asked_for() {
    // An f32 model exported in bf16 loads back as bf16, with exactly the weights that
    // rounding the f32 checkpoint to bf16 on load gives.
    let src = fixture("llama_gqa");
    let device = Device::flex();
    let m = load(&src, WeightDtype::F32, &device);
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("bf16");
    let options = burnlens::hf::ExportOptions { tokenizer: None, dtype: WeightDtype::Bf16 };
    burnlens::hf::export_hf(&m.model, m.hf.family, &out, &options).unwrap();
    let config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["torch_dtype"], "bfloat16");
    let back = load(&out, WeightDtype::Auto, &device);
    assert_eq!((back.info.dtypes.as_slice(), back.model.weight_dtype()), (&["bf16".to_string()][..], DType::BF16));
    let rounded = load(&src, WeightDtype::Bf16, &device);
    let host = |t: burn::tensor::Tensor<3>| t.into_data().try_into_vec_as::<f32>().unwrap();
    // The weight matrices are the bf16 roundings, bit for bit.
    let (a, b) = (burnlens::lens::head_weights(&back.model.blocks[1].attn), burnlens::lens::head_weights(&rounded.model.blocks[1].attn));
    for (what, x, y) in [("W_Q", a.w_q, b.w_q), ("W_K", a.w_k, b.w_k), ("W_V", a.w_v, b.w_v), ("W_O", a.w_o, b.w_o)] {
        assert_eq!(host(x), host(y), "{what}");
    }
    let u = |m: &Transformer| m.w_u().0.into_data().try_into_vec_as::<f32>().unwrap();
    assert_eq!(u(&back.model), u(&rounded.model), "W_U");
    // Vectors (norm gains) are rounded in the file too (all of a checkpoint is one dtype),
    // while a load keeps them f32: they differ by at most bf16's rounding.
    let g = |m: &Transformer| m.ln_final.weight.val().into_data().try_into_vec_as::<f32>().unwrap();
    let (gb, gr) = (g(&back.model), g(&rounded.model));
    assert!(gb.iter().zip(&gr).all(|(x, y)| (x - y).abs() <= y.abs() / 256.0) && gb != gr, "norm gains: bf16 rounding");
    // Auto keeps a trained (f32) model in f32.
    let f32_out = tmp.path().join("auto");
    burnlens::hf::export_hf(&m.model, m.hf.family, &f32_out, &burnlens::hf::ExportOptions::default()).unwrap();
    assert_eq!(load(&f32_out, WeightDtype::Auto, &device).info.dtypes, ["f32"]);
}
