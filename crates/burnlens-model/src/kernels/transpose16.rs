//! A 16 × 16 block of f32 transposed in AVX-512 registers: the bf16 products' output
//! write-back and their transposing operand pack, and [`transpose_copy`] for the f32 packs.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// `out[j][i] = r[i][j]`: pairs within 128-bit lanes, then quads, then whole lanes.
///
/// # Safety
/// The CPU must have AVX-512F; call it from a function compiled for it (it is inlined there).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn transpose16(r: [__m512; 16]) -> [__m512; 16] {
    unsafe {
        let t: [__m512; 16] = std::array::from_fn(|i| if i % 2 == 0 { _mm512_unpacklo_ps(r[i], r[i + 1]) } else { _mm512_unpackhi_ps(r[i - 1], r[i]) });
        // `u[4g + c]` holds, in lane `L`, element `4L + c` of rows `4g..4g + 4`.
        let u: [__m512; 16] = std::array::from_fn(|i| {
            let (g, c) = (i / 4, i % 4);
            let (a, b) = (t[4 * g + c / 2], t[4 * g + 2 + c / 2]);
            if c % 2 == 0 { _mm512_shuffle_ps::<0x44>(a, b) } else { _mm512_shuffle_ps::<0xEE>(a, b) }
        });
        // Output row `4L + c` gathers lane `L` of `u[c]`, `u[4 + c]`, `u[8 + c]`, `u[12 + c]`.
        let mut out = [_mm512_setzero_ps(); 16];
        for c in 0..4 {
            let v0 = _mm512_shuffle_f32x4::<0x88>(u[c], u[4 + c]);
            let v1 = _mm512_shuffle_f32x4::<0xDD>(u[c], u[4 + c]);
            let w0 = _mm512_shuffle_f32x4::<0x88>(u[8 + c], u[12 + c]);
            let w1 = _mm512_shuffle_f32x4::<0xDD>(u[8 + c], u[12 + c]);
            out[c] = _mm512_shuffle_f32x4::<0x88>(v0, w0);
            out[8 + c] = _mm512_shuffle_f32x4::<0xDD>(v0, w0);
            out[4 + c] = _mm512_shuffle_f32x4::<0x88>(v1, w1);
            out[12 + c] = _mm512_shuffle_f32x4::<0xDD>(v1, w1);
        }
        out
    }
}

/// `dst[r · dst_rs + c] = src[c · src_cs + r]` for `r < rows`, `c < cols`: a matrix whose
/// columns are contiguous runs (column `c` at `src[c · src_cs..]`) written row by row. With
/// AVX-512, sixteen columns by sixteen rows at a time through [`transpose16`] (a packed `kᵀ`
/// of attention or an `nn.Linear` weight's transpose: one element at a time, the writes 256
/// bytes apart, was 3% of an attention layer at 2048 tokens); element by element elsewhere and
/// at the edges.
pub(crate) fn transpose_copy(src: &[f32], src_cs: usize, rows: usize, cols: usize, dst: &mut [f32], dst_rs: usize) {
    if rows == 0 || cols == 0 {
        return;
    }
    assert!((cols - 1) * src_cs + rows <= src.len(), "transpose_copy: {cols} runs of {rows} at stride {src_cs} past a source of {}", src.len());
    assert!((rows - 1) * dst_rs + cols <= dst.len(), "transpose_copy: {rows} rows of {cols} at stride {dst_rs} past a destination of {}", dst.len());
    #[cfg(target_arch = "x86_64")]
    let (r16, c16) = if super::simd::has_avx512() { (rows / 16 * 16, cols / 16 * 16) } else { (0, 0) };
    #[cfg(target_arch = "x86_64")]
    if r16 > 0 && c16 > 0 {
        // SAFETY: AVX-512 checked; every block read and written lies inside the bounds
        // asserted above (blocks only cover rows < r16 <= rows and columns < c16 <= cols).
        unsafe { blocks_avx512(src, src_cs, r16, c16, dst, dst_rs) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let (r16, c16) = (0, 0);
    for c in 0..cols {
        let run = &src[c * src_cs..c * src_cs + rows];
        // Rows the blocks wrote, only in their columns.
        let first = if c < c16 { r16 } else { 0 };
        for (r, &v) in run.iter().enumerate().skip(first) {
            dst[r * dst_rs + c] = v;
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn blocks_avx512(src: &[f32], src_cs: usize, r16: usize, c16: usize, dst: &mut [f32], dst_rs: usize) {
    let (s, d) = (src.as_ptr(), dst.as_mut_ptr());
    for c0 in (0..c16).step_by(16) {
        for r0 in (0..r16).step_by(16) {
            // SAFETY: the caller's bounds: columns c0..c0 + 16 and rows r0..r0 + 16 lie
            // within c16 and r16.
            unsafe {
                let out = transpose16(std::array::from_fn(|i| _mm512_loadu_ps(s.add((c0 + i) * src_cs + r0))));
                for (j, v) in out.iter().enumerate() {
                    _mm512_storeu_ps(d.add((r0 + j) * dst_rs + c0), *v);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn a_block_comes_back_transposed() {
        use super::transpose16;
        use std::arch::x86_64::*;
        if !std::arch::is_x86_feature_detected!("avx512f") {
            return;
        }
        #[target_feature(enable = "avx512f")]
        unsafe fn run(v: &[f32; 256]) -> [f32; 256] {
            unsafe {
                let out = transpose16(std::array::from_fn(|i| _mm512_loadu_ps(v[16 * i..].as_ptr())));
                let mut back = [0f32; 256];
                for (i, o) in out.iter().enumerate() {
                    _mm512_storeu_ps(back[16 * i..].as_mut_ptr(), *o);
                }
                back
            }
        }
        let v: [f32; 256] = std::array::from_fn(|i| i as f32);
        let t = unsafe { run(&v) };
        for i in 0..16 {
            for j in 0..16 {
                assert_eq!(t[16 * j + i], v[16 * i + j], "[{i}][{j}]");
            }
        }
    }

    #[test]
    fn transpose_copy_writes_every_element_at_every_edge() {
        for (rows, cols) in [(1, 1), (16, 16), (17, 33), (64, 64), (64, 70), (5, 40), (48, 3)] {
            let (src_cs, dst_rs) = (rows + 3, cols + 5);
            let src: Vec<f32> = (0..cols * src_cs).map(|i| i as f32).collect();
            let mut dst = vec![f32::NAN; rows * dst_rs];
            super::transpose_copy(&src, src_cs, rows, cols, &mut dst, dst_rs);
            for r in 0..rows {
                for c in 0..cols {
                    assert_eq!(dst[r * dst_rs + c], src[c * src_cs + r], "{rows}x{cols}: [{r}][{c}]");
                }
                assert!(dst[r * dst_rs + cols..(r * dst_rs + dst_rs).min(dst.len())].iter().all(|v| v.is_nan()), "{rows}x{cols}: row {r} written past its end");
            }
        }
    }
}
