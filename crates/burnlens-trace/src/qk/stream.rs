//! The residual stream one layer's attention reads (`hook_resid_pre`), written as a sum of
//! [`QkNode`]s at each position, with the replacement model's frozen norm scales: the token
//! embedding; for every earlier layer, each head's output (through the frozen post-attention
//! norm where there is one), each active transcoder feature's decoder times its activation,
//! the skip term, and the error (the MLP's output less the transcoder's reconstruction, so
//! that the parts add up to the stream exactly); and one constant part.

use std::collections::BTreeMap;

use burn::tensor::{IndexingUpdateOp, Int, Tensor, TensorData};
use burnlens_model::{Activation, AttnHook, Block, BlockHook, HookPoint, LayerHook, NormHook, Positional, Transformer};

use super::frozen::Frozen;
use super::node::QkNode;
use crate::TraceError;
use crate::found::Found;
use crate::replacement::input_source;
use crate::transcoder::{OutputHook, TranscoderSet, tensor};

pub(crate) type Captured = BTreeMap<HookPoint, Activation>;

/// Rows of the stream: `vectors [n, d_model]`, row `i` being `nodes[i]` at `nodes[i].pos()`.
/// `constant`: the part of constants, to which a query's or key's own biases are added.
pub(crate) struct Part {
    pub nodes: Vec<QkNode>,
    pub vectors: Tensor<2>,
    pub constant: bool,
}

/// The hook points [`for_each_part`] reads, for the stream entering `layer`.
pub(crate) fn stream_points(model: &Transformer, set: Option<&TranscoderSet>, layer: usize) -> Vec<HookPoint> {
    let mut points = vec![HookPoint::Embed, HookPoint::PosEmbed, BlockHook::ResidPre.at(layer)];
    for (l, block) in model.blocks.iter().enumerate().take(layer) {
        points.extend([AttnHook::Result.at(l), BlockHook::MlpOut.at(l)]);
        points.extend(set.map(|set| input_source(set.input, block, l).0));
        points.extend(block.norm_after_attention(l).map(|(_, site)| NormHook::Scale.of(site)));
        points.extend(block.norm_after_mlp(l).map(|(_, site)| NormHook::Scale.of(site)));
    }
    points
}

fn take_rows(cache: &Captured, point: HookPoint) -> Result<Tensor<2>, TraceError> {
    let t = cache.get(&point).and_then(|a| a.rank3()).ok_or_else(|| TraceError::Mismatch(format!("the model has no hook point `{point}`")))?;
    let [_, p, d] = t.dims();
    Ok(t.reshape([p, d]))
}

/// The positions a decomposition keeps (sorted), and each position's row among them.
pub(crate) struct Kept {
    pub positions: Vec<usize>,
    row: Vec<Option<usize>>,
    index: Option<Tensor<1, Int>>,
}

impl Kept {
    /// `positions` (sorted, distinct) of a stream of `n_pos`.
    pub fn new(positions: Vec<usize>, n_pos: usize, device: &burn::tensor::Device) -> Self {
        let mut row = vec![None; n_pos];
        positions.iter().enumerate().for_each(|(r, &p)| row[p] = Some(r));
        let index = (positions.len() < n_pos)
            .then(|| Tensor::<1, Int>::from_data(TensorData::new(positions.iter().map(|&p| p as i64).collect::<Vec<_>>(), [positions.len()]), device));
        Self { positions, row, index }
    }

    /// The kept rows of `[pos, ...]` (along dimension 0 or 1).
    fn select<const D: usize>(&self, t: Tensor<D>, dim: usize) -> Tensor<D> {
        match &self.index {
            Some(i) => t.select(dim, i.clone()),
            None => t,
        }
    }
}

fn frozen<'m>(cache: &Captured, norm: Option<(&'m burnlens_model::Norm, burnlens_model::NormSite)>) -> Result<Option<Frozen<'m>>, TraceError> {
    norm.map(|(n, site)| {
        let point = NormHook::Scale.of(site);
        let scale = cache.get(&point).ok_or_else(|| TraceError::Mismatch(format!("the model has no hook point `{point}`")))?;
        Frozen::new(n, scale)
    })
    .transpose()
}

