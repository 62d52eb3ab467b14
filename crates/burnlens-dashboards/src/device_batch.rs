//! One model pass's feature activations kept where they were computed (a GPU run's batch):
//! the first pass's extremes and counts are reductions there, and only the columns in which
//! some row can enter a feature's top group come back to the host ([`crate::scan::Scan::first_on_device`]).
//! Early in a pass that is every column; once the top groups fill, a few.

use std::ops::Range;

use burn::tensor::{Bool, Device, Int, Tensor, TensorData};

use crate::batch::ActBatch;
use crate::config::DashboardConfig;
use crate::error::DashboardError;

/// Where the first pass reads a batch: from host memory (the whole batch read back) or on the
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

    /// Each feature's statistics over the batch (five vectors read back).
    pub fn extremes(&self, centre: Range<usize>) -> Result<Extremes, DashboardError> {
        let a = &self.acts;
        let positive = a.clone().greater_elem(0.0);
        let outside: Vec<bool> = (0..self.rows()).map(|r| !centre.contains(&(r % self.seq_len))).collect();
        Ok(Extremes {
            max: floats(a.clone().max_dim(0))?,
            min_positive: floats(a.clone().mask_fill(positive.clone().bool_not(), f32::INFINITY).min_dim(0))?,
            positive: counts(positive.int().sum_dim(0))?,
            zeros: counts(a.clone().equal_elem(0.0).int().sum_dim(0))?,
            centre_max: floats(a.clone().mask_fill(row_mask(outside, a), f32::NEG_INFINITY).max_dim(0))?,
        })
    }

    /// The columns `cols` (in that order) read back as a host batch of `cols.len()` features.
    pub fn columns(&self, cols: &[usize]) -> Result<ActBatch, DashboardError> {
        let idx = Tensor::<1, Int>::from_data(TensorData::new(cols.iter().map(|&c| c as i64).collect::<Vec<_>>(), [cols.len()]), &self.acts.device());
        let acts = self.acts.clone().select(1, idx);
        Ok(ActBatch { acts: floats(acts)?, n_features: cols.len(), tokens: self.tokens.clone(), seq_len: self.seq_len, first_window: self.first_window })
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
    /// order among equals), some negatives, a column that never fires.
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
                    _ => ((s >> 20) % 100_000) as f32 / 1000.0,
                }
            })
            .collect()
    }

    #[test]
    fn the_device_first_pass_leaves_the_host_passs_state() {
        let device = Device::flex();
        let cfg = DashboardConfig { ignore_tokens: vec![7], ignore_positions: vec![2], top_k: 4, ..DashboardConfig::default() };
        // Two blocks of features (the second a partial one), windows of 16 tokens.
        let (n, seq_len, windows) = (150, 16, 3);
        let mut host = Scan::new(cfg.clone(), (0..n).collect(), seq_len);
        let mut dev = Scan::new(cfg.clone(), (0..n).collect(), seq_len);
        let mut read_back_columns = Vec::new();
        for batch in 0..6u64 {
            let tokens: Vec<Vec<u32>> = (0..windows).map(|w| (0..seq_len as u32).map(|p| (p * 5 + w as u32 + batch as u32) % 11).collect()).collect();
            let a = acts(windows * seq_len, n, batch + 1);
            let t = Tensor::<2>::from_data(TensorData::new(a.clone(), [windows * seq_len, n]), &device);
            let mut b = read_back(t.clone(), &tokens, batch * windows as u64).unwrap();
            b.mask(&cfg);
            host.first(&b);
            let d = DeviceBatch::new(t, &tokens, batch * windows as u64, &cfg);
            let e = d.extremes(cfg.centre_range(seq_len)).unwrap();
            read_back_columns.push((0..n).filter(|&c| e.centre_max[c] > dev.first[c / 128].bar(c % 128)).count());
            dev.first_on_device(&d).unwrap();
        }
        let bytes = |s: &Scan| {
            let mut v = Vec::new();
            ciborium::into_writer(&(&s.first, s.positions), &mut v).unwrap();
            v
        };
        assert_eq!(bytes(&dev), bytes(&host));
        assert!(host.first[0].top.len.iter().all(|&l| l == 4), "the top groups fill");
        assert_eq!(read_back_columns[0], n, "the first batch reads every column back");
        assert!(read_back_columns[5] < n / 2, "later batches read few columns back: {read_back_columns:?}");
    }
}
