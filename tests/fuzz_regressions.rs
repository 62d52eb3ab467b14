//! Inputs found by `scripts/fuzz.sh` (cargo fuzz) that crashed burnlens, kept as tests, plus
//! hand-made relatives of each. Crash files live in `tests/fixtures/fuzz/`.

mod common;

use std::path::{Path, PathBuf};

use common::*;

fn crash(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fuzz").join(name)
}

/// `burnlens info` on a directory holding only `config.json` = `text`.
fn info_on_config(text: &str) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), text).unwrap();
    burnlens(&["info", "--model", dir.path().to_str().unwrap()])
}

/// Found by the `config_json` target: `"n_layer": 444522473353523` allocated per-layer state
/// for every layer before any check (an allocation of 2^53 bytes: abort).
#[test]
fn a_config_with_trillions_of_layers_is_an_error() {
    let text = std::fs::read_to_string(crash("config_json-huge-n_layer.json")).unwrap();
    let e = burnlens::hf::parse_config(&text, Path::new("config.json")).unwrap_err().to_string();
    assert!(e.contains("n_layer") && e.contains("at most 4096"), "{e}");
    assert_bad_input(&info_on_config(&text), "n_layer");
}

#[test]
fn gpt_neo_attention_types_that_expand_to_too_many_layers_are_an_error() {
    let text = r#"{"model_type": "gpt_neo", "num_layers": 2, "hidden_size": 8, "num_heads": 2,
        "attention_types": [[["global", "local"], 9007199254740993]]}"#;
    let e = burnlens::hf::parse_config(text, Path::new("config.json")).unwrap_err().to_string();
    assert!(e.contains("attention_types") && e.contains("at most"), "{e}");
    assert_bad_input(&info_on_config(text), "attention_types");
}

#[test]
fn sizes_whose_product_overflows_are_an_error_not_an_overflow() {
    let text = r#"{"model_type": "gpt2", "n_embd": 4294967296, "n_head": 1, "n_layer": 4000, "vocab_size": 4294967296}"#;
    let e = burnlens::hf::parse_config(text, Path::new("config.json")).unwrap_err().to_string();
    assert!(e.contains("n_params") && e.contains("2^40"), "{e}");
    assert_bad_input(&info_on_config(text), "n_params");
}

#[test]
fn a_run_config_with_too_many_layers_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("run.toml");
    std::fs::write(
        &cfg,
        "[model]\nn_layers = 444522473353523\nn_heads = 2\nd_model = 8\n[data]\nkind = \"repeated_tokens\"\nvocab = 8\n[training]\nsteps = 1\n",
    )
    .unwrap();
    let out = format!("output.dir={}", dir.path().join("run").display());
    let o = burnlens(&["train", "--config", cfg.to_str().unwrap(), "--set", &out]);
    assert_bad_input(&o, "model.n_layers");
}