/// `v` through a frozen norm's linear part, or unchanged without one.
fn through(norm: &Option<Frozen>, v: Tensor<2>, positions: &[usize]) -> Tensor<2> {
    let d = v.dims()[1];
    match norm {
        Some(n) => n.linear(v, positions, 0, 0..d),
        None => v,
    }
}

/// What a walk down the stream reads: the stream entering `layer` at the positions `kept`,
/// from the activations `cache` holds (the points of [`stream_points`]), with the first
/// `zero_positions` positions' features zeroed; `known`, where given, the active features
/// already found (else each transcoder encodes its input again).
pub(crate) struct StreamOf<'a> {
    pub model: &'a Transformer,
    pub set: Option<&'a TranscoderSet>,
    pub layer: usize,
    pub zero_positions: usize,
    pub kept: &'a Kept,
    pub cache: &'a Captured,
    pub known: Option<Known<'a>>,
}

/// Active features found before (an attribution graph's): `[layer, pos, feature]` and the
/// activation of each.
#[derive(Clone, Copy)]
pub(crate) struct Known<'a> {
    pub features: &'a [[i64; 3]],
    pub values: &'a [f32],
}

impl Known<'_> {
    /// Layer `l`'s features at the kept positions (at or after `zero_positions`), as
    /// `(kept row · n_features + feature, activation)` in that order.
    fn at(&self, l: usize, kept: &Kept, zero_positions: usize, n_features: usize) -> Vec<(usize, f32)> {
        let mut found: Vec<(usize, f32)> = self
            .features
            .iter()
            .zip(self.values)
            .filter(|&(f, &a)| f[0] as usize == l && f[1] as usize >= zero_positions && a != 0.0)
            .filter_map(|(f, &a)| Some((kept.row.get(f[1] as usize).copied().flatten()? * n_features + f[2] as usize, a)))
            .collect();
        found.sort_unstable_by_key(|&(i, _)| i);
        found
    }
}

/// Hand every part of `stream` to `each`, in order (the constant part last); returns the
/// model's own `hook_resid_pre` of the layer and the parts' sum at the kept positions,
/// `[kept, d_model]` each, row-major. Without transcoders, each MLP's output is one part.
pub(crate) fn for_each_part(stream: &StreamOf, each: impl FnMut(Part) -> Result<(), TraceError>) -> Result<(Vec<f32>, Vec<f32>), TraceError> {
    let StreamOf { model, set, layer, zero_positions, kept, cache, known } = *stream;
    let embed = kept.select(take_rows(cache, HookPoint::Embed)?, 0);
    let [n_pos, d] = embed.dims();
    let device = embed.device();
    let mut walk = Walk { cache, kept, known, n_pos, d, sum: vec![0f32; n_pos * d], bias: Tensor::zeros([n_pos, d], &device), each };
    walk.emit_each(embed, |pos| QkNode::Embedding { pos })?;
    if model.config.positional == Positional::Residual
        && let Ok(p) = walk.take(HookPoint::PosEmbed)
    {
        walk.bias = walk.bias.clone() + p;
    }
    // What each layer's MLP output passes through before the stream: the frozen post-norm
    // where the transcoders write before it (`mlp.hook_out`).
    let mut posts = Vec::with_capacity(layer);
    for (l, block) in model.blocks.iter().enumerate().take(layer) {
        posts.push(match set.map(|s| s.output) {
            Some(OutputHook::MlpHookOut) => frozen(walk.cache, block.norm_after_mlp(l))?,
            _ => None,
        });
    }
    // Every source layer's active features, for the CLT decoders into later layers.
    let mut actives: Vec<Option<Active>> = Vec::with_capacity(layer);
    for (l, block) in model.blocks.iter().enumerate().take(layer) {
        walk.attention(block, l)?;
        match set {
            Some(set) => walk.transcoder(&Layer { block, l, below: layer, zero_positions }, set, &posts, &mut actives)?,
            None if block.mlp.is_some() => {
                let v = walk.take(BlockHook::MlpOut.at(l))?;
                walk.emit_each(v, |pos| QkNode::Mlp { layer: l, pos })?;
            }
            None => {}
        }
    }
    let bias = walk.bias.clone();
    walk.emit(Part { nodes: kept.positions.iter().map(|&pos| QkNode::Bias { pos }).collect(), vectors: bias, constant: true })?;
    let resid = walk.take(BlockHook::ResidPre.at(layer))?.into_data().try_into_vec_as::<f32>().expect("f32");
    Ok((resid, walk.sum))
}

