//! Per-head circuits of a model, in TransformerLens's right-multiplying convention:
//! `QK = W_Q W_Kᵀ` (a query residual `x_q` and key residual `x_k` score `x_q QK x_kᵀ`) and
//! `OV = W_V W_O` (a head moves `x_k OV` into the residual stream), each `d_model × d_model`
//! of rank `d_head`, kept factored.

use burn::tensor::Tensor;
use burnlens_model::{HeadWeights, Transformer};

use crate::factored::{FactoredMatrix, copying_score};

/// Every layer's per-head weights (`W_Q, W_K, W_V: [n_heads, d_model, d_head]`,
/// `W_O: [n_heads, d_head, d_model]`, biases).
pub fn all_head_weights(model: &Transformer) -> Vec<HeadWeights> {
    model.blocks.iter().map(|b| b.attn.head_weights()).collect()
}

/// `W_E [vocab, d_model]`.
pub fn w_e(model: &Transformer) -> Tensor<2> {
    burnlens_model::f32_val(&model.embed.weight)
}

/// `W_U [d_model, vocab]` (`W_Eᵀ` unless weight processing untied it).
pub fn w_u(model: &Transformer) -> Tensor<2> {
    model.w_u().0
}

/// Layer `layer`'s `QK` circuits, one per head: `A = W_Q [h, d, dh]`, `B = W_Kᵀ [h, dh, d]`.
pub fn qk(w: &HeadWeights) -> FactoredMatrix {
    FactoredMatrix::new(w.w_q.clone(), w.w_k.clone().swap_dims(1, 2))
}

/// Layer `layer`'s `OV` circuits, one per head: `A = W_V [h, d, dh]`, `B = W_O [h, dh, d]`.
pub fn ov(w: &HeadWeights) -> FactoredMatrix {
    FactoredMatrix::new(w.w_v.clone(), w.w_o.clone())
}

/// Full QK circuit `W_E QK W_Eᵀ`, `[h, vocab, vocab]` factored through `d_head`: how much a
/// query token attends to a key token, ignoring positions and LayerNorm.
pub fn full_qk(model: &Transformer, w: &HeadWeights) -> FactoredMatrix {
    let we = w_e(model);
    qk(w).matmul_left(we.clone()).matmul_right(we.transpose())
}

/// Full OV circuit `W_E OV W_U`, `[h, vocab, vocab]` factored through `d_head`: which output
/// logits a head raises when it attends to each token.
pub fn full_ov(model: &Transformer, w: &HeadWeights) -> FactoredMatrix {
    ov(w).matmul_left(w_e(model)).matmul_right(w_u(model))
}

/// OV copying score of every head, `[layer][head]`: `Σ Re(λ) / Σ |λ|` over the eigenvalues
/// of the full OV circuit (computed from its `d_head × d_head` form `B A`).
pub fn ov_copying_scores(model: &Transformer) -> Vec<Vec<f64>> {
    all_head_weights(model)
        .iter()
        .map(|w| {
            let f = full_ov(model, w);
            (0..f.shape()[0]).map(|h| copying_score(&f.eigenvalues(h))).collect()
        })
        .collect()
}
