//! Matrix products in exact f32 on a GPU: every product of f32 operands runs on cubek's
//! unit-level tiled matmul (each unit multiplies and adds f32 values; no tensor cores), in the
//! forward and, under autodiff, in the backward (`dA = dC Bᵀ`, `dB = Aᵀ dC`, each the same
//! kernel).
//!
//! Why a route of burnlens's own: Burn's `matmul` on a `Cube` device autotunes over cubek's
//! kernels, tensor-core ones included, and cubek runs f32 operands on tensor cores as TF32
//! (inputs rounded to 10 mantissa bits) wherever the device has TF32 — every NVIDIA GPU from
//! Ampere on — with no switch to turn it off (`cubek_matmul`'s `adjust_dtypes`). That put a
//! GPT-2 forward 2.5e-3 away from the CPU's on an H100. [`super::super::matmul`] takes this
//! route unless the user asked for faster products (`--compute tf32`).
//!
//! Shapes: `a: [.., m, k]`, `b: [.., k, n]` with equal leading dimensions (no broadcasting:
//! the caller folds a weight's product into two dimensions first), any strides (a transposed
//! view is read in place when cubek can, else made contiguous).

use std::sync::atomic::{AtomicUsize, Ordering};

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::ops::FloatTensorOps;
use burn::backend::{Autodiff, Backend, Cube, DispatchDevice, backend_extension, tensor::FloatTensor};
use burn::tensor::{DType, Device, Tensor};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::kernel::matmul::init_matmul_output;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::Scalar;
use cubek::matmul::definition::{MatmulElems, MatmulGlobalElems};
use cubek::matmul::launch::launch_ref;
use cubek::matmul::multi_level;
use cubek::matmul::strategy::Strategy;
use cubek::std::InputBinding;

/// The extension that carries dispatch tensors to the exact product on `Cube` (and its
/// autodiff wrapper, whose backward is two more exact products).
#[backend_extension(Cube, Autodiff)]
pub trait ExactMatmul: Backend {
    /// `a · b` over the last two dimensions, in f32 arithmetic.
    fn bl_matmul_exact(a: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self>;
}

impl ExactMatmul for Cube {
    fn bl_matmul_exact(a: CubeTensor, b: CubeTensor) -> CubeTensor {
        product(a, b)
    }
}

/// Whether the exact route runs for `a · b`: f32 tensors of one rank (2 to 4) on a `Cube`
/// device (tracked or not), equal leading dimensions and matching inner ones.
pub fn applies<const D: usize>(a: &Tensor<D>, b: &Tensor<D>) -> bool {
    let (da, db) = (a.dims(), b.dims());
    let shapes = (2..=4).contains(&D) && da[..D - 2] == db[..D - 2] && da[D - 1] == db[D - 2];
    shapes && on_cube(&a.device()) && on_cube(&b.device()) && a.dtype() == DType::F32 && b.dtype() == DType::F32
}

/// A `Cube` device, directly or under autodiff.
pub fn on_cube(device: &Device) -> bool {
    match device.clone().inner().as_dispatch() {
        DispatchDevice::Cube(_) => true,
        DispatchDevice::Autodiff(d) => matches!(**d, DispatchDevice::Cube(_)),
        _ => false,
    }
}

/// See [`super::exact_matmul`]; the caller checked [`applies`].
pub fn exact_matmul<const D: usize>(a: Tensor<D>, b: Tensor<D>) -> Tensor<D> {
    Tensor::from_dispatch(<burn::backend::Dispatch as ExactMatmul>::bl_matmul_exact(a.into_dispatch(), b.into_dispatch()))
}

/// The unit-level kernel every exact product runs: no accelerator, so cubek never promotes
/// its operands to TF32.
fn strategy() -> Strategy {
    Strategy::MultiLevel(multi_level::Strategy::SimpleUnit(Default::default()))
}

static CALLS: AtomicUsize = AtomicUsize::new(0);

/// Products this process ran on the exact kernel (forward and backward).
pub fn calls() -> usize {
    CALLS.load(Ordering::Relaxed)
}

/// `a · b` on the device; operands cubek cannot read in their layout go contiguous first.
pub(super) fn product(a: CubeTensor, b: CubeTensor) -> CubeTensor {
    CALLS.fetch_add(1, Ordering::Relaxed);
    match launch(a.clone(), b.clone()) {
        Some(out) => out,
        None => launch(into_contiguous(a), into_contiguous(b)).unwrap_or_else(|| panic!("the exact f32 matmul declined contiguous operands")),
    }
}

/// One launch, or `None` where cubek declines the operands' layout.
fn launch(a: CubeTensor, b: CubeTensor) -> Option<CubeTensor> {
    let out = init_matmul_output(&a, &b, DType::F32);
    let f32_type = f32::elem_type_native();
    let mut dtypes = MatmulElems::from_globals(&MatmulGlobalElems { lhs: f32_type, rhs: f32_type, out: f32_type });
    let client = out.client.clone();
    let (lhs, rhs) = (InputBinding::new(a.binding(), f32_type), InputBinding::new(b.binding(), f32_type));
    launch_ref(&strategy(), &client, lhs, rhs, out.clone().binding(), &mut dtypes).ok()?;
    Some(out)
}

/// `t` with its last two dimensions swapped (a view).
pub(super) fn transposed(t: CubeTensor) -> CubeTensor {
    let d = t.meta.shape().num_dims();
    <Cube as FloatTensorOps<Cube>>::float_swap_dims(t, d - 2, d - 1)
}

#[derive(Debug)]
struct ExactMatmulBackward;

impl Backward<Cube, 2> for ExactMatmulBackward {
    /// The two operands.
    type State = (CubeTensor, CubeTensor);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_a, node_b] = ops.parents;
        let dc = grads.consume::<Cube>(&ops.node);
        let (a, b) = ops.state;
        if let Some(node) = node_a {
            grads.register::<Cube>(node.id, product(dc.clone(), transposed(b)));
        }
        if let Some(node) = node_b {
            grads.register::<Cube>(node.id, product(transposed(a), dc));
        }
    }
}

impl<C: CheckpointStrategy> ExactMatmul for Autodiff<Cube, C> {
    fn bl_matmul_exact(a: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self> {
        let (a, ga) = a.into_parts();
        let (b, gb) = b.into_parts();
        match ExactMatmulBackward.prepare::<C>([ga, gb]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let out = product(a.clone(), b.clone());
                prep.finish((a, b), out)
            }
            OpsKind::UnTracked(prep) => prep.finish(product(a, b)),
        }
    }
}
