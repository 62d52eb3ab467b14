//! The matrix products under every kernel: the `gemm` crate (the one flex itself calls,
//! built with its AVX-512 kernels, picked at run time) with burnlens's own threading.
//! On AVX2 CPUs without AVX-512, a product whose `a` has contiguous rows goes to
//! burnlens's own tiles instead ([`super::avx2_gemm`]).
//!
//! Why not flex's `matmul`: it gives a product all of gemm's threads only above
//! `m·n·k = 192³` and otherwise runs it on one, and its `m = 1` matrix-vector path is
//! single-threaded. For transformer shapes (skinny `m`, wide `n`) splitting the output
//! columns into one block per thread, each a single-threaded gemm call, measured faster than
//! gemm's internal threading (see BENCHMARKS.md), and for decoding it reads the weights with
//! every core, which is what a memory-bound product needs.

use gemm::Parallelism;

use super::pool::SendPtr;

pub use super::mat_ref::MatRef;
pub(crate) use super::mat_ref::check_view;

/// Below this many multiply-adds a product runs on one thread: splitting costs more than it
/// saves.
const SPLIT_MIN_MACS: usize = 48 * 48 * 64;

/// `dst[m, n] (+)= a[m, k] · b[k, n]`; `dst` is row-major with row stride `dst_rs`.
/// `accumulate` adds to what `dst` holds, otherwise it is overwritten.
pub fn matmul(dst: &mut [f32], dst_rs: usize, a: MatRef, b: MatRef, accumulate: bool) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert_eq!(b.rows, k, "matmul: inner dimensions {k} and {}", b.rows);
    if nothing_to_multiply(dst, dst_rs, [m, k, n], accumulate, "matmul") {
        return;
    }
    a.check();
    b.check();
    let threads = super::pool::threads();
    let macs = m.saturating_mul(n).saturating_mul(k);
    #[cfg(target_arch = "x86_64")]
    if macs >= SPLIT_MIN_MACS && super::avx2_gemm::takes(&a, n) {
        return super::avx2_gemm::matmul(dst, dst_rs, a, b, accumulate);
    }
    if threads <= 1 || macs < SPLIT_MIN_MACS {
        // SAFETY: bounds checked above.
        unsafe { call(dst.as_mut_ptr(), dst_rs, a, b, accumulate) };
        return;
    }
    // One block of output per thread, along the longer side; column blocks are multiples of
    // 64 so that every block keeps whole vector registers.
    let ptr = SendPtr(dst.as_mut_ptr());
    if n >= m || m < 2 * threads {
        let block = n.div_ceil(threads).next_multiple_of(64).min(n);
        super::pool::run(n.div_ceil(block), |i| {
            let p = ptr;
            let c0 = i * block;
            // SAFETY: blocks write disjoint columns of `dst`, all inside it.
            unsafe { call(p.0.add(c0), dst_rs, a, b.cols(c0, block.min(n - c0)), accumulate) };
        });
    } else {
        let block = m.div_ceil(threads);
        super::pool::run(m.div_ceil(block), |i| {
            let p = ptr;
            let r0 = i * block;
            // SAFETY: blocks write disjoint rows of `dst`, all inside it.
            unsafe { call(p.0.add(r0 * dst_rs), dst_rs, a.rows(r0, block.min(m - r0)), b, accumulate) };
        });
    }
}

/// What every product checks first: panics unless `dst` holds the `m × n` result at row
/// stride `dst_rs`; `true` when nothing is left to multiply (an empty result, or `k = 0`:
/// zeros, unless accumulating).
pub(crate) fn nothing_to_multiply(dst: &mut [f32], dst_rs: usize, [m, k, n]: [usize; 3], accumulate: bool, what: &str) -> bool {
    assert!(m == 0 || dst.len() >= (m - 1) * dst_rs + n, "{what}: destination too small");
    if m == 0 || n == 0 {
        return true;
    }
    if k == 0 {
        if !accumulate {
            for r in 0..m {
                dst[r * dst_rs..r * dst_rs + n].fill(0.0);
            }
        }
        return true;
    }
    false
}

