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
//! - **More rows** (prefill, training-free forward passes), rows of `W` contiguous: each
//!   task widens the `KC × P` panels of its columns for one depth block into a buffer of its
//!   own (at most `KC × GROUP_COLS` floats, 512 KiB) and runs gemm-f32's micro-kernels over
//!   it, as gemm-f16 does when it packs, prefetching the next block meanwhile; the weight's
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

use std::cell::RefCell;

use super::gemm::{MatRef, matmul, nothing_to_multiply};
use super::packed::{self, KC, Out, Split};
use super::pool::{self, GRAIN, SendPtr};
use super::simd::dispatch;

/// Which 16-bit float a weight holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Half {
    Bf16,
    F16,
}

/// At most this many rows of `a` take the streaming kernel.
pub const STREAM_ROWS: usize = 4;

/// A strided read-only view of a half-precision matrix: element `(i, j)` is
/// `data[offset + i·rs + j·cs]` (the bits, widened by [`Half`]'s rule).
#[derive(Clone, Copy, Debug)]
pub struct HalfRef<'a> {
    pub data: &'a [u16],
    pub kind: Half,
    pub offset: usize,
    pub rows: usize,
    pub cols: usize,
    pub rs: isize,
    pub cs: isize,
}

impl<'a> HalfRef<'a> {
    /// The transpose (a view: no copy).
    pub fn t(self) -> Self {
        Self { rows: self.cols, cols: self.rows, rs: self.cs, cs: self.rs, ..self }
    }

    pub(crate) fn at(&self, r: usize, c: usize) -> usize {
        (self.offset as isize + r as isize * self.rs + c as isize * self.cs) as usize
    }

    /// Panics unless every element lies inside `data`.
    pub(crate) fn check(&self) {
        super::gemm::check_view([self.offset, self.rows, self.cols], [self.rs, self.cs], self.data.len());
    }
}

/// bf16 → f32: the bf16 bits are the f32's upper half.
#[inline(always)]
pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// f16 → f32, exact for every value (normal, subnormal, zero, infinity, NaN), without
/// branches: the exponent is rebiased, subnormals renormalised by one float subtraction.
#[inline(always)]
pub fn f16_to_f32(h: u16) -> f32 {
    const SHIFTED_EXP: u32 = 0x7c00 << 13;
    let h = h as u32;
    let mut o = (h & 0x7fff) << 13;
    let exp = o & SHIFTED_EXP;
    o += (127 - 15) << 23;
    let inf_nan = o + ((128 - 16) << 23);
    // 2^-14: a subnormal's value once the implicit one is added and subtracted again.
    let magic = f32::from_bits(113 << 23);
    let subnormal = (f32::from_bits(o + (1 << 23)) - magic).to_bits();
    let o = if exp == SHIFTED_EXP {
        inf_nan
    } else if exp == 0 {
        subnormal
    } else {
        o
    };
    f32::from_bits(o | ((h & 0x8000) << 16))
}

/// Widen `src` into `dst` (equal lengths).
pub fn widen(kind: Half, src: &[u16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "widen: lengths differ");
    widen_runs(kind, src, Runs { start: 0, stride: 0, count: 1, len: src.len() }, dst, 0);
}

/// Where [`widen_runs`] reads: `count` runs of `len` bits, the `r`-th starting at
/// `start + r · stride`.
#[derive(Clone, Copy)]
struct Runs {
    start: usize,
    stride: isize,
    count: usize,
    len: usize,
}

/// Widen the runs `src` into `dst`, the `r`-th run to `dst[r · dst_stride..][..len]`: one
/// dispatch for a whole block (a call per short run cost more than the widening).
fn widen_runs(kind: Half, src: &[u16], runs: Runs, dst: &mut [f32], dst_stride: usize) {
    if runs.count == 0 || runs.len == 0 {
        return;
    }
    let last = (runs.start as isize + (runs.count - 1) as isize * runs.stride) as usize;
    assert!(runs.start.max(last) + runs.len <= src.len() && (runs.count - 1) * dst_stride + runs.len <= dst.len(), "widen_runs: out of bounds");
    match kind {
        Half::Bf16 => dispatch!(|src: &[u16], runs: Runs, dst: &mut [f32], dst_stride: usize| -> () { widen_runs_body::<true>(src, runs, dst, dst_stride) }),
        Half::F16 => dispatch!(|src: &[u16], runs: Runs, dst: &mut [f32], dst_stride: usize| -> () { widen_runs_body::<false>(src, runs, dst, dst_stride) }),
    }
}

