//! Gradients of a scalar metric with respect to the activations at named hook points, in one
//! backward pass (TransformerLens's backward hooks).
//!
//! Each chosen hook point adds a zero tensor that requires a gradient (`x + δ`, `δ = 0`):
//! the forward values are unchanged, the activation itself is not cut from the graph, and
//! `∂metric/∂δ` is the total derivative with respect to the activation, counting every path,
//! including those through later chosen points. Autodiff starts at the first chosen point;
//! the parameters are constants.
//!
//! ```ignore
//! let metric = Metric::LogitDiff { pos: None, right: 5, wrong: 9 };
//! let g = hook_gradients(&model, &ids, &|n| n.ends_with("hook_z"), &metric)?;
//! let dz = &g.gradients["blocks.1.attn.hook_z"]; // [1, pos, head, d_head]
//! ```

use std::cell::RefCell;
use std::collections::BTreeMap;

use burn::tensor::activation::log_softmax;
use burn::tensor::{Int, Tensor, TensorData};
use burnlens_model::{Activation, HookPoint, Hooks, Transformer};

/// A scalar read from the logits of one sequence: what a gradient or a patch is measured by.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Metric {
    /// `logit[pos, right] - logit[pos, wrong]` (`pos`: the last position when `None`).
    LogitDiff { pos: Option<usize>, right: i64, wrong: i64 },
    /// `log p(token)` at `pos` (the last position when `None`).
    LogProb { pos: Option<usize>, token: i64 },
    /// Mean next-token cross-entropy over the predictions made at positions `from..`.
    Loss { from: usize },
}

/// Why a metric cannot be read from a sequence.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MetricError {
    #[error("metric position {pos} is outside the sequence of {len} tokens")]
    Position { pos: usize, len: usize },
    #[error("metric token {id} is outside the vocabulary of {vocab}")]
    Token { id: i64, vocab: usize },
    #[error("the loss from position {from} needs at least {} tokens, the sequence has {len}", from + 2)]
    TooShort { from: usize, len: usize },
    #[error("clean and corrupted sequences differ in length ({clean} vs {corrupted} tokens)")]
    Lengths { clean: usize, corrupted: usize },
}

/// Why a metric specification does not parse: its syntax, or one of its tokens (the error of
/// the caller's token reader).
#[derive(Debug, PartialEq)]
pub enum MetricParseError<E> {
    Syntax(&'static str),
    Token(E),
}

impl Metric {
    /// The grammar [`Metric::parse`] reads, for error messages.
    pub const GRAMMAR: &'static str = "loss[:FROM], logprob:TOKEN[@POS] or logit-diff:RIGHT,WRONG[@POS]";

    /// Read `loss[:FROM]`, `logprob:TOKEN[@POS]` or `logit-diff:RIGHT,WRONG[@POS]` (also
    /// `logit_diff`); `token` turns one TOKEN (an id, or text of one token) into an id.
    pub fn parse<E>(spec: &str, mut token: impl FnMut(&str) -> Result<i64, E>) -> Result<Self, MetricParseError<E>> {
        use MetricParseError::{Syntax, Token};
        let (kind, rest) = spec.split_once(':').unwrap_or((spec, ""));
        let (args, pos) = match rest.rsplit_once('@') {
            Some((a, p)) => (a, Some(p.trim().parse::<usize>().map_err(|_| Syntax("POS is not a position"))?)),
            None => (rest, None),
        };
        Ok(match kind {
            "loss" => Metric::Loss { from: if args.is_empty() { 0 } else { args.trim().parse().map_err(|_| Syntax("FROM is not a position"))? } },
            "logprob" if !args.is_empty() => Metric::LogProb { pos, token: token(args).map_err(Token)? },
            "logit-diff" | "logit_diff" => {
                let (r, w) = args.split_once(',').ok_or(Syntax("logit-diff needs RIGHT,WRONG"))?;
                Metric::LogitDiff { pos, right: token(r).map_err(Token)?, wrong: token(w).map_err(Token)? }
            }
            _ => return Err(Syntax("unknown metric")),
        })
    }

