//! The first pass over the corpus, per block of features: each feature's largest activation,
//! its smallest nonzero one, how often it is nonzero, and its top group. The second pass
//! needs the extremes (they place the histogram's bins and the quantile groups).

use crate::batch::ActBatch;
use crate::config::DashboardConfig;
use crate::device_batch::Extremes;
use crate::top::TopGroups;

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct FirstPass {
    /// The block's first feature column and its width.
    pub f0: usize,
    pub n: usize,
    pub max: Vec<f32>,
    /// The smallest activation above zero (+∞ while there is none).
    pub min_nonzero: Vec<f32>,
    pub nonzero: Vec<u64>,
    /// Positions where it reads exactly zero.
    pub zeros: Vec<u64>,
    pub top: TopGroups,
    bar: Vec<f32>,
}

impl FirstPass {
    pub fn new(f0: usize, n: usize, cfg: &DashboardConfig, width: usize) -> Self {
        FirstPass {
            f0,
            n,
            max: vec![f32::NEG_INFINITY; n],
            min_nonzero: vec![f32::INFINITY; n],
            nonzero: vec![0; n],
            zeros: vec![0; n],
            top: TopGroups::new(n, cfg.top_k, width),
            bar: vec![f32::NEG_INFINITY; n],
        }
    }

    /// Adds another stream's first pass of the same block (another rank's windows): the
    /// extremes and counts combine and the top groups merge ([`TopGroups::merge`]).
    pub fn merge(&mut self, other: &FirstPass) {
        assert_eq!((self.f0, self.n), (other.f0, other.n), "merging first passes of different blocks");
        for j in 0..self.n {
            self.max[j] = self.max[j].max(other.max[j]);
            self.min_nonzero[j] = self.min_nonzero[j].min(other.min_nonzero[j]);
            self.nonzero[j] += other.nonzero[j];
            self.zeros[j] += other.zeros[j];
        }
        self.top.merge(&other.top);
        for j in 0..self.n {
            self.bar[j] = self.top.bar(j);
        }
    }

    pub fn scan(&mut self, b: &ActBatch, cfg: &DashboardConfig) {
        let centre = cfg.centre_range(b.seq_len);
        for r in 0..b.rows() {
            let row = &b.row(r)[self.f0..self.f0 + self.n];
            for ((((&a, max), min), nz), z) in row.iter().zip(&mut self.max).zip(&mut self.min_nonzero).zip(&mut self.nonzero).zip(&mut self.zeros) {
                *max = max.max(a);
                let pos = a > 0.0;
                *nz += pos as u64;
                *z += (a == 0.0) as u64;
                *min = if pos { min.min(a) } else { *min };
            }
            if !centre.contains(&(r % b.seq_len)) {
                continue;
            }
            // Sixteen at a time: most blocks have nothing that enters a top group.
            for c0 in (0..self.n).step_by(16) {
                let c1 = (c0 + 16).min(self.n);
                if !row[c0..c1].iter().zip(&self.bar[c0..c1]).fold(false, |hit, (a, bar)| hit | (a > bar)) {
                    continue;
                }
                for j in c0..c1 {
                    if row[j] > self.bar[j] {
                        self.top.offer(j, b, r, self.f0 + j, cfg);
                        self.bar[j] = self.top.bar(j);
                    }
                }
            }
        }
    }

    /// The smallest value that enters feature `j`'s top group (−∞ while it is not full).
    pub fn bar(&self, j: usize) -> f32 {
        self.bar[j]
    }

    /// Adds a batch's statistics taken on its device (columns `f0..f0 + n` of `e`): what
    /// [`Self::scan`] counts, without the top groups.
    pub fn add_extremes(&mut self, e: &Extremes) {
        let cols = self.f0..self.f0 + self.n;
        for (j, c) in cols.enumerate() {
            self.max[j] = self.max[j].max(e.max[c]);
            self.min_nonzero[j] = self.min_nonzero[j].min(e.min_positive[c]);
            self.nonzero[j] += e.positive[c];
            self.zeros[j] += e.zeros[c];
        }
    }

    /// Offers a batch's centre rows to the top groups of some of the block's features: `cols`
    /// pairs a feature `j` of the block with its column in `b` (a batch of those columns
    /// alone). The same offers, in the same order, as [`Self::scan`] makes for them.
    pub fn offer_columns(&mut self, b: &ActBatch, cols: &[(usize, usize)], cfg: &DashboardConfig) {
        let centre = cfg.centre_range(b.seq_len);
        for r in (0..b.rows()).filter(|r| centre.contains(&(r % b.seq_len))) {
            let row = b.row(r);
            for &(j, c) in cols {
                if row[c] > self.bar[j] {
                    self.top.offer(j, b, r, c, cfg);
                    self.bar[j] = self.top.bar(j);
                }
            }
        }
    }
}
