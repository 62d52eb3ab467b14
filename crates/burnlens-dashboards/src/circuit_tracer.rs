//! circuit-tracer's local feature files (its frontend's `feature_models.Model`: one
//! `<index>.json` per feature in a folder its graph viewer reads as a "scan" starting with
//! `./`): the example groups with each token's activation, the logit tables as strings, the
//! activation range, the quantile boundaries, the histogram and the activation frequency.

use serde_json::{Value, json};

use crate::dashboard::{Example, FeatureDashboard};

fn example(e: &Example, centre: usize, tok: &dyn Fn(u32) -> String) -> Value {
    json!({
        "tokens_acts_list": e.acts,
        "train_token_ind": centre,
        "is_repeated_datapoint": false,
        "tokens": e.tokens.iter().map(|&t| tok(t)).collect::<Vec<_>>(),
    })
}

/// The index circuit-tracer's viewer asks for: a graph node's `feature`, Cantor's pairing
/// of (layer, feature) for a transcoder's feature; the feature's own index for an SAE's.
pub fn viewer_index(d: &FeatureDashboard) -> usize {
    match d.layer {
        Some(l) => (l + d.feature) * (l + d.feature + 1) / 2 + d.feature,
        None => d.feature,
    }
}

/// One feature's file; `transcoder_id` names the set, `centre_index` maps a position to
/// the index of the shown token it is.
pub fn feature(d: &FeatureDashboard, transcoder_id: &str, tok: &dyn Fn(u32) -> String, centre_index: &dyn Fn(usize) -> usize) -> Value {
    let mut groups = vec![json!({
        "quantile_name": "Top activations",
        "examples": d.top.iter().map(|e| example(e, centre_index(e.position), tok)).collect::<Vec<_>>(),
    })];
    groups.extend(d.quantiles.iter().map(|q| {
        json!({
            "quantile_name": format!("Interval {:.3} – {:.3} ({:.3}%)", q.lower, q.upper, q.contains * 100.0),
            "examples": q.examples.iter().map(|e| example(e, centre_index(e.position), tok)).collect::<Vec<_>>(),
        })
    }));
    let act_min = d.acts_histogram.values.first().copied().unwrap_or(0.0);
    let mut bounds: Vec<f32> = d.quantiles.iter().map(|q| q.lower).collect();
    bounds.reverse();
    json!({
        "transcoder_id": transcoder_id,
        "index": viewer_index(d),
        "examples_quantiles": groups,
        "top_logits": d.logits.top.iter().map(|r| tok(r.0)).collect::<Vec<_>>(),
        "bottom_logits": d.logits.bottom.iter().map(|r| tok(r.0)).collect::<Vec<_>>(),
        "act_min": act_min.min(0.0),
        "act_max": d.max,
        "quantile_values": bounds,
        "histogram": d.acts_histogram.heights,
        "activation_frequency": d.density,
    })
}
