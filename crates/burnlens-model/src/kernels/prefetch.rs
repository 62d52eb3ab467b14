//! How far ahead the decoding kernels ask for a half weight's bytes, per CPU: a hint 1 KiB
//! ahead of the bytes being read into the first-level cache, and on Intel one 8 KiB ahead into
//! the second-level cache as well. The kernels that stream a half weight once per decoding
//! step ask by it: the panels ([`super::half_panels`]) and the stored layouts read in address
//! order ([`super::half_stream`]). Every kernel's hint, theirs and the half widening's
//! ([`super::half_format`]), goes through [`line`].

/// Bytes ahead of the read that the hint into L1 asks for: 8 rows of a bf16 panel.
pub const L1_BYTES: usize = 1024;
/// Bytes ahead that the hint into L2 asks for, where [`Ahead::L1AndL2`]: 64 rows of a panel.
pub const L2_BYTES: usize = 8192;

/// What a kernel asks the memory for ahead of what it reads, chosen per CPU and kernel by
/// measurement (BENCHMARKS.md):
/// - The panels ([`Ahead::panels`]), GPT-2 small's 64 decoded tokens, alternated processes.
///   AVX2 Zen 3, bf16: [`Ahead::L1`] took 0.90x the time of no hint (8 pairs,
///   twenty-fourth): the hardware's stream prefetcher alone left the kernel below the
///   memory's read rate. Intel (the Xeon model 207, AVX-512, thirty-sixth):
///   [`Ahead::L1AndL2`] took 0.83x and 0.74x the time of [`Ahead::L1`] with bf16 (two sets
///   of 6 rounds, medians 830 against 995 and 746 against 1,012 ms; 4 or 16 KiB ahead into
///   L2 instead of 8: 798 and 752; 2 KiB into L1 alone 930; 8 KiB into L2 alone 874), and
///   0.75x no hint with f16 (929 against 1,240 ms); at the 8B's MLP shape from memory
///   (`bench gemm --shape 1x4096x14336 --dtype bf16 --panels`, 4 alternated pairs) 25 against
///   20 GB/s. AMD's AVX-512 (Zen 4/5, not measured with and without): the Zen 3 rule; f16's
///   conversion kernel, which asked for nothing before, asks so too.
/// - The stored layout read in address order ([`Ahead::stored`]; decoding's weights past the
///   copies' budget, an 8B's), Intel (thirty-sixth), from memory, shuffled rounds. A column
///   at a time (`nn.Linear`), 1×4096×14336: [`Ahead::L1AndL2`] 24.0–24.3 GB/s (one round
///   14.8), L1 alone 18.7–20.0, L2 alone 21.6–22.0, no hint 13.3–15.2; deeper columns (8 at
///   a time from 8,192 deep, 1×14336×4096) gained nothing (20.5–20.9 GB/s without, 20.1–21.4
///   with both), so they ask for nothing. A row at a time (GPT-2's `Conv1D`), 3 rounds:
///   1×768×3072 15.1–15.9 against 11.0–12.3 GB/s, 1×3072×768 14.5–16.9 against 10.9–11.9;
///   rows wider than one task's block (1×4096×14336, pieces of rows 14,336 apart) lost
///   (8.9–9.8 against 11.7–12.7), so they ask for nothing. AMD: nothing, as measured there
///   (28–34 GB/s on the Zen 4).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Ahead {
    Nothing,
    L1,
    L1AndL2,
}

impl Ahead {
    /// The panels' rule on this CPU.
    pub fn panels() -> Self {
        if super::simd::intel() { Ahead::L1AndL2 } else { Ahead::L1 }
    }

    /// The rule for the stored layout read in address order on this CPU.
    pub fn stored() -> Self {
        if super::simd::intel() { Ahead::L1AndL2 } else { Ahead::Nothing }
    }

    /// For reports (`burnlens bench machine`: what decoding asks ahead for).
    pub fn describe(self) -> String {
        match self {
            Ahead::Nothing => "nothing".into(),
            Ahead::L1 => format!("{} KiB into L1", L1_BYTES / 1024),
            Ahead::L1AndL2 => format!("{} KiB into L1 and {} KiB into L2", L1_BYTES / 1024, L2_BYTES / 1024),
        }
    }
}

/// Ask, as `ahead` says, for the `lines` cache lines [`L1_BYTES`] (into L1) and [`L2_BYTES`]
/// (into L2) past `at`. Past a buffer's end the hint reads whatever lies there or nothing: a
/// prefetch never faults.
#[inline(always)]
pub fn ask<T>(at: *const T, lines: usize, ahead: Ahead) {
    let at = at.cast::<u8>();
    if ahead != Ahead::Nothing {
        for l in 0..lines {
            line(at.wrapping_add(L1_BYTES + 64 * l), Level::L1);
        }
    }
    if ahead == Ahead::L1AndL2 {
        for l in 0..lines {
            line(at.wrapping_add(L2_BYTES + 64 * l), Level::L2);
        }
    }
}

/// The cache a hint fills.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Level {
    L1,
    L2,
}

/// Ask for the cache line holding `at` (`_mm_prefetch`; nothing off x86): the one hint every
/// kernel's prefetching goes through. Any address is allowed.
#[inline(always)]
pub fn line<T>(at: *const T, into: Level) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _MM_HINT_T1, _mm_prefetch};
        let at = at.cast::<i8>();
        // SAFETY: a prefetch is a hint; it reads nothing the program sees and never faults.
        unsafe {
            match into {
                Level::L1 => _mm_prefetch::<_MM_HINT_T0>(at),
                Level::L2 => _mm_prefetch::<_MM_HINT_T1>(at),
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (at, into);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rules_are_intels_or_the_measured_amd_ones_and_report_their_distances() {
        let intel = crate::kernels::simd::intel();
        assert_eq!(Ahead::panels(), if intel { Ahead::L1AndL2 } else { Ahead::L1 });
        assert_eq!(Ahead::stored(), if intel { Ahead::L1AndL2 } else { Ahead::Nothing });
        assert_eq!(Ahead::Nothing.describe(), "nothing");
        assert_eq!(Ahead::L1.describe(), "1 KiB into L1");
        assert_eq!(Ahead::L1AndL2.describe(), "1 KiB into L1 and 8 KiB into L2");
        // The distances are whole rows of a panel (64 half values, two cache lines).
        let row = crate::kernels::half_panels::PANEL * 2;
        assert_eq!((L1_BYTES % row, L2_BYTES % row, L1_BYTES / row, L2_BYTES / row), (0, 0, 8, 64));
    }
}
