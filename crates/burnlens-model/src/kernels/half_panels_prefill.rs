//! Prefill (more than [`STREAM_ROWS`](super::half::STREAM_ROWS) rows) read from a half
//! weight's decoding panels ([`super::half_panels`]) on AVX2 CPUs: a 6 × 16 micro-kernel that
//! widens the weight in registers, so no widened copy is ever written.
//!
//! Why. A CPU without bf16 instructions widens a half weight to f32 before multiplying it.
//! Widening blocks of the stored layout into a buffer cost a bf16 forward a tenth of its time
//! on an AVX2 Zen 3 (BENCHMARKS.md, twenty-first), nearly all of it waiting on loads, and a
//! kernel widening the stored layout in registers read rows 1.5–6 KiB apart that fold onto a
//! few L1 sets (0.90x). The decoding panels are `k × 64` contiguous: a 16-column slice of one
//! depth block is [`KC`] rows 128 bytes apart, read front to back (the prefetchers follow it)
//! by every six rows of `a` in turn.
//!
//! The kernel. bf16: one 32-byte load holds 16 columns; the low half of each 32-bit word
//! shifted up is the even column as f32, the word with its low half cleared the odd one
//! (a shift and an and, neither on the FMA pipes of a Zen 3), so the 12 sums in registers are
//! even and odd columns, interleaved once when the tile is stored. f16: F16C's conversion of
//! two 8-column halves. The sums are f32, in depth order, with fused multiply-adds (within
//! 1e-5 relative of the widened f32 product, as the other half kernels).
//!
//! Loops, outermost first: tasks (ranges of 16-column slices), blocks of rows ([`ROW_BLOCK`]),
//! depth blocks ([`KC`]), the task's slices, six rows at a time.

use super::gemm::{MatRef, nothing_to_multiply};
use super::half::{Half, STREAM_ROWS};
use super::half_blocked::pack_row_panels;
use super::half_panels::{HalfPanels, PANEL, matmul_half_panels};
use super::pool::{self, SendPtr};

/// Rows of `a` per micro-kernel call.
const MR: usize = 6;
/// Columns per micro-kernel call: two AVX2 vectors.
const NR: usize = 16;
/// Depth of one block and rows of `a` per block: a slice's `KC × 16` values (768 panel rows
/// 128 bytes apart) pass six rows of `a` (18 KiB) at a time, and `dst` is read and written
/// once per 768 of depth. Scanned on the AVX2 Zen 3 (BENCHMARKS.md, twenty-second; five
/// alternated rounds, medians): 768 deep read 1.04–1.27x 256 deep at GPT-2's prefill shapes
/// (the tied unembedding's most, 1.27x), level at 3,072 deep; rows per block within the noise.
const KC: usize = 768;
/// See [`KC`].
const ROW_BLOCK: usize = 192;
/// Tasks per thread.
const TASKS_PER_THREAD: usize = 4;

/// Whether this CPU reads prefill from the panels: it runs the micro-kernel ([`runs`]) and has
/// no AVX-512 (whose machines keep the widened blocks: not measured with this kernel).
pub(crate) fn available(kind: Half) -> bool {
    runs(kind) && !super::simd::has_avx512()
}

/// Whether this CPU runs the micro-kernel: AVX2 with FMA (and F16C for f16), and not
/// `BURNLENS_ISA=baseline`.
fn runs(kind: Half) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        super::simd::has_avx2_fma() && (kind == Half::Bf16 || std::arch::is_x86_feature_detected!("f16c"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = kind;
        false
    }
}

/// `dst[m, n] (+)= a[m, k] · w` for a weight's decoding panels: more than [`STREAM_ROWS`]
/// rows through the micro-kernel where [`available`], else [`matmul_half_panels`].
pub fn matmul_from_panels(dst: &mut [f32], dst_rs: usize, a: MatRef, w: &HalfPanels, accumulate: bool) {
    let (m, k, n) = (a.rows, a.cols, w.cols());
    assert_eq!(w.rows(), k, "matmul_from_panels: inner dimensions {k} and {}", w.rows());
    if m <= STREAM_ROWS || !available(w.kind()) {
        return matmul_half_panels(dst, dst_rs, a, w, accumulate);
    }
    if nothing_to_multiply(dst, dst_rs, [m, k, n], accumulate, "matmul_from_panels") {
        return;
    }
    a.check();
    matmul_rows(dst, dst_rs, a, w, accumulate);
}

