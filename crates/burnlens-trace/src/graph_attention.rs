//! `graph --qk`: the attention side of a pruned graph — which heads carry its edges that
//! cross positions ([`crate::head_loadings`]) and why those heads attend where they do at
//! the edges' target positions ([`crate::qk`]) — added to graph.json as burnlens's
//! extension (links' `heads` and `heads_rest`, a top-level `qk`) and shown by graph.html.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::TraceError;
use crate::attribute::AttributeOptions;
use crate::graph::{Graph, Pruned};
use crate::head_loadings::{EdgeHeads, head_loadings, node_position};
use crate::json::{GraphJson, GraphText};
use crate::qk::{LayerRequests, QkOptions, QkRow, graph_rows};
use crate::replacement::Replacement;

/// The heads of a pruned graph's edges and their QK attributions.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GraphAttention {
    pub loadings: Vec<EdgeHeads>,
    pub qk: Vec<QkRow>,
}

/// How much of it: heads listed per edge; for each of them at an edge's target, the keys it
/// attends to most (besides the keys of its edges) and the terms listed per (query, key).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionOptions {
    pub top_heads: usize,
    pub top_keys: usize,
    pub top_terms: usize,
}

impl Default for AttentionOptions {
    fn default() -> Self {
        Self { top_heads: 5, top_keys: 8, top_terms: 10 }
    }
}

/// The loadings of `pruned`'s edges that cross positions, and the QK rows of each listed
/// head at the targets of the edges it carries: for the keys those edges come from and the
/// keys it attends to most. `rm`: the replacement model the graph was attributed on (or
/// one built again on its prompt with the graph's `opts`).
pub fn graph_attention(rm: &Replacement, graph: &Graph, pruned: &Pruned, opts: &AttributeOptions, a: &AttentionOptions) -> Result<GraphAttention, TraceError> {
    let (model, set) = (rm.model, rm.set);
    let loadings = head_loadings(rm, graph, Some(pruned), a.top_heads)?;
    // Each listed head's queries (the targets' positions) and, per query, the keys its
    // edges come from; grouped by layer (one forward pass a layer).
    let mut wanted: BTreeMap<usize, BTreeMap<usize, BTreeMap<usize, Vec<usize>>>> = BTreeMap::new();
    for e in &loadings {
        let (q, k) = (node_position(graph, e.target), node_position(graph, e.source));
        for h in &e.heads {
            wanted.entry(h.layer).or_default().entry(h.head).or_default().entry(q).or_default().push(k);
        }
    }
    let by_layer: Vec<LayerRequests> = wanted
        .into_iter()
        .map(|(layer, heads)| {
            heads
                .into_iter()
                .map(|(head, keys)| {
                    let queries = Some(keys.keys().copied().collect());
                    let opts = QkOptions {
                        top_terms: a.top_terms,
                        top_keys: Some(a.top_keys),
                        queries,
                        zero_positions: opts.zero_positions,
                        ..QkOptions::new(layer, head)
                    };
                    (opts, keys)
                })
                .collect()
        })
        .collect();
    let qk = graph_rows(model, set, graph, &by_layer)?;
    Ok(GraphAttention { loadings, qk })
}

impl GraphAttention {
    /// The loadings on `json`'s links (matched by their nodes' ids) and the rows as its `qk`.
    pub fn annotate(&self, json: &mut GraphJson, graph: &Graph, text: &GraphText) {
        let id = |node: usize| graph.json_node(node, 0.0, text).node_id;
        let by_edge: BTreeMap<(String, String), &EdgeHeads> = self.loadings.iter().map(|e| ((id(e.source), id(e.target)), e)).collect();
        for link in &mut json.links {
            if let Some(e) = by_edge.get(&(link.source.clone(), link.target.clone())) {
                link.heads = Some(e.heads.clone());
                link.heads_rest = Some(e.rest);
                link.multi_hop = Some(e.multi_hop);
            }
        }
        json.qk = Some(self.qk.clone());
    }
}
