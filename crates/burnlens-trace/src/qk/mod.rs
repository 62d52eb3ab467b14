//! QK attributions: why a head attends where it does ("Tracing Attention Computation Through
//! Feature Interactions", Transformer Circuits 2025; circuit-tracer issue #53).
//!
//! With the norms' scales frozen as the attribution graph freezes them, a head's
//! pre-softmax score `s(q, k) = (query at q) · (key at k) · scale` is a bilinear function of
//! the residual streams at `q` and `k`. Each stream is written as a sum of parts at its
//! position ([`QkNode`]: the graph's features, errors and token there, what earlier heads
//! wrote there, skip terms, constants; [`stream`]), each part is mapped to its query or
//! key ([`project`]: norm, projection, QK-norm, rotary for the position), and the score is
//! the sum over pairs of parts of `query(part_i) · key(part_j) · scale` — exact, not a
//! gradient estimate: the terms add up to the model's score (before any soft-cap).

mod frozen;
mod node;
mod project;
mod stream;

use burn::tensor::{Int, Tensor, TensorData};
use burnlens_model::{AttnHook, Forward, Hooks, LayerHook, Stop, Transformer};
use serde::{Deserialize, Serialize};

pub use node::QkNode;
use project::{Projection, Side, model_side, projection_points};
use stream::{for_each_part, stream_points};

use crate::TraceError;
use crate::transcoder::{TranscoderSet, tensor};

/// Which head, which pairs, how many terms: the `qk` command's flags and Python's keyword
/// arguments (as JSON) both read this struct.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
#[serde(deny_unknown_fields)]
pub struct QkOptions {
    #[cfg_attr(feature = "clap", arg(long))]
    pub layer: usize,
    #[cfg_attr(feature = "clap", arg(long))]
    pub head: usize,
    /// Terms listed per (query, key), largest first; the rest are summed into `remainder`.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = defaults::top_terms()))]
    #[serde(default = "defaults::top_terms")]
    pub top_terms: usize,
    /// Only keys the head gives at least this attention weight.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 0.0))]
    #[serde(default)]
    pub min_pattern: f32,
    /// Only each query's keys with the largest attention weights, at most this many.
    #[cfg_attr(feature = "clap", arg(long))]
    #[serde(default)]
    pub top_keys: Option<usize>,
    /// Only these query positions (comma-separated; all by default).
    #[cfg_attr(feature = "clap", arg(long, value_delimiter = ','))]
    #[serde(default)]
    pub queries: Option<Vec<usize>>,
    /// Leading positions without features (the BOS token), as in the graph.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = defaults::zero_positions()))]
    #[serde(default = "defaults::zero_positions")]
    pub zero_positions: usize,
}

mod defaults {
    pub fn top_terms() -> usize {
        10
    }

    pub fn zero_positions() -> usize {
        1
    }
}

impl QkOptions {
    /// Every key of every query of `head` at `layer`, ten terms each, BOS without features.
    pub fn new(layer: usize, head: usize) -> Self {
        Self { layer, head, top_terms: defaults::top_terms(), min_pattern: 0.0, top_keys: None, queries: None, zero_positions: defaults::zero_positions() }
    }
}

/// One pair of parts and what it adds to the score.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QkTerm {
    pub query_node: QkNode,
    pub key_node: QkNode,
    pub contribution: f32,
}

/// One (query, key) of a head: the score, its largest terms, and what the rest add.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QkRow {
    pub layer: usize,
    pub head: usize,
    pub query: usize,
    pub key: usize,
    /// The model's pre-softmax score, scaled as the model scales it, before any soft-cap.
    pub score: f32,
    /// The attention weight.
    pub pattern: f32,
    /// The largest terms by magnitude, largest first.
    pub terms: Vec<QkTerm>,
    /// The sum of every other term: `Σ terms + remainder` is the score.
    pub remainder: f32,
    /// The sum of the feature × feature terms...
    pub feature_feature: f32,
    /// ...of the terms with an error node on either side...
    pub error: f32,
    /// ...and of the rest (token, heads' outputs, skip, constants): the three add up to
    /// the score.
    pub other: f32,
}

/// The QK attributions of one head.
#[derive(Debug, Clone)]
pub struct QkHead {
    pub rows: Vec<QkRow>,
    /// Parts per position, summed over positions.
    pub n_parts: usize,
    /// How far the parts' sum is from the model's residual stream: `max |Σ parts − resid|
    /// / max |resid|`.
    pub residual_gap: f32,
}

