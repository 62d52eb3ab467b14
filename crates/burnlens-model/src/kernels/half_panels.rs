//! Half-precision weights laid out for decoding: `x W` for a few rows of `x` (decoding's one
//! position per sequence) with a bf16/f16 `W` copied once into panels of [`PANEL`] columns,
//! each panel `k × PANEL` contiguous, and the copy kept beside the weight ([`super::kept`]).
//!
//! Why a copy. A decoding step reads every weight once and is bound by memory; what decides
//! its speed is how the weight's bytes are read. In the checkpoint's own layouts the reads
//! are either rows of `W` added into the outputs ([`super::half`]'s `rows_axpy`, GPT-2's
//! `Conv1D`: a load and a store of the outputs per vector of weights) or one dot product per
//! column (`columns_dot`, every `nn.Linear`: a reduction per column). On the Zen 4 machine
//! both read 28–33 GB/s from memory where gemm-f32's micro-kernels stream f32 panels at
//! 42–45: the f32 model decoded faster per byte than the bf16 one. A panel is read front to
//! back with its `PANEL` sums in registers (four AVX-512 registers per row of `x`), one
//! stream per task and nothing stored until the panel ends: in BENCHMARKS.md ("2026-11-26
//! (later): decoding panels for half weights") bf16 panels read at the f32 panels' rate,
//! 1.1–1.9x the stored layouts at GPT-2's and Llama 8B's shapes.
//!
//! The copy costs the weight's bytes again (GPT-2 small: 247 MB beside 247 MB of bf16
//! weights); all kept copies share `BURNLENS_PACKED_MB` (default 1024), so a model larger
//! than that gets panels for the weights first used until the budget is spent and reads the
//! rest in place (an 8B model: 1 GB more than its 16 GB), and `BURNLENS_PACKED_MB=0` keeps
//! every weight as stored. Prefill (more than [`super::half::STREAM_ROWS`] rows) makes and reads
//! them only on AVX2 CPUs ([`super::half_panels_prefill`], where widening the stored layout
//! cost the most); elsewhere it reads the weight as stored.
//!
//! Widening is exact (bf16: a shift; f16: [`super::half::f16_to_f32`]) and the sums are f32
//! in depth order: within 1e-5 relative of the widened f32 product.

use std::sync::Arc;

use burn::backend::flex::FlexTensor;

use super::gemm::{MatRef, nothing_to_multiply};
use super::half::{Half, HalfRef, wide};
use super::kept::{Layout, View, kept};
use super::pages::PageBuf;
use super::pool::{self, GRAIN, SendPtr};
use super::prefetch::{self, Ahead};
use super::simd::dispatch;

/// Columns per panel: four AVX-512 vectors (eight AVX2) of sums per row of `x`.
pub const PANEL: usize = 64;
/// Rows of `x` summed together against one panel (their sums all in registers).
const ROWS: usize = 4;
/// Tasks per thread: enough to balance a helper that starts late.
const TASKS_PER_THREAD: usize = 4;

/// A `[k, n]` half-precision matrix in panels of [`PANEL`] columns, each `k × PANEL`
/// contiguous and zero-padded.
pub struct HalfPanels {
    k: usize,
    n: usize,
    kind: Half,
    data: PageBuf<u16>,
}

impl std::fmt::Debug for HalfPanels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HalfPanels").field("k", &self.k).field("n", &self.n).field("kind", &self.kind).finish()
    }
}

impl HalfPanels {
    /// Copy `w` (any strides) into panels.
    pub fn new(w: HalfRef) -> Self {
        let (k, n) = (w.rows, w.cols);
        let panels = n.div_ceil(PANEL);
        let mut data = PageBuf::<u16>::zeroed(Self::len(k, n));
        if k > 0 && n > 0 {
            w.check();
            let ptr = SendPtr(data.as_mut_ptr());
            pool::run(panels, |j| {
                let dst = ptr;
                // SAFETY: task `j` writes panel `j` alone, inside `data`.
                let panel = unsafe { std::slice::from_raw_parts_mut(dst.0.add(j * k * PANEL), k * PANEL) };
                fill_panel(panel, w, j * PANEL);
            });
        }
        Self { k, n, kind: w.kind, data }
    }

