//! burnlens's own GPU kernels, written in CubeCL (they compile for every CubeCL runtime
//! Burn's `Cube` backend runs: wgpu — Mesa's lavapipe included, which runs them on the CPU
//! for tests — and CUDA), plugged into Burn through a backend extension for `Cube`.
//!
//! Each public function here answers `None` where its kernel does not apply (a build without
//! `wgpu` or `cuda`, a tensor on another backend, a shape past the kernel's limits), and the
//! caller keeps its composed-ops path for those.
//!
//! | kernel | does | module |
//! |---|---|---|
//! | radix selection | the `k`-th largest value of each row (TopK, BatchTopK and the auxiliary loss's choice), four passes and no read-back | `radix_select` |

#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod radix_select;

use burn::tensor::Tensor;

/// The `k`-th largest value of each row of `x` (`1 ≤ k ≤` its width), `[rows, 1]`, in
/// [`f32::total_cmp`]'s order, computed on the tensor's GPU by burnlens's radix-selection
/// kernel; `None` where that kernel does not run (see the module's note). `x` must not be
/// tracked by autodiff.
pub fn kth_largest_rows(x: &Tensor<2>, k: usize) -> Option<Tensor<2>> {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        radix_select::kth_largest_rows(x, k)
    }
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    {
        let _ = (x, k);
        None
    }
}

/// Whether [`kth_largest_rows`] runs its kernel for `x` and `k` (rather than answer `None`).
pub fn kth_largest_rows_runs(x: &Tensor<2>, k: usize) -> bool {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        radix_select::applies(x, k)
    }
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    {
        let _ = (x, k);
        false
    }
}
