//! A feature's dashboard: what SAEDashboard's `FeatureData` holds for Neuronpedia (the top
//! and quantile groups of examples, the activation histogram and density, the logit effects)
//! and how the passes' per-block state becomes one.

use serde::{Deserialize, Serialize};

pub use crate::batch::Example;
use crate::first_pass::FirstPass;
use crate::histogram::Histogram;
use crate::logits::LogitEffects;
use crate::second_pass::SecondPass;

/// A quantile group: activations in `[lower, upper]`, `contains` the fraction of all
/// positions there, and its sample.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QuantileGroup {
    pub lower: f32,
    pub upper: f32,
    pub contains: f64,
    pub examples: Vec<Example>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FeatureDashboard {
    /// The feature's index (within its layer for a transcoder set).
    pub feature: usize,
    /// Its layer, for a transcoder set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer: Option<usize>,
    /// The largest activation (over every position, ignored ones reading zero).
    pub max: f32,
    /// Fraction of all positions where it is above zero.
    pub density: f64,
    pub acts_histogram: Histogram,
    pub logits: LogitEffects,
    /// Largest first.
    pub top: Vec<Example>,
    /// Highest interval first, as SAEDashboard lists them.
    pub quantiles: Vec<QuantileGroup>,
}

/// The dashboards of one block of features, from its two passes over `positions` positions.
pub fn assemble(
    first: &FirstPass,
    second: &SecondPass,
    features: &[usize],
    positions: u64,
    logits: &mut dyn FnMut(usize) -> LogitEffects,
) -> Vec<FeatureDashboard> {
    let nq = second.contains.len() / first.n.max(1);
    (0..first.n)
        .map(|j| {
            let feature = features[first.f0 + j];
            let top = (0..first.top.len[j]).map(|s| first.top.slots.example(j, s)).collect();
            let q = &second.bounds[j * (nq + 1)..(j + 1) * (nq + 1)];
            let quantiles = (0..nq)
                .rev()
                .map(|i| {
                    let o = j * nq + i;
                    let mut examples: Vec<Example> = (0..second.reservoirs[o].len(second.samples.per)).map(|s| second.samples.example(o, s)).collect();
                    examples.sort_by_key(|e| (e.window, e.position));
                    QuantileGroup { lower: q[i], upper: q[i + 1], contains: second.contains[o] as f64 / positions.max(1) as f64, examples }
                })
                .collect();
            FeatureDashboard {
                feature,
                layer: None,
                max: first.max[j],
                density: first.nonzero[j] as f64 / positions.max(1) as f64,
                acts_histogram: second.histograms[j].clone(),
                logits: logits(feature),
                top,
                quantiles,
            }
        })
        .collect()
}

impl FeatureDashboard {
    pub fn key(&self) -> FeatureKey {
        FeatureKey { layer: self.layer, index: self.feature }
    }
}

/// A feature's name: its index, and its layer for a transcoder set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct FeatureKey {
    pub layer: Option<usize>,
    pub index: usize,
}

impl FeatureKey {
    /// The name of its files: `12`, or `3_12` for feature 12 of layer 3.
    pub fn stem(&self) -> String {
        match self.layer {
            Some(l) => format!("{l}_{}", self.index),
            None => self.index.to_string(),
        }
    }
}
