//! Any bytes as `config.json`: an error or a config, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = burnlens_hf::parse_config(text, std::path::Path::new("config.json"));
    }
});
