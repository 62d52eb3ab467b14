//! The two operands of a bf16 product as its micro-kernel reads them, with `k` in adjacent
//! pairs (the `vdpbf16ps` unit: one 32-bit lane holds values `2p` and `2p + 1` of a dot
//! product).
//!
//! - **Row panels** ([`RowPanels`]), the activations: `a: [m, k]` (f32, any strides) rounded
//!   to bf16 and laid out in panels of [`PANEL_ROWS`] rows, pair `p` of the panel's rows
//!   contiguous (`[panel][pair][row]`, 32-bit pairs), zero-padded past `m` and past an odd
//!   `k`. The micro-kernel loads four vectors of sixteen rows per pair. Packed per product:
//!   `m · k` values against `m · k · n` multiply-adds.
//! - **Columns** ([`Cols`]), the weight: `w: [k, n]` read one column at a time, `k`
//!   contiguous, so that pair `p` of a column is one 32-bit word the micro-kernel broadcasts.
//!   A bf16 Hugging Face weight (`[out, in]` row-major, seen through its transposed view) is
//!   already that layout and is read in place, with no copy; an f32 or f16 weight, or one
//!   laid out otherwise, is rounded once into a [`ColsBuf`] (`[n][k]` bf16, half an f32
//!   weight's bytes).

use std::cell::RefCell;

use super::bf16_round::{pair, to_bf16, to_bf16_pairs, to_bf16_slice};
use super::gemm::MatRef;
use super::half_format::{Half, HalfRef, widen_one};
use super::lines::{LINE, LineBuf};
use super::pages::Plain;
use super::pool::{self, SendPtr};

/// Rows per panel: four vectors of sixteen f32 outputs.
pub const PANEL_ROWS: usize = 64;
/// Columns and rows per block of [`ColsBuf::fill_transposed`].
const T_COLS: usize = 64;
const T_ROWS: usize = 128;
/// Pairs per block of [`RowPanels::pack`]'s transposition (its writes stay in L1).
const PAIR_BLOCK: usize = 64;

/// The activations of a bf16 product (see the module's note).
pub struct RowPanels {
    pub rows: usize,
    /// Pairs per row (`k` rounded up to even, halved).
    pub pairs: usize,
    pub data: LineBuf<u32>,
}

impl RowPanels {
    pub fn panels(&self) -> usize {
        self.rows.div_ceil(PANEL_ROWS)
    }

    /// Panel `i` from pair `p0`.
    pub fn at(&self, panel: usize, p0: usize) -> *const u32 {
        self.data[(panel * self.pairs + p0) * PANEL_ROWS..].as_ptr()
    }

    /// Round and pack `a` (checked in bounds by the caller), one task per panel.
    pub fn pack(a: MatRef) -> Self {
        Self::pack_each(a.rows, a.cols, |rows, pairs, panel| pack_panel(a, rows, pairs, panel))
    }

    /// [`RowPanels::pack`] for a half matrix (checked in bounds by the caller): each panel's
    /// rows widened to f32 first (f16 values round to bf16; bf16 ones keep their bits).
    pub fn pack_half(a: HalfRef) -> Self {
        let k = a.cols;
        Self::pack_each(a.rows, k, |rows, pairs, panel| {
            let wide: Vec<f32> = rows.clone().flat_map(|r| (0..k).map(move |c| widen_one(a.kind, a.data[a.at(r, c)]))).collect();
            pack_panel(MatRef::row_major(&wide, rows.len(), k), 0..rows.len(), pairs, panel);
        })
    }

    /// `m × k` values packed by `fill(rows, pairs, panel)`, one task per panel of rows.
    fn pack_each(m: usize, k: usize, fill: impl Fn(std::ops::Range<usize>, usize, &mut [u32]) + Sync) -> Self {
        let pairs = k.div_ceil(2);
        let mut data = scratch(&SPARE_PANELS, m.div_ceil(PANEL_ROWS) * pairs * PANEL_ROWS);
        let out = SendPtr(data.as_mut_ptr());
        pool::run(m.div_ceil(PANEL_ROWS), |i| {
            let out = out;
            // SAFETY: task `i` writes panel `i` alone, inside `data`.
            let panel = unsafe { std::slice::from_raw_parts_mut(out.0.add(i * pairs * PANEL_ROWS), pairs * PANEL_ROWS) };
            fill(i * PANEL_ROWS..((i + 1) * PANEL_ROWS).min(m), pairs, panel);
        });
        Self { rows: m, pairs, data }
    }
}

