//! A dashboard run as a user describes it (the `dashboards` flags, Python's keyword
//! arguments): names and defaults written once, here, and turned into a [`DashboardConfig`].

use serde::Deserialize;

use crate::config::{Context, DashboardConfig};
use crate::error::DashboardError;

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
#[serde(default, deny_unknown_fields)]
pub struct DashboardOptions {
    /// Tokens read (whole windows; each pass reads them).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = DashboardOptions::default().tokens))]
    pub tokens: u64,
    /// Features: all, or ids and ranges such as 0-99,512 (within each layer for transcoders).
    #[cfg_attr(feature = "clap", arg(long))]
    pub features: Option<String>,
    /// Examples in the top group.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = DashboardOptions::default().top_k))]
    pub top_k: usize,
    /// Quantile groups, and examples sampled in each.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = DashboardOptions::default().quantiles))]
    pub quantiles: usize,
    #[cfg_attr(feature = "clap", arg(long, default_value_t = DashboardOptions::default().quantile_size))]
    pub quantile_size: usize,
    /// Tokens shown before and after an example's token.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = DashboardOptions::default().before))]
    pub before: usize,
    #[cfg_attr(feature = "clap", arg(long, default_value_t = DashboardOptions::default().after))]
    pub after: usize,
    /// Show each example's whole window (SAEDashboard's Neuronpedia runner) instead.
    #[cfg_attr(feature = "clap", arg(long))]
    pub whole_window: bool,
    /// Count activations on BOS too (by default they read zero, as SAEDashboard's Neuronpedia
    /// runner ignores BOS, EOS and padding).
    #[cfg_attr(feature = "clap", arg(long))]
    pub keep_bos: bool,
    /// Windows per model pass.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = DashboardOptions::default().batch))]
    pub batch: usize,
    /// Seconds between checkpoints (OUT/checkpoints/; the same command resumes from them).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = DashboardOptions::default().checkpoint_every))]
    pub checkpoint_every: f64,
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 0))]
    pub seed: u64,
    /// Keep the first pass's encoder inputs on disk (OUT/inputs.spill) for the second pass
    /// instead of running the model again, when they take at most this many GB (0: never).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = DashboardOptions::default().spill_gb))]
    pub spill_gb: f64,
}

impl Default for DashboardOptions {
    fn default() -> Self {
        let c = DashboardConfig::default();
        DashboardOptions {
            tokens: 100_000,
            features: None,
            top_k: c.top_k,
            quantiles: c.n_quantiles,
            quantile_size: c.quantile_size,
            before: 5,
            after: 5,
            whole_window: false,
            keep_bos: false,
            batch: 16,
            checkpoint_every: 60.0,
            seed: 0,
            spill_gb: 16.0,
        }
    }
}

impl DashboardOptions {
    /// The configuration for windows of `seq_len` tokens of a model whose BOS is `bos`.
    pub fn config(&self, seq_len: usize, bos: Option<u32>) -> Result<DashboardConfig, DashboardError> {
        if self.batch == 0 || self.top_k == 0 || self.tokens == 0 || self.quantiles == 0 || self.quantile_size == 0 {
            return Err(DashboardError::Input("batch, top_k, quantiles, quantile_size and tokens must be positive".into()));
        }
        let context = if self.whole_window { Context::Window } else { Context::Around { before: self.before, after: self.after } };
        if let Context::Around { before, after } = context
            && before + after + 2 > seq_len
        {
            return Err(DashboardError::Input(format!("before {before} and after {after} leave no room in windows of {seq_len} tokens (seq_len)")));
        }
        Ok(DashboardConfig {
            top_k: self.top_k,
            n_quantiles: self.quantiles,
            quantile_size: self.quantile_size,
            context,
            ignore_tokens: if self.keep_bos { Vec::new() } else { bos.into_iter().collect() },
            seed: self.seed,
            ..DashboardConfig::default()
        })
    }

    /// The feature ids asked for (`None`: all).
    pub fn feature_ids(&self) -> Result<Option<Vec<usize>>, DashboardError> {
        self.features.as_deref().map(parse_features).transpose()
    }
}

/// `0-99,512` as ids.
pub fn parse_features(s: &str) -> Result<Vec<usize>, DashboardError> {
    let bad = |p: &str| DashboardError::Input(format!("features: `{p}` is not a feature id or a range such as 0-99"));
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.trim().parse().map_err(|_| bad(part))?, b.trim().parse().map_err(|_| bad(part))?);
                if b < a {
                    return Err(bad(part));
                }
                out.extend(a..=b);
            }
            None => out.push(part.parse().map_err(|_| bad(part))?),
        }
    }
    Ok(out)
}
