//! The second pass, per block of features, once the first has found each feature's extremes:
//! the activation histogram (`torch.histc` of the nonzero activations over their own range)
//! and the quantile groups (intervals `linspace(0, max, n + 1)`, inclusive at both ends, the
//! lowest holding the zeros): how many of all positions each holds and a uniform sample of
//! the positions examples may be centred on.

use crate::batch::{ActBatch, Slots};
use crate::config::DashboardConfig;
use crate::device_batch::BinCounts;
use crate::first_pass::FirstPass;
use crate::histogram::{Binning, Histogram, linspace};
use crate::reservoir::{Reservoir, Take};

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct SecondPass {
    pub f0: usize,
    pub n: usize,
    pub histograms: Vec<Histogram>,
    binnings: Vec<Option<Binning>>,
    /// Each feature's `n_quantiles + 1` boundaries.
    pub bounds: Vec<f32>,
    /// Positions in each interval, `[feature, interval]`, lowest interval first.
    pub contains: Vec<u64>,
    pub reservoirs: Vec<Reservoir>,
    pub samples: Slots,
}

impl SecondPass {
    pub fn new(first: &FirstPass, cfg: &DashboardConfig, width: usize, features: &[usize]) -> Self {
        let (n, nq) = (first.n, cfg.n_quantiles);
        let mut bounds = Vec::with_capacity(n * (nq + 1));
        let mut histograms = Vec::with_capacity(n);
        let mut binnings = Vec::with_capacity(n);
        for j in 0..n {
            bounds.extend(linspace(0.0, first.max[j].max(0.0), nq + 1));
            if first.nonzero[j] > 0 {
                let (h, b) = Histogram::over(first.min_nonzero[j], first.max[j], cfg.n_bins);
                histograms.push(h);
                binnings.push(Some(b));
            } else {
                histograms.push(Histogram::default());
                binnings.push(None);
            }
        }
        let reservoirs = (0..n * nq)
            .map(|o| Reservoir::new(cfg.seed.wrapping_mul(0x1000_0000_01B3) ^ ((features[first.f0 + o / nq] as u64) << 8 | (o % nq) as u64)))
            .collect();
        // The zeros (every ignored position among them) are in the intervals holding 0: the
        // lowest, or all of them when the feature never fires.
        let mut contains = vec![0; n * nq];
        for j in 0..n {
            contains[zero_intervals(&bounds, j, nq)].iter_mut().for_each(|c| *c = first.zeros[j]);
        }
        SecondPass { f0: first.f0, n, histograms, binnings, bounds, contains, reservoirs, samples: Slots::new(n * nq, cfg.quantile_size, width) }
    }

    /// Adds another stream's second pass of the same block, both started from the same
    /// (merged) first pass: histograms and interval counts add (the zeros, which both
    /// started from, once), and each quantile group's sample is merged
    /// ([`Reservoir::merge`]).
    pub fn merge(&mut self, other: &SecondPass, first: &FirstPass, cfg: &DashboardConfig) {
        assert_eq!((self.f0, self.n), (other.f0, other.n), "merging second passes of different blocks");
        let nq = cfg.n_quantiles;
        for j in 0..self.n {
            for (h, o) in self.histograms[j].heights.iter_mut().zip(&other.histograms[j].heights) {
                *h += o;
            }
            let zeros = zero_intervals(&self.bounds, j, nq);
            for o in j * nq..(j + 1) * nq {
                self.contains[o] += other.contains[o] - if zeros.contains(&o) { first.zeros[j] } else { 0 };
            }
        }
        for o in 0..self.n * nq {
            let mine = self.samples.owner(o);
            let (a, b) = self.reservoirs[o].merge(&other.reservoirs[o], cfg.quantile_size);
            for (slot, (src, s)) in a.iter().map(|&s| (&mine, (0, s))).chain(b.iter().map(|&s| (&other.samples, (o, s)))).enumerate() {
                self.samples.copy_from(o, slot, src, s.0, s.1);
            }
        }
    }

