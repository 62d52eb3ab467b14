//! Broken model directories give one clear error naming the file and tensor, from the
//! library and from the CLI (exit code 2, one line, no panic).

mod common;

use std::path::Path;
use std::process::Command;

use burn::tensor::Device;
use burnlens::hf::load_model;
use common::*;
use safetensors::{Dtype, tensor::TensorView};

/// Rewrite `file` through `edit`, which gets (name, dtype, shape, bytes) tuples.
fn rewrite(file: &Path, edit: impl FnOnce(&mut Vec<(String, Dtype, Vec<usize>, Vec<u8>)>)) {
    let bytes = std::fs::read(file).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<_> = st.tensors().into_iter().map(|(n, v)| (n, v.dtype(), v.shape().to_vec(), v.data().to_vec())).collect();
    edit(&mut tensors);
    let views: Vec<_> = tensors.iter().map(|(n, d, s, b)| (n.as_str(), TensorView::new(*d, s.clone(), b).unwrap())).collect();
    std::fs::write(file, safetensors::serialize(views, None).unwrap()).unwrap();
}

fn load_err(dir: &Path) -> String {
    match load_model(dir, &Device::flex()) {
        Ok(_) => panic!("{} loaded but should not have", dir.display()),
        Err(e) => e.to_string(),
    }
}

/// The same failure through the CLI: exit 2 and one line.
fn cli_err(dir: &Path, needle: &str) {
    let o = Command::new(env!("CARGO_BIN_EXE_burnlens")).args(["info", "--model", dir.to_str().unwrap()]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains(needle), "expected {needle:?} in {err}");
}

#[test]
fn missing_tensor() {
    let (_t, dir) = copy_fixture("gpt2");
    rewrite(&dir.join("model.safetensors"), |ts| ts.retain(|(n, ..)| n != "transformer.h.1.attn.c_proj.weight"));
    let e = load_err(&dir);
    assert!(e.contains("model.safetensors: missing tensor `transformer.h.1.attn.c_proj.weight` (expected shape [32, 32])"), "{e}");
    cli_err(&dir, "missing tensor `transformer.h.1.attn.c_proj.weight`");
}

#[test]
fn wrong_shape_names_expected_and_found() {
    let (_t, dir) = copy_fixture("gpt2");
    rewrite(&dir.join("model.safetensors"), |ts| {
        let t = ts.iter_mut().find(|(n, ..)| n == "transformer.h.0.mlp.c_fc.weight").unwrap();
        t.2 = vec![128, 32]; // same bytes, transposed shape
    });
    let e = load_err(&dir);
    assert!(e.contains("tensor `transformer.h.0.mlp.c_fc.weight` has shape [128, 32], expected [32, 128]"), "{e}");
    cli_err(&dir, "has shape [128, 32], expected [32, 128]");
}

#[test]
fn integer_weights_are_rejected() {
    let (_t, dir) = copy_fixture("gpt2");
    rewrite(&dir.join("model.safetensors"), |ts| {
        let t = ts.iter_mut().find(|(n, ..)| n == "transformer.ln_f.bias").unwrap();
        t.1 = Dtype::I64;
        t.3 = vec![0u8; 32 * 8];
    });
    let e = load_err(&dir);
    assert!(e.contains("tensor `transformer.ln_f.bias` has dtype i64, expected a floating-point dtype"), "{e}");
}

#[test]
fn truncated_and_corrupt_files() {
    for (fixture_name, file) in [("gpt2", "model.safetensors"), ("gpt2_legacy_bin", "pytorch_model.bin")] {
        let full = std::fs::read(fixture(fixture_name).join(file)).unwrap();
        for cut in [4, 100, full.len() / 2, full.len() - 1] {
            let (_t, dir) = copy_fixture(fixture_name);
            std::fs::write(dir.join(file), &full[..cut]).unwrap();
            let e = load_err(&dir);
            assert!(e.contains(file) && e.contains("truncated or corrupt"), "cut at {cut}: {e}");
        }
        let (_t, dir) = copy_fixture(fixture_name);
        std::fs::write(dir.join(file), b"this is not a checkpoint at all, just some text").unwrap();
        cli_err(&dir, "truncated or corrupt");
    }
}

#[test]
fn untied_lm_head_is_refused() {
    let (_t, dir) = copy_fixture("gpt_neo_local");
    rewrite(&dir.join("model.safetensors"), |ts| {
        let t = ts.iter_mut().find(|(n, ..)| n == "lm_head.weight").unwrap();
        t.3[0] ^= 0x40;
    });
    assert!(load_err(&dir).contains("`lm_head.weight` differs from `transformer.wte.weight` although config.json ties them"));
}

#[test]
fn directories_without_config_or_weights() {
    let tmp = tempfile::tempdir().unwrap();
    let e = load_err(tmp.path());
    assert!(e.contains("config.json") && e.contains("No such file"), "{e}");
    cli_err(tmp.path(), "config.json");
    std::fs::copy(fixture("gpt2").join("config.json"), tmp.path().join("config.json")).unwrap();
    let e = load_err(tmp.path());
    assert!(e.contains("no weights found: expected model.safetensors, model.safetensors.index.json or pytorch_model.bin"), "{e}");
}

#[test]
fn bad_configs() {
    let (_t, dir) = copy_fixture("gpt2");
    let cfg = dir.join("config.json");
    std::fs::write(&cfg, r#"{"model_type": "bert"}"#).unwrap();
    assert!(load_err(&dir).contains("unsupported model_type \"bert\"; supported: gpt2, gpt_neo"));
    cli_err(&dir, "supported: gpt2, gpt_neo");
    std::fs::write(&cfg, "{ nope").unwrap();
    assert!(load_err(&dir).contains("config.json: not valid JSON"));
    std::fs::write(&cfg, r#"{"model_type": "gpt2", "n_embd": 30, "n_head": 4}"#).unwrap();
    assert!(load_err(&dir).contains("`n_embd` = 30 is not divisible by n_head = 4"));
}

#[test]
fn shard_missing_from_an_index() {
    let (_t, dir) = copy_fixture("gpt2_sharded_f64");
    std::fs::remove_file(dir.join("model-00003-of-00006.safetensors")).unwrap();
    let e = load_err(&dir);
    assert!(e.contains("model-00003-of-00006.safetensors") && e.contains("missing"), "{e}");
}
