//! The standard and JumpReLU training pass with its backward written out: the five products
//! (encoder, decoder, the decoder's two gradients, the encoder's gradient) on Burn's matmul,
//! and every element-wise step of SAELens's loss and its straight-through estimators in one
//! pass over the `[n, d_sae]` pre-activations on the host, rows in parallel, instead of the
//! dozen tensors autodiff keeps. The values and gradients are those of
//! [`training_pass`](crate::forward::training_pass) (a test holds them together):
//!
//! - standard: `acts = relu(pre)`, L1 `c/n · Σ acts·‖W_dec[j]‖`, so `∂pre = [pre > 0]·(∂acts +
//!   c/n·‖W_dec[j]‖)` and each decoder row gets `(c/n · Σ_tokens acts) · W_dec[j]/‖W_dec[j]‖`;
//! - JumpReLU: `acts = pre·[pre > θ]`, L0 `c/n · Σ [pre > θ]`, `∂pre = [pre > θ]·∂acts`, and
//!   `∂θ = Σ_tokens rect((pre − θ)/bw) · (−θ/bw · ∂acts − c/(n·bw))` (SAELens's `JumpReLU`
//!   and `Step` backward). Anthropic's pre-activation loss, when dead features make it
//!   non-zero, is left to autodiff ([`handles`]).

use burn::tensor::Tensor;
use burnlens_model::matmul::matmul;
use rayon::prelude::*;

use crate::architecture::{Architecture, LossTerm};
use crate::forward::TrainPassValues;
use crate::host::{column_sums, host, tensor};
use burnlens_lens::dictionary::Dictionary;

/// The inputs of a dense pass besides the parameters.
pub struct DenseInput<'a> {
    /// `[n, d_in]`
    pub x: Tensor<2>,
    /// `[n, d_out]`
    pub target: Tensor<2>,
    /// The sparsity coefficient this step.
    pub coefficient: f64,
    /// Per feature: dead before this step.
    pub dead: &'a [bool],
}

/// Whether this pass computes `arch`'s step: standard, and JumpReLU unless its
/// pre-activation loss is on and there are dead features.
pub fn handles(arch: &Architecture, n_dead: usize) -> bool {
    match arch {
        Architecture::Standard { .. } => true,
        Architecture::JumpRelu(j) => j.pre_act_loss_coefficient.is_none() || n_dead == 0,
        _ => false,
    }
}

/// The gradients of the loss at `p` (plain tensors, thresholds already clamped) and the
/// pass's values.
pub fn gradients(p: &Dictionary, arch: &Architecture, input: DenseInput) -> (Dictionary, TrainPassValues) {
    let DenseInput { x, target, coefficient, dead } = input;
    let device = x.device();
    let (d_in, m) = (p.d_in(), p.d_sae());
    let n = x.dims()[0];
    let sae_in = p.input(x.clone());
    let mut pre = vec![0.0f32; n * m];
    p.pre_into(&host(sae_in.clone()), &mut pre);
    let theta = p.threshold.clone().map(host);
    let norms = host(p.decoder_norms());
    let acts = activations(&pre, m, theta.as_deref());
    let c = (coefficient / n as f64) as f32;
    let fired = column_sums(&acts, m, |a| f32::from(a != 0.0));
    let act_sums = column_sums(&acts, m, |a| a);
    let sparsity = match theta {
        None => act_sums.iter().zip(&norms).map(|(s, nj)| (*s as f64) * (*nj as f64)).sum::<f64>() * c as f64,
        Some(_) => fired.iter().map(|&f| f as f64).sum::<f64>() * c as f64,
    };
    let fired_total: f64 = fired.iter().map(|&f| f as f64).sum();
    let acts_t = tensor(acts, [n, m], &device);

    let mut out = matmul(acts_t.clone(), p.decoder().clone()) + p.b_dec.clone().unsqueeze::<2>();
    if let Some(s) = p.skip(x.clone()) {
        out = out + s;
    }
    let diff = out - target;
    let mse = diff.clone().square().sum().into_scalar::<f32>() as f64 / n as f64;
    let g_out = diff * (2.0 / n as f64);
    let mut g = host(matmul(g_out.clone(), p.decoder().clone().transpose()));
    let g_theta = backward_elementwise(&mut g, &mut pre, m, theta.as_deref(), &norms, c, arch);
    let g_pre = tensor(g, [n, m], &device);

    let g_b_enc = g_pre.clone().sum_dim(0).reshape([m]);
    let mut g_w_dec = matmul(acts_t.clone().transpose(), g_out.clone());
    if theta.is_none() {
        // The L1's pull on each decoder row through its norm.
        let per_row: Vec<f32> = act_sums.iter().zip(&norms).map(|(s, nj)| c * s / nj).collect();
        g_w_dec = g_w_dec + p.decoder().clone() * tensor(per_row, [m, 1], &device);
    }
    let g_b_dec = g_out.clone().sum_dim(0).reshape([p.b_dec.dims()[0]]);
    let g_b_dec = if p.subtract_b_dec { g_b_dec - matmul(p.w_enc.clone(), g_b_enc.clone().reshape([m, 1])).reshape([d_in]) } else { g_b_dec };
    let grads = Dictionary {
        w_enc: matmul(sae_in.transpose(), g_pre),
        b_enc: g_b_enc,
        w_dec: vec![g_w_dec],
        b_dec: g_b_dec,
        threshold: g_theta.map(|t| tensor(t, [m], &device)),
        w_skip: p.w_skip.as_ref().map(|_| matmul(x.transpose(), g_out)),
        ..p.clone()
    };
    (grads, values(arch, mse, sparsity, fired, fired_total / n as f64, dead))
}

