//! Half weights widened once for prefill on Intel's AVX-512 cores: a bf16/f16 weight widened
//! to f32 into gemm-f32's panels ([`Packed`]) at its first product with more than
//! [`STREAM_ROWS`](super::half::STREAM_ROWS) rows, and kept beside it ([`super::kept`]), so that prefill with half
//! weights runs the packed product of f32 weights.
//!
//! Why. Elsewhere prefill widens a half weight block by block in every product
//! ([`super::half`]): on the model-207 Xeon with AMX hidden (BENCHMARKS.md, thirty-fourth), a
//! GPT-2 small forward over 128 tokens with bf16 weights ran at 0.95x the same forward with
//! f32 weights (five alternated pairs), and so did `--compute bf16`, which is f32 arithmetic
//! on that CPU ([`super::bf16_path`]). With the widened copy the two forwards run the same
//! products. AVX2 CPUs read prefill from the decoding panels instead
//! ([`super::half_panels_prefill`]); AMD's AVX-512 cores were not measured with this copy
//! and keep widening per product.
//!
//! Memory. The copy costs twice the weight's bytes (GPT-2 small: 494 MB beside 247 MB of bf16
//! weights, peak RSS of a forward 486 → 968 MB; with f32 weights the packed copies cost the
//! same). Widened copies share `BURNLENS_PACKED_MB` with the other kept copies, hold at most
//! half of it, and give way to any other copy that does not fit ([`super::kept`]): a model
//! larger than the budget widens the weights its prefill uses first until decoding's panels
//! need the room. `BURNLENS_PACKED_MB=0` turns every copy off.
//!
//! Widening is exact, so products read from the copy equal the f32 weight's packed products
//! bit for bit.

use std::sync::Arc;

use burn::backend::flex::FlexTensor;

use super::half::{HalfRef, widen_one};
use super::half_format::{Rows, Runs, widen_runs, widen_to_panels};
use super::kept::{Layout, View, kept};
use super::packed::{Packed, isa};

/// Whether prefill with a half weight reads a widened copy on this CPU: an Intel CPU with
/// AVX-512 (and gemm-f32's micro-kernels for it).
pub fn applies() -> bool {
    isa().is_some() && super::simd::has_avx512() && super::simd::intel()
}

/// The weight `w` widened to f32 and packed (see [`Packed::filled`]).
pub(crate) fn widen(w: HalfRef) -> Option<Packed> {
    if w.rows > 0 && w.cols > 0 {
        w.check();
    }
    let k = w.rows;
    Packed::filled(k, w.cols, |c0, cols, panel| {
        let p = panel.len() / k;
        if w.cs == 1 && w.rs > 0 {
            widen_to_panels(w.kind, w.data, Rows { start: w.at(0, c0), rs: w.rs as usize, rows: k, cols }, panel, p);
        } else if w.rs == 1 {
            // Columns contiguous (an `nn.Linear` weight read through its transposed view):
            // each widened as one run, then written down the panel.
            let mut column = vec![0.0f32; k];
            for c in 0..cols {
                widen_runs(w.kind, w.data, Runs { start: w.at(0, c0 + c), stride: 0, count: 1, len: k }, &mut column, 0);
                for (r, &v) in column.iter().enumerate() {
                    panel[r * p + c] = v;
                }
            }
        } else {
            for r in 0..k {
                for c in 0..cols {
                    panel[r * p + c] = widen_one(w.kind, w.data[w.at(r, c0 + c)]);
                }
            }
        }
    })
}

/// The widened copy of `owner`'s half weight `w`, made now if it is not kept yet; `None`
/// where this CPU packs nothing or the copy does not fit the copies' budget (the caller asks
/// only where [`applies`]).
pub(crate) fn widened_weight(owner: &FlexTensor, w: HalfRef) -> Option<Arc<Packed>> {
    let p = isa()?.panel();
    let key = View { offset: w.offset, dims: [w.rows, w.cols], strides: [w.rs, w.cs] };
    kept(owner, key, Layout::Widened, w.cols.div_ceil(p) * w.rows * p * 4, || {
        WIDENED_HERE.with(|c| c.set(c.get() + 1));
        widen(w)
    })
}

thread_local! {
    static WIDENED_HERE: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Widened copies this thread has made so far (a product finding its weight's copy makes none).
pub fn widened_on_this_thread() -> usize {
    WIDENED_HERE.with(|c| c.get())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::gemm::MatRef;
    use crate::kernels::gemm::tests::vals;
    use crate::kernels::half::Half;
    use crate::kernels::half::tests::to_bits;
    use crate::kernels::packed::matmul_packed;

    /// A widened copy multiplies exactly as the f32 weight packed, for every layout a weight
    /// is read in (rows contiguous, columns contiguous, neither), both half formats, partial
    /// panels and several depth blocks.
    #[test]
    fn a_widened_half_weight_multiplies_as_the_packed_f32_weight() {
        if isa().is_none() {
            return;
        }
        for kind in [Half::Bf16, Half::F16] {
            for &(m, k, n) in &[(7, 5, 3), (13, 70, 130), (9, 1600, 150)] {
                let bits = to_bits(kind, &vals(k * n, 2));
                let wide: Vec<f32> = bits.iter().map(|&b| widen_one(kind, b)).collect();
                // The same matrix row-major, through a transposed `[n, k]` view, and with a
                // row stride wider than its width and a column stride of 2.
                let bits_t: Vec<u16> = (0..n * k).map(|i| bits[(i % k) * n + i / k]).collect();
                let bits_sparse: Vec<u16> = (0..k * 2 * n).map(|i| if i % 2 == 0 { bits[i / 2] } else { 0 }).collect();
                let views = [
                    HalfRef { data: &bits, kind, offset: 0, rows: k, cols: n, rs: n as isize, cs: 1 },
                    HalfRef { data: &bits_t, kind, offset: 0, rows: n, cols: k, rs: k as isize, cs: 1 }.t(),
                    HalfRef { data: &bits_sparse, kind, offset: 0, rows: k, cols: n, rs: 2 * n as isize, cs: 2 },
                ];
                let a_data = vals(m * k, 1);
                let a = MatRef::row_major(&a_data, m, k);
                let want_packed = Packed::new(MatRef::row_major(&wide, k, n)).unwrap();
                let mut want = vec![0.0f32; m * n];
                matmul_packed(&mut want, n, a, &want_packed, false);
                for (i, w) in views.into_iter().enumerate() {
                    let mut got = vec![1.0f32; m * n];
                    matmul_packed(&mut got, n, a, &widen(w).unwrap(), false);
                    assert!(got == want, "{kind:?} {m}x{k}x{n} view {i}: the widened copy's product differs from the f32 weight's");
                }
            }
        }
    }
}
