//! Attribution rows: the backward pass of the frozen replacement model, written out.
//!
//! With attention patterns and norm scales constant and each MLP replaced by its
//! transcoder's features (whose activations are sources, not functions of the input), the
//! only paths left from one layer to the next are the residual stream, the attention
//! value–output circuits, the norms as fixed linear maps, and the transcoders' skip
//! connections. A target node is a direction injected as the gradient at its place (a
//! feature's encoder row at its layer's input hook, a logit's unembedding direction after
//! the final norm); running this linear map back gives, at each layer's output hook, the
//! gradient that every feature decoder row and error vector there is dotted with, and at
//! the embedding the gradient for the token nodes. Many targets run as one batch.
//!
//! Gradients are `[batch, pos, d_model]`, cut to the positions up to the batch's last target
//! position: attention is causal, so nothing later can reach them.

use burn::tensor::{IndexingUpdateOp, Int, Tensor};
use burnlens_model::kernels::linear;
use burnlens_model::matmul::matmul;
use burnlens_model::read_back::read_together;
use burnlens_model::{Norm, NormKind, NormSite};

use crate::replacement::{FrozenLayer, Replacement};
use crate::transcoder::{InputHook, OutputHook, indices};

/// Which positions a gradient `[batch, p, d_model]` holds: the first `p`, or these.
#[derive(Clone, Copy)]
pub(crate) enum At<'a> {
    First,
    Only(&'a Tensor<1, Int>),
}

/// The targets of one backward pass: where each injects (`layer` = the number of layers for
/// the unembedding's input), at which position, along which direction (`[batch, d_model]`,
/// on the model's device).
pub(crate) struct Targets<'a> {
    pub layers: &'a [usize],
    pub positions: &'a [usize],
    pub vectors: Tensor<2>,
}

/// The gradient at a norm's input from the gradient at its output `g`, its scale frozen:
/// `center(g · w) / scale` for a LayerNorm (no centring for an RMSNorm; no `w` when the
/// gradient is taken at the value before the gain).
pub(crate) fn norm_back(norm: &Norm, scale: &Tensor<3>, g: Tensor<3>, with_gain: bool) -> Tensor<3> {
    let [_, p, d] = g.dims();
    let g = if with_gain { g * burnlens_model::f32_val(&norm.weight).reshape([1, 1, d]) } else { g };
    let g = match norm.kind {
        NormKind::LayerNorm => g.clone() - g.mean_dim(2),
        NormKind::RmsNorm => g,
    };
    g / scale.clone().narrow(1, 0, p)
}

/// Attention with its pattern frozen, backwards: from the gradient at the attention output
/// to the gradient at its (value) input, `Σ_h Aₕᵀ (g W_Oₕᵀ) W_Vₕᵀ`. The products with
/// weights (here and in the skip connections) are the linear kernel's, in the compute dtype
/// (`--compute bf16`: bf16 operands); the pattern's and the decoder rows' stay f32.
fn attention_back(layer: &FrozenLayer, a: Tensor<3>, g: Tensor<3>) -> Tensor<3> {
    let [b, p, d] = g.dims();
    let [h, _, _] = a.dims();
    let dh = layer.w_o.dims()[0] / h;
    let gz = linear(g.reshape([b * p, d]), layer.w_o.clone().transpose(), None).reshape([b, p, h, dh]).permute([2, 1, 0, 3]).reshape([h, p, b * dh]);
    let gv = matmul(a.swap_dims(1, 2), gz).reshape([h, p, b, dh]).permute([2, 1, 0, 3]).reshape([b * p, h * dh]);
    linear(gv, layer.w_v.clone().transpose(), None).reshape([b, p, d])
}

