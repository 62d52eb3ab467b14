//! AdamW's step for one parameter in one pass over memory instead of about fifteen.
//!
//! Contract: every tensor f32 and of one shape. [`adamw_step`] takes the parameter `p`, its
//! moments `m`, `v` and its gradient `g` and returns the new `(p, m, v)`:
//! `m ← beta1 · m + (1 - beta1) · g`, `v ← beta2 · v + (1 - beta2) · g²`, then
//! `p ← p · (1 - lr · decay) - lr · (m / c1) / (sqrt(v / c2) + eps)` with the bias
//! corrections `c1 = 1 - beta1^t`, `c2 = 1 - beta2^t` — Burn's `AdamW` (and PyTorch's)
//! written as one expression per element, in the same order of operations. Burn's composed
//! step makes a fresh tensor per operation: for GPT-2 small's 124 M parameters about 34
//! reads and writes of 500 MB per step; this one pass reads `p`, `m`, `v`, `g` and writes
//! `p`, `m`, `v` (7), in place into the buffers it replaces when the optimizer owns them (it
//! does: no fresh buffer to fault in and zero per step; a shared buffer is copied first,
//! never written). Tolerance against the composed ops: 1e-6 relative per step (they differ
//! only in rounding where Burn rounds an intermediate). Not differentiable (optimizer steps
//! run on the inner backend).

use burn::backend::AutodiffBackend;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::flex::{FlexTensor, Layout};
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Backend, Dispatch, Flex, backend_extension};
use burn::tensor::{DType, Tensor};

use super::flex::{contiguous, owned, owned_f32, use_kernels};
use super::pages::{PageBuf, into_bytes};
use super::pool::{self, GRAIN};
use super::simd::dispatch;

#[backend_extension(Flex, Autodiff)]
pub trait AdamWKernel: Backend {
    fn bl_adamw_step(
        p: FloatTensor<Self>,
        m: FloatTensor<Self>,
        v: FloatTensor<Self>,
        g: FloatTensor<Self>,
        step: AdamWStep,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);
    fn bl_adamw_first_step(p: FloatTensor<Self>, g: FloatTensor<Self>, step: AdamWStep) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);
}

/// The scalars of one parameter's step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWStep {
    pub beta_1: f32,
    pub beta_2: f32,
    pub lr: f64,
    /// `lr · weight_decay`.
    pub decay_rate: f64,
    pub epsilon: f32,
    /// `1 - beta1^t`.
    pub correction_1: f32,
    /// `1 - beta2^t`.
    pub correction_2: f32,
}

/// One AdamW step of a parameter from its gradient: the new `(p, m, v)`. One pass on flex,
/// composed ops elsewhere. (Burn's first step, moments from the gradient alone, is this
/// step from zero moments.)
pub fn adamw_step<const D: usize>(p: Tensor<D>, m: Tensor<D>, v: Tensor<D>, g: Tensor<D>, step: AdamWStep) -> (Tensor<D>, Tensor<D>, Tensor<D>) {
    let same = p.dims() == m.dims() && m.dims() == v.dims() && v.dims() == g.dims();
    let devices = [&p.device(), &m.device(), &v.device(), &g.device()];
    if same && use_kernels(&devices, &[p.dtype(), m.dtype(), v.dtype(), g.dtype()]) {
        let (p, m, v) = Dispatch::bl_adamw_step(p.into_dispatch(), m.into_dispatch(), v.into_dispatch(), g.into_dispatch(), step);
        (Tensor::from_dispatch(p), Tensor::from_dispatch(m), Tensor::from_dispatch(v))
    } else if let Some(stepped) = crate::gpu::adam_step(p.clone(), m.clone(), v.clone(), g.clone(), None, step.rule()) {
        stepped
    } else {
        adamw_step_reference(p, m, v, g, step)
    }
}

impl AdamWStep {
    /// The GPU kernel's rule for this step: [`adamw_step_reference`]'s coefficients, rounded
    /// to f32 where Burn rounds them.
    pub fn rule(&self) -> crate::gpu::AdamRule {
        crate::gpu::AdamRule::BurnW {
            beta1: self.beta_1,
            one_minus_beta1: 1.0 - self.beta_1,
            beta2: self.beta_2,
            one_minus_beta2: 1.0 - self.beta_2,
            correction1: self.correction_1,
            correction2: self.correction_2,
            epsilon: self.epsilon,
            lr: self.lr as f32,
            keep: (1.0 - self.decay_rate) as f32,
        }
    }
}