/// The parts of every position and their queries and keys, `[n, d_head]` row-major.
struct Sides {
    nodes: Vec<Vec<QkNode>>,
    queries: Vec<Vec<f32>>,
    keys: Vec<Vec<f32>>,
}

/// Which keys of query `q` are decomposed.
fn keys_of(q: usize, pattern: &[f32], n_pos: usize, span: burnlens_model::AttentionSpan, opts: &QkOptions) -> Vec<usize> {
    let mut keys: Vec<usize> = (0..=q).filter(|&k| span.allows(q, k) && pattern[q * n_pos + k] >= opts.min_pattern).collect();
    if let Some(top) = opts.top_keys {
        keys.sort_by(|&a, &b| pattern[q * n_pos + b].total_cmp(&pattern[q * n_pos + a]));
        keys.truncate(top);
        keys.sort_unstable();
    }
    keys
}

/// The QK attributions of head `opts.head` at layer `opts.layer` on prompt `ids`, through
/// transcoders `set` (their features and errors as parts), or without (each MLP's output one
/// part; any model, attention-only and parallel blocks too).
pub fn qk_attributions(model: &Transformer, set: Option<&TranscoderSet>, ids: &[i64], opts: &QkOptions) -> Result<QkHead, TraceError> {
    if let Some(set) = set {
        set.check(&model.config)?;
    }
    model.check_ids(ids).map_err(|e| TraceError::Input(e.to_string()))?;
    if ids.is_empty() {
        return Err(TraceError::Input("the prompt has no tokens".into()));
    }
    let (n_layers, layer, head) = (model.blocks.len(), opts.layer, opts.head);
    if layer >= n_layers {
        return Err(TraceError::Input(format!("layer {layer} is out of range: the model has {n_layers} layers (0..{n_layers})")));
    }
    let attn = &model.blocks[layer].attn;
    if head >= attn.n_heads {
        return Err(TraceError::Input(format!("head {head} is out of range: layer {layer} has {} heads (0..{})", attn.n_heads, attn.n_heads)));
    }
    let device = model.device();
    let n_pos = ids.len();
    if let Some(bad) = opts.queries.iter().flatten().find(|&&q| q >= n_pos) {
        return Err(TraceError::Input(format!("query position {bad} is out of range: the prompt has {n_pos} tokens")));
    }
    let mut points = stream_points(model, set, layer);
    points.extend(projection_points(model, layer));
    let mut hooks = Hooks::capture(move |p| points.contains(&p));
    let ids_t = Tensor::<2, Int>::from_data(TensorData::new(ids.to_vec(), [1, n_pos]), &device);
    model.forward_with(Forward::new(ids_t).hooks(&mut hooks).stop(Stop::AfterBlock(layer)));
    let mut cache = hooks.take_cache();

    let pattern_point = AttnHook::Pattern.at(layer);
    let pattern =
        cache.get(&pattern_point).and_then(|a| a.rank4()).ok_or_else(|| TraceError::Mismatch(format!("the model has no hook point `{pattern_point}`")))?;
    let pattern: Vec<f32> = pattern.narrow(1, head, 1).into_data().try_into_vec_as::<f32>().expect("f32");
    let model_q = model_side(model, layer, head, Side::Query, &cache)?;
    let model_k = model_side(model, layer, head, Side::Key, &cache)?;
    let queries = Projection::new(model, layer, head, Side::Query, &cache)?;
    let keys = Projection::new(model, layer, head, Side::Key, &cache)?;

    let dh = attn.d_head;
    let mut sides = Sides { nodes: vec![Vec::new(); n_pos], queries: vec![Vec::new(); n_pos], keys: vec![Vec::new(); n_pos] };
    let host = |t: Tensor<2>| -> Vec<f32> { t.into_data().try_into_vec_as::<f32>().expect("f32") };
    let (resid, sum) = for_each_part(model, set, layer, opts.zero_positions, &mut cache, |part| {
        let positions = part.positions();
        let q = host(queries.project(part.vectors.clone(), &positions, part.constant));
        let k = host(keys.project(part.vectors, &positions, part.constant));
        for (i, node) in part.nodes.into_iter().enumerate() {
            let p = node.pos();
            sides.nodes[p].push(node);
            sides.queries[p].extend_from_slice(&q[i * dh..(i + 1) * dh]);
            sides.keys[p].extend_from_slice(&k[i * dh..(i + 1) * dh]);
        }
        Ok(())
    })?;
    let gap = resid.iter().zip(&sum).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max) / resid.iter().map(|a| a.abs()).fold(1e-30, f32::max);

    let scale = attn.scale as f32;
    let mut rows = Vec::new();
    for q in (0..n_pos).filter(|q| opts.queries.as_ref().is_none_or(|list| list.contains(q))) {
        let keys = keys_of(q, &pattern, n_pos, attn.span, opts);
        if keys.is_empty() {
            continue;
        }
        // Every term of this query with every chosen key's parts at once: [n_q, Σ n_k].
        let n_q = sides.nodes[q].len();
        let key_rows: Vec<f32> = keys.iter().flat_map(|&k| sides.keys[k].iter().copied()).collect();
        let width = key_rows.len() / dh;
        let terms = tensor(sides.queries[q].clone(), [n_q, dh], &device).matmul(tensor(key_rows, [width, dh], &device).transpose()) * scale;
        let terms: Vec<f32> = terms.into_data().try_into_vec_as::<f32>().expect("f32");
        let mut start = 0;
        for &k in &keys {
            let n_k = sides.nodes[k].len();
            let score = (0..dh).map(|e| model_q[q * dh + e] as f64 * model_k[k * dh + e] as f64).sum::<f64>() as f32 * scale;
            rows.push(row(&sides, RowAt { layer, head, query: q, key: k, score, pattern: pattern[q * n_pos + k] }, &terms, width, start, n_k, opts.top_terms));
            start += n_k;
        }
    }
    Ok(QkHead { rows, n_parts: sides.nodes.iter().map(Vec::len).sum(), residual_gap: gap })
}

