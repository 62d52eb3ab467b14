//! Parity with Hugging Face `transformers`: every fixture, on every test backend, against
//! the logits, attention patterns, residual stream and loss HF recorded
//! (`scripts/gen_fixtures.py`).

mod common;

use burnlens::hf::load_model;
use burnlens::model::HookPoint;
use burnlens::model::{Hooks, Sampling, generate, next_token_loss};
use common::*;

const LOGIT_TOL: f32 = 1e-4;
const PATTERN_TOL: f32 = 1e-5;

fn check(name: &str) {
    let dir = fixture(name);
    let expected = read_safetensors(&dir.join("expected.safetensors"));
    let ids = &expected["ids"].i64;
    for (backend, device) in backends() {
        let loaded = load_model(&dir, &device).unwrap_or_else(|e| panic!("{name} on {backend}: {e}"));
        let model = &loaded.model;
        let n_layers = model.config.n_layers();
        let mut hooks = Hooks::capture(|n| n.name().ends_with("hook_pattern") || n.name().ends_with("hook_resid_pre") || n == "ln_final.hook_normalized");
        let input = model.ids_tensor(ids);
        let logits = model.forward_hooked(input.clone(), &mut hooks);
        let loss = next_token_loss(logits.clone(), input).into_scalar::<f32>() as f64 as f32;
        let logits: Vec<f32> = logits.into_data().try_into_vec_as::<f32>().unwrap();

        // Without hooks the fused kernels run (LayerNorm, attention): same logits.
        let fast: Vec<f32> = model.forward(model.ids_tensor(ids)).into_data().try_into_vec_as::<f32>().unwrap();
        let d_fast = max_abs_diff(&fast, &expected["logits"].f32);
        assert!(d_fast <= LOGIT_TOL, "{name} on {backend}: fused path max |Δlogit| {d_fast:e}");
        let d_logit = max_abs_diff(&logits, &expected["logits"].f32);
        let d_loss = (loss - expected["loss"].f32[0]).abs();
        let mut d_pattern = 0f32;
        let mut d_resid = 0f32;
        for l in 0..n_layers {
            let p = hooks.cache[&HookPoint::parse(&format!("blocks.{l}.attn.hook_pattern")).unwrap()].to_vec();
            d_pattern = d_pattern.max(max_abs_diff(&p, &expected[&format!("pattern.{l}")].f32));
            let r = hooks.cache[&HookPoint::parse(&format!("blocks.{l}.hook_resid_pre")).unwrap()].to_vec();
            let e = &expected[&format!("resid_pre.{l}")].f32;
            d_resid = d_resid.max(max_abs_diff(&r, e) / max_abs(e).max(1.0));
        }
        // HF's last hidden state is the final norm's output (after an RMSNorm's gain).
        let f = model
            .ln_final
            .finish(hooks.cache[&HookPoint::parse("ln_final.hook_normalized").unwrap()].rank3().unwrap())
            .into_data()
            .try_into_vec_as::<f32>()
            .unwrap();
        d_resid = d_resid.max(max_abs_diff(&f, &expected["final"].f32) / max_abs(&expected["final"].f32).max(1.0));
        println!(
            "parity {name:<20} {backend:<8} max|dlogit| {d_logit:.2e} (fused {d_fast:.2e})  max|dpattern| {d_pattern:.2e}  max rel|dresid| {d_resid:.2e}  |dloss| {d_loss:.2e}"
        );
        assert!(d_logit <= LOGIT_TOL, "{name} on {backend}: max |Δlogit| {d_logit:e} > {LOGIT_TOL:e}");
        assert!(d_pattern <= PATTERN_TOL, "{name} on {backend}: max |Δpattern| {d_pattern:e} > {PATTERN_TOL:e}");
        assert!(d_resid <= 1e-5, "{name} on {backend}: residual stream differs by {d_resid:e} (relative)");
        assert!(d_loss <= 1e-4, "{name} on {backend}: |Δloss| {d_loss:e}");

        // Greedy decoding with the KV cache against HF's full-forward greedy decoding.
        if let Some(want) = expected.get("greedy") {
            let prompt = &ids[..GREEDY_PROMPT];
            let s = Sampling { max_new_tokens: want.i64.len(), ..Sampling::default() };
            let got = generate(model, prompt, &s).unwrap();
            assert_eq!(got, want.i64, "{name} on {backend}: greedy decoding with the KV cache differs from HF's");
        }
    }
}

