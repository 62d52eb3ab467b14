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
mod row;
mod stream;

use std::collections::BTreeMap;

use burn::tensor::{Int, Tensor, TensorData};
use burnlens_model::{AttnHook, BlockHook, Forward, Hooks, LayerHook, Stop, Transformer};
use serde::Deserialize;

pub use node::QkNode;
use project::{HeadSides, Side, model_side, projection_points};
pub use row::{QkRow, QkTerm};
use row::{Ranked, row};
use stream::{Captured, Kept, Known, Part, StreamOf, for_each_part, stream_points};

use crate::TraceError;
use crate::graph::Graph;
use crate::transcoder::TranscoderSet;

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

/// The QK attributions of one head.
#[derive(Debug, Clone)]
pub struct QkHead {
    pub rows: Vec<QkRow>,
    /// Parts of the residual streams, summed over positions.
    pub n_parts: usize,
    /// How far the parts' sum is from the model's residual stream: `max |Σ parts − resid|
    /// / max |resid|`.
    pub residual_gap: f32,
}

/// Which keys of query `q` are decomposed: the visible ones the options choose, and `extra`.
fn keys_of(q: usize, pattern: &[f32], n_pos: usize, span: burnlens_model::AttentionSpan, opts: &QkOptions, extra: &[usize]) -> Vec<usize> {
    let mut keys: Vec<usize> = (0..=q).filter(|&k| span.allows(q, k) && pattern[q * n_pos + k] >= opts.min_pattern).collect();
    if let Some(top) = opts.top_keys {
        keys.sort_by(|&a, &b| pattern[q * n_pos + b].total_cmp(&pattern[q * n_pos + a]));
        keys.truncate(top);
    }
    keys.extend(extra.iter().copied().filter(|&k| k <= q && span.allows(q, k)));
    keys.sort_unstable();
    keys.dedup();
    keys
}

/// `opts` against the model, the transcoders and the prompt: one line naming what is wrong.
fn check(model: &Transformer, set: Option<&TranscoderSet>, ids: &[i64], opts: &QkOptions) -> Result<(), TraceError> {
    if let Some(set) = set {
        set.check(&model.config)?;
    }
    model.check_ids(ids).map_err(|e| TraceError::Input(e.to_string()))?;
    if ids.is_empty() {
        return Err(TraceError::Input("the prompt has no tokens".into()));
    }
    let (n_layers, layer, head, n_pos) = (model.blocks.len(), opts.layer, opts.head, ids.len());
    if layer >= n_layers {
        return Err(TraceError::Input(format!("layer {layer} is out of range: the model has {n_layers} layers (0..{n_layers})")));
    }
    let n_heads = model.blocks[layer].attn.n_heads;
    if head >= n_heads {
        return Err(TraceError::Input(format!("head {head} is out of range: layer {layer} has {n_heads} heads (0..{n_heads})")));
    }
    if let Some(bad) = opts.queries.iter().flatten().find(|&&q| q >= n_pos) {
        return Err(TraceError::Input(format!("query position {bad} is out of range: the prompt has {n_pos} tokens")));
    }
    Ok(())
}

/// One forward pass up to the last of `layers`, keeping what the decomposition of their
/// heads reads.
fn capture(model: &Transformer, set: Option<&TranscoderSet>, ids: &[i64], layers: &[usize]) -> Captured {
    let last = layers.iter().copied().max().unwrap_or(0);
    let mut points = stream_points(model, set, last);
    layers.iter().for_each(|&l| points.extend([BlockHook::ResidPre.at(l)].into_iter().chain(projection_points(model, l))));
    let mut hooks = Hooks::capture(move |p| points.contains(&p));
    let ids_t = Tensor::<2, Int>::from_data(TensorData::new(ids.to_vec(), [1, ids.len()]), &model.device());
    model.forward_with(Forward::new(ids_t).hooks(&mut hooks).stop(Stop::AfterBlock(last)));
    hooks.take_cache()
}

/// The QK attributions of head `opts.head` at layer `opts.layer` on prompt `ids`, through
/// transcoders `set` (their features and errors as parts), or without (each MLP's output one
/// part; any model, attention-only and parallel blocks too).
pub fn qk_attributions(model: &Transformer, set: Option<&TranscoderSet>, ids: &[i64], opts: &QkOptions) -> Result<QkHead, TraceError> {
    check(model, set, ids, opts)?;
    let cache = capture(model, set, ids, &[opts.layer]);
    Ok(heads_rows(&Walked { model, set, ids, cache: &cache, known: None }, &[(opts.clone(), BTreeMap::new())])?.remove(0))
}

