//! `Sᵀ · D` on a GPU for a mostly-zero `S: [n, m]` and a dense `D: [n, d]`: the gradient of a
//! weight whose other factor is sparse — the decoder's `actsᵀ · g` under TopK, the encoder's
//! `x_inᵀ · g_pre` (as `(g_preᵀ · x_in)ᵀ`) whose pre-activation gradient lives on the same
//! support.
//!
//! `sparse_t_rows`: a cube per output row `f` (a column of `S`) and 256 units over the `d`
//! output columns walk the `n` rows in order, and only where `S[r, f] ≠ 0` (the same value
//! read by every unit of the cube, so the branch is uniform) add `S[r, f] · D[r, c]`. Exact
//! f32 sums in row order whatever the sparsity (a dense `S` is merely slow); no lists, no
//! atomics, nothing read back. Its cost is one read of `S` down each column (`n · m` values)
//! plus `nnz · d` multiply-adds, where a dense product takes `n · m · d`.

use burn::backend::{Backend, backend_extension, tensor::FloatTensor};
use burn::tensor::DType;
use burn_cubecl::CubeBackend;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::exact_matmul::{product, transposed};
use super::grid::GRID_LIMIT;

/// Units per cube.
const UNITS: u32 = 256;

/// The extension that carries the backward passes' tensors to the kernel (on `Fusion`, as
/// one opaque operation of its stream).
#[backend_extension(Cube, Fusion: cfg(feature = "fusion"))]
pub trait SparseTProduct: Backend {
    /// `sᵀ · dense` for `s: [n, m]`, `dense: [n, d]`: `[m, d]` (the exact product where the
    /// kernel's grid does not fit).
    #[fusion(dtype = s, shape = burn::tensor::Shape::new([s[1], dense[1]]))]
    fn bl_sparse_t_product(s: FloatTensor<Self>, dense: FloatTensor<Self>) -> FloatTensor<Self>;
}

impl SparseTProduct for CubeBackend {
    fn bl_sparse_t_product(s: CubeTensor, dense: CubeTensor) -> CubeTensor {
        let ((n, m), d) = ((s.meta.shape()[0], s.meta.shape()[1]), dense.meta.shape()[1]);
        if fits(n, m, d) { sparse_t_product(s, dense) } else { product(transposed::<CubeBackend>(s), dense) }
    }
}

/// Whether [`sparse_t_product`] takes `S: [n, m]`, `D: [n, d]`: `m` output rows and `d`
/// output columns within the grid, and 32-bit offsets.
pub(super) fn fits(n: usize, m: usize, d: usize) -> bool {
    m <= GRID_LIMIT && d.div_ceil(UNITS as usize) <= GRID_LIMIT && n * m < u32::MAX as usize && n * d < u32::MAX as usize
}

/// `Sᵀ · D`, `[m, d]` (the caller checked [`fits`]).
fn sparse_t_product(s: CubeTensor, dense: CubeTensor) -> CubeTensor {
    let (s, dense) = (into_contiguous(s), into_contiguous(dense));
    let (n, m, d) = (s.meta.shape()[0], s.meta.shape()[1], dense.meta.shape()[1]);
    let client = s.client.clone();
    let out = empty_device_dtype(client.clone(), s.device.clone(), [m, d].into(), DType::F32);
    sparse_t_rows::launch(
        &client,
        CubeCount::Static(d.div_ceil(UNITS as usize) as u32, m as u32, 1),
        CubeDim::new_1d(UNITS),
        unsafe { BufferArg::from_raw_parts(s.handle.clone(), n * m) },
        unsafe { BufferArg::from_raw_parts(dense.handle.clone(), n * d) },
        unsafe { BufferArg::from_raw_parts(out.handle.clone(), m * d) },
        n as u32,
        m as u32,
        d as u32,
    );
    out
}

/// Output row `f = CUBE_POS_Y`, column `CUBE_POS_X · 256 + UNIT_POS`.
#[cube(launch)]
fn sparse_t_rows(s: &[f32], dense: &[f32], out: &mut [f32], n: u32, m: u32, d: u32) {
    let f = CUBE_POS_Y as usize;
    let col = CUBE_POS_X * 256u32 + UNIT_POS;
    // Past the last column a unit still walks the rows (the cube's branch stays uniform) but
    // reads no `D` (a kernel's `&&` reads both sides).
    let live = col < d;
    let at = col.min(d - 1u32) as usize;
    let mut acc = 0.0f32;
    for r in 0..n {
        let v = s[r as usize * m as usize + f];
        if v != 0.0f32 {
            acc += v * dense[r as usize * d as usize + at];
        }
    }
    if live {
        out[f * d as usize + col as usize] = acc;
    }
}