    fn len(k: usize, n: usize) -> usize {
        n.div_ceil(PANEL) * k * PANEL
    }

    /// Bytes a copy of a `[k, n]` matrix takes.
    pub fn bytes_for(k: usize, n: usize) -> usize {
        Self::len(k, n) * 2
    }

    pub fn rows(&self) -> usize {
        self.k
    }

    pub fn cols(&self) -> usize {
        self.n
    }

    pub fn kind(&self) -> Half {
        self.kind
    }

    /// The panels, one after another.
    pub(super) fn data(&self) -> &[u16] {
        &self.data
    }
}

/// Panel starting at column `c0`: row `i` of the panel is `w[i, c0..c0 + PANEL]`.
fn fill_panel(panel: &mut [u16], w: HalfRef, c0: usize) {
    let cols = PANEL.min(w.cols - c0);
    if w.cs == 1 {
        for (i, dst) in panel.chunks_exact_mut(PANEL).enumerate() {
            let s = w.at(i, c0);
            dst[..cols].copy_from_slice(&w.data[s..s + cols]);
        }
    } else {
        // Column by column: each a contiguous run where `rs == 1` (an `nn.Linear` weight).
        for c in 0..cols {
            for (i, dst) in panel.chunks_exact_mut(PANEL).enumerate() {
                dst[c] = w.data[w.at(i, c0 + c)];
            }
        }
    }
}

/// `dst[m, n] (+)= a[m, k] · w`, `dst` row-major with row stride `dst_rs`. Meant for few
/// rows (at most [`super::half::STREAM_ROWS`]); correct for any number. Products call
/// [`super::half_panels_prefill::matmul_from_panels`], which sends more rows to its
/// micro-kernel where the CPU has it.
pub fn matmul_half_panels(dst: &mut [f32], dst_rs: usize, a: MatRef, w: &HalfPanels, accumulate: bool) {
    let (m, k, n) = (a.rows, a.cols, w.n);
    assert_eq!(w.k, k, "matmul_half_panels: inner dimensions {k} and {}", w.k);
    if nothing_to_multiply(dst, dst_rs, [m, k, n], accumulate, "matmul_half_panels") {
        return;
    }
    a.check();
    // The rows of `a`, contiguous.
    let x: Vec<f32> = (0..m).flat_map(|r| a.row_values(r)).collect();
    let panels = n.div_ceil(PANEL);
    let parallel = pool::threads() > 1 && m * k * n >= GRAIN * 16;
    let tasks_wanted = if parallel { pool::threads() * TASKS_PER_THREAD } else { 1 };
    let per_task = panels.div_ceil(tasks_wanted);
    let ptr = SendPtr(dst.as_mut_ptr());
    let ahead = Ahead::panels();
    let task = |t: usize| {
        let dst = ptr;
        for j in t * per_task..((t + 1) * per_task).min(panels) {
            let (c0, panel) = (j * PANEL, &w.data[j * k * PANEL..(j + 1) * k * PANEL]);
            let cols = PANEL.min(n - c0);
            for r0 in (0..m).step_by(ROWS) {
                let rows = ROWS.min(m - r0);
                let mut sums = [[0.0f32; PANEL]; ROWS];
                panel_product(w.kind, &x[r0 * k..(r0 + rows) * k], panel, &mut sums[..rows], ahead);
                for (r, s) in sums[..rows].iter().enumerate() {
                    // SAFETY: tasks write disjoint panel columns of `dst`, inside it (checked
                    // by `nothing_to_multiply`).
                    let d = unsafe { std::slice::from_raw_parts_mut(dst.0.add((r0 + r) * dst_rs + c0), cols) };
                    if accumulate {
                        d.iter_mut().zip(s).for_each(|(d, s)| *d += s);
                    } else {
                        d.copy_from_slice(&s[..cols]);
                    }
                }
            }
        }
    };
    let tasks = panels.div_ceil(per_task);
    if parallel && tasks > 1 {
        pool::run(tasks, task);
    } else {
        (0..tasks).for_each(task);
    }
}

