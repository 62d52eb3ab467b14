//! An attribution graph: its nodes, the direct effects between them (rows are targets,
//! columns sources), pruning by influence on the logits, and circuit-tracer's two scores.
//!
//! Node order: the selected features, `n_layers · n_pos` error nodes, `n_pos` token nodes,
//! the logit nodes. Only feature and logit nodes are targets, so only their rows of the
//! adjacency can hold edges: the graph keeps those rows (`[n_features + n_logits, n_nodes]`)
//! and never the square matrix, whose error and token rows are zero. With `n` nodes and `k`
//! stored rows a graph holds `k · n` floats, and pruning works on the same block.

use std::borrow::Cow;
use std::path::Path;

use crate::TraceError;
use crate::store::Floats;

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
    /// The adjacency's feature rows then its logit rows, `[n_features + n_logits, n_nodes]`
    /// row-major (see [`Graph::row_node`]); past the row budget in a mapped file.
    pub rows: Floats,
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
    /// `[stored rows, n_nodes]` like [`Graph::rows`]; the edges of the other rows are all
    /// pruned (they have none).
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

/// The sum of a row's absolute values, at least `floor`.
pub(crate) fn abs_sum(row: &[f32], floor: f32) -> f32 {
    row.iter().map(|x| x.abs()).sum::<f32>().max(floor)
}

/// A row's absolute values divided by `sum` (its [`abs_sum`]), into `out`.
fn normalize_into(row: &[f32], sum: f32, out: &mut [f32]) {
    out.iter_mut().zip(row).for_each(|(o, x)| *o = x.abs() / sum);
}

/// `Σ_{k≥1} w Aᵏ` for a nilpotent `A` (a graph without cycles) over `n` nodes given by its
/// `k` nonzero rows: `A[row_node[r]] = factor · values`, where `row(r, values)` writes row
/// `r`'s (nonnegative) values and returns its factor, so no normalised copy of the rows is
/// ever held. Repeated products until a term is zero.
pub(crate) fn influence(
    k: usize,
    row_node: &[usize],
    n: usize,
    weights: &[f32],
    max_iter: usize,
    row: impl Fn(usize, &mut [f32]) -> f32,
) -> Result<Vec<f32>, TraceError> {
    let mut values = vec![0f32; n];
    let mut step = |v: &[f32]| {
        let mut out = vec![0f32; n];
        for r in 0..k {
            if v[row_node[r]] == 0.0 {
                continue;
            }
            let w = v[row_node[r]] * row(r, &mut values);
            if w != 0.0 {
                out.iter_mut().zip(&values).for_each(|(o, &x)| *o += w * x);
            }
        }
        out
    };
    let mut current = step(weights);
    let mut total = current.clone();
    for _ in 0..max_iter {
        if current.iter().all(|&x| x == 0.0) {
            return Ok(total);
        }
        current = step(&current);
        total.iter_mut().zip(&current).for_each(|(t, &c)| *t += c);
    }
    Err(TraceError::Input(format!("influence did not converge in {max_iter} steps (the graph has a cycle?)")))
}

/// The weight of each of `n` nodes in the output: the logit nodes (last) carry their
/// probabilities, the rest nothing.
pub(crate) fn logit_weights(n: usize, logit_probs: &[f32]) -> Vec<f32> {
    let mut w = vec![0f32; n];
    w[n - logit_probs.len()..].copy_from_slice(logit_probs);
    w
}

/// The score at which the highest scores hold `fraction` of the total (scores not listed
/// are zero and sort last); sorts `sorted` in place.
fn threshold(sorted: &mut [f32], fraction: f32) -> f32 {
    sorted.sort_unstable_by(|a, b| b.total_cmp(a));
    let total: f32 = sorted.iter().sum();
    let mut cum = 0f32;
    for (i, &s) in sorted.iter().enumerate() {
        cum += s;
        if cum / total >= fraction {
            return sorted[i];
        }
    }
    0.0
}

impl Graph {
    pub fn n_pos(&self) -> usize {
        self.input_tokens.len()
    }

    pub fn n_features(&self) -> usize {
        self.selected_features.len()
    }

    pub fn n_logits(&self) -> usize {
        self.logit_token_ids.len()
    }

    pub fn n_nodes(&self) -> usize {
        self.n_features() + (self.n_layers + 1) * self.n_pos() + self.n_logits()
    }

    /// The node of stored row `r`.
    pub fn row_node(&self, r: usize) -> usize {
        if r < self.n_features() { r } else { self.n_nodes() - self.n_logits() + (r - self.n_features()) }
    }

    /// The stored row of `node`, if it is a target (a feature or a logit).
    pub fn node_row(&self, node: usize) -> Option<usize> {
        let (nf, n) = (self.n_features(), self.n_nodes());
        if node < nf {
            Some(node)
        } else if node >= n - self.n_logits() {
            Some(nf + node - (n - self.n_logits()))
        } else {
            None
        }
    }

