//! The AVX2 micro-kernel of [`super::avx2_gemm`] and of the weights packed once
//! ([`super::packed`], whose AVX2 panels are its `b`): one tile of six rows by sixteen columns
//! of `dst (+)= a · b`, from `a`'s six rows read in place and `b`'s sixteen columns packed
//! sixteen per depth step.
//!
//! Twelve accumulators, two vector loads and six broadcasts a depth step, four steps a loop
//! turn; every address an immediate offset from a row's pointer (gemm-f32's AVX2 kernel, which
//! the products took before, broadcasts through a run-time stride: six dependent address
//! adds a step). The tile's rows are row-major in `dst`, so the sums are stored as they are.

use std::arch::x86_64::*;

/// Rows of `a` (and of `dst`) in one tile.
pub(crate) const MR: usize = 6;
/// Columns of `b` (and of `dst`) in one tile: two vectors of eight.
pub(crate) const NR: usize = 16;

/// `dst[r, c] (+)= Σ_p a[r · a_rs + p] · b[p·NR + c]` for `r < rows`, `c < cols`, `p < k`
/// (`a`'s six rows contiguous, `a_rs` apart); `add` adds to what `dst` holds, otherwise it
/// is overwritten. Rows and columns past `rows`/`cols` are computed into a scratch tile and
/// not written.
///
/// # Safety
/// The CPU has AVX2 and FMA; `a` holds six rows of `k` floats at row stride `a_rs`, `b`
/// holds `k · NR` floats; `dst` is valid for `rows` rows of `cols` floats at row stride
/// `dst_rs`, and nothing else accesses them.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn tile(k: usize, a: *const f32, a_rs: usize, b: *const f32, dst: *mut f32, dst_rs: usize, [rows, cols]: [usize; 2], add: bool) {
    let mut c = [[_mm256_setzero_ps(); 2]; MR];
    // One pointer a row, a step one float on.
    let mut at: [*const f32; MR] = std::array::from_fn(|r| a.wrapping_add(r * a_rs));
    let mut b = b;
    macro_rules! step {
        ($s:expr) => {{
            // SAFETY: step `$s` of the current four lies inside both operands.
            let (b0, b1) = unsafe { (_mm256_loadu_ps(b.add(NR * $s)), _mm256_loadu_ps(b.add(NR * $s + 8))) };
            for (r, acc) in c.iter_mut().enumerate() {
                let x = unsafe { _mm256_broadcast_ss(&*at[r].add($s)) };
                acc[0] = _mm256_fmadd_ps(b0, x, acc[0]);
                acc[1] = _mm256_fmadd_ps(b1, x, acc[1]);
            }
        }};
    }
    for _ in 0..k / 4 {
        step!(0);
        step!(1);
        step!(2);
        step!(3);
        // Four steps consumed: still inside (or one past) the operands.
        at = at.map(|p| p.wrapping_add(4));
        b = b.wrapping_add(4 * NR);
    }
    for _ in 0..k % 4 {
        step!(0);
        at = at.map(|p| p.wrapping_add(1));
        b = b.wrapping_add(NR);
    }
    if rows == MR && cols == NR {
        for (r, acc) in c.iter().enumerate() {
            // SAFETY: the caller's guarantee on `dst` for a whole tile.
            unsafe {
                let d = dst.add(r * dst_rs);
                let (v0, v1) =
                    if add { (_mm256_add_ps(_mm256_loadu_ps(d), acc[0]), _mm256_add_ps(_mm256_loadu_ps(d.add(8)), acc[1])) } else { (acc[0], acc[1]) };
                _mm256_storeu_ps(d, v0);
                _mm256_storeu_ps(d.add(8), v1);
            }
        }
        return;
    }
    let mut part = [[0.0f32; NR]; MR];
    for (row, acc) in part.iter_mut().zip(&c) {
        // SAFETY: `row` holds sixteen floats.
        unsafe {
            _mm256_storeu_ps(row.as_mut_ptr(), acc[0]);
            _mm256_storeu_ps(row.as_mut_ptr().add(8), acc[1]);
        }
    }
    for (r, row) in part.iter().enumerate().take(rows) {
        // SAFETY: the caller's guarantee on `dst` for `rows × cols`.
        let d = unsafe { std::slice::from_raw_parts_mut(dst.add(r * dst_rs), cols) };
        for (o, &v) in d.iter_mut().zip(row) {
            *o = if add { *o + v } else { v };
        }
    }
}