/// The first step, from zero moments: the new `(p, m, v)`. On flex the moments are born in
/// buffers of their own (`zeros_like` on flex zeroes a byte vector and then copies it into
/// an aligned one: for GPT-2 small a gigabyte zeroed, copied and allocated twice, whose
/// holes in the heap the next step's activations then missed).
pub fn adamw_first_step<const D: usize>(p: Tensor<D>, g: Tensor<D>, step: AdamWStep) -> (Tensor<D>, Tensor<D>, Tensor<D>) {
    if p.dims() == g.dims() && use_kernels(&[&p.device(), &g.device()], &[p.dtype(), g.dtype()]) {
        let (p, m, v) = Dispatch::bl_adamw_first_step(p.into_dispatch(), g.into_dispatch(), step);
        (Tensor::from_dispatch(p), Tensor::from_dispatch(m), Tensor::from_dispatch(v))
    } else {
        let (m, v) = (g.zeros_like(), g.zeros_like());
        adamw_step(p, m, v, g, step)
    }
}

/// Burn's composed `AdamW` step (burn-optim's `adamw.rs`).
pub fn adamw_step_reference<const D: usize>(p: Tensor<D>, m: Tensor<D>, v: Tensor<D>, g: Tensor<D>, step: AdamWStep) -> (Tensor<D>, Tensor<D>, Tensor<D>) {
    let m = m.mul_scalar(step.beta_1).add(g.clone().mul_scalar(1.0 - step.beta_1));
    let v = v.mul_scalar(step.beta_2).add(g.square().mul_scalar(1.0 - step.beta_2));
    let delta = m.clone().div_scalar(step.correction_1).div(v.clone().div_scalar(step.correction_2).sqrt().add_scalar(step.epsilon));
    let decayed = if step.decay_rate == 0.0 { p } else { p.mul_scalar(1.0 - step.decay_rate) };
    (decayed - delta.mul_scalar(step.lr), m, v)
}

/// One chunk of the step, compiled for the machine's vector width.
fn step_chunk([p, m, v]: [&mut [f32]; 3], g: &[f32], s: AdamWStep) {
    dispatch!(|p: &mut [f32], m: &mut [f32], v: &mut [f32], g: &[f32], s: AdamWStep| -> () {
        let (keep_1, keep_2) = (1.0 - s.beta_1, 1.0 - s.beta_2);
        // Burn multiplies by f64 scalars converted to the tensor's f32.
        let (lr, keep) = (s.lr as f32, (1.0 - s.decay_rate) as f32);
        let decay = s.decay_rate != 0.0;
        for (((p, m), v), &g) in p.iter_mut().zip(m.iter_mut()).zip(v.iter_mut()).zip(g) {
            *m = *m * s.beta_1 + g * keep_1;
            *v = *v * s.beta_2 + (g * g) * keep_2;
            let delta = (*m / s.correction_1) / ((*v / s.correction_2).sqrt() + s.epsilon);
            let decayed = if decay { *p * keep } else { *p };
            *p = decayed - delta * lr;
        }
    })
}

impl AdamWKernel for Flex {
    fn bl_adamw_step(p: FlexTensor, m: FlexTensor, v: FlexTensor, g: FlexTensor, step: AdamWStep) -> (FlexTensor, FlexTensor, FlexTensor) {
        let g = contiguous(&g);
        let g = g.storage::<f32>();
        let (mut p, mut m, mut v) = (owned(p), owned(m), owned(v));
        let bufs = [&mut p, &mut m, &mut v].map(|t| owned_f32(t).expect("owned just above"));
        pool::for_chunks_n(bufs, GRAIN, |i, chunks| {
            let start = i * GRAIN;
            step_chunk(chunks, &g[start..start + GRAIN.min(g.len() - start)], step)
        });
        (p, m, v)
    }

    fn bl_adamw_first_step(p: FlexTensor, g: FlexTensor, step: AdamWStep) -> (FlexTensor, FlexTensor, FlexTensor) {
        let shape = p.layout().shape().clone();
        // Outside the heap (and on huge pages): the moments live as long as the training, and
        // born in the heap they took the space the first step's freed activations left.
        let zeros = || FlexTensor::new(into_bytes(PageBuf::<f32>::zeroed(shape.num_elements())), Layout::contiguous(shape.clone()), DType::F32);
        Self::bl_adamw_step(p, zeros(), zeros(), g, step)
    }
}

/// On the autodiff backend (a step run on tracked tensors): the same, untracked.
impl<C: CheckpointStrategy> AdamWKernel for Autodiff<Flex, C> {
    fn bl_adamw_step(
        p: FloatTensor<Self>,
        m: FloatTensor<Self>,
        v: FloatTensor<Self>,
        g: FloatTensor<Self>,
        step: AdamWStep,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let (p, m, v) = Flex::bl_adamw_step(Self::inner(p), Self::inner(m), Self::inner(v), Self::inner(g), step);
        (Self::from_inner(p), Self::from_inner(m), Self::from_inner(v))
    }

    fn bl_adamw_first_step(p: FloatTensor<Self>, g: FloatTensor<Self>, step: AdamWStep) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let (p, m, v) = Flex::bl_adamw_first_step(Self::inner(p), Self::inner(g), step);
        (Self::from_inner(p), Self::from_inner(m), Self::from_inner(v))
    }
}
