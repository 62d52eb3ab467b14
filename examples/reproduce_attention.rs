//! Reproduce one attention layer by hand from its extracted matrices.
//!
//! The classic exercise: pull W_Q, W_K, W_V, W_O (and biases) of one layer out of a loaded
//! model, form each head's QK = W_Q W_Kᵀ and OV = W_V W_O, rebuild the attention pattern and
//! the layer's output from them, and compare with the model's own forward pass. Rotary
//! models (GPT-NeoX, Llama, Qwen2, Mistral) rotate queries and keys by their positions
//! before the dot product, so there the queries and keys are formed, rotated by hand
//! (rotate-half: the pair `(x_i, x_{i+half})` turns by `θ_i = p · base^(-2i/dims)`) and
//! multiplied (GPT-J pairs neighbouring dimensions instead: `(x_2i, x_2i+1)`); grouped keys
//! and values arrive already repeated per query head. The newer families add steps that are
//! written out here too: QK-norm (Qwen3, Gemma 3: an RMSNorm of each head's query and key;
//! OLMo 2: of the whole projection), soft-capped scores (Gemma 2: `c tanh(s / c)`), a norm
//! after attention (Gemma's `ln1_post`; OLMo 2's only norm, `ln1`, whose attention reads the
//! residual stream itself), and Gemma's score scale `query_pre_attn_scalar^-1/2`.
//!
//! ```text
//! cargo run --example reproduce_attention -- MODEL_DIR [LAYER] [IDS]
//! cargo run --example reproduce_attention -- tests/fixtures/gpt_neo_local 1 5,17,3,99,42,7,8,1
//! cargo run --example reproduce_attention -- tests/fixtures/llama_gqa 2
//! ```

use std::path::Path;

use burn::tensor::activation::softmax;
use burn::tensor::{Bool, Device, Tensor, TensorData};
use burnlens::hf::load_model;
use burnlens::model::{AttnHook, BlockHook, Hooks, LayerHook, MASKED_SCORE, NormHook, NormPlacement, NormSite, QkNorm};

/// Largest differences between the hand-built and the model's own results.
#[derive(Debug)]
pub struct Reproduction {
    pub max_pattern_diff: f32,
    pub max_output_diff: f32,
    pub n_heads: usize,
}

