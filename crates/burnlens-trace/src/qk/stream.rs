//! The residual stream one layer's attention reads (`hook_resid_pre`), written as a sum of
//! [`QkNode`]s at each position, with the replacement model's frozen norm scales: the token
//! embedding; for every earlier layer, each head's output (through the frozen post-attention
//! norm where there is one), each active transcoder feature's decoder times its activation,
//! the skip term, and the error (the MLP's output less the transcoder's reconstruction, so
//! that the parts add up to the stream exactly); and one constant part.

use std::collections::BTreeMap;

use burn::tensor::{Int, Tensor, TensorData};
use burnlens_model::{Activation, AttnHook, BlockHook, HookPoint, LayerHook, NormHook, Positional, Transformer};

use super::frozen::Frozen;
use super::node::QkNode;
use crate::TraceError;
use crate::replacement::input_source;
use crate::transcoder::{OutputHook, TranscoderSet, host_activations, tensor};

pub(crate) type Captured = BTreeMap<HookPoint, Activation>;

/// Rows of the stream: `vectors [n, d_model]`, row `i` being `nodes[i]` at `nodes[i].pos()`.
/// `constant`: the part of constants, to which a query's or key's own biases are added.
pub(crate) struct Part {
    pub nodes: Vec<QkNode>,
    pub vectors: Tensor<2>,
    pub constant: bool,
}