    pub fn scan(&mut self, b: &ActBatch, cfg: &DashboardConfig) {
        let centre = cfg.centre_range(b.seq_len);
        for r in 0..b.rows() {
            let in_centre = centre.contains(&(r % b.seq_len));
            for j in 0..self.n {
                self.visit(j, b, Entry { row: r, col: self.f0 + j, in_centre }, cfg);
            }
        }
    }

    /// [`Self::scan`] for some of the block's features: `cols` pairs a feature `j` of the
    /// block with its column in `b` (a batch of those columns alone).
    pub fn scan_columns(&mut self, b: &ActBatch, cols: &[(usize, usize)], cfg: &DashboardConfig) {
        let centre = cfg.centre_range(b.seq_len);
        for r in 0..b.rows() {
            let in_centre = centre.contains(&(r % b.seq_len));
            for &(j, col) in cols {
                self.visit(j, b, Entry { row: r, col, in_centre }, cfg);
            }
        }
    }

    /// Feature `j`'s activation at one entry of `b`. Called for every entry of a batch, it
    /// and the two below are always inlined: shared by two callers, LLVM left them calls,
    /// which cost the host's second pass 5–20% of its time.
    #[inline(always)]
    fn visit(&mut self, j: usize, b: &ActBatch, at: Entry, cfg: &DashboardConfig) {
        let a = b.acts[at.row * b.n_features + at.col];
        if a > 0.0 {
            self.positive(j, a, b, at, cfg);
        } else if a == 0.0 && at.in_centre {
            // Zeros were counted by the first pass; here they are only offered to the
            // sample of the intervals holding 0.
            self.offer_zero(j, b, at, cfg);
        }
    }

    #[inline(always)]
    fn positive(&mut self, j: usize, a: f32, b: &ActBatch, at: Entry, cfg: &DashboardConfig) {
        let (nq, k) = (cfg.n_quantiles, cfg.quantile_size);
        if let Some(bin) = self.binnings[j].and_then(|bins| bins.bin(a)) {
            self.histograms[j].heights[bin] += 1;
        }
        let q = &self.bounds[j * (nq + 1)..(j + 1) * (nq + 1)];
        let Some((lo, hi)) = intervals(q, a) else { return };
        for i in lo..=hi {
            let o = j * nq + i;
            self.contains[o] += 1;
            if at.in_centre
                && let Take::Into(slot) = self.reservoirs[o].offer(k)
            {
                self.samples.set(o, slot, b, at.row, at.col, cfg);
            }
        }
    }

    #[inline(always)]
    fn offer_zero(&mut self, j: usize, b: &ActBatch, at: Entry, cfg: &DashboardConfig) {
        let (nq, k) = (cfg.n_quantiles, cfg.quantile_size);
        for o in zero_intervals(&self.bounds, j, nq) {
            if let Take::Into(slot) = self.reservoirs[o].offer(k) {
                self.samples.set(o, slot, b, at.row, at.col, cfg);
            }
        }
    }

    /// Each feature's histogram bins as comparisons ([`Binning::thresholds`], `[n, n_bins]`)
    /// and its range's upper end; a feature that never fired counts nothing (+∞, −∞).
    pub fn bin_edges(&self, n_bins: usize) -> (Vec<f32>, Vec<f32>) {
        let edges = self.binnings.iter().map(|b| match b {
            Some(b) => (b.thresholds(), b.hi),
            None => (vec![f32::INFINITY; n_bins], f32::NEG_INFINITY),
        });
        let (t, hi): (Vec<Vec<f32>>, Vec<f32>) = edges.unzip();
        (t.concat(), hi)
    }

    /// Offers to feature `j`'s interval `i` in a batch counted on the device (column `c`):
    /// its centre positives there, and its centre zeros where the interval holds 0.
    fn offers(&self, j: usize, i: usize, c: &BinCounts, col: usize, nq: usize) -> u64 {
        c.offers(col, i) + if zero_intervals(&self.bounds, j, nq).contains(&(j * nq + i)) { c.centre_zeros(col) } else { 0 }
    }

