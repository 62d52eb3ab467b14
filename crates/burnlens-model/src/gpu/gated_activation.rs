//! The sigmoid-gated activations `y = x σ(αx + βx³)` (the tanh GELUs, `quick_gelu`, SiLU:
//! [`crate::kernels::activation`]) on a GPU in one element-wise launch, where the composed
//! ops launch a kernel per operation (GPT-2's `gelu_new`: twelve of a decoded token's
//! launches a layer); under autodiff its backward is one more launch,
//! `dx = g (s + x s (1 - s)(α + 3βx²))` with `s = σ(αx + βx³)`.

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

use super::exact_matmul::on_cube;
use super::grid::GRID_LIMIT;

/// Units per cube.
const UNITS: u32 = 256;

/// The extension that carries a dispatch tensor to the kernel (and its autodiff wrapper).
#[backend_extension(Cube, Fusion: cfg(feature = "fusion"), Autodiff)]
pub trait GatedActivation: Backend {
    /// `x σ(αx + βx³)` element-wise.
    #[fusion(dtype = x, shape = x.clone())]
    fn bl_gpu_gated_activation(x: FloatTensor<Self>, alpha: f32, beta: f32) -> FloatTensor<Self>;
}

/// The backward's kernel.
#[backend_extension(Cube, Fusion: cfg(feature = "fusion"))]
pub trait GatedActivationGrad: Backend {
    /// `g · dy/dx` element-wise.
    #[fusion(dtype = x, shape = x.clone())]
    fn bl_gpu_gated_activation_grad(x: FloatTensor<Self>, g: FloatTensor<Self>, alpha: f32, beta: f32) -> FloatTensor<Self>;
}

impl GatedActivation for CubeBackend {
    fn bl_gpu_gated_activation(x: CubeTensor, alpha: f32, beta: f32) -> CubeTensor {
        elementwise(x, None, alpha, beta)
    }
}

impl GatedActivationGrad for CubeBackend {
    fn bl_gpu_gated_activation_grad(x: CubeTensor, g: CubeTensor, alpha: f32, beta: f32) -> CubeTensor {
        elementwise(x, Some(g), alpha, beta)
    }
}

/// The activation of `x` (given `g`: `g` times its derivative) over contiguous copies.
fn elementwise(x: CubeTensor, g: Option<CubeTensor>, alpha: f32, beta: f32) -> CubeTensor {
    let x = into_contiguous(x);
    let grad = g.is_some();
    // The activation reads no gradient: `x` stands in for the argument.
    let g = g.map(into_contiguous).unwrap_or_else(|| x.clone());
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
        unsafe { BufferArg::from_raw_parts(g.handle.clone(), n) },
        unsafe { BufferArg::from_raw_parts(y.handle.clone(), n) },
        n as u32,
        alpha,
        beta,
        grad,
    );
    y
}

#[derive(Debug)]
struct GatedActivationBackward;

impl Backward<Cube, 1> for GatedActivationBackward {
    /// The input and the coefficients.
    type State = (FloatTensor<Cube>, f32, f32);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node] = ops.parents;
        let g = grads.consume::<Cube>(&ops.node);
        let (x, alpha, beta) = ops.state;
        if let Some(node) = node {
            grads.register::<Cube>(node.id, Cube::bl_gpu_gated_activation_grad(x, g, alpha, beta));
        }
    }
}

impl<C: CheckpointStrategy> GatedActivation for Autodiff<Cube, C> {
    fn bl_gpu_gated_activation(x: FloatTensor<Self>, alpha: f32, beta: f32) -> FloatTensor<Self> {
        let (x, gx) = x.into_parts();
        let out = Cube::bl_gpu_gated_activation(x.clone(), alpha, beta);
        match GatedActivationBackward.prepare::<C>([gx]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish((x, alpha, beta), out),
            OpsKind::UnTracked(prep) => prep.finish(out),
        }
    }
}

/// Whether the kernel takes `x`: plain f32 on a `Cube` device (tracked or not).
pub fn applies<const D: usize>(x: &Tensor<D>) -> bool {
    x.dtype() == DType::F32 && x.shape().num_elements() < u32::MAX as usize && on_cube(&x.device())
}

/// See [`super::gated_activation`].
pub fn gated_activation<const D: usize>(x: Tensor<D>, alpha: f32, beta: f32) -> Option<Tensor<D>> {
    applies(&x).then(|| Tensor::from_dispatch(<burn::backend::Dispatch as GatedActivation>::bl_gpu_gated_activation(x.into_dispatch(), alpha, beta)))
}

/// Elements `ABSOLUTE_POS_X, + the grid's units, …` of `y = x σ(αx + βx³)`, or where `grad`
/// of `g · dy/dx`.
#[cube(launch)]
fn gate(x: &[f32], g: &[f32], y: &mut [f32], n: u32, alpha: f32, beta: f32, #[comptime] grad: bool) {
    let stride = CUBE_COUNT_X * 256u32;
    let mut i = ABSOLUTE_POS_X;
    while i < n {
        let v = x[i as usize];
        let z = (beta * v * v + alpha) * v;
        let s = 1.0f32 / (1.0f32 + f32::exp(-z));
        if grad {
            y[i as usize] = g[i as usize] * (s + v * s * (1.0f32 - s) * (alpha + 3.0f32 * beta * v * v));
        } else {
            y[i as usize] = v * s;
        }
        i += stride;
    }
}
