//! `a · b` whose output's gradient is mostly zeros: the encoder's `x_in · W_enc` in a TopK
//! step, where only the kept features' pre-activations get a gradient. The forward is the
//! exact product ([`super::exact_matmul`]); the backward reads only the gradient's non-zeros:
//! `dA = G · bᵀ` lists each row's non-zeros and sums those rows of `bᵀ` ([`super::sparse_decode`]'s
//! kernels, on a contiguous copy of `bᵀ`), `dB = aᵀ · G` is `(Gᵀ · a)ᵀ` by
//! [`super::sparse_t_product`]. Exact for any `G` (a row past `cap` non-zeros is read whole; a
//! dense `G` is merely slow).

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::{Autodiff, Backend, Cube, backend_extension, tensor::FloatTensor};
use burn::tensor::{DType, Tensor};
use burn_cubecl::CubeBackend;
use burn_cubecl::tensor::CubeTensor;

use super::exact_matmul::{ExactMatmul, on_cube, product, transposed};
use super::grid::GRID_LIMIT;
use super::sparse_decode::SparseDecode;
use super::sparse_t_product::{SparseTProduct, fits};

/// The extension that carries dispatch tensors to the product (and the autodiff wrapper,
/// whose backward reads the gradient's non-zeros).
#[backend_extension(Cube, Fusion: cfg(feature = "fusion"), Autodiff)]
pub trait SparseGradProduct: Backend {
    /// `a · b` for `a: [n, k]`, `b: [k, m]`, its output's gradient expected to hold about
    /// `cap` non-zeros a row.
    #[fusion(dtype = a, shape = burn::tensor::Shape::new([a[0], b[1]]))]
    fn bl_product_sparse_grad(a: FloatTensor<Self>, b: FloatTensor<Self>, cap: usize) -> FloatTensor<Self>;
}

impl SparseGradProduct for CubeBackend {
    fn bl_product_sparse_grad(a: CubeTensor, b: CubeTensor, _cap: usize) -> CubeTensor {
        product(a, b)
    }
}

/// Whether the kernels take `a · b`: f32 matrices on a `Cube` device whose output's rows fit
/// the grid (one cube per row for the lists) and whose `bᵀ · ` fits [`fits`].
pub fn applies(a: &Tensor<2>, b: &Tensor<2>, cap: usize) -> bool {
    let ([n, k], [k2, m]) = (a.dims(), b.dims());
    let shapes = k == k2 && (1..=GRID_LIMIT).contains(&n) && fits(n, m, k) && n * k < u32::MAX as usize && k * m < u32::MAX as usize;
    shapes && cap >= 1 && on_cube(&a.device()) && on_cube(&b.device()) && a.dtype() == DType::F32 && b.dtype() == DType::F32
}

/// See [`super::product_sparse_grad`]; the caller checked [`applies`].
pub fn product_sparse_grad(a: Tensor<2>, b: Tensor<2>, cap: usize) -> Tensor<2> {
    Tensor::from_dispatch(<burn::backend::Dispatch as SparseGradProduct>::bl_product_sparse_grad(a.into_dispatch(), b.into_dispatch(), cap))
}

#[derive(Debug)]
struct SparseGradBackward;

impl Backward<Cube, 2> for SparseGradBackward {
    /// The two operands and the lists' capacity.
    type State = (FloatTensor<Cube>, FloatTensor<Cube>, usize);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_a, node_b] = ops.parents;
        let g = grads.consume::<Cube>(&ops.node);
        let (a, b, cap) = ops.state;
        if let Some(node) = node_a {
            grads.register::<Cube>(node.id, Cube::bl_decode_sparse(g.clone(), g.clone(), transposed::<Cube>(b), cap));
        }
        if let Some(node) = node_b {
            grads.register::<Cube>(node.id, transposed::<Cube>(Cube::bl_sparse_t_product(g, a)));
        }
    }
}

impl<C: CheckpointStrategy> SparseGradProduct for Autodiff<Cube, C> {
    fn bl_product_sparse_grad(a: FloatTensor<Self>, b: FloatTensor<Self>, cap: usize) -> FloatTensor<Self> {
        let (a, ga) = a.into_parts();
        let (b, gb) = b.into_parts();
        match SparseGradBackward.prepare::<C>([ga, gb]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let out = Cube::bl_matmul_exact(a.clone(), b.clone());
                prep.finish((a, b, cap), out)
            }
            OpsKind::UnTracked(prep) => prep.finish(Cube::bl_matmul_exact(a, b)),
        }
    }
}
