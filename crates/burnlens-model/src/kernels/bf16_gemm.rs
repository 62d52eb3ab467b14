//! Products in bf16 arithmetic: `dst (+)= a · w` with both operands rounded to bf16 and every
//! sum in f32 ([`super::compute::Compute::Bf16`]).
//!
//! On a CPU with AVX512_BF16 a micro-kernel of `vdpbf16ps` computes a `64 × 6` block of the
//! product: per pair of `k` it loads four vectors of sixteen rows of `a` (a panel,
//! [`RowPanels`]) and broadcasts one 32-bit pair from each of six columns of the weight
//! ([`Cols`], read in place for a bf16 Hugging Face weight), 24 accumulators of sixteen
//! outputs. Each task owns a tile of [`TILE_COLS`] columns by [`BLOCK_PANELS`] panels
//! (column-contiguous, in L2) that the micro-kernel sums into over depth blocks of
//! [`KC_PAIRS`] pairs (the block's `a` stays in L2, a group's six columns in L1), and adds the
//! tile to `dst` once its whole depth is summed. Tasks are tiles: groups of columns, and
//! blocks of rows where the rows are many (training).
//!
//! Where the CPU has AMX tiles, blocks of 32 columns run on them instead
//! ([`super::bf16_amx`]), and a constant weight is kept as panels of its columns so that the
//! product is taken transposed and the tiles' sums reach `dst` with no transposition
//! ([`matmul_bf16_panels`]). Whether `--compute bf16` takes this kernel at all is
//! [`super::bf16_path`]'s choice; [`emulate`] is the portable reference: both operands
//! rounded to bf16 values held in f32 and multiplied by the f32 product (a product of two
//! bf16 values is exact in f32, so only the order of the sums differs), slower than f32.

use std::cell::RefCell;
use std::sync::Arc;

use burn::backend::flex::FlexTensor;

pub use super::bf16_pack::RowPanels;
use super::bf16_pack::{Cols, ColsBuf, PANEL_ROWS};
use super::bf16_round::round_slice;
use super::gemm::{MatRef, matmul, nothing_to_multiply};
pub use super::kept::View;
use super::kept::{Layout, kept};
use super::lines::LineBuf;
use super::packed::SPLIT_MIN_MACS;
use super::pool::{self, SendPtr};

/// Weight columns per micro-kernel call (broadcast operands).
const NB: usize = 6;
/// Columns per task tile: sixteen micro-kernel groups.
pub const TILE_COLS: usize = 16 * NB;
/// Panels of rows per task tile (256 rows).
pub const BLOCK_PANELS: usize = 4;
/// Columns and panels per task tile where the product is taken transposed on AMX tiles.
const AMX_TILE_COLS: usize = 128;
const AMX_BLOCK_PANELS: usize = 2;
/// Pairs per depth block: a block's four panels (256 KiB) stay in L2, a group's six
/// columns (6 KiB) in L1.
pub const KC_PAIRS: usize = 256;

/// Whether this CPU has the bf16 instructions the kernel needs (AVX512_BF16 and AVX-512F,
/// and `BURNLENS_ISA` is not `baseline`). Whether `--compute bf16` uses them is
/// [`super::bf16_path`]'s choice.
pub fn instructions() -> bool {
    super::simd::has_avx512_bf16()
}

/// `dst[m, n] (+)= a[m, k] · w` in bf16 arithmetic, `dst` row-major with row stride
/// `dst_rs`.
pub fn matmul_bf16(dst: &mut [f32], dst_rs: usize, a: MatRef, w: Cols, accumulate: bool) {
    matmul_bf16_on(dst, dst_rs, a, w, accumulate, super::bf16_amx::available());
}

/// [`matmul_bf16`], on AMX tiles where `amx` (and the CPU has them).
fn matmul_bf16_on(dst: &mut [f32], dst_rs: usize, a: MatRef, w: Cols, accumulate: bool, amx: bool) {
    let (m, k, n) = (a.rows, a.cols, w.n);
    assert_eq!(w.k, k, "matmul_bf16: inner dimensions {k} and {}", w.k);
    if nothing_to_multiply(dst, dst_rs, [m, k, n], accumulate, "matmul_bf16") {
        return;
    }
    a.check();
    assert!(w.n == 0 || w.offset + (w.n - 1) * w.ld + 2 * w.pairs() <= w.data.len(), "matmul_bf16: weight view out of bounds");
    if instructions() {
        tiled(dst, dst_rs, &RowPanels::pack(a), w, accumulate, false, amx && super::bf16_amx::available());
    } else {
        emulate(dst, dst_rs, a, w, accumulate);
    }
}