/// `dst[m, n] (+)= a[m, k] · w` through the micro-kernel; the caller checked the operands
/// (and [`available`], or [`runs`] in a test).
pub(super) fn matmul_rows(dst: &mut [f32], dst_rs: usize, a: MatRef, w: &HalfPanels, accumulate: bool) {
    assert!(runs(w.kind()), "matmul_rows: this CPU has no AVX2 micro-kernel for {:?} panels", w.kind());
    let (m, k, n) = (a.rows, a.cols, w.cols());
    let lhs = pack_row_panels(a, MR);
    let slices = n.div_ceil(NR);
    let threads = pool::threads();
    let parallel = threads > 1 && m * k * n >= super::packed::SPLIT_MIN_MACS;
    let per_task = if parallel { slices.div_ceil(threads * TASKS_PER_THREAD) } else { slices };
    let ptr = SendPtr(dst.as_mut_ptr());
    let task = |t: usize| {
        let dst = ptr;
        let mine = t * per_task..((t + 1) * per_task).min(slices);
        for r0 in (0..m).step_by(ROW_BLOCK) {
            let strips = r0 / MR..(r0 + ROW_BLOCK).min(m).div_ceil(MR);
            for p0 in (0..k).step_by(KC) {
                let kc = KC.min(k - p0);
                for s in mine.clone() {
                    let (c0, panel) = (s * NR, s * NR / PANEL);
                    let cols = NR.min(n - c0);
                    // SAFETY: panel `panel` holds `k × PANEL` values, this slice's 16 columns
                    // at `c0 % PANEL` (zero-padded past `n`).
                    let wp = unsafe { w.data().as_ptr().add(panel * k * PANEL + p0 * PANEL + c0 % PANEL) };
                    for strip in strips.clone() {
                        let rows = MR.min(m - strip * MR);
                        let tile = Tile { kc, cols, rows, accumulate: accumulate || p0 > 0, out_rs: dst_rs };
                        // SAFETY: `lhs` holds `k × MR` values per strip (zero-padded); tasks
                        // write disjoint columns of `dst`, whose `rows × cols` block at
                        // (strip · MR, c0) is inside it (checked by the caller).
                        unsafe {
                            let x = lhs.as_ptr().add(strip * k * MR + p0 * MR);
                            let out = dst.0.add(strip * MR * dst_rs + c0);
                            multiply(w.kind(), &tile, x, wp, out);
                        }
                    }
                }
            }
        }
    };
    let tasks = slices.div_ceil(per_task);
    if parallel && tasks > 1 {
        pool::run(tasks, task);
    } else {
        (0..tasks).for_each(task);
    }
}

/// One micro-kernel call's extent: `kc` deep, `rows × cols` of the output (at most 6 × 16)
/// written (or added to, `accumulate`) with row stride `out_rs`.
struct Tile {
    kc: usize,
    cols: usize,
    rows: usize,
    accumulate: bool,
    out_rs: usize,
}

/// # Safety
/// `x` holds `kc × 6` floats (a row's values 6 apart), `w` `kc` rows of 16 halves `PANEL`
/// apart, `out` the tile's `rows × cols` block; [`runs`] holds.
unsafe fn multiply(kind: Half, tile: &Tile, x: *const f32, w: *const u16, out: *mut f32) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: as the caller promised; `runs` checked the instructions.
    unsafe {
        match kind {
            Half::Bf16 => bf16_tile(tile, x, w, out),
            Half::F16 => f16_tile(tile, x, w, out),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (kind, tile, x, w, out);
        unreachable!("half_panels_prefill: no micro-kernel on this architecture");
    }
}

/// # Safety
/// As [`multiply`]; the CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn bf16_tile(tile: &Tile, x: *const f32, w: *const u16, out: *mut f32) {
    use std::arch::x86_64::*;
    let high = _mm256_set1_epi32(0xFFFF_0000u32 as i32);
    let mut even = [_mm256_setzero_ps(); MR];
    let mut odd = [_mm256_setzero_ps(); MR];
    for i in 0..tile.kc {
        // SAFETY: row `i` of the slice and of `x` are inside them (the caller's promise).
        let (v, xi) = unsafe { (_mm256_loadu_si256(w.add(i * PANEL).cast::<__m256i>()), x.add(i * MR)) };
        let we = _mm256_castsi256_ps(_mm256_slli_epi32::<16>(v));
        let wo = _mm256_castsi256_ps(_mm256_and_si256(v, high));
        for r in 0..MR {
            // SAFETY: as above.
            let b = _mm256_set1_ps(unsafe { *xi.add(r) });
            even[r] = _mm256_fmadd_ps(b, we, even[r]);
            odd[r] = _mm256_fmadd_ps(b, wo, odd[r]);
        }
    }
    let mut sums = [[_mm256_setzero_ps(); 2]; MR];
    for r in 0..MR {
        // Columns (0 2 4 6 | 8 10 12 14) and (1 3 5 7 | 9 11 13 15) back into order.
        let lo = _mm256_unpacklo_ps(even[r], odd[r]);
        let hi = _mm256_unpackhi_ps(even[r], odd[r]);
        sums[r] = [_mm256_permute2f128_ps::<0x20>(lo, hi), _mm256_permute2f128_ps::<0x31>(lo, hi)];
    }
    // SAFETY: the caller's promise on `out`.
    unsafe { store(tile, &sums, out) };
}