    /// Check the metric against a sequence of `len` tokens and a vocabulary.
    pub fn check(&self, len: usize, vocab: usize) -> Result<(), MetricError> {
        let token = |id: i64| if id < 0 || id as usize >= vocab { Err(MetricError::Token { id, vocab }) } else { Ok(()) };
        let pos = |p: Option<usize>| match p {
            Some(pos) if pos >= len => Err(MetricError::Position { pos, len }),
            _ => Ok(()),
        };
        match *self {
            Metric::LogitDiff { pos: p, right, wrong } => {
                pos(p)?;
                token(right)?;
                token(wrong)
            }
            Metric::LogProb { pos: p, token: t } => {
                pos(p)?;
                token(t)
            }
            Metric::Loss { from } if from + 2 > len => Err(MetricError::TooShort { from, len }),
            Metric::Loss { .. } => Ok(()),
        }
    }

    /// The metric of the first sequence of `logits: [batch, pos, vocab]`, as `[1]` (so it can
    /// be differentiated).
    pub fn eval(&self, logits: Tensor<3>, ids: &[i64]) -> Tensor<1> {
        let [_, t, v] = logits.dims();
        let row = |p: Option<usize>| -> Tensor<1> {
            let p = p.unwrap_or(t - 1);
            logits.clone().narrow(0, 0, 1).narrow(1, p, 1).reshape([v])
        };
        let pick = |x: Tensor<1>, id: i64| x.narrow(0, id as usize, 1);
        match *self {
            Metric::LogitDiff { pos, right, wrong } => {
                let r = row(pos);
                pick(r.clone(), right) - pick(r, wrong)
            }
            Metric::LogProb { pos, token } => pick(log_softmax(row(pos), 0), token),
            Metric::Loss { from } => {
                let n = t - 1 - from;
                let lp = log_softmax(logits.narrow(0, 0, 1).narrow(1, from, n).reshape([n, v]), 1);
                let targets = Tensor::<2, Int>::from_data(TensorData::new(ids[from + 1..].to_vec(), [n, 1]), &lp.device());
                lp.gather(1, targets).mean().neg().reshape([1])
            }
        }
    }

    /// The metric from the final norm's output `stream: [batch, pos, d_model]` of the first
    /// sequence, unembedding only the positions it reads (one for a logit or log-probability,
    /// `from..` for the loss).
    pub fn eval_stream(&self, model: &Transformer, stream: Tensor<3>, ids: &[i64]) -> Tensor<1> {
        let t = stream.dims()[1];
        let (start, shifted) = match *self {
            Metric::LogitDiff { pos, right, wrong } => {
                let p = pos.unwrap_or(t - 1);
                (p, Metric::LogitDiff { pos: Some(0), right, wrong })
            }
            Metric::LogProb { pos, token } => {
                let p = pos.unwrap_or(t - 1);
                (p, Metric::LogProb { pos: Some(0), token })
            }
            Metric::Loss { from } => (from, Metric::Loss { from: 0 }),
        };
        let end = if matches!(self, Metric::Loss { .. }) { t } else { start + 1 };
        let logits = model.soft_cap_logits(model.unembed(stream.narrow(0, 0, 1).narrow(1, start, end - start)));
        shifted.eval(logits, &ids[start..])
    }

    /// The metric's value for `ids` (a plain forward pass, no gradient), with `hooks`.
    pub fn value(&self, model: &Transformer, ids: &[i64], hooks: &mut Hooks) -> f64 {
        let logits = model.forward_hooked(model.ids_tensor(ids), hooks);
        self.eval(logits, ids).into_scalar::<f32>() as f64
    }

