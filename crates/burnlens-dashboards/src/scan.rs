//! The two passes over the corpus for a set of features, their blocks scanned in parallel:
//! first the extremes, density and top groups, then the histograms and quantile groups.
//! Memory: per feature, the top group and the quantile samples (`top_k + n_quantiles ×
//! quantile_size` examples of `width` tokens and activations), the histogram's bins and a
//! few counters; nothing grows with the corpus.

use rayon::prelude::*;

use crate::batch::ActBatch;
use crate::config::DashboardConfig;
use crate::dashboard::{FeatureDashboard, assemble};
use crate::device_batch::{DeviceBatch, SecondTargets};
use crate::error::DashboardError;
use crate::first_pass::FirstPass;
use crate::logits::LogitEffects;
use crate::second_pass::SecondPass;

/// Features per block: a block's state is walked for every row, so it should stay in cache.
const BLOCK: usize = 128;

#[derive(serde::Serialize, serde::Deserialize)]
pub struct Scan {
    pub cfg: DashboardConfig,
    /// The feature ids, in the batches' column order.
    pub features: Vec<usize>,
    pub seq_len: usize,
    pub first: Vec<FirstPass>,
    pub second: Vec<SecondPass>,
    /// Positions (tokens) read by each pass.
    pub positions: [u64; 2],
}

impl Scan {
    pub fn new(cfg: DashboardConfig, features: Vec<usize>, seq_len: usize) -> Self {
        let width = cfg.width(seq_len);
        let n = features.len();
        let first = (0..n).step_by(BLOCK).map(|f0| FirstPass::new(f0, BLOCK.min(n - f0), &cfg, width)).collect();
        Scan { cfg, features, seq_len, first, second: Vec::new(), positions: [0, 0] }
    }

    /// Bytes the per-feature state holds (the bound on this pass's memory besides one batch).
    pub fn state_bytes(&self) -> usize {
        let w = self.cfg.width(self.seq_len);
        let per_example = 16 + 8 * w;
        let examples = self.cfg.top_k + self.cfg.n_quantiles * self.cfg.quantile_size;
        let per_feature = examples * per_example + self.cfg.n_bins * 8 * 2 + (self.cfg.n_quantiles + 1) * 4 + self.cfg.n_quantiles * (8 + 32) + 32;
        per_feature * self.features.len()
    }

    pub fn first(&mut self, b: &ActBatch) {
        self.check(b.n_features, b.seq_len);
        let cfg = &self.cfg;
        self.first.par_iter_mut().for_each(|p| p.scan(b, cfg));
        self.positions[0] += b.rows() as u64;
    }

    /// The first pass over a batch on its device: the extremes and counts are reductions
    /// there; read back are those and the columns in which a centre row passes its feature's
    /// top-group bar, whose rows are offered as [`Self::first`] offers them. The state after
    /// is [`Self::first`]'s, bit for bit.
    pub fn first_on_device(&mut self, b: &DeviceBatch) -> Result<(), DashboardError> {
        self.check(b.n_features(), b.seq_len);
        let e = b.extremes(self.cfg.centre_range(b.seq_len))?;
        let cols: Vec<usize> = self.first.iter().flat_map(|p| (0..p.n).filter(|&j| e.centre_max[p.f0 + j] > p.bar(j)).map(move |j| p.f0 + j)).collect();
        let sub = if cols.is_empty() { None } else { Some(b.columns(&cols)?) };
        let cfg = &self.cfg;
        self.first.par_iter_mut().for_each(|p| {
            p.add_extremes(&e);
            if let Some(sub) = &sub {
                p.offer_columns(sub, &block_columns(&cols, p.f0, p.n), cfg);
            }
        });
        self.positions[0] += b.rows() as u64;
        Ok(())
    }

    /// Ends the first pass: the second's intervals and bins are placed.
    pub fn start_second(&mut self) {
        let width = self.cfg.width(self.seq_len);
        self.second = self.first.iter().map(|f| SecondPass::new(f, &self.cfg, width, &self.features)).collect();
    }

