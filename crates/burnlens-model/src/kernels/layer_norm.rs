//! Fused LayerNorm and RMSNorm over the last dimension, forward and backward.
//!
//! Contract: `x: [.., d]`, `weight: [d]`, `bias: [d]` (LayerNorm only), f32. LayerNorm
//! `y = (x - mean) * rstd * w + b` with the biased variance and `rstd = 1 / sqrt(var + eps)`;
//! RMSNorm `y = x * rstd * w` with `rstd = 1 / sqrt(mean(x²) + eps)`. One pass per row; the
//! forward keeps `(mean, rstd)` per row (mean 0 for RMSNorm) for the backward:
//! `dx = rstd * (g - mean(g) - x̂ mean(g x̂))` (RMSNorm: without `mean(g)`) with `g = dy * w`,
//! `x̂ = (x - mean) rstd`, `dw = Σ dy x̂`, `db = Σ dy`.
//! Tolerance against the composed ops: 1e-5 relative (values), 1e-4 (gradients).

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::flex::FlexTensor;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Backend, Dispatch, Flex, backend_extension};
use burn::tensor::{Shape, Tensor};

use super::flex::{contiguous, flex_vec, use_kernels};
use super::pool;
use super::simd::{self, dispatch};
use super::unfilled::unfilled;

#[backend_extension(Flex, Autodiff)]
pub trait NormKernel: Backend {
    fn bl_layer_norm(x: FloatTensor<Self>, w: FloatTensor<Self>, b: FloatTensor<Self>, eps: f64) -> FloatTensor<Self>;
    fn bl_rms_norm(x: FloatTensor<Self>, w: FloatTensor<Self>, eps: f64) -> FloatTensor<Self>;
}

/// LayerNorm of `x: [.., d]` over its last dimension: the fused kernel on flex, the GPU
/// kernel ([`crate::gpu::row_norm`]) on a `Cube` device (with its own backward under autodiff), the
/// backend's own `module::layer_norm` elsewhere.
pub fn layer_norm<const D: usize>(x: Tensor<D>, weight: Tensor<1>, bias: Tensor<1>, eps: f64) -> Tensor<D> {
    if use_kernels(&[&x.device()], &[x.dtype(), weight.dtype(), bias.dtype()]) {
        return Tensor::from_dispatch(Dispatch::bl_layer_norm(x.into_dispatch(), weight.into_dispatch(), bias.into_dispatch(), eps));
    }
    if crate::gpu::row_norm_runs(&x, &[&weight, &bias]) {
        return crate::gpu::row_norm(x, weight, Some(bias), eps).expect("the kernel takes what it said it runs");
    }
    burn::tensor::module::layer_norm(x, weight, Some(bias), eps)
}

/// The composed LayerNorm: what the kernel is tested against.
pub fn layer_norm_reference<const D: usize>(x: Tensor<D>, weight: Tensor<1>, bias: Tensor<1>, eps: f64) -> Tensor<D> {
    let (var, mean) = x.clone().var_mean_bias(D - 1);
    let xhat = (x - mean) / (var + eps).sqrt();
    xhat * weight.unsqueeze::<D>() + bias.unsqueeze::<D>()
}

/// RMSNorm of `x: [.., d]` over its last dimension: the fused kernel on flex, the GPU kernel
/// on a `Cube` device (with its own backward under autodiff), composed ops elsewhere.
pub fn rms_norm<const D: usize>(x: Tensor<D>, weight: Tensor<1>, eps: f64) -> Tensor<D> {
    if use_kernels(&[&x.device()], &[x.dtype(), weight.dtype()]) {
        return Tensor::from_dispatch(Dispatch::bl_rms_norm(x.into_dispatch(), weight.into_dispatch(), eps));
    }
    if crate::gpu::row_norm_runs(&x, &[&weight]) {
        return crate::gpu::row_norm(x, weight, None, eps).expect("the kernel takes what it said it runs");
    }
    rms_norm_reference(x, weight, eps)
}

/// The composed RMSNorm.
pub fn rms_norm_reference<const D: usize>(x: Tensor<D>, weight: Tensor<1>, eps: f64) -> Tensor<D> {
    let ms = x.clone().square().mean_dim(D - 1);
    x / (ms + eps).sqrt() * weight.unsqueeze::<D>()
}

