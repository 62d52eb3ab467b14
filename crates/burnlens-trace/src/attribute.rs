//! The attribution graph of one prompt, built as circuit-tracer's `attribute` builds it.
//!
//! Node order (columns are sources, rows targets): the active features (by layer, position,
//! feature), the error nodes (`layer · n_pos + pos`), the token nodes, the logit nodes. Logit
//! rows come first; then feature rows, either all of them or, with `max_feature_nodes`, the
//! features with the largest influence on the logits so far, re-ranked every
//! `update_interval` batches from the rows already computed.

use burn::tensor::{Tensor, TensorData};
use burnlens_model::Transformer;

use crate::TraceError;
use crate::backward::Targets;
use crate::graph::{Graph, abs_sum, influence, logit_weights};
use crate::replacement::{Replacement, unembedding};
use crate::store::Floats;
use crate::transcoder::TranscoderSet;

/// Which logits the graph explains.
#[derive(Debug, Clone, PartialEq)]
pub enum LogitTargets {
    /// The most probable tokens, until their probabilities sum to `desired_prob` or there are
    /// `max_n_logits` of them.
    Salient { max_n_logits: usize, desired_prob: f32 },
    /// These token ids.
    Tokens(Vec<i64>),
}

impl Default for LogitTargets {
    fn default() -> Self {
        LogitTargets::Salient { max_n_logits: 10, desired_prob: 0.95 }
    }
}

/// How to build a graph (circuit-tracer's arguments and defaults).
#[derive(Debug, Clone, PartialEq)]
pub struct AttributeOptions {
    pub targets: LogitTargets,
    /// Targets per backward pass.
    pub batch_size: usize,
    /// Feature rows to compute; all active features when `None`.
    pub max_feature_nodes: Option<usize>,
    /// Batches between re-rankings of the features by influence.
    pub update_interval: usize,
    /// Leading positions without features or errors (the BOS token).
    pub zero_positions: usize,
    /// Keep every layer's attention pattern while they take at most this many bytes; past
    /// it, patterns are recomputed for each backward pass (memory for time).
    pub pattern_budget: u64,
    /// Keep the adjacency rows in memory while they take at most this many bytes; past it
    /// they live in a mapped temporary file (see [`crate::store`]).
    pub row_budget: u64,
}

impl Default for AttributeOptions {
    fn default() -> Self {
        Self {
            targets: LogitTargets::default(),
            batch_size: 512,
            max_feature_nodes: None,
            update_interval: 4,
            zero_positions: 1,
            pattern_budget: 4 << 30,
            row_budget: 8 << 30,
        }
    }
}

fn softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f64> = logits.iter().map(|&l| ((l - max) as f64).exp()).collect();
    let sum: f64 = exps.iter().sum();
    exps.iter().map(|e| (e / sum) as f32).collect()
}

/// The logit targets' token ids and probabilities.
pub fn select_logits(logits: &[f32], targets: &LogitTargets) -> Result<(Vec<i64>, Vec<f32>), TraceError> {
    let probs = softmax(logits);
    let ids: Vec<i64> = match targets {
        LogitTargets::Tokens(ids) => {
            if ids.is_empty() {
                return Err(TraceError::Input("no target tokens given".into()));
            }
            if let Some(bad) = ids.iter().find(|&&t| t < 0 || t as usize >= logits.len()) {
                return Err(TraceError::Input(format!("target token {bad} is outside the vocabulary of {}", logits.len())));
            }
            ids.clone()
        }
        LogitTargets::Salient { max_n_logits, desired_prob } => {
            if *max_n_logits == 0 {
                return Err(TraceError::Input("max_n_logits must be at least 1".into()));
            }
            let mut order: Vec<usize> = (0..probs.len()).collect();
            order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
            order.truncate(*max_n_logits);
            // The first index whose running sum reaches the desired probability, inclusive.
            let mut sum = 0f32;
            let mut cutoff = order.len();
            for (i, &t) in order.iter().enumerate() {
                sum += probs[t];
                if sum >= *desired_prob {
                    cutoff = i + 1;
                    break;
                }
            }
            order[..cutoff].iter().map(|&t| t as i64).collect()
        }
    };
    let p = ids.iter().map(|&t| probs[t as usize]).collect();
    Ok((ids, p))
}

