//! Matrix products in exact f32 on a GPU: every product of f32 operands runs on one of
//! cubek's routines that need no accelerator (units multiply and add f32 values; no tensor
//! cores) — unit-level tiled kernels, a register-tiled GEMM, vector-matrix kernels for
//! decoding's rows, the naive kernel as the fallback — the fastest for each shape chosen by
//! CubeCL's autotuner, in the forward and, under autodiff, in the backward (`dA = dC Bᵀ`,
//! `dB = Aᵀ dC`, each an exact product too).
//!
//! Why a route of burnlens's own: Burn's `matmul` on a `Cube` device autotunes over cubek's
//! kernels, tensor-core ones included, and cubek runs f32 operands on tensor cores as TF32
//! (inputs rounded to 10 mantissa bits) wherever the device has TF32 — every NVIDIA GPU from
//! Ampere on — with no switch to turn it off (`cubek_matmul`'s `adjust_dtypes`). That put a
//! GPT-2 forward 2.5e-3 away from the CPU's on an H100. [`super::super::matmul`] takes this
//! route unless the user asked for faster products (`--compute tf32`).
//!
//! Shapes: `a: [.., m, k]`, `b: [.., k, n]` with equal leading dimensions (no broadcasting:
//! the caller folds a weight's product into two dimensions first), any strides (a candidate
//! that refuses a layout drops out of the tuning; the naive kernel takes any).

use std::sync::atomic::{AtomicUsize, Ordering};

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::{Autodiff, Backend, Cube, DispatchDevice, TensorMetadata, backend_extension, tensor::FloatTensor};
use burn::tensor::{DType, Device, Tensor};
use burn_cubecl::CubeBackend;
use burn_cubecl::kernel::matmul::init_matmul_output;
use burn_cubecl::tensor::CubeTensor;
use cubecl::CubeTuneId;
use cubecl::prelude::Scalar;
use cubecl::tune::{LocalTuner, Tunable, TunableSet, TuneGroup, local_tuner};
use cubek::matmul::definition::{MatmulElems, MatmulGlobalElems, MatmulKind, MatmulSetupError};
use cubek::matmul::launch::launch_ref;
use cubek::matmul::multi_level;
use cubek::matmul::multi_level::routines::gemm::GemmStrategy;
use cubek::matmul::routine::BlueprintStrategy;
use cubek::matmul::strategy::Strategy;
use cubek::matmul::tune_key::{MatmulAutotuneKey, MatmulGlobalScale};
use cubek::std::InputBinding;

