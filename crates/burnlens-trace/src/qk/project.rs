//! One side of one head: what turns a part of the residual stream at a position into that
//! head's query (or key) there, with the norms' scales frozen — the attention's norm, the
//! shortformer position embedding, the head's projection and bias, its QK-norm, its rotary
//! rotation for the position. Linear in the part, plus the constants (norm and projection
//! biases), which only the constant part carries; so the query of the whole stream is the
//! sum of its parts' queries, and the score `q·k · scale` a sum over pairs of parts.

use burnlens_model::matmul::matmul;
use std::ops::Range;

use burn::tensor::{Int, Tensor, TensorData};
use burnlens_model::{AttnHook, HookPoint, LayerHook, NormHook, NormKind, NormSite, Positional, QkNorm, Transformer, apply_rotary};

use super::frozen::Frozen;
use super::stream::Captured;
use crate::TraceError;

/// Queries or keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    Query,
    Key,
}

/// The map of one side of head `head` at `layer`.
pub(crate) struct Projection<'m> {
    model: &'m Transformer,
    layer: usize,
    norm: Option<Frozen<'m>>,
    /// Shortformer position embeddings `[pos, d_model]`, added to what queries and keys read.
    positions: Option<Tensor<2>>,
    /// `[d_model, d_head]`, `[d_head]`
    w: Tensor<2>,
    b: Tensor<1>,
    /// The QK-norm, with the scale's head index and the gain's elements of this head.
    qk: Option<(Frozen<'m>, usize, Range<usize>)>,
}

/// The hook points [`Projection::new`] reads at `layer`, and those of the model's own
/// queries and keys (for the scores the parts must add up to).
pub(crate) fn projection_points(model: &Transformer, layer: usize) -> Vec<HookPoint> {
    let block = &model.blocks[layer];
    let mut points = vec![HookPoint::PosEmbed];
    points.extend(block.norm_before_attention(layer).map(|(_, site)| NormHook::Scale.of(site)));
    for site in [NormSite::QNorm(layer), NormSite::KNorm(layer)] {
        points.extend([NormHook::Scale.of(site), NormHook::Normalized.of(site)]);
    }
    points.extend([AttnHook::Q, AttnHook::K, AttnHook::RotQ, AttnHook::RotK, AttnHook::Pattern].map(|h| h.at(layer)));
    points
}

fn scale_of<'m>(cache: &Captured, norm: &'m burnlens_model::Norm, site: NormSite) -> Result<Frozen<'m>, TraceError> {
    let point = NormHook::Scale.of(site);
    Frozen::new(norm, cache.get(&point).ok_or_else(|| TraceError::Mismatch(format!("the model has no hook point `{point}`")))?)
}

impl<'m> Projection<'m> {
    pub fn new(model: &'m Transformer, layer: usize, head: usize, side: Side, cache: &Captured) -> Result<Self, TraceError> {
        let block = &model.blocks[layer];
        let attn = &block.attn;
        let norm = block.norm_before_attention(layer).map(|(n, site)| scale_of(cache, n, site)).transpose()?;
        let positions = match model.config.positional {
            Positional::QueryKeyOnly => cache.get(&HookPoint::PosEmbed).and_then(|a| a.rank3()).map(|p| {
                let [_, n, d] = p.dims();
                p.reshape([n, d])
            }),
            _ => None,
        };
        let w = burnlens_lens::head_weights(attn);
        let (w, b) = match side {
            Side::Query => (w.w_q, w.b_q),
            Side::Key => (w.w_k, w.b_k),
        };
        let [_, d, dh] = w.dims();
        let w = w.narrow(0, head, 1).reshape([d, dh]);
        let b = b.narrow(0, head, 1).reshape([dh]);
        // The key head of a group is `head / (n_heads / n_kv_heads)`.
        let index = match side {
            Side::Query => head,
            Side::Key => head / (attn.n_heads / attn.n_kv_heads),
        };
        let qk = match (&attn.q_norm, &attn.k_norm, attn.qk_norm) {
            (Some(qn), Some(kn), Some(kind)) => {
                let (n, site) = match side {
                    Side::Query => (qn, NormSite::QNorm(layer)),
                    Side::Key => (kn, NormSite::KNorm(layer)),
                };
                let frozen = scale_of(cache, n, site)?;
                Some(match kind {
                    QkNorm::PerHead => (frozen, index, 0..dh),
                    QkNorm::Whole if n.kind == NormKind::RmsNorm => (frozen, 0, index * dh..(index + 1) * dh),
                    QkNorm::Whole => return Err(TraceError::Input("QK attributions through a LayerNorm over all heads' queries are not supported".into())),
                })
            }
            _ => None,
        };
        Ok(Self { model, layer, norm, positions, w, b, qk })
    }

