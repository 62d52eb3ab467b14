//! One panel of a matrix packed for a micro-kernel: `p` of its columns side by side, a row a
//! step, zeros past its last column. The weights packed once ([`super::packed`]) and the AVX2
//! products' per-call panels ([`super::avx2_gemm`]) both fill theirs here.

use super::mat_ref::MatRef;
use super::transpose16::transpose_copy;

/// `dst[r · p + c] = b[r, c0 + c]` for `r < b.rows`, `c < cols`; zero for `cols ≤ c < p`.
pub(crate) fn fill_panel(dst: &mut [f32], b: MatRef, c0: usize, cols: usize, p: usize) {
    let dst = &mut dst[..b.rows * p];
    let row0 = |r: usize| b.offset as isize + r as isize * b.rs + c0 as isize * b.cs;
    if b.cs == 1 {
        // Each row's columns adjacent: one copy a row.
        for (r, d) in dst.chunks_exact_mut(p).enumerate() {
            let start = row0(r) as usize;
            d[..cols].copy_from_slice(&b.data[start..start + cols]);
            d[cols..].fill(0.0);
        }
    } else if b.rs == 1 && b.cs > 0 {
        // A transposed view (`Wᵀ` of an `nn.Linear` weight): its columns are contiguous runs.
        transpose_copy(&b.data[row0(0) as usize..], b.cs as usize, b.rows, cols, dst, p);
        if cols < p {
            dst.chunks_exact_mut(p).for_each(|d| d[cols..].fill(0.0));
        }
    } else {
        for (r, d) in dst.chunks_exact_mut(p).enumerate() {
            for (c, v) in d.iter_mut().enumerate() {
                *v = if c < cols { b.data[(row0(r) + c as isize * b.cs) as usize] } else { 0.0 };
            }
        }
    }
}
