//! Weights packed once: `x W` with `W` laid out, the first time it is used, in the panel
//! order gemm's micro-kernels read, and the packed copy kept beside the weight.
//!
//! `gemm::gemm` repacks both operands on every call; for the skinny products of a forward
//! pass (`m` = positions, often 128 or fewer) packing the weight is a large share of the
//! work (16–17% of a GPT-2 small forward in `perf`, BENCHMARKS.md). Here a weight `W: [k, n]`
//! (any strides) is packed into panels of `P` columns (`P` = 64 with AVX-512, 16 with AVX2),
//! each panel `k × P` contiguous and zero-padded, and the product drives gemm-f32's own
//! micro-kernels directly: they compute a `P × 6` block of `(x W)ᵀ` from one panel and six
//! rows of `x`, read in place (no packing of `x` at all). On AVX2 (panels of 16) a whole
//! block of six contiguous rows goes to burnlens's own tile instead ([`super::avx2_tile`]; a
//! panel is its `b`): on a Zen 3 (BENCHMARKS.md, fortieth), against gemm-f32's kernel in one
//! process, the GEMM table's products 1.00–1.19x (medians of 31 alternated pairs; minima
//! 0.99–1.12x) and attention's forward 1.06–1.17x. Loops, outermost first: the tasks
//! (blocks of rows or groups of panels, see [`matmul_packed`]), column groups (so that their
//! panels stay in L2), depth blocks, six rows at a time, the group's panels; the groups'
//! width and the blocks' depth are the ISA's ([`Isa`]).
//!
//! The packed copy is kept beside the weight by [`super::kept`] (keyed by the weight's
//! storage, so that any change to the weight packs it again; all copies together under
//! `BURNLENS_PACKED_MB`); a weight that does not fit runs through `gemm::gemm` as before.

use std::cell::Cell;
use std::sync::{Arc, OnceLock};

use burn::backend::flex::FlexTensor;
use gemm_common::microkernel::MicroKernelFn;

use super::gemm::{MatRef, nothing_to_multiply};
use super::kept::{Layout, View, kept};
use super::panel_fill::fill_panel;
use super::pool::{self, SendPtr};

/// Depth of one block of the product with AVX-512 (and of the half-weight kernels' widened
/// blocks): a panel's `KC × P` slice stays in L1/L2 while six rows of `x` stream past it.
pub(crate) const KC: usize = 256;
/// Output columns passed together with AVX-512 (several panels): their `KC`-deep slices stay
/// in L2.
pub(crate) const GROUP_COLS: usize = 512;
/// The AVX2 blocking: deeper blocks over narrower groups. Each block's six rows of `x`
/// (`6 × 768` floats, 18 KiB) stay in L1 and the group's panels (`768 × 128` floats, 384
/// KiB) in a 512 KiB L2; `dst` is read and written once per 768 of depth instead of once per
/// 256. On an AVX2 Zen 3 (BENCHMARKS.md, twentieth), against 256 × 512 in 8 alternated
/// pairs (order swapped every pair): the packed products 128×768×2304, 128×3072×768,
/// 1024×768×2304 and 1536³ 1.20, 1.19, 1.15 and 1.05x as fast; a GPT-2 small forward 1.03x
/// at 1×128 and 1.08x at 4×256. Intel's AVX-512 cores take it too ([`INTEL_AVX512_BLOCKING`]).
const AVX2_BLOCKING: Blocking = Blocking { kc: 768, group_cols: 128 };
/// The AVX-512 blocking on AMD (Zen 4 and 5; not measured against another): [`KC`] deep
/// over [`GROUP_COLS`].
const AVX512_BLOCKING: Blocking = Blocking { kc: KC, group_cols: GROUP_COLS };
/// The AVX-512 blocking on Intel: the AVX2 one (768 deep over 128 columns: six rows' 18 KiB
/// in a 48 KiB L1, the group's 384 KiB in a 2 MiB L2). On a Xeon (family 6, model 207,
/// BENCHMARKS.md, thirty-fourth), each product timed in one process with the two blockings
/// alternating three products at a time, medians of 45, against [`AVX512_BLOCKING`]:
/// 128×768×2304 1.11–1.19x, 128×768×768 1.12–1.14x, 128×3072×768 1.08–1.14x, 1024×768×2304
/// 1.06–1.09x, 768×128×384 0.98–0.99x, 1536³ 1.03x; depth alone (768 over 512 columns) or
/// width alone (256 over 128) gained nothing.
const INTEL_AVX512_BLOCKING: Blocking = AVX2_BLOCKING;