impl Drop for RowPanels {
    fn drop(&mut self) {
        give_back(&SPARE_PANELS, std::mem::take(&mut self.data));
    }
}

thread_local! {
    /// The last operand buffers dropped on this thread, reused by the next product: past
    /// glibc's largest mapping threshold (32 MiB) every fresh buffer is fresh pages, and the
    /// kernel zeroing them took 16% of a GPT-2 training step in bf16.
    static SPARE_PANELS: RefCell<LineBuf<u32>> = RefCell::new(LineBuf::default());
    static SPARE_COLS: RefCell<LineBuf<u16>> = RefCell::new(LineBuf::default());
}

/// A buffer of `len` values, in this thread's spare one where it has one: what the last
/// product left there (zeroing it was 4% of a training step), so the packers write every
/// value, padding included.
fn scratch<T: Plain>(spare: &'static std::thread::LocalKey<RefCell<LineBuf<T>>>, len: usize) -> LineBuf<T> {
    let mut v = spare.take();
    v.resize(len);
    v
}

/// Keep `v` as this thread's spare buffer if it is bigger than the one kept.
fn give_back<T: Plain>(spare: &'static std::thread::LocalKey<RefCell<LineBuf<T>>>, v: LineBuf<T>) {
    spare.with(|s| {
        let mut s = s.borrow_mut();
        if v.capacity() > s.capacity() {
            *s = v;
        }
    });
}

/// One panel: `rows` of `a` into `panel` (`[pair][PANEL_ROWS]`), the rows past them zero.
fn pack_panel(a: MatRef, rows: std::ops::Range<usize>, pairs: usize, panel: &mut [u32]) {
    let k = a.cols;
    if rows.len() < PANEL_ROWS {
        panel.chunks_exact_mut(PANEL_ROWS).for_each(|p| p[rows.len()..].fill(0));
    }
    let at = |r: usize, c: usize| if c < k { a.data[(a.offset as isize + r as isize * a.rs + c as isize * a.cs) as usize] } else { 0.0 };
    if a.rs == 1 && k.is_multiple_of(2) {
        // Columns contiguous (`xᵀ` in `dW = xᵀ dy`): pair `p` of sixteen rows is two runs.
        let n = rows.len();
        for p in 0..pairs {
            let lo = (a.offset as isize + (2 * p) as isize * a.cs) as usize + rows.start;
            let hi = (a.offset as isize + (2 * p + 1) as isize * a.cs) as usize + rows.start;
            to_bf16_pairs(&a.data[lo..lo + n], &a.data[hi..hi + n], &mut panel[p * PANEL_ROWS..p * PANEL_ROWS + n]);
        }
        return;
    }
    let mut bits = [0u16; 2 * PAIR_BLOCK];
    for p0 in (0..pairs).step_by(PAIR_BLOCK) {
        let p1 = (p0 + PAIR_BLOCK).min(pairs);
        for (i, r) in rows.clone().enumerate() {
            if a.cs == 1 && 2 * p1 <= k {
                // The row's run rounded in vectors, its pairs then written down the panel.
                let start = (a.offset as isize + r as isize * a.rs) as usize + 2 * p0;
                let bits = &mut bits[..2 * (p1 - p0)];
                to_bf16_slice(&a.data[start..start + bits.len()], bits);
                for (j, v) in bits.chunks_exact(2).enumerate() {
                    panel[(p0 + j) * PANEL_ROWS + i] = v[0] as u32 | (v[1] as u32) << 16;
                }
            } else {
                for p in p0..p1 {
                    panel[p * PANEL_ROWS + i] = pair(at(r, 2 * p), at(r, 2 * p + 1));
                }
            }
        }
    }
}

