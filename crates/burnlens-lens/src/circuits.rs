//! Per-head circuits of a model, in TransformerLens's right-multiplying convention:
//! `QK = W_Q W_Kᵀ` (a query residual `x_q` and key residual `x_k` score `x_q QK x_kᵀ`) and
//! `OV = W_V W_O` (a head moves `x_k OV` into the residual stream), each `d_model × d_model`
//! of rank `d_head`, kept factored.

use burn::tensor::Tensor;
use burnlens_model::Transformer;

use crate::factored::{FactoredMatrix, copying_score};
use crate::head_weights::{HeadWeights, head_weights};

/// Every layer's per-head weights (`W_Q, W_K, W_V: [n_heads, d_model, d_head]`,
/// `W_O: [n_heads, d_head, d_model]`, biases).
pub fn all_head_weights(model: &Transformer) -> Vec<HeadWeights> {
    model.blocks.iter().map(|b| head_weights(&b.attn)).collect()
}

/// A weight in TransformerLens's stacked shapes, as host values and dims.
pub type HostTensor = (Vec<f32>, Vec<usize>);

/// Every weight under TransformerLens's name and shape (`HookedTransformer.W_Q` and the
/// rest): `W_E [vocab, d]`, `W_pos`, `W_U [d, vocab]`, `b_U`, per layer stacked
/// `W_Q, W_K, W_V [L, H, d, d_head]` (grouped heads repeated), `W_O [L, H, d_head, d]`,
/// `b_Q, b_K, b_V [L, H, d_head]`, `b_O [L, d]`, `W_in`, `W_gate`, `W_out`, `b_in`, `b_out`,
/// and the final norm's `ln_final.w` / `ln_final.b`.
pub fn transformer_lens_weights(m: &Transformer) -> Vec<(&'static str, HostTensor)> {
    fn host<const D: usize>(t: Tensor<D>) -> HostTensor {
        let dims = t.dims().to_vec();
        (t.into_data().try_into_vec_as::<f32>().expect("f32 values"), dims)
    }
    let mut out: Vec<(&'static str, HostTensor)> = vec![("W_E", host(w_e(m)))];
    if let Some(p) = &m.pos_embed {
        out.push(("W_pos", host(burnlens_model::f32_val(&p.weight))));
    }
    out.push(("ln_final.w", host(m.ln_final.weight.val())));
    if let Some(b) = &m.ln_final.bias {
        out.push(("ln_final.b", host(b.val())));
    }
    let (w_u, b_u) = m.w_u();
    out.push(("W_U", host(w_u)));
    if let Some(b) = b_u {
        out.push(("b_U", host(b)));
    }
    let heads = all_head_weights(m);
    let stack3 = |f: fn(&HeadWeights) -> Tensor<3>| host(Tensor::stack::<4>(heads.iter().map(f).collect(), 0));
    let stack2 = |f: fn(&HeadWeights) -> Tensor<2>| host(Tensor::stack::<3>(heads.iter().map(f).collect(), 0));
    out.push(("W_Q", stack3(|h| h.w_q.clone())));
    out.push(("W_K", stack3(|h| h.w_k.clone())));
    out.push(("W_V", stack3(|h| h.w_v.clone())));
    out.push(("W_O", stack3(|h| h.w_o.clone())));
    out.push(("b_Q", stack2(|h| h.b_q.clone())));
    out.push(("b_K", stack2(|h| h.b_k.clone())));
    out.push(("b_V", stack2(|h| h.b_v.clone())));
    out.push(("b_O", host(Tensor::stack::<2>(heads.iter().map(|h| h.b_o.clone()).collect(), 0))));
    let mlps: Option<Vec<_>> = m.blocks.iter().map(|b| b.mlp.as_ref()).collect();
    if let Some(mlps) = mlps.filter(|v| !v.is_empty()) {
        let device = m.device();
        let bias = |b: Option<&burn::module::Param<Tensor<1>>>, width: usize| b.map_or_else(|| Tensor::zeros([width], &device), |b| b.val());
        let (d, dm) = (m.config.d_model, m.config.d_mlp.unwrap_or(0));
        out.push(("W_in", host(Tensor::stack::<3>(mlps.iter().map(|x| burnlens_model::f32_val(&x.fc_in.weight)).collect(), 0))));
        out.push(("W_out", host(Tensor::stack::<3>(mlps.iter().map(|x| burnlens_model::f32_val(&x.fc_out.weight)).collect(), 0))));
        let gates: Option<Vec<_>> = mlps.iter().map(|x| x.fc_gate.as_ref()).collect();
        if let Some(gates) = gates {
            out.push(("W_gate", host(Tensor::stack::<3>(gates.iter().map(|g| burnlens_model::f32_val(&g.weight)).collect(), 0))));
        }
        out.push(("b_in", host(Tensor::stack::<2>(mlps.iter().map(|x| bias(x.fc_in.bias.as_ref(), dm)).collect(), 0))));
        out.push(("b_out", host(Tensor::stack::<2>(mlps.iter().map(|x| bias(x.fc_out.bias.as_ref(), d)).collect(), 0))));
    }
    out
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
