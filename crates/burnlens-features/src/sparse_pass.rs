//! The TopK and BatchTopK training pass done sparsely: the encoder's product is dense, then
//! only each token's active features are decoded, and the backward of SAELens's loss (the
//! MSE, and the auxiliary loss through which dead features reconstruct the residual) is
//! written out over those entries: the decoder's gradient is a scatter of `k` rows per token,
//! the encoder's a scatter of `k` columns. The values and gradients are those of
//! [`training_pass`](crate::forward::training_pass)'s autodiff (a test holds them together);
//! the products are the encoder's alone, about a fifth of the dense pass.
//!
//! With `rescale_acts_by_decoder_norm` the choice is made on `pre · ‖W_dec[j]‖` and decoded
//! as `(pre · ‖W_dec[j]‖) / ‖W_dec[j]‖ · W_dec[j]`: the norms cancel in the value and in the
//! gradient, so the decoded coefficient is `pre` itself.

use burn::tensor::{Tensor, TensorData};
use burnlens_model::matmul::matmul;

use burnlens_dist::DistError;
use burnlens_lens::dictionary::select::{Scores, kth_largest_per_row, kth_or_lowest};
use burnlens_lens::dictionary::{Codes, Dictionary};

use crate::architecture::{Architecture, LossTerm, TopKSettings};
use crate::forward::TrainPassValues;
use crate::host::{Scratch, host, tensor};
use crate::share::{Share, batch_kth};

/// The inputs of a sparse pass besides the parameters.
pub struct SparseInput<'a> {
    /// `[n, d_in]`
    pub x: Tensor<2>,
    /// `[n, d_out]`
    pub target: Tensor<2>,
    /// Per feature: dead before this step.
    pub dead: &'a [bool],
    /// Where the pre-activations go.
    pub scratch: &'a Scratch,
    /// When these rows are one rank's part of the step's batch: the ranks (BatchTopK
    /// chooses over the whole batch).
    pub share: Option<Share<'a>>,
}

/// The gradients of the loss at `p` (plain tensors, not autodiff) and the pass's values
/// (an error only from the ranks sharing a BatchTopK choice).
pub fn gradients(p: &Dictionary, arch: &Architecture, input: SparseInput) -> Result<(Dictionary, TrainPassValues), DistError> {
    let t = arch.topk().expect("a sparse pass is for TopK and BatchTopK SAEs");
    let SparseInput { x, target, dead, scratch, share } = input;
    let device = x.device();
    let (d_in, m) = (p.d_in(), p.d_sae());
    let [n, d] = target.dims();
    let sae_in_h = host(p.input(x.clone()));
    let mut pre = scratch.take(n * m);
    p.pre_into(&sae_in_h, &mut pre);
    let norms = t.rescale_acts_by_decoder_norm.then(|| host(p.decoder_norms()));
    let score = |j: usize, v: f32| norms.as_ref().map_or(v, |s| v * s[j]);
    let w_dec = host(p.decoder().clone());
    let main = match arch {
        // The dictionary's own sparse encoding: each token's k largest scores.
        Architecture::TopK(_) => p.codes(&pre),
        _ => batch_choice(Scores { pre: &pre, m, scale: norms.as_deref() }, t.k, share.as_ref())?,
    };

    // out − target, then the MSE and its gradient.
    let mut diff = match p.skip(x.clone()) {
        Some(s) => host(s),
        None => vec![0.0; n * d],
    };
    let b_dec = host(p.b_dec.clone());
    diff.chunks_mut(d).for_each(|row| row.iter_mut().zip(&b_dec).for_each(|(o, b)| *o += b));
    main.decode_into(&w_dec, d, &mut diff);
    diff.iter_mut().zip(host(target)).for_each(|(o, y)| *o -= y);
    let mse = sum_squares(&diff) / n as f64;
    let g_out: Vec<f32> = diff.iter().map(|v| v * 2.0 / n as f32).collect();
    let aux = auxiliary(t, &pre, &w_dec, &diff, dead, &score);

    // Backward over the active entries.
    let g_main = main.coefficient_grads(&w_dec, &g_out, d);
    let mut g_w_dec = vec![0.0; m * d];
    main.scatter_rows_into(None, &g_out, d, &mut g_w_dec);
    let mut g_b_enc = vec![0.0; m];
    main.sum_by_feature_into(&g_main, &mut g_b_enc);
    let mut g_w_enc = vec![0.0; d_in * m];
    main.scatter_columns_into(&g_main, &sae_in_h, d_in, &mut g_w_enc);
    if let Some(a) = &aux {
        let g_codes = a.codes.coefficient_grads(&w_dec, &a.grad, d);
        a.codes.scatter_rows_into(None, &a.grad, d, &mut g_w_dec);
        a.codes.sum_by_feature_into(&g_codes, &mut g_b_enc);
        a.codes.scatter_columns_into(&g_codes, &sae_in_h, d_in, &mut g_w_enc);
    }
    let mut g_b_dec = vec![0.0f32; d];
    g_out.chunks(d).for_each(|row| g_b_dec.iter_mut().zip(row).for_each(|(s, g)| *s += g));
    let g_b_dec = tensor(g_b_dec, [d], &device);
    let g_b_enc = tensor(g_b_enc, [m], &device);
    let g_b_dec = if p.subtract_b_dec { g_b_dec - matmul(p.w_enc.clone(), g_b_enc.clone().reshape([m, 1])).reshape([d_in]) } else { g_b_dec };
    let g_out_t = Tensor::<2>::from_data(TensorData::new(g_out, [n, d]), &device);
    let grads = Dictionary {
        w_enc: Tensor::from_data(TensorData::new(g_w_enc, [d_in, m]), &device),
        b_enc: g_b_enc,
        w_dec: vec![Tensor::from_data(TensorData::new(g_w_dec, [m, d]), &device)],
        b_dec: g_b_dec,
        threshold: None,
        w_skip: p.w_skip.as_ref().map(|_| matmul(x.transpose(), g_out_t)),
        ..p.clone()
    };
    let aux_loss = aux.as_ref().map_or(0.0, |a| a.loss);
    let min_positive = matches!(arch, Architecture::BatchTopK { .. })
        .then(|| main.features.iter().zip(&main.values).map(|(&j, &v)| score(j as usize, v)).fold(f32::INFINITY, f32::min))
        .filter(|v| v.is_finite())
        .map(f64::from);
    let values = TrainPassValues {
        losses: vec![(LossTerm::AuxiliaryReconstruction, aux_loss), (LossTerm::Mse, mse)],
        loss: mse + aux_loss,
        l0: main.nnz() as f64 / n as f64,
        dead: dead.iter().filter(|&&d| d).count(),
        fired: main.counts(m),
        min_positive,
    };
    scratch.give(pre);
    Ok((grads, values))
}