/// Where a row is and what the model says there.
struct RowAt {
    layer: usize,
    head: usize,
    query: usize,
    key: usize,
    score: f32,
    pattern: f32,
}

/// The row of `at` from its terms: columns `start..start + n_k` of `terms [n_q, width]`.
fn row(sides: &Sides, at: RowAt, terms: &[f32], width: usize, start: usize, n_k: usize, top_terms: usize) -> QkRow {
    let (qn, kn) = (&sides.nodes[at.query], &sides.nodes[at.key]);
    let mut all: Vec<(usize, usize, f32)> = Vec::with_capacity(qn.len() * n_k);
    let (mut ff, mut err, mut other) = (0f64, 0f64, 0f64);
    for (i, a) in qn.iter().enumerate() {
        for (j, b) in kn.iter().enumerate() {
            let c = terms[i * width + start + j];
            all.push((i, j, c));
            match (a, b) {
                (QkNode::Feature { .. }, QkNode::Feature { .. }) => ff += c as f64,
                (QkNode::Error { .. }, _) | (_, QkNode::Error { .. }) => err += c as f64,
                _ => other += c as f64,
            }
        }
    }
    let top = top_terms.min(all.len());
    if top > 0 && top < all.len() {
        all.select_nth_unstable_by(top - 1, |x, y| y.2.abs().total_cmp(&x.2.abs()));
    }
    all.truncate(top);
    all.sort_by(|x, y| y.2.abs().total_cmp(&x.2.abs()));
    let listed: f64 = all.iter().map(|t| t.2 as f64).sum();
    let total = ff + err + other;
    QkRow {
        layer: at.layer,
        head: at.head,
        query: at.query,
        key: at.key,
        score: at.score,
        pattern: at.pattern,
        terms: all.into_iter().map(|(i, j, c)| QkTerm { query_node: qn[i], key_node: kn[j], contribution: c }).collect(),
        remainder: (total - listed) as f32,
        feature_feature: ff as f32,
        error: err as f32,
        other: other as f32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_read_by_name_with_the_librarys_defaults() {
        let o: QkOptions = serde_json::from_str(r#"{"layer": 2, "head": 3}"#).unwrap();
        assert_eq!(o, QkOptions::new(2, 3));
        let o: QkOptions = serde_json::from_str(r#"{"layer": 0, "head": 1, "top_keys": 4, "min_pattern": 0.1}"#).unwrap();
        assert_eq!((o.top_keys, o.min_pattern, o.top_terms), (Some(4), 0.1, 10));
        let e = serde_json::from_str::<QkOptions>(r#"{"layer": 0, "head": 1, "top_term": 4}"#).unwrap_err().to_string();
        assert!(e.contains("unknown field `top_term`"), "{e}");
        let e = serde_json::from_str::<QkOptions>(r#"{"layer": 0}"#).unwrap_err().to_string();
        assert!(e.contains("missing field `head`"), "{e}");
    }
}
