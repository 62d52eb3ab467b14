//! Softmax over the last dimension on a GPU in one launch, where Burn's composed softmax
//! launches five kernels (two reductions, three element-wise): a cube per row (32 to 256
//! units), three passes over it — its maximum, the sum of `e^(x - max)`, the output — each reduced
//! over the cube ([`super::cube_reduce`]). Same contract as [`crate::kernels::softmax`]:
//! masked scores (−1e30 or −∞) give 0, a row of only −∞ the uniform row. Under autodiff its
//! backward is one more launch of the same shape, `dx = y (g - Σ g y)` per row.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
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

/// The backward's kernel.
#[backend_extension(Cube, Fusion: cfg(feature = "fusion"))]
pub trait RowSoftmaxGrad: Backend {
    /// `y (g - Σ g y)` per row, from the softmax's output `y` and its gradient `g`.
    #[fusion(dtype = y, shape = y.clone())]
    fn bl_gpu_softmax_grad(y: FloatTensor<Self>, g: FloatTensor<Self>) -> FloatTensor<Self>;
}

impl RowSoftmax for CubeBackend {
    fn bl_gpu_softmax(x: CubeTensor) -> CubeTensor {
        rows(x, None)
    }
}

impl RowSoftmaxGrad for CubeBackend {
    fn bl_gpu_softmax_grad(y: CubeTensor, g: CubeTensor) -> CubeTensor {
        rows(y, Some(g))
    }
}

/// The kernel over contiguous copies: the softmax of `x`'s rows, or given `g` the backward
/// from the output `x` and its gradient `g`.
fn rows(x: CubeTensor, g: Option<CubeTensor>) -> CubeTensor {
    let (x, g) = (into_contiguous(x), g.map(into_contiguous));
    let (rows, d) = (x.meta.shape()[0], x.meta.shape()[1]);
    let client = x.client.clone();
    let out = empty_device_dtype(client.clone(), x.device.clone(), [rows, d].into(), DType::F32);
    if rows == 0 {
        return out;
    }
    let (count, dim) = (CubeCount::Static(rows.min(GRID_LIMIT) as u32, 1, 1), CubeDim::new_1d(row_units(d)));
    let arg = |t: &CubeTensor| unsafe { BufferArg::from_raw_parts(t.handle.clone(), rows * d) };
    match &g {
        Some(g) => softmax_grad_rows::launch(&client, count, dim, arg(&x), arg(g), arg(&out), rows as u32, d as u32, row_units(d)),
        None => softmax_rows::launch(&client, count, dim, arg(&x), arg(&out), rows as u32, d as u32, row_units(d)),
    }
    out
}

#[derive(Debug)]
struct RowSoftmaxBackward;

impl Backward<Cube, 1> for RowSoftmaxBackward {
    /// The softmax's output.
    type State = FloatTensor<Cube>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node] = ops.parents;
        let g = grads.consume::<Cube>(&ops.node);
        if let Some(node) = node {
            grads.register::<Cube>(node.id, Cube::bl_gpu_softmax_grad(ops.state, g));
        }
    }
}

impl<C: CheckpointStrategy> RowSoftmax for Autodiff<Cube, C> {
    fn bl_gpu_softmax(x: FloatTensor<Self>) -> FloatTensor<Self> {
        let (x, gx) = x.into_parts();
        let out = Cube::bl_gpu_softmax(x);
        match RowSoftmaxBackward.prepare::<C>([gx]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish(out.clone(), out),
            OpsKind::UnTracked(prep) => prep.finish(out),
        }
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

/// Rows `CUBE_POS_X, CUBE_POS_X + CUBE_COUNT_X, …` of `x: [rows, d]`, each `e^(x - max) / Σ`.
#[cube(launch)]
fn softmax_rows(x: &[f32], y: &mut [f32], rows: u32, d: u32, #[comptime] units: u32) {
    let mut shared = Shared::<[f32]>::new_slice(comptime!(units as usize));
    let steps = d.div_ceil(units);
    let mut row = CUBE_POS_X;
    // Uniform over the cube: every unit of a cube takes the same rows.
    while row < rows {
        let base = row as usize * d as usize;
        // The lowest finite value: a row of only −∞ keeps it, and every term is e^−∞ = 0.
        let mut top = f32::min_value();
        for step in 0..steps {
            let i = step * units + UNIT_POS;
            if i < d {
                top = f32::max(top, x[base + i as usize]);
            }
        }
        let shift = cube_max(top, &mut shared);
        let mut s = 0.0f32;
        for step in 0..steps {
            let i = step * units + UNIT_POS;
            if i < d {
                s += f32::exp(x[base + i as usize] - shift);
            }
        }
        let sum = cube_sum(s, &mut shared);
        for step in 0..steps {
            let i = step * units + UNIT_POS;
            if i < d {
                let mut v = f32::exp(x[base + i as usize] - shift) / sum;
                // A row of only −∞ sums to 0: the uniform row, as the composed ops give.
                if sum == 0.0f32 {
                    v = 1.0f32 / f32::cast_from(d);
                }
                y[base + i as usize] = v;
            }
        }
        row += CUBE_COUNT_X;
    }
}

/// Rows `CUBE_POS_X, CUBE_POS_X + CUBE_COUNT_X, …` of the backward: `y (g - Σ g y)`.
#[cube(launch)]
fn softmax_grad_rows(y: &[f32], g: &[f32], dx: &mut [f32], rows: u32, d: u32, #[comptime] units: u32) {
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
                dx[base + i as usize] = y[base + i as usize] * (g[base + i as usize] - dot);
            }
        }
        row += CUBE_COUNT_X;
    }
}