impl Part {
    pub fn positions(&self) -> Vec<usize> {
        self.nodes.iter().map(|n| n.pos()).collect()
    }
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

fn take_rows(cache: &mut Captured, point: HookPoint) -> Result<Tensor<2>, TraceError> {
    let t = cache.remove(&point).and_then(|a| a.rank3()).ok_or_else(|| TraceError::Mismatch(format!("the model has no hook point `{point}`")))?;
    let [_, p, d] = t.dims();
    Ok(t.reshape([p, d]))
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

/// Hand every part of the stream entering `layer` to `each`, in order (the constant part
/// last), from the activations `cache` holds (the points of [`stream_points`]); returns
/// the model's own `hook_resid_pre` of `layer` and the parts' sum, `[pos, d_model]` each,
/// row-major. Without transcoders, each MLP's output is one part.
pub(crate) fn for_each_part(
    model: &Transformer,
    set: Option<&TranscoderSet>,
    layer: usize,
    zero_positions: usize,
    cache: &mut Captured,
    mut each: impl FnMut(Part) -> Result<(), TraceError>,
) -> Result<(Vec<f32>, Vec<f32>), TraceError> {
    let embed = take_rows(cache, HookPoint::Embed)?;
    let [n_pos, d] = embed.dims();
    let device = embed.device();
    let every: Vec<usize> = (0..n_pos).collect();
    let mut sum = vec![0f32; n_pos * d];
    let mut emit = |part: Part| -> Result<(), TraceError> {
        let v: Vec<f32> = part.vectors.clone().into_data().try_into_vec_as::<f32>().expect("f32");
        for (i, node) in part.nodes.iter().enumerate() {
            let at = node.pos() * d;
            sum[at..at + d].iter_mut().zip(&v[i * d..(i + 1) * d]).for_each(|(s, x)| *s += x);
        }
        each(part)
    };
    emit(Part { nodes: every.iter().map(|&pos| QkNode::Embedding { pos }).collect(), vectors: embed, constant: false })?;
    let mut bias = Tensor::<2>::zeros([n_pos, d], &device);
    if model.config.positional == Positional::Residual
        && let Ok(p) = take_rows(cache, HookPoint::PosEmbed)
    {
        bias = bias + p;
    }
    // What each layer's MLP output passes through before the stream: the frozen post-norm
    // where the transcoders write before it (`mlp.hook_out`).
    let mut posts = Vec::with_capacity(layer);
    for (l, block) in model.blocks.iter().enumerate().take(layer) {
        posts.push(match set.map(|s| s.output) {
            Some(OutputHook::MlpHookOut) => frozen(cache, block.norm_after_mlp(l))?,
            _ => None,
        });
    }
    let constant_of = |norm: &Option<Frozen>| norm.as_ref().and_then(|n| n.bias(0..d)).map(|b| b.reshape([1, d]).expand([n_pos, d]));
    // Every source layer's activations `[pos, features]`, for the CLT decoders into later layers.
    let mut dense: Vec<Tensor<2>> = Vec::with_capacity(layer);
    for (l, block) in model.blocks.iter().enumerate().take(layer) {
        // Attention: each head's write, and b_O with the constants.
        let post_attn = frozen(cache, block.norm_after_attention(l))?;
        let result = cache
            .remove(&AttnHook::Result.at(l))
            .and_then(|a| a.rank4())
            .ok_or_else(|| TraceError::Mismatch(format!("the model has no hook point `{}`", AttnHook::Result.at(l))))?;
        let h = result.dims()[2];
        for head in 0..h {
            let v = through(&post_attn, result.clone().narrow(2, head, 1).reshape([n_pos, d]), &every);
            emit(Part { nodes: every.iter().map(|&pos| QkNode::Attention { layer: l, head, pos }).collect(), vectors: v, constant: false })?;
        }
        if let Some(b_o) = &block.attn.out.bias {
            bias = bias + through(&post_attn, b_o.val().reshape([1, d]).expand([n_pos, d]), &every);
        }
        if let Some(b) = constant_of(&post_attn) {
            bias = bias + b;
        }

        let Some(set) = set else {
            if block.mlp.is_some() {
                let v = take_rows(cache, BlockHook::MlpOut.at(l))?;
                emit(Part { nodes: every.iter().map(|&pos| QkNode::Mlp { layer: l, pos }).collect(), vectors: v, constant: false })?;
            }
            continue;
        };
        // The MLP: this layer's features (into every layer below `layer` they write), the
        // skip term, b_dec, and the error.
        let (point, finish) = input_source(set.input, block, l);
        let mut x = take_rows(cache, point)?;
        if finish {
            x = block.ln2.as_ref().ok_or_else(|| TraceError::Mismatch("the block has no ln2".into()))?.finish(x);
        }
        let tc = &set.layers[l];
        let f = tc.d_sae();
        let mut acts = host_activations(tc, x.clone());
        acts[..zero_positions.min(n_pos) * f].fill(0.0);
        let (mut idx, mut values, mut nodes) = (Vec::new(), Vec::new(), Vec::new());
        for (i, &a) in acts.iter().enumerate() {
            if a != 0.0 {
                idx.push((i % f) as i64);
                values.push(a);
                nodes.push(QkNode::Feature { layer: l, feature: i % f, pos: i / f });
            }
        }
        if !nodes.is_empty() {
            let n = nodes.len();
            let positions: Vec<usize> = nodes.iter().map(|n| n.pos()).collect();
            let sel = Tensor::<1, Int>::from_data(TensorData::new(idx, [n]), &device);
            let scale = tensor(values, [n, 1], &device);
            let mut v = Tensor::<2>::zeros([n, d], &device);
            for (k, w_dec) in tc.w_dec.iter().enumerate().take(layer - l) {
                v = v + through(&posts[l + k], w_dec.clone().select(0, sel.clone()) * scale.clone(), &positions);
            }
            emit(Part { nodes, vectors: v, constant: false })?;
        }
        dense.push(tensor(acts, [n_pos, f], &device));
        let mut recon = tc.b_dec.clone().reshape([1, d]).expand([n_pos, d]);
        // Layer `s`'s decoder into layer `l`, where it has one (a CLT's earlier layers).
        for (s, acts) in dense.iter().enumerate() {
            if let Some(w_dec) = set.layers[s].w_dec.get(l - s) {
                recon = recon + acts.clone().matmul(w_dec.clone());
            }
        }
        if let Some(skip) = tc.skip(x) {
            recon = recon + skip.clone();
            emit(Part {
                nodes: every.iter().map(|&pos| QkNode::Skip { layer: l, pos }).collect(),
                vectors: through(&posts[l], skip, &every),
                constant: false,
            })?;
        }
        let mlp_out = take_rows(cache, BlockHook::MlpOut.at(l))?;
        let mut error = mlp_out - through(&posts[l], recon, &every);
        bias = bias + through(&posts[l], tc.b_dec.clone().reshape([1, d]).expand([n_pos, d]), &every);
        if let Some(b) = constant_of(&posts[l]) {
            error = error - b.clone();
            bias = bias + b;
        }
        emit(Part { nodes: every.iter().map(|&pos| QkNode::Error { layer: l, pos }).collect(), vectors: error, constant: false })?;
    }
    emit(Part { nodes: every.iter().map(|&pos| QkNode::Bias { pos }).collect(), vectors: bias, constant: true })?;
    let resid = take_rows(cache, BlockHook::ResidPre.at(layer))?.into_data().try_into_vec_as::<f32>().expect("f32");
    Ok((resid, sum))
}
