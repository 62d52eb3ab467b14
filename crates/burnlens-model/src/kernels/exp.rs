//! The exponential the kernels take: `e^x` in f32 without libm, so that loops calling it
//! vectorise ([`exp`]), the same sixteen lanes at a time with AVX-512's `vscalefps` for `2ⁿ`
//! ([`exp16`]: 19 vector operations for sixteen exponentials instead of 24), and a softmax's
//! exponentials with their sum in one pass ([`exp_scaled_sum`]), on either.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::simd;

/// `ln 2` split for Cody–Waite's reduction: `LN2_HI` has few enough mantissa bits that `n ·
/// LN2_HI` is exact.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// `e^r ≈ 1 + r + r² p(r)`: `p`'s coefficients, highest first (Cephes').
const POLY: [f32; 6] = [1.987_569_1e-4, 1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 0.5];
/// Below this [`exp`] gives 0 (as `expf` underflows).
const UNDERFLOW: f32 = -87.3;

/// `e^x` for f32 without a libm call, so that loops calling it vectorise. Cody–Waite range
/// reduction `x = n ln2 + r` (fused) and a degree-7 polynomial for `e^r` on `|r| <= ln2/2`;
/// relative error below 2e-7 on [-87, 88]. Inputs below -87.3 give 0 (as `expf`
/// underflows), from 88.38 up (`n > 127`) `+inf`, NaN stays NaN. `exp16` computes the same
/// bit for bit, sixteen at a time on AVX-512.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    let xc = x.clamp(UNDERFLOW, 88.7);
    let n = (xc * std::f32::consts::LOG2_E).round_ties_even();
    let r = n.mul_add(-LN2_HI, xc);
    let r = n.mul_add(-LN2_LO, r);
    let p = POLY[1..].iter().fold(POLY[0], |p, &c| p.mul_add(r, c));
    let e = (p * r).mul_add(r, r) + 1.0;
    // 2^n without a float-to-int conversion (Rust's saturating `as i32` does not vectorise):
    // adding 2^23 puts the integer n + 127 in the low mantissa bits, and the shift moves it
    // into the exponent field, discarding the rest (n = 128, from 88.38 up, gives +inf).
    let scale = f32::from_bits((n + (127.0 + 8_388_608.0)).to_bits() << 23);
    let y = e * scale;
    if x < UNDERFLOW { 0.0 } else { y }
}

/// `x[i] = e^(x[i] · scale - m)` in place (`x[i] · scale - m` fused), returning `Σ x[i]`: a
/// softmax's exponentials and their sum in one pass, added in [`simd::sum_by`]'s order (the
/// same sum as a second pass). On AVX-512 through `exp16`, the same values.
#[inline(always)]
pub fn exp_scaled_sum(x: &mut [f32], scale: f32, m: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if simd::has_avx512() {
        // SAFETY: the CPU has AVX-512F.
        return unsafe { exp_scaled_sum_avx512(x, scale, m) };
    }
    let mut acc = [0.0f32; simd::LANES];
    let mut chunks = x.chunks_exact_mut(simd::LANES);
    for c in &mut chunks {
        for l in 0..simd::LANES {
            let e = exp(c[l].mul_add(scale, -m));
            c[l] = e;
            acc[l] += e;
        }
    }
    finish(acc, chunks.into_remainder(), scale, m)
}

/// The last `< 16` values of [`exp_scaled_sum`] one at a time, and the total: the sixteen
/// lanes' sums folded as [`simd::sum_by`] folds them, then the tail's (both paths end here).
#[inline(always)]
fn finish(lanes: [f32; simd::LANES], tail: &mut [f32], scale: f32, m: f32) -> f32 {
    for v in tail.iter_mut() {
        *v = exp(v.mul_add(scale, -m));
    }
    simd::reduce_sum(lanes) + tail.iter().sum::<f32>()
}

/// `e^a` in each lane, as [`exp`] gives it: 0 below its underflow bound (and for
/// `-inf`), `+inf` where `2ⁿ` leaves f32's exponents (`n > 127`: from 88.38 up), NaN kept.
///
/// # Safety
/// The CPU must have AVX-512F; call it from a function compiled for it (it is inlined there).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn exp16(a: __m512) -> __m512 {
    // SAFETY: the caller's guarantee (AVX-512F).
    unsafe {
        // `!(a < bound)`: NaN is kept, as the portable code keeps it.
        let kept = _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(a, _mm512_set1_ps(UNDERFLOW));
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_mul_ps(a, _mm512_set1_ps(std::f32::consts::LOG2_E)));
        let overflows = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(n, _mm512_set1_ps(127.5));
        let r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_HI), a);
        let r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_LO), r);
        let mut p = _mm512_set1_ps(POLY[0]);
        for c in &POLY[1..] {
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(*c));
        }
        let e = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0));
        let y = _mm512_maskz_scalef_ps(kept, e, n);
        _mm512_mask_mov_ps(y, overflows, _mm512_set1_ps(f32::INFINITY))
    }
}