    /// The side's vectors `[n, d_head]` of `rows [n, d_model]` at `positions`; with
    /// `constant`, the norm and projection biases are added (the constant part).
    pub fn project(&self, rows: Tensor<2>, positions: &[usize], constant: bool) -> Tensor<2> {
        let [n, d] = rows.dims();
        let mut x = rows;
        if let Some(norm) = &self.norm {
            x = norm.linear(x, positions, 0, 0..d);
            if constant && let Some(b) = norm.bias(0..d) {
                x = x + b.reshape([1, d]);
            }
        }
        if constant && let Some(p) = &self.positions {
            let idx: Vec<i64> = positions.iter().map(|&p| p as i64).collect();
            x = x + p.clone().select(0, Tensor::<1, Int>::from_data(TensorData::new(idx, [n]), &p.device()));
        }
        let dh = self.w.dims()[1];
        let mut y = matmul(x, self.w.clone());
        if constant {
            y = y + self.b.clone().reshape([1, dh]);
        }
        self.finish(y, positions, constant)
    }

    /// What follows the projection `y [n, d_head]` at `positions`: the QK-norm (its bias
    /// with `constant`) and the rotation.
    fn finish(&self, mut y: Tensor<2>, positions: &[usize], constant: bool) -> Tensor<2> {
        let [n, dh] = y.dims();
        if let Some((norm, head, range)) = &self.qk {
            y = norm.linear(y, positions, *head, range.clone());
            if constant && let Some(b) = norm.bias(range.clone()) {
                y = y + b.reshape([1, dh]);
            }
        }
        match self.model.rotary_angles(self.layer, &[positions.to_vec()]) {
            Some(angles) => apply_rotary(y.reshape([1, n, 1, dh]), &angles).reshape([n, dh]),
            None => y,
        }
    }
}

/// The model's own queries of `head` (`side` Query) or keys of its key head, `[pos, d_head]`
/// row-major, as the scores read them (after QK-norm and rotary).
pub(crate) fn model_side(model: &Transformer, layer: usize, head: usize, side: Side, cache: &Captured) -> Result<Vec<f32>, TraceError> {
    let attn = &model.blocks[layer].attn;
    let (index, raw, rotated, site, norm) = match side {
        Side::Query => (head, AttnHook::Q, AttnHook::RotQ, NormSite::QNorm(layer), &attn.q_norm),
        Side::Key => (head / (attn.n_heads / attn.n_kv_heads), AttnHook::K, AttnHook::RotK, NormSite::KNorm(layer), &attn.k_norm),
    };
    let dh = attn.d_head;
    let heads = |t: Tensor<4>| {
        let [_, p, h, _] = t.dims();
        t.reshape([p, h, dh]).narrow(1, index, 1).reshape([p, dh])
    };
    let missing = |p: HookPoint| TraceError::Mismatch(format!("the model has no hook point `{p}`"));
    let t = if let Some(a) = cache.get(&rotated.at(layer)) {
        heads(a.rank4().ok_or_else(|| missing(rotated.at(layer)))?)
    } else if let (Some(norm), Some(a)) = (norm, cache.get(&NormHook::Normalized.of(site))) {
        // QK-norm without rotary: the norm's output, `[1, pos, h, dh]` or `[1, pos, h·dh]`.
        heads(match (a.rank4(), a.rank3()) {
            (Some(t), _) => norm.finish(t),
            (None, Some(t)) => {
                let [b, p, w] = t.dims();
                norm.finish(t).reshape([b, p, w / dh, dh])
            }
            _ => return Err(missing(NormHook::Normalized.of(site))),
        })
    } else {
        heads(cache.get(&raw.at(layer)).and_then(|a| a.rank4()).ok_or_else(|| missing(raw.at(layer)))?)
    };
    Ok(t.into_data().try_into_vec_as::<f32>().expect("f32"))
}

/// Both sides of one head, for the parts that are not constant: the norm before attention
/// folded into the two projections side by side (`[d_model, 2·d_head]`, [`Frozen::fold`]),
/// so a part's rows take one product, divided by the positions' frozen scales — the same
/// map as [`Projection::project`], without normalising every part once per head and side.
pub(crate) struct HeadSides<'m> {
    pub query: Projection<'m>,
    pub key: Projection<'m>,
    folded: Tensor<2>,
}

impl<'m> HeadSides<'m> {
    pub fn new(model: &'m Transformer, layer: usize, head: usize, cache: &Captured) -> Result<Self, TraceError> {
        let (query, key) = (Projection::new(model, layer, head, Side::Query, cache)?, Projection::new(model, layer, head, Side::Key, cache)?);
        let both = Tensor::cat(vec![query.w.clone(), key.w.clone()], 1);
        let folded = match &query.norm {
            Some(norm) => norm.fold(both),
            None => both,
        };
        Ok(Self { query, key, folded })
    }

    /// The queries and keys `[n, d_head]` of `rows [n, d_model]` at `positions`.
    pub fn project(&self, rows: Tensor<2>, positions: &[usize], constant: bool) -> (Tensor<2>, Tensor<2>) {
        if constant {
            return (self.query.project(rows.clone(), positions, true), self.key.project(rows, positions, true));
        }
        let mut y = matmul(rows, self.folded.clone());
        if let Some(norm) = &self.query.norm {
            let s = norm.scales_at(positions, &y.device());
            y = y / s;
        }
        let dh = self.folded.dims()[1] / 2;
        (self.query.finish(y.clone().narrow(1, 0, dh), positions, false), self.key.finish(y.narrow(1, dh, dh), positions, false))
    }
}
