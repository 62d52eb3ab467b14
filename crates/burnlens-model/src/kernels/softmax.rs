//! Softmax over the last dimension, forward and backward in one pass over each row.
//!
//! The explicit attention path (taken when a hook wants the scores, the pattern or `z`)
//! normalises `[batch, head, query, key]` scores with it: Burn's composed softmax makes four
//! tensors (max, shifted, exponentials, sums) and calls libm's `expf` once per element.
//! Forward: `y = e^(x - max) / Σ e^(x - max)`, masked scores (-1e30 or -inf) give 0, a row of
//! only masked scores gives the uniform row the composed ops give. Backward:
//! `dx = y (dy - Σ dy y)`. Contract: any shape, f32, rows of the last dimension; tolerance
//! 1e-6 absolute on probabilities, 1e-5 relative on gradients.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::flex::FlexTensor;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Backend, Dispatch, Flex, backend_extension};
use burn::tensor::Tensor;

use super::exp;
use super::flex::{contiguous, flex_vec, use_kernels};
use super::pool;
use super::simd::{self, dispatch};
use super::unfilled::unfilled;

#[backend_extension(Flex, Autodiff)]
pub trait SoftmaxKernel: Backend {
    fn bl_softmax(x: FloatTensor<Self>) -> FloatTensor<Self>;
}

/// Softmax of `x` over its last dimension: the kernel on flex, the GPU kernel
/// ([`crate::gpu::softmax`]) on a `Cube` device (with its own backward under autodiff), composed ops
/// elsewhere.
pub fn softmax<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    if use_kernels(&[&x.device()], &[x.dtype()]) {
        return Tensor::from_dispatch(Dispatch::bl_softmax(x.into_dispatch()));
    }
    if crate::gpu::softmax_runs(&x) {
        return crate::gpu::softmax(x).expect("the kernel takes what it said it runs");
    }
    softmax_reference(x)
}

/// Burn's composed softmax: what the kernel is tested against.
pub fn softmax_reference<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    burn::tensor::activation::softmax(x, D - 1)
}

/// `y` = softmax of each `d`-long row of `x`.
pub fn forward(x: &[f32], y: &mut [f32], d: usize) {
    let chunk = pool::rows_per_task(d) * d;
    pool::for_chunks(y, chunk, |i, y| {
        let x = &x[i * chunk..i * chunk + y.len()];
        dispatch!(|y: &mut [f32], x: &[f32], d: usize| -> () {
            for (yr, xr) in y.chunks_exact_mut(d).zip(x.chunks_exact(d)) {
                let max = simd::max_by(xr, |v| v);
                // A row of only -inf: every term equal, as the composed ops give.
                let shift = if max == f32::NEG_INFINITY { 0.0 } else { max };
                // `e^(x - shift)` and their sum in one pass over the row's copy.
                yr.copy_from_slice(xr);
                let sum = exp::exp_scaled_sum(yr, 1.0, shift);
                let inv = if sum > 0.0 { 1.0 / sum } else { 1.0 / d as f32 };
                let fill = if sum > 0.0 { None } else { Some(inv) };
                for yi in yr.iter_mut() {
                    *yi = fill.unwrap_or(*yi * inv);
                }
            }
        })
    });
}

/// `dx = y (dy - Σ dy y)` per row.
pub fn backward(y: &[f32], dy: &[f32], dx: &mut [f32], d: usize) {
    let chunk = pool::rows_per_task(d) * d;
    pool::for_chunks(dx, chunk, |i, dx| {
        let (y, dy) = (&y[i * chunk..i * chunk + dx.len()], &dy[i * chunk..i * chunk + dx.len()]);
        dispatch!(|dx: &mut [f32], y: &[f32], dy: &[f32], d: usize| -> () {
            for ((dxr, yr), dyr) in dx.chunks_exact_mut(d).zip(y.chunks_exact(d)).zip(dy.chunks_exact(d)) {
                let dot = simd::sum_by2(yr, dyr, |a, b| a * b);
                for ((dxi, &yi), &dyi) in dxr.iter_mut().zip(yr).zip(dyr) {
                    *dxi = yi * (dyi - dot);
                }
            }
        })
    });
}

fn flex_forward(x: &FlexTensor) -> FlexTensor {
    super::flex::record(super::flex::Op::Softmax, false);
    let x = contiguous(x);
    let shape = x.layout().shape().clone();
    let d = shape.as_slice().last().copied().unwrap_or(1);
    let mut y = unfilled(x.layout().num_elements());
    forward(x.storage(), &mut y, d);
    flex_vec(y, shape)
}

impl SoftmaxKernel for Flex {
    fn bl_softmax(x: FlexTensor) -> FlexTensor {
        flex_forward(&x)
    }
}

#[derive(Debug)]
struct SoftmaxBackward;

impl Backward<Flex, 1> for SoftmaxBackward {
    /// The output.
    type State = FlexTensor;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        super::flex::record(super::flex::Op::Softmax, true);
        let [node_x] = ops.parents;
        let dy = contiguous(&grads.consume::<Flex>(&ops.node));
        if let Some(node) = node_x {
            let y = contiguous(&ops.state);
            let shape = y.layout().shape().clone();
            let d = shape.as_slice().last().copied().unwrap_or(1);
            let mut dx = unfilled(y.layout().num_elements());
            backward(y.storage(), dy.storage(), &mut dx, d);
            grads.register::<Flex>(node.id, flex_vec(dx, shape));
        }
    }
}

impl<C: CheckpointStrategy> SoftmaxKernel for Autodiff<Flex, C> {
    fn bl_softmax(x: FloatTensor<Self>) -> FloatTensor<Self> {
        let (x, gx) = x.into_parts();
        match SoftmaxBackward.prepare::<C>([gx]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let y = flex_forward(&x);
                prep.finish(y.clone(), y)
            }
            OpsKind::UnTracked(prep) => prep.finish(flex_forward(&x)),
        }
    }
}