/// `dst (+)= a · b` for an f32 `b` (any strides) rounded per call: a weight being trained, a
/// gradient.
///
/// The weight side is read a column at a time, so `b` is transposed as it is rounded unless
/// its columns are contiguous. Where transposing `a` instead costs less (none at all when
/// `a`'s rows are contiguous: a weight `[d_in, d_out]` being trained, `W_E` in the
/// unembedding's `dx`; `xᵀ` of `dW = xᵀ dy` when `d_in < d_out`) the product is taken
/// transposed, `(a b)ᵀ = bᵀ aᵀ`: `bᵀ` packs as rows, `aᵀ`'s columns are `a`'s rows, and the
/// tile's columns land as rows of `dst`.
pub fn matmul_bf16_f32(dst: &mut [f32], dst_rs: usize, a: MatRef, b: MatRef, accumulate: bool) {
    b.check();
    // What each orientation transposes while it rounds: `b` (`k · n` values) unless its
    // columns are contiguous, or, taken transposed, `a` (`m · k`) unless its rows are.
    let (m, k, n) = (a.rows, a.cols, b.cols);
    let straight = if b.rs == 1 { 0 } else { k * n };
    let swapped = if a.cs == 1 { 0 } else { m * k };
    if instructions() && swapped < straight {
        assert_eq!(b.rows, k, "matmul_bf16_f32: inner dimensions {k} and {}", b.rows);
        if nothing_to_multiply(dst, dst_rs, [m, k, n], accumulate, "matmul_bf16_f32") {
            return;
        }
        a.check();
        return tiled(dst, dst_rs, &RowPanels::pack(b.t()), ColsBuf::from_f32(a.t()).view(), accumulate, true, super::bf16_amx::available());
    }
    matmul_bf16(dst, dst_rs, a, ColsBuf::from_f32(b).view(), accumulate);
}

/// `dst (+)= a · w` for a constant weight `w: [k, n]` kept as panels of its columns
/// (`wᵀ` packed, [`kept_panels`]), on AMX tiles where the CPU has them: the product is taken
/// transposed, the tiles' `C` rows being the weight's columns and their columns the rows of
/// `a`, so a task's tile goes to `dst` a row at a time with no transposition (the columns'
/// orientation, [`matmul_bf16`], spent a quarter of its time transposing: this one ran
/// 10–35% faster on GPT-2's products on a 2-core Xeon with AMX, 2026-12-02).
pub fn matmul_bf16_panels(dst: &mut [f32], dst_rs: usize, a: MatRef, w: &RowPanels, accumulate: bool) {
    let (m, k, n) = (a.rows, a.cols, w.rows);
    assert_eq!(w.pairs, k.div_ceil(2), "matmul_bf16_panels: inner dimension {k} but the weight's panels hold {} pairs", w.pairs);
    if nothing_to_multiply(dst, dst_rs, [m, k, n], accumulate, "matmul_bf16_panels") {
        return;
    }
    a.check();
    assert!(instructions(), "matmul_bf16_panels: no AVX512_BF16 here (its callers take it where bf16_path says amx)");
    tiled(dst, dst_rs, w, ColsBuf::from_f32(a.t()).view(), accumulate, true, super::bf16_amx::available());
}

/// The panels of a constant weight's columns (the view `view` of `owner`, `[k, n]`), made by
/// `make` at first use and kept beside it ([`super::kept`]); `None` where the copies' budget
/// has no room.
pub fn kept_panels(owner: &FlexTensor, view: View, make: impl FnOnce() -> RowPanels) -> Option<Arc<RowPanels>> {
    let [k, n] = view.dims;
    kept(owner, view, Layout::Bf16Panels, n.div_ceil(PANEL_ROWS) * PANEL_ROWS * k.div_ceil(2) * 4, || Some(make()))
}