/// Prompt length of the greedy continuations the generator records.
const GREEDY_PROMPT: usize = 8;

#[test]
fn gpt2() {
    check("gpt2");
}

#[test]
fn gpt2_inverse_layer_scale_and_n_inner() {
    check("gpt2_inverse_layer");
}

#[test]
fn gpt_neo_local_window_shorter_than_sequence() {
    check("gpt_neo_local");
}

#[test]
fn gpt2_legacy_unprefixed_pytorch_bin_with_buffers() {
    check("gpt2_legacy_bin");
}

#[test]
fn gpt2_f16_safetensors() {
    check("gpt2_f16");
}

#[test]
fn gpt_neo_bf16_all_local() {
    check("gpt_neo_bf16");
}

#[test]
fn gpt2_sharded_f64() {
    check("gpt2_sharded_f64");
}

#[test]
fn pythia_like_partial_rotary_parallel_residual_untied() {
    check("pythia_like");
}

#[test]
fn gpt_neox_sequential_residual_half_rotary() {
    check("neox_sequential");
}

#[test]
fn llama_grouped_query_attention_llama3_rope_untied() {
    check("llama_gqa");
}

#[test]
fn qwen2_qkv_biases_tied_embeddings() {
    check("qwen2_tied");
}

#[test]
fn mistral_sliding_window_shorter_than_sequence_one_kv_head() {
    check("mistral_window");
}

#[test]
fn qwen3_per_head_qk_norm_independent_head_dim_sliding_window() {
    check("qwen3_qknorm");
}

#[test]
fn olmo2_post_norms_whole_projection_qk_norm() {
    check("olmo2_postnorm");
}

#[test]
fn gptj_interleaved_partial_rotary_shared_norm_parallel_lm_head_bias() {
    check("gptj_interleaved");
}

#[test]
fn gemma2_softcaps_sandwich_norms_scaled_embedding_query_pre_attn_scalar() {
    check("gemma2_softcap");
}

#[test]
fn gemma3_qk_norm_local_rope_base_linear_scaled_global_rope() {
    check("gemma3_local_rope");
}

#[test]
fn phi3_fused_qkv_and_gate_up_partial_rotary_sliding_window() {
    check("phi3_fused");
}

/// The fixtures must exercise what they claim to: a wrong scale, mask or transpose would
/// move the patterns, so they must be peaked, and the local fixture's window must bite.
#[test]
fn fixtures_are_discriminating() {
    for name in FIXTURES {
        let e = read_safetensors(&fixture(name).join("expected.safetensors"));
        let p = &e["pattern.0"];
        let (t, rows) = (p.shape[2], p.f32.len() / p.shape[2]);
        let mean_max: f32 = p.f32.chunks(t).map(|r| r.iter().copied().fold(0.0, f32::max)).sum::<f32>() / rows as f32;
        assert!(mean_max > 0.4, "{name}: attention too flat to catch errors (mean row max {mean_max})");
    }
    let loaded = load_model(&fixture("gpt_neo_local"), &burn::tensor::Device::flex()).unwrap();
    let e = read_safetensors(&fixture("gpt_neo_local").join("expected.safetensors"));
    let p = &e["pattern.1"];
    let t = p.shape[2];
    let burnlens::model::AttentionSpan::Local(w) = loaded.model.config.spans[1] else { panic!("layer 1 should be local") };
    assert!(w < t, "window {w} must be shorter than the sequence {t}");
    // Row t-1 of every head must be exactly zero outside the window.
    for h in 0..p.shape[0] {
        let row = &p.f32[(h * t + t - 1) * t..(h * t + t) * t];
        assert!(row[..t - w].iter().all(|&x| x == 0.0), "head {h}: HF attended outside the window");
    }
}

/// Models trained and exported by burnlens, loaded by `transformers`'
/// `AutoModelForCausalLM.from_pretrained` in the fixture generator: HF's logits on the
/// export must equal burnlens's.
#[test]
fn burnlens_exports_load_in_transformers_with_the_same_logits() {
    for name in EXPORT_FIXTURES {
        check(name);
    }
}