/// Sixteen rows of sixteen f32 (`src`, row stride `src_ld`) transposed and rounded: column
/// `j` as sixteen bf16 at `dst + j · dst_ld`.
///
/// # Safety
/// Both blocks must be valid; the CPU must have AVX512_BF16.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn round_block(src: *const f32, src_ld: usize, dst: *mut u16, dst_ld: usize) {
    use std::arch::x86_64::*;
    unsafe {
        let cols = super::transpose16::transpose16(std::array::from_fn(|i| _mm512_loadu_ps(src.wrapping_add(i * src_ld))));
        for (j, v) in cols.into_iter().enumerate() {
            let bits: __m256i = std::mem::transmute(_mm512_cvtneps_pbh(v));
            _mm256_storeu_si256(dst.wrapping_add(j * dst_ld).cast(), bits);
        }
    }
}

/// The weight of a bf16 product: column `j`'s pair `p` is the 32-bit word at
/// `data[offset + j · ld + 2p]` (see the module's note). `pairs · 2` values per column are
/// readable (an odd `k`'s last pair ends with a zero).
#[derive(Clone, Copy)]
pub struct Cols<'a> {
    pub data: &'a [u16],
    pub offset: usize,
    pub ld: usize,
    pub k: usize,
    pub n: usize,
}

impl Cols<'_> {
    pub fn pairs(&self) -> usize {
        self.k.div_ceil(2)
    }

    /// Column `j` from pair `p0`.
    pub fn at(&self, j: usize, p0: usize) -> *const u16 {
        self.data[self.offset + j * self.ld + 2 * p0..].as_ptr()
    }

    /// Column `j`'s `k` values (and a padding zero for an odd `k`), as f32.
    pub fn column(&self, j: usize) -> impl Iterator<Item = f32> + '_ {
        let start = self.offset + j * self.ld;
        self.data[start..start + 2 * self.pairs()].iter().map(|&h| super::bf16_round::from_bf16(h))
    }

    /// A half weight read in place where it already has this layout: bf16, each column
    /// contiguous (`rs == 1`, a Hugging Face `[out, in]` weight's transposed view) and `k`
    /// even (no pair straddles two columns).
    pub fn in_place<'a>(w: &HalfRef<'a>) -> Option<Cols<'a>> {
        (w.kind == Half::Bf16 && (w.rs == 1 || w.rows <= 1) && w.rows.is_multiple_of(2) && w.cs >= 0).then_some(Cols {
            data: w.data,
            offset: w.offset,
            ld: w.cs as usize,
            k: w.rows,
            n: w.cols,
        })
    }
}

/// A weight rounded into the columns layout (`[n][k]` bf16), each column from the start of a
/// cache line (for the AMX tiles' rows, [`super::lines`]): `k` padded to whole lines, an odd
/// `k`'s last pair ending with a zero.
pub struct ColsBuf {
    pub k: usize,
    pub n: usize,
    pub data: LineBuf<u16>,
}

impl Drop for ColsBuf {
    fn drop(&mut self) {
        give_back(&SPARE_COLS, std::mem::take(&mut self.data));
    }
}