    pub fn second(&mut self, b: &ActBatch) {
        self.check(b.n_features, b.seq_len);
        let cfg = &self.cfg;
        self.second.par_iter_mut().for_each(|p| p.scan(b, cfg));
        self.positions[1] += b.rows() as u64;
    }

    /// What [`Self::second_on_device`] compares batches on `device` with: every feature's
    /// histogram thresholds and quantile boundaries, made once for the pass.
    pub fn second_targets(&self, device: &burn::tensor::Device) -> SecondTargets {
        let edges: Vec<(Vec<f32>, Vec<f32>)> = self.second.iter().map(|p| p.bin_edges(self.cfg.n_bins)).collect();
        let thresholds: Vec<f32> = edges.iter().flat_map(|e| e.0.iter().copied()).collect();
        let top: Vec<f32> = edges.iter().flat_map(|e| e.1.iter().copied()).collect();
        let bounds: Vec<f32> = self.second.iter().flat_map(|p| p.bounds.iter().copied()).collect();
        SecondTargets::new(&thresholds, &top, &bounds, device)
    }

    /// The second pass over a batch on its device: histogram bins and interval counts by
    /// comparisons there ([`SecondTargets`]); read back are those counts and the columns of
    /// the features one of whose quantile samples takes from this batch, which are scanned
    /// as [`Self::second`] scans them. The state after is [`Self::second`]'s, bit for bit.
    pub fn second_on_device(&mut self, b: &DeviceBatch, t: &SecondTargets) -> Result<(), DashboardError> {
        self.check(b.n_features(), b.seq_len);
        let counts = b.bin_counts(t, self.cfg.centre_range(b.seq_len))?;
        let cfg = &self.cfg;
        let cols: Vec<usize> = self.second.iter().flat_map(|p| (0..p.n).filter(|&j| p.takes(j, &counts, cfg)).map(move |j| p.f0 + j)).collect();
        let sub = if cols.is_empty() { None } else { Some(b.columns(&cols)?) };
        self.second.par_iter_mut().for_each(|p| {
            let mine = block_columns(&cols, p.f0, p.n);
            let mut scanned = mine.iter().map(|m| m.0).peekable();
            for j in 0..p.n {
                if scanned.next_if_eq(&j).is_none() {
                    p.add_counts(j, &counts, cfg);
                }
            }
            if let Some(sub) = &sub {
                p.scan_columns(sub, &mine, cfg);
            }
        });
        self.positions[1] += b.rows() as u64;
        Ok(())
    }

    /// Adds another stream's first pass (its blocks, over `positions` positions of other
    /// windows of the same corpus).
    pub fn merge_first(&mut self, other: &[FirstPass], positions: u64) {
        self.first.par_iter_mut().zip(other).for_each(|(a, b)| a.merge(b));
        self.positions[0] += positions;
    }

    /// Adds another stream's second pass (both started from the same merged first pass).
    pub fn merge_second(&mut self, other: &[SecondPass], positions: u64) {
        let cfg = &self.cfg;
        self.second.par_iter_mut().zip(other).zip(&self.first).for_each(|((a, b), f)| a.merge(b, f, cfg));
        self.positions[1] += positions;
    }

    fn check(&self, n_features: usize, seq_len: usize) {
        assert_eq!((n_features, seq_len), (self.features.len(), self.seq_len), "a batch of another shape than the scan's");
    }

    /// The dashboards, in feature order; `logits(feature)` gives each one's logit effects.
    pub fn finish(&self, logits: &mut dyn FnMut(usize) -> LogitEffects) -> Vec<FeatureDashboard> {
        assert_eq!(self.positions[0], self.positions[1], "the two passes read different corpora");
        self.first.iter().zip(&self.second).flat_map(|(f, s)| assemble(f, s, &self.features, self.positions[0], logits)).collect()
    }
}

/// The block `f0..f0 + n`'s features among the sorted columns `cols` read back, each paired
/// with its column in the batch read back: `(feature in the block, column)`.
fn block_columns(cols: &[usize], f0: usize, n: usize) -> Vec<(usize, usize)> {
    let (lo, hi) = (cols.partition_point(|&c| c < f0), cols.partition_point(|&c| c < f0 + n));
    (lo..hi).map(|c| (cols[c] - f0, c)).collect()
}