/// `sums[r] = x_r · panel` for the `sums.len()` rows of `x` (each `k` long).
fn panel_product(kind: Half, x: &[f32], panel: &[u16], sums: &mut [[f32; PANEL]], ahead: Ahead) {
    macro_rules! rows {
        ($bf16:literal) => {
            match sums.len() {
                1 => dispatch!(|x: &[f32], panel: &[u16], sums: &mut [[f32; PANEL]], ahead: Ahead| -> () { panel_body::<$bf16, 1>(x, panel, sums, ahead) }),
                2 => dispatch!(|x: &[f32], panel: &[u16], sums: &mut [[f32; PANEL]], ahead: Ahead| -> () { panel_body::<$bf16, 2>(x, panel, sums, ahead) }),
                3 => dispatch!(|x: &[f32], panel: &[u16], sums: &mut [[f32; PANEL]], ahead: Ahead| -> () { panel_body::<$bf16, 3>(x, panel, sums, ahead) }),
                _ => dispatch!(|x: &[f32], panel: &[u16], sums: &mut [[f32; PANEL]], ahead: Ahead| -> () { panel_body::<$bf16, 4>(x, panel, sums, ahead) }),
            }
        };
    }
    // An AVX-512 kernel by the number of rows.
    #[cfg(target_arch = "x86_64")]
    macro_rules! avx512_rows {
        ($kernel:ident) => {
            match sums.len() {
                1 => unsafe { $kernel::<1>(x, panel, sums, ahead) },
                2 => unsafe { $kernel::<2>(x, panel, sums, ahead) },
                3 => unsafe { $kernel::<3>(x, panel, sums, ahead) },
                _ => unsafe { $kernel::<4>(x, panel, sums, ahead) },
            }
        };
    }
    match kind {
        // SAFETY: the CPU has AVX-512F and AVX512BW (checked by `has_avx512`); AVX-512F
        // converts f16 in hardware.
        #[cfg(target_arch = "x86_64")]
        Half::Bf16 if super::simd::has_avx512() => avx512_rows!(bf16_panel_avx512),
        Half::Bf16 => rows!(true),
        #[cfg(target_arch = "x86_64")]
        Half::F16 if super::simd::has_avx512() => avx512_rows!(f16_panel_avx512),
        Half::F16 => rows!(false),
    }
}

/// [`panel_body`] for bf16 with AVX-512, in fewer instructions a row of the panel: a row's
/// 64 values are two loads, each widened by interleaving its 16-bit words with zeros (one
/// instruction for 16 values, where the portable loop zero-extends and shifts), and added
/// by fused multiply-adds. The interleave takes each 128-bit lane's low four words into one
/// register and its high four into another, so the accumulators hold the columns in that
/// order and the sums are put back in column order once, at the panel's end.
///
/// # Safety
/// The CPU must have AVX-512F and AVX512BW.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn bf16_panel_avx512<const M: usize>(x: &[f32], panel: &[u16], sums: &mut [[f32; PANEL]], ahead: Ahead) {
    use std::arch::x86_64::*;
    let k = x.len() / M;
    assert!(x.len() == M * k && panel.len() >= k * PANEL && sums.len() >= M, "bf16_panel_avx512: operand sizes");
    let zero = _mm512_setzero_si512();
    let mut acc = [[_mm512_setzero_ps(); 4]; M];
    for (i, w) in panel[..k * PANEL].chunks_exact(PANEL).enumerate() {
        prefetch_ahead(w, ahead);
        // SAFETY: `w` holds PANEL (64) values: two 64-byte unaligned loads.
        let (a, b) = unsafe { (_mm512_loadu_si512(w.as_ptr().cast()), _mm512_loadu_si512(w.as_ptr().add(32).cast())) };
        let wf = [
            _mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, a)),
            _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, a)),
            _mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, b)),
            _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, b)),
        ];
        for (r, acc) in acc.iter_mut().enumerate() {
            let xv = _mm512_set1_ps(x[r * k + i]);
            for (a, &w) in acc.iter_mut().zip(&wf) {
                *a = _mm512_fmadd_ps(xv, w, *a);
            }
        }
    }
    for (acc, sums) in acc.iter().zip(sums.iter_mut()) {
        let mut lanes = [[0.0f32; 16]; 4];
        for (l, a) in lanes.iter_mut().zip(acc) {
            // SAFETY: `l` holds 16 values.
            unsafe { _mm512_storeu_ps(l.as_mut_ptr(), *a) };
        }
        for (v, l) in lanes.iter().enumerate() {
            // Register `v` holds, for each 128-bit lane `j` of its load (32 columns from
            // `32 * (v / 2)`), the lane's low (even `v`) or high (odd `v`) four columns.
            let (base, high) = (32 * (v / 2), 4 * (v % 2));
            for (j, four) in l.chunks_exact(4).enumerate() {
                sums[base + 8 * j + high..][..4].copy_from_slice(four);
            }
        }
    }
}