/// # Safety
/// As [`multiply`]; the CPU has AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16_tile(tile: &Tile, x: *const f32, w: *const u16, out: *mut f32) {
    use std::arch::x86_64::*;
    let mut sums = [[_mm256_setzero_ps(); 2]; MR];
    for i in 0..tile.kc {
        // SAFETY: row `i` of the slice and of `x` are inside them (the caller's promise).
        let (row, xi) = unsafe { (w.add(i * PANEL), x.add(i * MR)) };
        let (w0, w1) = unsafe { (_mm256_cvtph_ps(_mm_loadu_si128(row.cast::<__m128i>())), _mm256_cvtph_ps(_mm_loadu_si128(row.add(8).cast::<__m128i>()))) };
        for (r, s) in sums.iter_mut().enumerate() {
            // SAFETY: as above.
            let b = _mm256_set1_ps(unsafe { *xi.add(r) });
            s[0] = _mm256_fmadd_ps(b, w0, s[0]);
            s[1] = _mm256_fmadd_ps(b, w1, s[1]);
        }
    }
    // SAFETY: the caller's promise on `out`.
    unsafe { store(tile, &sums, out) };
}

/// The tile's sums written to (or added into) `out`'s `rows × cols` block.
///
/// # Safety
/// As [`multiply`]; the CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn store(tile: &Tile, sums: &[[std::arch::x86_64::__m256; 2]; MR], out: *mut f32) {
    use std::arch::x86_64::*;
    for (r, s) in sums.iter().enumerate().take(tile.rows) {
        // SAFETY: row `r` of the block is inside `out` (the caller's promise); a partial
        // row goes through a buffer.
        unsafe {
            let d = out.add(r * tile.out_rs);
            if tile.cols == NR {
                let (mut a, mut b) = (s[0], s[1]);
                if tile.accumulate {
                    a = _mm256_add_ps(a, _mm256_loadu_ps(d));
                    b = _mm256_add_ps(b, _mm256_loadu_ps(d.add(8)));
                }
                _mm256_storeu_ps(d, a);
                _mm256_storeu_ps(d.add(8), b);
            } else {
                let mut buf = [0.0f32; NR];
                _mm256_storeu_ps(buf.as_mut_ptr(), s[0]);
                _mm256_storeu_ps(buf.as_mut_ptr().add(8), s[1]);
                let d = std::slice::from_raw_parts_mut(d, tile.cols);
                if tile.accumulate {
                    d.iter_mut().zip(buf).for_each(|(d, v)| *d += v);
                } else {
                    d.copy_from_slice(&buf[..tile.cols]);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::half::matmul_half;
    use crate::kernels::half_panels::tests::Operands;

    #[test]
    fn prefill_from_panels_matches_the_widened_product_on_every_edge() {
        for kind in [Half::Bf16, Half::F16] {
            if !runs(kind) {
                // Only `BURNLENS_ISA=baseline` (or another architecture) turns the kernel off.
                assert!(super::super::simd::baseline() || !cfg!(target_arch = "x86_64"), "{kind:?}: no AVX2 micro-kernel on this x86 CPU");
                continue;
            }
            // One row and one column; a whole tile; partial strips and slices past several
            // depth blocks; rows across two row blocks; a panel's columns exactly.
            for &(m, k, n) in &[(1, 1, 1), (6, 256, 16), (7, 600, 129), (13, 1600, 300), (130, 768, 70), (200, 300, 64)] {
                let ops = Operands::new(kind, [m, k, n]);
                let a = ops.a();
                for w in ops.views() {
                    let panels = HalfPanels::new(w);
                    for accumulate in [false, true] {
                        // `dst` wider than the product: columns past `n` stay untouched.
                        let rs = n + 5;
                        let mut want = vec![0.5f32; m * rs];
                        matmul_half(&mut want, rs, a, w, accumulate);
                        let mut got = vec![0.5f32; m * rs];
                        matmul_rows(&mut got, rs, a, &panels, accumulate);
                        let scale = want.iter().fold(1.0f32, |s, v| s.max(v.abs()));
                        for (i, (&g, &e)) in got.iter().zip(&want).enumerate() {
                            assert!((g - e).abs() <= 1e-5 * scale, "{kind:?} {m}x{k}x{n} rs={} acc={accumulate} [{i}]: {g} vs {e}", w.rs);
                            if i % rs >= n {
                                assert_eq!(g, 0.5, "{kind:?} {m}x{k}x{n}: column {} past the product written", i % rs);
                            }
                        }
                    }
                }
            }
        }
    }
}
