//! Head detectors (TransformerLens's `detect_head` with the "mul" measure) and the
//! repeated-random-tokens induction experiment.
//!
//! A detector is a 0/1 pattern over `(query, key)`; a head's score on a sequence is the
//! share of its attention that falls on the pattern, `Σ pattern ∘ detector / Σ pattern`,
//! averaged over the sequences given.

use burnlens_model::{AttnHook, Hooks, LayerHook, Rng, Transformer};
use serde::Serialize;

use crate::cache::run_with_cache;

/// The detectors TransformerLens defines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Detector {
    /// Attends to the previous position: `(q, q - 1)`.
    PreviousToken,
    /// Attends to earlier copies of the current token: `k < q`, `tok[k] == tok[q]`.
    DuplicateToken,
    /// Attends to the token after an earlier copy of the current token:
    /// `1 <= k <= q`, `tok[k - 1] == tok[q]`, `k - 1 != q`.
    Induction,
}

impl Detector {
    pub const ALL: [Detector; 3] = [Detector::PreviousToken, Detector::DuplicateToken, Detector::Induction];

    pub fn name(self) -> &'static str {
        match self {
            Detector::PreviousToken => "previous_token",
            Detector::DuplicateToken => "duplicate_token",
            Detector::Induction => "induction",
        }
    }

    /// The `[t, t]` 0/1 detection pattern of `tokens`, row-major (query, key).
    pub fn pattern(self, tokens: &[i64]) -> Vec<f32> {
        let t = tokens.len();
        let mut p = vec![0.0; t * t];
        for q in 0..t {
            for k in 0..=q {
                let on = match self {
                    Detector::PreviousToken => k + 1 == q,
                    Detector::DuplicateToken => k < q && tokens[k] == tokens[q],
                    Detector::Induction => k >= 1 && k - 1 != q && tokens[k - 1] == tokens[q],
                };
                if on {
                    p[q * t + k] = 1.0;
                }
            }
        }
        p
    }
}

/// Detector scores `[layer][head]` of every head, averaged over `sequences`.
pub fn head_scores(model: &Transformer, sequences: &[Vec<i64>], detector: Detector) -> Vec<Vec<f64>> {
    let (l, h) = (model.config.n_layers(), model.config.n_heads);
    let mut total = vec![vec![0.0; h]; l];
    for tokens in sequences {
        let t = tokens.len();
        let det = detector.pattern(tokens);
        let cache = run_with_cache(model, tokens, AttnHook::Pattern.every_layer());
        for (layer, row) in total.iter_mut().enumerate() {
            let pattern = cache.pattern(layer); // [head, q, k]
            for (head, acc) in row.iter_mut().enumerate() {
                let p = &pattern[head * t * t..(head + 1) * t * t];
                let hit: f64 = p.iter().zip(&det).map(|(a, b)| (*a * *b) as f64).sum();
                let all: f64 = p.iter().map(|&a| a as f64).sum();
                *acc += if all > 0.0 { hit / all } else { 0.0 };
            }
        }
    }
    total.iter_mut().flatten().for_each(|x| *x /= sequences.len().max(1) as f64);
    total
}

/// What the repeated-random-tokens experiment measured.
#[derive(Debug, Clone, Serialize)]
pub struct InductionReport {
    /// `[BOS] + r + r` per batch row.
    pub tokens: Vec<Vec<i64>>,
    pub seq_len: usize,
    pub bos: Option<i64>,
    /// `log p(token[i + 1] | token[..=i])`, averaged over the batch, one per predicted token.
    pub logprobs: Vec<f64>,
    /// Mean log-probability of the first copy of `r`.
    pub mean_logprob_first_half: f64,
    /// Mean log-probability of the second copy of `r` (high when induction works).
    pub mean_logprob_second_half: f64,
    /// `[layer][head]`: mean attention on the diagonal at offset `-(seq_len - 1)`, from each
    /// token to the token after its previous occurrence.
    pub induction_scores: Vec<Vec<f64>>,
}