/// BatchTopK's choice: the `k · rows` largest scores of the whole batch (every rank's part
/// of it when it is shared).
fn batch_choice(scores: Scores, k: f64, share: Option<&Share>) -> Result<Codes, DistError> {
    let n = scores.pre.len() / scores.m;
    let rows = share.map_or(n, |s| s.rows);
    let kk = ((k * rows as f64) as usize).clamp(1, rows * scores.m);
    let mut c = scores.batch_candidates(kk);
    let values = std::mem::take(&mut c.values);
    let kth = match share {
        Some(s) => batch_kth(s.ranks, values, kk, s.step)?,
        None => kth_or_lowest(values, kk),
    };
    Ok(scores.batch_at_least(&c, kth))
}

/// The auxiliary loss's codes (each token's `k_aux` largest scores among dead features), the
/// loss, and the gradient of what they decode.
struct Auxiliary {
    codes: Codes,
    loss: f64,
    /// `[n, d]`
    grad: Vec<f32>,
}

/// SAELens's TopK auxiliary loss: with `dead` features, the `k_aux = min(d/2, dead)` largest
/// of them per token reconstruct the residual `target − out` (held fixed) through the
/// decoder without bias, scaled by `min(dead / (d/2), 1)`; `None` without dead features.
fn auxiliary(t: &TopKSettings, pre: &[f32], w_dec: &[f32], diff: &[f32], dead: &[bool], score: &(impl Fn(usize, f32) -> f32 + Sync)) -> Option<Auxiliary> {
    let n_dead = dead.iter().filter(|&&d| d).count();
    if n_dead == 0 {
        return None;
    }
    let (m, d) = (dead.len(), w_dec.len() / dead.len());
    let n = pre.len() / m;
    let half = (d / 2).max(1);
    let scale = (n_dead as f64 / half as f64).min(1.0);
    let kth = kth_largest_per_row(n, m, half.min(n_dead), |r, j| dead[j].then(|| score(j, pre[r * m + j])));
    let codes = Codes::select(pre, m, |r, j, v| dead[j] && score(j, v) >= kth[r]);
    // recons − residual = recons + (out − target)
    let mut e = diff.to_vec();
    codes.decode_into(w_dec, d, &mut e);
    let c = t.aux_loss_coefficient * scale;
    let loss = c * sum_squares(&e) / n as f64;
    let g = (2.0 * c / n as f64) as f32;
    Some(Auxiliary { codes, loss, grad: e.iter().map(|v| v * g).collect() })
}

fn sum_squares(v: &[f32]) -> f64 {
    v.iter().map(|&x| (x as f64) * (x as f64)).sum()
}

#[cfg(test)]
mod tests;