/// A product's blocking: depth blocks of `kc`, column groups of `group_cols`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Blocking {
    pub kc: usize,
    pub group_cols: usize,
}

/// Rows of `x` per micro-kernel call (the micro-kernels' `nr`).
pub(crate) const NR: usize = 6;
/// Tasks per thread in a split product.
pub(crate) const TASKS_PER_THREAD: usize = 3;
/// Below this many multiply-adds a product runs on one thread.
pub(crate) const SPLIT_MIN_MACS: usize = 48 * 48 * 64;

/// The micro-kernels this CPU runs: `ukr[v - 1][r - 1]` computes `v` vectors of `lanes`
/// output columns for `r` rows.
#[derive(Clone, Copy)]
pub(crate) struct Isa {
    lanes: usize,
    ukr: &'static [[MicroKernelFn<f32>; NR]],
    pub blocking: Blocking,
}

impl Isa {
    pub(crate) fn panel(&self) -> usize {
        self.lanes * self.ukr.len()
    }

    /// Depth of the half-weight kernels' blocks by columns (`half_blocked::by_columns`): the
    /// AVX2 blocking's with AVX2, [`KC`] with AVX-512, on Intel too (768 there, timed in one
    /// process against 256: 0.95–1.05x, nothing gained).
    pub(crate) fn half_kc(&self) -> usize {
        if self.lanes == 8 { AVX2_BLOCKING.kc } else { KC }
    }

    /// The blocking of the half-weight kernels' widened row-major blocks
    /// (`half_blocked::blocked`): with AVX-512 the f32 products' (on Intel
    /// [`INTEL_AVX512_BLOCKING`], timed in one process against 256 × 512 on the model-207
    /// Xeon: GPT-2's 128-row products with bf16 weights 1.00–1.15x, median about 1.05x), with
    /// AVX2 [`KC`] over [`GROUP_COLS`] as before.
    pub(crate) fn half_blocking(&self) -> Blocking {
        if self.lanes == 16 { self.blocking } else { AVX512_BLOCKING }
    }

    /// The micro-kernel for `m` values down a panel (at most [`Isa::panel`]) by `n` (at most
    /// [`NR`]) broadcast values.
    pub(crate) fn kernel(&self, m: usize, n: usize) -> MicroKernelFn<f32> {
        self.ukr[m.div_ceil(self.lanes) - 1][n - 1]
    }
}

pub(crate) fn isa() -> Option<Isa> {
    static ISA: OnceLock<Option<Isa>> = OnceLock::new();
    *ISA.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        if !super::simd::baseline() {
            if std::arch::is_x86_feature_detected!("avx512f") {
                let blocking = if super::simd::intel() { INTEL_AVX512_BLOCKING } else { AVX512_BLOCKING };
                return Some(Isa { lanes: 16, ukr: &gemm_f32::microkernel::avx512f::f32::UKR, blocking });
            }
            if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                return Some(Isa { lanes: 8, ukr: &gemm_f32::microkernel::fma::f32::UKR, blocking: AVX2_BLOCKING });
            }
        }
        None
    })
}

/// Whether this CPU (and `BURNLENS_ISA`) lets weights be packed: gemm-f32's AVX2 or AVX-512
/// micro-kernels are there and [`super::simd::baseline`] is off.
pub fn available() -> bool {
    isa().is_some()
}

/// A `[k, n]` matrix in panels of `panel` columns, each `k × panel` contiguous.
pub struct Packed {
    k: usize,
    n: usize,
    isa: Isa,
    data: super::pages::PageBuf<f32>,
}

impl std::fmt::Debug for Packed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Packed").field("k", &self.k).field("n", &self.n).field("panel", &self.isa.panel()).finish()
    }
}

impl Packed {
    /// Pack `b`, or `None` where this CPU has no micro-kernel for it (the caller uses gemm).
    pub fn new(b: MatRef) -> Option<Self> {
        if b.rows > 0 {
            b.check();
        }
        Self::filled(b.rows, b.cols, |c0, cols, panel| fill_panel(panel, b, c0, cols, panel.len() / b.rows))
    }