/// Ask for the cache lines of `runs` ahead of their use (a hint: never faults; nothing off
/// x86), so that widening the next block does not wait for memory.
fn prefetch_runs(src: &[u16], runs: Runs) {
    #[cfg(target_arch = "x86_64")]
    for r in 0..runs.count {
        let s = src.as_ptr().wrapping_offset(runs.start as isize + r as isize * runs.stride);
        for i in (0..runs.len).step_by(32) {
            // SAFETY: a prefetch is a hint; any address is allowed.
            unsafe { std::arch::x86_64::_mm_prefetch(s.wrapping_add(i).cast::<i8>(), std::arch::x86_64::_MM_HINT_T0) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (src, runs);
}

#[inline(always)]
fn widen_runs_body<const BF16: bool>(src: &[u16], runs: Runs, dst: &mut [f32], dst_stride: usize) {
    for r in 0..runs.count {
        let s = (runs.start as isize + r as isize * runs.stride) as usize;
        let d = &mut dst[r * dst_stride..r * dst_stride + runs.len];
        for (d, &b) in d.iter_mut().zip(&src[s..s + runs.len]) {
            *d = wide::<BF16>(b);
        }
    }
}

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
// Few rows: one pass over the weight
// ---------------------------------------------------------------------------------------

fn stream(dst: &mut [f32], dst_rs: usize, a: MatRef, w: HalfRef, accumulate: bool) {
    let (m, k) = (a.rows, a.cols);
    // The rows of `a`, contiguous (at most STREAM_ROWS × k floats).
    let rows: Vec<Vec<f32>> = (0..m).map(|r| a.row_values(r).collect()).collect();
    let parallel = pool::threads() > 1 && m * k * w.cols >= GRAIN * 16;
    if w.rs == 1 {
        stream_columns(dst, dst_rs, &rows, w, accumulate, parallel);
    } else {
        stream_rows(dst, dst_rs, &rows, w, accumulate, parallel);
    }
}

/// Tasks per thread of a streaming product: enough to balance a helper that starts late.
const STREAM_TASKS_PER_THREAD: usize = 4;

/// Columns contiguous in `w` (`rs == 1`): each task takes a block of columns, a contiguous
/// run of `cols × k` weights, and writes their dot products.
fn stream_columns(dst: &mut [f32], dst_rs: usize, rows: &[Vec<f32>], w: HalfRef, accumulate: bool, parallel: bool) {
    let (m, k, n) = (rows.len(), w.rows, w.cols);
    let tasks_wanted = if parallel { pool::threads() * STREAM_TASKS_PER_THREAD } else { 1 };
    // Enough weight per task to amortise handing it out, in whole groups of deep columns.
    let block = n.div_ceil(tasks_wanted).max((GRAIN * 4 / k.max(1)).min(n)).next_multiple_of(DEEP_GROUP);
    let ptr = SendPtr(dst.as_mut_ptr());
    let task = |t: usize| {
        let dst = ptr;
        let c0 = t * block;
        let cols = block.min(n - c0);
        let mut out = vec![0.0f32; m * cols];
        columns_dot(rows, w, c0, &mut out, cols);
        for (r, row) in out.chunks_exact(cols).enumerate() {
            // SAFETY: tasks write disjoint columns of `dst`, inside it (checked by the caller).
            let d = unsafe { std::slice::from_raw_parts_mut(dst.0.add(r * dst_rs + c0), cols) };
            store(d, row, accumulate);
        }
    };
    let tasks = n.div_ceil(block);
    if parallel && tasks > 1 {
        pool::run(tasks, task);
    } else {
        (0..tasks).for_each(task);
    }
}

/// Most columns one task of [`stream_rows`] sums at once (its partial sums stay in L1/L2).
const STREAM_ROW_COLS: usize = 4096;

/// Rows contiguous in `w` (`cs == 1`, GPT-2's `Conv1D`): each task takes a range of whole
/// rows of `w` (of at most [`STREAM_ROW_COLS`] columns), a contiguous run of memory the
/// prefetchers follow, and sums them into partial outputs of its own; the partial sums are
/// added in task order. (Blocks of columns instead would read a short piece of every row,
/// `k` jumps of `n` values each.)
fn stream_rows(dst: &mut [f32], dst_rs: usize, rows: &[Vec<f32>], w: HalfRef, accumulate: bool, parallel: bool) {
    let (m, k, n) = (rows.len(), w.rows, w.cols);
    let col_blocks = n.div_ceil(STREAM_ROW_COLS);
    let width = n.div_ceil(col_blocks);
    let tasks_wanted = if parallel { pool::threads() * STREAM_TASKS_PER_THREAD } else { 1 };
    let depth_splits = tasks_wanted.div_ceil(col_blocks).clamp(1, k.div_ceil(4).max(1));
    let depth = k.div_ceil(depth_splits).next_multiple_of(4);
    let depth_splits = k.div_ceil(depth).max(1);
    // Partial sums: task (b, s) writes rows `m` × columns of block `b` at `partial[(b · splits + s) · m · width ..]`.
    let mut partial = vec![0.0f32; col_blocks * depth_splits * m * width];
    let ptr = SendPtr(partial.as_mut_ptr());
    let task = |t: usize| {
        let part = ptr;
        let (b, s) = (t / depth_splits, t % depth_splits);
        let c0 = b * width;
        let cols = width.min(n - c0);
        let i0 = s * depth;
        let i1 = (i0 + depth).min(k);
        // SAFETY: each task owns its own `m × width` piece of `partial`.
        let out = unsafe { std::slice::from_raw_parts_mut(part.0.add(t * m * width), m * width) };
        rows_axpy(rows, w, c0, i0..i1, out, cols);
    };
    let tasks = col_blocks * depth_splits;
    if parallel && tasks > 1 {
        pool::run(tasks, task);
    } else {
        (0..tasks).for_each(task);
    }
    for b in 0..col_blocks {
        let c0 = b * width;
        let cols = width.min(n - c0);
        for r in 0..m {
            let d = &mut dst[r * dst_rs + c0..r * dst_rs + c0 + cols];
            let piece = |s: usize| &partial[((b * depth_splits + s) * m + r) * width..][..cols];
            store(d, piece(0), accumulate);
            for s in 1..depth_splits {
                d.iter_mut().zip(piece(s)).for_each(|(d, v)| *d += v);
            }
        }
    }
}

fn store(dst: &mut [f32], src: &[f32], accumulate: bool) {
    if accumulate {
        dst.iter_mut().zip(src).for_each(|(d, v)| *d += v);
    } else {
        dst.copy_from_slice(src);
    }
}

/// `out[r, c] = rows[r] · w[:, c0 + c]` for columns contiguous in `w` (`rs == 1`).
fn columns_dot(rows: &[Vec<f32>], w: HalfRef, c0: usize, out: &mut [f32], cols: usize) {
    match w.kind {
        Half::Bf16 => {
            dispatch!(|rows: &[Vec<f32>], w: HalfRef, c0: usize, out: &mut [f32], cols: usize| -> () { columns_dot_body::<true>(rows, w, c0, out, cols) })
        }
        Half::F16 => {
            dispatch!(|rows: &[Vec<f32>], w: HalfRef, c0: usize, out: &mut [f32], cols: usize| -> () { columns_dot_body::<false>(rows, w, c0, out, cols) })
        }
    }
}

#[inline(always)]
pub(crate) fn wide<const BF16: bool>(bits: u16) -> f32 {
    if BF16 { bf16_to_f32(bits) } else { f16_to_f32(bits) }
}

/// Independent partial sums of one dot product: two AVX-512 registers (four AVX2), enough
/// to hide the multiply-adds' latency.
const LANES: usize = 32;

/// The sum of `v`'s lanes as a tree (a chain of adds would not vectorise, and at decoding's
/// widths it cost as much as the products).
#[inline(always)]
fn lane_sum<const N: usize>(mut v: [f32; N]) -> f32 {
    let mut half = N / 2;
    while half > 0 {
        for l in 0..half {
            v[l] += v[l + half];
        }
        half /= 2;
    }
    v[0]
}

/// From this depth on, [`columns_dot`] reads [`DEEP_GROUP`] columns per pass: one row of `x`
/// (32 KB from here) no longer stays in L1, and one column at a time reloaded it from L2 for
/// every column (1×14336×4096 from memory: 23 GB/s, against 27–34 for eight columns per
/// pass in the probe of BENCHMARKS.md "2026-11-26 (later)"). Shallower columns stay one at a
/// time: there eight short streams at once ran slower than one (17–22 GB/s against 28–34
/// at depth 768).
const DEEP_COLUMNS: usize = 8192;
/// Columns read together by one pass over deep columns.
const DEEP_GROUP: usize = 8;
/// Partial sums per column in a deep pass: one AVX-512 register.
const DEEP_LANES: usize = 16;

/// One column at a time: the task's weights are read as one stream, in address order.
/// (Four columns at once, four streams a column apart, ran at a third of the speed from
/// memory on the Zen 4 machine at GPT-2's depth: the prefetchers did not follow.) Deep
/// columns go [`DEEP_GROUP`] at a time ([`deep_columns_dot`]).
#[inline(always)]
fn columns_dot_body<const BF16: bool>(rows: &[Vec<f32>], w: HalfRef, c0: usize, out: &mut [f32], cols: usize) {
    let k = w.rows;
    let body = k / LANES * LANES;
    let mut first = 0;
    if k >= DEEP_COLUMNS {
        while first + DEEP_GROUP <= cols {
            deep_columns_dot::<BF16>(rows, w, c0, first, out, cols);
            first += DEEP_GROUP;
        }
    }
    for c in first..cols {
        let start = w.at(0, c0 + c);
        let col = &w.data[start..start + k];
        for (r, row) in rows.iter().enumerate() {
            let mut acc = [0.0f32; LANES];
            for (x, wc) in row[..body].chunks_exact(LANES).zip(col[..body].chunks_exact(LANES)) {
                for l in 0..LANES {
                    acc[l] += x[l] * wide::<BF16>(wc[l]);
                }
            }
            let tail: f32 = row[body..k].iter().zip(&col[body..]).map(|(&x, &b)| x * wide::<BF16>(b)).sum();
            out[r * cols + c] = lane_sum(acc) + tail;
        }
    }
}

/// Columns `first .. first + DEEP_GROUP` of the task's block (from `c0`), each row of `x`
/// loaded once for all of them.
#[inline(always)]
fn deep_columns_dot<const BF16: bool>(rows: &[Vec<f32>], w: HalfRef, c0: usize, first: usize, out: &mut [f32], cols: usize) {
    let k = w.rows;
    let body = k / DEEP_LANES * DEEP_LANES;
    let col: [&[u16]; DEEP_GROUP] = std::array::from_fn(|j| {
        let start = w.at(0, c0 + first + j);
        &w.data[start..start + k]
    });
    for (r, row) in rows.iter().enumerate() {
        let mut acc = [[0.0f32; DEEP_LANES]; DEEP_GROUP];
        for (ib, x) in row[..body].chunks_exact(DEEP_LANES).enumerate() {
            let i = ib * DEEP_LANES;
            for (acc, col) in acc.iter_mut().zip(&col) {
                let wc = &col[i..i + DEEP_LANES];
                for l in 0..DEEP_LANES {
                    acc[l] += x[l] * wide::<BF16>(wc[l]);
                }
            }
        }
        for (j, (acc, col)) in acc.into_iter().zip(&col).enumerate() {
            let tail: f32 = row[body..k].iter().zip(&col[body..]).map(|(&x, &b)| x * wide::<BF16>(b)).sum();
            out[r * cols + first + j] = lane_sum(acc) + tail;
        }
    }
}

/// `out[r, ..cols] += Σ_{i ∈ depth} rows[r][i] · w[i, c0..c0 + cols]` for rows contiguous in
/// `w` (`cs == 1`); `out` holds `rows.len()` rows of `cols` values, zeroed by the caller.
fn rows_axpy(rows: &[Vec<f32>], w: HalfRef, c0: usize, depth: std::ops::Range<usize>, out: &mut [f32], cols: usize) {
    match w.kind {
        Half::Bf16 => dispatch!(|rows: &[Vec<f32>], w: HalfRef, c0: usize, depth: std::ops::Range<usize>, out: &mut [f32], cols: usize| -> () {
            rows_axpy_body::<true>(rows, w, c0, depth, out, cols)
        }),
        Half::F16 => dispatch!(|rows: &[Vec<f32>], w: HalfRef, c0: usize, depth: std::ops::Range<usize>, out: &mut [f32], cols: usize| -> () {
            rows_axpy_body::<false>(rows, w, c0, depth, out, cols)
        }),
    }
}

/// One row of `w` at a time, so that the task's weights are read as one stream in address
/// order (four rows per pass, four streams a row apart, ran at 60–70% of this speed from
/// memory on the Zen 4 machine; its output reads and writes stay in L1 either way).
#[inline(always)]
fn rows_axpy_body<const BF16: bool>(rows: &[Vec<f32>], w: HalfRef, c0: usize, depth: std::ops::Range<usize>, out: &mut [f32], cols: usize) {
    for i in depth {
        let start = w.at(i, c0);
        let src = &w.data[start..start + cols];
        for (r, row) in rows.iter().enumerate() {
            let x = row[i];
            for (o, &b) in out[r * cols..(r + 1) * cols].iter_mut().zip(src) {
                *o += x * wide::<BF16>(b);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// More rows: panels widened per depth block, gemm-f32's micro-kernels
// ---------------------------------------------------------------------------------------

thread_local! {
    /// Each thread's widened panels (reused from product to product).
    static PANELS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

fn blocked(dst: &mut [f32], dst_rs: usize, a: MatRef, w: HalfRef, accumulate: bool, isa: packed::Isa) {
    let (m, k, n) = (a.rows, a.cols, w.cols);
    let p = isa.panel();
    let split = Split::new([m, k, n], p);
    let ptr = SendPtr(dst.as_mut_ptr());
    split.run(|t| {
        let dst = ptr;
        let (panels, rows) = split.task(t);
        PANELS.with(|buf| {
            let mut buf = buf.borrow_mut();
            let mut g0 = panels.start;
            while g0 < panels.end {
                let g1 = (g0 + packed::GROUP_COLS.div_ceil(p)).min(panels.end);
                let mut p0 = 0;
                while p0 < k {
                    let kc = KC.min(k - p0);
                    fill_panels(&mut buf, w, p0..p0 + kc, g0 * p..(g1 * p).min(n), p);
                    if w.cs == 1 && p0 + kc < k {
                        // The next depth block's rows, fetched while this one multiplies.
                        let (c0, c1) = (g0 * p, (g1 * p).min(n));
                        prefetch_runs(w.data, Runs { start: w.at(p0 + kc, c0), stride: w.rs, count: KC.min(k - p0 - kc), len: c1 - c0 });
                    }
                    let out = Out { dst: dst.0, dst_rs, col0: 0, col_end: n };
                    let panel0 = buf.as_ptr();
                    // SAFETY: tasks write disjoint (rows × panel columns) blocks of `dst`,
                    // inside it (checked by the caller); `buf` holds `g1 - g0` whole
                    // zero-padded `kc × p` panels.
                    unsafe { packed::depth_block(isa, &out, a.cols(p0, kc), g0..g1, rows.clone(), p0 > 0 || accumulate, |j| panel0.add((j - g0) * kc * p)) };
                    p0 += kc;
                }
                g0 = g1;
            }
        });
    });
}

/// Rows of `a` per pass of [`by_columns`]: their packed `KC`-deep slices (`ROW_BLOCK × KC`
/// floats, 256 KiB) stay in L2 while the weight's columns stream past.
const ROW_BLOCK: usize = 256;
/// Column groups (of [`NR`](packed::NR)) computed together into one tile by [`by_columns`].
const TILE_GROUPS: usize = 16;

thread_local! {
    /// [`by_columns`]'s output tile: `TILE_GROUPS · NR` columns of up to `ROW_BLOCK` rows,
    /// each column contiguous.
    static TILE: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// The weight's columns contiguous (`rs == 1`: every `nn.Linear` weight read through its
/// transposed view, the tied unembedding `W_Eᵀ`): the roles of the operands swap. `a` is
/// packed once into panels of `P` rows (`a` is the small operand: positions × width), and
/// the weight is widened [`NR`](packed::NR) columns at a time, each a contiguous run of
/// `KC` values, into a buffer the micro-kernel broadcasts from (`kc × 6` floats, in L1).
/// Every weight element is widened once per [`ROW_BLOCK`] rows and read in order: no
/// transposing scatter into panels. The micro-kernels write a tile whose columns are
/// contiguous (their fast path); it is added to `dst` once its whole depth is summed, so
/// `dst`'s row stride (a power of two for most models: every row of a block in one cache
/// set) is never walked by the micro-kernels.
fn by_columns(dst: &mut [f32], dst_rs: usize, a: MatRef, w: HalfRef, accumulate: bool, isa: packed::Isa) {
    let (m, k, n) = (a.rows, a.cols, w.cols);
    let (p, nr) = (isa.panel(), packed::NR);
    let lhs = pack_row_panels(a, p);
    let groups = n.div_ceil(nr);
    let threads = pool::threads();
    let parallel = threads > 1 && m.saturating_mul(k).saturating_mul(n) >= packed::SPLIT_MIN_MACS;
    let per_task = if parallel { groups.div_ceil(threads * packed::TASKS_PER_THREAD) } else { groups };
    let panels_per_block = (ROW_BLOCK / p).max(1);
    let ptr = SendPtr(dst.as_mut_ptr());
    let job = ColumnsJob { lhs: &lhs, w, m, isa };
    let task = |t: usize| {
        let dst = ptr;
        let task_groups = t * per_task..((t + 1) * per_task).min(groups);
        let (mut buf, mut tile) = (PANELS.take(), TILE.take());
        buf.resize(nr * KC, 0.0);
        tile.resize(TILE_GROUPS * nr * panels_per_block * p, 0.0);
        for g0 in task_groups.clone().step_by(TILE_GROUPS) {
            let cols = g0 * nr..((g0 + TILE_GROUPS).min(task_groups.end) * nr).min(n);
            for rb in (0..m.div_ceil(p)).step_by(panels_per_block) {
                let panels = rb..(rb + panels_per_block).min(m.div_ceil(p));
                let ts = job.multiply_tile(&mut tile, &mut buf, cols.clone(), panels.clone());
                let rows = panels.start * p..(panels.end * p).min(m);
                for r in rows.clone() {
                    // SAFETY: tasks write disjoint column ranges of `dst`, inside it (checked
                    // by the caller).
                    let d = unsafe { std::slice::from_raw_parts_mut(dst.0.add(r * dst_rs + cols.start), cols.len()) };
                    let column = |c: usize| tile[c * ts + r - rows.start];
                    if accumulate {
                        d.iter_mut().enumerate().for_each(|(c, d)| *d += column(c));
                    } else {
                        d.iter_mut().enumerate().for_each(|(c, d)| *d = column(c));
                    }
                }
            }
        }
        PANELS.set(buf);
        TILE.set(tile);
    };
    let tasks = groups.div_ceil(per_task);
    if parallel {
        pool::run(tasks, task);
    } else {
        (0..tasks).for_each(task);
    }
}

/// `a` in panels of `p` rows, each `k × p` with a row's values `p` apart (zero-padded).
fn pack_row_panels(a: MatRef, p: usize) -> Vec<f32> {
    let (m, k) = (a.rows, a.cols);
    let mut lhs = vec![0.0f32; m.div_ceil(p) * k * p];
    pool::for_chunks(&mut lhs, k * p, |rp, panel| {
        let r0 = rp * p;
        for i in 0..p.min(m - r0) {
            let row = (a.offset as isize + (r0 + i) as isize * a.rs) as usize;
            for (kk, dst) in panel.chunks_exact_mut(p).enumerate() {
                dst[i] = a.data[(row as isize + kk as isize * a.cs) as usize];
            }
        }
    });
    lhs
}

/// What every task of [`by_columns`] reads: `a` packed by [`pack_row_panels`] (`m` rows),
/// the weight, the micro-kernels.
struct ColumnsJob<'a> {
    lhs: &'a [f32],
    w: HalfRef<'a>,
    m: usize,
    isa: packed::Isa,
}

impl ColumnsJob<'_> {
    /// The product of the row panels `panels` with the weight's columns `cols`, over the
    /// whole depth, into `tile` (column `c` at `tile[c · ts ..]`, `ts` the block's rows in
    /// whole panels, returned). `buf` holds the widened columns.
    fn multiply_tile(&self, tile: &mut [f32], buf: &mut [f32], cols: std::ops::Range<usize>, panels: std::ops::Range<usize>) -> usize {
        let (w, isa) = (self.w, self.isa);
        let (k, p, nr) = (w.rows, isa.panel(), packed::NR);
        let ts = panels.len() * p;
        for p0 in (0..k).step_by(KC) {
            let kc = KC.min(k - p0);
            for c0 in cols.clone().step_by(nr) {
                let width = nr.min(cols.end - c0);
                widen_runs(w.kind, w.data, Runs { start: w.at(p0, c0), stride: w.cs, count: width, len: kc }, buf, kc);
                if c0 + nr < cols.end {
                    let next = nr.min(cols.end - c0 - nr);
                    prefetch_runs(w.data, Runs { start: w.at(p0, c0 + nr), stride: w.cs, count: next, len: kc });
                }
                for rp in panels.clone() {
                    let rows = p.min(self.m - rp * p);
                    let panel = self.lhs[rp * k * p + p0 * p..].as_ptr();
                    let out = tile[(c0 - cols.start) * ts + (rp - panels.start) * p..].as_mut_ptr();
                    // SAFETY: `out` has `width` columns of `ts ≥ rows` values left in the
                    // tile; `panel` holds `kc × p` packed values of this row panel, `buf`
                    // `width` widened columns of `kc` each.
                    unsafe {
                        isa.kernel(rows, width)(
                            rows,
                            width,
                            kc,
                            out,
                            panel,
                            buf.as_ptr(),
                            ts as isize,
                            1,
                            p as isize,
                            1,
                            kc as isize,
                            1.0,
                            1.0,
                            u8::from(p0 > 0),
                            false,
                            false,
                            false,
                            panel,
                        )
                    };
                }
            }
        }
        ts
    }
}

/// Widen `w[depth, cols]` into `buf` as panels of `p` columns, each `depth.len() × p`
/// contiguous and zero-padded past the last column. (A weight whose columns are contiguous
/// takes [`by_columns`] instead.)
fn fill_panels(buf: &mut Vec<f32>, w: HalfRef, depth: std::ops::Range<usize>, cols: std::ops::Range<usize>, p: usize) {
    let kc = depth.len();
    let panels = cols.len().div_ceil(p);
    // Every value is written below but a partial panel's padding, zeroed here (zeroing the
    // whole buffer each depth block cost as much as a tenth of the widening).
    buf.resize(panels * kc * p, 0.0);
    for j in 0..panels {
        let c0 = cols.start + j * p;
        let width = p.min(cols.end - c0);
        let panel = &mut buf[j * kc * p..(j + 1) * kc * p];
        if width < p {
            panel.chunks_exact_mut(p).for_each(|row| row[width..].fill(0.0));
        }
        if w.cs == 1 {
            widen_runs(w.kind, w.data, Runs { start: w.at(depth.start, c0), stride: w.rs, count: kc, len: width }, panel, p);
        } else {
            for r in 0..kc {
                for c in 0..width {
                    let bits = w.data[w.at(depth.start + r, c0 + c)];
                    panel[r * p + c] = widen_one(w.kind, bits);
                }
            }
        }
    }
}

fn widen_one(kind: Half, bits: u16) -> f32 {
    match kind {
        Half::Bf16 => wide::<true>(bits),
        Half::F16 => wide::<false>(bits),
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
        // several depth blocks, both layouts of `w`, a strided `a`, both half kinds; columns
        // deep enough to be read DEEP_GROUP at a time, with a partial group and a tail.
        for &(m, k, n) in &[
            (1, 5, 3),
            (1, 700, 300),
            (3, 257, 1100),
            (4, 64, 17),
            (5, 300, 70),
            (13, 600, 130),
            (130, 64, 1100),
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