    /// The direct effect of `source` on `target`.
    pub fn edge(&self, target: usize, source: usize) -> f32 {
        self.node_row(target).map_or(0.0, |r| self.rows[r * self.n_nodes() + source])
    }

    /// The square adjacency `[n_nodes, n_nodes]` (circuit-tracer's `adjacency_matrix`);
    /// for small graphs.
    pub fn dense_adjacency(&self) -> Vec<f32> {
        let n = self.n_nodes();
        let mut a = vec![0f32; n * n];
        for (r, row) in self.rows.chunks(n).enumerate() {
            let node = self.row_node(r);
            a[node * n..(node + 1) * n].copy_from_slice(row);
        }
        a
    }

    /// Stored row `r`.
    pub fn row(&self, r: usize) -> &[f32] {
        let n = self.n_nodes();
        &self.rows[r * n..(r + 1) * n]
    }

    /// Every stored row's [`abs_sum`], computed once rather than in each product.
    fn abs_sums(&self, floor: f32) -> Vec<f32> {
        (0..self.rows.len() / self.n_nodes().max(1)).map(|r| abs_sum(self.row(r), floor)).collect()
    }

    fn row_nodes(&self) -> Vec<usize> {
        (0..self.rows.len() / self.n_nodes().max(1)).map(|r| self.row_node(r)).collect()
    }

    fn logit_weights(&self) -> Vec<f32> {
        logit_weights(self.n_nodes(), &self.logit_probabilities)
    }