/// `W_U[:, t] − mean_v W_U[:, v]` for each target, `[n, d_model]` on the model's device (the
/// mean taken in f64 on the host).
pub(crate) fn logit_directions(model: &Transformer, ids: &[i64]) -> Tensor<2> {
    let w_u = unembedding(model);
    let [d, v] = w_u.dims();
    let host: Vec<f32> = w_u.into_data().try_into_vec_as::<f32>().expect("f32");
    let mean: Vec<f32> = (0..d).map(|i| (host[i * v..(i + 1) * v].iter().map(|&x| x as f64).sum::<f64>() / v as f64) as f32).collect();
    let rows: Vec<f32> = ids.iter().flat_map(|&t| (0..d).map(|i| host[i * v + t as usize] - mean[i]).collect::<Vec<_>>()).collect();
    Tensor::from_data(TensorData::new(rows, [ids.len(), d]), &model.device())
}

/// Influence of every node on the logits from the rows computed so far (circuit-tracer's
/// `compute_partial_influences`): rows normalised by their absolute sum, then
/// `Σ_k w Aᵏ` from the logit weights, at most 128 terms.
fn partial_influences(rows: &Rows, logit_probs: &[f32]) -> Result<Vec<f32>, TraceError> {
    let (n, k) = (rows.stride, rows.nodes.len());
    // Each row's normalising factor once, not in every product.
    let scale: Vec<f32> = (0..k).map(|r| 1.0 / abs_sum(rows.row(r), 1e-8)).collect();
    influence(k, &rows.nodes, n, &logit_weights(n, logit_probs), 128, |r, out| {
        out.iter_mut().zip(rows.row(r)).for_each(|(o, x)| *o = x.abs());
        scale[r]
    })
}

/// Rows in the order computed, each over every node (logit columns zero), with the node
/// each row is the target of; one slot of `stride = n_nodes` floats per row, reserved for
/// every row the graph will have.
struct Rows {
    store: Floats,
    stride: usize,
    nodes: Vec<usize>,
}

impl Rows {
    fn compute(&mut self, rm: &Replacement, t: Targets, nodes: &[usize]) {
        let start = self.nodes.len() * self.stride;
        rm.rows_into(&t, &mut self.store[start..start + nodes.len() * self.stride], self.stride);
        self.nodes.extend_from_slice(nodes);
    }

    fn row(&self, r: usize) -> &[f32] {
        &self.store[r * self.stride..(r + 1) * self.stride]
    }

    /// The rows sorted by node and cut to `columns`, in place: `[rows, columns.len()]`.
    fn into_graph_rows(mut self, columns: &[usize]) -> Floats {
        let (k, w) = (self.nodes.len(), self.stride);
        // Sort the slots by node, following each cycle of the permutation with one spare row.
        let mut order: Vec<usize> = (0..k).collect();
        order.sort_by_key(|&r| self.nodes[r]);
        let mut placed = vec![false; k];
        let mut spare = vec![0f32; w];
        for start in 0..k {
            if placed[start] || order[start] == start {
                continue;
            }
            spare.copy_from_slice(&self.store[start * w..(start + 1) * w]);
            let mut at = start;
            while order[at] != start {
                let from = order[at];
                self.store.copy_within(from * w..(from + 1) * w, at * w);
                placed[at] = true;
                at = from;
            }
            self.store[at * w..(at + 1) * w].copy_from_slice(&spare);
            placed[at] = true;
        }
        // Keep `columns` (ascending): every value moves to an earlier or the same place, and
        // never onto one still to be read.
        let n = columns.len();
        for r in 0..k {
            for (j, &c) in columns.iter().enumerate() {
                self.store[r * n + j] = self.store[r * w + c];
            }
        }
        self.store.truncate(k * n);
        self.store
    }
}

/// The attribution graph of `ids` (attributed as given: add the BOS yourself).
pub fn attribute(model: &Transformer, set: &TranscoderSet, ids: &[i64], opts: &AttributeOptions) -> Result<Graph, TraceError> {
    check_options(opts)?;
    attribute_on(&Replacement::new(model, set, ids, opts.zero_positions, opts.pattern_budget)?, opts)
}

