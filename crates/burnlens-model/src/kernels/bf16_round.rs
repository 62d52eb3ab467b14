//! Rounding f32 to bf16 as `vcvtneps2bf16` does, and the pair product `vdpbf16ps` computes,
//! in plain Rust: the rule every bf16 kernel is tested against and the portable path runs.
//!
//! Rounding: to nearest, ties to even, on the bits (add `0x7fff` plus the lowest kept bit,
//! keep the upper half); a denormal input becomes a zero of its sign (the instruction treats
//! denormals as zero); NaN stays NaN, made quiet; a value past bf16's largest rounds to
//! infinity. The pair product adds, per output, the odd pair's product and then the even
//! one's to the f32 accumulator, each addition rounded to nearest even with denormal results
//! flushed to zero; a product of two bf16 values is exact in f32 (8 + 8 significant bits),
//! so only the additions round.

use super::simd::dispatch;

/// f32 → bf16 bits, round-to-nearest-even, denormals as zero, NaN quiet.
#[inline(always)]
pub fn to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    let exp = b & 0x7f80_0000;
    if exp == 0 {
        // Zero or denormal: a zero of the same sign.
        ((b >> 16) & 0x8000) as u16
    } else if exp == 0x7f80_0000 && b & 0x007f_ffff != 0 {
        ((b >> 16) | 0x0040) as u16
    } else {
        (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16
    }
}

/// bf16 bits → f32 (exact).
#[inline(always)]
pub fn from_bf16(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// `x` rounded to the nearest bf16 value, as an f32.
#[inline(always)]
pub fn round(x: f32) -> f32 {
    from_bf16(to_bf16(x))
}

/// Round every value of `src` into `dst` as bf16 bits (equal lengths).
pub fn to_bf16_slice(src: &[f32], dst: &mut [u16]) {
    assert_eq!(src.len(), dst.len(), "to_bf16_slice: lengths differ");
    #[cfg(target_arch = "x86_64")]
    if super::simd::has_avx512_bf16() {
        // SAFETY: the CPU has AVX512_BF16 (checked); equal lengths (checked).
        return unsafe { to_bf16_native(src, dst) };
    }
    dispatch!(|src: &[f32], dst: &mut [u16]| -> () {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = to_bf16(s);
        }
    })
}

/// [`to_bf16_slice`] by `vcvtneps2bf16`, sixteen values an instruction (the rule above is
/// the instruction's; the compiler's vectors of that rule ran at half its speed, 9% of a bf16
/// training step on AMX).
///
/// # Safety
/// The CPU must have AVX512_BF16; `src` and `dst` of equal lengths.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn to_bf16_native(src: &[f32], dst: &mut [u16]) {
    use std::arch::x86_64::*;
    let whole = src.len() / 16 * 16;
    for i in (0..whole).step_by(16) {
        unsafe {
            let bits: __m256i = std::mem::transmute(_mm512_cvtneps_pbh(_mm512_loadu_ps(src.as_ptr().add(i))));
            _mm256_storeu_si256(dst.as_mut_ptr().add(i).cast(), bits);
        }
    }
    for (d, &s) in dst[whole..].iter_mut().zip(&src[whole..]) {
        *d = to_bf16(s);
    }
}

/// Two values rounded to bf16 as one 32-bit word: `lo` in the low half (`vdpbf16ps`'s even
/// element).
#[inline(always)]
pub fn pair(lo: f32, hi: f32) -> u32 {
    to_bf16(lo) as u32 | (to_bf16(hi) as u32) << 16
}

/// `out[i] = lo[i]`'s bf16 bits in the low half and `hi[i]`'s in the high half (equal
/// lengths), by `vcvtneps2bf16` where the CPU has it: the pairs `vdpbf16ps` and the tiles
/// read.
pub fn to_bf16_pairs(lo: &[f32], hi: &[f32], out: &mut [u32]) {
    assert!(lo.len() == out.len() && hi.len() == out.len(), "to_bf16_pairs: lengths differ");
    #[cfg(target_arch = "x86_64")]
    if super::simd::has_avx512_bf16() {
        // SAFETY: the CPU has AVX512_BF16 (checked); equal lengths (checked).
        return unsafe { to_bf16_pairs_native(lo, hi, out) };
    }
    dispatch!(|lo: &[f32], hi: &[f32], out: &mut [u32]| -> () {
        for ((o, &l), &h) in out.iter_mut().zip(lo).zip(hi) {
            *o = pair(l, h);
        }
    })
}

/// [`to_bf16_pairs`] on AVX512_BF16.
///
/// # Safety
/// The CPU must have AVX512_BF16; the three slices of equal lengths.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn to_bf16_pairs_native(lo: &[f32], hi: &[f32], out: &mut [u32]) {
    use std::arch::x86_64::*;
    let whole = out.len() / 16 * 16;
    for i in (0..whole).step_by(16) {
        unsafe {
            let l: __m256i = std::mem::transmute(_mm512_cvtneps_pbh(_mm512_loadu_ps(lo.as_ptr().add(i))));
            let h: __m256i = std::mem::transmute(_mm512_cvtneps_pbh(_mm512_loadu_ps(hi.as_ptr().add(i))));
            let pairs = _mm512_or_si512(_mm512_cvtepu16_epi32(l), _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)));
            _mm512_storeu_si512(out.as_mut_ptr().add(i).cast(), pairs);
        }
    }
    for ((o, &l), &h) in out[whole..].iter_mut().zip(&lo[whole..]).zip(&hi[whole..]) {
        *o = pair(l, h);
    }
}