/// The loss terms, sorted by SAELens's names, and the counts.
fn values(arch: &Architecture, mse: f64, sparsity: f64, fired: Vec<f32>, l0: f64, dead: &[bool]) -> TrainPassValues {
    let mut losses = vec![(LossTerm::Mse, mse)];
    match arch {
        Architecture::Standard { .. } => losses.push((LossTerm::L1, sparsity)),
        Architecture::JumpRelu(j) => {
            losses.push((LossTerm::L0, sparsity));
            losses.extend(j.pre_act_loss_coefficient.map(|_| (LossTerm::PreAct, 0.0)));
        }
        _ => unreachable!("a dense pass is for standard and JumpReLU SAEs"),
    }
    losses.sort_by_key(|(t, _)| t.name());
    TrainPassValues {
        loss: losses.iter().map(|(_, v)| v).sum(),
        losses,
        l0,
        dead: dead.iter().filter(|&&d| d).count(),
        fired: fired.iter().map(|&f| f as u64).collect(),
        min_positive: None,
    }
}

/// `relu(pre)`, or `pre·[pre > θ]` with thresholds.
fn activations(pre: &[f32], m: usize, theta: Option<&[f32]>) -> Vec<f32> {
    let mut acts = vec![0.0f32; pre.len()];
    acts.par_chunks_mut(m).zip(pre.par_chunks(m)).for_each(|(a, p)| match theta {
        None => a.iter_mut().zip(p).for_each(|(a, &v)| *a = v.max(0.0)),
        Some(t) => a.iter_mut().zip(p).zip(t).for_each(|((a, &v), &t)| *a = if v > t { v } else { 0.0 }),
    });
    acts
}

/// Turn `g` (the activations' gradient) into the pre-activations' in place; with thresholds,
/// `pre` is overwritten on the way and the thresholds' gradient returned.
fn backward_elementwise(g: &mut [f32], pre: &mut [f32], m: usize, theta: Option<&[f32]>, norms: &[f32], c: f32, arch: &Architecture) -> Option<Vec<f32>> {
    match (theta, arch) {
        (None, _) => {
            g.par_chunks_mut(m).zip(pre.par_chunks(m)).for_each(|(g, p)| {
                g.iter_mut().zip(p).zip(norms).for_each(|((g, &v), &nj)| *g = if v > 0.0 { *g + c * nj } else { 0.0 });
            });
            None
        }
        (Some(t), Architecture::JumpRelu(j)) => {
            let bw = j.bandwidth as f32;
            let (inv, step) = (-1.0 / j.bandwidth as f32, c * (-1.0 / j.bandwidth as f32));
            // pre becomes each element's share of ∂θ.
            g.par_chunks_mut(m).zip(pre.par_chunks_mut(m)).for_each(|(g, p)| {
                for ((g, p), &t) in g.iter_mut().zip(p.iter_mut()).zip(t) {
                    let z = (*p - t) / bw;
                    let window = if z > -0.5 && z < 0.5 { 1.0 } else { 0.0 };
                    let share = window * t * inv * *g + window * step;
                    *g = if *p > t { *g } else { 0.0 };
                    *p = share;
                }
            });
            Some(column_sums(pre, m, |v| v))
        }
        _ => unreachable!("thresholds are JumpReLU's"),
    }
}

#[cfg(test)]
mod tests;
