//! Bad input beyond the basics, numerics at full context, concurrent inference, and
//! training that survives being killed.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use burn::tensor::Device;
use burnlens::hf::load_model;
use burnlens::model::{AttentionSpan, AttnHook, HookPoint, Hooks, LayerHook, Transformer, TransformerConfig};
use common::*;

/// Replace the safetensors header of `file` by `header` (the data stays).
fn set_header(file: &Path, header: &[u8]) {
    let bytes = std::fs::read(file).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header);
    out.extend_from_slice(&bytes[8 + n..]);
    std::fs::write(file, out).unwrap();
}

fn header_of(file: &Path) -> serde_json::Value {
    let bytes = std::fs::read(file).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    serde_json::from_slice(&bytes[8..8 + n]).unwrap()
}

#[test]
fn safetensors_headers_that_lie() {
    let m = |dir: &Path| dir.to_str().unwrap().to_string();
    // A header length pointing past the end of the file.
    let (_t, dir) = copy_fixture("gpt2");
    let file = dir.join("model.safetensors");
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[..8].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
    std::fs::write(&file, &bytes).unwrap();
    assert_exit(&burnlens(&["info", "--model", &m(&dir)]), 2, "model.safetensors: not a readable safetensors file");

    // Offsets beyond the data.
    let (_t, dir) = copy_fixture("gpt2");
    let file = dir.join("model.safetensors");
    let mut h = header_of(&file);
    h["transformer.ln_f.bias"]["data_offsets"] = serde_json::json!([0, 1_000_000_000]);
    set_header(&file, h.to_string().as_bytes());
    assert_exit(&burnlens(&["info", "--model", &m(&dir)]), 2, "not a readable safetensors file");

    // A header that is not JSON.
    let (_t, dir) = copy_fixture("gpt2");
    set_header(&dir.join("model.safetensors"), b"{this is not json at all}");
    assert_exit(&burnlens(&["info", "--model", &m(&dir)]), 2, "not a readable safetensors file");
}