    /// A `[k, n]` matrix packed by `fill(c0, cols, panel)`, which writes columns `c0..c0 +
    /// cols` into `panel` (`k × P`, zeroed, row `r` at `r · P`), one panel per call and the
    /// panels in parallel; `None` where this CPU has no micro-kernel.
    pub(crate) fn filled(k: usize, n: usize, fill: impl Fn(usize, usize, &mut [f32]) + Sync) -> Option<Self> {
        let isa = isa()?;
        let p = isa.panel();
        let mut data = super::pages::PageBuf::zeroed(n.div_ceil(p) * k * p);
        if k > 0 {
            pool::for_chunks(&mut data, k * p, |j, panel| fill(j * p, p.min(n - j * p), panel));
        }
        Some(Self { k, n, isa, data })
    }

    /// Columns per panel: where a part of the matrix may start ([`matmul_packed_part`]).
    pub fn panel(&self) -> usize {
        self.isa.panel()
    }

    pub fn rows(&self) -> usize {
        self.k
    }

    pub fn cols(&self) -> usize {
        self.n
    }
}

/// `dst[m, n] (+)= a[m, k] · b`, `dst` row-major with row stride `dst_rs`.
pub fn matmul_packed(dst: &mut [f32], dst_rs: usize, a: MatRef, b: &Packed, accumulate: bool) {
    let (m, k, n) = (a.rows, a.cols, b.n);
    assert_eq!(b.k, k, "matmul_packed: inner dimensions {k} and {}", b.k);
    if nothing_to_multiply(dst, dst_rs, [m, k, n], accumulate, "matmul_packed") {
        return;
    }
    a.check();
    let split = Split::new([m, k, n], b.isa.panel(), b.isa.blocking.group_cols);
    let ptr = SendPtr(dst.as_mut_ptr());
    let win = Window { depth: 0..k, col0: 0, col_end: n };
    split.run(|t| {
        // The whole `SendPtr` (a closure naming only `ptr.0` would capture a bare pointer).
        let dst = ptr;
        let (panels, rows) = split.task(t);
        // SAFETY: tasks write disjoint (rows × panel columns) blocks of `dst`, all inside it
        // (checked above); `a` was bounds-checked and `b` holds whole zero-padded panels.
        unsafe { block(dst.0, dst_rs, a, b, panels, rows, &win, accumulate) };
    });
}

/// How a product of `m` rows, depth `k` and `n` columns (in panels of `p`) splits into
/// tasks, each a range of panels against a range of rows.
pub(crate) struct Split {
    m: usize,
    panels: usize,
    per_group: usize,
    rows_per: usize,
    row_splits: usize,
    parallel: bool,
}

impl Split {
    /// The split of a product in panels of `p` columns whose tasks take at most `group_cols`
    /// columns each.
    pub(crate) fn new([m, k, n]: [usize; 3], p: usize, group_cols: usize) -> Self {
        let panels = n.div_ceil(p);
        let group_max = (group_cols / p).max(1);
        let threads = pool::threads();
        let parallel = threads > 1 && m.saturating_mul(n).saturating_mul(k) >= SPLIT_MIN_MACS;
        // About [`TASKS_PER_THREAD`] tasks per thread, so that a helper the scheduler starts
        // late still takes its share of what is left. Taller than wide (the training step's
        // `m = batch · positions` rows against a narrow weight): blocks of rows, each against
        // every panel, so that threads write different rows and share no cache line of
        // `dst`. Wider than tall (a forward pass over few positions): groups of panels, each
        // thread streaming its own part of the weight, with the rows split as well if there
        // are too few groups.
        let tasks_wanted = threads * TASKS_PER_THREAD;
        let (per_group, rows_per) = if !parallel {
            (panels, m)
        } else if m >= n {
            (panels, m.div_ceil(tasks_wanted).next_multiple_of(NR))
        } else {
            let per_group = panels.div_ceil(tasks_wanted).clamp(1, group_max);
            let groups = panels.div_ceil(per_group);
            let row_splits = if groups < threads { threads.div_ceil(groups).min(m.div_ceil(NR)) } else { 1 };
            (per_group, m.div_ceil(row_splits).next_multiple_of(NR))
        };
        Self { m, panels, per_group, rows_per, row_splits: m.div_ceil(rows_per), parallel }
    }

