//! Vectorisation helpers shared by the kernels.
//!
//! The default x86-64 target only guarantees SSE2, so plain loops compile to 4-wide code.
//! [`dispatch!`] compiles one loop body three times (AVX-512, AVX2 + FMA, baseline) and picks
//! the widest the CPU has at run time, so the default build stays portable and still uses
//! the whole vector unit. Bodies are written as simple indexable loops with independent
//! accumulators, which LLVM vectorises.

/// Run `$body` (an expression) compiled for the best instruction set this CPU supports.
/// Every variable the body uses must be captured by the closure-like list `|$($arg: $ty),*|`.
macro_rules! dispatch {
    (|$($arg:ident : $ty:ty),* $(,)?| -> $ret:ty $body:block) => {{
        #[inline(always)]
        fn body($($arg: $ty),*) -> $ret $body
        #[cfg(target_arch = "x86_64")]
        {
            #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,bmi2")]
            unsafe fn v4($($arg: $ty),*) -> $ret { body($($arg),*) }
            #[target_feature(enable = "avx2,fma,bmi2")]
            unsafe fn v3($($arg: $ty),*) -> $ret { body($($arg),*) }
            if $crate::kernels::simd::has_avx512() {
                // SAFETY: the CPU supports every feature `v4` was compiled for.
                unsafe { v4($($arg),*) }
            } else if $crate::kernels::simd::has_avx2_fma() {
                // SAFETY: as above, for `v3`.
                unsafe { v3($($arg),*) }
            } else {
                body($($arg),*)
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            body($($arg),*)
        }
    }};
}
pub(crate) use dispatch;

/// Whether `BURNLENS_ISA=baseline` sends every kernel to its portable path: no
/// AVX2/AVX-512 bodies, no packed weights, the plain loops an aarch64 build (Apple silicon)
/// compiles. Read once per process; the README's test command runs the kernel and parity
/// tests once this way, so the code a Mac runs is tested on x86 too.
pub fn baseline() -> bool {
    static BASELINE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *BASELINE.get_or_init(|| match std::env::var("BURNLENS_ISA").as_deref().map(str::trim) {
        Ok("baseline") => true,
        Ok("" | "native") | Err(_) => false,
        Ok(other) => {
            eprintln!("warning: BURNLENS_ISA={other:?} is not one of baseline, native; using native");
            false
        }
    })
}

/// Whether the CPU has the AVX-512 subset the kernels are compiled for (and
/// [`baseline`] does not forbid it). The CPU is asked once: every dispatch, and every row
/// of exponentials, asks this.
#[cfg(target_arch = "x86_64")]
#[inline]
pub fn has_avx512() -> bool {
    static AVX512: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVX512.get_or_init(|| {
        !baseline()
            && std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512dq")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && has_avx2_fma()
    })
}

/// Whether the CPU has AVX512_BF16 with AVX-512F (and [`baseline`] does not forbid them):
/// what bf16 products run on ([`super::bf16_gemm`]).
#[cfg(target_arch = "x86_64")]
#[inline]
pub fn has_avx512_bf16() -> bool {
    !baseline() && std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("avx512bf16")
}

#[cfg(not(target_arch = "x86_64"))]
pub fn has_avx512_bf16() -> bool {
    false
}

/// Whether the CPU has AVX2, FMA and BMI2 (and [`baseline`] does not forbid them).
#[cfg(target_arch = "x86_64")]
#[inline]
pub fn has_avx2_fma() -> bool {
    !baseline() && std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") && std::arch::is_x86_feature_detected!("bmi2")
}

/// Whether the CPU is Intel's: where measurements chose a rule per vendor (the bf16 path,
/// the AVX-512 blocking of packed products). Asked of the CPU once (`cpuid` leaves a virtual
/// machine, and the bf16 path is decided per product).
#[cfg(target_arch = "x86_64")]
pub fn intel() -> bool {
    static INTEL: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *INTEL.get_or_init(|| {
        let id = std::arch::x86_64::__cpuid(0);
        let vendor: Vec<u8> = [id.ebx, id.edx, id.ecx].iter().flat_map(|r| r.to_le_bytes()).collect();
        vendor == b"GenuineIntel"
    })
}

#[cfg(not(target_arch = "x86_64"))]
pub fn intel() -> bool {
    false
}

/// The instruction set the kernels run with on this CPU, for reports.
pub fn isa() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        if baseline() {
            return "baseline";
        }
        if has_avx512() {
            return "avx512";
        }
        if has_avx2_fma() {
            return "avx2+fma";
        }
        "sse2"
    }
    #[cfg(not(target_arch = "x86_64"))]
    "baseline"
}

/// Lanes of the accumulators: one AVX-512 register.
pub(super) const LANES: usize = 16;

/// `Σ f(a[i])` with sixteen independent accumulators (a plain f32 fold is one long
/// dependency chain that does not vectorise).
#[inline(always)]
pub fn sum_by(a: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut acc = [0.0f32; LANES];
    let chunks = a.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for l in 0..LANES {
            acc[l] += f(c[l]);
        }
    }
    reduce_sum(acc) + tail.iter().map(|&x| f(x)).sum::<f32>()
}