#[test]
fn non_finite_weights_load_with_a_warning_naming_the_tensor() {
    let (_t, dir) = copy_fixture("gpt2");
    let file = dir.join("model.safetensors");
    let h = header_of(&file);
    let [start, _] = [h["transformer.h.0.mlp.c_fc.bias"]["data_offsets"][0].as_u64().unwrap(), 0];
    let bytes = std::fs::read(&file).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut bytes = bytes;
    let at = 8 + n + start as usize;
    bytes[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    bytes[at + 8..at + 12].copy_from_slice(&f32::INFINITY.to_le_bytes());
    std::fs::write(&file, bytes).unwrap();
    let o = burnlens(&["info", "--model", dir.to_str().unwrap()]);
    assert!(o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("warning: tensor `transformer.h.0.mlp.c_fc.bias` has 2 non-finite values (first at flat index 0: NaN)"), "{err}");
}

#[test]
fn inconsistent_configs_are_refused_with_exit_2() {
    let cases: &[(&str, &str)] = &[
        (r#"{"model_type": "gpt2", "n_embd": 30, "n_head": 4}"#, "`n_embd` = 30 is not divisible by n_head = 4"),
        (r#"{"model_type": "gpt_neo", "num_layers": 2, "window_size": 0, "attention_types": [[["local"], 2]]}"#, "`window_size` is 0"),
        (r#"{"model_type": "gpt2", "n_positions": -5}"#, "`n_positions` must be a non-negative integer, found -5"),
        (r#"{"model_type": "gpt_neo", "num_layers": 2, "attention_types": [[["global", "local"], 3]]}"#, "describes 6 layers but num_layers is 2"),
        (r#"{"n_layer": 2}"#, "`model_type` is missing"),
        (r#"["not", "an", "object"]"#, "expected a JSON object"),
    ];
    for (config, needle) in cases {
        let (_t, dir) = copy_fixture("gpt2");
        std::fs::write(dir.join("config.json"), config).unwrap();
        assert_exit(&burnlens(&["info", "--model", dir.to_str().unwrap()]), 2, needle);
    }
}

/// Full context: finite logits, pattern rows summing to one, masked entries exactly zero.
fn check_full_context(model: &Transformer, layers: &[usize]) {
    let t = model.config.n_ctx;
    let ids: Vec<i64> = (0..t).map(|i| ((i * 7919) % model.config.vocab_size) as i64).collect();
    let points: Vec<HookPoint> = layers.iter().map(|&l| AttnHook::Pattern.at(l)).collect();
    let mut hooks = Hooks::capture(|p| points.contains(&p));
    let logits = model.forward_hooked(model.ids_tensor(&ids), &mut hooks);
    let logits: Vec<f32> = logits.into_data().try_into_vec_as().unwrap();
    assert!(logits.iter().all(|x| x.is_finite()), "non-finite logits at {t} tokens");
    for &l in layers {
        let span = model.config.spans[l];
        let p = hooks.cache[&AttnHook::Pattern.at(l)].to_vec();
        for (row_index, row) in p.chunks(t).enumerate() {
            let q = row_index % t;
            let sum: f64 = row.iter().map(|&x| x as f64).sum();
            assert!((sum - 1.0).abs() < 1e-4, "layer {l} row {q} sums to {sum}");
            for (k, &x) in row.iter().enumerate() {
                if !span.allows(q, k) {
                    assert_eq!(x, 0.0, "layer {l} ({span:?}) query {q} key {k} must be masked");
                }
            }
        }
    }
}

#[test]
fn gpt2_small_shape_at_its_full_context_of_1024() {
    let cfg = TransformerConfig { vocab_size: 50257, ..TransformerConfig::gpt2_like(50257, 1024, 768, 12, 12) };
    let model = cfg.init(&Device::flex()).unwrap();
    check_full_context(&model, &[0, 11]);
}

#[test]
fn gpt_neo_shape_with_local_layers_at_2048() {
    let mut cfg = TransformerConfig::gpt2_like(50257, 2048, 768, 4, 12);
    cfg.spans = vec![AttentionSpan::Global, AttentionSpan::Local(256), AttentionSpan::Global, AttentionSpan::Local(256)];
    cfg.score_scale = burnlens::model::ScoreScale::None;
    cfg.qkv_bias = false;
    let model = cfg.init(&Device::flex()).unwrap();
    check_full_context(&model, &[0, 1]);
}

/// `Transformer` is `Send + Sync`: threads can share one model for inference.
#[test]
fn parallel_forward_passes_agree() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Transformer>();
    let model = load_model(&fixture("gpt_neo_local"), &Device::flex()).unwrap().model;
    let ids: Vec<i64> = (0..24).map(|i| (i * 13 % 128) as i64).collect();
    let reference: Vec<f32> = model.forward(model.ids_tensor(&ids)).into_data().try_into_vec_as().unwrap();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..6)
            .map(|_| s.spawn(|| (0..5).map(|_| model.forward(model.ids_tensor(&ids)).into_data().try_into_vec_as::<f32>().unwrap()).collect::<Vec<_>>()))
            .collect();
        for h in handles {
            for got in h.join().unwrap() {
                assert_eq!(got, reference, "a concurrent forward pass differed");
            }
        }
    });
}

const TINY: &str = r#"
[model]
n_layers = 2
n_heads = 2
d_model = 32
context = 16
[data]
kind = "repeated_tokens"
vocab = 20
[training]
batch_size = 4
block_size = 16
steps = 400
lr_decay_steps = 400
warmup_steps = 2
eval_interval = 1000
eval_batches = 1
checkpoint_interval = 3
[output]
dir = "RUN"
"#;

/// Write [`TINY`] to `cfg` with its run directory set to `run` and `steps` training steps
/// (also the decay length).
fn write_tiny(cfg: &Path, run: &Path, steps: usize) {
    let text = TINY.replace("\"RUN\"", &format!("{:?}", run.display().to_string())).replace("steps = 400", &format!("steps = {steps}"));
    std::fs::write(cfg, text).unwrap();
}

/// Train the config at `cfg` to the end through the CLI; the step of its last checkpoint.
fn train_tiny(cfg: &Path, run: &Path) -> usize {
    let o = burnlens(&["train", "--config", cfg.to_str().unwrap(), "--quiet"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    burnlens::train::load_run(run, &Device::flex()).unwrap().state.step
}

#[cfg(unix)]
#[test]
fn sigkill_at_random_moments_always_leaves_a_loadable_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let cfg = tmp.path().join("run.toml");
    write_tiny(&cfg, &run, 400);
    let mut rng = burnlens::model::Rng::new(42);
    let mut last_step = 0;
    for round in 0..8 {
        let args: Vec<String> = if !run.join("checkpoints/LATEST").exists() {
            vec!["train".into(), "--config".into(), cfg.display().to_string(), "--quiet".into()]
        } else {
            vec!["train".into(), "--resume".into(), run.display().to_string(), "--quiet".into()]
        };
        let mut child = Command::new(env!("CARGO_BIN_EXE_burnlens")).args(&args).stderr(std::process::Stdio::null()).spawn().unwrap();
        // Let it run for a random while (checkpoints come every 3 steps), then kill -9.
        std::thread::sleep(std::time::Duration::from_millis(150 + rng.below(600)));
        let _ = child.kill();
        let _ = child.wait();
        // Whatever moment it died at, the latest complete checkpoint loads.
        if run.join("checkpoints/LATEST").exists() {
            let loaded = burnlens::train::load_run(&run, &Device::flex()).unwrap_or_else(|e| panic!("round {round}: {e}"));
            assert!(loaded.state.step >= last_step, "checkpoints went backwards");
            last_step = loaded.state.step;
        }
    }
    // And --resume finishes the run from there.
    let o = burnlens(&["train", "--resume", run.to_str().unwrap(), "--quiet"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(burnlens::train::load_run(&run, &Device::flex()).unwrap().state.step, 400);
}

/// Block writes into `dir`: permissions for ordinary users, the immutable attribute for
/// root. Returns an undo command, or `None` if neither works here.
#[cfg(unix)]
fn block_writes(dir: &Path) -> Option<Box<dyn Fn()>> {
    use std::os::unix::fs::PermissionsExt;
    let writable = || {
        let probe = dir.join(".probe");
        let ok = std::fs::write(&probe, b"x").is_ok();
        let _ = std::fs::remove_file(&probe);
        ok
    };
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o500)).unwrap();
    let d = dir.to_path_buf();
    if !writable() {
        return Some(Box::new(move || std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap()));
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let _ = Command::new("chattr").arg("+i").arg(dir).status();
    if !writable() {
        return Some(Box::new(move || {
            let _ = Command::new("chattr").arg("-i").arg(&d).status();
        }));
    }
    None
}

#[cfg(unix)]
#[test]
fn an_unwritable_run_directory_is_an_error_that_keeps_the_last_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let cfg = tmp.path().join("run.toml");
    write_tiny(&cfg, &run, 6);
    let before = train_tiny(&cfg, &run);
    let ckpts = run.join("checkpoints");
    let Some(undo) = block_writes(&ckpts) else {
        panic!("could not make {} unwritable (neither permissions nor chattr +i work here)", ckpts.display());
    };
    let o = burnlens(&["train", "--resume", run.to_str().unwrap(), "--set", "training.steps=9", "--quiet"]);
    undo();
    assert_exit(&o, 2, "checkpoints");
    assert_eq!(burnlens::train::load_run(&run, &Device::flex()).unwrap().state.step, before, "the previous checkpoint must survive");
}

/// A real full disk (needs the right to mount a tmpfs, as root in CI; skipped with a note
/// elsewhere). A first run writes a checkpoint; then the disk is filled so that less than one
/// checkpoint's worth of space is left, and the resumed run must fail cleanly, naming the lack
/// of space, while the last complete checkpoint stays loadable.
#[cfg(target_os = "linux")]
#[test]
fn a_full_disk_keeps_the_last_complete_checkpoint() {
    use std::io::Write;
    let tmp = tempfile::tempdir().unwrap();
    let mnt = tmp.path().join("small");
    std::fs::create_dir(&mnt).unwrap();
    let mounted =
        Command::new("mount").args(["-t", "tmpfs", "-o", "size=8m", "tmpfs"]).arg(&mnt).stderr(std::process::Stdio::null()).status().is_ok_and(|s| s.success());
    if !mounted {
        missing_prerequisite("cannot mount a small tmpfs here (not root)");
        return;
    }
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let _guard = Unmount(mnt.clone());
    let run = mnt.join("run");
    let cfg = tmp.path().join("run.toml");
    write_tiny(&cfg, &run, 6);
    let before = train_tiny(&cfg, &run);
    assert_eq!(before, 6);
    let ckpt_bytes: u64 = walk_size(&run.join("checkpoints"));
    assert!(ckpt_bytes > 64 * 1024, "a checkpoint of this model is well over 64 kB, got {ckpt_bytes}");

    // Fill the disk completely, then free a quarter of one checkpoint.
    let filler_path = mnt.join("filler");
    let mut filler = std::fs::File::create(&filler_path).unwrap();
    let block = vec![0xA5u8; 64 * 1024];
    let mut written = 0u64;
    loop {
        match filler.write(&block) {
            Ok(0) => break,
            Ok(n) => written += n as u64,
            Err(e) if e.raw_os_error() == Some(28) => break,
            Err(e) => panic!("filling the tmpfs: {e}"),
        }
    }
    filler.set_len(written.saturating_sub(ckpt_bytes / 4)).unwrap();
    filler.sync_all().unwrap();
    drop(filler);

    let o = burnlens(&["train", "--resume", run.to_str().unwrap(), "--set", "training.steps=60", "--quiet"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "a full disk cannot hold another checkpoint");
    assert!(err.contains("No space left on device") || err.contains("space"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let loaded = burnlens::train::load_run(&run, &Device::flex()).unwrap();
    assert_eq!(loaded.state.step, before, "the checkpoint written before the disk filled survives");
}

#[cfg(target_os = "linux")]
fn walk_size(dir: &std::path::Path) -> u64 {
    let mut total = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let m = e.metadata().unwrap();
        total += if m.is_dir() { walk_size(&e.path()) } else { m.len() };
    }
    total
}