    /// Task `t`'s panels and rows.
    pub(crate) fn task(&self, t: usize) -> (std::ops::Range<usize>, std::ops::Range<usize>) {
        let (g, r) = (t / self.row_splits, t % self.row_splits);
        (g * self.per_group..((g + 1) * self.per_group).min(self.panels), r * self.rows_per..((r + 1) * self.rows_per).min(self.m))
    }

    /// Run every task, on the pool when the product is big enough to split.
    pub(crate) fn run(&self, task: impl Fn(usize) + Sync) {
        let tasks = self.panels.div_ceil(self.per_group) * self.row_splits;
        if self.parallel {
            pool::run(tasks, task);
        } else {
            (0..tasks).for_each(task);
        }
    }
}

/// Which part of a packed matrix a product reads: rows `depth` (the columns of `a`), and
/// columns from `col0` (a panel boundary, `dst`'s column 0) to `col_end`.
struct Window {
    depth: std::ops::Range<usize>,
    col0: usize,
    col_end: usize,
}

/// `dst (+)= a · b[depth, cols]` on the calling thread, for kernels that split work
/// themselves: `a` is `[m, depth.len()]`, `cols.start` a multiple of [`Packed::panel`], and
/// `dst` column `c` is `b`'s column `cols.start + c`.
///
/// # Safety
/// `dst` must be valid for `a.rows` rows of `cols.len()` values at stride `dst_rs`, and
/// nothing else may access them during the call.
pub unsafe fn matmul_packed_part(
    dst: *mut f32,
    dst_rs: usize,
    a: MatRef,
    b: &Packed,
    depth: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
    accumulate: bool,
) {
    let p = b.isa.panel();
    assert!(
        cols.start.is_multiple_of(p) && cols.end <= b.n && depth.end <= b.k && a.cols == depth.len(),
        "matmul_packed_part: {cols:?} × {depth:?} of a {}×{} packed matrix, a {}×{}",
        b.k,
        b.n,
        a.rows,
        a.cols
    );
    if a.rows == 0 || cols.is_empty() {
        return;
    }
    if depth.is_empty() {
        if !accumulate {
            for r in 0..a.rows {
                unsafe { std::slice::from_raw_parts_mut(dst.add(r * dst_rs), cols.len()).fill(0.0) };
            }
        }
        return;
    }
    a.check();
    let win = Window { depth, col0: cols.start, col_end: cols.end };
    unsafe { block(dst, dst_rs, a, b, cols.start / p..cols.end.div_ceil(p), 0..a.rows, &win, accumulate) };
}

/// One task: `panels` of `b` against `rows` of `a`.
///
/// # Safety
/// `dst` must be valid for the written block and not accessed by others meanwhile; `a`'s
/// view must be in bounds.
#[allow(clippy::too_many_arguments)]
unsafe fn block(
    dst: *mut f32,
    dst_rs: usize,
    a: MatRef,
    b: &Packed,
    panels: std::ops::Range<usize>,
    rows: std::ops::Range<usize>,
    win: &Window,
    accumulate: bool,
) {
    let p = b.isa.panel();
    let group_max = (b.isa.blocking.group_cols / p).max(1);
    let mut g0 = panels.start;
    while g0 < panels.end {
        let g1 = (g0 + group_max).min(panels.end);
        unsafe { group(dst, dst_rs, a, b, g0..g1, rows.clone(), win, accumulate) };
        g0 = g1;
    }
}

/// [`block`] for at most a group's columns ([`Blocking`]): their block-deep slices stay in L2
/// while every row block passes.
///
/// # Safety
/// As for [`block`].
#[allow(clippy::too_many_arguments)]
unsafe fn group(
    dst: *mut f32,
    dst_rs: usize,
    a: MatRef,
    b: &Packed,
    panels: std::ops::Range<usize>,
    rows: std::ops::Range<usize>,
    win: &Window,
    accumulate: bool,
) {
    let (k, p) = (b.k, b.isa.panel());
    let mut p0 = win.depth.start;
    while p0 < win.depth.end {
        let kc = b.isa.blocking.kc.min(win.depth.end - p0);
        // Overwrite on the first depth block unless accumulating, then add.
        let add = p0 > win.depth.start || accumulate;
        let a_part = a.cols(p0 - win.depth.start, kc);
        let out = Out { dst, dst_rs, col0: win.col0, col_end: win.col_end };
        unsafe { depth_block(b.isa, &out, a_part, panels.clone(), rows.clone(), add, |j| b.data.as_ptr().add(j * k * p + p0 * p)) };
        p0 += kc;
    }
}

