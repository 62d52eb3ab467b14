//! The JSON Neuronpedia imports from SAEDashboard (`NeuronpediaConverter.convert_to_np_json`:
//! one batch file of features, its fields and roundings). Left empty, as SAEDashboard leaves
//! them without its feature tables and DFA: the neuron-alignment and correlation lists, the
//! decoder-weight distribution, the vector.

use serde_json::{Value, json};

use crate::dashboard::{Example, FeatureDashboard};
use crate::histogram::round_to;

/// Where the features come from, for the batch's header and each feature's dataset fields.
pub struct BatchInfo<'a> {
    pub model_id: &'a str,
    pub layer: usize,
    pub sae_set: &'a str,
    pub dataset: &'a str,
    pub n_prompts_total: u64,
    pub n_tokens_in_prompt: usize,
    /// The index of the shown token an example is centred on, given its position.
    pub centre_index: &'a dyn Fn(usize) -> usize,
}

fn r3(v: f64) -> f64 {
    round_to(v, 3)
}

/// SAEDashboard's title numbers, as Neuronpedia parses them back (three decimals).
fn title_number(v: f64) -> f64 {
    format!("{v:.3}").parse().unwrap()
}

fn activation(e: &Example, bins: (f64, f64, f64), tok: &dyn Fn(u32) -> String, info: &BatchInfo) -> Value {
    json!({
        "bin_min": bins.0, "bin_max": bins.1, "bin_contains": bins.2,
        "tokens": e.tokens.iter().map(|&t| tok(t)).collect::<Vec<_>>(),
        "values": e.acts.iter().map(|&a| r3(a as f64)).collect::<Vec<_>>(),
        "qualifying_token_index": (info.centre_index)(e.position),
    })
}

/// One feature as Neuronpedia's `NeuronpediaDashboardFeature.to_dict`.
pub fn feature(d: &FeatureDashboard, tok: &dyn Fn(u32) -> String, info: &BatchInfo) -> Value {
    let mut acts: Vec<Value> = d.top.iter().map(|e| activation(e, (-1.0, title_number(d.max as f64), -1.0), tok, info)).collect();
    for q in &d.quantiles {
        let bins = (title_number(q.lower as f64), title_number(q.upper as f64), title_number(q.contains * 100.0) / 100.0);
        acts.extend(q.examples.iter().map(|e| activation(e, bins, tok, info)));
    }
    let nonzero = d.acts_histogram.heights.iter().sum::<u64>() > 0;
    let list = |v: &[f64]| v.iter().map(|&x| r3(x)).collect::<Vec<_>>();
    let heights = |h: &[u64]| h.iter().map(|&x| x as f64).collect::<Vec<_>>();
    json!({
        "feature_index": d.feature,
        "neuron_alignment_indices": [], "neuron_alignment_values": [], "neuron_alignment_l1": [],
        "correlated_neurons_indices": [], "correlated_neurons_l1": [], "correlated_neurons_pearson": [],
        "correlated_features_indices": [], "correlated_features_l1": [], "correlated_features_pearson": [],
        "neg_str": d.logits.bottom.iter().map(|r| tok(r.0)).collect::<Vec<_>>(),
        "neg_values": d.logits.bottom.iter().map(|r| r3(r.1 as f64)).collect::<Vec<_>>(),
        "pos_str": d.logits.top.iter().map(|r| tok(r.0)).collect::<Vec<_>>(),
        "pos_values": d.logits.top.iter().map(|r| r3(r.1 as f64)).collect::<Vec<_>>(),
        "frac_nonzero": if nonzero { title_number(d.density * 100.0) / 100.0 } else { 0.0 },
        "freq_hist_data_bar_values": list(&d.acts_histogram.values),
        "freq_hist_data_bar_heights": heights(&d.acts_histogram.heights),
        "logits_hist_data_bar_heights": heights(&d.logits.histogram.heights),
        "logits_hist_data_bar_values": list(&d.logits.histogram.values),
        "n_prompts_total": info.n_prompts_total,
        "n_tokens_in_prompt": info.n_tokens_in_prompt,
        "dataset": info.dataset,
        "decoder_weights_dist": [],
        "activations": acts,
        "vector": [],
    })
}

/// A batch file (`batch-N.json`).
pub fn batch(features: &[FeatureDashboard], tok: &dyn Fn(u32) -> String, info: &BatchInfo) -> Value {
    json!({
        "model_id": info.model_id,
        "layer": info.layer,
        "sae_set": info.sae_set,
        "sae_id_suffix": null,
        "features": features.iter().map(|d| feature(d, tok, info)).collect::<Vec<_>>(),
    })
}