/// Heads of an attribution graph, one layer's at a time: each request's options and, per
/// query, keys to decompose besides those the options choose.
pub(crate) type LayerRequests = Vec<(QkOptions, BTreeMap<usize, Vec<usize>>)>;

/// The rows of the heads `by_layer` asks for on `graph`'s prompt, from one forward pass and,
/// per layer, one decomposition of its stream; the graph's active features stand for the
/// transcoders' (no encoding again: any activations would do, the error nodes take up the
/// difference, so the terms still add up to the score).
pub(crate) fn graph_rows(model: &Transformer, set: &TranscoderSet, graph: &Graph, by_layer: &[LayerRequests]) -> Result<Vec<QkRow>, TraceError> {
    let ids = &graph.input_tokens;
    let mut layers = Vec::new();
    for requests in by_layer.iter().filter(|r| !r.is_empty()) {
        let first = &requests[0].0;
        for (opts, _) in requests {
            check(model, Some(set), ids, opts)?;
            if (opts.layer, opts.zero_positions) != (first.layer, first.zero_positions) {
                return Err(TraceError::Input(format!("one layer's heads at a time: {} and {}", first.layer, opts.layer)));
            }
        }
        layers.push(first.layer);
    }
    let cache = capture(model, Some(set), ids, &layers);
    let walked =
        Walked { model, set: Some(set), ids, cache: &cache, known: Some(Known { features: &graph.active_features, values: &graph.activation_values }) };
    let mut rows = Vec::new();
    for requests in by_layer.iter().filter(|r| !r.is_empty()) {
        rows.extend(heads_rows(&walked, requests)?.into_iter().flat_map(|h| h.rows));
    }
    Ok(rows)
}

/// What the decompositions of one prompt read: the model, the transcoders, the captured
/// activations, and active features found before.
struct Walked<'a> {
    model: &'a Transformer,
    set: Option<&'a TranscoderSet>,
    ids: &'a [i64],
    cache: &'a Captured,
    known: Option<Known<'a>>,
}

/// One head's side of the decomposition: what its rows read, and the parts' queries and keys
/// at the positions they read.
struct HeadParts<'m> {
    opts: &'m QkOptions,
    pattern: Vec<f32>,
    /// The model's own queries and keys of the head, `[pos, d_head]`.
    model_q: Vec<f32>,
    model_k: Vec<f32>,
    sides: HeadSides<'m>,
    chosen: Vec<(usize, Vec<usize>)>,
    as_query: Vec<bool>,
    as_key: Vec<bool>,
    nodes: Vec<Vec<QkNode>>,
    qv: Vec<Vec<f32>>,
    kv: Vec<Vec<f32>>,
}

impl<'m> HeadParts<'m> {
    fn new(model: &'m Transformer, cache: &Captured, opts: &'m QkOptions, extra: &BTreeMap<usize, Vec<usize>>, n_pos: usize) -> Result<Self, TraceError> {
        let (layer, head) = (opts.layer, opts.head);
        let pattern_point = AttnHook::Pattern.at(layer);
        let pattern =
            cache.get(&pattern_point).and_then(|a| a.rank4()).ok_or_else(|| TraceError::Mismatch(format!("the model has no hook point `{pattern_point}`")))?;
        let pattern: Vec<f32> = pattern.narrow(1, head, 1).into_data().try_into_vec_as::<f32>().expect("f32");
        let span = model.blocks[layer].attn.span;
        let chosen: Vec<(usize, Vec<usize>)> = (0..n_pos)
            .filter(|q| opts.queries.as_ref().is_none_or(|list| list.contains(q)))
            .map(|q| (q, keys_of(q, &pattern, n_pos, span, opts, extra.get(&q).map_or(&[][..], Vec::as_slice))))
            .filter(|(_, k)| !k.is_empty())
            .collect();
        let (mut as_query, mut as_key) = (vec![false; n_pos], vec![false; n_pos]);
        for (q, ks) in &chosen {
            as_query[*q] = true;
            ks.iter().for_each(|&k| as_key[k] = true);
        }
        Ok(Self {
            opts,
            model_q: model_side(model, layer, head, Side::Query, cache)?,
            model_k: model_side(model, layer, head, Side::Key, cache)?,
            sides: HeadSides::new(model, layer, head, cache)?,
            pattern,
            chosen,
            as_query,
            as_key,
            nodes: vec![Vec::new(); n_pos],
            qv: vec![Vec::new(); n_pos],
            kv: vec![Vec::new(); n_pos],
        })
    }