    /// A short description, e.g. `logit[-1, 5] - logit[-1, 9]`.
    pub fn describe(&self) -> String {
        let p = |p: Option<usize>| p.map_or("-1".to_string(), |p| p.to_string());
        match self {
            Metric::LogitDiff { pos, right, wrong } => format!("logit[{}, {right}] - logit[{}, {wrong}]", p(*pos), p(*pos)),
            Metric::LogProb { pos, token } => format!("log p(token {token} at {})", p(*pos)),
            Metric::Loss { from } => format!("mean next-token loss from position {from}"),
        }
    }
}

/// The metric, the activations and the metric's gradients at the chosen hook points.
pub struct HookGradients {
    pub metric: f64,
    /// Activation values by hook point (no autodiff), batch dimension kept.
    pub activations: BTreeMap<HookPoint, Activation>,
    /// `∂metric/∂activation` by hook point, each the shape of its activation.
    pub gradients: BTreeMap<HookPoint, Activation>,
}

/// `∂metric/∂activation` at every hook point `points` accepts, from one forward
/// and one backward pass over `ids` (one sequence). The model may live on any device: the
/// activations become autodiff tensors at the chosen points, and the parameters enter the
/// graph as constants (no parameter gradients are computed).
pub fn hook_gradients(model: &Transformer, ids: &[i64], points: &dyn Fn(HookPoint) -> bool, metric: &Metric) -> Result<HookGradients, MetricError> {
    metric.check(ids.len(), model.config.vocab_size)?;
    let device = model.device();
    let deltas: RefCell<Vec<(HookPoint, Activation)>> = RefCell::new(Vec::new());
    let mut hooks = Hooks::capture(points).with_edit(points, |point, act| match act {
        Activation::Rank3(x) => {
            let d = Tensor::<3>::zeros(x.dims(), &device).autodiff().require_grad();
            deltas.borrow_mut().push((point, Activation::Rank3(d.clone())));
            Activation::Rank3(x.autodiff() + d)
        }
        Activation::Rank4(x) => {
            let d = Tensor::<4>::zeros(x.dims(), &device).autodiff().require_grad();
            deltas.borrow_mut().push((point, Activation::Rank4(d.clone())));
            Activation::Rank4(x.autodiff() + d)
        }
    });
    let logits = model.forward_hooked(model.ids_tensor(ids), &mut hooks);
    let activations = hooks.take_cache().into_iter().map(|(n, a)| (n, inner(a))).collect();
    drop(hooks);
    let m = metric.eval(logits, ids);
    let value = m.clone().inner().into_scalar::<f32>() as f64;
    let grads = m.backward();
    let gradients = deltas
        .into_inner()
        .into_iter()
        .map(|(name, d)| {
            let g = match &d {
                Activation::Rank3(t) => Activation::Rank3(t.grad(&grads).unwrap_or_else(|| t.clone().inner())),
                Activation::Rank4(t) => Activation::Rank4(t.grad(&grads).unwrap_or_else(|| t.clone().inner())),
            };
            (name, g)
        })
        .collect();
    Ok(HookGradients { metric: value, activations, gradients })
}

fn inner(a: Activation) -> Activation {
    match a {
        Activation::Rank3(t) => Activation::Rank3(t.inner()),
        Activation::Rank4(t) => Activation::Rank4(t.inner()),
    }
}

#[cfg(test)]
mod parse_tests {
    use super::*;

    fn ids(s: &str) -> Result<i64, String> {
        s.trim().parse::<i64>().map_err(|_| format!("{s:?} is not an id"))
    }

    #[test]
    fn the_metric_grammar() {
        assert_eq!(Metric::parse("loss", ids), Ok(Metric::Loss { from: 0 }));
        assert_eq!(Metric::parse("loss:3", ids), Ok(Metric::Loss { from: 3 }));
        assert_eq!(Metric::parse("logprob:7", ids), Ok(Metric::LogProb { pos: None, token: 7 }));
        assert_eq!(Metric::parse("logprob:7@2", ids), Ok(Metric::LogProb { pos: Some(2), token: 7 }));
        assert_eq!(Metric::parse("logit-diff:3,11", ids), Ok(Metric::LogitDiff { pos: None, right: 3, wrong: 11 }));
        assert_eq!(Metric::parse("logit_diff:3, 11@5", ids), Ok(Metric::LogitDiff { pos: Some(5), right: 3, wrong: 11 }));
        assert_eq!(Metric::parse("loss:x", ids), Err(MetricParseError::Syntax("FROM is not a position")));
        assert_eq!(Metric::parse("logprob:7@x", ids), Err(MetricParseError::Syntax("POS is not a position")));
        assert_eq!(Metric::parse("logit-diff:3", ids), Err(MetricParseError::Syntax("logit-diff needs RIGHT,WRONG")));
        assert_eq!(Metric::parse("logprob", ids), Err(MetricParseError::Syntax("unknown metric")));
        assert_eq!(Metric::parse("accuracy", ids), Err(MetricParseError::Syntax("unknown metric")));
        assert_eq!(Metric::parse("logprob:cat", ids), Err(MetricParseError::Token("\"cat\" is not an id".to_string())));
    }
}
