//! A 16 × 16 block of f32 transposed in AVX-512 registers: the bf16 products' output
//! write-back and their transposing operand pack.

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
}
