//! Half-precision weights as the kernels read them: which format, a strided view of one,
//! and the exact widening of its elements to f32.

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
pub(crate) struct Runs {
    pub(crate) start: usize,
    pub(crate) stride: isize,
    pub(crate) count: usize,
    pub(crate) len: usize,
}

/// Widen the runs `src` into `dst`, the `r`-th run to `dst[r · dst_stride..][..len]`: one
/// dispatch for a whole block (a call per short run cost more than the widening).
pub(crate) fn widen_runs(kind: Half, src: &[u16], runs: Runs, dst: &mut [f32], dst_stride: usize) {
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

/// Where [`widen_to_panels`] reads: `rows` rows of `cols` bits, the `r`-th starting at
/// `start + r · rs` (each row contiguous).
#[derive(Clone, Copy)]
pub(crate) struct Rows {
    pub(crate) start: usize,
    pub(crate) rs: usize,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
}

/// Widen `src` row by row into panels of `p` columns: panel `j` at `dst[j · rows · p..]`, its
/// row `r` at `+ r · p` (a partial last panel's padding is left as it is). Every row is read
/// front to back, so the hardware prefetcher streams it (reading one panel's few columns
/// down all rows missed the cache on every row).
pub(crate) fn widen_to_panels(kind: Half, src: &[u16], rows: Rows, dst: &mut [f32], p: usize) {
    if rows.rows == 0 || rows.cols == 0 {
        return;
    }
    assert!(rows.start + (rows.rows - 1) * rows.rs + rows.cols <= src.len(), "widen_to_panels: source out of bounds");
    assert!(rows.cols.div_ceil(p) * rows.rows * p <= dst.len(), "widen_to_panels: destination out of bounds");
    match kind {
        Half::Bf16 => dispatch!(|src: &[u16], rows: Rows, dst: &mut [f32], p: usize| -> () { to_panels_body::<true>(src, rows, dst, p) }),
        Half::F16 => dispatch!(|src: &[u16], rows: Rows, dst: &mut [f32], p: usize| -> () { to_panels_body::<false>(src, rows, dst, p) }),
    }
}

#[inline(always)]
fn to_panels_body<const BF16: bool>(src: &[u16], rows: Rows, dst: &mut [f32], p: usize) {
    /// Values widened per step: a whole number of vectors on every ISA (`p` is a multiple).
    const STEP: usize = 16;
    /// Rows widened together, panel by panel: their source (a few KiB) stays in L1 while
    /// each panel gets a run of whole cache lines. Row by row across all panels, every
    /// row's stores went to lines 16 KiB apart (one L1 set); panel by panel down all rows,
    /// the loads did.
    const CHUNK: usize = 16;
    let panel_len = rows.rows * p;
    for r0 in (0..rows.rows).step_by(CHUNK) {
        // The next chunk's rows asked for now, widened after this chunk's (the first block
        // of a task has nothing fetched ahead of it).
        let ahead = r0 + CHUNK..(r0 + 2 * CHUNK).min(rows.rows);
        prefetch_runs(src, Runs { start: rows.start + ahead.start * rows.rs, stride: rows.rs as isize, count: ahead.len(), len: rows.cols });
        for j in 0..rows.cols.div_ceil(p) {
            let (c0, width) = (j * p, p.min(rows.cols - j * p));
            for r in r0..(r0 + CHUNK).min(rows.rows) {
                let seg = &src[rows.start + r * rows.rs + c0..][..width];
                let d = &mut dst[j * panel_len + r * p..][..width];
                let mut ds = d.chunks_exact_mut(STEP);
                let mut ss = seg.chunks_exact(STEP);
                for (d, s) in (&mut ds).zip(&mut ss) {
                    let d: &mut [f32; STEP] = d.try_into().expect("a whole step");
                    let s: &[u16; STEP] = s.try_into().expect("a whole step");
                    for i in 0..STEP {
                        d[i] = wide::<BF16>(s[i]);
                    }
                }
                for (d, &b) in ds.into_remainder().iter_mut().zip(ss.remainder()) {
                    *d = wide::<BF16>(b);
                }
            }
        }
    }
}

/// Ask for the cache lines of `runs` ahead of their use, into L1 ([`super::prefetch::line`]),
/// so that widening the next block does not wait for memory.
pub(crate) fn prefetch_runs(src: &[u16], runs: Runs) {
    for r in 0..runs.count {
        let s = src.as_ptr().wrapping_offset(runs.start as isize + r as isize * runs.stride);
        for i in (0..runs.len).step_by(32) {
            super::prefetch::line(s.wrapping_add(i), super::prefetch::Level::L1);
        }
    }
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

#[inline(always)]
pub(crate) fn wide<const BF16: bool>(bits: u16) -> f32 {
    if BF16 { bf16_to_f32(bits) } else { f16_to_f32(bits) }
}

/// One element widened.
pub(crate) fn widen_one(kind: Half, bits: u16) -> f32 {
    match kind {
        Half::Bf16 => wide::<true>(bits),
        Half::F16 => wide::<false>(bits),
    }
}