impl Replacement<'_> {
    /// Layer `l`'s attention pattern over the first `p` positions, `[head, p, p]`: kept, or
    /// recomputed from the attention's input.
    pub(crate) fn pattern(&self, l: usize, p: usize) -> Tensor<3> {
        let layer = &self.layers[l];
        match (&layer.pattern, &layer.attn_input) {
            (Some(a), _) => a.clone().narrow(1, 0, p).narrow(2, 0, p),
            (None, Some(x)) => {
                let d = x.dims()[1];
                let a = self.model.attention_pattern(l, x.clone().narrow(0, 0, p).reshape([1, p, d]));
                let h = a.dims()[1];
                a.reshape([h, p, p])
            }
            (None, None) => unreachable!("a frozen layer keeps its pattern or the attention's input"),
        }
    }

    /// The scale of `site` at the positions `at` (all of them for [`At::First`]; the norm's
    /// backward pass cuts them to the gradient's).
    pub(crate) fn scale_at(&self, site: NormSite, at: At) -> Tensor<3> {
        match at {
            At::First => self.scale(site).clone(),
            At::Only(idx) => self.scale(site).clone().select(1, idx.clone()),
        }
    }

    pub(crate) fn scale(&self, site: NormSite) -> &Tensor<3> {
        let l = site.layer().expect("a block's norm");
        self.layers[l].scales.get(&site).unwrap_or_else(|| panic!("{site}.hook_scale was captured"))
    }

    /// The injected gradients of targets `order`, `[order.len(), p, d_model]`: each target's
    /// vector at its position, zero elsewhere, made where the vectors are.
    pub(crate) fn injected(&self, t: &Targets, order: &[usize], p: usize) -> Tensor<3> {
        let (n, d, device) = (order.len(), self.d_model(), self.model.device());
        let at = indices(order.iter().enumerate().map(|(k, &i)| (k * p + t.positions[i]) as i64).collect(), &device);
        let vectors = t.vectors.clone().select(0, indices(order.iter().map(|&i| i as i64).collect(), &device));
        Tensor::<2>::zeros([n * p, d], &device).select_assign(0, at, vectors, IndexingUpdateOp::Add).reshape([n, p, d])
    }

    /// The gradient at layer `l`'s MLP output hook from the gradient `g` at its output.
    pub(crate) fn output_hook_grad(&self, l: usize, g: &Tensor<3>, at: At) -> Tensor<3> {
        let block = &self.model.blocks[l];
        match (self.set.output, block.norm_after_mlp(l)) {
            (OutputHook::MlpHookOut, Some((n, site))) => norm_back(n, &self.scale_at(site, at), g.clone(), true),
            _ => g.clone(),
        }
    }

    /// From the gradient at layer `l`'s input hook to the gradient at its `hook_resid_mid`.
    pub(crate) fn input_hook_to_mid(&self, l: usize, g_in: Tensor<3>, at: At) -> Tensor<3> {
        let block = &self.model.blocks[l];
        let ln2 = block.ln2.as_ref().expect("checked: the block has an MLP norm");
        match self.set.input {
            InputHook::ResidMid => g_in,
            InputHook::MlpIn if block.norm_before_mlp(l).is_none() => g_in,
            InputHook::MlpIn => norm_back(ln2, &self.scale_at(NormSite::Ln2(l), at), g_in, true),
            InputHook::Ln2Normalized => norm_back(ln2, &self.scale_at(NormSite::Ln2(l), at), g_in, ln2.kind == NormKind::LayerNorm),
        }
    }

    /// From the gradient at layer `l`'s `hook_resid_mid` to the one at its `hook_resid_pre`,
    /// through the frozen attention (and its norms).
    fn attention_block_back(&self, l: usize, g_mid: Tensor<3>) -> Tensor<3> {
        let block = &self.model.blocks[l];
        let g_o = match block.norm_after_attention(l) {
            Some((n, site)) => norm_back(n, self.scale(site), g_mid.clone(), true),
            None => g_mid.clone(),
        };
        let p = g_o.dims()[1];
        let g_x = attention_back(&self.layers[l], self.pattern(l, p), g_o);
        let g_x = match block.norm_before_attention(l) {
            Some((n, site)) => norm_back(n, self.scale(site), g_x, true),
            None => g_x,
        };
        g_mid + g_x
    }

    /// One attribution row per target, added into `rows` (zeros), target `i` at
    /// `rows[i · row..]` (`row` ≥ the row's width `n_active + (n_layers + 1) · n_pos`): the
    /// direct effect on the target of every active feature, then every error node
    /// (layer-major), then every token.
    ///
    /// Targets run highest first: going down the layers, a target joins the batch at its own
    /// input hook (the gradient above it is zero), so a layer costs only the targets above it.
    pub(crate) fn rows_into(&self, t: &Targets, rows: &mut [f32], row: usize) {
        let (n_layers, d) = (self.n_layers(), self.d_model());
        let b = t.layers.len();
        assert!(row >= self.active.len() + (n_layers + 1) * self.n_pos() && rows.len() >= b * row, "a slot of {row} floats per row");
        let p = t.positions.iter().max().map_or(0, |m| m + 1);
        let mut order: Vec<usize> = (0..b).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(t.layers[i]));
        let joined = |l: usize| order.iter().take_while(|&&i| t.layers[i] >= l).count();
        let device = self.model.device();
        let mut columns = Columns::default();
        // The gradient at the current layer's `hook_resid_post` for targets `order[..k]`.
        let mut k = joined(n_layers);
        let mut g: Option<Tensor<3>> = (k > 0).then(|| norm_back(&self.model.ln_final, &self.ln_final_scale, self.injected(t, &order[..k], p), true));
        let top = t.layers.iter().copied().max().expect("a batch has targets").min(n_layers - 1);
        for l in (0..=top).rev() {
            let mut g_in = g.as_ref().and_then(|g| self.mlp_back(l, g, k, &mut columns));
            let k_new = joined(l);
            if k_new > k {
                let inj = self.injected(t, &order[k..k_new], p);
                let zeros = || Tensor::zeros([k, p, d], &device);
                g_in = Some(if k == 0 { inj } else { Tensor::cat(vec![g_in.unwrap_or_else(zeros), inj], 0) });
                g = Some(match g {
                    Some(g) => Tensor::cat(vec![g, Tensor::zeros([k_new - k, p, d], &device)], 0),
                    None => Tensor::zeros([k_new, p, d], &device),
                });
                k = k_new;
            }
            let Some(g_post) = g.take() else { continue };
            let g_mid = match g_in {
                Some(g_in) => g_post + self.input_hook_to_mid(l, g_in, At::First),
                None => g_post,
            };
            g = Some(self.attention_block_back(l, g_mid));
        }
        let g = g.expect("every target has joined by layer 0");
        let tok = (g * self.tokens.clone().narrow(0, 0, p).unsqueeze::<3>()).sum_dim(2);
        columns.push(tok.reshape([-1]), Placement { k: order.len(), spans: Vec::new(), col: self.active.len() + n_layers * self.n_pos(), copied: p });
        columns.write(rows, row, &order);
    }

    /// Layer `l`'s MLP, backwards from the gradient `g` at its `hook_resid_post` for the first
    /// `k` targets: its features' and errors' columns added to `columns`, and the gradient at
    /// its input hook through the skip connection returned (`skip = x · M`, so `g · Mᵀ`), if
    /// it has one.
    fn mlp_back(&self, l: usize, g: &Tensor<3>, k: usize, columns: &mut Columns) -> Option<Tensor<3>> {
        let g_out = self.output_hook_grad(l, g, At::First);
        self.contract_layer(l, &g_out, k, columns);
        self.skip_of(l, g_out)
    }

    /// [`mlp_back`](Self::mlp_back) without writing columns: only the skip connection's
    /// gradient.
    pub(crate) fn skip_back(&self, l: usize, g: &Tensor<3>, at: At) -> Option<Tensor<3>> {
        self.skip_of(l, self.output_hook_grad(l, g, at))
    }

    /// The gradient at layer `l`'s input hook through its skip connection from `g_out` at its
    /// output hook.
    fn skip_of(&self, l: usize, g_out: Tensor<3>) -> Option<Tensor<3>> {
        let [k, p, d] = g_out.dims();
        self.set.layers[l].w_skip.as_ref().map(|m| linear(g_out.reshape([k * p, d]), m.clone().transpose(), None).reshape([k, p, d]))
    }

    /// The features' and errors' columns of layer `l` for the first `k` targets from the
    /// gradient at its output hook `g_out [k, p, d_model]`: every writer's effects
    /// ([`crate::writer`]) and the errors', added to `columns`.
    fn contract_layer(&self, l: usize, g_out: &Tensor<3>, k: usize, columns: &mut Columns) {
        let layer = &self.layers[l];
        let [b, p, _] = g_out.dims();
        let mut pieces = Vec::new();
        let mut spans = Vec::new();
        for w in &layer.writers {
            if let Some(e) = w.layout.effects(&self.set.layers[w.source].w_dec[w.decoder], g_out) {
                spans.push((w.first_feature, e.dims()[1]));
                pieces.push(e);
            }
        }
        pieces.push((g_out.clone() * layer.errors.clone().narrow(0, 0, p).unsqueeze::<3>()).sum_dim(2).reshape([b, p]));
        let vals = Tensor::cat(pieces, 1).reshape([-1]);
        columns.push(vals, Placement { k, spans, col: self.active.len() + l * self.n_pos(), copied: p });
    }
}

