//! One model pass's feature activations kept where they were computed (a GPU run's batch).
//! The first pass's extremes and counts are reductions there, and only the columns in which
//! some row can enter a feature's top group come back ([`crate::scan::Scan::first_on_device`]);
//! the second pass's histogram bins and interval counts are comparisons there
//! ([`SecondTargets`], [`BinCounts`]), and only the columns of features one of whose quantile
//! samples takes from the batch come back ([`crate::scan::Scan::second_on_device`]). Early in
//! a pass that is every column; as the groups and samples fill, fewer.

use std::ops::Range;

use burn::tensor::{Bool, Device, Int, Tensor, TensorData};
use burnlens_model::gpu::BinCountInput;
use burnlens_model::read_back::read_together;

use crate::batch::ActBatch;
use crate::config::DashboardConfig;
use crate::error::DashboardError;

/// Where the passes read a batch: from host memory (the whole batch read back) or on the
/// device that computed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScanPlace {
    Host,
    Device,
}

impl ScanPlace {
    /// The host for a CPU's batches, the device for a GPU's.
    pub fn for_device(device: &Device) -> Self {
        if burnlens_model::backend::is_host(device) { ScanPlace::Host } else { ScanPlace::Device }
    }
}

/// Feature activations of consecutive windows, on their device.
pub struct DeviceBatch {
    /// `[rows, n_features]`, ignored tokens and positions zero (as [`ActBatch::mask`] makes them).
    pub acts: Tensor<2>,
    /// The token of each row.
    pub tokens: Vec<u32>,
    pub seq_len: usize,
    /// The corpus index of the first window.
    pub first_window: u64,
}

/// A batch's per-feature statistics: the largest activation, the smallest above zero (+∞
/// where none), how many are above zero and how many exactly zero, and the largest over the
/// rows an example may be centred on (−∞ where none).
pub struct Extremes {
    pub max: Vec<f32>,
    pub min_positive: Vec<f32>,
    pub positive: Vec<u64>,
    pub zeros: Vec<u64>,
    pub centre_max: Vec<f32>,
}

impl DeviceBatch {
    /// The batch of `windows` (corpus index of the first: `first_window`), `acts` one row per
    /// token; the ignored rows are zeroed on the device.
    pub fn new(acts: Tensor<2>, windows: &[Vec<u32>], first_window: u64, cfg: &DashboardConfig) -> Self {
        let (tokens, seq_len) = (windows.concat(), windows[0].len());
        let ignored: Vec<bool> = tokens.iter().enumerate().map(|(r, &t)| !cfg.counts(t, r % seq_len)).collect();
        let acts = if ignored.contains(&true) {
            let mask = row_mask(ignored, &acts);
            acts.mask_fill(mask, 0.0)
        } else {
            acts
        };
        DeviceBatch { acts, tokens, seq_len, first_window }
    }

    pub fn rows(&self) -> usize {
        self.tokens.len()
    }

    pub fn n_features(&self) -> usize {
        self.acts.dims()[1]
    }

    /// Each feature's statistics over the batch, in one read: five `[features]` rows gathered
    /// on the device (the counts whole numbers in f32, exact below 2²⁴ rows).
    pub fn extremes(&self, centre: Range<usize>) -> Result<Extremes, DashboardError> {
        let (a, n) = (&self.acts, self.n_features());
        assert!(self.rows() < 1 << 24, "a batch of {} rows: its counts would not be whole in f32", self.rows());
        let positive = a.clone().greater_elem(0.0);
        let rows = [
            a.clone().max_dim(0),
            a.clone().mask_fill(positive.clone().bool_not(), f32::INFINITY).min_dim(0),
            positive.float().sum_dim(0),
            a.clone().equal_elem(0.0).float().sum_dim(0),
            a.clone().mask_fill(self.outside(centre), f32::NEG_INFINITY).max_dim(0),
        ];
        let [max, min_positive, positive, zeros, centre_max] = read_together(rows.map(|r| r.reshape([n])).to_vec()).try_into().expect("five rows");
        let whole = |v: Vec<f32>| v.into_iter().map(|c| c as u64).collect();
        Ok(Extremes { max, min_positive, positive: whole(positive), zeros: whole(zeros), centre_max })
    }

