//! Weights read as f32.

use burn::module::Param;
use burn::tensor::{DType, Tensor};

/// A parameter's values in f32 (a half weight widened: the forward reads half weights
/// through its kernels, everything else that multiplies by a weight takes f32).
pub fn f32_val<const D: usize>(p: &Param<Tensor<D>>) -> Tensor<D> {
    p.val().cast(DType::F32)
}