/// The rounded columns of a constant weight (the view `view` of `owner`, `[k, n]`), made by
/// `make` at first use and kept beside it ([`super::kept`]); `None` where the copies' budget
/// has no room.
pub fn kept_cols(owner: &FlexTensor, view: View, make: impl FnOnce() -> ColsBuf) -> Option<Arc<ColsBuf>> {
    let [k, n] = view.dims;
    kept(owner, view, Layout::Bf16Cols, ColsBuf::ld(k) * n * 2, || Some(make()))
}

/// The portable reference: operands rounded to bf16 values in f32, the f32 product.
fn emulate(dst: &mut [f32], dst_rs: usize, a: MatRef, w: Cols, accumulate: bool) {
    let (m, k, n) = (a.rows, a.cols, w.n);
    let mut a_round: Vec<f32> = (0..m).flat_map(|r| a.row_values(r)).collect();
    round_slice(&mut a_round);
    let ld = 2 * w.pairs();
    let w_wide: Vec<f32> = (0..n).flat_map(|j| w.column(j)).collect();
    let b = MatRef { data: &w_wide, offset: 0, rows: k, cols: n, rs: 1, cs: ld as isize };
    matmul(dst, dst_rs, MatRef::row_major(&a_round, m, k), b, accumulate);
}

thread_local! {
    /// Each thread's tile (reused from product to product).
    /// Its columns start on cache lines, as the AMX tiles' stores want ([`super::lines`]).
    static TILE: RefCell<LineBuf<f32>> = RefCell::new(LineBuf::default());
}

/// The AVX512_BF16 product over packed rows (see the module's note), blocks of 32 columns on
/// AMX tiles where `amx` ([`super::bf16_amx`]); `transposed`: `dst` receives the product's
/// transpose (row `c` of `dst` is the product's column `c`).
fn tiled(dst: &mut [f32], dst_rs: usize, a: &RowPanels, w: Cols, accumulate: bool, transposed: bool, amx: bool) {
    let (m, n, pairs) = (a.rows, w.n, a.pairs);
    // Taken transposed on AMX tiles (a constant weight's panels against the rows of `a`): a
    // task covers 128 of those rows, all of a short prompt's, so that each block of the
    // weight is read once, and two panels of the weight's columns.
    let (tile_cols, block) = if transposed && amx { (AMX_TILE_COLS, AMX_BLOCK_PANELS) } else { (TILE_COLS, BLOCK_PANELS) };
    let col_tiles = n.div_ceil(tile_cols);
    let panels = a.panels();
    let threads = pool::threads();
    let parallel = threads > 1 && m.saturating_mul(2 * pairs).saturating_mul(n) >= SPLIT_MIN_MACS;
    // Blocks of rows: a depth block of their panels stays in L2; their tiles are tasks too.
    let row_blocks = panels.div_ceil(block);
    let tile_rows = block.min(panels) * PANEL_ROWS;
    let ptr = SendPtr(dst.as_mut_ptr());
    let task = |t: usize| {
        let dst = ptr;
        let (ct, rb) = (t / row_blocks, t % row_blocks);
        let cols = ct * tile_cols..((ct + 1) * tile_cols).min(n);
        let panel_range = rb * block..((rb + 1) * block).min(panels);
        let mut tile = TILE.take();
        tile.resize(tile_cols * tile_rows);
        #[cfg(target_arch = "x86_64")]
        let tiles = amx.then(super::bf16_amx::Tiles::configure);
        for p0 in (0..pairs).step_by(KC_PAIRS) {
            let kc = KC_PAIRS.min(pairs - p0);
            // The AVX512_BF16 kernel over columns `cols`, pairs `p0 + done..p0 + kc`.
            let vector = |cols: std::ops::Range<usize>, done: usize, tile: &mut [f32]| {
                for c in cols.clone().step_by(NB) {
                    let nb = NB.min(cols.end - c);
                    for (i, panel) in panel_range.clone().enumerate() {
                        let out = tile[(c - ct * tile_cols) * tile_rows + i * PANEL_ROWS..].as_mut_ptr();
                        // SAFETY: the panel holds `pairs × 64` words from `p0`; the weight's
                        // columns `c..c + nb` hold `pairs` readable pairs each (checked by the
                        // caller); `out` has `nb` columns of `tile_rows` floats from here.
                        unsafe { micro_kernel(nb, kc - done, a.at(panel, p0 + done), w.at(c, p0 + done), w.ld, out, tile_rows, p0 + done > 0) };
                    }
                }
            };
            let mut c = cols.start;
            // Blocks of 32 columns on AMX tiles where the CPU has them, the pairs left over
            // and the columns past the last block on the vector kernel.
            #[cfg(target_arch = "x86_64")]
            if let Some(tiles) = &tiles {
                while c + super::bf16_amx::BLOCK_COLS <= cols.end {
                    let out = tile[(c - cols.start) * tile_rows..].as_mut_ptr();
                    // SAFETY: as for the vector kernel, for 32 columns and whole panels.
                    let done = unsafe { super::bf16_amx::depth_block(tiles, a, panel_range.clone(), &w, c, p0, kc, out, tile_rows, p0 > 0) };
                    if done < kc {
                        vector(c..c + super::bf16_amx::BLOCK_COLS, done, &mut tile);
                    }
                    c += super::bf16_amx::BLOCK_COLS;
                }
            }
            vector(c..cols.end, 0, &mut tile);
        }
        let rows = panel_range.start * PANEL_ROWS..(panel_range.end * PANEL_ROWS).min(m);
        let block = Block { tile: &tile, tile_rows, rows, cols };
        // SAFETY: tasks write disjoint (rows × columns) blocks of `dst` (swapped when
        // `transposed`), inside it (checked by the caller).
        unsafe { block.write(dst.0, dst_rs, accumulate, transposed) };
        TILE.set(tile);
    };
    let tasks = col_tiles * row_blocks;
    if parallel {
        pool::run(tasks, task);
    } else {
        (0..tasks).for_each(task);
    }
}

