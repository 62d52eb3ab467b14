//! An attribution graph: its nodes, the dense adjacency of direct effects (rows are targets,
//! columns sources), pruning by influence on the logits, and circuit-tracer's two scores.
//!
//! Node order: the selected features, `n_layers · n_pos` error nodes, `n_pos` token nodes,
//! the logit nodes.

use std::path::Path;

use crate::TraceError;

/// The graph of one prompt, with circuit-tracer's `Graph` fields.
#[derive(Debug, Clone, PartialEq)]
pub struct Graph {
    pub input_tokens: Vec<i64>,
    /// Every active feature `(layer, pos, feature)`.
    pub active_features: Vec<[i64; 3]>,
    /// The activation of every active feature.
    pub activation_values: Vec<f32>,
    /// Indices into `active_features` of the feature nodes, ascending.
    pub selected_features: Vec<i64>,
    /// `[n_nodes, n_nodes]` row-major.
    pub adjacency: Vec<f32>,
    pub logit_token_ids: Vec<i64>,
    pub logit_probabilities: Vec<f32>,
    pub n_layers: usize,
    pub vocab_size: usize,
    pub scan: Option<String>,
}

/// Which nodes and edges survive pruning, and every node's cumulative influence rank.
#[derive(Debug, Clone, PartialEq)]
pub struct Pruned {
    pub node_mask: Vec<bool>,
    /// `[n_nodes, n_nodes]` row-major, like the adjacency.
    pub edge_mask: Vec<bool>,
    /// The fraction of total influence held by the nodes at least as influential as each.
    pub cumulative_scores: Vec<f32>,
}

/// Both pruning thresholds must be shares, in `[0, 1]`.
pub fn check_thresholds(node_threshold: f32, edge_threshold: f32) -> Result<(), TraceError> {
    for (name, t) in [("node_threshold", node_threshold), ("edge_threshold", edge_threshold)] {
        if !(0.0..=1.0).contains(&t) {
            return Err(TraceError::Input(format!("{name} must be between 0 and 1, got {t}")));
        }
    }
    Ok(())
}

/// One row's absolute values divided by their sum (at least `floor`).
pub(crate) fn normalize_rows(row: &[f32], floor: f32) -> Vec<f32> {
    let sum: f32 = row.iter().map(|x| x.abs()).sum::<f32>().max(floor);
    row.iter().map(|x| x.abs() / sum).collect()
}

/// `Σ_{k≥1} w Aᵏ` for a nilpotent `A` (a graph without cycles), by repeated products until
/// the term is zero.
fn influence(a: &[f32], n: usize, weights: &[f32]) -> Result<Vec<f32>, TraceError> {
    let mut current = vec_mat(weights, a, n);
    let mut total = current.clone();
    for _ in 0..1000 {
        if current.iter().all(|&x| x == 0.0) {
            return Ok(total);
        }
        current = vec_mat(&current, a, n);
        total.iter_mut().zip(&current).for_each(|(t, &c)| *t += c);
    }
    Err(TraceError::Input("influence did not converge in 1000 steps (the graph has a cycle?)".into()))
}

fn vec_mat(v: &[f32], a: &[f32], n: usize) -> Vec<f32> {
    let mut out = vec![0f32; n];
    for (r, &w) in v.iter().enumerate() {
        if w != 0.0 {
            out.iter_mut().zip(&a[r * n..(r + 1) * n]).for_each(|(o, &x)| *o += w * x);
        }
    }
    out
}

/// The score at which the highest scores hold `fraction` of the total.
fn threshold(scores: &[f32], fraction: f32) -> f32 {
    let mut sorted = scores.to_vec();
    sorted.sort_by(|a, b| b.total_cmp(a));
    let total: f32 = sorted.iter().sum();
    let mut cum = 0f32;
    for (i, &s) in sorted.iter().enumerate() {
        cum += s;
        if cum / total >= fraction {
            return sorted[i];
        }
    }
    *sorted.last().unwrap_or(&0.0)
}

impl Graph {
    pub fn n_pos(&self) -> usize {
        self.input_tokens.len()
    }

    pub fn n_nodes(&self) -> usize {
        self.selected_features.len() + (self.n_layers + 1) * self.n_pos() + self.logit_token_ids.len()
    }

    fn normalized(&self) -> Vec<f32> {
        let n = self.n_nodes();
        self.adjacency.chunks(n).flat_map(|r| normalize_rows(r, 1e-10)).collect()
    }

    fn logit_weights(&self) -> Vec<f32> {
        let n = self.n_nodes();
        let mut w = vec![0f32; n];
        w[n - self.logit_token_ids.len()..].copy_from_slice(&self.logit_probabilities);
        w
    }