    /// `[rows, n_features]` true on the rows whose window position is outside `centre` (the
    /// positions an example may be centred on).
    fn outside(&self, centre: Range<usize>) -> Tensor<2, Bool> {
        row_mask((0..self.rows()).map(|r| !centre.contains(&(r % self.seq_len))).collect(), &self.acts)
    }

    /// The columns `cols` (in that order) read back as a host batch of `cols.len()` features.
    pub fn columns(&self, cols: &[usize]) -> Result<ActBatch, DashboardError> {
        let idx = Tensor::<1, Int>::from_data(TensorData::new(cols.iter().map(|&c| c as i64).collect::<Vec<_>>(), [cols.len()]), &self.acts.device());
        let acts = self.acts.clone().select(1, idx);
        Ok(ActBatch { acts: floats(acts)?, n_features: cols.len(), tokens: self.tokens.clone(), seq_len: self.seq_len, first_window: self.first_window })
    }
}

/// What the second pass compares a batch with on the device, `[_, features]` each: every
/// feature's histogram thresholds (one row per bin), its histogram's upper end, and its
/// quantile intervals' boundaries (one row per boundary).
pub struct SecondTargets {
    thresholds: Tensor<2>,
    top: Tensor<2>,
    bounds: Tensor<2>,
}

impl SecondTargets {
    /// From per-feature rows: `thresholds` `[features, n_bins]`, `top` `[features]`,
    /// `bounds` `[features, n_quantiles + 1]`.
    pub fn new(thresholds: &[f32], top: &[f32], bounds: &[f32], device: &Device) -> Self {
        let n = top.len();
        let by_row = |v: &[f32]| Tensor::<2>::from_data(TensorData::new(v.to_vec(), [n, v.len() / n]), device).transpose();
        SecondTargets { thresholds: by_row(thresholds), top: by_row(top), bounds: by_row(bounds) }
    }
}

/// A batch's second-pass counts, per feature (column), taken on the device: positives in
/// each histogram bin, positives in each quantile interval over all rows and over the rows
/// an example may be centred on, and the centre's zeros.
pub struct BinCounts {
    /// Counted by burnlens's kernel (`burnlens_model::gpu::bin_counts`) rather than by
    /// composed tensor operations.
    pub by_kernel: bool,
    n: usize,
    bins: usize,
    intervals: usize,
    /// `[bins + 2 · intervals + 1, n]`: the rows above in that order.
    counts: Vec<u64>,
}

impl BinCounts {
    /// Every count, `[bins + 2 · intervals + 1, features]` row-major: the bins, then each
    /// interval's count over all rows and over the centre rows, then the centre's zeros.
    pub fn all(&self) -> &[u64] {
        &self.counts
    }

    fn at(&self, row: usize, col: usize) -> u64 {
        self.counts[row * self.n + col]
    }

    /// Positives in histogram bin `b`.
    pub fn bin(&self, col: usize, b: usize) -> u64 {
        self.at(b, col)
    }

    /// Positives in quantile interval `i` (both ends inclusive), over all rows.
    pub fn contains(&self, col: usize, i: usize) -> u64 {
        self.at(self.bins + 2 * i, col)
    }

    /// Positives in interval `i` on the rows an example may be centred on.
    pub fn offers(&self, col: usize, i: usize) -> u64 {
        self.at(self.bins + 2 * i + 1, col)
    }

    /// Zeros on the rows an example may be centred on.
    pub fn centre_zeros(&self, col: usize) -> u64 {
        self.at(self.bins + 2 * self.intervals, col)
    }
}

