//! circuit-tracer's `attribute` arguments as a user spells them, once: the `graph` command's
//! flags (with the `clap` feature) and Python's keyword arguments (as JSON) both read this
//! struct, and [`AttributeArgs::options`] turns it into the library's [`AttributeOptions`].

use serde::Deserialize;

use crate::attribute::{AttributeOptions, LogitTargets};

/// How an attribution graph is built (circuit-tracer's arguments and defaults).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
#[serde(default, deny_unknown_fields)]
pub struct AttributeArgs {
    /// Explain the most probable next tokens, at most this many...
    #[cfg_attr(feature = "clap", arg(long, default_value_t = AttributeArgs::default().max_n_logits))]
    pub max_n_logits: usize,
    /// ...until their probabilities sum to this.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = AttributeArgs::default().desired_logit_prob))]
    pub desired_logit_prob: f32,
    /// Target nodes per backward pass.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = AttributeArgs::default().batch_size))]
    pub batch_size: usize,
    /// Compute rows for at most this many features, the most influential first (all by default).
    #[cfg_attr(feature = "clap", arg(long))]
    pub max_feature_nodes: Option<usize>,
    /// Batches of feature rows between re-rankings by influence.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = AttributeArgs::default().update_interval))]
    pub update_interval: usize,
    /// Leading positions without features or errors (the BOS token).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = AttributeArgs::default().zero_positions))]
    pub zero_positions: usize,
    /// Keep every layer's attention pattern while they fit in this many GB; past it they are
    /// recomputed for each backward pass (less memory, more time).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = AttributeArgs::default().pattern_memory_gb))]
    pub pattern_memory_gb: f64,
    /// Keep the adjacency rows in memory while they fit in this many GB; past it they live in
    /// a mapped temporary file under TMPDIR (bounded by the disk, not by RAM).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = AttributeArgs::default().rows_memory_gb))]
    pub rows_memory_gb: f64,
}

impl Default for AttributeArgs {
    fn default() -> Self {
        AttributeArgs {
            max_n_logits: 10,
            desired_logit_prob: 0.95,
            batch_size: 512,
            max_feature_nodes: None,
            update_interval: 4,
            zero_positions: 1,
            pattern_memory_gb: 4.0,
            rows_memory_gb: 8.0,
        }
    }
}

impl AttributeArgs {
    /// The library's options; `targets` (token ids) replaces the most probable tokens.
    pub fn options(&self, targets: Option<Vec<i64>>) -> AttributeOptions {
        let gb = |x: f64| (x.max(0.0) * 1e9) as u64;
        AttributeOptions {
            targets: match targets {
                Some(t) => LogitTargets::Tokens(t),
                None => LogitTargets::Salient { max_n_logits: self.max_n_logits, desired_prob: self.desired_logit_prob },
            },
            batch_size: self.batch_size,
            max_feature_nodes: self.max_feature_nodes,
            update_interval: self.update_interval,
            zero_positions: self.zero_positions,
            pattern_budget: gb(self.pattern_memory_gb),
            row_budget: gb(self.rows_memory_gb),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_the_librarys_and_keywords_read_by_name() {
        let o = AttributeArgs::default().options(None);
        let d = AttributeOptions::default();
        assert_eq!(
            (o.targets, o.batch_size, o.max_feature_nodes, o.update_interval, o.zero_positions),
            (d.targets, d.batch_size, d.max_feature_nodes, d.update_interval, d.zero_positions)
        );
        let a: AttributeArgs = serde_json::from_str(r#"{"batch_size": 7, "rows_memory_gb": 0}"#).unwrap();
        assert_eq!((a.batch_size, a.options(Some(vec![3])).row_budget, a.max_n_logits), (7, 0, 10));
        let e = serde_json::from_str::<AttributeArgs>(r#"{"batch": 7}"#).unwrap_err().to_string();
        assert!(e.contains("unknown field `batch`"), "{e}");
    }
}