fn check_options(opts: &AttributeOptions) -> Result<(), TraceError> {
    if opts.batch_size == 0 || opts.update_interval == 0 {
        return Err(TraceError::Input("batch_size and update_interval must be at least 1".into()));
    }
    Ok(())
}

/// The attribution graph of the prompt of replacement model `rm` (built with `opts`'s
/// `zero_positions` and `pattern_budget`), which the graph's attention side can read again
/// ([`crate::graph_attention`]).
pub fn attribute_on(rm: &Replacement, opts: &AttributeOptions) -> Result<Graph, TraceError> {
    check_options(opts)?;
    let (model, set, ids) = (rm.model, rm.set, &rm.ids);
    let (n_layers, n_pos) = (rm.n_layers(), rm.n_pos());
    let n_active = rm.active.len();
    let (logit_ids, logit_probs) = select_logits(&rm.logits, &opts.targets)?;
    let n_logits = logit_ids.len();
    let logit_offset = n_active + (n_layers + 1) * n_pos;
    let n_nodes = logit_offset + n_logits;
    let max_features = opts.max_feature_nodes.unwrap_or(n_active).min(n_active);
    let mut rows = Rows {
        store: Floats::zeros((max_features + n_logits) * n_nodes, opts.row_budget)?,
        stride: n_nodes,
        nodes: Vec::with_capacity(max_features + n_logits),
    };

    let directions = logit_directions(model, &logit_ids);
    for start in (0..n_logits).step_by(opts.batch_size) {
        let end = (start + opts.batch_size).min(n_logits);
        let (layers, positions) = (vec![n_layers; end - start], vec![n_pos - 1; end - start]);
        let nodes: Vec<usize> = (start..end).map(|i| logit_offset + i).collect();
        let vectors = directions.clone().narrow(0, start, end - start);
        rows.compute(rm, Targets { layers: &layers, positions: &positions, vectors }, &nodes);
    }

    let mut visited = vec![false; n_active];
    let mut n_visited = 0;
    while n_visited < max_features {
        let pending: Vec<usize> = if max_features == n_active {
            (0..n_active).collect()
        } else {
            let influence = partial_influences(&rows, &logit_probs)?;
            let mut rank: Vec<usize> = (0..n_active).collect();
            rank.sort_by(|&a, &b| influence[b].total_cmp(&influence[a]));
            let queue = (opts.update_interval * opts.batch_size).min(max_features - n_visited);
            rank.into_iter().filter(|&i| !visited[i]).take(queue).collect()
        };
        // Rows are independent: computing a queue in another order changes nothing but the
        // cost. Sorted by position and layer, a batch's backward pass stops at its highest
        // layer and spans only the positions up to its last.
        let mut pending = pending;
        pending.sort_by_key(|&i| (rm.active[i].pos, rm.active[i].layer, i));
        for batch in pending.chunks(opts.batch_size) {
            let layers: Vec<usize> = batch.iter().map(|&i| rm.active[i].layer).collect();
            let positions: Vec<usize> = batch.iter().map(|&i| rm.active[i].pos).collect();
            let vectors = rm.encoder_rows(batch);
            rows.compute(rm, Targets { layers: &layers, positions: &positions, vectors }, batch);
            batch.iter().for_each(|&i| visited[i] = true);
            n_visited += batch.len();
        }
    }

    // The selected features in node order, then errors, tokens and logits; only feature
    // and logit rows are stored (the others are zero).
    let selected: Vec<usize> = (0..n_active).filter(|&i| visited[i]).collect();
    let columns: Vec<usize> = selected.iter().copied().chain(n_active..n_nodes).collect();
    let adjacency = rows.into_graph_rows(&columns);
    Ok(Graph {
        input_tokens: ids.to_vec(),
        active_features: rm.active.iter().map(|f| [f.layer as i64, f.pos as i64, f.feature as i64]).collect(),
        activation_values: rm.active.iter().map(|f| f.activation).collect(),
        selected_features: selected.iter().map(|&i| i as i64).collect(),
        rows: adjacency,
        logit_token_ids: logit_ids,
        logit_probabilities: logit_probs,
        n_layers,
        vocab_size: rm.logits.len(),
        scan: set.scan.clone(),
    })
}