impl DeviceBatch {
    /// The second pass's counts of this batch against `t`, all read back at once: by
    /// burnlens's kernel on a GPU (one launch), else one `[rows, features]` comparison per
    /// threshold and boundary.
    pub fn bin_counts(&self, t: &SecondTargets, centre: Range<usize>) -> Result<BinCounts, DashboardError> {
        let (n, bins, intervals) = (self.n_features(), t.thresholds.dims()[0], t.bounds.dims()[0] - 1);
        let input =
            BinCountInput { acts: &self.acts, thresholds: &t.thresholds, top: &t.top, bounds: &t.bounds, centre: [self.seq_len, centre.start, centre.end] };
        if let Some(c) = burnlens_model::gpu::bin_counts(input) {
            let counts = floats(c)?.into_iter().map(|c| c as u64).collect();
            return Ok(BinCounts { by_kernel: true, n, bins, intervals, counts });
        }
        let a = &self.acts;
        let rows = self.rows();
        let row = |m: &Tensor<2>, i: usize| m.clone().narrow(0, i, 1).expand([rows, n]);
        let positive = a.clone().greater_elem(0.0);
        let centre = self.outside(centre).bool_not();
        let in_range = positive.clone().bool_and(a.clone().lower_equal(row(&t.top, 0)));
        // Positives at or above each threshold; a bin's count is the difference of two.
        let mut sums: Vec<Tensor<2, Int>> =
            (0..bins).map(|b| in_range.clone().bool_and(a.clone().greater_equal(row(&t.thresholds, b))).int().sum_dim(0)).collect();
        for i in 0..intervals {
            let inside = positive.clone().bool_and(a.clone().greater_equal(row(&t.bounds, i))).bool_and(a.clone().lower_equal(row(&t.bounds, i + 1)));
            sums.push(inside.clone().int().sum_dim(0));
            sums.push(inside.bool_and(centre.clone()).int().sum_dim(0));
        }
        sums.push(a.clone().equal_elem(0.0).bool_and(centre).int().sum_dim(0));
        let mut counts = counts(Tensor::cat(sums, 0))?;
        for b in 0..bins.saturating_sub(1) {
            for c in 0..n {
                counts[b * n + c] -= counts[(b + 1) * n + c];
            }
        }
        Ok(BinCounts { by_kernel: false, n, bins, intervals, counts })
    }
}

/// A CPU run's batch: `acts` (one row per token of `windows`) read back whole, as the host
/// passes read it (not yet masked: [`ActBatch::mask`]).
pub fn read_back(acts: Tensor<2>, windows: &[Vec<u32>], first_window: u64) -> Result<ActBatch, DashboardError> {
    let n_features = acts.dims()[1];
    Ok(ActBatch { acts: floats(acts)?, n_features, tokens: windows.concat(), seq_len: windows[0].len(), first_window })
}

/// `[rows, n]` true on the rows `rows` marks, on `like`'s device.
fn row_mask(rows: Vec<bool>, like: &Tensor<2>) -> Tensor<2, Bool> {
    let [r, n] = like.dims();
    Tensor::<1, Bool>::from_data(TensorData::new(rows, [r]), &like.device()).reshape([r, 1]).expand([r, n])
}

fn floats<const D: usize>(t: Tensor<D>) -> Result<Vec<f32>, DashboardError> {
    t.into_data().try_into_vec_as::<f32>().map_err(|e| DashboardError::Input(format!("feature activations: {e:?}")))
}