impl ColsBuf {
    pub fn view(&self) -> Cols<'_> {
        Cols { data: &self.data, offset: 0, ld: Self::ld(self.k), k: self.k, n: self.n }
    }

    /// Values from one column to the next: `k` rounded up to whole cache lines.
    pub fn ld(k: usize) -> usize {
        k.div_ceil(LINE / 2) * (LINE / 2)
    }

    /// Round an f32 matrix `b: [k, n]` (any strides; checked by the caller).
    pub fn from_f32(b: MatRef) -> Self {
        let mut buf = Self::with_room(b.rows, b.cols);
        if b.cs == 1 && b.rs > 0 {
            buf.fill_transposed(b);
            return buf;
        }
        let at = |r: usize, c: usize| b.data[(b.offset as isize + r as isize * b.rs + c as isize * b.cs) as usize];
        buf.fill(|j, col| {
            if b.rs == 1 {
                let start = (b.offset as isize + j as isize * b.cs) as usize;
                to_bf16_slice(&b.data[start..start + b.rows], &mut col[..b.rows]);
            } else {
                col[..b.rows].iter_mut().enumerate().for_each(|(r, d)| *d = to_bf16(at(r, j)));
            }
        });
        buf
    }

    /// Round a half matrix (f16 values round to bf16; bf16 ones copy exactly).
    pub fn from_half(w: HalfRef) -> Self {
        let mut buf = Self::with_room(w.rows, w.cols);
        buf.fill(|j, col| col[..w.rows].iter_mut().enumerate().for_each(|(r, d)| *d = to_bf16(widen_one(w.kind, w.data[w.at(r, j)]))));
        buf
    }

    /// Room for `[n][k]`, the padding value of an odd `k` zero (the fills write the rest).
    fn with_room(k: usize, n: usize) -> Self {
        let ld = Self::ld(k);
        let mut data = scratch(&SPARE_COLS, ld * n);
        if ld > k {
            data.chunks_exact_mut(ld).for_each(|c| c[k] = 0);
        }
        Self { k, n, data }
    }

    /// Rows of `b` contiguous (`cs == 1`): blocks of [`T_COLS`] columns by [`T_ROWS`] rows,
    /// each row's run read in order and written down the block's columns (their runs stay in
    /// L1), one task per block of columns.
    fn fill_transposed(&mut self, b: MatRef) {
        let (k, n, ld) = (b.rows, b.cols, Self::ld(self.k));
        let out = SendPtr(self.data.as_mut_ptr());
        let native = super::simd::has_avx512_bf16();
        pool::run(n.div_ceil(T_COLS), |t| {
            let out = out;
            let cols = t * T_COLS..((t + 1) * T_COLS).min(n);
            for r0 in (0..k).step_by(T_ROWS) {
                let rows = r0..(r0 + T_ROWS).min(k);
                // Whole 16 × 16 blocks in registers where the CPU rounds in vectors.
                let (full_rows, full_cols) = if native { (rows.len() / 16 * 16, cols.len() / 16 * 16) } else { (0, 0) };
                #[cfg(target_arch = "x86_64")]
                for r in (0..full_rows).step_by(16) {
                    for c in (0..full_cols).step_by(16) {
                        let src = (b.offset as isize + (r0 + r) as isize * b.rs) as usize + cols.start + c;
                        let end = src + 15 * b.rs as usize + 16;
                        assert!(end <= b.data.len(), "fill_transposed: block out of bounds");
                        // SAFETY: the block's 16 rows of 16 lie in `b.data` (checked); task `t`
                        // writes its own columns, inside `data`; `native` checked the CPU.
                        unsafe { round_block(b.data.as_ptr().add(src), b.rs as usize, out.0.add((cols.start + c) * ld + r0 + r), ld) };
                    }
                }
                for r in rows {
                    let first = if r - r0 < full_rows { full_cols } else { 0 };
                    let start = (b.offset as isize + r as isize * b.rs) as usize + cols.start;
                    for (i, &v) in b.data[start..start + cols.len()].iter().enumerate().skip(first) {
                        // SAFETY: task `t` writes its own columns, inside `data` (`n · ld` values).
                        unsafe { *out.0.add((cols.start + i) * ld + r) = to_bf16(v) };
                    }
                }
            }
        });
    }

    /// `f(j, column j)` for every column, spread over the kernel threads.
    fn fill(&mut self, f: impl Fn(usize, &mut [u16]) + Sync) {
        let (ld, n) = (Self::ld(self.k), self.n);
        if ld == 0 {
            return;
        }
        let per_task = pool::rows_per_task(ld).max(1);
        let out = SendPtr(self.data.as_mut_ptr());
        pool::run(n.div_ceil(per_task), |t| {
            let out = out;
            for j in t * per_task..((t + 1) * per_task).min(n) {
                // SAFETY: task `t` writes its own columns, inside `data`.
                f(j, unsafe { std::slice::from_raw_parts_mut(out.0.add(j * ld), ld) });
            }
        });
    }
}
