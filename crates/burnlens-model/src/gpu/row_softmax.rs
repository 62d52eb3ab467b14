//! Softmax over the last dimension on a GPU in one launch, where Burn's composed softmax
//! launches five kernels (two reductions, three element-wise): a cube per row (32 to 256
//! units), three passes over it — its maximum, the sum of `e^(x - max)`, the output — each reduced
//! over the cube ([`super::cube_reduce`]). Same contract as [`crate::kernels::softmax`]:
//! masked scores (−1e30 or −∞) give 0, a row of only −∞ the uniform row. Under autodiff its
//! backward is one more launch of the same shape, `dx = y (g - Σ g y)` per row.
//!
//! The same launch makes attention's pattern from the raw scores `q kᵀ`
//! ([`AttentionPattern`]): the scale and the causal (and local-window) mask applied as the
//! row is read, where the composed path launches two more kernels a layer (the scale, the
//! mask's fill) and writes the scores twice more; masked keys get 0, as the filled scores'
//! `e^(MIN - max)` does. Its backward is the softmax's, times the scale.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, NodeGuard, Ops, OpsKind};
use burn::backend::{Autodiff, Backend, Cube, backend_extension, tensor::FloatTensor};
use burn::tensor::{DType, Tensor};
use burn_cubecl::CubeBackend;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::cube_reduce::{cube_max, cube_sum, row_units};
use super::exact_matmul::on_cube;
use super::grid::GRID_LIMIT;

/// The extension that carries a dispatch tensor to the kernel (and its autodiff wrapper).
#[backend_extension(Cube, Fusion: cfg(feature = "fusion"), Autodiff)]
pub trait RowSoftmax: Backend {
    /// Softmax of each row of `x: [rows, d]`.
    #[fusion(dtype = x, shape = x.clone())]
    fn bl_gpu_softmax(x: FloatTensor<Self>) -> FloatTensor<Self>;
}

/// Attention's pattern from raw scores in one launch (and its autodiff wrapper).
#[backend_extension(Cube, Fusion: cfg(feature = "fusion"), Autodiff)]
pub trait AttentionPattern: Backend {
    /// The softmax of `scale · scores` over each row of `scores: [rows, keys]` with the keys
    /// its query does not see left out (given 0): row `r` is query `r % queries` of its
    /// head, at position `q_offset + r % queries`, seeing the keys up to its own position
    /// and, with a `window` (0: none), only the last `window` of them.
    #[fusion(dtype = scores, shape = scores.clone())]
    fn bl_gpu_attention_pattern(scores: FloatTensor<Self>, scale: f32, queries: usize, q_offset: usize, window: usize) -> FloatTensor<Self>;
}

/// The backward's kernel.
#[backend_extension(Cube, Fusion: cfg(feature = "fusion"))]
pub trait RowSoftmaxGrad: Backend {
    /// `scale · y (g - Σ g y)` per row, from the softmax's output `y` and its gradient `g`
    /// (`scale`: what the softmax's input was multiplied by, 1 for a plain softmax).
    #[fusion(dtype = y, shape = y.clone())]
    fn bl_gpu_softmax_grad(y: FloatTensor<Self>, g: FloatTensor<Self>, scale: f32) -> FloatTensor<Self>;
}

/// Which entries of a row a softmax reads, and what it multiplies them by.
#[derive(Debug, Clone, Copy)]
struct Rule {
    scale: f32,
    /// Attention's mask: `(queries, q_offset, window)`; `None`: every entry.
    causal: Option<(usize, usize, usize)>,
}

impl RowSoftmax for CubeBackend {
    fn bl_gpu_softmax(x: CubeTensor) -> CubeTensor {
        rows(x, Rule { scale: 1.0, causal: None })
    }
}

impl AttentionPattern for CubeBackend {
    fn bl_gpu_attention_pattern(scores: CubeTensor, scale: f32, queries: usize, q_offset: usize, window: usize) -> CubeTensor {
        rows(scores, Rule { scale, causal: Some((queries, q_offset, window)) })
    }
}

impl RowSoftmaxGrad for CubeBackend {
    fn bl_gpu_softmax_grad(y: CubeTensor, g: CubeTensor, scale: f32) -> CubeTensor {
        grad_rows(y, g, scale)
    }
}

