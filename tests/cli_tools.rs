//! The interpretability commands end to end: `tokenize`, `--text`, `--names`,
//! `--process-weights`, `patch`, `attribute`, `lens`, `sae`, and the first errors a newcomer
//! meets, on imported fixtures of every family and on models trained by burnlens.

mod common;

use std::process::Output;

use common::*;
use serde_json::Value;

fn out(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn ok(o: &Output) -> String {
    assert!(o.status.success(), "exit {:?}\nstdout: {}\nstderr: {}", o.status.code(), out(o), err(o));
    out(o)
}

fn json(path: &std::path::Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap()
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

const CHAR_MODEL: &str = "trained_llama_char";

#[test]
fn tokenize_and_text_input_agree_with_ids() {
    let m = fixture(CHAR_MODEL);
    let m = m.to_str().unwrap();
    let o = burnlens(&["tokenize", "--model", m, "--text", "First Citizen", "--json"]);
    let doc: Value = serde_json::from_str(ok(&o).trim()).unwrap();
    let ids: Vec<i64> = doc["ids"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect();
    let tokens: Vec<&str> = doc["tokens"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert_eq!(tokens.concat(), "First Citizen");
    assert_eq!(ids.len(), 13);
    let plain = ok(&burnlens(&["tokenize", "--model", m, "--text", "First Citizen"]));
    assert!(plain.contains("ids:") && plain.contains("\"C\""), "{plain}");

    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("a.json"), tmp.path().join("b.json"));
    let id_text = ids.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",");
    ok(&burnlens(&["logits", "--model", m, "--text", "First Citizen", "--out", a.to_str().unwrap()]));
    ok(&burnlens(&["logits", "--model", m, "--ids", &id_text, "--out", b.to_str().unwrap()]));
    let (a, b) = (json(&a), json(&b));
    assert_eq!(a["logits"], b["logits"]);
    assert_eq!(a["tokens"][6], "C");
    // Text needs a tokenizer.
    assert_bad_input(
        &burnlens(&["logits", "--model", fixture("gpt2").to_str().unwrap(), "--text", "hi"]),
        "has no tokenizer.json or char_vocab.json; pass token ids with --ids",
    );
    assert_bad_input(&burnlens(&["tokenize", "--model", fixture("gpt2").to_str().unwrap(), "--text", "hi"]), "no tokenizer.json");
}

#[test]
fn names_are_exact_unless_a_regex_is_asked_for() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("c.safetensors");
    let m = fixture("gpt2");
    let run = |names: &str| burnlens(&["cache", "--model", m.to_str().unwrap(), "--ids", "1,2,3", "--names", names, "--out", file.to_str().unwrap()]);
    ok(&run("blocks.1.attn.hook_z, hook_embed"));
    let got = read_safetensors(&file);
    let mut keys: Vec<&String> = got.keys().collect();
    keys.sort();
    assert_eq!(keys, ["blocks.1.attn.hook_z", "hook_embed", "ids"]);
    // A regex must match whole names: `hook_z` alone matches nothing.
    assert_bad_input(&run("re:hook_z"), "matches no hook point");
    ok(&run(r"re:blocks\.[12]\.attn\.hook_z"));
    assert_eq!(read_safetensors(&file).len(), 3);
    // Regex syntax without `re:` is refused with the hint.
    assert_bad_input(&run(r"blocks\.1\.attn\.hook_(q|z)"), "for a regex, write re:PATTERN");
    assert_bad_input(&run("blocks.7.attn.hook_z"), "\"blocks.7.attn.hook_z\" is not a hook point of this model");
}

#[test]
fn process_weights_keeps_the_log_probabilities_of_logits_and_changes_the_cache() {
    let tmp = tempfile::tempdir().unwrap();
    for name in ["gpt2", "llama_gqa"] {
        let m = fixture(name);
        let m = m.to_str().unwrap();
        let (a, b) = (tmp.path().join("a.json"), tmp.path().join("b.json"));
        ok(&burnlens(&["logits", "--model", m, "--ids", "3,9,27,81,115", "--out", a.to_str().unwrap()]));
        ok(&burnlens(&["logits", "--model", m, "--ids", "3,9,27,81,115", "--out", b.to_str().unwrap(), "--process-weights"]));
        let logp = |d: &Value| -> Vec<f64> {
            d["logits"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|row| {
                    let r: Vec<f64> = row.as_array().unwrap().iter().map(f).collect();
                    let m = r.iter().cloned().fold(f64::MIN, f64::max);
                    let z = r.iter().map(|x| (x - m).exp()).sum::<f64>().ln() + m;
                    r.into_iter().map(move |x| x - z)
                })
                .collect()
        };
        let (pa, pb) = (logp(&json(&a)), logp(&json(&b)));
        let d = pa.iter().zip(&pb).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
        assert!(d < 1e-4, "{name}: processed weights change log-probs by {d}");
        assert!((f(&json(&a)["loss"]) - f(&json(&b)["loss"])).abs() < 1e-4);
        let (ca, cb) = (tmp.path().join("a.safetensors"), tmp.path().join("b.safetensors"));
        let hook = "blocks.0.ln1.hook_normalized";
        ok(&burnlens(&["cache", "--model", m, "--ids", "3,9,27", "--names", hook, "--out", ca.to_str().unwrap()]));
        ok(&burnlens(&["cache", "--model", m, "--ids", "3,9,27", "--names", hook, "--out", cb.to_str().unwrap(), "--process-weights"]));
        // hook_normalized is before the norm's gain and bias (TransformerLens's convention):
        // folding moves them into the next weights and centring the writers changes nothing a
        // LayerNorm lets through, so the hook keeps its value (as in TransformerLens).
        let d = max_abs_diff(&read_safetensors(&ca)[hook].f32, &read_safetensors(&cb)[hook].f32);
        assert!(d < 1e-4, "{name}: folding the norm changed hook_normalized by {d}");
    }
}

#[test]
fn patch_reports_both_estimates_and_their_correlation() {
    let tmp = tempfile::tempdir().unwrap();
    for (name, clean, corrupted, metric) in [
        ("gpt2", "5,17,33,2,90,12,7,64", "5,17,33,2,91,12,7,64", "logit-diff:7,64"),
        ("pythia_like", "5,17,33,2,90,12,7,64", "5,17,38,2,90,12,7,64", "loss:1"),
        ("mistral_window", "5,17,33,2,90,12,7,64", "5,17,33,2,90,13,7,64", "logprob:9@6"),
    ] {
        let dir = tmp.path().join(name);
        let o = burnlens(&[
            "patch",
            "--model",
            fixture(name).to_str().unwrap(),
            "--ids",
            clean,
            "--corrupted-ids",
            corrupted,
            "--metric",
            metric,
            "--out",
            dir.to_str().unwrap(),
        ]);
        let text = ok(&o);
        assert!(text.contains("correlation of the two over"), "{text}");
        let r = json(&dir.join("report.json"));
        let (l, h, t) = (r["n_layers"].as_u64().unwrap() as usize, r["n_heads"].as_u64().unwrap() as usize, 8);
        let n = r["nodes"].as_array().unwrap().len();
        assert_eq!(n, l * h + l * t + l, "{name}: heads, positions and MLPs");
        assert_eq!(r["attribution"].as_array().unwrap().len(), n);
        assert_eq!(r["patched"].as_array().unwrap().len(), n);
        let c = f(&r["correlation"]);
        assert!(c > 0.3 && c <= 1.0 + 1e-9, "{name}: correlation {c}");
        // Patching the first layer's residual stream where the sequences differ reproduces
        // the corrupted run (a loss keeps the clean targets, so only for the other metrics).
        if metric.starts_with("loss") {
            continue;
        }
        let diff_pos = clean.split(',').zip(corrupted.split(',')).position(|(a, b)| a != b).unwrap();
        let labels: Vec<&str> = r["labels"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
        let i = labels.iter().position(|s| *s == format!("L0P{diff_pos}")).unwrap();
        let want = f(&r["corrupted_metric"]) - f(&r["clean_metric"]);
        assert!((f(&r["patched"][i]) - want).abs() < 1e-4 * want.abs().max(1.0), "{name}: {} vs {want}", r["patched"][i]);
        let html = std::fs::read_to_string(dir.join("index.html")).unwrap();
        assert!(
            html.contains("<svg") && html.contains("bl-correlation") && !html.contains("src=\"http") && !html.contains("href=\"http"),
            "{name}: offline HTML (nothing fetched)"
        );
    }
    // Text on a model trained here, with attribution only.
    let dir = tmp.path().join("char");
    let o = burnlens(&[
        "patch",
        "--model",
        fixture(CHAR_MODEL).to_str().unwrap(),
        "--text",
        "the king",
        "--corrupted-text",
        "she king",
        "--metric",
        "loss",
        "--no-exact",
        "--out",
        dir.to_str().unwrap(),
    ]);
    ok(&o);
    let r = json(&dir.join("report.json"));
    assert!(r["patched"].is_null() && r["correlation"].is_null());
    assert_eq!(r["clean_tokens"][7], "g");
    assert!(r["attribution"].as_array().unwrap().iter().any(|a| f(a).abs() > 1e-4), "a changed first token changes the later losses");
    // Bad input.
    let m = fixture("gpt2");
    let m = m.to_str().unwrap();
    let d = dir.to_str().unwrap();
    assert_bad_input(&burnlens(&["patch", "--model", m, "--ids", "1,2,3", "--corrupted-ids", "1,2", "--out", d]), "needs equal lengths");
    let o = burnlens(&["patch", "--model", m, "--ids", "1,2,3", "--corrupted-ids", "1,2,300", "--out", d]);
    assert_bad_input(&o, "--corrupted-ids: token id 300 at position 2 is out of range");
    assert!(!err(&o).contains("--corrupted-ids: --corrupted-ids"), "the flag is named once: {}", err(&o));
    assert_bad_input(
        &burnlens(&["patch", "--model", m, "--ids", "1,2,3", "--corrupted-ids", "1,2,4", "--metric", "logprob:5@9", "--out", d]),
        "metric position 9 is outside the sequence of 3 tokens",
    );
    assert_bad_input(&burnlens(&["patch", "--model", m, "--ids", "1,2,3", "--corrupted-ids", "1,2,4", "--metric", "bleu", "--out", d]), "unknown metric");
    assert_bad_input(&burnlens(&["patch", "--model", m, "--ids", "1,2,3", "--corrupted-ids", "1,2,4", "--nodes", "neurons", "--out", d]), "unknown node kind");
}

#[test]
fn attribute_components_sum_to_the_logits_on_every_family() {
    let tmp = tempfile::tempdir().unwrap();
    for name in ["gpt2", "gpt_neo_local", "neox_sequential", "qwen2_tied", CHAR_MODEL] {
        let dir = tmp.path().join(name);
        let m = fixture(name);
        let args: Vec<&str> = if name == CHAR_MODEL {
            vec!["--text", "First Citizen", "--target", " ", "--wrong", "t"]
        } else {
            vec!["--ids", "5,17,33,2,90,12", "--target", "7", "--wrong", "64"]
        };
        let mut cmd = vec!["attribute", "--model", m.to_str().unwrap(), "--out", dir.to_str().unwrap()];
        cmd.extend(args);
        ok(&burnlens(&cmd));
        let r = json(&dir.join("report.json"));
        let contributions = r["contributions"].as_array().unwrap();
        let t = r["logits"].as_array().unwrap().len();
        for p in 0..t {
            let sum: f64 = contributions.iter().map(|c| f(&c[p])).sum::<f64>() + f(&r["bias"][p]);
            assert!((sum - f(&r["logits"][p])).abs() <= 1e-4, "{name} pos {p}: {sum} vs {}", r["logits"][p]);
        }
        assert!(f(&r["max_error"]) <= 1e-4);
        let html = std::fs::read_to_string(dir.join("index.html")).unwrap();
        assert!(html.contains("bl-tok") && html.contains("<svg"));
    }
    let m = fixture(CHAR_MODEL);
    assert_bad_input(
        &burnlens(&["attribute", "--model", m.to_str().unwrap(), "--text", "ab", "--target", "xy", "--out", tmp.path().join("x").to_str().unwrap()]),
        "encodes to 2 tokens",
    );
}

#[test]
fn the_lens_command_ends_at_the_models_logits() {
    let tmp = tempfile::tempdir().unwrap();
    for name in ["gpt2", "llama_gqa", CHAR_MODEL] {
        let dir = tmp.path().join(name);
        let m = fixture(name);
        let m = m.to_str().unwrap();
        let input: Vec<&str> = if name == CHAR_MODEL { vec!["--text", "First Citizen"] } else { vec!["--ids", "5,17,33,2,90,12"] };
        let mut cmd = vec!["lens", "--model", m, "--out", dir.to_str().unwrap(), "--top", "3"];
        cmd.extend(input.iter().copied());
        ok(&burnlens(&cmd));
        let r = json(&dir.join("report.json"));
        let layers = r["layers"].as_array().unwrap().len();
        let logits_file = tmp.path().join(format!("{name}.json"));
        let mut cmd = vec!["logits", "--model", m, "--out", logits_file.to_str().unwrap()];
        cmd.extend(input.iter().copied());
        ok(&burnlens(&cmd));
        let l = json(&logits_file);
        let ids: Vec<i64> = l["ids"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect();
        for p in 0..ids.len() - 1 {
            let row: Vec<f64> = l["logits"][p].as_array().unwrap().iter().map(f).collect();
            let mx = row.iter().cloned().fold(f64::MIN, f64::max);
            let z = row.iter().map(|x| (x - mx).exp()).sum::<f64>().ln() + mx;
            let want = row[ids[p + 1] as usize] - z;
            let got = f(&r["target_logprob"][layers - 1][p]);
            assert!((got - want).abs() < 1e-4, "{name} pos {p}: {got} vs {want}");
        }
        assert_eq!(r["top_tokens"][0][0].as_array().unwrap().len(), 3);
    }
}

#[test]
fn sae_command_runs_a_saelens_directory_and_refuses_a_mismatched_one() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("sae");
    let sae = fixture("sae").join("jumprelu_llama_resid");
    let text = ok(&burnlens(&[
        "sae",
        "--model",
        fixture("llama_gqa").to_str().unwrap(),
        "--sae",
        sae.to_str().unwrap(),
        "--ids",
        "5,17,33,2,90,12",
        "--out",
        dir.to_str().unwrap(),
    ]));
    assert!(text.contains("mean L0") && text.contains("with the SAE spliced in"), "{text}");
    let r = json(&dir.join("report.json"));
    assert_eq!(r["l0"].as_array().unwrap().len(), 6);
    assert_eq!(r["hook_name"], "blocks.1.hook_resid_pre");
    assert!(f(&r["loss_with_sae"]).is_finite());
    assert!(std::fs::read_to_string(dir.join("index.html")).unwrap().contains("bl-tok"));
    assert_bad_input(
        &burnlens(&["sae", "--model", fixture("gpt2").to_str().unwrap(), "--sae", sae.to_str().unwrap(), "--ids", "1,2", "--out", dir.to_str().unwrap()]),
        "the SAE's d_in is 64",
    );
    assert_bad_input(
        &burnlens(&[
            "sae",
            "--model",
            fixture("gpt2").to_str().unwrap(),
            "--sae",
            tmp.path().to_str().unwrap(),
            "--ids",
            "1,2",
            "--out",
            dir.to_str().unwrap(),
        ]),
        "cfg.json",
    );
}

#[test]
fn analyze_nests_composition_scores_and_reports_token_logprobs() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("a");
    ok(&burnlens(&["analyze", "--model", fixture("pythia_like").to_str().unwrap(), "--ids", "5,17,33,2,90", "--out", dir.to_str().unwrap()]));
    let r = json(&dir.join("report.json"));
    let k = &r["composition"]["k"];
    let (l, h) = (3, 4);
    assert_eq!(k.as_array().unwrap().len(), l);
    assert_eq!(k[0].as_array().unwrap().len(), h);
    assert_eq!(k[0][0].as_array().unwrap().len(), l);
    assert_eq!(k[0][0][0].as_array().unwrap().len(), h);
    assert_eq!(f(&k[1][0][0][0]), 0.0, "a later head does not compose into an earlier one");
    assert!(f(&k[0][1][2][3]) > 0.0);
    let lp = r["token_logprobs"].as_array().unwrap();
    assert_eq!(lp.len(), 5);
    assert!(lp[4].is_null() && f(&lp[0]) < 0.0);
}

#[test]
fn a_bos_id_outside_the_vocabulary_is_a_warning() {
    let (_tmp, dir) = copy_fixture("gpt2");
    let cfg = dir.join("config.json");
    let mut c: Value = serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
    c["bos_token_id"] = 50256.into();
    std::fs::write(&cfg, c.to_string()).unwrap();
    let o = burnlens(&["info", "--model", dir.to_str().unwrap()]);
    ok(&o);
    assert!(err(&o).contains("warning:") && err(&o).contains("bos_token_id 50256 lies outside the vocabulary of 128 tokens"), "{}", err(&o));
}

#[test]
fn training_without_the_data_says_where_it_looked_and_how_to_get_it() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/shakespeare-char-cpu.toml");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_burnlens"))
        .current_dir(tmp.path())
        .args(["train", "--config", cfg.to_str().unwrap()])
        .env_remove("BURNLENS_BACKEND")
        .output()
        .unwrap();
    assert_bad_input(&o, "data/tinyshakespeare.txt: no such file");
    let e = err(&o);
    assert!(e.contains("resolved from the current directory") && e.contains(&tmp.path().display().to_string()), "{e}");
    assert!(e.contains("burnlens data fetch tinyshakespeare"), "{e}");
    assert_eq!(e.matches("No such file").count(), 0, "the OS message is not repeated: {e}");
    assert!(!tmp.path().join("runs").exists() && !tmp.path().join("out").exists(), "nothing is created for a run that cannot start");
}