/// Rebuild layer `layer`'s attention on token ids `ids` of the model in `dir`.
pub fn reproduce(dir: &Path, layer: usize, ids: &[i64], device: &Device) -> Result<Reproduction, String> {
    let model = load_model(dir, device).map_err(|e| e.to_string())?.model;
    model.check_ids(ids).map_err(|e| e.to_string())?;
    let n_layers = model.config.n_layers();
    if layer >= n_layers {
        return Err(format!("layer {layer} does not exist; the model has {n_layers} layers"));
    }

    // What the model itself computes: the attention's input (ln1 output), pattern and output.
    let names = [NormHook::Normalized.of(NormSite::Ln1(layer)), AttnHook::Pattern.at(layer), BlockHook::AttnOut.at(layer), BlockHook::ResidPre.at(layer)];
    let mut hooks = Hooks::capture_points(&names);
    model.forward_hooked(model.ids_tensor(ids), &mut hooks);
    let cfg = &model.config;
    let post_norms = cfg.norm_placement == NormPlacement::Post;
    // hook_normalized is before the norm's gain and bias (as in TransformerLens): `finish`
    // applies them, giving the attention's input. With post-norms attention reads the stream.
    let x: Tensor<2> = if post_norms {
        hooks.cache[&names[3]].rank3().unwrap().squeeze_dim(0)
    } else {
        model.blocks[layer].ln1.finish(hooks.cache[&names[0]].rank3().unwrap().squeeze_dim(0)) // [pos, d_model]
    };
    let model_pattern: Tensor<3> = hooks.cache[&names[1]].rank4().unwrap().squeeze_dim(0); // [head, q, k]
    let model_out: Tensor<2> = hooks.cache[&names[2]].rank3().unwrap().squeeze_dim(0); // [pos, d_model]

    // The layer's matrices, per head, in x @ W form.
    let attn = &model.blocks[layer].attn;
    let w = burnlens::lens::head_weights(attn);
    let scale = model.config.score_factor(layer) as f32;
    let span = model.config.spans[layer];
    let t = ids.len();
    let d_model = model.config.d_model;

    // Hidden entries: later keys, and keys outside a local window.
    let hidden: Vec<bool> = (0..t).flat_map(|q| (0..t).map(move |k| !span.allows(q, k))).collect();
    let hidden = Tensor::<2, Bool>::from_data(TensorData::new(hidden, [t, t]), device);

    // QK-norm: an RMSNorm (no centring) of each query and key before rotary, over one head
    // (`[d_head]` gain) or over all heads at once (`[heads * d_head]` gain).
    let eps = cfg.layer_norm_eps;
    let rms = |v: Tensor<2>| (v.clone().square().mean_dim(1) + eps).sqrt(); // [pos, 1]
    let all_q: Vec<Tensor<2>> =
        (0..attn.n_heads).map(|h| x.clone().matmul(w.w_q.clone().narrow(0, h, 1).squeeze_dim(0)) + w.b_q.clone().narrow(0, h, 1)).collect();
    let all_k: Vec<Tensor<2>> =
        (0..attn.n_heads).map(|h| x.clone().matmul(w.w_k.clone().narrow(0, h, 1).squeeze_dim(0)) + w.b_k.clone().narrow(0, h, 1)).collect();
    // Whole-projection norms: the scale over every head (keys repeated per query head have
    // the same mean square as the key heads themselves).
    let whole_q = rms(Tensor::cat(all_q.clone(), 1));
    let whole_k = rms(Tensor::cat(all_k.clone(), 1));
    let group = attn.n_heads / attn.n_kv_heads;
    let qk_norm = |v: Tensor<2>, h: usize, is_q: bool| -> Tensor<2> {
        let dh = cfg.d_head;
        let (norm, whole) = if is_q { (&attn.q_norm, &whole_q) } else { (&attn.k_norm, &whole_k) };
        match (cfg.qk_norm, norm) {
            (Some(QkNorm::PerHead), Some(n)) => v.clone() / rms(v) * n.weight.val().reshape([1, dh]),
            (Some(QkNorm::Whole), Some(n)) => {
                let slot = if is_q { h } else { h / group };
                v / whole.clone() * n.weight.val().narrow(0, slot * dh, dh).reshape([1, dh])
            }
            _ => v,
        }
    };

    let mut max_pattern_diff = 0f32;
    let mut out = w.b_o.clone().reshape([1, d_model]).expand([t, d_model]); // b_O
    for h in 0..attn.n_heads {
        let head = |m: &Tensor<3>| -> Tensor<2> { m.clone().narrow(0, h, 1).squeeze_dim(0) };
        let row = |b: &Tensor<2>| -> Tensor<2> { b.clone().narrow(0, h, 1) }; // [1, d_head]
        let (w_q, w_k, w_v, w_o) = (head(&w.w_q), head(&w.w_k), head(&w.w_v), head(&w.w_o));
        let (b_q, b_k, b_v) = (row(&w.b_q), row(&w.b_k), row(&w.b_v));

        let scores = match cfg.rotary_for(layer) {
            None if cfg.qk_norm.is_none() => {
                // Scores from the bilinear form QK = W_Q W_Kᵀ [d_model, d_model]:
                //   (x W_Q + b_Q)(x W_K + b_K)ᵀ = x QK xᵀ + x W_Q b_Kᵀ + b_Q W_Kᵀ xᵀ + b_Q b_Kᵀ
                let qk = w_q.clone().matmul(w_k.clone().transpose());
                x.clone().matmul(qk).matmul(x.clone().transpose())
                    + x.clone().matmul(w_q).matmul(b_k.clone().transpose()) // [t, 1], same for every key
                    + b_q.clone().matmul(w_k.transpose()).matmul(x.clone().transpose()) // [1, t]
                    + b_q.matmul(b_k.transpose()) // [1, 1]
            }
            rot => {
                let (q, k) = (qk_norm(all_q[h].clone(), h, true), qk_norm(all_k[h].clone(), h, false));
                let (q, k) = match rot {
                    Some(rot) => (rotate_by_hand(q, rot), rotate_by_hand(k, rot)),
                    None => (q, k),
                };
                q.matmul(k.transpose())
            }
        };
        let scores = match cfg.attn_softcap {
            Some(c) => ((scores * scale) / c).tanh() * c,
            None => scores * scale,
        };
        let pattern = softmax(scores.mask_fill(hidden.clone(), MASKED_SCORE), 1);
        let theirs: Tensor<2> = model_pattern.clone().narrow(0, h, 1).squeeze_dim(0);
        max_pattern_diff = max_pattern_diff.max((pattern.clone() - theirs).abs().max().into_scalar::<f32>());

        // Output through OV = W_V W_O [d_model, d_model]. Pattern rows sum to one, so the
        // value bias contributes b_V W_O to every position.
        let ov = w_v.matmul(w_o.clone());
        out = out + pattern.matmul(x.clone()).matmul(ov) + b_v.matmul(w_o);
    }
    // A norm after attention (Gemma's ln1_post, OLMo 2's ln1) acts on the whole output.
    let after = match (&model.blocks[layer].ln1_post, post_norms) {
        (Some(n), _) => Some(n),
        (None, true) => Some(&model.blocks[layer].ln1),
        (None, false) => None,
    };
    if let Some(n) = after {
        out = out.clone() / rms(out) * n.weight.val().reshape([1, d_model]);
    }
    let max_output_diff = (out - model_out).abs().max().into_scalar::<f32>();
    Ok(Reproduction { max_pattern_diff, max_output_diff, n_heads: attn.n_heads })
}

