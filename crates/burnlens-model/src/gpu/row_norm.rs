//! LayerNorm and RMSNorm over the last dimension on a GPU in one launch: a cube per row (32
//! to 256 units by the row's length; a cube takes rows `CUBE_POS_X, + cubes, …` past the
//! grid's limit), three passes over the row — its sum, the sum of its squared deviations, the
//! output — each sum a tree over the cube's units ([`super::cube_reduce`]). The composed ops
//! it replaces launch nine kernels (two reductions and seven element-wise), so a decoded
//! token's two norms a layer were eighteen of its launches. Same contract as
//! [`crate::kernels::layer_norm`] (biased variance, `1 / sqrt(var + eps)`). Under autodiff its
//! backward is [`super::row_norm_grad`]'s.

use burn::backend::{Backend, backend_extension, tensor::FloatTensor};
use burn::tensor::{DType, Tensor};
use burn_cubecl::CubeBackend;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::cube_reduce::{cube_sum, row_units};
use super::exact_matmul::on_cube;
use super::grid::GRID_LIMIT;

/// The extension that carries dispatch tensors to the kernel (and its autodiff wrapper, in
/// [`super::row_norm_grad`]).
#[backend_extension(Cube, Fusion: cfg(feature = "fusion"), Autodiff)]
pub trait RowNorm: Backend {
    /// LayerNorm of `x: [rows, d]` with `w`, `b: [d]`.
    #[fusion(dtype = x, shape = x.clone())]
    fn bl_gpu_layer_norm(x: FloatTensor<Self>, w: FloatTensor<Self>, b: FloatTensor<Self>, eps: f32) -> FloatTensor<Self>;
    /// RMSNorm of `x: [rows, d]` with `w: [d]`.
    #[fusion(dtype = x, shape = x.clone())]
    fn bl_gpu_rms_norm(x: FloatTensor<Self>, w: FloatTensor<Self>, eps: f32) -> FloatTensor<Self>;
}

impl RowNorm for CubeBackend {
    fn bl_gpu_layer_norm(x: CubeTensor, w: CubeTensor, b: CubeTensor, eps: f32) -> CubeTensor {
        launch(x, w, Some(b), eps)
    }

    fn bl_gpu_rms_norm(x: CubeTensor, w: CubeTensor, eps: f32) -> CubeTensor {
        launch(x, w, None, eps)
    }
}

/// Whether the kernel takes the norm of `x` with these parameters: plain f32 on a `Cube`
/// device, all tracked by autodiff or none, `[.., d]` with `d = weight.len()` (and
/// `bias.len()`).
pub fn applies<const D: usize>(x: &Tensor<D>, params: &[&Tensor<1>]) -> bool {
    let d = x.dims()[D - 1];
    let shapes = d >= 1 && x.shape().num_elements() < u32::MAX as usize && params.iter().all(|p| p.dims()[0] == d);
    let dtypes = x.dtype() == DType::F32 && params.iter().all(|p| p.dtype() == DType::F32);
    let tracking = params.iter().all(|p| p.is_autodiff() == x.is_autodiff());
    shapes && dtypes && tracking && on_cube(&x.device())
}

/// The norm of `x: [.., d]` over its last dimension: LayerNorm where `bias`, else RMSNorm;
/// `None` where [`applies`] does not hold.
pub fn row_norm<const D: usize>(x: Tensor<D>, weight: Tensor<1>, bias: Option<Tensor<1>>, eps: f64) -> Option<Tensor<D>> {
    let params: Vec<&Tensor<1>> = std::iter::once(&weight).chain(bias.as_ref()).collect();
    if !applies(&x, &params) {
        return None;
    }
    let dims = x.dims();
    let d = dims[D - 1];
    let rows = x.shape().num_elements() / d;
    let x = x.reshape([rows, d]).into_dispatch();
    type Ext = burn::backend::Dispatch;
    let y = match bias {
        Some(b) => <Ext as RowNorm>::bl_gpu_layer_norm(x, weight.into_dispatch(), b.into_dispatch(), eps as f32),
        None => <Ext as RowNorm>::bl_gpu_rms_norm(x, weight.into_dispatch(), eps as f32),
    };
    Some(Tensor::<2>::from_dispatch(y).reshape(dims))
}