/// `dst (+)= a · b` on the calling thread, for kernels that split work themselves.
///
/// # Safety
/// `dst` must be valid for writes of `a.rows` rows of `b.cols` elements at row stride
/// `dst_rs`, and nothing else may access those elements during the call.
pub unsafe fn matmul_single(dst: *mut f32, dst_rs: usize, a: MatRef, b: MatRef, accumulate: bool) {
    assert_eq!(b.rows, a.cols, "matmul: inner dimensions {} and {}", a.cols, b.rows);
    if a.rows == 0 || b.cols == 0 {
        return;
    }
    if a.cols == 0 {
        if !accumulate {
            for r in 0..a.rows {
                // SAFETY: the caller guarantees the rows are writable.
                unsafe { std::slice::from_raw_parts_mut(dst.add(r * dst_rs), b.cols).fill(0.0) };
            }
        }
        return;
    }
    a.check();
    b.check();
    // SAFETY: views checked; `dst` is the caller's guarantee.
    unsafe { call(dst, dst_rs, a, b, accumulate) }
}

/// One single-threaded gemm call.
///
/// # Safety
/// `dst` must hold `a.rows` rows of `b.cols` elements at row stride `dst_rs`, and the views
/// must be in bounds.
unsafe fn call(dst: *mut f32, dst_rs: usize, a: MatRef, b: MatRef, accumulate: bool) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst,
            1,
            dst_rs as isize,
            accumulate,
            a.data.as_ptr().add(a.offset),
            a.cs,
            a.rs,
            b.data.as_ptr().add(b.offset),
            b.cs,
            b.rs,
            1.0f32,
            1.0f32,
            false,
            false,
            false,
            Parallelism::None,
        )
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Deterministic test values in [-2, 2): `n` of them, seeded by `s`.
    pub(crate) fn vals(n: usize, s: usize) -> Vec<f32> {
        (0..n).map(|i| (((i * 7919 + s * 104729) % 1000) as f32 - 500.0) / 250.0).collect()
    }

    /// `a · b` in f64, the reference for the products.
    pub(crate) fn naive(a: &MatRef, b: &MatRef) -> Vec<f32> {
        let at = |m: &MatRef, i: usize, j: usize| m.data[(m.offset as isize + i as isize * m.rs + j as isize * m.cs) as usize];
        let mut out = vec![0.0; a.rows * b.cols];
        for i in 0..a.rows {
            for j in 0..b.cols {
                out[i * b.cols + j] = (0..a.cols).map(|p| at(a, i, p) as f64 * at(b, p, j) as f64).sum::<f64>() as f32;
            }
        }
        out
    }

    #[test]
    fn strided_products_match_a_naive_product_on_every_split() {
        for &(m, k, n) in &[(1, 5, 3), (1, 768, 300), (3, 1, 4), (200, 70, 9), (7, 130, 333), (130, 64, 130), (0, 3, 4), (4, 0, 5)] {
            let a_data = vals(m * k, 1);
            let b_data = vals(k * n, 2);
            let a = MatRef::row_major(&a_data, m, k);
            // b stored transposed ([n, k]) and read through a view.
            let bt: Vec<f32> = (0..n * k).map(|i| b_data[(i % k) * n + i / k]).collect();
            for b in [MatRef::row_major(&b_data, k, n), MatRef::row_major(&bt, n, k).t()] {
                let want = naive(&a, &b);
                for accumulate in [false, true] {
                    let mut dst = vec![1.0f32; m * n];
                    matmul(&mut dst, n, a, b, accumulate);
                    for (i, (&g, &w)) in dst.iter().zip(&want).enumerate() {
                        let w = if accumulate { w + 1.0 } else { w };
                        assert!((g - w).abs() <= 1e-4 * (1.0 + w.abs()), "{m}x{k}x{n} acc={accumulate} [{i}]: {g} vs {w}");
                    }
                }
            }
        }
    }
}