    /// Keep `part`'s rows at the positions this head's rows read, projected.
    fn take(&mut self, part: &Part, dh: usize) {
        let keep: Vec<usize> = (0..part.nodes.len()).filter(|&i| self.as_query[part.nodes[i].pos()] || self.as_key[part.nodes[i].pos()]).collect();
        if keep.is_empty() {
            return;
        }
        let vectors = if keep.len() == part.nodes.len() {
            part.vectors.clone()
        } else {
            let idx: Vec<i64> = keep.iter().map(|&i| i as i64).collect();
            let device = part.vectors.device();
            part.vectors.clone().select(0, Tensor::<1, Int>::from_data(TensorData::new(idx, [keep.len()]), &device))
        };
        let positions: Vec<usize> = keep.iter().map(|&i| part.nodes[i].pos()).collect();
        let host = |t: Tensor<2>| -> Vec<f32> { t.into_data().try_into_vec_as::<f32>().expect("f32") };
        let (q, k) = self.sides.project(vectors, &positions, part.constant);
        let (q, k) = (host(q), host(k));
        for (r, &i) in keep.iter().enumerate() {
            let p = positions[r];
            self.nodes[p].push(part.nodes[i]);
            if self.as_query[p] {
                self.qv[p].extend_from_slice(&q[r * dh..(r + 1) * dh]);
            }
            if self.as_key[p] {
                self.kv[p].extend_from_slice(&k[r * dh..(r + 1) * dh]);
            }
        }
    }

    /// The rows, from the parts taken.
    fn rows(mut self, model: &Transformer, dh: usize) -> Vec<QkRow> {
        let (layer, head, n_pos) = (self.opts.layer, self.opts.head, self.nodes.len());
        let scale = model.blocks[layer].attn.scale as f32;
        let ranked_q: Vec<Option<Ranked>> =
            (0..n_pos).map(|p| self.as_query[p].then(|| Ranked::new(self.nodes[p].clone(), std::mem::take(&mut self.qv[p]), dh))).collect();
        let ranked_k: Vec<Option<Ranked>> =
            (0..n_pos).map(|p| self.as_key[p].then(|| Ranked::new(self.nodes[p].clone(), std::mem::take(&mut self.kv[p]), dh))).collect();
        let mut rows = Vec::new();
        for (q, ks) in &self.chosen {
            for &k in ks {
                let score = (0..dh).map(|e| self.model_q[q * dh + e] as f64 * self.model_k[k * dh + e] as f64).sum::<f64>() as f32 * scale;
                let at = QkRow {
                    layer,
                    head,
                    query: *q,
                    key: k,
                    score,
                    pattern: self.pattern[q * n_pos + k],
                    terms: Vec::new(),
                    remainder: 0.0,
                    feature_feature: 0.0,
                    error: 0.0,
                    other: 0.0,
                };
                rows.push(row(at, ranked_q[*q].as_ref().expect("a query"), ranked_k[k].as_ref().expect("a key"), dh, scale, self.opts.top_terms));
            }
        }
        rows
    }
}

/// Each request's rows (one layer's heads): one decomposition of the layer's stream, each
/// head projecting the parts its rows read.
fn heads_rows(w: &Walked, requests: &[(QkOptions, BTreeMap<usize, Vec<usize>>)]) -> Result<Vec<QkHead>, TraceError> {
    let (model, first, n_pos) = (w.model, &requests[0].0, w.ids.len());
    let dh = model.blocks[first.layer].attn.d_head;
    let mut heads = requests.iter().map(|(opts, extra)| HeadParts::new(model, w.cache, opts, extra, n_pos)).collect::<Result<Vec<_>, _>>()?;
    // Only the positions some row reads: a late layer's rows read a fraction of them.
    let positions: Vec<usize> = (0..n_pos).filter(|&p| heads.iter().any(|h| h.as_query[p] || h.as_key[p])).collect();
    if positions.is_empty() {
        return Ok(heads.into_iter().map(|_| QkHead { rows: Vec::new(), n_parts: 0, residual_gap: 0.0 }).collect());
    }
    let kept = Kept::new(positions, n_pos, &model.device());
    let stream = StreamOf { model, set: w.set, layer: first.layer, zero_positions: first.zero_positions, kept: &kept, cache: w.cache, known: w.known };
    let mut n_parts = 0;
    let (resid, sum) = for_each_part(&stream, |part| {
        n_parts += part.nodes.len();
        heads.iter_mut().for_each(|h| h.take(&part, dh));
        Ok(())
    })?;
    let gap = resid.iter().zip(&sum).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max) / resid.iter().map(|a| a.abs()).fold(1e-30, f32::max);
    Ok(heads.into_iter().map(|h| QkHead { rows: h.rows(model, dh), n_parts, residual_gap: gap }).collect())
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