/// The columns a batch's backward pass writes, kept on the device until the pass is done and
/// then read back at once: one wait for the device a batch, not one a layer.
#[derive(Default)]
struct Columns {
    parts: Vec<(Tensor<1>, Placement)>,
}

/// Where a part's values go: `[k, width]` row-major for the first `k` targets of the order,
/// each row the writers' `spans` (`(first column, count)`, added: a cross-layer feature sums
/// over the layers it writes), then `copied` values copied to columns `col..`.
struct Placement {
    k: usize,
    spans: Vec<(usize, usize)>,
    col: usize,
    copied: usize,
}

impl Columns {
    fn push(&mut self, vals: Tensor<1>, placement: Placement) {
        self.parts.push((vals, placement));
    }

    /// Every part read back in one read ([`read_together`]) and written into `rows` (target
    /// `order[k]` at `rows[order[k] · row..]`).
    fn write(self, rows: &mut [f32], row: usize, order: &[usize]) {
        let (tensors, placements): (Vec<_>, Vec<_>) = self.parts.into_iter().unzip();
        for (vals, Placement { k, spans, col, copied }) in read_together(tensors).into_iter().zip(placements) {
            let mut at = 0;
            for &i in &order[..k] {
                let r = &mut rows[i * row..(i + 1) * row];
                for &(first, n) in &spans {
                    r[first..first + n].iter_mut().zip(&vals[at..at + n]).for_each(|(r, &v)| *r += v);
                    at += n;
                }
                r[col..col + copied].copy_from_slice(&vals[at..at + copied]);
                at += copied;
            }
            assert_eq!(at, vals.len(), "every column read back was written");
        }
    }
}
