//! Every matrix product burnlens takes on tensors, and the arithmetic it runs in.
//!
//! On the CPU a product is Burn's (burnlens's own kernels take the model's hot products
//! before they get here). On a GPU with Burn's `Cube` backend (wgpu, CUDA), Burn's product
//! autotunes over tensor-core kernels that round f32 operands to TF32 where the device has it,
//! so there the default (`--compute f32`) takes burnlens's exact f32 kernel
//! ([`crate::gpu::exact_matmul`]) and Burn's product only when asked (`--compute tf32`, or
//! `bf16`, whose GPU products are Burn's too). [`MatmulRoute`] names the choice.

use burn::tensor::{Device, Tensor};

use crate::kernels::compute::{Compute, compute};

/// How [`matmul`] multiplies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatmulRoute {
    /// Burn's own product (on a CUDA GPU with `--compute tf32` or `bf16`: TF32 tensor cores).
    Burn,
    /// burnlens's exact f32 kernel on a `Cube` GPU.
    ExactKernel,
}

impl MatmulRoute {
    /// The route of `a · b` under the compute dtype in force.
    pub fn of<const D: usize>(a: &Tensor<D>, b: &Tensor<D>) -> Self {
        if compute() == Compute::F32 && crate::gpu::exact_matmul_runs(a, b) { MatmulRoute::ExactKernel } else { MatmulRoute::Burn }
    }

    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            MatmulRoute::Burn => "burn",
            MatmulRoute::ExactKernel => "exact-kernel",
        }
    }
}

/// Whether f32 products on `device` take the exact kernel under the compute dtype in force
/// (a `Cube` GPU and `--compute f32`): what a caller choosing between Burn's fused op, which
/// multiplies by Burn's products, and one composed of [`matmul`] asks.
pub fn exact_on(device: &Device) -> bool {
    compute() == Compute::F32 && crate::gpu::exact_matmul_on(device)
}

/// `a · b` over the last two dimensions (Burn's broadcasting rules), by [`MatmulRoute`].
pub fn matmul<const D: usize>(a: Tensor<D>, b: Tensor<D>) -> Tensor<D> {
    match MatmulRoute::of(&a, &b) {
        MatmulRoute::ExactKernel => crate::gpu::exact_matmul(a, b).expect("the kernel takes what it said it runs"),
        MatmulRoute::Burn => a.matmul(b),
    }
}

/// `x W` for `x: [.., k]` and a weight `W: [k, n]`: the leading dimensions folded into one
/// product of [`matmul`]'s route (no broadcast, so the exact kernel takes it on a GPU).
pub fn matmul_weight<const D: usize>(x: Tensor<D>, w: Tensor<2>) -> Tensor<D> {
    let dims = x.dims();
    let k = dims[D - 1];
    let rows = dims[..D - 1].iter().product::<usize>();
    let y = matmul(x.reshape([rows, k]), w);
    let mut out = dims;
    out[D - 1] = y.dims()[1];
    y.reshape(out)
}
