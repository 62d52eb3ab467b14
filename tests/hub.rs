//! Models by Hub id against a Hub stand-in on 127.0.0.1 (never the real Hub): a first
//! download into the standard cache layout, a cached load with `HF_HUB_OFFLINE=1`, a
//! revision, a sharded model, a 404, a 401 without a token, a connection dropped mid-file
//! (resumed with a range request), and a file whose hash does not match (clear error,
//! nothing half-written left in the cache).

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::hub_server::{Faults, HubServer};
use common::*;

const COMMIT_A: &str = "0123456789abcdef0123456789abcdef01234567";
const COMMIT_B: &str = "89abcdef0123456789abcdef0123456789abcdef";

/// The CLI with the Hub and cache pointed at the test's own.
fn cli(server: &str, hf_home: &Path, extra_env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_burnlens"));
    c.args(args).env_remove("BURNLENS_BACKEND").env_remove("HF_TOKEN").env_remove("HF_HUB_OFFLINE").env_remove("HF_HUB_CACHE");
    c.env("HF_ENDPOINT", server).env("HF_HOME", hf_home);
    for (k, v) in extra_env {
        c.env(k, v);
    }
    c.output().expect("run burnlens")
}

fn logits_json(out: &Output, path: &Path) -> Vec<f32> {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v["logits"].as_array().unwrap().iter().flat_map(|r| r.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32)).collect()
}

/// The logits burnlens computes from a fixture directory directly.
fn local_logits(fixture_name: &str, ids: &str, tmp: &Path) -> Vec<f32> {
    let out = tmp.join(format!("local-{fixture_name}.json"));
    let o = burnlens(&["logits", "--model", fixture(fixture_name).to_str().unwrap(), "--ids", ids, "--out", out.to_str().unwrap()]);
    logits_json(&o, &out)
}

#[test]
fn first_download_uses_the_hf_cache_layout_then_loads_offline() {
    let server = HubServer::start();
    server.publish("org/tiny-llama", "main", COMMIT_A, &fixture("llama_gqa"));
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("hf");
    let out = tmp.path().join("hub.json");
    let o = cli(&server.url, &home, &[], &["logits", "--model", "org/tiny-llama", "--ids", "1,2,3,4", "--out", out.to_str().unwrap()]);
    let got = logits_json(&o, &out);
    assert_eq!(got, local_logits("llama_gqa", "1,2,3,4", tmp.path()), "the downloaded model computes what the fixture does");
    // Progress lines (stderr is not a terminal here).
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("downloading model.safetensors") && err.contains("verified config.json"), "{err}");

    // huggingface_hub's layout: refs/main, blobs named by hash, snapshot symlinks into blobs.
    let repo = home.join("hub/models--org--tiny-llama");
    assert_eq!(std::fs::read_to_string(repo.join("refs/main")).unwrap(), COMMIT_A);
    let snap = repo.join("snapshots").join(COMMIT_A);
    let link = std::fs::read_link(snap.join("model.safetensors")).expect("a symlink");
    let weights = std::fs::read(fixture("llama_gqa").join("model.safetensors")).unwrap();
    assert_eq!(link, Path::new("../../blobs").join(hub_server::sha256_hex(&weights)));
    assert_eq!(std::fs::read(snap.join("model.safetensors")).unwrap(), weights);
    assert!(snap.join("config.json").is_file() && snap.join("generation_config.json").is_file());
    assert!(!snap.join("expected.safetensors").exists());
    let blobs: Vec<String> = std::fs::read_dir(repo.join("blobs")).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().to_string()).collect();
    assert!(blobs.iter().all(|b| !b.ends_with(".incomplete")), "{blobs:?}");

    // Offline: no request reaches the server, same result.
    let before = server.log().len();
    let out2 = tmp.path().join("offline.json");
    let o = cli(&server.url, &home, &[("HF_HUB_OFFLINE", "1")], &["logits", "--model", "org/tiny-llama", "--ids", "1,2,3,4", "--out", out2.to_str().unwrap()]);
    assert_eq!(logits_json(&o, &out2), got);
    assert_eq!(server.log().len(), before, "offline mode must not touch the network");
    // And with the server gone entirely (no HF_HUB_OFFLINE), the cache still serves.
    let o = cli("http://127.0.0.1:9", &home, &[], &["logits", "--model", "org/tiny-llama", "--ids", "1,2,3,4", "--out", out2.to_str().unwrap()]);
    assert_eq!(logits_json(&o, &out2), got);
    assert!(String::from_utf8_lossy(&o.stderr).contains("using the cached model"));
    // Offline and never downloaded: a clear error.
    let o = cli(&server.url, &home, &[("HF_HUB_OFFLINE", "1")], &["info", "--model", "org/never-seen"]);
    assert_bad_input(&o, "org/never-seen: is not in the cache");
}

