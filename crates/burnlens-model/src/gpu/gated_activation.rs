//! The sigmoid-gated activations `y = x σ(αx + βx³)` (the tanh GELUs, `quick_gelu`, SiLU:
//! [`crate::kernels::activation`]) on a GPU in one element-wise launch, where the composed
//! ops launch a kernel per operation (GPT-2's `gelu_new`: twelve of a decoded token's
//! launches a layer). For values not tracked by autodiff; the composed ops otherwise.

use burn::backend::{Backend, backend_extension, tensor::FloatTensor};
use burn::tensor::{DType, Tensor};
use burn_cubecl::CubeBackend;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::exact_matmul::on_cube;
use super::grid::GRID_LIMIT;

/// Units per cube.
const UNITS: u32 = 256;

/// The extension that carries a dispatch tensor to the kernel.
#[backend_extension(Cube, Fusion: cfg(feature = "fusion"))]
pub trait GatedActivation: Backend {
    /// `x σ(αx + βx³)` element-wise.
    #[fusion(dtype = x, shape = x.clone())]
    fn bl_gpu_gated_activation(x: FloatTensor<Self>, alpha: f32, beta: f32) -> FloatTensor<Self>;
}

impl GatedActivation for CubeBackend {
    fn bl_gpu_gated_activation(x: CubeTensor, alpha: f32, beta: f32) -> CubeTensor {
        let x = into_contiguous(x);
        let n = x.meta.shape().num_elements();
        let client = x.client.clone();
        let y = empty_device_dtype(client.clone(), x.device.clone(), x.meta.shape().clone(), DType::F32);
        if n == 0 {
            return y;
        }
        let cubes = n.div_ceil(UNITS as usize).min(GRID_LIMIT) as u32;
        gate::launch(
            &client,
            CubeCount::Static(cubes, 1, 1),
            CubeDim::new_1d(UNITS),
            unsafe { BufferArg::from_raw_parts(x.handle.clone(), n) },
            unsafe { BufferArg::from_raw_parts(y.handle.clone(), n) },
            n as u32,
            alpha,
            beta,
        );
        y
    }
}

/// Whether the kernel takes `x`: plain f32 on a `Cube` device, not tracked by autodiff.
pub fn applies<const D: usize>(x: &Tensor<D>) -> bool {
    x.dtype() == DType::F32 && x.shape().num_elements() < u32::MAX as usize && on_cube(&x.device()) && !x.is_autodiff()
}

/// See [`super::gated_activation`].
pub fn gated_activation<const D: usize>(x: Tensor<D>, alpha: f32, beta: f32) -> Option<Tensor<D>> {
    applies(&x).then(|| Tensor::from_dispatch(<burn::backend::Dispatch as GatedActivation>::bl_gpu_gated_activation(x.into_dispatch(), alpha, beta)))
}

/// Elements `ABSOLUTE_POS_X, + the grid's units, …` of `y = x σ(αx + βx³)`.
#[cube(launch)]
fn gate(x: &[f32], y: &mut [f32], n: u32, alpha: f32, beta: f32) {
    let stride = CUBE_COUNT_X * 256u32;
    let mut i = ABSOLUTE_POS_X;
    while i < n {
        let v = x[i as usize];
        let z = (beta * v * v + alpha) * v;
        y[i as usize] = v / (1.0f32 + f32::exp(-z));
        i += stride;
    }
}