/// The extension that carries dispatch tensors to the exact product on `Cube` (with the
/// `fusion` feature, as one opaque operation in Burn's fused streams; and its autodiff
/// wrapper, whose backward is two more exact products).
#[backend_extension(Cube, Fusion: cfg(feature = "fusion"), Autodiff)]
pub trait ExactMatmul: Backend {
    /// `a · b` over the last two dimensions, in f32 arithmetic.
    #[fusion(dtype = a, shape = product_shape(a, b))]
    fn bl_matmul_exact(a: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self>;
}

impl ExactMatmul for CubeBackend {
    fn bl_matmul_exact(a: CubeTensor, b: CubeTensor) -> CubeTensor {
        product(a, b)
    }
}

/// The shape of `a · b`: `a`'s with its last dimension `b`'s (what the fused stream records
/// before the product runs).
#[cfg(feature = "fusion")]
fn product_shape(a: &burn::tensor::Shape, b: &burn::tensor::Shape) -> burn::tensor::Shape {
    let mut out = a.clone();
    let d = out.num_dims();
    out[d - 1] = b[d - 1];
    out
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

/// The candidates of an exact product: cubek's routines that need no accelerator (so cubek
/// never promotes their operands to TF32): the naive kernel (first: the fallback that always
/// runs), the unit-level tiled kernels at both tile sizes, single- and double-buffered, the
/// register-tiled GEMM without stages, and the vector-matrix routines for decoding's rows.
fn candidates() -> Vec<multi_level::Strategy> {
    use multi_level::Strategy as S;
    use multi_level::routines::TileSizeSelection;
    use multi_level::routines::batch::{double_unit::DoubleUnitSelectionArgs, simple_unit::SimpleUnitSelectionArgs};
    let mut v = vec![S::Naive];
    for tile_size in [TileSizeSelection::MaxTileSize, TileSizeSelection::MinTileSize] {
        v.push(S::SimpleUnit(BlueprintStrategy::Inferred(SimpleUnitSelectionArgs { tile_size })));
        v.push(S::DoubleUnit(BlueprintStrategy::Inferred(DoubleUnitSelectionArgs { tile_size })));
    }
    v.push(S::Gemm(BlueprintStrategy::Inferred(GemmStrategy { target_num_planes: None })));
    v.push(S::SimpleVecMat(BlueprintStrategy::Inferred(().into())));
    v.push(S::DoubleVecMat(BlueprintStrategy::Inferred(().into())));
    v.push(S::GemvUnitPerpendicular(BlueprintStrategy::Inferred(Default::default())));
    v
}

static CALLS: AtomicUsize = AtomicUsize::new(0);

/// Products this process ran on the exact kernel (forward and backward).
pub fn calls() -> usize {
    CALLS.load(Ordering::Relaxed)
}

/// `a · b` on the device by the fastest of [`candidates`] for its shape and layout, chosen
/// by CubeCL's autotuner the first time a shape is met (as Burn chooses among all of cubek's
/// kernels) and remembered per device.
pub(super) fn product(a: CubeTensor, b: CubeTensor) -> CubeTensor {
    CALLS.fetch_add(1, Ordering::Relaxed);
    let out = init_matmul_output(&a, &b, DType::F32);
    static TUNER: LocalTuner<MatmulAutotuneKey, CubeTuneId> = local_tuner!();
    let id = CubeTuneId::new(&a.client, &a.device);
    let client = a.client.clone();
    let tunables = TUNER.init(&id, || {
        let exact = TuneGroup::<MatmulAutotuneKey>::new("exact f32", |_| 1);
        let mut set = TunableSet::new(tune_key, tune_inputs);
        for strategy in candidates() {
            let name = format!("burnlens_exact_{strategy}");
            let tried = strategy.clone();
            set = set.with(
                Tunable::new(&name, move |(a, b, out): Inputs| launch(&strategy, a, b, out).map_err(|e| format!("{e:?}")))
                    .group(&exact, move |key| priority(&tried, key)),
            );
        }
        set
    });
    TUNER.execute(&id, &client, tunables, (a, b, out.clone()));
    out
}

/// Which candidates a shape tries (1) and which it skips (-1): the naive kernel only for
/// small or inner products (it stays the fallback for every shape), the vector routines only
/// for a matrix times a vector or a vector times a matrix.
fn priority(strategy: &multi_level::Strategy, key: &MatmulAutotuneKey) -> i8 {
    use multi_level::Strategy as S;
    let vector = matches!(key.analysis.kind, MatmulKind::MatVec | MatmulKind::VecMat);
    let tiny = matches!(key.analysis.kind, MatmulKind::InnerProduct) || matches!(key.analysis.scale_global, MatmulGlobalScale::Small);
    let tried = match strategy {
        S::Naive => tiny,
        S::SimpleVecMat(_) | S::DoubleVecMat(_) | S::GemvUnitPerpendicular(_) => vector,
        _ => true,
    };
    if tried { 1 } else { -1 }
}

type Inputs = (CubeTensor, CubeTensor, CubeTensor);

fn tune_key((a, b, _): &Inputs) -> MatmulAutotuneKey {
    let f = f32::elem_type_native();
    MatmulAutotuneKey::generate(
        &a.client,
        a.meta.shape(),
        b.meta.shape(),
        a.meta.strides(),
        b.meta.strides(),
        a.meta.tiling,
        b.meta.tiling,
        f,
        f,
        f,
        None,
        None,
    )
}

fn tune_inputs(_: &MatmulAutotuneKey, (a, b, out): &Inputs) -> Inputs {
    (a.clone(), b.clone(), out.copy())
}

/// One candidate's launch into `out`.
fn launch(strategy: &multi_level::Strategy, a: CubeTensor, b: CubeTensor, out: CubeTensor) -> Result<(), MatmulSetupError> {
    let f32_type = f32::elem_type_native();
    let mut dtypes = MatmulElems::from_globals(&MatmulGlobalElems { lhs: f32_type, rhs: f32_type, out: f32_type });
    let client = out.client.clone();
    let (lhs, rhs) = (InputBinding::new(a.binding(), f32_type), InputBinding::new(b.binding(), f32_type));
    launch_ref(&Strategy::MultiLevel(strategy.clone()), &client, lhs, rhs, out.binding(), &mut dtypes)
}

/// `t` with its last two dimensions swapped (a view; on `Fusion`, a lazy one).
pub(super) fn transposed<B: Backend>(t: FloatTensor<B>) -> FloatTensor<B> {
    let d = t.shape().num_dims();
    B::float_swap_dims(t, d - 2, d - 1)
}

#[derive(Debug)]
struct ExactMatmulBackward;

impl Backward<Cube, 2> for ExactMatmulBackward {
    /// The two operands.
    type State = (FloatTensor<Cube>, FloatTensor<Cube>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_a, node_b] = ops.parents;
        let dc = grads.consume::<Cube>(&ops.node);
        let (a, b) = ops.state;
        if let Some(node) = node_a {
            grads.register::<Cube>(node.id, Cube::bl_matmul_exact(dc.clone(), transposed::<Cube>(b)));
        }
        if let Some(node) = node_b {
            grads.register::<Cube>(node.id, Cube::bl_matmul_exact(transposed::<Cube>(a), dc));
        }
    }
}

impl<C: CheckpointStrategy> ExactMatmul for Autodiff<Cube, C> {
    fn bl_matmul_exact(a: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self> {
        let (a, ga) = a.into_parts();
        let (b, gb) = b.into_parts();
        match ExactMatmulBackward.prepare::<C>([ga, gb]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let out = Cube::bl_matmul_exact(a.clone(), b.clone());
                prep.finish((a, b), out)
            }
            OpsKind::UnTracked(prep) => prep.finish(Cube::bl_matmul_exact(a, b)),
        }
    }
}