#[test]
fn a_revision_picks_its_commit_and_a_sharded_model_fetches_every_shard() {
    let server = HubServer::start();
    server.publish("org/m", "main", COMMIT_A, &fixture("gpt2"));
    server.publish("org/m", "v2", COMMIT_B, &fixture("gpt2_sharded_f64"));
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("hf");
    let out = tmp.path().join("v2.json");
    let o = cli(&server.url, &home, &[], &["logits", "--model", "org/m@v2", "--ids", "5,6,7", "--out", out.to_str().unwrap()]);
    assert_eq!(logits_json(&o, &out), local_logits("gpt2_sharded_f64", "5,6,7", tmp.path()));
    let repo = home.join("hub/models--org--m");
    assert_eq!(std::fs::read_to_string(repo.join("refs/v2")).unwrap(), COMMIT_B);
    let index = std::fs::read_to_string(fixture("gpt2_sharded_f64").join("model.safetensors.index.json")).unwrap();
    let shards: std::collections::BTreeSet<String> = serde_json::from_str::<serde_json::Value>(&index).unwrap()["weight_map"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    assert!(shards.len() > 1);
    for s in &shards {
        assert!(repo.join("snapshots").join(COMMIT_B).join(s).is_file(), "shard {s} missing");
    }
    // main is another commit with other weights; a commit hash works as a revision too.
    let out = tmp.path().join("main.json");
    let o = cli(&server.url, &home, &[], &["logits", "--model", &format!("org/m@{COMMIT_A}"), "--ids", "5,6,7", "--out", out.to_str().unwrap()]);
    assert_eq!(logits_json(&o, &out), local_logits("gpt2", "5,6,7", tmp.path()));
    // `burnlens download` fetches without running.
    let o = cli(&server.url, &home, &[], &["download", "org/m"]);
    assert!(o.status.success() && String::from_utf8_lossy(&o.stdout).contains("org/m: gpt2 model in"), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn missing_repositories_and_gated_ones_without_a_token_are_clear_errors() {
    let server = HubServer::start();
    server.publish("org/gated", "main", COMMIT_A, &fixture("pythia_like"));
    server.gate("org/gated", "secret-token");
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("hf");
    let o = cli(&server.url, &home, &[], &["info", "--model", "org/missing"]);
    assert_bad_input(&o, "org/missing: GET");
    assert_bad_input(&o, "HTTP 404: no such repository, revision or file");
    let o = cli(&server.url, &home, &[], &["info", "--model", "org/gated"]);
    assert_bad_input(&o, "HTTP 401: the repository is gated or private; accept its terms on the Hub and set HF_TOKEN");
    let o = cli(&server.url, &home, &[("HF_TOKEN", "wrong")], &["info", "--model", "org/gated"]);
    assert_bad_input(&o, "HF_TOKEN is not allowed to read this repository");
    let o = cli(&server.url, &home, &[("HF_TOKEN", "secret-token")], &["info", "--model", "org/gated"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("family:      gpt_neox"));
    // A name that is neither a directory nor a Hub id.
    let o = cli(&server.url, &home, &[], &["info", "--model", "./no/such/dir"]);
    assert_bad_input(&o, "no such model directory");
}

#[test]
fn a_dropped_connection_is_resumed_and_a_bad_hash_leaves_nothing_behind() {
    let server = HubServer::start();
    server.publish("org/flaky", "main", COMMIT_A, &fixture("qwen2_tied"));
    let size = std::fs::metadata(fixture("qwen2_tied").join("model.safetensors")).unwrap().len() as usize;
    server.set_faults(Faults { drop_after: [("model.safetensors".to_string(), size / 3)].into(), corrupt: vec![] });
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("hf");
    let repo = home.join("hub/models--org--flaky");
    let o = cli(&server.url, &home, &[], &["info", "--model", "org/flaky"]);
    assert_exit(&o, 2, "run again to resume");
    let partial: Vec<_> =
        std::fs::read_dir(repo.join("blobs")).unwrap().map(|e| e.unwrap().path()).filter(|p| p.to_string_lossy().ends_with(".incomplete")).collect();
    assert_eq!(partial.len(), 1, "the partial download is kept for resuming");
    assert_eq!(std::fs::metadata(&partial[0]).unwrap().len() as usize, size / 3);
    assert!(!repo.join("snapshots").join(COMMIT_A).join("model.safetensors").exists());
    // Second attempt: a range request from where it stopped, then a verified file.
    let o = cli(&server.url, &home, &[], &["info", "--model", "org/flaky"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(server.log().iter().any(|l| l.contains(&format!("[bytes={}-]", size / 3))), "{:?}", server.log());
    assert_eq!(
        std::fs::read(repo.join("snapshots").join(COMMIT_A).join("model.safetensors")).unwrap(),
        std::fs::read(fixture("qwen2_tied").join("model.safetensors")).unwrap()
    );

    // A corrupt file: refused, deleted, nothing in the snapshot.
    let server = HubServer::start();
    server.publish("org/corrupt", "main", COMMIT_B, &fixture("mistral_window"));
    server.set_faults(Faults { drop_after: Default::default(), corrupt: vec!["model.safetensors".into()] });
    let o = cli(&server.url, &home, &[], &["info", "--model", "org/corrupt"]);
    assert_exit(&o, 2, "sha256 is");
    assert_exit(&o, 2, "the download was deleted");
    let repo = home.join("hub/models--org--corrupt");
    let blobs: Vec<String> = std::fs::read_dir(repo.join("blobs")).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().to_string()).collect();
    let weights_hash = hub_server::sha256_hex(&std::fs::read(fixture("mistral_window").join("model.safetensors")).unwrap());
    assert!(!blobs.iter().any(|b| b.starts_with(&weights_hash)), "{blobs:?}");
    assert!(!repo.join("snapshots").join(COMMIT_B).join("model.safetensors").exists());
    // The small files that did verify stay cached.
    assert!(repo.join("snapshots").join(COMMIT_B).join("config.json").is_file());
}

#[test]
fn an_sae_in_a_folder_of_a_hub_repository_is_fetched_alone_and_then_served_from_the_cache() {
    let server = HubServer::start();
    // A release repository with one SAE per hook folder, as SAELens publishes them.
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("release");
    for (folder, src) in [("blocks.1.hook_resid_pre", "jumprelu_llama_resid"), ("blocks.2.hook_resid_pre", "topk_pythia_resid")] {
        std::fs::create_dir_all(repo.join(folder)).unwrap();
        for f in ["cfg.json", "sae_weights.safetensors"] {
            std::fs::copy(fixture("sae").join(src).join(f), repo.join(folder).join(f)).unwrap();
        }
    }
    server.publish("org/llama-saes", "main", COMMIT_A, &repo);
    let home = tmp.path().join("hf");
    let model = fixture("llama_gqa");
    let run = |spec: &str, out: &Path, env: &[(&str, &str)]| {
        cli(&server.url, &home, env, &["sae", "--model", model.to_str().unwrap(), "--sae", spec, "--ids", "5,17,33,2,90", "--out", out.to_str().unwrap()])
    };
    let (hub_out, local_out) = (tmp.path().join("hub"), tmp.path().join("local"));
    let o = run("org/llama-saes:blocks.1.hook_resid_pre", &hub_out, &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = run(fixture("sae").join("jumprelu_llama_resid").to_str().unwrap(), &local_out, &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let read = |d: &Path| -> serde_json::Value { serde_json::from_str(&std::fs::read_to_string(d.join("report.json")).unwrap()).unwrap() };
    assert_eq!(read(&hub_out)["top_features"], read(&local_out)["top_features"]);
    assert_eq!(read(&hub_out)["l0"], read(&local_out)["l0"]);
    // Only the chosen folder's two files were downloaded.
    let fetched: Vec<String> = server.log().into_iter().filter(|l| l.starts_with("GET") && l.contains("/resolve/")).collect();
    assert_eq!(fetched.len(), 2, "{fetched:?}");
    assert!(fetched.iter().all(|l| l.contains("blocks.1.hook_resid_pre/")), "{fetched:?}");
    // Offline, from the cache; a folder that was never fetched is a clear error.
    let before = server.log().len();
    let o = run("org/llama-saes:blocks.1.hook_resid_pre", &hub_out, &[("HF_HUB_OFFLINE", "1")]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(server.log().len(), before);
    assert_exit(&run("org/llama-saes:blocks.2.hook_resid_pre", &hub_out, &[("HF_HUB_OFFLINE", "1")]), 2, "has no blocks.2.hook_resid_pre/cfg.json");
    assert_exit(&run("org/llama-saes:blocks.9.hook_resid_pre", &hub_out, &[]), 2, "has no file blocks.9.hook_resid_pre/cfg.json");

    // A Gemma Scope release: the folder holds only params.npz, and the hook point comes from
    // the repository's name and the layer folder.
    let gs = tmp.path().join("gemma-scope");
    let folder = "layer_1/width_96/average_l0_5";
    std::fs::create_dir_all(gs.join(folder)).unwrap();
    let src = fixture("sae").join("gemma_scope/gemma-scope-2b-pt-res").join(folder);
    std::fs::copy(src.join("params.npz"), gs.join(folder).join("params.npz")).unwrap();
    std::fs::write(gs.join("README.md"), "not fetched").unwrap();
    server.publish("google/gemma-scope-2b-pt-res", "main", COMMIT_B, &gs);
    let (gs_hub, gs_local) = (tmp.path().join("gs-hub"), tmp.path().join("gs-local"));
    let before = server.log().len();
    let o = run(&format!("google/gemma-scope-2b-pt-res:{folder}"), &gs_hub, &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = run(src.to_str().unwrap(), &gs_local, &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(read(&gs_hub)["top_features"], read(&gs_local)["top_features"]);
    assert_eq!(read(&gs_hub)["hook_name"], "blocks.1.hook_resid_post");
    let fetched: Vec<String> = server.log()[before..].iter().filter(|l| l.starts_with("GET") && l.contains("/resolve/")).cloned().collect();
    assert_eq!(fetched.len(), 1, "{fetched:?}");
    assert!(fetched[0].contains("params.npz"), "{fetched:?}");
}

/// Every newer family loads by Hub id: the model downloaded from the stand-in computes what
/// the fixture directory does (whose logits match `transformers`).
#[test]
fn the_newer_families_load_by_hub_id() {
    let server = HubServer::start();
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("hf");
    for (i, name) in ["qwen3_qknorm", "olmo2_postnorm", "gptj_interleaved", "gemma2_softcap", "gemma3_local_rope", "phi3_fused"].iter().enumerate() {
        let repo = format!("org/{}", name.replace('_', "-"));
        server.publish(&repo, "main", if i % 2 == 0 { COMMIT_A } else { COMMIT_B }, &fixture(name));
        let out = tmp.path().join(format!("{name}.json"));
        let o = cli(&server.url, &home, &[], &["logits", "--model", &repo, "--ids", "1,2,3,4,5", "--out", out.to_str().unwrap()]);
        assert_eq!(logits_json(&o, &out), local_logits(name, "1,2,3,4,5", tmp.path()), "{name} by Hub id");
    }
}

/// Transcoder sets by Hub id, as circuit-tracer names them: a per-layer set at a repository's
/// root, a cross-layer transcoder in a folder (only its numbered files fetched), and a
/// config.yaml whose `transcoders:` entries are `hf://` URIs into another repository. Each
/// graph equals the one built from the local fixture folder; offline, the cache serves them.
#[test]
fn transcoder_sets_load_by_hub_id_and_hf_uris() {
    let server = HubServer::start();
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("hf");
    let trace = |case: &str| fixture("trace").join(case);
    server.publish("org/gpt2-transcoders", "main", COMMIT_A, &trace("gpt2").join("transcoders"));
    let clt_repo = tmp.path().join("clt-repo");
    std::fs::create_dir_all(clt_repo.join("clt")).unwrap();
    for e in std::fs::read_dir(trace("gpt2_clt").join("transcoders")).unwrap().flatten() {
        std::fs::copy(e.path(), clt_repo.join("clt").join(e.file_name())).unwrap();
    }
    std::fs::write(clt_repo.join("README.md"), "not fetched").unwrap();
    std::fs::write(clt_repo.join("clt/notes.txt"), "not fetched").unwrap();
    server.publish("org/clts", "main", COMMIT_B, &clt_repo);
    // A set that only points at another repository's files (tagged revision `v1`).
    server.publish("org/gpt2-transcoders", "v1", COMMIT_B, &trace("gpt2").join("transcoders"));
    let refs = tmp.path().join("refs");
    std::fs::create_dir_all(&refs).unwrap();
    let mut yaml =
        "model_kind: transcoder_set\nscan: burnlens-fixture-gpt2\nfeature_input_hook: hook_resid_mid\nfeature_output_hook: hook_mlp_out\ntranscoders:\n"
            .to_string();
    for i in 0..3 {
        yaml += &format!("  - \"hf://org/gpt2-transcoders/layer_{i}.safetensors?revision=v1\"\n");
    }
    std::fs::write(refs.join("config.yaml"), &yaml).unwrap();
    server.publish("org/ref-set", "main", COMMIT_A, &refs);

    let graph = |case: &str, spec: &str, name: &str, env: &[(&str, &str)]| {
        let out = tmp.path().join(name);
        let model = trace(case).join("model");
        let o = cli(
            &server.url,
            &home,
            env,
            &[
                "graph",
                "--model",
                model.to_str().unwrap(),
                "--transcoders",
                spec,
                "--ids",
                "1,17,5,60,33,2",
                "--max-n-logits",
                "3",
                "--out",
                out.to_str().unwrap(),
            ],
        );
        assert!(o.status.success(), "{spec}: {}", String::from_utf8_lossy(&o.stderr));
        let g = read_safetensors(&out.join("graph.safetensors"));
        let mut names: Vec<_> = g.keys().cloned().collect();
        names.sort();
        names.into_iter().map(|n| (n.clone(), g[&n].f32.clone(), g[&n].i64.clone())).collect::<Vec<_>>()
    };
    let local = graph("gpt2", trace("gpt2").join("transcoders").to_str().unwrap(), "local", &[]);
    assert!(!local.is_empty());
    assert_eq!(graph("gpt2", "org/gpt2-transcoders", "hub", &[]), local);
    assert_eq!(graph("gpt2", "org/ref-set", "refs", &[]), local);
    // A local config.yaml with hf:// entries fetches them too.
    assert_eq!(graph("gpt2", refs.to_str().unwrap(), "local-refs", &[]), local);
    let clt_local = graph("gpt2_clt", trace("gpt2_clt").join("transcoders").to_str().unwrap(), "clt-local", &[]);
    let before = server.log().len();
    assert_eq!(graph("gpt2_clt", "org/clts:clt", "clt-hub", &[]), clt_local);
    let fetched: Vec<String> = server.log()[before..].iter().filter(|l| l.starts_with("GET") && l.contains("/resolve/")).cloned().collect();
    assert_eq!(fetched.len(), 7, "config.yaml and six numbered files: {fetched:?}");
    assert!(fetched.iter().all(|l| l.contains("/clt/") && !l.contains("notes.txt")), "{fetched:?}");
    // Offline: everything from the cache, no request at all.
    let before = server.log().len();
    assert_eq!(graph("gpt2_clt", "org/clts:clt", "clt-offline", &[("HF_HUB_OFFLINE", "1")]), clt_local);
    assert_eq!(graph("gpt2", "org/ref-set", "refs-offline", &[("HF_HUB_OFFLINE", "1")]), local);
    assert_eq!(server.log().len(), before);
    // A repository without transcoders is a one-line error naming what is missing.
    let o = cli(
        &server.url,
        &home,
        &[],
        &[
            "graph",
            "--model",
            trace("gpt2").join("model").to_str().unwrap(),
            "--transcoders",
            "org/clts",
            "--ids",
            "1,2",
            "--out",
            tmp.path().join("x").to_str().unwrap(),
        ],
    );
    assert_exit(&o, 2, "has no file config.yaml");
}

/// `burnlens data fetch`: the corpus from a real HTTP server on 127.0.0.1
/// (`BURNLENS_DATA_URL`), written only after its sha256 checks; a different file is refused
/// with nothing written, and an unknown name lists the known ones.
#[test]
fn data_fetch_writes_a_corpus_only_after_its_hash_checks() {
    let Some(data) = shared_data() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let (good, bad) = (tmp.path().join("good"), tmp.path().join("bad"));
    std::fs::create_dir_all(&good).unwrap();
    std::fs::create_dir_all(&bad).unwrap();
    let text = std::fs::read(data.join("tinyshakespeare.txt")).unwrap();
    std::fs::write(good.join("input.txt"), &text).unwrap();
    let mut changed = text.clone();
    changed[100] ^= 1;
    std::fs::write(bad.join("input.txt"), &changed).unwrap();
    let server = HubServer::start();
    server.publish("karpathy/char-rnn", "main", COMMIT_A, &good);
    server.publish("someone/changed", "main", COMMIT_A, &bad);
    let fetch = |repo: &str, name: &str, out: &Path| {
        let url = format!("{}/{repo}/resolve/{COMMIT_A}/input.txt", server.url);
        Command::new(env!("CARGO_BIN_EXE_burnlens")).args(["data", "fetch", name, "--out"]).arg(out).env("BURNLENS_DATA_URL", url).output().unwrap()
    };
    let out = tmp.path().join("data/corpus.txt");
    let o = fetch("karpathy/char-rnn", "tinyshakespeare", &out);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("sha256 86c4e6aa"), "{}", String::from_utf8_lossy(&o.stdout));
    assert_eq!(std::fs::read(&out).unwrap(), text);
    let refused = tmp.path().join("data/refused.txt");
    let o = fetch("someone/changed", "tinyshakespeare", &refused);
    assert_exit(&o, 2, "expected 86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed; not saved");
    assert!(!refused.exists(), "a file that failed its hash must not be written");
    assert_exit(&fetch("karpathy/char-rnn", "tinystories", &refused), 2, "unknown dataset; known: tinyshakespeare");
}
