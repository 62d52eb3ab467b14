//! Half-weight products with more rows (prefill): panels widened per depth block for
//! gemm-f32's micro-kernels (see [`super::half`]).

use std::cell::RefCell;

use super::gemm::MatRef;
use super::half_format::{HalfRef, Rows, Runs, prefetch_runs, widen_one, widen_runs, widen_to_panels};
use super::packed::{self, Blocking, Out, Split};
use super::pool::{self, SendPtr};

// ---------------------------------------------------------------------------------------
// More rows: panels widened per depth block, gemm-f32's micro-kernels
// ---------------------------------------------------------------------------------------

thread_local! {
    /// Each thread's widened panels (reused from product to product).
    static PANELS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

pub(super) fn blocked(dst: &mut [f32], dst_rs: usize, a: MatRef, w: HalfRef, accumulate: bool, isa: packed::Isa) {
    let (m, k, n) = (a.rows, a.cols, w.cols);
    let p = isa.panel();
    // Its own blocking (the widened blocks' buffer is sized for it).
    let Blocking { kc: depth, group_cols } = isa.half_blocking();
    let split = Split::new([m, k, n], p, group_cols);
    let ptr = SendPtr(dst.as_mut_ptr());
    split.run(|t| {
        let dst = ptr;
        let (panels, rows) = split.task(t);
        let group = group_cols.div_ceil(p);
        // Each column group's depth blocks in turn: (first row of the block, its panels).
        let mut blocks = panels.clone().step_by(group).flat_map(|g0| (0..k).step_by(depth).map(move |p0| (p0, g0..(g0 + group).min(panels.end)))).peekable();
        PANELS.with(|buf| {
            let mut buf = buf.borrow_mut();
            while let Some((p0, g)) = blocks.next() {
                let kc = depth.min(k - p0);
                fill_panels(&mut buf, w, p0..p0 + kc, g.start * p..(g.end * p).min(n), p);
                // The next block's rows, fetched a share after each strip of rows multiplies
                // (asked for in one burst before, the widening still waited on memory).
                let next = blocks.peek().filter(|_| w.cs == 1).map(|(q0, h)| Runs {
                    start: w.at(*q0, h.start * p),
                    stride: w.rs,
                    count: depth.min(k - q0),
                    len: (h.end * p).min(n) - h.start * p,
                });
                let out = Out { dst: dst.0, dst_rs, col0: 0, col_end: n };
                let panel0 = buf.as_ptr();
                let strips = rows.len().div_ceil(packed::NR);
                for s in 0..strips {
                    let strip = rows.start + s * packed::NR..(rows.start + (s + 1) * packed::NR).min(rows.end);
                    // SAFETY: tasks write disjoint (rows × panel columns) blocks of `dst`,
                    // inside it (checked by the caller); `buf` holds `g.len()` whole
                    // zero-padded `kc × p` panels.
                    unsafe { packed::depth_block(isa, &out, a.cols(p0, kc), g.clone(), strip, p0 > 0 || accumulate, |j| panel0.add((j - g.start) * kc * p)) };
                    if let Some(next) = next {
                        let (i0, i1) = (next.count * s / strips, next.count * (s + 1) / strips);
                        prefetch_runs(w.data, Runs { start: (next.start as isize + i0 as isize * next.stride) as usize, count: i1 - i0, ..next });
                    }
                }
            }
        });
    });
}

/// At most this many rows of `a` per pass of [`by_columns`].
const ROW_BLOCK: usize = 256;
/// Floats of `a`'s packed slices per pass of [`by_columns`] (rows × depth block): 384 KiB,
/// which stay in L2 while the weight's columns stream past.
const ROW_BLOCK_FLOATS: usize = 96 * 1024;

/// [`by_columns`]'s depth block (the ISA's: 768 with AVX2, 256 with AVX-512) and rows per
/// pass (AVX2: 128; AVX-512: [`ROW_BLOCK`]). On the AVX2 Zen 3 (BENCHMARKS.md,
/// twenty-first), against 256 deep over 256 rows, alternated with the order swapped: the
/// tied unembedding's product 1.06x at 128 rows (10 pairs; 1.06–1.09x in three earlier
/// runs), level at 1,024 (1.02x): a third of the micro-kernel calls, each adding into its
/// tile a third as often.
fn columns_blocking(isa: packed::Isa) -> (usize, usize) {
    let kc = isa.half_kc();
    (kc, (ROW_BLOCK_FLOATS / kc).min(ROW_BLOCK))
}
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
/// `kc` values, into a buffer the micro-kernel broadcasts from (`kc × 6` floats, in L1).
/// Every weight element is widened once per pass of rows ([`columns_blocking`]) and read in order: no
/// transposing scatter into panels. The micro-kernels write a tile whose columns are
/// contiguous (their fast path); it is added to `dst` once its whole depth is summed, so
/// `dst`'s row stride (a power of two for most models: every row of a block in one cache
/// set) is never walked by the micro-kernels.
pub(super) fn by_columns(dst: &mut [f32], dst_rs: usize, a: MatRef, w: HalfRef, accumulate: bool, isa: packed::Isa) {
    let (m, k, n) = (a.rows, a.cols, w.cols);
    let (p, nr) = (isa.panel(), packed::NR);
    let lhs = pack_row_panels(a, p);
    let groups = n.div_ceil(nr);
    let threads = pool::threads();
    let parallel = threads > 1 && m.saturating_mul(k).saturating_mul(n) >= packed::SPLIT_MIN_MACS;
    let per_task = if parallel { groups.div_ceil(threads * packed::TASKS_PER_THREAD) } else { groups };
    let (kc, block_rows) = columns_blocking(isa);
    let panels_per_block = (block_rows / p).max(1);
    let ptr = SendPtr(dst.as_mut_ptr());
    let job = ColumnsJob { lhs: &lhs, w, m, isa, kc };
    let task = |t: usize| {
        let dst = ptr;
        let task_groups = t * per_task..((t + 1) * per_task).min(groups);
        let (mut buf, mut tile) = (PANELS.take(), TILE.take());
        buf.resize(nr * kc, 0.0);
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
pub(super) fn pack_row_panels(a: MatRef, p: usize) -> Vec<f32> {
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
    /// The depth block ([`columns_blocking`]).
    kc: usize,
}

impl ColumnsJob<'_> {
    /// The product of the row panels `panels` with the weight's columns `cols`, over the
    /// whole depth, into `tile` (column `c` at `tile[c · ts ..]`, `ts` the block's rows in
    /// whole panels, returned). `buf` holds the widened columns.
    fn multiply_tile(&self, tile: &mut [f32], buf: &mut [f32], cols: std::ops::Range<usize>, panels: std::ops::Range<usize>) -> usize {
        let (w, isa) = (self.w, self.isa);
        let (k, p, nr) = (w.rows, isa.panel(), packed::NR);
        let ts = panels.len() * p;
        for p0 in (0..k).step_by(self.kc) {
            let kc = self.kc.min(k - p0);
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
    if w.cs == 1 && w.rs > 0 {
        if !cols.len().is_multiple_of(p) {
            let (j, width) = (panels - 1, cols.len() % p);
            buf[j * kc * p..].chunks_exact_mut(p).for_each(|row| row[width..].fill(0.0));
        }
        let rows = Rows { start: w.at(depth.start, cols.start), rs: w.rs as usize, rows: kc, cols: cols.len() };
        widen_to_panels(w.kind, w.data, rows, buf, p);
        return;
    }
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
