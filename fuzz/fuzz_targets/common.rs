//! A model directory with a tiny GPT-2 config and the fuzzed bytes as its weights file.
use std::path::PathBuf;

pub const CONFIG: &str = r#"{"model_type": "gpt2", "vocab_size": 16, "n_positions": 8, "n_embd": 8, "n_layer": 1, "n_head": 2}"#;

pub fn model_dir(weights_name: &str, bytes: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("burnlens-fuzz-{}-{weights_name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.json"), CONFIG).unwrap();
    for stale in ["model.safetensors", "pytorch_model.bin"] {
        let _ = std::fs::remove_file(dir.join(stale));
    }
    std::fs::write(dir.join(weights_name), bytes).unwrap();
    dir
}
