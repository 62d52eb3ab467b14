//! Half-weight products with few rows (decoding): one pass over the weight, each element
//! widened in registers (see [`super::half`]).

use super::gemm::MatRef;
use super::half_format::{Half, HalfRef, wide};
use super::pool::{self, GRAIN, SendPtr};
use super::prefetch::{self, Ahead};
use super::simd::dispatch;

// ---------------------------------------------------------------------------------------
// Few rows: one pass over the weight
// ---------------------------------------------------------------------------------------

pub(super) fn stream(dst: &mut [f32], dst_rs: usize, a: MatRef, w: HalfRef, accumulate: bool) {
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
pub(crate) const DEEP_COLUMNS: usize = 8192;
/// Columns read together by one pass over deep columns.
const DEEP_GROUP: usize = 8;
/// Partial sums per column in a deep pass: one AVX-512 register.
const DEEP_LANES: usize = 16;

/// One column at a time: the task's weights are read as one stream, in address order, asking
/// for the bytes ahead as [`Ahead::stored`] says. (Four columns at once, four streams a
/// column apart, ran at a third of the speed from memory on the Zen 4 machine at GPT-2's
/// depth: the prefetchers did not follow.) Deep columns go [`DEEP_GROUP`] at a time
/// ([`deep_columns_dot`]), asking for nothing.
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
    let ahead = Ahead::stored();
    for c in first..cols {
        let start = w.at(0, c0 + c);
        let col = &w.data[start..start + k];
        for (r, row) in rows.iter().enumerate() {
            let mut acc = [0.0f32; LANES];
            for (x, wc) in row[..body].chunks_exact(LANES).zip(col[..body].chunks_exact(LANES)) {
                // One cache line of the column per step; ahead of it the next columns'.
                prefetch::ask(wc.as_ptr(), 1, ahead);
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
/// memory on the Zen 4 machine; its output reads and writes stay in L1 either way). Where the
/// task's rows are whole rows of `w` one after another (one block of columns), the row's
/// lines ask for the bytes ahead as [`Ahead::stored`] says; where they are pieces of wider
/// rows, the bytes ahead are not the next read, and nothing is asked.
#[inline(always)]
fn rows_axpy_body<const BF16: bool>(rows: &[Vec<f32>], w: HalfRef, c0: usize, depth: std::ops::Range<usize>, out: &mut [f32], cols: usize) {
    let ahead = if w.cs == 1 && w.rs == cols as isize { Ahead::stored() } else { Ahead::Nothing };
    for i in depth {
        let start = w.at(i, c0);
        let src = &w.data[start..start + cols];
        if ahead != Ahead::Nothing {
            for line in src.chunks(32) {
                prefetch::ask(line.as_ptr(), 1, ahead);
            }
        }
        for (r, row) in rows.iter().enumerate() {
            let x = row[i];
            for (o, &b) in out[r * cols..(r + 1) * cols].iter_mut().zip(src) {
                *o += x * wide::<BF16>(b);
            }
        }
    }
}