    /// Keep the nodes holding `node_threshold` of the influence on the logits and the edges
    /// holding `edge_threshold` of it (circuit-tracer's `prune_graph`); tokens and logits
    /// always stay, and features and errors left without outgoing (features: or incoming)
    /// edges go.
    pub fn prune(&self, node_threshold: f32, edge_threshold: f32) -> Result<Pruned, TraceError> {
        check_thresholds(node_threshold, edge_threshold)?;
        let n = self.n_nodes();
        let (n_logits, n_tokens, n_features) = (self.logit_token_ids.len(), self.n_pos(), self.selected_features.len());
        let weights = self.logit_weights();
        let node_influence = influence(&self.normalized(), n, &weights)?;
        let cut = threshold(&node_influence, node_threshold);
        let mut node_mask: Vec<bool> = node_influence.iter().map(|&x| x >= cut).collect();
        node_mask[n - n_logits - n_tokens..].iter_mut().for_each(|m| *m = true);

        let mut pruned = self.adjacency.clone();
        for r in 0..n {
            for c in 0..n {
                if !node_mask[r] || !node_mask[c] {
                    pruned[r * n + c] = 0.0;
                }
            }
        }
        let normalized: Vec<f32> = pruned.chunks(n).flat_map(|r| normalize_rows(r, 1e-10)).collect();
        let mut pruned_influence = influence(&normalized, n, &weights)?;
        pruned_influence.iter_mut().zip(&weights).for_each(|(p, &w)| *p += w);
        let edge_scores: Vec<f32> = (0..n * n).map(|i| normalized[i] * pruned_influence[i / n]).collect();
        let edge_cut = threshold(&edge_scores, edge_threshold);
        let mut edge_mask: Vec<bool> = edge_scores.iter().map(|&s| s >= edge_cut).collect();

        let inner = n - n_logits - n_tokens;
        let mut old = node_mask.clone();
        loop {
            for c in 0..inner {
                node_mask[c] &= (0..n).any(|r| edge_mask[r * n + c]);
            }
            for r in 0..n_features {
                node_mask[r] &= edge_mask[r * n..(r + 1) * n].iter().any(|&e| e);
            }
            if node_mask == old {
                break;
            }
            old.clone_from(&node_mask);
            for r in 0..n {
                for c in 0..n {
                    if !node_mask[r] || !node_mask[c] {
                        edge_mask[r * n + c] = false;
                    }
                }
            }
        }

        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&a, &b| node_influence[b].total_cmp(&node_influence[a]));
        let total: f32 = node_influence.iter().sum();
        let mut cumulative_scores = vec![0f32; n];
        let mut cum = 0f32;
        for &i in &order {
            cum += node_influence[i];
            cumulative_scores[i] = cum / total;
        }
        Ok(Pruned { node_mask, edge_mask, cumulative_scores })
    }

    /// circuit-tracer's replacement score (the share of the tokens' and errors' influence on
    /// the logits that the tokens hold) and completeness score (the influence-weighted share of
    /// each node's inputs that is not from errors).
    pub fn scores(&self) -> Result<(f32, f32), TraceError> {
        let n = self.n_nodes();
        let error_start = self.selected_features.len();
        let error_end = error_start + self.n_pos() * self.n_layers;
        let token_end = error_end + self.n_pos();
        let weights = self.logit_weights();
        let normalized = self.normalized();
        let infl = influence(&normalized, n, &weights)?;
        let token: f32 = infl[error_end..token_end].iter().sum();
        let error: f32 = infl[error_start..error_end].iter().sum();
        let replacement = token / (token + error);
        let (mut num, mut den) = (0f32, 0f32);
        for r in 0..n {
            let from_errors: f32 = normalized[r * n + error_start..r * n + error_end].iter().sum();
            let out = infl[r] + weights[r];
            num += (1.0 - from_errors) * out;
            den += out;
        }
        Ok((replacement, num / den))
    }

    /// Write `graph.safetensors` with circuit-tracer's `Graph` tensors under their names.
    pub fn save_safetensors(&self, path: &Path) -> Result<(), TraceError> {
        use safetensors::Dtype;
        let n = self.n_nodes();
        let i64s = |v: &[i64]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let features: Vec<i64> = self.active_features.iter().flatten().copied().collect();
        let tensors: Vec<(&str, Dtype, Vec<usize>, Vec<u8>)> = vec![
            ("input_tokens", Dtype::I64, vec![self.n_pos()], i64s(&self.input_tokens)),
            ("active_features", Dtype::I64, vec![self.active_features.len(), 3], i64s(&features)),
            ("activation_values", Dtype::F32, vec![self.activation_values.len()], f32s(&self.activation_values)),
            ("selected_features", Dtype::I64, vec![self.selected_features.len()], i64s(&self.selected_features)),
            ("adjacency_matrix", Dtype::F32, vec![n, n], f32s(&self.adjacency)),
            ("logit_token_ids", Dtype::I64, vec![self.logit_token_ids.len()], i64s(&self.logit_token_ids)),
            ("logit_probabilities", Dtype::F32, vec![self.logit_probabilities.len()], f32s(&self.logit_probabilities)),
        ];
        let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
            .iter()
            .map(|(name, dtype, shape, bytes)| (name.to_string(), safetensors::tensor::TensorView::new(*dtype, shape.clone(), bytes).expect("consistent view")))
            .collect();
        let mut meta = std::collections::HashMap::new();
        meta.insert("n_layers".to_string(), self.n_layers.to_string());
        meta.insert("vocab_size".to_string(), self.vocab_size.to_string());
        if let Some(scan) = &self.scan {
            meta.insert("scan".to_string(), scan.clone());
        }
        let bytes = safetensors::serialize(views, Some(meta)).map_err(|e| TraceError::file(path, e.to_string()))?;
        crate::write_atomic(path, &bytes)
    }
}