/// Where a product writes: `dst` column `c` is the matrix's column `col0 + c`, up to `col_end`.
pub(crate) struct Out {
    pub dst: *mut f32,
    pub dst_rs: usize,
    pub col0: usize,
    pub col_end: usize,
}

/// The micro-kernel calls of one depth block: `rows` of `a` (`[m, kc]`, read in place)
/// against `panels`, panel `j`'s `kc × P` slice starting at `lhs(j)` with row stride `P`;
/// `add`: accumulate into `dst`, else overwrite.
///
/// # Safety
/// `out` must be valid for the written block and not accessed by others meanwhile; `a`'s
/// view must be in bounds and every `lhs(j)` valid for `kc × P` reads.
pub(crate) unsafe fn depth_block(
    isa: Isa,
    out: &Out,
    a: MatRef,
    panels: std::ops::Range<usize>,
    rows: std::ops::Range<usize>,
    add: bool,
    lhs: impl Fn(usize) -> *const f32,
) {
    let p = isa.panel();
    let a_ptr = unsafe { a.data.as_ptr().add(a.offset) };
    let mut r0 = rows.start;
    while r0 < rows.end {
        let nr = NR.min(rows.end - r0);
        for j in panels.clone() {
            let c0 = j * p;
            let cols = p.min(out.col_end - c0);
            #[cfg(target_arch = "x86_64")]
            if isa.lanes == 8 && p == super::avx2_tile::NR && nr == super::avx2_tile::MR && a.cs == 1 && a.rs > 0 {
                // Whole six-row blocks on AVX2: burnlens's own tile (the panel's layout is the
                // tile's `b`), not gemm-f32's kernel.
                // SAFETY: an AVX2 panel means the CPU has AVX2 and FMA ([`isa`]); the six rows
                // of `a` from `r0` hold `a.cols` floats each (in bounds, the caller's
                // guarantee), the panel `kc × P` floats at `lhs(j)`, and the tile's `6 × cols`
                // block of `dst` is the caller's to write.
                unsafe {
                    super::avx2_tile::tile(
                        a.cols,
                        a_ptr.offset(r0 as isize * a.rs),
                        a.rs as usize,
                        lhs(j),
                        out.dst.add(r0 * out.dst_rs + c0 - out.col0),
                        out.dst_rs,
                        [nr, cols],
                        add,
                    )
                };
                continue;
            }
            let ukr = isa.kernel(cols, nr);
            let lhs = lhs(j);
            unsafe {
                ukr(
                    cols,
                    nr,
                    a.cols,
                    out.dst.add(r0 * out.dst_rs + c0 - out.col0),
                    lhs,
                    a_ptr.offset(r0 as isize * a.rs),
                    out.dst_rs as isize,
                    1,
                    p as isize,
                    a.cs,
                    a.rs,
                    1.0,
                    1.0,
                    u8::from(add),
                    false,
                    false,
                    false,
                    lhs,
                )
            };
        }
        r0 += nr;
    }
}

thread_local! {
    static PACKS_HERE: Cell<usize> = const { Cell::new(0) };
}

/// Weights this thread has packed so far (a product finding its weight's copy packs none).
pub fn packs_on_this_thread() -> usize {
    PACKS_HERE.with(|c| c.get())
}

/// The packed copy of the weight `view` (a view of `owner`'s storage), packed now if it is
/// not kept yet ([`super::kept`]); `None` where packing does not apply (no micro-kernel for
/// this CPU, copies turned off, or the copy would not fit the budget).
pub fn packed_weight(owner: &FlexTensor, view: MatRef) -> Option<Arc<Packed>> {
    let isa = isa()?;
    let size = view.cols.div_ceil(isa.panel()) * view.rows * isa.panel() * 4;
    let key = View { offset: view.offset, dims: [view.rows, view.cols], strides: [view.rs, view.cs] };
    kept(owner, key, Layout::Packed, size, || {
        PACKS_HERE.with(|c| c.set(c.get() + 1));
        Packed::new(view)
    })
}