    /// Whether any of feature `j`'s quantile samples takes from a batch counted on the device
    /// (its column `f0 + j` of `c`): then its column is read back and scanned.
    pub fn takes(&self, j: usize, c: &BinCounts, cfg: &DashboardConfig) -> bool {
        let nq = cfg.n_quantiles;
        (0..nq).any(|i| self.reservoirs[j * nq + i].takes_within(self.offers(j, i, c, self.f0 + j, nq), cfg.quantile_size))
    }

    /// Adds a batch counted on the device to feature `j` (column `f0 + j` of `c`), none of
    /// whose samples takes from it ([`Self::takes`]): what [`Self::scan`] would have added.
    pub fn add_counts(&mut self, j: usize, c: &BinCounts, cfg: &DashboardConfig) {
        let (nq, col) = (cfg.n_quantiles, self.f0 + j);
        for (bin, h) in self.histograms[j].heights.iter_mut().enumerate() {
            *h += c.bin(col, bin);
        }
        for i in 0..nq {
            let offers = self.offers(j, i, c, col, nq);
            self.contains[j * nq + i] += c.contains(col, i);
            self.reservoirs[j * nq + i].skip(offers);
        }
    }
}

/// An entry of a batch: its row and column, and whether an example may be centred on it.
#[derive(Clone, Copy)]
struct Entry {
    row: usize,
    col: usize,
    in_centre: bool,
}

/// Feature `j`'s intervals (indices into `contains`) that hold the zeros: the lowest, or
/// all of them when the feature never fires.
fn zero_intervals(bounds: &[f32], j: usize, nq: usize) -> std::ops::RangeInclusive<usize> {
    let hi = if bounds[j * (nq + 1) + 1] > 0.0 { 0 } else { nq - 1 };
    j * nq..=j * nq + hi
}

/// The intervals `[q[i], q[i+1]]` holding `a`, lowest and highest (none for values outside).
#[inline]
pub fn intervals(q: &[f32], a: f32) -> Option<(usize, usize)> {
    let n = q.len() - 1;
    let top = q[n];
    if a == 0.0 && q[1] > 0.0 {
        return Some((0, 0));
    }
    if !(a >= 0.0 && a <= top) {
        return None;
    }
    let mut g = if top > 0.0 { ((a / top * n as f32) as usize).min(n - 1) } else { 0 };
    while g > 0 && q[g] > a {
        g -= 1;
    }
    while g < n - 1 && q[g + 1] < a {
        g += 1;
    }
    let (mut lo, mut hi) = (g, g);
    while lo > 0 && q[lo] == a {
        lo -= 1;
    }
    while hi < n - 1 && q[hi + 1] == a {
        hi += 1;
    }
    Some((lo, hi))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_are_inclusive_at_both_ends() {
        let q = linspace(0.0, 2.0, 5); // 0, .5, 1, 1.5, 2
        assert_eq!(intervals(&q, 0.0), Some((0, 0)));
        assert_eq!(intervals(&q, 0.25), Some((0, 0)));
        assert_eq!(intervals(&q, 0.5), Some((0, 1)));
        assert_eq!(intervals(&q, 2.0), Some((3, 3)));
        assert_eq!(intervals(&q, 2.5), None);
        assert_eq!(intervals(&[0.0, 0.0, 0.0], 0.0), Some((0, 1)));
        // Against the definition, on a grid through every boundary.
        for i in 0..=400 {
            let a = i as f32 * 0.005;
            let want: Vec<usize> = (0..4).filter(|&j| q[j] <= a && a <= q[j + 1]).collect();
            let got = intervals(&q, a).map(|(lo, hi)| (lo..=hi).collect::<Vec<_>>()).unwrap_or_default();
            assert_eq!(got, want, "a = {a}");
        }
    }
}
