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

    #[test]
    fn rounding_is_decimal() {
        assert_eq!(round_to(0.123456, 5), 0.12346);
        assert_eq!(round_to(-2.5e-7, 5), -0.0);
    }
}
