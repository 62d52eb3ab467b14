//! One training forward pass, as SAELens 6's `TrainingSAE.training_forward_pass` computes it:
//! `sae_in = x − b_dec`, `hidden_pre = sae_in·W_enc + b_enc`, the architecture's activation,
//! `sae_out = acts·W_dec + b_dec`, the MSE `Σ_d (sae_out − x)²` averaged over tokens, plus the
//! architecture's terms. A transcoder is the same pass with another target (the output
//! hook's activation, `Σ_d (out − y)²`), no `b_dec` taken from its input (SAELens's
//! transcoders refuse `apply_b_dec_to_input`) and, with a skip connection, `x · M` added to
//! its output. The pre-activations and the skip are the dictionary's own
//! ([`Dictionary::pre`], [`Dictionary::skip`]). On autodiff tensors: the gradients are
//! Burn's backward of these expressions, with JumpReLU's straight-through estimators written
//! so that their backward is SAELens's (see [`jump_relu`] and [`step`]).

use burn::tensor::activation::relu;
use burn::tensor::{Bool, Tensor};
use burnlens_lens::dictionary::select::kth_largest_rows;
use burnlens_model::matmul::matmul;

use crate::architecture::{Architecture, LossTerm, TopKSettings};
use burnlens_lens::dictionary::Dictionary;

/// What a training pass produced.
pub struct TrainPass {
    /// `[n, d_sae]`
    pub feature_acts: Tensor<2>,
    /// `[1]`: the sum of the terms.
    pub loss: Tensor<1>,
    /// Each term `[1]`, in the architecture's order.
    pub terms: Vec<(LossTerm, Tensor<1>)>,
}

/// A pass's values read back from the device.
#[derive(Debug, Clone)]
pub struct TrainPassValues {
    pub losses: Vec<(LossTerm, f64)>,
    pub loss: f64,
    pub l0: f64,
    pub dead: usize,
    /// Per feature: tokens of the batch it fired on.
    pub fired: Vec<u64>,
    /// BatchTopK: the smallest positive activation of the batch.
    pub min_positive: Option<f64>,
}

/// The inputs of a pass besides the parameters.
pub struct PassInput<'a> {
    /// `[n, d_in]`
    pub x: Tensor<2>,
    /// `[n, d_out]`: what the output should be (`x` for an SAE).
    pub target: Tensor<2>,
    /// The sparsity coefficient this step (after its warm-up).
    pub coefficient: f64,
    /// `[d_sae]` features dead before this step, and how many.
    pub dead: Option<(&'a Tensor<1, Bool>, usize)>,
    /// BatchTopK over a batch whose rows several ranks share; `None` alone.
    pub shared: Option<BatchShare<'a>>,
}

/// BatchTopK's choice over a batch shared by ranks: this rank holds some of its `rows`, and
/// `threshold(acts, kk)` gives the `kk`-th largest of every rank's activations together from
/// this rank's (`acts`, detached, `[rows here, d_sae]`).
#[derive(Clone, Copy)]
pub struct BatchShare<'a> {
    pub rows: usize,
    pub threshold: &'a dyn Fn(Tensor<2>, usize) -> f32,
}

