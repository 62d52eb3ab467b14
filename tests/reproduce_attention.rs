//! Runs `examples/reproduce_attention.rs` on every fixture and layer: the pattern and the
//! attention output rebuilt by hand from W_Q, W_K, W_V, W_O must match the model.

mod common;

#[path = "../examples/reproduce_attention.rs"]
#[allow(dead_code)]
mod reproduce_attention;

use burn::tensor::Device;
use burnlens::hf::load_model;
use common::*;

#[test]
fn attention_rebuilt_by_hand_matches_the_model_on_every_fixture() {
    let device = Device::flex();
    for name in all_fixtures() {
        let dir = fixture(name);
        let ids = read_safetensors(&dir.join("expected.safetensors"))["ids"].i64.clone();
        let n_layers = load_model(&dir, &device).unwrap().model.config.n_layers();
        for layer in 0..n_layers {
            let r = reproduce_attention::reproduce(&dir, layer, &ids, &device).unwrap();
            println!("reproduce {name:<20} layer {layer}: pattern {:.2e}  output {:.2e}", r.max_pattern_diff, r.max_output_diff);
            assert!(r.max_pattern_diff <= 1e-5, "{name} layer {layer}: pattern differs by {:e}", r.max_pattern_diff);
            assert!(r.max_output_diff <= 1e-5, "{name} layer {layer}: output differs by {:e}", r.max_output_diff);
        }
    }
}

#[test]
fn bad_layer_is_an_error_not_a_panic() {
    let e = reproduce_attention::reproduce(&fixture("gpt2"), 9, &[1, 2], &Device::flex()).unwrap_err();
    assert_eq!(e, "layer 9 does not exist; the model has 3 layers");
}