/// A contiguous copy of `t: [rows, d]` and an empty output like it.
fn with_output(t: CubeTensor) -> (CubeTensor, CubeTensor, [usize; 2]) {
    let t = into_contiguous(t);
    let (rows, d) = (t.meta.shape()[0], t.meta.shape()[1]);
    let out = empty_device_dtype(t.client.clone(), t.device.clone(), [rows, d].into(), DType::F32);
    (t, out, [rows, d])
}

/// A cube per row (up to the grid's limit), its units by the row's length.
fn row_launch(rows: usize, d: usize) -> (CubeCount, CubeDim) {
    (CubeCount::Static(rows.min(GRID_LIMIT) as u32, 1, 1), CubeDim::new_1d(row_units(d)))
}

/// The softmax of `x`'s rows under `rule`.
fn rows(x: CubeTensor, rule: Rule) -> CubeTensor {
    let (x, out, [rows, d]) = with_output(x);
    if rows == 0 {
        return out;
    }
    let (count, dim) = row_launch(rows, d);
    let arg = |t: &CubeTensor| unsafe { BufferArg::from_raw_parts(t.handle.clone(), rows * d) };
    let (queries, q_offset, window) = rule.causal.unwrap_or((1, 0, 0));
    let mask = [queries as u32, q_offset as u32, window as u32];
    softmax_rows::launch(
        &x.client,
        count,
        dim,
        arg(&x),
        arg(&out),
        rows as u32,
        d as u32,
        rule.scale,
        mask[0],
        mask[1],
        mask[2],
        row_units(d),
        rule.causal.is_some(),
    );
    out
}

/// The backward from the output `y` and its gradient `g`.
fn grad_rows(y: CubeTensor, g: CubeTensor, scale: f32) -> CubeTensor {
    let (y, out, [rows, d]) = with_output(y);
    let g = into_contiguous(g);
    if rows == 0 {
        return out;
    }
    let (count, dim) = row_launch(rows, d);
    let arg = |t: &CubeTensor| unsafe { BufferArg::from_raw_parts(t.handle.clone(), rows * d) };
    softmax_grad_rows::launch(&y.client, count, dim, arg(&y), arg(&g), arg(&out), rows as u32, d as u32, scale, row_units(d));
    out
}

#[derive(Debug)]
struct RowSoftmaxBackward;

impl Backward<Cube, 1> for RowSoftmaxBackward {
    /// The softmax's output and the scale of its input.
    type State = (FloatTensor<Cube>, f32);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node] = ops.parents;
        let g = grads.consume::<Cube>(&ops.node);
        let (y, scale) = ops.state;
        if let Some(node) = node {
            grads.register::<Cube>(node.id, Cube::bl_gpu_softmax_grad(y, g, scale));
        }
    }
}

/// Records the output `out` of a softmax of `scale ·` the input tracked by `gx`.
fn tracked<C: CheckpointStrategy>(gx: NodeGuard, out: FloatTensor<Cube>, scale: f32) -> FloatTensor<Autodiff<Cube, C>> {
    match RowSoftmaxBackward.prepare::<C>([gx]).compute_bound().stateful() {
        OpsKind::Tracked(prep) => prep.finish((out.clone(), scale), out),
        OpsKind::UnTracked(prep) => prep.finish(out),
    }
}

impl<C: CheckpointStrategy> RowSoftmax for Autodiff<Cube, C> {
    fn bl_gpu_softmax(x: FloatTensor<Self>) -> FloatTensor<Self> {
        let (x, gx) = x.into_parts();
        tracked::<C>(gx, Cube::bl_gpu_softmax(x), 1.0)
    }
}

impl<C: CheckpointStrategy> AttentionPattern for Autodiff<Cube, C> {
    fn bl_gpu_attention_pattern(scores: FloatTensor<Self>, scale: f32, queries: usize, q_offset: usize, window: usize) -> FloatTensor<Self> {
        let (x, gx) = scores.into_parts();
        tracked::<C>(gx, Cube::bl_gpu_attention_pattern(x, scale, queries, q_offset, window), scale)
    }
}

/// Whether the kernel takes `x: [.., d]`: plain f32 on a `Cube` device (tracked or not),
/// `d ≥ 1`.
pub fn applies<const D: usize>(x: &Tensor<D>) -> bool {
    let shapes = x.dims()[D - 1] >= 1 && x.shape().num_elements() < u32::MAX as usize;
    shapes && x.dtype() == DType::F32 && on_cube(&x.device())
}

