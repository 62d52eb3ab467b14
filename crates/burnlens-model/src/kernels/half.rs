//! Products with half-precision weights and f32 compute: `dst (+)= a · W` for f32 `a` and a
//! bf16 or f16 weight `W` read in place (any strides: the transposed view of a Hugging Face
//! `[out, in]` weight, the tied unembedding `W_Eᵀ`), widened a block at a time and never as
//! a whole f32 copy.
//!
//! - **Few rows** (decoding, [`STREAM_ROWS`] or fewer), when the weight has no decoding
//!   panels ([`super::half_panels`], which `linear` reads first while their budget has
//!   room): a streaming kernel reads each weight
//!   element once and widens it in registers, every task reading its share of the weight as
//!   one stream in address order (several interleaved streams ran at a third to two thirds
//!   of the speed from memory: the prefetchers did not follow them) — dot products down one
//!   contiguous column at a time (`W`'s row stride 1, every `nn.Linear` weight), or, for
//!   rows of `W` contiguous (GPT-2's `Conv1D`), a range of whole rows per task summed into
//!   partial outputs that are added at the end. Memory-bound, so half the bytes of an f32
//!   weight is up to twice the speed.
//! - **More rows** (prefill, training-free forward passes) on AVX2 CPUs, when the weight has
//!   decoding panels (`linear` makes them there while their budget has room): a micro-kernel
//!   widening them in registers ([`super::half_panels_prefill`]). Otherwise, as follows.
//! - **More rows**, rows of `W` contiguous: each
//!   task widens the `KC × P` panels of its columns for one depth block into a buffer of its
//!   own (at most `KC × GROUP_COLS` floats, 512 KiB; sixteen rows at a time, each read front
//!   to back) and runs gemm-f32's micro-kernels over it, as gemm-f16 does when it packs,
//!   prefetching the next block a share per strip of rows meanwhile; the weight's
//!   own bytes are all that stays in memory. Columns contiguous ([`by_columns`]): the
//!   operands swap roles, `a` packed once into panels of rows and the weight widened six
//!   columns at a time into a small buffer the micro-kernels broadcast from.
//! - **No micro-kernels** (`BURNLENS_ISA=baseline`, non-x86): the same blocks widened
//!   row-major and multiplied by `gemm`.
//!
//! Widening is exact: bf16 → f32 is a 16-bit shift; f16 → f32 ([`f16_to_f32`]) a branch-free
//! bit conversion that LLVM vectorises, checked against `half` on all 65,536 values.
//! Tolerance against widening `W` to f32 and multiplying: the products are the same sums in
//! f32 (1e-5 relative; only the summation order may differ).

use super::gemm::{MatRef, matmul, nothing_to_multiply};
use super::half_blocked::{blocked, by_columns};
use super::half_stream::stream;
use super::packed::{self, KC};

pub use super::half_format::{Half, HalfRef, STREAM_ROWS, bf16_to_f32, f16_to_f32, widen};
pub(crate) use super::half_format::{wide, widen_one};

/// `dst[m, n] (+)= a[m, k] · w[k, n]`, `dst` row-major with row stride `dst_rs`.
pub fn matmul_half(dst: &mut [f32], dst_rs: usize, a: MatRef, w: HalfRef, accumulate: bool) {
    let (m, k, n) = (a.rows, a.cols, w.cols);
    assert_eq!(w.rows, k, "matmul_half: inner dimensions {k} and {}", w.rows);
    if nothing_to_multiply(dst, dst_rs, [m, k, n], accumulate, "matmul_half") {
        return;
    }
    a.check();
    w.check();
    if m <= STREAM_ROWS && (w.rs == 1 || w.cs == 1) {
        stream(dst, dst_rs, a, w, accumulate);
    } else if let Some(isa) = packed::isa() {
        if w.rs == 1 && w.cs != 1 {
            by_columns(dst, dst_rs, a, w, accumulate, isa);
        } else {
            blocked(dst, dst_rs, a, w, accumulate, isa);
        }
    } else {
        portable(dst, dst_rs, a, w, accumulate);
    }
}

// ---------------------------------------------------------------------------------------
// No micro-kernels: blocks widened row-major, multiplied by gemm
// ---------------------------------------------------------------------------------------