/// The training pass of `p` (autodiff leaves) on `input`.
pub fn training_pass(p: &Dictionary, arch: &Architecture, input: PassInput) -> TrainPass {
    let PassInput { x, target, coefficient, dead, shared } = input;
    let d_sae = p.d_sae();
    // TopK's and BatchTopK's kept features (and the auxiliary loss's, with dead features)
    // alone get a gradient of their pre-activations.
    let kept = kept_per_row(arch);
    let aux = dead.map_or(0, |(_, n)| n.min((target.dims()[1] / 2).max(1)));
    let pre = match kept {
        Some(k) => p.pre_with_sparse_gradient(x.clone(), k + aux),
        None => p.pre(x.clone()),
    };
    let norms = || p.decoder_norms().reshape([1, d_sae]);
    let (acts, out, extra): (Tensor<2>, Tensor<2>, Vec<(LossTerm, Tensor<1>)>) = match arch {
        Architecture::Standard { .. } => {
            let acts = relu(pre);
            let out = matmul(acts.clone(), p.decoder().clone()) + p.b_dec.clone().unsqueeze::<2>();
            let l1 = (acts.clone() * norms()).abs().sum_dim(1).mean() * coefficient;
            (acts, out, vec![(LossTerm::L1, l1)])
        }
        Architecture::TopK(t) | Architecture::BatchTopK { topk: t, .. } => {
            let hidden = if t.rescale_acts_by_decoder_norm { pre * norms() } else { pre };
            let acts = match arch {
                Architecture::TopK(_) => top_k(hidden.clone(), t.k as usize),
                _ => batch_top_k(hidden.clone(), t.k, shared),
            };
            let cap = kept.expect("TopK and BatchTopK keep a number of features a row");
            let out = decode_rescaled(p, t, acts.clone(), Sparsity::NonZeros(cap)) + p.b_dec.clone().unsqueeze::<2>();
            let aux = aux_k_loss(p, t, &target, &with_skip(p, &x, out.clone()), hidden, dead);
            (acts, out, vec![(LossTerm::AuxiliaryReconstruction, aux)])
        }
        Architecture::JumpRelu(j) => {
            let theta = p.threshold.clone().expect("a JumpReLU SAE has thresholds").reshape([1, d_sae]);
            let acts = jump_relu(pre.clone(), theta.clone(), j.bandwidth);
            let out = matmul(acts.clone(), p.decoder().clone()) + p.b_dec.clone().unsqueeze::<2>();
            let l0 = step(pre.clone(), theta.clone(), j.bandwidth).sum_dim(1).mean() * coefficient;
            let mut terms = vec![(LossTerm::L0, l0)];
            if let Some(c) = j.pre_act_loss_coefficient {
                let loss = match dead {
                    Some((mask, n)) if n > 0 => {
                        let dead = mask.clone().float().reshape([1, d_sae]);
                        (relu(theta - pre) * dead * norms()).sum_dim(1).mean() * c
                    }
                    _ => Tensor::zeros([1], &target.device()),
                };
                terms.push((LossTerm::PreAct, loss));
            }
            (acts, out, terms)
        }
    };
    let mse = (with_skip(p, &x, out) - target).square().sum_dim(1).mean();
    let mut terms = vec![(LossTerm::Mse, mse)];
    terms.extend(extra);
    let loss = terms.iter().skip(1).fold(terms[0].1.clone(), |acc, (_, t)| acc + t.clone());
    terms.sort_by_key(|(t, _)| t.name());
    TrainPass { feature_acts: acts, loss, terms }
}

/// `out + x · M` for a skip transcoder, `out` otherwise.
fn with_skip(p: &Dictionary, x: &Tensor<2>, out: Tensor<2>) -> Tensor<2> {
    match p.skip(x.clone()) {
        Some(s) => out + s,
        None => out,
    }
}

/// How many features a row keeps, about: TopK's `k`, BatchTopK's `k` on average (a row's
/// share of the batch's `k · n`, up to four times it listed before a row is read whole);
/// `None` for the architectures whose activations are not chosen by count.
fn kept_per_row(arch: &Architecture) -> Option<usize> {
    match arch {
        Architecture::TopK(t) => Some(t.k as usize),
        Architecture::BatchTopK { topk: t, .. } => Some((4.0 * t.k).ceil() as usize),
        _ => None,
    }
}

/// Which entries of a TopK decode's activations may be non-zero, for the sparse decode on a
/// GPU (about `cap` a row; a row with more is read whole).
enum Sparsity {
    /// Their own non-zeros: TopK's and BatchTopK's activations, whose mask and ReLU pass no
    /// gradient through the zeros, so their gradient is wanted there alone.
    NonZeros(usize),
    /// The non-zeros of a mask they were multiplied by (the auxiliary loss's kept
    /// pre-activations, not ReLU'd: a kept one that is exactly zero still gets its gradient).
    Mask(Tensor<2>, usize),
}

/// `acts · W_dec`, the activations divided by the decoder rows' norms first when the TopK
/// choice was made on rescaled pre-activations (SAELens's `act_times_W_dec`); on a GPU the
/// sparse decode reads only the decoder rows each token uses ([`Sparsity`]).
fn decode_rescaled(p: &Dictionary, t: &TopKSettings, acts: Tensor<2>, sparsity: Sparsity) -> Tensor<2> {
    use burnlens_model::gpu::{decode_sparse, decode_sparse_on};
    let d_sae = p.d_sae();
    let acts = if t.rescale_acts_by_decoder_norm { acts * p.decoder_norms().reshape([1, d_sae]).recip() } else { acts };
    let w = p.decoder().clone();
    let sparse = match sparsity {
        Sparsity::NonZeros(cap) => decode_sparse(acts.clone(), w.clone(), cap),
        Sparsity::Mask(mask, cap) => decode_sparse_on(acts.clone(), mask, w.clone(), cap),
    };
    sparse.unwrap_or_else(|| matmul(acts, w))
}

