//! Softmax over the last dimension on a GPU in one launch, where Burn's composed softmax
//! launches five kernels (two reductions, three element-wise): a cube of 256 units per row,
//! three passes over it — its maximum, the sum of `e^(x - max)`, the output — each reduced
//! over the cube ([`super::cube_reduce`]). Same contract as [`crate::kernels::softmax`]:
//! masked scores (−1e30 or −∞) give 0, a row of only −∞ the uniform row. For values not
//! tracked by autodiff (attention's pattern at inference and decoding); the composed ops
//! otherwise.

use burn::backend::{Backend, backend_extension, tensor::FloatTensor};
use burn::tensor::{DType, Tensor};
use burn_cubecl::CubeBackend;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::cube_reduce::{UNITS, cube_max, cube_sum};
use super::exact_matmul::on_cube;
use super::grid::GRID_LIMIT;

/// The extension that carries a dispatch tensor to the kernel.
#[backend_extension(Cube, Fusion: cfg(feature = "fusion"))]
pub trait RowSoftmax: Backend {
    /// Softmax of each row of `x: [rows, d]`.
    #[fusion(dtype = x, shape = x.clone())]
    fn bl_gpu_softmax(x: FloatTensor<Self>) -> FloatTensor<Self>;
}

impl RowSoftmax for CubeBackend {
    fn bl_gpu_softmax(x: CubeTensor) -> CubeTensor {
        let x = into_contiguous(x);
        let (rows, d) = (x.meta.shape()[0], x.meta.shape()[1]);
        let client = x.client.clone();
        let y = empty_device_dtype(client.clone(), x.device.clone(), [rows, d].into(), DType::F32);
        if rows == 0 {
            return y;
        }
        softmax_rows::launch(
            &client,
            CubeCount::Static(rows.min(GRID_LIMIT) as u32, 1, 1),
            CubeDim::new_1d(UNITS),
            unsafe { BufferArg::from_raw_parts(x.handle.clone(), rows * d) },
            unsafe { BufferArg::from_raw_parts(y.handle.clone(), rows * d) },
            rows as u32,
            d as u32,
        );
        y
    }
}

/// Whether the kernel takes `x: [.., d]`: plain f32 on a `Cube` device, `d ≥ 1`, not tracked
/// by autodiff.
pub fn applies<const D: usize>(x: &Tensor<D>) -> bool {
    let shapes = x.dims()[D - 1] >= 1 && x.shape().num_elements() < u32::MAX as usize;
    shapes && x.dtype() == DType::F32 && on_cube(&x.device()) && !x.is_autodiff()
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
fn softmax_rows(x: &[f32], y: &mut [f32], rows: u32, d: u32) {
    let mut shared = Shared::<[f32]>::new_slice(256usize);
    let steps = d.div_ceil(256u32);
    let mut row = CUBE_POS_X;
    // Uniform over the cube: every unit of a cube takes the same rows.
    while row < rows {
        let base = row as usize * d as usize;
        // The lowest finite value: a row of only −∞ keeps it, and every term is e^−∞ = 0.
        let mut top = f32::min_value();
        for step in 0..steps {
            let i = step * 256u32 + UNIT_POS;
            if i < d {
                top = f32::max(top, x[base + i as usize]);
            }
        }
        let shift = cube_max(top, &mut shared);
        let mut s = 0.0f32;
        for step in 0..steps {
            let i = step * 256u32 + UNIT_POS;
            if i < d {
                s += f32::exp(x[base + i as usize] - shift);
            }
        }
        let sum = cube_sum(s, &mut shared);
        for step in 0..steps {
            let i = step * 256u32 + UNIT_POS;
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
