//! Each row's non-zero values listed on a GPU, `[rows, cap]` in a fixed order, by the sparse
//! decode's listing kernel (`sparse_decode::compact`, a cube per row): what BatchTopK over
//! several ranks reads back of a batch's activations (the values that can reach its
//! threshold), and an attribution graph of a layer's transcoder activations (its active
//! features), instead of the whole matrix or a mask of it.

use burn::backend::{Backend, backend_extension, tensor::FloatTensor};
use burn::tensor::{DType, Tensor};
use burn_cubecl::CubeBackend;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;

use super::exact_matmul::on_cube;
use super::grid::GRID_LIMIT;
use super::sparse_decode::compact;

/// The extension that carries a dispatch tensor to the listing kernel.
#[backend_extension(Cube, Fusion: cfg(feature = "fusion"))]
pub trait RowValues: Backend {
    /// Each row's non-zeros, up to `cap` (`[rows, cap]`; entries past a row's count are
    /// unspecified).
    #[fusion(dtype = x, shape = burn::tensor::Shape::new([x[0], *cap]))]
    fn bl_row_values(x: FloatTensor<Self>, cap: usize) -> FloatTensor<Self>;
}

impl RowValues for CubeBackend {
    fn bl_row_values(x: CubeTensor, cap: usize) -> CubeTensor {
        let x = into_contiguous(x);
        compact(&x, &x, cap).val
    }
}

/// Whether the kernel lists `x`: plain f32 `[rows, width]` on a `Cube` device, rows within
/// the grid, `cap ≥ 1`.
pub fn applies(x: &Tensor<2>, cap: usize) -> bool {
    let [rows, width] = x.dims();
    let fits = (1..=GRID_LIMIT).contains(&rows) && rows * width < u32::MAX as usize && rows * cap < u32::MAX as usize;
    fits && cap >= 1 && on_cube(&x.device()) && !x.is_autodiff() && x.dtype() == DType::F32
}

/// See [`super::row_values`]; `None` where [`applies`] does not hold.
pub fn row_values(x: &Tensor<2>, cap: usize) -> Option<Tensor<2>> {
    applies(x, cap).then(|| Tensor::from_dispatch(<burn::backend::Dispatch as RowValues>::bl_row_values(x.clone().into_dispatch(), cap)))
}