/// The ReLU of the `k` largest entries of each row, zero elsewhere.
fn top_k(hidden: Tensor<2>, k: usize) -> Tensor<2> {
    let [n, m] = hidden.dims();
    let kth = kth_largest_rows(&hidden, k).expand([n, m]);
    let keep = hidden.clone().detach().greater_equal(kth).float();
    relu(hidden) * keep
}

/// The `⌊k·n⌋` largest ReLU activations of the whole batch (of `n` rows: all ranks' when
/// `shared`), zero elsewhere.
fn batch_top_k(hidden: Tensor<2>, k: f64, shared: Option<BatchShare>) -> Tensor<2> {
    let [n, m] = hidden.dims();
    let acts = relu(hidden);
    let rows = shared.map_or(n, |s| s.rows);
    let kk = ((k * rows as f64) as usize).clamp(1, rows * m);
    let keep = match shared {
        None => {
            let kth = kth_largest_rows(&acts.clone().reshape([1, n * m]), kk).reshape([1, 1]).expand([n, m]);
            acts.clone().detach().greater_equal(kth)
        }
        Some(s) => {
            let detached = acts.clone().detach();
            detached.clone().greater_equal_elem((s.threshold)(detached, kk))
        }
    };
    acts * keep.float()
}

/// SAELens's TopK auxiliary loss: the `k_aux = min(d/2, dead)` largest pre-activations of
/// dead features reconstruct the (detached) residual `target − sae_out` through the decoder
/// without bias, scaled by `min(dead / (d_in/2), 1)`; zero without dead features.
fn aux_k_loss(p: &Dictionary, t: &TopKSettings, target: &Tensor<2>, out: &Tensor<2>, hidden: Tensor<2>, dead: Option<(&Tensor<1, Bool>, usize)>) -> Tensor<1> {
    let Some((mask, n_dead)) = dead.filter(|(_, n)| *n > 0) else { return Tensor::zeros([1], &target.device()) };
    let [n, m] = hidden.dims();
    let d_in = target.dims()[1];
    let half = (d_in / 2).max(1);
    let scale = (n_dead as f64 / half as f64).min(1.0);
    let k_aux = half.min(n_dead);
    let alive = mask.clone().bool_not().reshape([1, m]).expand([n, m]);
    let masked = hidden.clone().detach().mask_fill(alive, f32::NEG_INFINITY);
    let kth = kth_largest_rows(&masked, k_aux).expand([n, m]);
    let keep = masked.greater_equal(kth).float();
    let residual = (target.clone() - out.clone()).detach();
    let recons = decode_rescaled(p, t, hidden * keep.clone(), Sparsity::Mask(keep, k_aux));
    (recons - residual).square().sum_dim(1).mean() * (t.aux_loss_coefficient * scale)
}

/// `rectangle((x − θ)/bandwidth)`: 1 where `|x − θ| < bandwidth/2`.
fn window(x: &Tensor<2>, theta: &Tensor<2>, bandwidth: f64) -> Tensor<2> {
    let [n, m] = x.dims();
    let z = (x.clone().detach() - theta.clone().detach().expand([n, m])) / bandwidth;
    z.clone().greater_elem(-0.5).bool_and(z.lower_elem(0.5)).float()
}

/// `x · [x > θ]` whose backward is SAELens's `JumpReLU`: `[x > θ]·g` to `x`, and
/// `−Σ_tokens (θ/bandwidth)·rectangle((x − θ)/bandwidth)·g` to `θ` (the estimator enters as
/// `(θ − stop(θ))·c`, zero in value, `c` in gradient).
pub fn jump_relu(x: Tensor<2>, theta: Tensor<2>, bandwidth: f64) -> Tensor<2> {
    let [n, m] = x.dims();
    let on = x.clone().detach().greater(theta.clone().detach().expand([n, m])).float();
    let c = window(&x, &theta, bandwidth) * theta.clone().detach().expand([n, m]) * (-1.0 / bandwidth);
    x * on + (theta.clone() - theta.detach()).expand([n, m]) * c
}

/// `[x > θ]` whose backward is SAELens's `Step`: nothing to `x`, and
/// `−Σ_tokens (1/bandwidth)·rectangle((x − θ)/bandwidth)·g` to `θ`.
pub fn step(x: Tensor<2>, theta: Tensor<2>, bandwidth: f64) -> Tensor<2> {
    let [n, m] = x.dims();
    let on = x.clone().detach().greater(theta.clone().detach().expand([n, m])).float();
    let c = window(&x, &theta, bandwidth) * (-1.0 / bandwidth);
    on + (theta.clone() - theta.detach()).expand([n, m]) * c
}
