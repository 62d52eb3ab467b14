//! The two passes of global-norm gradient clipping: `Σ x²` of a tensor in one read (the
//! norm), and the scaling of a tensor in place (applying it).
//!
//! Burn's `g.square().sum()` writes the squares to a fresh tensor and reads them again: for
//! GPT-2 small's 124 M gradients, 500 MB allocated, written and read per step before the
//! optimizer runs. [`sum_squares`] reads each gradient once and allocates nothing; [`scale`]
//! multiplies in place, on the pool's threads, a tensor that owns its buffer (Burn's
//! `g * c` writes a fresh one). Contract: any shape, f32; the sum is accumulated in f32
//! lanes per chunk and in f64 across chunks, tolerance 1e-5 relative against the composed
//! ops; the scaling is exact (`x · (c as f32)`, as Burn's). Not differentiable (they run on
//! gradients).

use burn::backend::AutodiffBackend;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::flex::FlexTensor;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Backend, Dispatch, Flex, backend_extension};
use burn::tensor::{Shape, Tensor};

use super::flex::{contiguous, flex_vec, owned, owned_f32, use_kernels};
use super::pool::{self, GRAIN};
use super::simd::{self, dispatch};

#[backend_extension(Flex, Autodiff)]
pub trait SumSquaresKernel: Backend {
    fn bl_sum_squares(x: FloatTensor<Self>) -> FloatTensor<Self>;
    fn bl_scale(x: FloatTensor<Self>, factor: f32) -> FloatTensor<Self>;
}

/// `Σ x²` as a one-element tensor: one pass on flex, composed ops elsewhere.
pub fn sum_squares<const D: usize>(x: Tensor<D>) -> Tensor<1> {
    if use_kernels(&[&x.device()], &[x.dtype()]) { Tensor::from_dispatch(Dispatch::bl_sum_squares(x.into_dispatch())) } else { sum_squares_reference(x) }
}

/// The composed reference.
pub fn sum_squares_reference<const D: usize>(x: Tensor<D>) -> Tensor<1> {
    x.square().sum()
}

/// `x · factor`: in place on flex when `x` owns its buffer (a copy first otherwise), composed
/// ops elsewhere.
pub fn scale<const D: usize>(x: Tensor<D>, factor: f64) -> Tensor<D> {
    if use_kernels(&[&x.device()], &[x.dtype()]) { Tensor::from_dispatch(Dispatch::bl_scale(x.into_dispatch(), factor as f32)) } else { x * factor }
}

/// `Σ x²` over contiguous values, chunks in parallel.
pub fn sum(x: &[f32]) -> f64 {
    let chunks = x.len().div_ceil(GRAIN).max(1);
    let mut partial = vec![0.0f32; chunks];
    pool::for_chunks(&mut partial, 1, |i, out| {
        let c = &x[(i * GRAIN).min(x.len())..((i + 1) * GRAIN).min(x.len())];
        out[0] = dispatch!(|c: &[f32]| -> f32 { simd::sum_by(c, |v| v * v) });
    });
    partial.iter().map(|&p| p as f64).sum()
}

impl SumSquaresKernel for Flex {
    fn bl_sum_squares(x: FlexTensor) -> FlexTensor {
        let x = contiguous(&x);
        flex_vec(vec![sum(x.storage()) as f32], Shape::from(vec![1]))
    }

    fn bl_scale(x: FlexTensor, factor: f32) -> FlexTensor {
        let mut x = owned(x);
        let values = owned_f32(&mut x).expect("owned just above");
        pool::for_chunks(values, GRAIN, |_, chunk| {
            dispatch!(|chunk: &mut [f32], factor: f32| -> () {
                for v in chunk {
                    *v *= factor;
                }
            })
        });
        x
    }
}

/// On the autodiff backend: the same, untracked.
impl<C: CheckpointStrategy> SumSquaresKernel for Autodiff<Flex, C> {
    fn bl_sum_squares(x: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::from_inner(Flex::bl_sum_squares(Self::inner(x)))
    }

    fn bl_scale(x: FloatTensor<Self>, factor: f32) -> FloatTensor<Self> {
        Self::from_inner(Flex::bl_scale(Self::inner(x), factor))
    }
}
