//! One attention layer's weights split per head, as TransformerLens holds them (`W_Q`,
//! `W_K`, `W_V`, `W_O` and biases): what the circuit tools and the attribution graph's
//! attention read.

use burn::tensor::Tensor;
use burnlens_model::{Attention, f32_val};

/// One layer's attention weights split per head, in TransformerLens's right-multiplying
/// shapes: `q = x W_Q[h] + b_Q[h]`, and head `h` writes `z_h W_O[h]` into the residual stream.
/// With grouped-query attention the key and value weights are repeated for every query head
/// of their group, as TransformerLens does, so every tensor has `n_heads` rows.
#[derive(Debug, Clone)]
pub struct HeadWeights {
    /// `[n_heads, d_model, d_head]`
    pub w_q: Tensor<3>,
    /// `[n_heads, d_model, d_head]`
    pub w_k: Tensor<3>,
    /// `[n_heads, d_model, d_head]`
    pub w_v: Tensor<3>,
    /// `[n_heads, d_head, d_model]`
    pub w_o: Tensor<3>,
    /// `[n_heads, d_head]` (zeros when the model has no q/k/v biases)
    pub b_q: Tensor<2>,
    /// `[n_heads, d_head]`
    pub b_k: Tensor<2>,
    /// `[n_heads, d_head]`
    pub b_v: Tensor<2>,
    /// `[d_model]`
    pub b_o: Tensor<1>,
}

/// Split the fused projection into per-head `W_Q`, `W_K`, `W_V`, `W_O` and biases.
pub fn head_weights(attn: &Attention) -> HeadWeights {
    let (h, hk, dh) = (attn.n_heads, attn.n_kv_heads, attn.d_head);
    let w = f32_val(&attn.qkv.weight);
    let d = w.dims()[0];
    let device = w.device();
    // (first column, heads) of Q, K and V.
    let blocks = [(0, h), (h * dh, hk), ((h + hk) * dh, hk)];
    let part = |i: usize| {
        let (start, n) = blocks[i];
        let p: Tensor<3> = w.clone().narrow(1, start, n * dh).reshape([d, n, dh]).swap_dims(0, 1);
        if n == h { p } else { p.reshape([n, 1, d, dh]).expand([n, h / n, d, dh]).reshape([h, d, dh]) }
    };
    let bias = |i: usize| {
        let (start, n) = blocks[i];
        let b: Tensor<2> = match &attn.qkv.bias {
            Some(b) => b.val().narrow(0, start, n * dh).reshape([n, dh]),
            None => Tensor::zeros([n, dh], &device),
        };
        if n == h { b } else { b.reshape([n, 1, dh]).expand([n, h / n, dh]).reshape([h, dh]) }
    };
    let w_o = f32_val(&attn.out.weight);
    let d_out = w_o.dims()[1];
    HeadWeights {
        w_q: part(0),
        w_k: part(1),
        w_v: part(2),
        w_o: w_o.reshape([h, dh, d_out]),
        b_q: bias(0),
        b_k: bias(1),
        b_v: bias(2),
        b_o: attn.out.bias.as_ref().map_or_else(|| Tensor::zeros([d_out], &device), |b| b.val()),
    }
}