/// Round every value of `v` to the nearest bf16 value in place (kept as f32).
pub fn round_slice(v: &mut [f32]) {
    dispatch!(|v: &mut [f32]| -> () {
        for x in v.iter_mut() {
            *x = round(*x);
        }
    })
}

/// A denormal result flushed to a zero of its sign.
#[cfg(test)]
#[inline(always)]
fn flush(x: f32) -> f32 {
    if x.to_bits() & 0x7f80_0000 == 0 { f32::from_bits(x.to_bits() & 0x8000_0000) } else { x }
}

/// `acc + a[1]·b[1] + a[0]·b[0]` for one pair of bf16 values each, rounded as `vdpbf16ps`
/// rounds (see the module's note). The scalar rule the kernel is tested against.
#[cfg(test)]
#[inline(always)]
pub fn pair_product(acc: f32, a: [u16; 2], b: [u16; 2]) -> f32 {
    let odd = flush(from_bf16(a[1])) * flush(from_bf16(b[1]));
    let even = flush(from_bf16(a[0])) * flush(from_bf16(b[0]));
    flush(flush(acc + odd) + even)
}

/// `Σ_k a[k]·b[k]` over bf16 values, pair after pair from `acc`, as one output lane of the
/// kernel sums it (an odd length ends with a zero pair half).
#[cfg(test)]
pub fn dot(mut acc: f32, a: &[u16], b: &[u16]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot: lengths differ");
    let pair = |v: &[u16], i: usize| [v[2 * i], v.get(2 * i + 1).copied().unwrap_or(0)];
    for i in 0..a.len().div_ceil(2) {
        acc = pair_product(acc, pair(a, i), pair(b, i));
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_is_to_nearest_even_with_denormals_as_zero() {
        // Exactly representable, halfway ties (to even, both ways), just above a tie.
        assert_eq!(to_bf16(1.0), 0x3f80);
        assert_eq!(to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80);
        assert_eq!(to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(to_bf16(f32::from_bits(0x3f80_8001)), 0x3f81);
        assert_eq!(to_bf16(-2.5), 0xc020);
        // Denormals, zeros, infinities, NaN, overflow past bf16's largest value.
        assert_eq!(to_bf16(f32::from_bits(0x0000_0001)), 0x0000);
        assert_eq!(to_bf16(f32::from_bits(0x8040_0000)), 0x8000);
        assert_eq!(to_bf16(-0.0), 0x8000);
        assert_eq!(to_bf16(f32::INFINITY), 0x7f80);
        assert_eq!(to_bf16(f32::NEG_INFINITY), 0xff80);
        assert_eq!(to_bf16(f32::from_bits(0x7f80_0001)), 0x7fc0);
        assert_eq!(to_bf16(f32::MAX), 0x7f80);
        // The smallest normal survives.
        assert_eq!(to_bf16(f32::MIN_POSITIVE), 0x0080);
    }

    #[test]
    fn the_slice_rounding_equals_the_scalar_rule_on_every_pattern_class() {
        // A spread of bit patterns through every exponent, with the low bits that decide ties.
        let src: Vec<f32> = (0..200_000u32).map(|i| f32::from_bits(i.wrapping_mul(2_654_435_761) ^ (i & 0xffff))).collect();
        let mut dst = vec![0u16; src.len()];
        to_bf16_slice(&src, &mut dst);
        let mut rounded = src.clone();
        round_slice(&mut rounded);
        for (i, &x) in src.iter().enumerate() {
            assert_eq!(dst[i], to_bf16(x), "{x:e} ({:#x})", x.to_bits());
            assert_eq!(rounded[i].to_bits(), from_bf16(to_bf16(x)).to_bits(), "{x:e}");
        }
        // In pairs: each half rounded by the same rule, `lo` in the low half.
        let (lo, hi) = src.split_at(src.len() / 2 - 3);
        let (lo, hi) = (&lo[..hi.len() - 7], &hi[..hi.len() - 7]);
        let mut pairs = vec![0u32; lo.len()];
        to_bf16_pairs(lo, hi, &mut pairs);
        for (i, &p) in pairs.iter().enumerate() {
            assert_eq!(p, (to_bf16(hi[i]) as u32) << 16 | to_bf16(lo[i]) as u32, "pair {i}: {:e} {:e}", lo[i], hi[i]);
        }
    }

    #[test]
    fn the_pair_product_adds_the_odd_half_first_and_flushes_denormals() {
        let b = |x: f32| to_bf16(x);
        assert_eq!(pair_product(1.0, [b(2.0), b(3.0)], [b(5.0), b(7.0)]), 1.0 + 21.0 + 10.0);
        // 2^24 + 1 rounds away before the even product is added (an exact sum would be 2^24 + 2).
        let big = 16_777_216.0f32;
        assert_eq!(pair_product(big, [b(1.0), b(1.0)], [b(1.0), b(1.0)]), big);
        // A product below the smallest normal is zero.
        let tiny = f32::from_bits(0x1f80_0000); // 2^-64
        assert_eq!(pair_product(0.0, [b(tiny), 0], [b(tiny), 0]), 0.0);
        assert_eq!(dot(0.5, &[b(1.0), b(2.0), b(3.0)], &[b(4.0), b(5.0), b(6.0)]), 0.5 + 4.0 + 10.0 + 18.0);
    }
}