/// [`panel_body`] for f16 with AVX-512's conversion instruction (`vcvtph2ps`): the portable
/// bit conversion vectorises but costs more than the memory it reads (1×768×3072 from
/// memory: 26 GB/s either way, where bf16's shift reads 33–49). The same sums in the same
/// order (a multiply, then an add).
///
/// # Safety
/// The CPU must have AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn f16_panel_avx512<const M: usize>(x: &[f32], panel: &[u16], sums: &mut [[f32; PANEL]], ahead: Ahead) {
    use std::arch::x86_64::*;
    const V: usize = PANEL / 16;
    let k = x.len() / M;
    assert!(x.len() == M * k && panel.len() >= k * PANEL && sums.len() >= M, "f16_panel_avx512: operand sizes");
    let mut acc = [[_mm512_setzero_ps(); V]; M];
    let mut w = [_mm512_setzero_ps(); V];
    for i in 0..k {
        prefetch_ahead(&panel[i * PANEL..], ahead);
        let row = panel[i * PANEL..].as_ptr();
        for (v, w) in w.iter_mut().enumerate() {
            // SAFETY: `row` holds PANEL values (checked above); unaligned loads.
            *w = _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(row.add(16 * v).cast::<__m256i>()) });
        }
        for (r, acc) in acc.iter_mut().enumerate() {
            let xv = _mm512_set1_ps(x[r * k + i]);
            for (a, &w) in acc.iter_mut().zip(&w) {
                *a = _mm512_add_ps(*a, _mm512_mul_ps(xv, w));
            }
        }
    }
    for (acc, sums) in acc.iter().zip(sums.iter_mut()) {
        for (v, a) in acc.iter().enumerate() {
            // SAFETY: `sums` rows hold PANEL values.
            unsafe { _mm512_storeu_ps(sums.as_mut_ptr().add(16 * v), *a) };
        }
    }
}

/// Ask, as `ahead` says, for the panel rows ahead of row `w` (its two cache lines; past the
/// panel's end the next panel's).
#[inline(always)]
fn prefetch_ahead(w: &[u16], ahead: Ahead) {
    prefetch::ask(w.as_ptr(), 2, ahead);
}

/// The panel read once, front to back: each row of the panel widened and added, times the
/// depth's value of each row of `x`, into `M × PANEL` sums held in registers.
#[inline(always)]
fn panel_body<const BF16: bool, const M: usize>(x: &[f32], panel: &[u16], sums: &mut [[f32; PANEL]], ahead: Ahead) {
    let k = x.len() / M;
    let xs: [&[f32]; M] = std::array::from_fn(|r| &x[r * k..(r + 1) * k]);
    let mut acc = [[0.0f32; PANEL]; M];
    for (i, w) in panel[..k * PANEL].chunks_exact(PANEL).enumerate() {
        prefetch_ahead(w, ahead);
        let mut wf = [0.0f32; PANEL];
        for l in 0..PANEL {
            wf[l] = wide::<BF16>(w[l]);
        }
        for r in 0..M {
            let v = xs[r][i];
            for l in 0..PANEL {
                acc[r][l] += v * wf[l];
            }
        }
    }
    sums[..M].copy_from_slice(&acc);
}