/// A task's summed tile: column `c` of the product (`cols.start + c`) holds `rows` at
/// stride `tile_rows`.
struct Block<'a> {
    tile: &'a [f32],
    tile_rows: usize,
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
}

impl Block<'_> {
    /// Add (or copy) the tile into `dst`: row `r` of the product to row `r` of `dst`, or,
    /// `transposed`, column `c` to row `c` (a contiguous run: the tile's own layout).
    ///
    /// # Safety
    /// `dst` must be valid for the block's rows and columns (swapped when `transposed`) at
    /// stride `dst_rs`, and nothing else may access them meanwhile.
    unsafe fn write(&self, dst: *mut f32, dst_rs: usize, accumulate: bool, transposed: bool) {
        let (rows, cols) = (self.rows.clone(), self.cols.clone());
        let put = |d: &mut f32, v: f32| if accumulate { *d += v } else { *d = v };
        if transposed {
            for c in cols.clone() {
                let d = unsafe { std::slice::from_raw_parts_mut(dst.add(c * dst_rs + rows.start), rows.len()) };
                let src = &self.tile[(c - cols.start) * self.tile_rows..][..rows.len()];
                if accumulate {
                    d.iter_mut().zip(src).for_each(|(d, &t)| *d += t);
                } else {
                    d.copy_from_slice(src);
                }
            }
            return;
        }
        // Blocks of 16 × 16 transposed in registers, the edges one value at a time.
        let (full_rows, full_cols) = (rows.len() / 16 * 16, cols.len() / 16 * 16);
        #[cfg(target_arch = "x86_64")]
        for r in (0..full_rows).step_by(16) {
            for c in (0..full_cols).step_by(16) {
                let at = unsafe { dst.add((rows.start + r) * dst_rs + cols.start + c) };
                unsafe { transpose_into(self.tile.as_ptr().add(c * self.tile_rows + r), self.tile_rows, at, dst_rs, accumulate) };
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let (full_rows, full_cols) = (0usize, 0usize);
        for r in 0..rows.len() {
            let d = unsafe { std::slice::from_raw_parts_mut(dst.add((rows.start + r) * dst_rs + cols.start), cols.len()) };
            let first = if r < full_rows { full_cols } else { 0 };
            for (c, d) in d.iter_mut().enumerate().skip(first) {
                put(d, self.tile[c * self.tile_rows + r]);
            }
        }
    }
}

/// `dst[i][j] (+)= src[j][i]` for a 16 × 16 block: `src` columns of 16 at stride `src_ld`,
/// `dst` rows at stride `dst_ld`.
///
/// # Safety
/// Both blocks must be valid; the CPU must have AVX-512F (every caller runs after
/// [`native`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn transpose_into(src: *const f32, src_ld: usize, dst: *mut f32, dst_ld: usize, accumulate: bool) {
    use std::arch::x86_64::*;
    unsafe {
        let rows = super::transpose16::transpose16(std::array::from_fn(|i| _mm512_loadu_ps(src.wrapping_add(i * src_ld))));
        for (row, v) in rows.into_iter().enumerate() {
            let d = dst.wrapping_add(row * dst_ld);
            let v = if accumulate { _mm512_add_ps(_mm512_loadu_ps(d), v) } else { v };
            _mm512_storeu_ps(d, v);
        }
    }
}