fn counts(t: Tensor<2, Int>) -> Result<Vec<u64>, DashboardError> {
    let v = t.into_data().try_into_vec_as::<i64>().map_err(|e| DashboardError::Input(format!("feature counts: {e:?}")))?;
    Ok(v.into_iter().map(|c| c as u64).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scan::Scan;

    /// Activations as a pass meets them: mostly zeros, ties at a few values (the top groups'
    /// order among equals), values on the quantile boundaries, some negatives, a column that
    /// never fires.
    fn acts(rows: usize, n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed | 1;
        (0..rows * n)
            .map(|i| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                match (i % n, s % 10) {
                    (3, _) => 0.0,
                    (_, 0..=5) => 0.0,
                    (_, 6) => ((s >> 20) % 3) as f32,
                    (_, 7) => -(((s >> 20) % 100) as f32) / 50.0,
                    // On the quantile boundaries (each feature's maximum is 100: 0, 10, ...).
                    (_, 8) => ((s >> 20) % 11) as f32 * 10.0,
                    _ => ((s >> 20) % 100_000) as f32 / 1000.0,
                }
            })
            .collect()
    }

    /// Windows of 16 tokens, three a batch, and their activations.
    fn batches(n: usize) -> Vec<(Vec<Vec<u32>>, Vec<f32>)> {
        (0..8u64)
            .map(|batch| {
                let tokens = (0..3).map(|w| (0..16u32).map(|p| (p * 5 + w + batch as u32) % 11).collect()).collect();
                (tokens, acts(48, n, batch + 1))
            })
            .collect()
    }

    fn state(s: &Scan) -> Vec<u8> {
        let mut v = Vec::new();
        ciborium::into_writer(&(&s.first, &s.second, s.positions), &mut v).unwrap();
        v
    }

    /// Both passes over the same batches, on the host and on the device (the CPU backend
    /// standing in): the same state after each, and the columns read back fewer as the top
    /// groups and quantile samples fill.
    #[test]
    fn the_device_passes_leave_the_host_passes_state() {
        let device = Device::flex();
        let cfg = DashboardConfig { ignore_tokens: vec![7], ignore_positions: vec![2], top_k: 4, quantile_size: 3, ..DashboardConfig::default() };
        // Two blocks of features (the second a partial one).
        let n = 150;
        let (mut host, mut dev) = (Scan::new(cfg.clone(), (0..n).collect(), 16), Scan::new(cfg.clone(), (0..n).collect(), 16));
        let data = batches(n);
        let tensor = |a: &[f32]| Tensor::<2>::from_data(TensorData::new(a.to_vec(), [48, n]), &device);
        let (mut first_read, mut second_read) = (Vec::new(), Vec::new());
        for pass in 1..=2 {
            let t = (pass == 2).then(|| dev.second_targets(&device));
            for (i, (tokens, a)) in data.iter().enumerate() {
                let mut b = read_back(tensor(a), tokens, 3 * i as u64).unwrap();
                b.mask(&cfg);
                let d = DeviceBatch::new(tensor(a), tokens, 3 * i as u64, &cfg);
                let centre = cfg.centre_range(16);
                if let Some(t) = &t {
                    host.second(&b);
                    let c = d.bin_counts(t, centre).unwrap();
                    assert!(!c.by_kernel, "the CPU backend counts by composed operations");
                    second_read.push(dev.second.iter().map(|p| (0..p.n).filter(|&j| p.takes(j, &c, &cfg)).count()).sum::<usize>());
                    dev.second_on_device(&d, t).unwrap();
                } else {
                    host.first(&b);
                    let e = d.extremes(centre).unwrap();
                    first_read.push((0..n).filter(|&c| e.centre_max[c] > dev.first[c / 128].bar(c % 128)).count());
                    dev.first_on_device(&d).unwrap();
                }
            }
            assert_eq!(state(&dev), state(&host), "after pass {pass}");
            if pass == 1 {
                host.start_second();
                dev.start_second();
            }
        }
        assert!(host.first[0].top.len.iter().all(|&l| l == 4), "the top groups fill");
        assert_eq!((first_read[0], second_read[0]), (n, n), "the first batch reads every column back");
        assert!(first_read[7] < n / 2, "later batches read few columns back: {first_read:?}");
        assert!(second_read[7] < n, "later batches skip some columns: {second_read:?}");
    }
}