/// The kernel over contiguous copies of the operands.
fn launch(x: CubeTensor, w: CubeTensor, b: Option<CubeTensor>, eps: f32) -> CubeTensor {
    let (x, w) = (into_contiguous(x), into_contiguous(w));
    let (rows, d) = (x.meta.shape()[0], x.meta.shape()[1]);
    let client = x.client.clone();
    let y = empty_device_dtype(client.clone(), x.device.clone(), [rows, d].into(), DType::F32);
    if rows == 0 {
        return y;
    }
    let center = b.is_some();
    // RMSNorm reads no bias: the weight stands in for the argument.
    let b = b.map(into_contiguous).unwrap_or_else(|| w.clone());
    norm_rows::launch(
        &client,
        CubeCount::Static(rows.min(GRID_LIMIT) as u32, 1, 1),
        CubeDim::new_1d(row_units(d)),
        unsafe { BufferArg::from_raw_parts(x.handle.clone(), rows * d) },
        unsafe { BufferArg::from_raw_parts(w.handle.clone(), d) },
        unsafe { BufferArg::from_raw_parts(b.handle.clone(), d) },
        unsafe { BufferArg::from_raw_parts(y.handle.clone(), rows * d) },
        rows as u32,
        d as u32,
        eps,
        center,
        row_units(d),
    );
    y
}

/// Rows `CUBE_POS_X, CUBE_POS_X + CUBE_COUNT_X, …` of `x: [rows, d]` normalized into `y`:
/// `(x - mean) · rstd · w + b` where `center`, else `x · rstd · w`.
#[cube(launch)]
fn norm_rows(x: &[f32], w: &[f32], b: &[f32], y: &mut [f32], rows: u32, d: u32, eps: f32, #[comptime] center: bool, #[comptime] units: u32) {
    let mut shared = Shared::<[f32]>::new_slice(comptime!(units as usize));
    let steps = d.div_ceil(units);
    let mut row = CUBE_POS_X;
    // Uniform over the cube: every unit of a cube takes the same rows.
    while row < rows {
        let base = row as usize * d as usize;
        let mean = row_mean(x, base, d, &mut shared, center, units);
        let rstd = row_rstd(x, base, d, mean, eps, &mut shared, units);
        for step in 0..steps {
            let i = step * units + UNIT_POS;
            if i < d {
                let mut v = (x[base + i as usize] - mean) * rstd * w[i as usize];
                if center {
                    v += b[i as usize];
                }
                y[base + i as usize] = v;
            }
        }
        row += CUBE_COUNT_X;
    }
}

/// The mean of the row of `x` at `base` (`d` long) where `center`, else 0: every unit of the
/// cube gets it.
#[cube]
pub(super) fn row_mean(x: &[f32], base: usize, d: u32, shared: &mut Shared<[f32]>, #[comptime] center: bool, #[comptime] units: u32) -> f32 {
    let mut mean = 0.0f32;
    if center {
        let mut s = 0.0f32;
        for step in 0..d.div_ceil(units) {
            let i = step * units + UNIT_POS;
            if i < d {
                s += x[base + i as usize];
            }
        }
        mean = cube_sum(s, shared) / f32::cast_from(d);
    }
    mean
}

/// `1 / sqrt(mean((x - mean)²) + eps)` of the row of `x` at `base`: every unit gets it.
#[cube]
pub(super) fn row_rstd(x: &[f32], base: usize, d: u32, mean: f32, eps: f32, shared: &mut Shared<[f32]>, #[comptime] units: u32) -> f32 {
    let mut s = 0.0f32;
    for step in 0..d.div_ceil(units) {
        let i = step * units + UNIT_POS;
        if i < d {
            let dev = x[base + i as usize] - mean;
            s += dev * dev;
        }
    }
    1.0f32 / f32::sqrt(cube_sum(s, shared) / f32::cast_from(d) + eps)
}
