//! Autoregressive generation with a KV cache: the prompt is run once, then each new token
//! costs one position.

use crate::error::ModelError;
use crate::rng::Rng;
use crate::transformer::{KvCache, Transformer};

/// How to pick each next token.
#[derive(Debug, Clone)]
pub struct Sampling {
    pub max_new_tokens: usize,
    /// `0.0` means greedy (argmax); otherwise logits are divided by it before the softmax.
    pub temperature: f64,
    /// Keep only the `k` most likely tokens.
    pub top_k: Option<usize>,
    /// Keep the smallest set of most likely tokens whose probability reaches `p`.
    pub top_p: Option<f64>,
    pub seed: u64,
    /// Stop after producing this token (it is included in the output).
    pub stop_token: Option<i64>,
    /// Use the KV cache (default). Without it every step reruns the whole sequence; only
    /// useful to check the cache.
    pub use_cache: bool,
}

impl Default for Sampling {
    fn default() -> Self {
        Self { max_new_tokens: 32, temperature: 0.0, top_k: None, top_p: None, seed: 0, stop_token: None, use_cache: true }
    }
}

impl Sampling {
    fn validate(&self) -> Result<(), ModelError> {
        let bad = |field, msg: String| Err(ModelError::Config { field, msg });
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return bad("temperature", format!("must be >= 0, found {}", self.temperature));
        }
        if self.top_k == Some(0) {
            return bad("top_k", "must be at least 1, found 0".into());
        }
        if let Some(p) = self.top_p
            && !(p > 0.0 && p <= 1.0)
        {
            return bad("top_p", format!("must be in (0, 1], found {p}"));
        }
        Ok(())
    }
}

/// Continue `prompt` with up to `s.max_new_tokens` tokens; returns only the new ones. Stops
/// early at `s.stop_token` or when the context is full (learned positions end at `n_ctx`).
pub fn generate(model: &Transformer, prompt: &[i64], s: &Sampling) -> Result<Vec<i64>, ModelError> {
    s.validate()?;
    model.check_ids(prompt)?;
    // The last token produced is never fed back, so it needs no position.
    let budget = s.max_new_tokens.min(model.config.n_ctx + 1 - prompt.len());
    let mut rng = Rng::new(s.seed);
    let mut seq = prompt.to_vec();
    let mut cache = KvCache::new();
    let mut out = Vec::with_capacity(budget);
    let vocab = model.config.vocab_size;
    for i in 0..budget {
        let logits = if s.use_cache {
            let new = if i == 0 { &seq[..] } else { &seq[seq.len() - 1..] };
            model.forward_cached(model.ids_tensor(new), &mut cache)
        } else {
            model.forward(model.ids_tensor(&seq))
        };
        let t = logits.dims()[1];
        let last: Vec<f32> = logits.narrow(1, t - 1, 1).into_data().try_into_vec_as::<f32>().expect("f32 logits");
        assert_eq!(last.len(), vocab);
        let next = pick(&last, s, &mut rng) as i64;
        out.push(next);
        seq.push(next);
        if s.stop_token == Some(next) {
            break;
        }
    }
    Ok(out)
}

/// Choose a token from one row of logits.
pub fn pick(logits: &[f32], s: &Sampling, rng: &mut Rng) -> usize {
    let argmax = || logits.iter().enumerate().fold((0, f32::NEG_INFINITY), |b, (i, &x)| if x > b.1 { (i, x) } else { b }).0;
    if s.temperature == 0.0 {
        return argmax();
    }
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    if let Some(k) = s.top_k {
        order.truncate(k.max(1));
    }
    let max = logits[order[0]] as f64;
    let mut probs: Vec<f64> = order.iter().map(|&i| ((logits[i] as f64 - max) / s.temperature).exp()).collect();
    let total: f64 = probs.iter().sum();
    probs.iter_mut().for_each(|p| *p /= total);
    if let Some(top_p) = s.top_p {
        let mut cum = 0.0;
        let keep = probs.iter().position(|p| {
            cum += p;
            cum >= top_p
        });
        let keep = keep.map_or(probs.len(), |i| i + 1);
        order.truncate(keep);
        probs.truncate(keep);
    }
    let total: f64 = probs.iter().sum();
    let mut u = rng.next_f64() * total;
    for (i, p) in order.iter().zip(&probs) {
        if u < *p {
            return *i;
        }
        u -= p;
    }
    *order.last().expect("at least one candidate")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(temperature: f64, top_k: Option<usize>, top_p: Option<f64>) -> Sampling {
        Sampling { temperature, top_k, top_p, ..Sampling::default() }
    }

    #[test]
    fn greedy_takes_the_first_maximum() {
        assert_eq!(pick(&[0.0, 3.0, 3.0, 1.0], &s(0.0, None, None), &mut Rng::new(0)), 1);
    }

    #[test]
    fn top_k_and_top_p_restrict_the_candidates() {
        let logits = [5.0, 4.9, 0.0, -1.0, 4.8];
        let mut rng = Rng::new(1);
        for _ in 0..500 {
            let k = pick(&logits, &s(1.0, Some(2), None), &mut rng);
            assert!(k == 0 || k == 1);
            // The two best hold about 0.34 + 0.31 of the mass: p = 0.5 keeps exactly them.
            let p = pick(&logits, &s(1.0, None, Some(0.5)), &mut rng);
            assert!(p == 0 || p == 1, "{p}");
        }
        let mut seen = [false; 5];
        for _ in 0..2000 {
            seen[pick(&logits, &s(1.0, None, None), &mut rng)] = true;
        }
        assert!(seen.iter().all(|&x| x), "plain sampling should reach every token: {seen:?}");
    }
}