/// `Σ f(a[i], b[i])` over the common length.
#[inline(always)]
pub fn sum_by2(a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> f32) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0f32; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (ta, tb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..LANES {
            acc[l] += f(x[l], y[l]);
        }
    }
    reduce_sum(acc) + ta.iter().zip(tb).map(|(&x, &y)| f(x, y)).sum::<f32>()
}

/// `Σ f(a[i], b[i], c[i])` over the common length.
#[inline(always)]
pub fn sum_by3(a: &[f32], b: &[f32], c: &[f32], f: impl Fn(f32, f32, f32) -> f32) -> f32 {
    let n = a.len().min(b.len()).min(c.len());
    let (a, b, c) = (&a[..n], &b[..n], &c[..n]);
    let mut acc = [0.0f32; LANES];
    let (ca, cb, cc) = (a.chunks_exact(LANES), b.chunks_exact(LANES), c.chunks_exact(LANES));
    let (ta, tb, tc) = (ca.remainder(), cb.remainder(), cc.remainder());
    for ((x, y), z) in ca.zip(cb).zip(cc) {
        for l in 0..LANES {
            acc[l] += f(x[l], y[l], z[l]);
        }
    }
    reduce_sum(acc) + ta.iter().zip(tb).zip(tc).map(|((&x, &y), &z)| f(x, y, z)).sum::<f32>()
}

#[inline(always)]
pub(super) fn reduce_sum(acc: [f32; LANES]) -> f32 {
    let mut s = [0.0f32; 8];
    for l in 0..8 {
        s[l] = acc[l] + acc[l + 8];
    }
    ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]))
}

/// `max f(a[i])` (`-inf` for an empty slice), vectorisable; NaNs are passed over, as
/// `f32::max` passes them.
#[inline(always)]
pub fn max_by(a: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let chunks = a.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for l in 0..LANES {
            // One `vmaxps` a vector: a NaN `v` compares false and is passed over, and `acc`
            // never holds one. (`f32::max` adds a NaN test of both operands.)
            let v = f(c[l]);
            acc[l] = if v > acc[l] { v } else { acc[l] };
        }
    }
    tail.iter().fold(acc.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)), |m, &x| m.max(f(x)))
}

/// `Σ a[i] b[i]`.
#[inline(always)]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    sum_by2(a, b, |x, y| x * y)
}

/// [`dot`] compiled for the CPU it runs on, for callers outside the kernels (one call a
/// product: short vectors, many of them).
pub fn dot_here(a: &[f32], b: &[f32]) -> f32 {
    dispatch!(|a: &[f32], b: &[f32]| -> f32 { dot(a, b) })
}

/// `Σ a[i]` over all kernel threads, vectorised: reads `a` once at full bandwidth (the bench
/// uses it to measure the read bandwidth that bounds decoding).
pub fn parallel_sum(a: &[f32]) -> f32 {
    const PART: usize = 1 << 16;
    let parts = a.len().div_ceil(PART);
    let sums: Vec<std::sync::atomic::AtomicU32> = (0..parts).map(|_| std::sync::atomic::AtomicU32::new(0)).collect();
    super::pool::run(parts, |i| {
        let part = &a[i * PART..((i + 1) * PART).min(a.len())];
        let s = dispatch!(|part: &[f32]| -> f32 { sum_by(part, |x| x) });
        sums[i].store(s.to_bits(), std::sync::atomic::Ordering::Relaxed);
    });
    sums.iter().map(|s| f32::from_bits(s.load(std::sync::atomic::Ordering::Relaxed))).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dispatched_dot_is_the_sum_of_products_at_every_length() {
        for n in 0..70 {
            let a: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
            let b: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos() - 0.5).collect();
            let want: f64 = a.iter().zip(&b).map(|(&x, &y)| x as f64 * y as f64).sum();
            let got = dot_here(&a, &b) as f64;
            assert!((got - want).abs() <= 1e-5 * (1.0 + want.abs()), "n = {n}: {got} against {want}");
        }
    }

    #[test]
    fn dispatched_sum_and_max_agree_with_plain_loops() {
        for n in [0usize, 1, 7, 16, 17, 100, 1027] {
            let data: Vec<f32> = (0..n).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
            let v: &[f32] = &data;
            let s = dispatch!(|v: &[f32]| -> f32 { sum_by(v, |x| x) });
            let m = dispatch!(|v: &[f32]| -> f32 { max_by(v, |x| x) });
            let want: f64 = v.iter().map(|&x| x as f64).sum();
            assert!((s as f64 - want).abs() < 1e-3, "n={n}: {s} vs {want}");
            assert_eq!(m, v.iter().cloned().fold(f32::NEG_INFINITY, f32::max));
        }
    }

    #[test]
    fn max_passes_over_nans_as_f32_max_does() {
        for n in [1usize, 16, 17, 40] {
            for at in [0, n / 2, n - 1] {
                let mut v: Vec<f32> = (0..n).map(|i| i as f32 - 3.0).collect();
                v[at] = f32::NAN;
                let x: &[f32] = &v;
                let got = dispatch!(|x: &[f32]| -> f32 { max_by(x, |y| y) });
                assert_eq!(got, v.iter().cloned().fold(f32::NEG_INFINITY, f32::max), "n={n}, NaN at {at}");
            }
        }
    }
}