#[test]
fn cache_saves_gradients_at_the_named_points() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("g.safetensors");
    let m = fixture("gpt2");
    let text = ok(&burnlens(&[
        "cache",
        "--model",
        m.to_str().unwrap(),
        "--ids",
        "5,17,33,2,90,12",
        "--names",
        "hook_embed,hook_pos_embed,blocks.0.hook_resid_pre,blocks.1.attn.hook_z",
        "--grad",
        "logprob:7@2",
        "--out",
        file.to_str().unwrap(),
    ]));
    assert!(text.contains("metric log p(token 7 at 2)"), "{text}");
    let st = read_safetensors(&file);
    for n in ["hook_embed", "blocks.0.hook_resid_pre", "blocks.1.attn.hook_z"] {
        assert_eq!(st[&format!("grad.{n}")].shape, st[n].shape, "{n}");
    }
    // resid_pre 0 = embed + pos_embed: the three gradients are one total derivative.
    let (ge, gp, gr) = (&st["grad.hook_embed"].f32, &st["grad.hook_pos_embed"].f32, &st["grad.blocks.0.hook_resid_pre"].f32);
    assert!(max_abs_diff(ge, gr) <= 1e-6 * max_abs(gr).max(1.0) && max_abs_diff(gp, gr) <= 1e-6 * max_abs(gr).max(1.0));
    assert!(max_abs(gr) > 0.0);
    // Positions after the metric's do not reach it.
    let d = 32;
    assert!(gr[3 * d..].iter().all(|&x| x == 0.0));
    let metric = st["metric"].f32[0];
    assert!(metric < 0.0, "a log-probability: {metric}");
}
