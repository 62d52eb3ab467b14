//! Any text as a run config, with and without an override: an error or a config.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let path = std::path::Path::new("run.toml");
        let _ = burnlens_train::RunConfig::parse(text, path, &[]);
        if let Some((head, tail)) = text.split_once('\n') {
            let _ = burnlens_train::RunConfig::parse(tail, path, &[head.to_string()]);
        }
    }
});
