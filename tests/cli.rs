//! End-to-end runs of the `burnlens` binary on the committed fixtures.

mod common;

use std::path::Path;
use std::process::Output;

use common::*;

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn ids_of(name: &str) -> (Vec<i64>, String) {
    let e = read_safetensors(&fixture(name).join("expected.safetensors"));
    let ids = e["ids"].i64.clone();
    let text = ids.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",");
    (ids, text)
}

#[test]
fn info_describes_family_spans_and_dtype() {
    let o = burnlens(&["info", "--model", fixture("gpt_neo_local").to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("family:      gpt_neo"), "{out}");
    assert!(out.contains("local attn:  1 (window 6), 3 (window 6)"), "{out}");
    assert!(out.contains("layers:      4"), "{out}");
    assert!(out.contains("dtype f32"), "{out}");
    assert!(out.contains("unembedding present (tied)"), "{out}");

    let o = burnlens(&["info", "--model", fixture("gpt2_legacy_bin").to_str().unwrap()]);
    let out = stdout(&o);
    assert!(out.contains("family:      gpt2") && out.contains("all layers global"), "{out}");
    assert!(out.contains("no transformer. prefix") && out.contains("4 legacy buffers ignored"), "{out}");
    let o = burnlens(&["info", "--model", fixture("gpt_neo_bf16").to_str().unwrap()]);
    assert!(stdout(&o).contains("dtype bf16"), "{}", stdout(&o));
}

#[test]
fn logits_json_and_safetensors_match_hf() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["gpt2", "gpt_neo_local"] {
        let expected = read_safetensors(&fixture(name).join("expected.safetensors"));
        let (ids, text) = ids_of(name);
        let json_out = dir.path().join(format!("{name}.json"));
        let o = burnlens(&["logits", "--model", fixture(name).to_str().unwrap(), "--ids", &text, "--out", json_out.to_str().unwrap(), "--backend", "flex"]);
        assert!(o.status.success(), "{}", stderr(&o));
        let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json_out).unwrap()).unwrap();
        let got_ids: Vec<i64> = doc["ids"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect();
        assert_eq!(got_ids, ids);
        let rows = doc["logits"].as_array().unwrap();
        assert_eq!(rows.len(), ids.len());
        let flat: Vec<f32> = rows.iter().flat_map(|r| r.as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32)).collect();
        assert!(max_abs_diff(&flat, &expected["logits"].f32) <= 1e-4);
        assert!((doc["loss"].as_f64().unwrap() as f32 - expected["loss"].f32[0]).abs() <= 1e-4);

        let st_out = dir.path().join(format!("{name}.safetensors"));
        let o = burnlens(&["logits", "--model", fixture(name).to_str().unwrap(), "--ids", &text, "--out", st_out.to_str().unwrap()]);
        assert!(o.status.success(), "{}", stderr(&o));
        let got = read_safetensors(&st_out);
        assert_eq!(got["ids"].i64, ids);
        assert_eq!(got["logits"].shape, vec![ids.len(), 128]);
        assert!(max_abs_diff(&got["logits"].f32, &expected["logits"].f32) <= 1e-4);
        assert!((got["loss"].f32[0] - expected["loss"].f32[0]).abs() <= 1e-4);
    }
}