/// `y` and `stats` (`[rows, 2]`: mean, rstd) from contiguous `x`; `b = None` and
/// `center = false` make an RMSNorm.
pub fn forward(x: &[f32], w: &[f32], b: Option<&[f32]>, eps: f32, center: bool, y: &mut [f32], stats: &mut [f32]) {
    let d = w.len();
    let rpt = pool::rows_per_task(d);
    let zeros = vec![0.0f32; if b.is_some() { 0 } else { d }];
    let b: &[f32] = b.unwrap_or(&zeros);
    pool::for_chunks2(y, rpt * d, stats, rpt * 2, |i, y, st| {
        let x = &x[i * rpt * d..i * rpt * d + y.len()];
        dispatch!(|y: &mut [f32], x: &[f32], st: &mut [f32], w: &[f32], b: &[f32], eps: f32, center: bool| -> () {
            let d = w.len();
            let inv_d = 1.0 / d as f32;
            for ((yr, xr), s) in y.chunks_exact_mut(d).zip(x.chunks_exact(d)).zip(st.chunks_exact_mut(2)) {
                let mean = if center { simd::sum_by(xr, |x| x) * inv_d } else { 0.0 };
                let var = simd::sum_by(xr, |x| (x - mean) * (x - mean)) * inv_d;
                let rstd = 1.0 / (var + eps).sqrt();
                for (((y, &x), &w), &b) in yr.iter_mut().zip(xr).zip(w).zip(b) {
                    *y = (x - mean) * rstd * w + b;
                }
                s[0] = mean;
                s[1] = rstd;
            }
        })
    });
}

/// `dx` (written) and `(dw, db)` (returned when `need_wb`; `db` is meaningless for RMSNorm).
pub fn backward(x: &[f32], w: &[f32], stats: &[f32], dy: &[f32], center: bool, dx: &mut [f32], need_wb: bool) -> Option<(Vec<f32>, Vec<f32>)> {
    let d = w.len();
    let rpt = pool::rows_per_task(d);
    let tasks = dx.len().div_ceil(rpt * d);
    // One [dw | db] partial sum per task, added up afterwards.
    let mut partial = vec![0.0f32; if need_wb { tasks * 2 * d } else { 0 }];
    let acc_chunk = if need_wb { 2 * d } else { 1 };
    let partial_ptr = pool::SendPtr(partial.as_mut_ptr());
    pool::for_chunks(dx, rpt * d, |i, dx| {
        let p = partial_ptr;
        let (x, dy) = (&x[i * rpt * d..i * rpt * d + dx.len()], &dy[i * rpt * d..i * rpt * d + dx.len()]);
        let st = &stats[i * rpt * 2..i * rpt * 2 + dx.len() / d * 2];
        // SAFETY: each task owns its own partial sum.
        let acc: &mut [f32] = if need_wb { unsafe { std::slice::from_raw_parts_mut(p.0.add(i * acc_chunk), acc_chunk) } } else { &mut [] };
        dispatch!(|dx: &mut [f32], x: &[f32], dy: &[f32], st: &[f32], w: &[f32], acc: &mut [f32], center: bool| -> () {
            let d = w.len();
            let inv_d = 1.0 / d as f32;
            for (((dxr, xr), dyr), s) in dx.chunks_exact_mut(d).zip(x.chunks_exact(d)).zip(dy.chunks_exact(d)).zip(st.chunks_exact(2)) {
                let (mean, rstd) = (s[0], s[1]);
                let mg = if center { simd::sum_by2(dyr, w, |dy, w| dy * w) * inv_d } else { 0.0 };
                let mgx = simd::sum_by3(dyr, w, xr, |dy, w, x| dy * w * ((x - mean) * rstd)) * inv_d;
                if !acc.is_empty() {
                    let (aw, ab) = acc.split_at_mut(d);
                    for (((aw, ab), &dy), &x) in aw.iter_mut().zip(ab.iter_mut()).zip(dyr).zip(xr) {
                        *aw += dy * ((x - mean) * rstd);
                        *ab += dy;
                    }
                }
                for (((dx, &dy), &w), &x) in dxr.iter_mut().zip(dyr).zip(w).zip(xr) {
                    let xhat = (x - mean) * rstd;
                    *dx = rstd * (dy * w - mg - xhat * mgx);
                }
            }
        });
    });
    if !need_wb {
        return None;
    }
    let mut sums = vec![0.0f32; 2 * d];
    for p in partial.chunks_exact(2 * d) {
        for (s, v) in sums.iter_mut().zip(p) {
            *s += *v;
        }
    }
    let (dw, db) = sums.split_at(d);
    Some((dw.to_vec(), db.to_vec()))
}

