//! The pruned graph as the JSON Neuronpedia's graph viewer and circuit-tracer's local server
//! load (`metadata`, `qParams`, `nodes`, `links`), node for node what circuit-tracer's
//! `create_graph_files` writes; with `graph --qk`, burnlens's extension (links' `heads`, a
//! top-level `qk`): keys outside their schema.

use serde::Serialize;

use crate::graph::{Graph, Pruned};
use crate::head_loadings::HeadLoading;
use crate::qk::QkRow;

/// The text a graph's JSON shows: its name, the prompt and its tokens, the logit targets.
#[derive(Debug, Clone)]
pub struct GraphText {
    /// The graph's name (circuit-tracer's `slug`).
    pub slug: String,
    pub prompt: String,
    /// One string per input token.
    pub prompt_tokens: Vec<String>,
    /// One string per logit target.
    pub logit_tokens: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct Metadata {
    pub slug: String,
    pub scan: String,
    pub transcoder_list: Vec<String>,
    pub prompt_tokens: Vec<String>,
    pub prompt: String,
    pub node_threshold: Option<f32>,
    pub schema_version: Option<u32>,
}

#[derive(Debug, Serialize)]
#[allow(non_snake_case)]
pub struct QParams {
    pub pinnedIds: Vec<String>,
    pub supernodes: Vec<Vec<String>>,
    pub linkType: String,
    pub clickedId: String,
    pub sg_pos: String,
}

#[derive(Debug, Clone, Serialize)]
#[allow(non_snake_case)]
pub struct Node {
    pub node_id: String,
    pub feature: i64,
    pub layer: String,
    pub ctx_idx: usize,
    pub feature_type: String,
    pub token_prob: f32,
    pub is_target_logit: bool,
    pub run_idx: usize,
    pub reverse_ctx_idx: usize,
    pub jsNodeId: String,
    pub clerp: String,
    pub influence: Option<f32>,
    pub activation: Option<f32>,
    /// A feature's dashboard, where one was given (`burnlens graph --features`): its top
    /// examples (`tokens`, `acts`, `centre`), the tokens it promotes and suppresses.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dashboard: Option<serde_json::Value>,
}

impl Node {
    /// (layer, feature) of a transcoder feature's node.
    pub fn transcoder_feature(&self) -> Option<(usize, usize)> {
        if self.feature_type != "cross layer transcoder" {
            return None;
        }
        let mut parts = self.node_id.split('_');
        Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Link {
    pub source: String,
    pub target: String,
    pub weight: f32,
    /// burnlens's extension (`graph --qk`): the heads that carry an edge that crosses
    /// positions (their one-hop paths), largest first, the other heads' sum, and the paths
    /// through several heads (`Σ heads + heads_rest + multi_hop = weight`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub heads: Option<Vec<HeadLoading>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub heads_rest: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub multi_hop: Option<f32>,
}

#[derive(Debug, Serialize)]
#[allow(non_snake_case)]
pub struct GraphJson {
    pub metadata: Metadata,
    pub qParams: QParams,
    pub nodes: Vec<Node>,
    pub links: Vec<Link>,
    /// burnlens's extension (`graph --qk`): the QK attributions of the heads that carry the
    /// links, at the links' target positions (the `qk` command's rows).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qk: Option<Vec<QkRow>>,
}

/// Cantor's pairing of two naturals, the viewer's feature id of (layer, feature).
fn cantor(x: i64, y: i64) -> i64 {
    (x + y) * (x + y + 1) / 2 + y
}

fn node(id: String, feature: i64, layer: String, ctx_idx: usize, kind: &str, js: String) -> Node {
    Node {
        node_id: id,
        feature,
        layer,
        ctx_idx,
        feature_type: kind.into(),
        token_prob: 0.0,
        is_target_logit: false,
        run_idx: 0,
        reverse_ctx_idx: 0,
        jsNodeId: js,
        clerp: String::new(),
        influence: None,
        activation: None,
        dashboard: None,
    }
}

impl Graph {
    /// The node at index `i` of the adjacency, as the viewer names it.
    pub fn json_node(&self, i: usize, influence: f32, text: &GraphText) -> Node {
        let n_features = self.selected_features.len();
        let n_pos = self.n_pos();
        let error_end = n_features + n_pos * self.n_layers;
        let token_end = error_end + n_pos;
        if i < n_features {
            let f = self.selected_features[i] as usize;
            let [layer, pos, feat] = self.active_features[f];
            let mut n = node(
                format!("{layer}_{feat}_{pos}"),
                cantor(layer, feat),
                layer.to_string(),
                pos as usize,
                "cross layer transcoder",
                format!("{layer}_{feat}-0"),
            );
            n.influence = Some(influence);
            n.activation = Some(self.activation_values[f]);
            n
        } else if i < error_end {
            let (layer, pos) = ((i - n_features) / n_pos, (i - n_features) % n_pos);
            let mut n = node(format!("0_{layer}_{pos}"), -1, layer.to_string(), pos, "mlp reconstruction error", format!("{layer}_{pos}-0"));
            n.influence = Some(influence);
            n
        } else if i < token_end {
            let pos = i - error_end;
            let tok = self.input_tokens[pos];
            let mut n = node(format!("E_{tok}_{pos}"), pos as i64, "E".into(), pos, "embedding", format!("E_{tok}-{pos}"));
            n.influence = Some(influence);
            n
        } else {
            let k = i - token_end;
            let (vocab, layer, pos) = (self.logit_token_ids[k], (self.n_layers + 1).to_string(), n_pos - 1);
            let prob = self.logit_probabilities[k];
            let mut n = node(format!("{layer}_{vocab}_{pos}"), vocab, layer, pos, "logit", format!("L_{vocab}-{pos}"));
            n.token_prob = prob;
            n.is_target_logit = k == 0;
            n.clerp = format!("Output \"{}\" (p={prob:.3})", text.logit_tokens.get(k).map_or("", String::as_str));
            n
        }
    }

    /// The pruned graph in the viewer's schema: kept nodes that have a kept edge (tokens
    /// and logits always), kept edges between kept nodes, ordered by target then source.
    pub fn to_json(&self, pruned: &Pruned, text: &GraphText, node_threshold: f32) -> GraphJson {
        let n = self.n_nodes();
        let kept: Vec<Option<Node>> = (0..n).map(|i| pruned.node_mask[i].then(|| self.json_node(i, pruned.cumulative_scores[i], text))).collect();
        let mut links = Vec::new();
        let mut connected = vec![false; n];
        // Stored rows are in node order, so links come ordered by target, then source.
        for r in 0..pruned.edge_mask.len() / n.max(1) {
            let dst = self.row_node(r);
            for src in 0..n {
                if pruned.edge_mask[r * n + src]
                    && let (Some(s), Some(t)) = (&kept[src], &kept[dst])
                {
                    links.push(Link {
                        source: s.node_id.clone(),
                        target: t.node_id.clone(),
                        weight: self.rows[r * n + src],
                        heads: None,
                        heads_rest: None,
                        multi_hop: None,
                    });
                    connected[src] = true;
                    connected[dst] = true;
                }
            }
        }
        let nodes = kept
            .into_iter()
            .enumerate()
            .filter_map(|(i, node)| node.filter(|nd| connected[i] || nd.feature_type == "embedding" || nd.feature_type == "logit"))
            .collect();
        GraphJson {
            metadata: Metadata {
                slug: text.slug.clone(),
                scan: self.scan.clone().unwrap_or_default(),
                transcoder_list: Vec::new(),
                prompt_tokens: text.prompt_tokens.clone(),
                prompt: text.prompt.clone(),
                node_threshold: Some(node_threshold),
                schema_version: Some(1),
            },
            qParams: QParams { pinnedIds: vec![], supernodes: vec![], linkType: "both".into(), clickedId: String::new(), sg_pos: String::new() },
            nodes,
            links,
            qk: None,
        }
    }
}