/// Run `batch` sequences `[BOS] + r + r` with `r` `seq_len` uniform random tokens.
pub fn induction_experiment(model: &Transformer, seq_len: usize, batch: usize, seed: u64, bos: Option<i64>) -> InductionReport {
    let vocab = model.config.vocab_size as u64;
    let mut rng = Rng::new(seed);
    let tokens: Vec<Vec<i64>> = (0..batch)
        .map(|_| {
            let r: Vec<i64> = (0..seq_len).map(|_| rng.below(vocab) as i64).collect();
            bos.into_iter().chain(r.iter().copied()).chain(r.iter().copied()).collect()
        })
        .collect();
    let t = tokens[0].len();
    let off = usize::from(bos.is_some());
    let (l, h) = (model.config.n_layers(), model.config.n_heads);
    let mut logprobs = vec![0.0; t - 1];
    let mut scores = vec![vec![0.0; h]; l];
    for seq in &tokens {
        let mut hooks = Hooks::capture(AttnHook::Pattern.every_layer());
        let logits = model.forward_hooked(model.ids_tensor(seq), &mut hooks);
        let lp = token_logprobs(logits, seq);
        logprobs.iter_mut().zip(lp).for_each(|(a, b)| *a += b / batch as f64);
        for (layer, row) in scores.iter_mut().enumerate() {
            let pattern = hooks.cache[&AttnHook::Pattern.at(layer)].to_vec();
            for (head, acc) in row.iter_mut().enumerate() {
                let p = &pattern[head * t * t..(head + 1) * t * t];
                let shift = seq_len - 1;
                let diag: Vec<f64> = (shift..t).map(|q| p[q * t + q - shift] as f64).collect();
                *acc += diag.iter().sum::<f64>() / diag.len() as f64 / batch as f64;
            }
        }
    }
    // Prediction i is of token i + 1: the first copy of r is tokens off..off+seq_len.
    let first: Vec<f64> = (0..logprobs.len()).filter(|&i| i + 1 >= off.max(1) && i + 1 < off + seq_len).map(|i| logprobs[i]).collect();
    let second: Vec<f64> = (0..logprobs.len()).filter(|&i| i + 1 >= off + seq_len).map(|i| logprobs[i]).collect();
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    InductionReport { seq_len, bos, mean_logprob_first_half: mean(&first), mean_logprob_second_half: mean(&second), logprobs, induction_scores: scores, tokens }
}

/// `log p(seq[i + 1])` at every position `i` of one sequence.
pub fn token_logprobs(logits: burn::tensor::Tensor<3>, seq: &[i64]) -> Vec<f64> {
    let v = logits.dims()[2];
    let logp: Vec<f32> = burn::tensor::activation::log_softmax(logits, 2).into_data().try_into_vec_as::<f32>().expect("f32");
    (0..seq.len() - 1).map(|i| logp[i * v + seq[i + 1] as usize] as f64).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detection_patterns_follow_transformerlens() {
        let toks = [7, 3, 9, 7, 3];
        let at = |p: &[f32], q: usize, k: usize| p[q * 5 + k];
        let prev = Detector::PreviousToken.pattern(&toks);
        assert_eq!(prev.iter().sum::<f32>(), 4.0);
        assert_eq!(at(&prev, 3, 2), 1.0);
        let dup = Detector::DuplicateToken.pattern(&toks);
        assert_eq!((at(&dup, 3, 0), at(&dup, 4, 1), dup.iter().sum::<f32>()), (1.0, 1.0, 2.0));
        let ind = Detector::Induction.pattern(&toks);
        // Query 3 (token 7) -> key 1 (after the earlier 7); query 4 (token 3) -> key 2.
        assert_eq!((at(&ind, 3, 1), at(&ind, 4, 2), ind.iter().sum::<f32>()), (1.0, 1.0, 2.0));
    }
}

/// The two-head induction circuit found in a model: its strongest induction head (in any
/// layer but the first), the strongest previous-token head in an earlier layer, and how
/// strongly the induction head reads the previous-token head through its keys.
#[derive(Debug, Clone, Serialize)]
pub struct InductionCircuit {
    /// `(layer, head, previous-token score)` on the experiment's sequences.
    pub previous_token: (usize, usize, f64),
    /// `(layer, head, induction score)` from the experiment, in a layer after the
    /// previous-token head's.
    pub induction: (usize, usize, f64),
    /// K-composition of the previous-token head's OV into the induction head's QK.
    pub k_composition: f64,
    /// The random-matrix baseline of composition scores at these shapes.
    pub random_baseline: f64,
    /// The same for Q-composition, for contrast (induction needs K, not Q).
    pub q_composition: f64,
}

/// Locate the previous-token -> induction head pair of `model` on the sequences of an
/// induction experiment. `None` when the model has a single layer.
pub fn induction_circuit(model: &Transformer, report: &InductionReport) -> Option<InductionCircuit> {
    let prev = head_scores(model, &report.tokens, Detector::PreviousToken);
    let n_layers = prev.len();
    if n_layers < 2 {
        return None;
    }
    let best = |rows: &[Vec<f64>], layers: std::ops::Range<usize>| {
        layers.flat_map(|l| rows[l].iter().enumerate().map(move |(h, &s)| (l, h, s))).max_by(|a, b| a.2.total_cmp(&b.2)).expect("at least one head")
    };
    let induction = best(&report.induction_scores, 1..n_layers);
    let previous_token = best(&prev, 0..induction.0);
    let comp = crate::composition::composition_scores(model);
    let at = comp.index(previous_token.0, previous_token.1, induction.0, induction.1);
    Some(InductionCircuit {
        previous_token,
        induction,
        k_composition: comp.k[at] as f64,
        q_composition: comp.q[at] as f64,
        random_baseline: comp.random_baseline,
    })
}
