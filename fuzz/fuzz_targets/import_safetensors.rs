//! Any bytes as `model.safetensors`: a model or an error, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    let dir = common::model_dir("model.safetensors", data);
    let _ = burnlens_hf::load_model(&dir, &burn::tensor::Device::flex());
});