/// One block of the walk: block `l`, the stream read below layer `below`.
struct Layer<'m> {
    block: &'m Block,
    l: usize,
    below: usize,
    zero_positions: usize,
}

/// One layer's active features: their nodes, indices, rows (of the kept positions) and
/// activations `[n, 1]`.
struct Active {
    nodes: Vec<QkNode>,
    sel: Tensor<1, Int>,
    at: Tensor<1, Int>,
    scale: Tensor<2>,
}

impl Active {
    /// Each feature's row of decoder `w_dec` times its activation, `[n, d_model]`.
    fn decoded(&self, w_dec: &Tensor<2>) -> Tensor<2> {
        w_dec.clone().select(0, self.sel.clone()) * self.scale.clone()
    }
}

/// The walk down the layers: the parts handed on so far, summed, and the constants gathered.
struct Walk<'c, F> {
    cache: &'c Captured,
    kept: &'c Kept,
    known: Option<Known<'c>>,
    /// Rows: the kept positions.
    n_pos: usize,
    d: usize,
    sum: Vec<f32>,
    /// The constant part so far, `[pos, d_model]`.
    bias: Tensor<2>,
    each: F,
}

impl<F: FnMut(Part) -> Result<(), TraceError>> Walk<'_, F> {
    fn emit(&mut self, part: Part) -> Result<(), TraceError> {
        let d = self.d;
        let v: Vec<f32> = part.vectors.clone().into_data().try_into_vec_as::<f32>().expect("f32");
        for (i, node) in part.nodes.iter().enumerate() {
            let at = self.kept.row[node.pos()].expect("a part at a kept position") * d;
            self.sum[at..at + d].iter_mut().zip(&v[i * d..(i + 1) * d]).for_each(|(s, x)| *s += x);
        }
        (self.each)(part)
    }

    /// A part with one row per kept position, `vectors [kept, d_model]`.
    fn emit_each(&mut self, vectors: Tensor<2>, node: impl Fn(usize) -> QkNode) -> Result<(), TraceError> {
        let nodes = self.kept.positions.iter().map(|&p| node(p)).collect();
        self.emit(Part { nodes, vectors, constant: false })
    }

    /// The kept rows of a captured `[1, pos, d]` activation.
    fn take(&mut self, point: HookPoint) -> Result<Tensor<2>, TraceError> {
        Ok(self.kept.select(take_rows(self.cache, point)?, 0))
    }

    /// `[pos, d_model]` rows of one vector.
    fn rows(&self, v: Tensor<1>) -> Tensor<2> {
        v.reshape([1, self.d]).expand([self.n_pos, self.d])
    }

    /// `v` through `norm` (frozen, linear part) at every kept position.
    fn through_all(&self, norm: &Option<Frozen>, v: Tensor<2>) -> Tensor<2> {
        through(norm, v, &self.kept.positions)
    }

    /// A norm's constant part, added to the constants; returned as rows.
    fn add_constant(&mut self, norm: &Option<Frozen>) -> Option<Tensor<2>> {
        let b = self.rows(norm.as_ref()?.bias(0..self.d)?);
        self.bias = self.bias.clone() + b.clone();
        Some(b)
    }

    /// Layer `l`'s attention: each head's write (through the frozen post-attention norm),
    /// and `b_O` with the constants.
    fn attention(&mut self, block: &Block, l: usize) -> Result<(), TraceError> {
        let post = frozen(self.cache, block.norm_after_attention(l))?;
        let point = AttnHook::Result.at(l);
        let result = self.cache.get(&point).and_then(|a| a.rank4()).ok_or_else(|| TraceError::Mismatch(format!("the model has no hook point `{point}`")))?;
        let result = self.kept.select(result, 1);
        for head in 0..result.dims()[2] {
            let v = self.through_all(&post, result.clone().narrow(2, head, 1).reshape([self.n_pos, self.d]));
            self.emit_each(v, |pos| QkNode::Attention { layer: l, head, pos })?;
        }
        if let Some(b_o) = &block.attn.out.bias {
            self.bias = self.bias.clone() + self.through_all(&post, self.rows(b_o.val()));
        }
        self.add_constant(&post);
        Ok(())
    }

    /// Layer `l`'s MLP through its transcoder: the features (into every layer below the
    /// head's they write, through those layers' `posts`), the skip term, `b_dec` with the
    /// constants, and the error. `actives` gains this layer's active features.
    fn transcoder(&mut self, at: &Layer, set: &TranscoderSet, posts: &[Option<Frozen>], actives: &mut Vec<Option<Active>>) -> Result<(), TraceError> {
        let (block, l, n_pos, d) = (at.block, at.l, self.n_pos, self.d);
        let (point, finish) = input_source(set.input, block, l);
        let mut x = self.take(point)?;
        if finish {
            x = block.ln2.as_ref().ok_or_else(|| TraceError::Mismatch("the block has no ln2".into()))?.finish(x);
        }
        let device = x.device();
        let tc = &set.layers[l];
        let f = tc.d_sae();
        let active: Vec<(usize, f32)> = match &self.known {
            Some(known) => known.at(l, self.kept, at.zero_positions, f),
            None => {
                let zeroed = self.kept.positions.iter().take_while(|&&p| p < at.zero_positions).count();
                let (_, found) = Found::encode(tc, x.clone(), zeroed);
                (0..n_pos)
                    .flat_map(|p| (found.starts[p]..found.starts[p + 1]).map(move |j| (p, j)))
                    .map(|(p, j)| (p * f + found.features[j] as usize, found.values[j]))
                    .collect()
            }
        };
        let mine = (!active.is_empty()).then(|| {
            let n = active.len();
            let int = |v: Vec<i64>| Tensor::<1, Int>::from_data(TensorData::new(v, [n]), &device);
            Active {
                nodes: active.iter().map(|&(i, _)| QkNode::Feature { layer: l, feature: i % f, pos: self.kept.positions[i / f] }).collect(),
                sel: int(active.iter().map(|&(i, _)| (i % f) as i64).collect()),
                at: int(active.iter().map(|&(i, _)| (i / f) as i64).collect()),
                scale: tensor(active.iter().map(|&(_, a)| a).collect(), [n, 1], &device),
            }
        });
        if let Some(a) = &mine {
            let positions: Vec<usize> = a.nodes.iter().map(|n| n.pos()).collect();
            let mut v = Tensor::<2>::zeros([a.nodes.len(), d], &device);
            for (k, w_dec) in tc.w_dec.iter().enumerate().take(at.below - l) {
                v = v + through(&posts[l + k], a.decoded(w_dec), &positions);
            }
            self.emit(Part { nodes: a.nodes.clone(), vectors: v, constant: false })?;
        }
        actives.push(mine);
        let mut recon = self.rows(tc.b_dec.clone());
        // Layer `s`'s decoder into layer `l`, where it has one (a CLT's earlier layers): each
        // active feature's row added at its position.
        for (s, a) in actives.iter().enumerate() {
            if let (Some(w_dec), Some(a)) = (set.layers[s].w_dec.get(l - s), a) {
                recon = recon.select_assign(0, a.at.clone(), a.decoded(w_dec), IndexingUpdateOp::Add);
            }
        }
        if let Some(skip) = tc.skip(x) {
            recon = recon + skip.clone();
            let v = self.through_all(&posts[l], skip);
            self.emit_each(v, |pos| QkNode::Skip { layer: l, pos })?;
        }
        let mlp_out = self.take(BlockHook::MlpOut.at(l))?;
        let mut error = mlp_out - self.through_all(&posts[l], recon);
        self.bias = self.bias.clone() + self.through_all(&posts[l], self.rows(tc.b_dec.clone()));
        if let Some(b) = self.add_constant(&posts[l]) {
            error = error - b;
        }
        self.emit_each(error, |pos| QkNode::Error { layer: l, pos })
    }
}
