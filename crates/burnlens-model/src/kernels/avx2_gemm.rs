//! burnlens's own f32 product on AVX2 CPUs without AVX-512 (AMD Zen 3, older Intel), for
//! products whose `a` has contiguous rows (a linear layer's forward `x W` and its `dx = dy
//! Wᵀ`): `b` packed once per call by all threads, then tiles of six rows by sixteen columns
//! ([`super::avx2_tile`]) computed by all threads, `a` read in place.
//!
//! Why: gemm-f32's AVX2 micro-kernel broadcasts `a`'s values through a run-time stride (six
//! dependent address adds a depth step) and unrolls two steps, and with the rows split each
//! thread's gemm call packs all of `b` again. On a Zen 3 (BENCHMARKS.md, thirty-ninth),
//! GPT-2-like training products at 2,048 positions, both paths alternated in one process
//! (minima of 31 calls each, two runs): forwards 1.04–1.31x, `dx` 1.01–1.21x. `dW = xᵀ dy`
//! (`a` read through its transpose) stays with gemm: here, `xᵀ` read in place or packed, it
//! ran 0.75–1.05x.
//!
//! Layout: `b`'s columns in panels of [`NR`], for depth blocks of [`blocks`] starting at depth
//! `p0` (the last `kb` deep), panel `j` at `NR · (panels · p0 + j · kb)`, `kb × NR` (zero
//! columns past `n`). Loops of the compute, outermost first: tasks (a block of [`MC`] rows by a
//! block of columns, handed out one at a time), depth blocks, the block's panels (one, at
//! most `KC × NR` = 16 KiB, stays in L1), its row tiles (at most `MC × KC` = 96 KiB of `a` in
//! L2).

use super::avx2_tile::{MR, NR, tile};
use super::mat_ref::MatRef;
use super::panel_fill::fill_panel;
use super::pool::{self, SendPtr};
use super::unfilled::unfilled;

/// Depth of one block.
const KC: usize = 256;
/// Rows of one task (sixteen tiles).
const MC: usize = 16 * MR;
/// Tasks per thread at least, where the columns allow (blocks of at least [`MIN_NC`]).
const TASKS_PER_THREAD: usize = 4;
/// The narrowest column block a task takes.
const MIN_NC: usize = 4 * NR;

/// The most floats of `b` packed at once: 16 MiB (GPT-2 small's MLP weights are 9 MiB; its
/// tied unembedding, 147 MiB, and an SAE's encoder stay with gemm, which packs a block at a
/// time).
const MAX_PACKED: usize = 1 << 22;

/// Whether this product runs here: an AVX2 CPU without AVX-512 (gemm's AVX-512 kernels
/// stay where they are), `a`'s rows contiguous, a few whole tiles each way, and `b` no
/// larger than [`MAX_PACKED`].
pub(crate) fn takes(a: &MatRef, n: usize) -> bool {
    can_run() && !super::simd::has_avx512() && a.cs == 1 && a.rs > 0 && a.rows >= 2 * MR && n >= 2 * NR && a.cols >= 8 && a.cols.saturating_mul(n) <= MAX_PACKED
}

/// Whether the CPU has the tile's instructions (AVX2 and FMA; every AVX-512 CPU has them, so
/// the tests run there too).
fn can_run() -> bool {
    super::simd::has_avx2_fma()
}

/// `dst[m, n] (+)= a[m, k] · b[k, n]`, `dst` row-major at row stride `dst_rs`, on every
/// kernel thread. The caller has checked the views and `dst`'s size, and [`takes`].
pub(crate) fn matmul(dst: &mut [f32], dst_rs: usize, a: MatRef, b: MatRef, accumulate: bool) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    let a_rs = a.rs as usize;
    let panels = n.div_ceil(NR);
    let mut pb = unfilled(panels * NR * k);
    pack_panels(&mut pb, b);
    let row_blocks = m.div_ceil(MC);
    let mut nc = panels;
    while row_blocks * panels.div_ceil(nc) < TASKS_PER_THREAD * pool::threads() && nc * NR >= 2 * MIN_NC {
        nc = nc.div_ceil(2);
    }
    let col_blocks = panels.div_ceil(nc);
    let pb = &pb[..];
    let out = SendPtr(dst.as_mut_ptr());
    pool::run(row_blocks * col_blocks, |task| {
        let out = out;
        let (r0, j0) = (task / col_blocks * MC, task % col_blocks * nc);
        let (r1, j1) = ((r0 + MC).min(m), (j0 + nc).min(panels));
        // The block's last rows, fewer than a tile: copied here, zero rows below them.
        let rest = (r1 - r0) % MR;
        let mut last = Vec::new();
        for (p0, kb) in blocks(k) {
            let add = accumulate || p0 > 0;
            if rest > 0 {
                last.clear();
                last.resize(MR * kb, 0.0);
                for (r, row) in last.chunks_exact_mut(kb).take(rest).enumerate() {
                    let start = a.offset + (r1 - rest + r) * a_rs + p0;
                    row.copy_from_slice(&a.data[start..start + kb]);
                }
            }
            for j in j0..j1 {
                let bp = &pb[NR * (panels * p0 + j * kb)..][..NR * kb];
                let cols = NR.min(n - j * NR);
                for t in r0 / MR..r1 / MR {
                    let at = a.offset + t * MR * a_rs + p0;
                    // SAFETY: AVX2 and FMA checked by `takes` (the test: `can_run`); the
                    // tile's six rows of `kb` floats from `at` lie inside `a` (checked by the
                    // caller) and `bp` holds the panel's `kb` steps; tile (t, j) lies inside
                    // `dst` (the caller checked its size) and no other task writes it (tasks
                    // own disjoint row and column blocks).
                    unsafe { tile(kb, a.data[at..].as_ptr(), a_rs, bp.as_ptr(), out.0.add(t * MR * dst_rs + j * NR), dst_rs, [MR, cols], add) };
                }
                if rest > 0 {
                    // SAFETY: as above, from the copied rows; tile (last, j) is `rest` rows of
                    // `dst` inside it and this task's own.
                    unsafe { tile(kb, last.as_ptr(), kb, bp.as_ptr(), out.0.add((r1 - rest) * dst_rs + j * NR), dst_rs, [rest, cols], add) };
                }
            }
        }
    });
}