/// See [`super::softmax`].
pub fn softmax<const D: usize>(x: Tensor<D>) -> Option<Tensor<D>> {
    if !applies(&x) {
        return None;
    }
    let dims = x.dims();
    let d = dims[D - 1];
    let rows = x.shape().num_elements() / d;
    let y = <burn::backend::Dispatch as RowSoftmax>::bl_gpu_softmax(x.reshape([rows, d]).into_dispatch());
    Some(Tensor::<2>::from_dispatch(y).reshape(dims))
}

/// See [`super::attention_pattern`]: `scores: [batch, heads, queries, keys]`.
pub fn attention_pattern(scores: Tensor<4>, scale: f32, q_offset: usize, window: usize) -> Option<Tensor<4>> {
    if !applies(&scores) {
        return None;
    }
    let dims = scores.dims();
    let (queries, keys) = (dims[2], dims[3]);
    let flat = scores.reshape([dims[0] * dims[1] * queries, keys]).into_dispatch();
    let y = <burn::backend::Dispatch as AttentionPattern>::bl_gpu_attention_pattern(flat, scale, queries, q_offset, window);
    Some(Tensor::<2>::from_dispatch(y).reshape(dims))
}

/// Rows `CUBE_POS_X, CUBE_POS_X + CUBE_COUNT_X, …` of `x: [rows, d]`, each `e^(s x - max) / Σ`
/// over the entries the row reads (all, or where `causal` those its query sees, see
/// [`AttentionPattern`]), 0 elsewhere.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn softmax_rows(
    x: &[f32],
    y: &mut [f32],
    rows: u32,
    d: u32,
    scale: f32,
    queries: u32,
    q_offset: u32,
    window: u32,
    #[comptime] units: u32,
    #[comptime] causal: bool,
) {
    let mut shared = Shared::<[f32]>::new_slice(comptime!(units as usize));
    let steps = d.div_ceil(units);
    let mut row = CUBE_POS_X;
    // Uniform over the cube: every unit of a cube takes the same rows.
    while row < rows {
        let base = row as usize * d as usize;
        // The entries `lo..hi` are read.
        let mut lo = 0u32;
        let mut hi = d;
        if causal {
            let seen = q_offset + row % queries + 1;
            hi = u32::min(seen, d);
            if window > 0u32 && seen > window {
                lo = u32::min(seen - window, hi);
            }
        }
        // The lowest finite value: a row of only −∞ keeps it, and every term is e^−∞ = 0.
        let mut top = f32::min_value();
        for step in 0..steps {
            let i = step * units + UNIT_POS;
            if i >= lo && i < hi {
                top = f32::max(top, x[base + i as usize] * scale);
            }
        }
        let shift = cube_max(top, &mut shared);
        let mut s = 0.0f32;
        for step in 0..steps {
            let i = step * units + UNIT_POS;
            if i >= lo && i < hi {
                s += f32::exp(x[base + i as usize] * scale - shift);
            }
        }
        let sum = cube_sum(s, &mut shared);
        for step in 0..steps {
            let i = step * units + UNIT_POS;
            if i < d {
                let mut v = 0.0f32;
                if i >= lo && i < hi {
                    v = f32::exp(x[base + i as usize] * scale - shift) / sum;
                    // A row of only −∞ sums to 0: the uniform row, as the composed ops give.
                    if sum == 0.0f32 {
                        v = 1.0f32 / f32::cast_from(hi - lo);
                    }
                }
                y[base + i as usize] = v;
            }
        }
        row += CUBE_COUNT_X;
    }
}

/// Rows `CUBE_POS_X, CUBE_POS_X + CUBE_COUNT_X, …` of the backward: `scale · y (g - Σ g y)`.
#[cube(launch)]
fn softmax_grad_rows(y: &[f32], g: &[f32], dx: &mut [f32], rows: u32, d: u32, scale: f32, #[comptime] units: u32) {
    let mut shared = Shared::<[f32]>::new_slice(comptime!(units as usize));
    let steps = d.div_ceil(units);
    let mut row = CUBE_POS_X;
    while row < rows {
        let base = row as usize * d as usize;
        let mut s = 0.0f32;
        for step in 0..steps {
            let i = step * units + UNIT_POS;
            if i < d {
                s += g[base + i as usize] * y[base + i as usize];
            }
        }
        let dot = cube_sum(s, &mut shared);
        for step in 0..steps {
            let i = step * units + UNIT_POS;
            if i < d {
                dx[base + i as usize] = scale * (y[base + i as usize] * (g[base + i as usize] - dot));
            }
        }
        row += CUBE_COUNT_X;
    }
}