/// The panels kept for the half weight `view` of `owner` ([`super::kept`]), made now if
/// they are not kept yet; `None` where copies are off or would not fit the budget.
pub fn half_panels(owner: &FlexTensor, view: HalfRef) -> Option<Arc<HalfPanels>> {
    let key = View { offset: view.offset, dims: [view.rows, view.cols], strides: [view.rs, view.cs] };
    kept(owner, key, Layout::HalfPanels, HalfPanels::bytes_for(view.rows, view.cols), || {
        MADE_HERE.with(|c| c.set(c.get() + 1));
        Some(HalfPanels::new(view))
    })
}

thread_local! {
    static MADE_HERE: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Panel copies this thread has made so far (a product finding its weight's copy makes none).
pub fn panels_made_on_this_thread() -> usize {
    MADE_HERE.with(|c| c.get())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::kernels::gemm::tests::vals;
    use crate::kernels::half::tests::to_bits as bits;

    /// A product's operands for the panel tests: `a` (`m × k`) at an offset with rows wider
    /// than its width, and a half `k × n` weight stored both ways.
    pub(crate) struct Operands {
        kind: Half,
        mkn: [usize; 3],
        a: Vec<f32>,
        w: Vec<u16>,
        wt: Vec<u16>,
    }

    impl Operands {
        pub(crate) fn new(kind: Half, [m, k, n]: [usize; 3]) -> Self {
            let w = bits(kind, &vals(k * n, 2));
            let wt = (0..n * k).map(|i| w[(i % k) * n + i / k]).collect();
            Operands { kind, mkn: [m, k, n], a: vals(m * (k + 3) + 1, 1), w, wt }
        }

        pub(crate) fn a(&self) -> MatRef<'_> {
            let [m, k, _] = self.mkn;
            MatRef { data: &self.a, offset: 1, rows: m, cols: k, rs: (k + 3) as isize, cs: 1 }
        }

        /// The weight with its rows contiguous, and as the transposed view of `[n, k]`.
        pub(crate) fn views(&self) -> [HalfRef<'_>; 2] {
            let ([_, k, n], kind) = (self.mkn, self.kind);
            [
                HalfRef { data: &self.w, kind, offset: 0, rows: k, cols: n, rs: n as isize, cs: 1 },
                HalfRef { data: &self.wt, kind, offset: 0, rows: n, cols: k, rs: k as isize, cs: 1 }.t(),
            ]
        }
    }

    #[test]
    fn panel_products_match_the_half_product_on_every_layout_and_edge() {
        for kind in [Half::Bf16, Half::F16] {
            // One partial panel, several panels, a partial last panel, depth 1, rows 1..=5
            // (a second group of rows), big enough to split over threads.
            for &(m, k, n) in &[(1, 5, 3), (1, 768, 300), (3, 1, 70), (4, 600, 130), (5, 64, 129), (2, 768, 2304), (0, 4, 5), (2, 0, 7)] {
                let ops = Operands::new(kind, [m, k, n]);
                let a = ops.a();
                for w in ops.views() {
                    let panels = HalfPanels::new(w);
                    assert_eq!((panels.rows(), panels.cols()), (k, n));
                    for accumulate in [false, true] {
                        let mut want = vec![0.5f32; m * n];
                        super::super::half::matmul_half(&mut want, n, a, w, accumulate);
                        let mut got = vec![0.5f32; m * n];
                        matmul_half_panels(&mut got, n, a, &panels, accumulate);
                        // Relative to the largest value: the sums cancel, and only their
                        // order differs.
                        let scale = want.iter().fold(1.0f32, |s, v| s.max(v.abs()));
                        for (i, (&g, &e)) in got.iter().zip(&want).enumerate() {
                            assert!((g - e).abs() <= 1e-5 * scale, "{kind:?} {m}x{k}x{n} rs={} acc={accumulate} [{i}]: {g} vs {e}", w.rs);
                        }
                    }
                }
            }
        }
    }
}
