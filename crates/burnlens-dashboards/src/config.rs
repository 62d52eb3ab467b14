//! What a dashboard shows, with SAEDashboard's defaults (`SequencesConfig`, the histogram and
//! logit-table configs, `SaeVisConfig`'s ignore lists).

use serde::{Deserialize, Serialize};

/// How much of a window each example shows around its token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Context {
    /// `before` tokens before and `after` after (SAEDashboard's `buffer=(5, 5)`); examples are
    /// chosen only where the whole context fits, one token more on the left.
    Around { before: usize, after: usize },
    /// The whole window but its first token (SAEDashboard's `buffer=None`, as its Neuronpedia
    /// runner uses). Examples are centred on the shown positions only (SAEDashboard may centre
    /// one on the unshown first position, which Neuronpedia then reads at index -1).
    Window,
}

/// The settings of one dashboard run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DashboardConfig {
    /// Examples in the top group (`top_acts_group_size`).
    pub top_k: usize,
    /// Quantile groups (`n_quantiles`) and examples in each (`quantile_group_size`).
    pub n_quantiles: usize,
    pub quantile_size: usize,
    pub context: Context,
    /// Bars of the activation and logit histograms.
    pub n_bins: usize,
    /// Rows of the top and bottom logit tables.
    pub logit_rows: usize,
    /// Token ids whose activations count as zero (`ignore_tokens`; SAEDashboard's Neuronpedia
    /// runner passes BOS, EOS and padding).
    pub ignore_tokens: Vec<u32>,
    /// Positions whose activations count as zero (`ignore_positions`).
    pub ignore_positions: Vec<usize>,
    /// Seeds the quantile groups' sampling.
    pub seed: u64,
}

impl Default for DashboardConfig {
    fn default() -> Self {
        DashboardConfig {
            top_k: 20,
            n_quantiles: 10,
            quantile_size: 5,
            context: Context::Around { before: 5, after: 5 },
            n_bins: 50,
            logit_rows: 10,
            ignore_tokens: Vec::new(),
            ignore_positions: Vec::new(),
            seed: 0,
        }
    }
}

impl DashboardConfig {
    /// Positions of a `seq_len` window that examples may be centred on (SAEDashboard's
    /// `buffer=(before + 1, -after)`; `after = 0` reads to the end).
    pub fn centre_range(&self, seq_len: usize) -> std::ops::Range<usize> {
        match self.context {
            Context::Around { before, after } => (before + 1).min(seq_len)..seq_len.saturating_sub(after),
            Context::Window => 1..seq_len,
        }
    }

    /// The window positions an example centred on `pos` shows.
    pub fn shown(&self, pos: usize, seq_len: usize) -> std::ops::Range<usize> {
        match self.context {
            Context::Around { before, after } => pos - before..pos + after + 1,
            Context::Window => 1..seq_len,
        }
    }

    /// Tokens an example shows.
    pub fn width(&self, seq_len: usize) -> usize {
        match self.context {
            Context::Around { before, after } => before + after + 1,
            Context::Window => seq_len - 1,
        }
    }

    /// Whether an activation at `pos` of a window holding `token` counts (not ignored).
    pub fn counts(&self, token: u32, pos: usize) -> bool {
        !self.ignore_tokens.contains(&token) && !self.ignore_positions.contains(&pos)
    }
}