    /// Keep the nodes holding `node_threshold` of the influence on the logits and the edges
    /// holding `edge_threshold` of it (circuit-tracer's `prune_graph`); tokens and logits
    /// always stay, and features and errors left without outgoing (features: or incoming)
    /// edges go.
    pub fn prune(&self, node_threshold: f32, edge_threshold: f32) -> Result<Pruned, TraceError> {
        check_thresholds(node_threshold, edge_threshold)?;
        let n = self.n_nodes();
        let (n_logits, n_tokens, n_features) = (self.n_logits(), self.n_pos(), self.n_features());
        let row_nodes = self.row_nodes();
        let k = row_nodes.len();
        let weights = self.logit_weights();
        let sums = self.abs_sums(1e-10);
        let node_influence = influence(k, &row_nodes, n, &weights, 1000, |r, out| {
            normalize_into(self.row(r), sums[r], out);
            1.0
        })?;
        let cut = threshold(&mut node_influence.clone(), node_threshold);
        let mut node_mask: Vec<bool> = node_influence.iter().map(|&x| x >= cut).collect();
        node_mask[n - n_logits - n_tokens..].iter_mut().for_each(|m| *m = true);

        // Each row with the pruned nodes' entries (and the pruned nodes' rows) zeroed, then
        // normalised; its sum is computed once.
        let masked = |r: usize, c: usize, x: f32| if node_mask[row_nodes[r]] && node_mask[c] { x.abs() } else { 0.0 };
        let pruned_sums: Vec<f32> = (0..k).map(|r| self.row(r).iter().enumerate().map(|(c, &x)| masked(r, c, x)).sum::<f32>().max(1e-10)).collect();
        let pruned = |r: usize, out: &mut [f32]| out.iter_mut().zip(self.row(r)).enumerate().for_each(|(c, (o, &x))| *o = masked(r, c, x) / pruned_sums[r]);
        let mut pruned_influence = influence(k, &row_nodes, n, &weights, 1000, |r, out| {
            pruned(r, out);
            1.0
        })?;
        pruned_influence.iter_mut().zip(&weights).for_each(|(p, &w)| *p += w);
        // The cut needs every score sorted (one k·n copy, dropped at once, in a mapped file
        // when the rows are); the mask is then taken from the scores recomputed row by row.
        let edge_cut = {
            let mut scores = Floats::zeros(k * n, if self.rows.is_mapped() { 0 } else { u64::MAX })?;
            for (r, s) in scores.chunks_mut(n.max(1)).enumerate() {
                pruned(r, s);
                let infl = pruned_influence[row_nodes[r]];
                s.iter_mut().for_each(|x| *x *= infl);
            }
            threshold(&mut scores, edge_threshold)
        };
        let mut edge_mask = vec![false; k * n];
        let mut row_buf = vec![0f32; n];
        for r in 0..k {
            pruned(r, &mut row_buf);
            let infl = pruned_influence[row_nodes[r]];
            edge_mask[r * n..(r + 1) * n].iter_mut().zip(&row_buf).for_each(|(m, &x)| *m = x * infl >= edge_cut);
        }

        let inner = n - n_logits - n_tokens;
        let mut old = node_mask.clone();
        loop {
            let mut has_out = vec![false; inner];
            for r in 0..k {
                edge_mask[r * n..r * n + inner].iter().zip(has_out.iter_mut()).for_each(|(&e, h)| *h |= e);
            }
            node_mask[..inner].iter_mut().zip(&has_out).for_each(|(m, &h)| *m &= h);
            for r in 0..n_features {
                node_mask[r] &= edge_mask[r * n..(r + 1) * n].iter().any(|&e| e);
            }
            if node_mask == old {
                break;
            }
            old.clone_from(&node_mask);
            for r in 0..k {
                let keep_row = node_mask[row_nodes[r]];
                edge_mask[r * n..(r + 1) * n].iter_mut().zip(&node_mask).for_each(|(e, &keep)| *e &= keep_row && keep);
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
        let error_start = self.n_features();
        let error_end = error_start + self.n_pos() * self.n_layers;
        let token_end = error_end + self.n_pos();
        let weights = self.logit_weights();
        let row_nodes = self.row_nodes();
        let k = row_nodes.len();
        let sums = self.abs_sums(1e-10);
        let infl = influence(k, &row_nodes, n, &weights, 1000, |r, out| {
            normalize_into(self.row(r), sums[r], out);
            1.0
        })?;
        let token: f32 = infl[error_end..token_end].iter().sum();
        let error: f32 = infl[error_start..error_end].iter().sum();
        let replacement = token / (token + error);
        let out: Vec<f32> = infl.iter().zip(&weights).map(|(i, w)| i + w).collect();
        // Rows that are not stored have no inputs at all, so none from errors.
        let mut num: f32 = out.iter().sum();
        let mut row = vec![0f32; n];
        for r in 0..k {
            normalize_into(self.row(r), sums[r], &mut row);
            num -= row[error_start..error_end].iter().sum::<f32>() * out[row_nodes[r]];
        }
        Ok((replacement, num / out.iter().sum::<f32>()))
    }

    /// Write `graph.safetensors` with circuit-tracer's `Graph` tensors under their names.
    /// `adjacency_matrix` (square) is written while it stays under `dense_limit` bytes;
    /// `adjacency_rows` (the stored rows, see [`Graph::rows`]) always is.
    pub fn save_safetensors(&self, path: &Path, dense_limit: u64) -> Result<(), TraceError> {
        use safetensors::Dtype;
        let n = self.n_nodes();
        let i64s = |v: &[i64]| Cow::Owned(v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>());
        let features: Vec<i64> = self.active_features.iter().flatten().copied().collect();
        let dense = ((n as u64) * (n as u64) * 4 <= dense_limit).then(|| self.dense_adjacency());
        let mut tensors: Vec<(&str, Dtype, Vec<usize>, Cow<[u8]>)> = vec![
            ("input_tokens", Dtype::I64, vec![self.n_pos()], i64s(&self.input_tokens)),
            ("active_features", Dtype::I64, vec![self.active_features.len(), 3], i64s(&features)),
            ("activation_values", Dtype::F32, vec![self.activation_values.len()], f32_bytes(&self.activation_values)),
            ("selected_features", Dtype::I64, vec![self.n_features()], i64s(&self.selected_features)),
            ("adjacency_rows", Dtype::F32, vec![self.rows.len() / n.max(1), n], f32_bytes(&self.rows)),
            ("logit_token_ids", Dtype::I64, vec![self.n_logits()], i64s(&self.logit_token_ids)),
            ("logit_probabilities", Dtype::F32, vec![self.n_logits()], f32_bytes(&self.logit_probabilities)),
        ];
        if let Some(dense) = &dense {
            tensors.push(("adjacency_matrix", Dtype::F32, vec![n, n], f32_bytes(dense)));
        }
        let files: Vec<burnlens_model::files::FileTensor> =
            tensors.iter().map(|(name, dtype, shape, bytes)| burnlens_model::files::FileTensor { name, dtype: *dtype, shape: shape.clone(), bytes }).collect();
        let mut meta = std::collections::HashMap::new();
        meta.insert("n_layers".to_string(), self.n_layers.to_string());
        meta.insert("vocab_size".to_string(), self.vocab_size.to_string());
        if let Some(scan) = &self.scan {
            meta.insert("scan".to_string(), scan.clone());
        }
        // Streamed to the file: the rows are never copied into one serialised buffer.
        Ok(burnlens_model::files::write_safetensors(path, &files, Some(meta))?)
    }
}

/// Floats as safetensors' little-endian bytes: the same memory on a little-endian machine.
fn f32_bytes(v: &[f32]) -> Cow<'_, [u8]> {
    if cfg!(target_endian = "little") {
        // SAFETY: any f32 is four plain bytes, u8 has no alignment, and the length covers
        // exactly the slice.
        Cow::Borrowed(unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) })
    } else {
        Cow::Owned(v.iter().flat_map(|x| x.to_le_bytes()).collect())
    }
}