/// One micro-kernel call for `nb` (1 to [`NB`]) columns.
///
/// # Safety
/// As for [`kernel`]; the CPU must have AVX512_BF16 ([`native`]).
unsafe fn micro_kernel(nb: usize, kc: usize, a: *const u32, w: *const u16, ldw: usize, out: *mut f32, ldo: usize, add: bool) {
    #[cfg(target_arch = "x86_64")]
    unsafe {
        match nb {
            1 => kernel::<1>(kc, a, w, ldw, out, ldo, add),
            2 => kernel::<2>(kc, a, w, ldw, out, ldo, add),
            3 => kernel::<3>(kc, a, w, ldw, out, ldo, add),
            4 => kernel::<4>(kc, a, w, ldw, out, ldo, add),
            5 => kernel::<5>(kc, a, w, ldw, out, ldo, add),
            _ => kernel::<NB>(kc, a, w, ldw, out, ldo, add),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("bf16 micro-kernels are x86-64 only: {nb} {kc} {a:?} {w:?} {ldw} {out:?} {ldo} {add}")
}

/// `out[j][0..64] (+)= Σ_p a[p][0..64] · w_j[p]` over `kc` pairs for `C` columns `w_j =
/// w + j · ldw`: 4 × `C` accumulators of sixteen rows.
///
/// # Safety
/// `a` must be readable for `kc × 64` words, each `w_j` for `2 · kc` values, `out` for `C`
/// columns of 64 floats at stride `ldo`; the CPU must have AVX512_BF16.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn kernel<const C: usize>(kc: usize, a: *const u32, w: *const u16, ldw: usize, out: *mut f32, ldo: usize, add: bool) {
    use std::arch::x86_64::*;
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); 4]; C];
        if add {
            for (j, acc) in acc.iter_mut().enumerate() {
                for (v, acc) in acc.iter_mut().enumerate() {
                    *acc = _mm512_loadu_ps(out.add(j * ldo + 16 * v));
                }
            }
        }
        // Pointers bumped with `wrapping_add`: the debug build's precondition checks on `add`
        // (this crate keeps debug assertions in the dev profile) halved the loop's speed.
        let mut cols: [*const u32; C] = std::array::from_fn(|j| w.wrapping_add(j * ldw).cast::<u32>());
        let mut row = a;
        for _ in 0..kc {
            let av: [__m512bh; 4] = std::array::from_fn(|v| std::mem::transmute(_mm512_loadu_si512(row.wrapping_add(16 * v).cast())));
            for j in 0..C {
                let bw: __m512bh = std::mem::transmute(_mm512_set1_epi32(std::ptr::read_unaligned(cols[j]) as i32));
                for v in 0..4 {
                    acc[j][v] = _mm512_dpbf16_ps(acc[j][v], av[v], bw);
                }
                cols[j] = cols[j].wrapping_add(1);
            }
            row = row.wrapping_add(PANEL_ROWS);
        }
        for (j, acc) in acc.iter().enumerate() {
            for (v, acc) in acc.iter().enumerate() {
                _mm512_storeu_ps(out.add(j * ldo + 16 * v), *acc);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::bf16_round::{dot, from_bf16, to_bf16};
    use crate::kernels::gemm::tests::vals;
    use crate::kernels::half_format::{Half, HalfRef};

    /// `a`'s rows and `w`'s columns rounded to bf16 by the scalar rule.
    fn rounded(a: &MatRef, w: &Cols) -> (Vec<Vec<u16>>, Vec<Vec<u16>>) {
        let rows = (0..a.rows).map(|r| a.row_values(r).map(to_bf16).collect()).collect();
        let cols = (0..w.n).map(|j| w.column(j).take(w.k).map(to_bf16).collect()).collect();
        (rows, cols)
    }

    const SHAPES: [(usize, usize, usize); 9] =
        [(1, 5, 3), (63, 7, 6), (65, 513, 13), (130, 64, 97), (3, 1, 1), (200, 40, 200), (64, 600, 6), (0, 3, 4), (5, 0, 2)];

    #[test]
    fn the_bf16_instructions_sum_each_output_as_the_scalar_rule_does() {
        if !instructions() {
            eprintln!("no AVX512_BF16 here: the emulated path is tested below");
            return;
        }
        for (m, k, n) in SHAPES {
            let a_data = vals(m * k, 1);
            let b_data = vals(k * n, 2);
            let w = ColsBuf::from_f32(MatRef::row_major(&b_data, k, n));
            let a = MatRef::row_major(&a_data, m, k);
            let (rows, cols) = rounded(&a, &w.view());
            for accumulate in [false, true] {
                let mut dst = vec![0.25f32; m * n];
                matmul_bf16_on(&mut dst, n, a, w.view(), accumulate, false);
                for r in 0..m {
                    for j in 0..n {
                        let sum = dot(0.0, &rows[r], &cols[j]);
                        let want = if accumulate { 0.25 + sum } else { sum };
                        assert_eq!(dst[r * n + j].to_bits(), want.to_bits(), "{m}x{k}x{n} acc={accumulate} [{r},{j}]: {} vs {want}", dst[r * n + j]);
                    }
                }
            }
        }
    }

    /// AMX tiles (where the CPU has them) against the f64 product of the rounded operands, on
    /// shapes with whole blocks, pairs left over and columns past the last block; and the
    /// vector kernel within the same bound.
    #[test]
    fn amx_tiles_equal_the_rounded_product() {
        if !super::super::bf16_amx::available() {
            eprintln!("no AMX here (or BURNLENS_AMX=0): the tiles are not tested");
            return;
        }
        for (m, k, n) in [(64, 32, 32), (130, 64, 97), (200, 40, 200), (70, 600, 70), (1, 1000, 64)] {
            let (a_data, b_data) = (vals(m * k, 7), vals(k * n, 8));
            let w = ColsBuf::from_f32(MatRef::row_major(&b_data, k, n));
            let a = MatRef::row_major(&a_data, m, k);
            let (rows, cols) = rounded(&a, &w.view());
            let (mut tiles, mut vector) = (vec![0.5f32; m * n], vec![0.5f32; m * n]);
            matmul_bf16_on(&mut tiles, n, a, w.view(), true, true);
            matmul_bf16_on(&mut vector, n, a, w.view(), true, false);
            let mut same = 0;
            for r in 0..m {
                for j in 0..n {
                    let terms = rows[r].iter().zip(&cols[j]).map(|(&x, &y)| from_bf16(x) as f64 * from_bf16(y) as f64);
                    let (want, scale) = terms.fold((0.5, 0.5), |(s, t), v| (s + v, t + v.abs()));
                    let (t, v) = (tiles[r * n + j], vector[r * n + j]);
                    same += (t == v) as usize;
                    assert!((t as f64 - want).abs() <= 1e-5 * (scale + 1.0), "tiles {m}x{k}x{n} [{r},{j}]: {t} vs {want}");
                }
            }
            eprintln!("{m}x{k}x{n}: AMX equals the vector kernel bit for bit on {same} of {} outputs", m * n);
        }
    }

    /// A constant weight's panels (f32, and bf16 or f16 widened), the product taken
    /// transposed: on AMX tiles where the CPU has them, else the vector kernel; against the
    /// f64 product of the rounded operands, accumulating, on shapes with whole tile blocks,
    /// rows and pairs left over, and more rows than one task covers.
    #[test]
    fn a_weights_panels_give_the_rounded_product() {
        if !instructions() {
            eprintln!("no AVX512_BF16 here: the panels' product is not taken here");
            return;
        }
        for (m, k, n) in [(64, 32, 32), (130, 64, 97), (200, 40, 200), (70, 600, 70), (1, 1000, 64), (300, 66, 129)] {
            let (a_data, b_data) = (vals(m * k, 9), vals(k * n, 10));
            let b = MatRef::row_major(&b_data, k, n);
            let bits: Vec<u16> = b_data.iter().map(|&v| to_bf16(v)).collect();
            let half = HalfRef { data: &bits, kind: Half::Bf16, offset: 0, rows: k, cols: n, rs: n as isize, cs: 1 };
            let a = MatRef::row_major(&a_data, m, k);
            let (rows, cols) = rounded(&a, &ColsBuf::from_f32(b).view());
            for (what, panels) in [("f32", RowPanels::pack(b.t())), ("bf16", RowPanels::pack_half(half.t()))] {
                let mut dst = vec![0.5f32; m * n];
                matmul_bf16_panels(&mut dst, n, a, &panels, true);
                for r in 0..m {
                    for j in 0..n {
                        let terms = rows[r].iter().zip(&cols[j]).map(|(&x, &y)| from_bf16(x) as f64 * from_bf16(y) as f64);
                        let (want, scale) = terms.fold((0.5, 0.5), |(s, t), v| (s + v, t + v.abs()));
                        let got = dst[r * n + j];
                        assert!((got as f64 - want).abs() <= 1e-5 * (scale + 1.0), "{what} panels {m}x{k}x{n} [{r},{j}]: {got} vs {want}");
                    }
                }
            }
        }
    }

    #[test]
    fn every_path_equals_the_rounded_product_in_any_layout() {
        for (m, k, n) in SHAPES {
            let a_data = vals(m * k + 3, 3);
            let b_data = vals(k * n, 4);
            let bt: Vec<f32> = (0..n * k).map(|i| b_data[(i % k) * n + i / k]).collect();
            let at: Vec<f32> = (0..m * k).map(|i| a_data[(i % m) * k + i / m]).collect();
            let a_views = [
                MatRef::row_major(&a_data, m, k),
                MatRef::row_major(&at, k, m).t(),
                MatRef { data: &a_data, offset: 3, rows: m, cols: k, rs: k as isize, cs: 1 },
            ];
            for b in [MatRef::row_major(&b_data, k, n), MatRef::row_major(&bt, n, k).t()] {
                let w = ColsBuf::from_f32(b);
                for a in a_views {
                    let (rows, cols) = rounded(&a, &w.view());
                    let mut dst = vec![0.0f32; m * n];
                    matmul_bf16(&mut dst, n, a, w.view(), false);
                    let mut emu = vec![0.0f32; m * n];
                    emulate(&mut emu, n, a, w.view(), false);
                    // Rounded per product (taken transposed where both operands' rows are
                    // contiguous), accumulating.
                    let mut direct = vec![0.5f32; m * n];
                    matmul_bf16_f32(&mut direct, n, a, b, true);
                    direct.iter_mut().for_each(|x| *x -= 0.5);
                    for r in 0..m {
                        for j in 0..n {
                            let terms = rows[r].iter().zip(&cols[j]).map(|(&x, &y)| from_bf16(x) as f64 * from_bf16(y) as f64);
                            let (want, scale) = terms.fold((0.0, 0.0), |(s, t), v| (s + v, t + v.abs()));
                            for (what, got) in [("kernel", dst[r * n + j]), ("emulated", emu[r * n + j]), ("per product", direct[r * n + j])] {
                                assert!((got as f64 - want).abs() <= 1e-5 * (scale + 1.0), "{what} {m}x{k}x{n} [{r},{j}]: {got} vs {want}");
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_bf16_weight_is_read_in_place_and_equals_its_copy() {
        let (k, n, m) = (34, 9, 70);
        let w_bits: Vec<u16> = vals(n * k + 1, 5).into_iter().map(to_bf16).collect();
        // `[n, k]` row-major from offset 1, seen as `[k, n]`.
        let view = HalfRef { data: &w_bits, kind: Half::Bf16, offset: 1, rows: k, cols: n, rs: 1, cs: k as isize };
        let in_place = Cols::in_place(&view).expect("a transposed bf16 view with even k is read in place");
        assert!(Cols::in_place(&HalfRef { rows: k - 1, ..view }).is_none() && Cols::in_place(&HalfRef { kind: Half::F16, ..view }).is_none());
        let copy = ColsBuf::from_half(view);
        let a_data = vals(m * k, 6);
        let a = MatRef::row_major(&a_data, m, k);
        let (mut x, mut y) = (vec![0.0; m * n], vec![0.0; m * n]);
        matmul_bf16(&mut x, n, a, in_place, false);
        matmul_bf16(&mut y, n, a, copy.view(), false);
        assert_eq!(x, y);
    }
}