/// The depth blocks of a `k`-deep product as `(p0, kb)`: at most [`KC`] deep, all equal but
/// the last (384 as two of 192, not 256 and 128).
fn blocks(k: usize) -> impl Iterator<Item = (usize, usize)> {
    let depth = k.div_ceil(k.div_ceil(KC));
    (0..k).step_by(depth).map(move |p0| (p0, depth.min(k - p0)))
}

/// `b`'s panels (see the module's layout), on every kernel thread, a panel at a time.
fn pack_panels(pb: &mut [f32], b: MatRef) {
    let (k, n) = (b.rows, b.cols);
    let panels = n.div_ceil(NR);
    let out = SendPtr(pb.as_mut_ptr());
    pool::run(panels, |j| {
        let out = out;
        for (p0, kb) in blocks(k) {
            // SAFETY: panel `j` of block `p0` is its own `NR · kb` floats of `pb`.
            let dst = unsafe { std::slice::from_raw_parts_mut(out.0.add(NR * (panels * p0 + j * kb)), NR * kb) };
            fill_panel(dst, b.rows(p0, kb), j * NR, NR.min(n - j * NR), NR);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::gemm::tests::{naive, vals};

    /// Every edge: partial tiles and panels, one and several depth blocks (uneven ones too),
    /// `a` row-major and with a wider row stride, `b` in both layouts and a general stride,
    /// accumulate on and off, `dst` wider than the product; outputs start as NaN where they
    /// are overwritten, and what lies past them must stay as it was.
    #[test]
    fn tiles_match_a_naive_product_on_every_edge() {
        if !can_run() {
            return;
        }
        let shapes = [(12, 8, 32), (13, 9, 33), (50, 257, 70), (97, 513, 130), (103, 300, 16), (200, 64, 300)];
        for &(m, k, n) in &shapes {
            let (ad, bd) = (vals(m * (k + 3) + 2, 1), vals(k * n * 2, 2));
            let a_views = [MatRef::row_major(&ad, m, k), MatRef { data: &ad, offset: 2, rows: m, cols: k, rs: k as isize + 3, cs: 1 }];
            let b_views =
                [MatRef::row_major(&bd, k, n), MatRef::row_major(&bd, n, k).t(), MatRef { data: &bd, offset: 1, rows: k, cols: n, rs: 1, cs: 2 * k as isize }];
            for (ai, a) in a_views.iter().enumerate() {
                let big = m >= 2 * MR && n >= 2 * NR;
                assert_eq!(takes(a, n), big && !crate::kernels::simd::has_avx512(), "{m}x{k}x{n}: a row-major `a` runs here on AVX2 alone");
                assert!(!takes(&a.t(), m), "a transposed `a` (`xᵀ` in `dW`) stays with gemm");
                assert!(!takes(&MatRef::row_major(&ad, m, 1 << 16), MAX_PACKED / 8), "a `b` over the packing bound stays with gemm");
                for (bi, b) in b_views.iter().enumerate() {
                    let want = naive(a, b);
                    for accumulate in [false, true] {
                        let dst_rs = n + 5;
                        let start = if accumulate { 1.0 } else { f32::NAN };
                        let mut dst = vec![start; m * dst_rs];
                        matmul(&mut dst, dst_rs, *a, *b, accumulate);
                        for i in 0..m {
                            for j in 0..n {
                                let (g, w) = (dst[i * dst_rs + j], want[i * n + j] + if accumulate { 1.0 } else { 0.0 });
                                assert!((g - w).abs() <= 1e-4 * (1.0 + w.abs()), "{m}x{k}x{n} a{ai} b{bi} acc={accumulate} [{i},{j}]: {g} vs {w}");
                            }
                            assert!(dst[i * dst_rs + n..(i + 1) * dst_rs].iter().all(|&v| v.to_bits() == start.to_bits()), "{m}x{k}x{n}: wrote past row {i}");
                        }
                    }
                }
            }
        }
    }
}
