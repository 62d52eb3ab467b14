//! Histograms as SAEDashboard draws them (`HistogramData.from_data`): `torch.histc` over the
//! data's own range in `n` bins, bars at the bins' centres rounded to five places; and
//! `torch.linspace`, which places the bins and the quantile groups' boundaries.

use serde::{Deserialize, Serialize};

/// `torch.linspace(start, end, steps)` in f32 (its scalar loop: the first half counted from
/// `start`, the second from `end`; the vectorised loop can differ in the last bit).
pub fn linspace(start: f32, end: f32, steps: usize) -> Vec<f32> {
    if steps == 1 {
        return vec![start];
    }
    let step = (end - start) / (steps - 1) as f32;
    let half = steps / 2;
    (0..steps).map(|i| if i < half { start + step * i as f32 } else { end - step * (steps - 1 - i) as f32 }).collect()
}

/// Which of `n` equal bins over `[lo, hi]` a value falls in, as `torch.histc` decides:
/// `⌊(x − lo)·n / (hi − lo)⌋` in f32, `hi` itself in the last bin, values outside in none.
/// A range of one value is widened by one each side, as `histc` widens it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Binning {
    pub lo: f32,
    pub hi: f32,
    pub n: usize,
}

impl Binning {
    pub fn new(lo: f32, hi: f32, n: usize) -> Self {
        if lo == hi { Binning { lo: lo - 1.0, hi: hi + 1.0, n } } else { Binning { lo, hi, n } }
    }

    #[inline]
    pub fn bin(&self, x: f32) -> Option<usize> {
        if !(x >= self.lo && x <= self.hi) {
            return None;
        }
        let pos = ((x - self.lo) * self.n as f32 / (self.hi - self.lo)) as usize;
        Some(pos.min(self.n - 1))
    }
}

impl Binning {
    /// Each bin's smallest member: `t[b]` is the least f32 in `[lo, hi]` that [`Self::bin`]
    /// puts in bin `b` or above (+∞ where none), so a value `x` in `[lo, hi]` is in bin `b`
    /// exactly when `t[b] <= x < t[b + 1]`. Counting by these comparisons gives the bins
    /// where the arithmetic itself may round otherwise (a GPU's division).
    pub fn thresholds(&self) -> Vec<f32> {
        // f32 in value order as u32 (negatives reversed below the positives).
        let key = |x: f32| if x.is_sign_negative() { !x.to_bits() } else { x.to_bits() | 0x8000_0000 };
        let value = |k: u32| if k & 0x8000_0000 != 0 { f32::from_bits(k & 0x7FFF_FFFF) } else { f32::from_bits(!k) };
        let (lo, hi) = (key(self.lo), key(self.hi));
        (0..self.n)
            .map(|b| {
                if self.bin(self.hi).is_none_or(|top| top < b) {
                    return f32::INFINITY;
                }
                // The least key in [lo, hi] whose value's bin is at least b.
                let (mut a, mut z) = (lo, hi);
                while a < z {
                    let mid = a + (z - a) / 2;
                    if self.bin(value(mid)).is_some_and(|m| m >= b) { z = mid } else { a = mid + 1 }
                }
                value(a)
            })
            .collect()
    }
}

/// A histogram's bars: counts and the values they stand at.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Histogram {
    pub heights: Vec<u64>,
    /// Bin centres, rounded to five places.
    pub values: Vec<f64>,
}

impl Histogram {
    /// Empty bars for data in `[min, max]` (the data's own extremes), filled by [`Binning`].
    pub fn over(min: f32, max: f32, n: usize) -> (Histogram, Binning) {
        let edges = linspace(min, max, n + 1);
        let half = ((max as f64 - min as f64) / n as f64 / 2.0) as f32;
        let values = edges[..n].iter().map(|&e| round_to(f64::from(e + half), 5)).collect();
        (Histogram { heights: vec![0; n], values }, Binning::new(min, max, n))
    }

    /// The histogram of `data` in `n` bins (none when `data` is empty).
    pub fn of(data: &[f32], n: usize) -> Histogram {
        if data.is_empty() {
            return Histogram::default();
        }
        let (min, max) = data.iter().fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &x| (lo.min(x), hi.max(x)));
        Histogram::of_range(data, min, max, n)
    }

    /// [`Self::of`] for data whose extremes are known.
    pub fn of_range(data: &[f32], min: f32, max: f32, n: usize) -> Histogram {
        let (mut h, bins) = Histogram::over(min, max, n);
        for &x in data {
            if let Some(b) = bins.bin(x) {
                h.heights[b] += 1;
            }
        }
        h
    }
}

/// `x` rounded to `places` decimals, as Python's `round` rounds the binary value.
pub fn round_to(x: f64, places: usize) -> f64 {
    format!("{x:.places$}").parse().unwrap_or(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linspace_ends_exactly_and_is_symmetric() {
        let v = linspace(0.0, 3.7, 11);
        assert_eq!((v[0], v[10]), (0.0, 3.7));
        assert!((v[5] - 1.85).abs() < 1e-6);
        assert!(v.windows(2).all(|w| w[1] > w[0]));
    }

    #[test]
    fn histc_puts_the_maximum_in_the_last_bin_and_widens_a_point() {
        let h = Histogram::of(&[1.0, 2.0, 2.0, 3.0], 4);
        assert_eq!(h.heights, vec![1, 0, 2, 1]);
        assert_eq!(h.values, vec![1.25, 1.75, 2.25, 2.75]);
        let b = Binning::new(2.0, 2.0, 4);
        assert_eq!(b.bin(2.0), Some(2));
        assert_eq!(b.bin(5.0), None);
    }

    /// Around each threshold the bins change exactly there: the float below is in a lower
    /// bin, the threshold in its own; over ranges wide, narrow, negative and a widened point.
    #[test]
    fn thresholds_are_each_bins_least_member() {
        let below = |x: f32| if x > 0.0 { f32::from_bits(x.to_bits() - 1) } else { f32::from_bits(x.to_bits() + 1) };
        for (lo, hi, n) in [(0.013f32, 97.31f32, 50), (1.0, 1.0 + 3e-6, 50), (-2.5, 7.0, 7), (2.0, 2.0, 4), (0.1, 0.3, 10)] {
            let b = Binning::new(lo, hi, n);
            let t = b.thresholds();
            assert_eq!(t[0], b.lo);
            for (i, &x) in t.iter().enumerate().filter(|(_, x)| x.is_finite()) {
                assert!(b.bin(x).unwrap() >= i, "[{lo}, {hi}] bin {i}");
                if i > 0 {
                    assert!(b.bin(below(x)).unwrap() < i, "[{lo}, {hi}] bin {i}: {} below {x}", below(x));
                }
            }
            assert!(t.windows(2).all(|w| w[0] <= w[1]));
            // Every float of a narrow range lands where the thresholds say.
            if hi - lo < 1e-5 {
                let mut x = b.lo;
                while x <= b.hi {
                    let by_t = t.iter().rposition(|&s| s <= x).unwrap();
                    assert_eq!(Some(by_t), b.bin(x), "{x}");
                    x = f32::from_bits(x.to_bits() + 1);
                }
            }
        }
    }

    #[test]
    fn rounding_is_decimal() {
        assert_eq!(round_to(0.123456, 5), 0.12346);
        assert_eq!(round_to(-2.5e-7, 5), -0.0);
    }
}