#[test]
fn logits_summary_without_out() {
    let o = burnlens(&["logits", "--model", fixture("gpt2").to_str().unwrap(), "--ids", "1, 2,3"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("3 tokens, vocab 128") && out.contains("loss (mean next-token cross-entropy)"), "{out}");
}

#[test]
fn cache_writes_the_matching_activations() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("cache.safetensors");
    let (ids, text) = ids_of("gpt2");
    let o = burnlens(&[
        "cache",
        "--model",
        fixture("gpt2").to_str().unwrap(),
        "--ids",
        &text,
        "--names",
        r"re:blocks\.0\.attn\.hook_(q|pattern)|hook_embed|blocks\.2\.hook_resid_post",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let got = read_safetensors(&out);
    let mut names: Vec<&String> = got.keys().filter(|k| *k != "ids").collect();
    names.sort();
    assert_eq!(got["ids"].i64, ids, "the token ids are saved beside the activations");
    assert_eq!(names, ["blocks.0.attn.hook_pattern", "blocks.0.attn.hook_q", "blocks.2.hook_resid_post", "hook_embed"]);
    let t = ids.len();
    assert_eq!(got["blocks.0.attn.hook_q"].shape, vec![1, t, 4, 8]);
    assert_eq!(got["blocks.0.attn.hook_pattern"].shape, vec![1, 4, t, t]);
    assert_eq!(got["hook_embed"].shape, vec![1, t, 32]);
    let expected = read_safetensors(&fixture("gpt2").join("expected.safetensors"));
    assert!(max_abs_diff(&got["blocks.0.attn.hook_pattern"].f32, &expected["pattern.0"].f32) <= 1e-5);

    // Every documented hook name is produced when asked for.
    let all = dir.path().join("all.safetensors");
    let o = burnlens(&["cache", "--model", fixture("gpt2").to_str().unwrap(), "--ids", "1,2,3", "--names", "re:.*", "--out", all.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let got = read_safetensors(&all);
    for l in 0..3 {
        for h in [
            "hook_resid_pre",
            "hook_resid_mid",
            "hook_resid_post",
            "attn.hook_q",
            "attn.hook_k",
            "attn.hook_v",
            "attn.hook_attn_scores",
            "attn.hook_pattern",
            "attn.hook_z",
            "attn.hook_result",
            "hook_attn_out",
            "mlp.hook_pre",
            "mlp.hook_post",
            "hook_mlp_out",
            "ln1.hook_scale",
            "ln2.hook_normalized",
        ] {
            assert!(got.contains_key(&format!("blocks.{l}.{h}")), "missing blocks.{l}.{h}");
        }
    }
    assert!(got.contains_key("hook_pos_embed") && got.contains_key("ln_final.hook_normalized"));
}

#[test]
fn bad_command_line_inputs_are_one_line_errors() {
    let gpt2 = fixture("gpt2");
    let m = gpt2.to_str().unwrap();
    assert_bad_input(&burnlens(&["logits", "--model", m, "--ids", "1,500,2"]), "token id 500 at position 1 is out of range: the vocabulary has 128 ids");
    assert_bad_input(&burnlens(&["logits", "--model", m, "--ids", "1,-3"]), "token id -3 at position 1 is out of range");
    let long: Vec<String> = (0..33).map(|i| (i % 100).to_string()).collect();
    assert_bad_input(
        &burnlens(&["logits", "--model", m, "--ids", &long.join(",")]),
        "sequence of 33 tokens is longer than the model's context of 32 positions",
    );
    assert_bad_input(&burnlens(&["logits", "--model", m, "--ids", "1,x"]), "--ids: \"x\" is not an integer token id");
    assert_bad_input(&burnlens(&["logits", "--model", m, "--ids", ""]), "the sequence is empty");
    assert_bad_input(
        &burnlens(&["logits", "--model", m, "--ids", "1", "--backend", "metal9"]),
        "unknown backend \"metal9\"; expected one of flex, ndarray, wgpu, tch, cuda",
    );
    assert_bad_input(&burnlens(&["logits", "--model", m, "--ids", "1", "--out", "x.txt"]), "expected a .json or .safetensors file name");
    assert_bad_input(&burnlens(&["logits", "--model", m, "--ids", "1", "--out", "/nonexistent-dir/x.json"]), "does not exist");
    assert_bad_input(&burnlens(&["logits", "--model", "/nonexistent-model", "--ids", "1"]), "/nonexistent-model");
    assert_bad_input(&burnlens(&["cache", "--model", m, "--ids", "1", "--names", "re:(", "--out", "x.safetensors"]), "--names: invalid regex");
    assert_bad_input(
        &burnlens(&["cache", "--model", m, "--ids", "1", "--names", "nothing_here", "--out", "x.safetensors"]),
        "is not a hook point of this model",
    );
    assert_bad_input(
        &burnlens(&["bench", "generate", "--model", m, "--prompt", "30", "--new-tokens", "4", "--reps", "1"]),
        "bench generate: --prompt 30 and --new-tokens 4: expected a prompt of 1 or more tokens and at most 33 tokens in all",
    );
    if !burnlens::model::backend::is_compiled("cuda") {
        assert_bad_input(&burnlens(&["info", "--model", m, "--backend", "cuda"]), "rebuild with: cargo build --release --features cuda");
    }
}

#[test]
fn a_fresh_save_pretrained_directory_with_only_the_required_files_works() {
    // Copy just config.json and the weights, as a user's directory might be.
    let dir = tempfile::tempdir().unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(fixture("gpt2_inverse_layer").join(f), dir.path().join(f)).unwrap();
    }
    let o = burnlens(&["logits", "--model", dir.path().to_str().unwrap(), "--ids", "0,1,2,3"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(Path::new(dir.path()).join("config.json").exists());
}

/// `backends` says which one-launch GPU kernels run, and which `BURNLENS_GPU_ROW_KERNELS`
/// leaves out; a name it does not know is one warning line, and every kernel stays on.
#[test]
fn backends_names_the_one_launch_kernels_left_out() {
    let line = |env: &[(&str, &str)]| {
        let o = burnlens_with_env(env, &["backends"]);
        assert!(o.status.success(), "{}", stderr(&o));
        let out = stdout(&o);
        (out.lines().find(|l| l.starts_with("one-launch GPU kernels")).unwrap_or_else(|| panic!("no kernels line: {out}")).to_string(), stderr(&o))
    };
    let all = "one-launch GPU kernels (cuda, wgpu): norm, softmax, pattern, activation, decode, flash, adam";
    assert_eq!(line(&[]).0, all);
    assert_eq!(
        line(&[("BURNLENS_GPU_ROW_KERNELS", "decode, adam")]).0,
        "one-launch GPU kernels (cuda, wgpu): norm, softmax, pattern, activation, flash; left out by BURNLENS_GPU_ROW_KERNELS: decode, adam"
    );
    assert!(line(&[("BURNLENS_GPU_ROW_KERNELS", "off")]).0.contains("none, Burn's composed ops"));
    let (kept, warning) = line(&[("BURNLENS_GPU_ROW_KERNELS", "decod")]);
    assert_eq!(kept, all);
    assert_eq!(warning.lines().count(), 1, "{warning}");
    assert!(warning.contains("unknown kernel `decod`"), "{warning}");
}