/// Copies held now: `(entries, bytes)` (see [`super::kept::cached`]).
pub fn cached() -> (usize, usize) {
    super::kept::cached()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::gemm::tests::{naive, vals};

    #[test]
    fn packed_products_match_a_naive_product_on_every_edge() {
        if isa().is_none() {
            assert!(Packed::new(MatRef::row_major(&[1.0], 1, 1)).is_none());
            return;
        }
        // Partial panels, partial row blocks, several depth blocks (AMD's AVX-512 of 256, AVX2's
        // and Intel's of 768: 1,600 is three of those), several column groups, m = 1, big
        // enough to split; on AVX2 whole six-row blocks take burnlens's tile, the rest gemm-f32's
        // kernels.
        let shapes = [(1, 5, 3), (1, 768, 300), (7, 1, 4), (13, 600, 130), (6, 257, 64), (9, 1600, 150), (130, 64, 1100), (200, 70, 9), (0, 3, 4), (4, 0, 5)];
        for &(m, k, n) in &shapes {
            let a_data = vals(m * k + 3, 1);
            let b_data = vals(k * n, 2);
            let bt: Vec<f32> = (0..n * k).map(|i| b_data[(i % k) * n + i / k]).collect();
            // `a` at an offset and with a wider row stride than its width.
            let a_wide: Vec<f32> =
                (0..m * (k + 2) + 1).map(|i| if i == 0 || (i - 1) % (k + 2) >= k { 9.0 } else { a_data[(i - 1) / (k + 2) * k + (i - 1) % (k + 2)] }).collect();
            let a_views = [MatRef::row_major(&a_data, m, k), MatRef { data: &a_wide, offset: 1, rows: m, cols: k, rs: (k + 2) as isize, cs: 1 }];
            for b in [MatRef::row_major(&b_data, k, n), MatRef::row_major(&bt, n, k).t()] {
                let packed = Packed::new(b).expect("this CPU packs");
                for a in a_views {
                    let want = naive(&a, &b);
                    for accumulate in [false, true] {
                        let mut dst = vec![1.0f32; m * n];
                        matmul_packed(&mut dst, n, a, &packed, accumulate);
                        for (i, (&g, &w)) in dst.iter().zip(&want).enumerate() {
                            let w = if accumulate { w + 1.0 } else { w };
                            assert!((g - w).abs() <= 1e-4 * (1.0 + w.abs()), "{m}x{k}x{n} acc={accumulate} [{i}]: {g} vs {w}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_part_of_a_packed_matrix_matches_the_same_part_unpacked() {
        let Some(b_full) = Packed::new(MatRef::row_major(&[0.0; 4], 2, 2)) else { return };
        let p = b_full.panel();
        let (k, n, m) = (300usize, 5 * p + 7, 11usize);
        let b_data = vals(k * n, 3);
        let b = MatRef::row_major(&b_data, k, n);
        let packed = Packed::new(b).unwrap();
        for (depth, cols) in [(0..k, 0..n), (17..290, p..n), (100..101, 2 * p..2 * p + 3), (0..40, 4 * p..n), (5..5, 0..p)] {
            let a_data = vals(m * depth.len(), 4);
            let a = MatRef::row_major(&a_data, m, depth.len());
            let want = naive(&a, &b.rows(depth.start, depth.len()).cols(cols.start, cols.len()));
            for accumulate in [false, true] {
                let mut dst = vec![1.0f32; m * cols.len()];
                unsafe { matmul_packed_part(dst.as_mut_ptr(), cols.len(), a, &packed, depth.clone(), cols.clone(), accumulate) };
                for (i, (&g, &w)) in dst.iter().zip(&want).enumerate() {
                    let w = if accumulate { w + 1.0 } else { w };
                    assert!((g - w).abs() <= 1e-4 * (1.0 + w.abs()), "{depth:?} {cols:?} acc={accumulate} [{i}]: {g} vs {w}");
                }
            }
        }
    }
}