fn flex_forward(x: &FlexTensor, w: &FlexTensor, b: Option<&FlexTensor>, eps: f64) -> (FlexTensor, FlexTensor) {
    super::flex::record(super::flex::Op::LayerNorm, false);
    let (x, w) = (contiguous(x), contiguous(w));
    let b = b.map(contiguous);
    let shape = x.layout().shape().clone();
    let d = w.layout().num_elements();
    let rows = shape.num_elements() / d.max(1);
    let mut y = unfilled(shape.num_elements());
    let mut stats = unfilled(2 * rows);
    forward(x.storage(), w.storage(), b.as_ref().map(|b| b.storage()), eps as f32, b.is_some(), &mut y, &mut stats);
    (flex_vec(y, shape), flex_vec(stats, Shape::from(vec![rows, 2])))
}

impl NormKernel for Flex {
    fn bl_layer_norm(x: FlexTensor, w: FlexTensor, b: FlexTensor, eps: f64) -> FlexTensor {
        flex_forward(&x, &w, Some(&b), eps).0
    }
    fn bl_rms_norm(x: FlexTensor, w: FlexTensor, eps: f64) -> FlexTensor {
        flex_forward(&x, &w, None, eps).0
    }
}

/// The gradients of a norm from its saved state: `[dx, dw, db]`, each only if wanted.
fn gradients(x: &FlexTensor, w: &FlexTensor, stats: &FlexTensor, dy: &FlexTensor, center: bool, want: [bool; 3]) -> [Option<FlexTensor>; 3] {
    super::flex::record(super::flex::Op::LayerNorm, true);
    let (x, w, stats, dy) = (contiguous(x), contiguous(w), contiguous(stats), contiguous(dy));
    let shape = x.layout().shape().clone();
    let d = w.layout().num_elements();
    let mut dx = unfilled(shape.num_elements());
    let wb = backward(x.storage(), w.storage(), stats.storage(), dy.storage(), center, &mut dx, want[1] || want[2]);
    let (dw, db) = match wb {
        Some((dw, db)) => (Some(flex_vec(dw, Shape::from(vec![d]))), Some(flex_vec(db, Shape::from(vec![d])))),
        None => (None, None),
    };
    [want[0].then(|| flex_vec(dx, shape)), dw.filter(|_| want[1]), db.filter(|_| want[2])]
}

#[derive(Debug)]
struct LayerNormBackward;

impl Backward<Flex, 3> for LayerNormBackward {
    /// `x`, `w` and the per-row `(mean, rstd)`.
    type State = (FlexTensor, FlexTensor, FlexTensor);

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_x, node_w, node_b] = ops.parents;
        let dy = grads.consume::<Flex>(&ops.node);
        let (x, w, stats) = ops.state;
        let g = gradients(&x, &w, &stats, &dy, true, [node_x.is_some(), node_w.is_some(), node_b.is_some()]);
        for (node, g) in [node_x, node_w, node_b].into_iter().zip(g) {
            if let (Some(node), Some(g)) = (node, g) {
                grads.register::<Flex>(node.id, g);
            }
        }
    }
}

#[derive(Debug)]
struct RmsNormBackward;

impl Backward<Flex, 2> for RmsNormBackward {
    type State = (FlexTensor, FlexTensor, FlexTensor);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_x, node_w] = ops.parents;
        let dy = grads.consume::<Flex>(&ops.node);
        let (x, w, stats) = ops.state;
        let [dx, dw, _] = gradients(&x, &w, &stats, &dy, false, [node_x.is_some(), node_w.is_some(), false]);
        for (node, g) in [(node_x, dx), (node_w, dw)] {
            if let (Some(node), Some(g)) = (node, g) {
                grads.register::<Flex>(node.id, g);
            }
        }
    }
}

impl<C: CheckpointStrategy> NormKernel for Autodiff<Flex, C> {
    fn bl_layer_norm(x: FloatTensor<Self>, w: FloatTensor<Self>, b: FloatTensor<Self>, eps: f64) -> FloatTensor<Self> {
        let (x, gx) = x.into_parts();
        let (w, gw) = w.into_parts();
        let (b, gb) = b.into_parts();
        match LayerNormBackward.prepare::<C>([gx, gw, gb]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let (y, stats) = flex_forward(&x, &w, Some(&b), eps);
                prep.finish((x, w, stats), y)
            }
            OpsKind::UnTracked(prep) => prep.finish(flex_forward(&x, &w, Some(&b), eps).0),
        }
    }

    fn bl_rms_norm(x: FloatTensor<Self>, w: FloatTensor<Self>, eps: f64) -> FloatTensor<Self> {
        let (x, gx) = x.into_parts();
        let (w, gw) = w.into_parts();
        match RmsNormBackward.prepare::<C>([gx, gw]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let (y, stats) = flex_forward(&x, &w, None, eps);
                prep.finish((x, w, stats), y)
            }
            OpsKind::UnTracked(prep) => prep.finish(flex_forward(&x, &w, None, eps).0),
        }
    }
}
