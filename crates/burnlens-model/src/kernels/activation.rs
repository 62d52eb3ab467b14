//! Sigmoid-gated activations `y = x σ(αx + βx³)`, forward and backward in one pass each.
//!
//! One formula covers four of Hugging Face's activations: the tanh GELUs (`gelu_new`,
//! `gelu_pytorch_tanh`, `gelu_fast`: `0.5 x (1 + tanh(u)) = x σ(2u)` with
//! `u = √(2/π)(x + 0.044715 x³)`), `quick_gelu` (`x σ(1.702 x)`) and SiLU (`x σ(x)`).
//! Backward: `dy/dx = s + x s (1 - s)(α + 3βx²)` with `s = σ(αx + βx³)`.
//! Contract: any shape, f32; tolerance 1e-5 relative (values), 1e-4 (gradients).

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::flex::FlexTensor;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Backend, Dispatch, Flex, backend_extension};
use burn::tensor::Tensor;
use burn::tensor::activation::sigmoid;

use super::exp;
use super::flex::{contiguous, flex_vec, use_kernels};
use super::pool::{self, GRAIN};
use super::simd::dispatch;
use super::unfilled::unfilled;
use crate::config::ActivationFn;

#[backend_extension(Flex, Autodiff)]
pub trait GatedActivationKernel: Backend {
    fn bl_gated_activation(x: FloatTensor<Self>, alpha: f32, beta: f32) -> FloatTensor<Self>;
}

/// `(α, β)` of an activation that has this form, `None` for the others (exact GELU, ReLU).
pub fn gate_coefficients(act: ActivationFn) -> Option<(f32, f32)> {
    // 2 * sqrt(2 / π)
    const TWO_SQRT_2_OVER_PI: f64 = 1.595_769_121_605_730_7;
    match act {
        ActivationFn::GeluNew => Some((TWO_SQRT_2_OVER_PI as f32, (TWO_SQRT_2_OVER_PI * 0.044715) as f32)),
        ActivationFn::GeluFast => Some(((2.0 * 0.7978845608f64) as f32, (2.0 * 0.7978845608f64 * 0.044715) as f32)),
        ActivationFn::QuickGelu => Some((1.702, 0.0)),
        ActivationFn::Silu => Some((1.0, 0.0)),
        ActivationFn::Gelu | ActivationFn::Relu => None,
    }
}

/// `x σ(αx + βx³)` element-wise: the fused kernel on flex, the GPU kernel
/// ([`crate::gpu::gated_activation`]) on a `Cube` device (with its own backward under autodiff), composed
/// ops elsewhere.
pub fn gated_activation<const D: usize>(x: Tensor<D>, alpha: f32, beta: f32) -> Tensor<D> {
    if use_kernels(&[&x.device()], &[x.dtype()]) {
        return Tensor::from_dispatch(Dispatch::bl_gated_activation(x.into_dispatch(), alpha, beta));
    }
    if crate::gpu::gated_activation_runs(&x) {
        return crate::gpu::gated_activation(x, alpha, beta).expect("the kernel takes what it said it runs");
    }
    gated_activation_reference(x, alpha, beta)
}

/// The composed reference (`x³` as products, as the model always computed it).
pub fn gated_activation_reference<const D: usize>(x: Tensor<D>, alpha: f32, beta: f32) -> Tensor<D> {
    let inner = if beta == 0.0 { x.clone() * alpha as f64 } else { (x.clone() * x.clone() * (beta / alpha) as f64 + 1.0) * x.clone() * alpha as f64 };
    x * sigmoid(inner)
}

#[inline(always)]
fn sigmoid_of(x: f32, alpha: f32, beta: f32) -> f32 {
    let z = (beta * x * x + alpha) * x;
    1.0 / (1.0 + exp::exp(-z))
}

/// `y = x σ(αx + βx³)`.
pub fn forward(x: &[f32], y: &mut [f32], alpha: f32, beta: f32) {
    pool::for_chunks(y, GRAIN, |i, y| {
        let x = &x[i * GRAIN..i * GRAIN + y.len()];
        dispatch!(|y: &mut [f32], x: &[f32], alpha: f32, beta: f32| -> () {
            for (yi, &xi) in y.iter_mut().zip(x) {
                *yi = xi * sigmoid_of(xi, alpha, beta);
            }
        })
    });
}

/// `dx = dy * (s + x s (1 - s)(α + 3βx²))`.
pub fn backward(x: &[f32], dy: &[f32], dx: &mut [f32], alpha: f32, beta: f32) {
    pool::for_chunks(dx, GRAIN, |i, dx| {
        let (x, dy) = (&x[i * GRAIN..i * GRAIN + dx.len()], &dy[i * GRAIN..i * GRAIN + dx.len()]);
        dispatch!(|dx: &mut [f32], x: &[f32], dy: &[f32], alpha: f32, beta: f32| -> () {
            for ((dxi, &xi), &dyi) in dx.iter_mut().zip(x).zip(dy) {
                let s = sigmoid_of(xi, alpha, beta);
                *dxi = dyi * (s + xi * s * (1.0 - s) * (3.0 * beta * xi * xi + alpha));
            }
        })
    });
}

fn flex_forward(x: &FlexTensor, alpha: f32, beta: f32) -> FlexTensor {
    super::flex::record(super::flex::Op::Activation, false);
    let x = contiguous(x);
    let mut y = unfilled(x.layout().num_elements());
    forward(x.storage(), &mut y, alpha, beta);
    flex_vec(y, x.layout().shape().clone())
}

impl GatedActivationKernel for Flex {
    fn bl_gated_activation(x: FlexTensor, alpha: f32, beta: f32) -> FlexTensor {
        flex_forward(&x, alpha, beta)
    }
}

#[derive(Debug)]
struct GatedActivationBackward;

impl Backward<Flex, 1> for GatedActivationBackward {
    /// The input and `(α, β)`.
    type State = (FlexTensor, f32, f32);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        super::flex::record(super::flex::Op::Activation, true);
        let [node_x] = ops.parents;
        let dy = contiguous(&grads.consume::<Flex>(&ops.node));
        let (x, alpha, beta) = ops.state;
        if let Some(node) = node_x {
            let x = contiguous(&x);
            let mut dx = unfilled(x.layout().num_elements());
            backward(x.storage(), dy.storage(), &mut dx, alpha, beta);
            grads.register::<Flex>(node.id, flex_vec(dx, x.layout().shape().clone()));
        }
    }
}

impl<C: CheckpointStrategy> GatedActivationKernel for Autodiff<Flex, C> {
    fn bl_gated_activation(x: FloatTensor<Self>, alpha: f32, beta: f32) -> FloatTensor<Self> {
        let (x, gx) = x.into_parts();
        match GatedActivationBackward.prepare::<C>([gx]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let y = flex_forward(&x, alpha, beta);
                prep.finish((x, alpha, beta), y)
            }
            OpsKind::UnTracked(prep) => prep.finish(flex_forward(&x, alpha, beta)),
        }
    }
}
