//! One row of QK attributions — a (query, key) score and its terms — from the parts of the
//! two positions: the score's sums by kind from the parts' sums
//! (bilinearity: `Σ_ij q_i·k_j = (Σ_i q_i)·(Σ_j k_j)`), and its largest terms without
//! computing every pair: parts ranked by norm, the pairs of the largest ones computed, and
//! the block widened until no pair outside it can be larger (`|q_i·k_j| ≤ |q_i| |k_j|`).

use serde::Serialize;

use super::node::QkNode;

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

/// One position's parts and their queries or keys, `[n, d_head]` row-major, ranked.
pub(crate) struct Ranked {
    pub nodes: Vec<QkNode>,
    pub vectors: Vec<f32>,
    /// Parts by norm, largest first, and those norms.
    order: Vec<usize>,
    norms: Vec<f32>,
    /// Sums of every part, of the features, of the parts that are not errors (f64).
    all: Vec<f64>,
    features: Vec<f64>,
    no_errors: Vec<f64>,
}

impl Ranked {
    pub fn new(nodes: Vec<QkNode>, vectors: Vec<f32>, dh: usize) -> Self {
        let n = nodes.len();
        let norm = |i: usize| vectors[i * dh..(i + 1) * dh].iter().map(|x| x * x).sum::<f32>().sqrt();
        let mut order: Vec<usize> = (0..n).collect();
        let all_norms: Vec<f32> = (0..n).map(norm).collect();
        order.sort_by(|&a, &b| all_norms[b].total_cmp(&all_norms[a]));
        let norms = order.iter().map(|&i| all_norms[i]).collect();
        let sum = |keep: &dyn Fn(&QkNode) -> bool| {
            let mut s = vec![0f64; dh];
            for (i, _) in nodes.iter().enumerate().filter(|(_, n)| keep(n)) {
                s.iter_mut().zip(&vectors[i * dh..(i + 1) * dh]).for_each(|(a, &x)| *a += x as f64);
            }
            s
        };
        let (all, features, no_errors) = (sum(&|_| true), sum(&|n| matches!(n, QkNode::Feature { .. })), sum(&|n| !matches!(n, QkNode::Error { .. })));
        Self { nodes, vectors, order, norms, all, features, no_errors }
    }

    fn vector(&self, i: usize, dh: usize) -> &[f32] {
        &self.vectors[i * dh..(i + 1) * dh]
    }
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Row `at` (where it is and what the model says there) with its terms from the query's
/// parts `q` and the key's `k`, the `top` largest listed (`scale` the model's score factor).
pub(crate) fn row(at: QkRow, q: &Ranked, k: &Ranked, dh: usize, scale: f32, top: usize) -> QkRow {
    let s = scale as f64;
    let total = dot(&q.all, &k.all) * s;
    let ff = dot(&q.features, &k.features) * s;
    let error = total - dot(&q.no_errors, &k.no_errors) * s;
    let (n_q, n_k) = (q.nodes.len(), k.nodes.len());
    let top = top.min(n_q * n_k);
    // The pairs of the `m` largest parts of each side, widened until the `top`-th largest
    // term found is at least any term outside the block can be.
    let mut m = (2 * top).max(32);
    let terms = loop {
        let (mq, mk) = (m.min(n_q), m.min(n_k));
        let mut block: Vec<(usize, usize, f32)> = Vec::with_capacity(mq * mk);
        for &i in &q.order[..mq] {
            let a = q.vector(i, dh);
            for &j in &k.order[..mk] {
                let c = burnlens_model::kernels::dot(a, k.vector(j, dh)) * scale;
                block.push((i, j, c));
            }
        }
        if top > 0 && top < block.len() {
            block.select_nth_unstable_by(top - 1, |x, y| y.2.abs().total_cmp(&x.2.abs()));
        }
        block.truncate(top);
        let outside = q
            .norms
            .get(mq)
            .map_or(0.0, |&nq| nq * k.norms.first().copied().unwrap_or(0.0))
            .max(k.norms.get(mk).map_or(0.0, |&nk| nk * q.norms.first().copied().unwrap_or(0.0)))
            * scale.abs();
        let kth = block.iter().map(|t| t.2.abs()).fold(f32::INFINITY, f32::min);
        if (mq == n_q && mk == n_k) || (block.len() == top && kth >= outside) {
            break block;
        }
        m *= 4;
    };
    let mut terms = terms;
    terms.sort_by(|x, y| y.2.abs().total_cmp(&x.2.abs()));
    let listed: f64 = terms.iter().map(|t| t.2 as f64).sum();
    QkRow {
        terms: terms.into_iter().map(|(i, j, c)| QkTerm { query_node: q.nodes[i], key_node: k.nodes[j], contribution: c }).collect(),
        remainder: (total - listed) as f32,
        feature_feature: ff as f32,
        error: error as f32,
        other: (total - ff - error) as f32,
        ..at
    }
}