/// [`exp_scaled_sum`] on AVX-512: the same exponentials and the same sum, in the same
/// order.
///
/// # Safety
/// The CPU must have AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn exp_scaled_sum_avx512(x: &mut [f32], scale: f32, m: f32) -> f32 {
    let (s, minus_m) = (_mm512_set1_ps(scale), _mm512_set1_ps(-m));
    let mut acc = _mm512_setzero_ps();
    let mut chunks = x.chunks_exact_mut(simd::LANES);
    for c in &mut chunks {
        // SAFETY: `c` holds sixteen floats; the CPU has AVX-512F (the caller's guarantee).
        unsafe {
            let e = exp16(_mm512_fmadd_ps(_mm512_loadu_ps(c.as_ptr()), s, minus_m));
            _mm512_storeu_ps(c.as_mut_ptr(), e);
            acc = _mm512_add_ps(acc, e);
        }
    }
    let mut lanes = [0.0f32; simd::LANES];
    // SAFETY: `lanes` holds sixteen floats.
    unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), acc) };
    finish(lanes, chunks.into_remainder(), scale, m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::simd::dispatch;

    #[test]
    fn exp_matches_libm_to_two_ulp_relative() {
        let mut worst = 0.0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let want = (x as f64).exp();
            let got = exp(x) as f64;
            worst = worst.max(((got - want) / want).abs());
            x += 0.0137;
        }
        assert!(worst < 3e-7, "worst relative error {worst}");
        assert_eq!(exp(-1000.0), 0.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert!(exp(0.0) == 1.0);
    }

    #[test]
    fn exp_scaled_sum_writes_the_exponentials_and_sums_them_as_a_second_pass_would() {
        for n in [0usize, 1, 15, 16, 33, 515] {
            let x: Vec<f32> = (0..n).map(|i| ((i * 29 % 97) as f32 - 48.0) / 5.0).collect();
            let (scale, m) = (0.7f32, 3.25f32);
            let mut got = x.clone();
            let g: &mut [f32] = &mut got;
            let sum = dispatch!(|g: &mut [f32], scale: f32, m: f32| -> f32 { exp_scaled_sum(g, scale, m) });
            let want: Vec<f32> = x.iter().map(|&v| exp(v.mul_add(scale, -m))).collect();
            assert_eq!(got, want, "n={n}: the exponentials");
            let w: &[f32] = &want;
            assert_eq!(sum, dispatch!(|w: &[f32]| -> f32 { simd::sum_by(w, |v| v) }), "n={n}: the sum");
        }
    }

    /// Every input `exp` has a rule for — underflow, the top of the exponents, infinities,
    /// NaN — and a sweep of ordinary ones: the sixteen-wide AVX-512 exponentials ([`exp16`])
    /// equal `exp` bit for bit, in the full vectors and the tail alike.
    #[test]
    fn the_exponentials_equal_exp_bit_for_bit_at_every_bound() {
        let mut x: Vec<f32> =
            vec![f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0, 1e30, -1e30, -87.31, -87.3, -87.29, 88.37, 88.376, 88.38, 88.7, 88.71, 88.73];
        x.extend((0..4000).map(|i| -180.0 + i as f32 * 0.0913));
        x.extend_from_slice(&[f32::NAN, 88.38, -87.31, 1.5, -90.0]);
        let mut got = x.clone();
        let g: &mut [f32] = &mut got;
        dispatch!(|g: &mut [f32]| -> f32 { exp_scaled_sum(g, 1.0, 0.0) });
        for (i, (&v, &e)) in x.iter().zip(&got).enumerate() {
            let want = exp(v);
            assert!(e.to_bits() == want.to_bits() || (e.is_nan() && want.is_nan()), "x[{i}] = {v}: {e} against {want}");
        }
        assert_eq!((exp(88.37).is_finite(), exp(88.38), exp(-87.31)), (true, f32::INFINITY, 0.0));
        assert!(exp(f32::NAN).is_nan());
    }
}