/// Rotate the rows of `x: [pos, d_head]` (row `p` is position `p`) as rotary embeddings do:
/// for `i < half`, `(x_i, x_{i+half}) -> (x_i cos θ - x_{i+half} sin θ, x_{i+half} cos θ + x_i sin θ)`
/// with `θ = p · f_i`; the dimensions past `2 half` pass through. The frequencies `f_i` are
/// `base^(-2i/dims)`, rescaled when the checkpoint asks for a rope scaling.
/// GPT-J's interleaved form turns the neighbours `(x_2i, x_2i+1)` instead.
fn rotate_by_hand(x: Tensor<2>, rot: &burnlens::model::Rotary) -> Tensor<2> {
    let [t, dh] = x.dims();
    let half = rot.dims / 2;
    let freqs = rot.inv_freq();
    let v: Vec<f32> = x.to_data().try_into_vec_as::<f32>().unwrap();
    let mut out = v.clone();
    for p in 0..t {
        for i in 0..half {
            let theta = (p as f32 * freqs[i]) as f64;
            let (c, s) = (theta.cos() as f32, theta.sin() as f32);
            let (ia, ib) = if rot.interleaved { (2 * i, 2 * i + 1) } else { (i, i + half) };
            let (a, b) = (v[p * dh + ia], v[p * dh + ib]);
            out[p * dh + ia] = a * c - b * s;
            out[p * dh + ib] = b * c + a * s;
        }
    }
    Tensor::from_data(TensorData::new(out, [t, dh]), &x.device())
}

#[allow(dead_code)]
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(dir) = args.first() else {
        eprintln!("usage: reproduce_attention MODEL_DIR [LAYER] [IDS e.g. 1,2,3]");
        std::process::exit(2);
    };
    let layer: usize = args.get(1).map_or(0, |s| {
        s.parse().unwrap_or_else(|_| {
            eprintln!("error: LAYER must be a number, found \"{s}\"");
            std::process::exit(2)
        })
    });
    let ids: Vec<i64> = match args.get(2) {
        Some(s) => s
            .split(',')
            .map(|x| {
                x.trim().parse().unwrap_or_else(|_| {
                    eprintln!("error: IDS must be comma-separated integers, found \"{x}\"");
                    std::process::exit(2)
                })
            })
            .collect(),
        None => vec![5, 17, 3, 99, 42, 7, 8, 1, 64, 33, 12, 90, 2, 45, 11, 77],
    };
    let device = Device::default();
    match reproduce(Path::new(dir), layer, &ids, &device) {
        Ok(r) => {
            println!("layer {layer}, {} heads, {} tokens", r.n_heads, ids.len());
            println!("max |pattern(by hand) - pattern(model)|          = {:.3e}", r.max_pattern_diff);
            println!("max |attn_out(by hand) - attn_out(model)|        = {:.3e}", r.max_output_diff);
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    }
}