fn portable(dst: &mut [f32], dst_rs: usize, a: MatRef, w: HalfRef, accumulate: bool) {
    let (m, k, n) = (a.rows, a.cols, w.cols);
    let cols_per = packed::GROUP_COLS;
    let mut block = Vec::new();
    for c0 in (0..n).step_by(cols_per) {
        let cols = cols_per.min(n - c0);
        for p0 in (0..k).step_by(KC) {
            let kc = KC.min(k - p0);
            block.clear();
            block.resize(kc * cols, 0.0);
            for r in 0..kc {
                for c in 0..cols {
                    block[r * cols + c] = widen_one(w.kind, w.data[w.at(p0 + r, c0 + c)]);
                }
            }
            let b = MatRef::row_major(&block, kc, cols);
            let part = &mut dst[c0..(m - 1) * dst_rs + c0 + cols];
            matmul(part, dst_rs, a.cols(p0, kc), b, p0 > 0 || accumulate);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::kernels::gemm::tests::{naive, vals};
    use crate::kernels::half_stream::DEEP_COLUMNS;

    /// `v` rounded to `kind`'s bits.
    pub(crate) fn to_bits(kind: Half, v: &[f32]) -> Vec<u16> {
        v.iter()
            .map(|&x| match kind {
                Half::Bf16 => burn::tensor::bf16::from_f32(x).to_bits(),
                Half::F16 => burn::tensor::f16::from_f32(x).to_bits(),
            })
            .collect()
    }

    #[test]
    fn f16_widening_is_exact_for_every_value() {
        for h in 0..=u16::MAX {
            let want = burn::tensor::f16::from_bits(h).to_f32();
            let got = f16_to_f32(h);
            assert!(got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()), "f16 {h:#06x}: {got} vs {want}");
        }
        let src: Vec<u16> = (0..=u16::MAX).collect();
        let mut dst = vec![0.0f32; src.len()];
        widen(Half::Bf16, &src, &mut dst);
        for (&h, d) in src.iter().zip(&dst) {
            // `half` quiets signalling NaNs; the shift keeps their bits (both are NaN).
            let want = burn::tensor::bf16::from_bits(h).to_f32();
            assert!(d.to_bits() == want.to_bits() || (d.is_nan() && want.is_nan()), "bf16 {h:#06x}: {d} vs {want}");
        }
    }

    #[test]
    fn half_products_match_the_widened_f32_product_on_every_path_and_edge() {
        // m ≤ STREAM_ROWS streams, larger m goes through widened panels; partial panels,
        // several depth blocks (1,600: three of AVX2's 768), several passes of rows (130),
        // both layouts of `w`, a strided `a`, both half kinds; columns deep enough to be
        // read DEEP_GROUP at a time, with a partial group and a tail.
        for &(m, k, n) in &[
            (1, 5, 3),
            (1, 700, 300),
            (3, 257, 1100),
            (4, 64, 17),
            (5, 300, 70),
            (13, 600, 130),
            (130, 64, 1100),
            (9, 1600, 40),
            (0, 3, 4),
            (4, 0, 5),
            (2, DEEP_COLUMNS + 8, 21),
        ] {
            let a_data = vals(m * (k + 2) + 1, 1);
            let a = MatRef { data: &a_data, offset: 1, rows: m, cols: k, rs: (k + 2) as isize, cs: 1 };
            for kind in [Half::Bf16, Half::F16] {
                let w_f32: Vec<f32> = vals(k * n, 2);
                // Round to the half type first: the reference then multiplies exactly the
                // values the half weight holds.
                let bits = to_bits(kind, &w_f32);
                let wide: Vec<f32> = bits.iter().map(|&b| widen_one(kind, b)).collect();
                let bits_t: Vec<u16> = (0..n * k).map(|i| bits[(i % k) * n + i / k]).collect();
                let views = [
                    HalfRef { data: &bits, kind, offset: 0, rows: k, cols: n, rs: n as isize, cs: 1 },
                    HalfRef { data: &bits_t, kind, offset: 0, rows: n, cols: k, rs: k as isize, cs: 1 }.t(),
                ];
                let want = naive(&a, &MatRef::row_major(&wide, k, n));
                for w in views {
                    for accumulate in [false, true] {
                        let mut dst = vec![1.0f32; m * n];
                        matmul_half(&mut dst, n, a, w, accumulate);
                        for (i, (&g, &w)) in dst.iter().zip(&want).enumerate() {
                            let w = if accumulate { w + 1.0 } else { w };
                            assert!((g - w).abs() <= 1e-4 * (1.0 + w.abs()), "{kind:?} {m}x{k}x{n} acc={accumulate} [{i}]: {g} vs {w}");
                        }
                    }
                }
            }
        }
    }
}
