//! SAELens's evaluation (`evals.run_evals` with every metric on), over batches of token
//! windows: the model's next-token loss and its distribution clean, with the SAE's
//! reconstruction spliced in at its hook and with the hook zero-ablated (`ce_loss_score`,
//! `kl_div_score`); on the SAE's own input, L2 norms and shrinkage, L0 and L1, explained
//! variance (streamed, and SAELens's per-batch "legacy" form), MSE, cosine similarity; per
//! feature, density, the consistent-activation heuristic and weight-based metrics. Tokens in
//! `ignore_tokens` (special tokens) are left out of every average as SAELens leaves them out,
//! and keep their original activation when the SAE is spliced in. Names and nesting are
//! SAELens's, so the JSON reads the same.

use burn::tensor::activation::log_softmax;
use burn::tensor::{Bool, Int, Tensor, TensorData};
use burnlens_lens::hook_pass::{hook_activations, window_ids};
use burnlens_lens::sae::{Sae, SaeError};
use burnlens_model::read_back::read_together;
use burnlens_model::{Activation, Hooks, Transformer};

use crate::eval_reads::feature_reads;
use crate::host::host;
use crate::tensor_pass::PassPath;
use serde::Serialize;

/// `run_evals`'s first dictionary.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct EvalMetrics {
    pub model_behavior_preservation: BehaviorPreservation,
    pub model_performance_preservation: PerformancePreservation,
    pub reconstruction_quality: ReconstructionQuality,
    pub shrinkage: Shrinkage,
    pub sparsity: Sparsity,
    pub token_stats: TokenStats,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct BehaviorPreservation {
    pub kl_div_score: f64,
    pub kl_div_with_ablation: f64,
    pub kl_div_with_sae: f64,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PerformancePreservation {
    pub ce_loss_score: f64,
    pub ce_loss_with_ablation: f64,
    pub ce_loss_with_sae: f64,
    pub ce_loss_without_sae: f64,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ReconstructionQuality {
    pub explained_variance: f64,
    pub explained_variance_legacy: f64,
    pub mse: f64,
    pub cossim: f64,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Shrinkage {
    pub l2_norm_in: f64,
    pub l2_norm_out: f64,
    pub l2_ratio: f64,
    pub relative_reconstruction_bias: f64,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Sparsity {
    pub l0: f64,
    pub l1: f64,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TokenStats {
    pub total_tokens_eval_reconstruction: usize,
    pub total_tokens_eval_sparsity_variance: usize,
}

/// `run_evals`'s second dictionary: one value per feature.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FeatureMetrics {
    pub feature_density: Vec<f64>,
    pub consistent_activation_heuristic: Vec<f64>,
    pub encoder_norm: Vec<f64>,
    pub encoder_decoder_cosine_sim: Vec<f64>,
    pub encoder_bias: Vec<f64>,
}

/// What to evaluate on.
pub struct EvalInput<'a> {
    pub model: &'a Transformer,
    pub sae: &'a Sae,
    /// Batches of windows, every window of one length.
    pub batches: &'a [Vec<Vec<u32>>],
    /// Token ids left out of the metrics (SAELens: the tokenizer's special tokens).
    pub ignore_tokens: &'a [u32],
}

/// Per-token values gathered over batches, averaged at the end.
#[derive(Default)]
struct Lists {
    kl_sae: Vec<f64>,
    kl_zero: Vec<f64>,
    ce_clean: Vec<f64>,
    ce_sae: Vec<f64>,
    ce_zero: Vec<f64>,
    l2_in: Vec<f64>,
    l2_out: Vec<f64>,
    l2_ratio: Vec<f64>,
    bias: Vec<f64>,
    l0: Vec<f64>,
    l1: Vec<f64>,
    ev_legacy: Vec<f64>,
    mse: Vec<f64>,
    cossim: Vec<f64>,
}

impl Lists {
    fn all(&self) -> [&Vec<f64>; 14] {
        let l = self;
        [&l.kl_sae, &l.kl_zero, &l.ce_clean, &l.ce_sae, &l.ce_zero, &l.l2_in, &l.l2_out, &l.l2_ratio, &l.bias, &l.l0, &l.l1, &l.ev_legacy, &l.mse, &l.cossim]
    }

    fn all_mut(&mut self) -> [&mut Vec<f64>; 14] {
        let l = self;
        [
            &mut l.kl_sae,
            &mut l.kl_zero,
            &mut l.ce_clean,
            &mut l.ce_sae,
            &mut l.ce_zero,
            &mut l.l2_in,
            &mut l.l2_out,
            &mut l.l2_ratio,
            &mut l.bias,
            &mut l.l0,
            &mut l.l1,
            &mut l.ev_legacy,
            &mut l.mse,
            &mut l.cossim,
        ]
    }
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

/// Evaluate `input.sae` as SAELens's `run_evals` does, every metric on.
pub fn evaluate(input: &EvalInput) -> Result<(EvalMetrics, FeatureMetrics), SaeError> {
    input.sae.check_model(input.model)?;
    let part = evaluate_part(input, input.batches)?;
    Ok(part.finish(input))
}

/// What the metrics are made of, gathered batch by batch: the per-token lists, the streamed
/// explained variance, and per feature the tokens and prompts it fired on. The parts of
/// consecutive runs of batches joined in order are the part of all of them.
#[derive(Default)]
pub(crate) struct EvalPart {
    lists: Lists,
    ev: ExplainedVariance,
    fired_tokens: Vec<f64>,
    fired_prompts: Vec<f64>,
    tokens: usize,
}

/// The part of `batches` (some of `input.batches`).
pub(crate) fn evaluate_part(input: &EvalInput, batches: &[Vec<Vec<u32>>]) -> Result<EvalPart, SaeError> {
    let EvalInput { model, sae, ignore_tokens, .. } = *input;
    let d_sae = sae.cfg.d_sae;
    let mut part = EvalPart::empty(sae.cfg.d_in, d_sae);
    let l = &mut part.lists;
    for batch in batches {
        let (b, t) = (batch.len(), batch[0].len());
        let keep: Vec<bool> = batch.iter().flatten().map(|id| !ignore_tokens.contains(id)).collect();
        reconstruction_pass(model, sae, batch, &keep, l)?;
        let x = sae_input(model, sae, batch)?;
        let (f, r) = sae.forward(x.clone());
        let path = PassPath::for_device(&f.device());
        let reads = feature_reads(f, &keep, b, path);
        let [x, r] = read_together(vec![x.reshape([-1]), r.reshape([-1])]).try_into().expect("two reads");
        let rows: Vec<usize> = (0..b * t).filter(|&i| keep[i]).collect();
        variance_metrics(&x, &r, &rows, sae.cfg.d_in, l, &mut part.ev);
        l.l0.extend(&reads.l0);
        l.l1.extend(&reads.l1);
        part.fired_tokens.iter_mut().zip(&reads.fired_tokens).for_each(|(a, b)| *a += b);
        part.fired_prompts.iter_mut().zip(&reads.fired_prompts).for_each(|(a, b)| *a += b);
        part.tokens += rows.len();
    }
    Ok(part)
}

impl EvalPart {
    /// The part of no batch.
    pub(crate) fn empty(d_in: usize, d_sae: usize) -> Self {
        EvalPart { ev: ExplainedVariance::new(d_in), fired_tokens: vec![0.0; d_sae], fired_prompts: vec![0.0; d_sae], ..Default::default() }
    }

    /// The metrics of all of `input.batches`, this being their part.
    pub(crate) fn finish(self, input: &EvalInput) -> (EvalMetrics, FeatureMetrics) {
        let EvalPart { lists: l, ev, fired_tokens, fired_prompts, tokens } = self;
        let (kl_sae, kl_zero) = (mean(&l.kl_sae), mean(&l.kl_zero));
        let (ce_clean, ce_sae, ce_zero) = (mean(&l.ce_clean), mean(&l.ce_sae), mean(&l.ce_zero));
        let per_batch = input.batches.iter().map(|b| b.len() * b[0].len()).sum::<usize>();
        let metrics = EvalMetrics {
            model_behavior_preservation: BehaviorPreservation {
                kl_div_score: (kl_zero - kl_sae) / kl_zero,
                kl_div_with_ablation: kl_zero,
                kl_div_with_sae: kl_sae,
            },
            model_performance_preservation: PerformancePreservation {
                ce_loss_score: (ce_zero - ce_sae) / (ce_zero - ce_clean),
                ce_loss_with_ablation: ce_zero,
                ce_loss_with_sae: ce_sae,
                ce_loss_without_sae: ce_clean,
            },
            reconstruction_quality: ReconstructionQuality {
                explained_variance: ev.value(),
                explained_variance_legacy: mean(&l.ev_legacy),
                mse: mean(&l.mse),
                cossim: mean(&l.cossim),
            },
            shrinkage: Shrinkage {
                l2_norm_in: mean(&l.l2_in),
                l2_norm_out: mean(&l.l2_out),
                l2_ratio: mean(&l.l2_ratio),
                relative_reconstruction_bias: mean(&l.bias),
            },
            sparsity: Sparsity { l0: mean(&l.l0), l1: mean(&l.l1) },
            token_stats: TokenStats { total_tokens_eval_reconstruction: per_batch, total_tokens_eval_sparsity_variance: per_batch },
        };
        let mut features = weight_metrics(input.sae);
        features.feature_density = fired_tokens.iter().map(|c| c / tokens as f64).collect();
        features.consistent_activation_heuristic = fired_tokens.iter().zip(&fired_prompts).map(|(a, p)| a / p).collect();
        (metrics, features)
    }

    /// As numbers: each list's length then its values, the explained variance's sums, the
    /// feature counts, the tokens ([`EvalPart::join`] reads them back).
    pub(crate) fn to_numbers(&self) -> Vec<f64> {
        let mut v = Vec::new();
        for list in self.lists.all() {
            v.push(list.len() as f64);
            v.extend_from_slice(list);
        }
        v.extend([self.ev.sum_sq, self.ev.sum_resid, self.ev.n as f64]);
        v.extend(&self.ev.sum_x);
        v.extend(&self.fired_tokens);
        v.extend(&self.fired_prompts);
        v.push(self.tokens as f64);
        v
    }

    /// `self` followed by the part `numbers` holds (as [`EvalPart::to_numbers`] wrote it).
    pub(crate) fn join(mut self, numbers: &[f64]) -> Self {
        let mut at = 0;
        let mut take = |n: usize| {
            at += n;
            &numbers[at - n..at]
        };
        for list in self.lists.all_mut() {
            let n = take(1)[0] as usize;
            list.extend_from_slice(take(n));
        }
        let [sum_sq, sum_resid, n] = take(3).try_into().expect("three numbers");
        self.ev.sum_sq += sum_sq;
        self.ev.sum_resid += sum_resid;
        self.ev.n += n as usize;
        let (d_in, d_sae) = (self.ev.sum_x.len(), self.fired_tokens.len());
        self.ev.sum_x.iter_mut().zip(take(d_in)).for_each(|(s, x)| *s += x);
        self.fired_tokens.iter_mut().zip(take(d_sae)).for_each(|(s, x)| *s += x);
        self.fired_prompts.iter_mut().zip(take(d_sae)).for_each(|(s, x)| *s += x);
        self.tokens += take(1)[0] as usize;
        self
    }
}

/// The activation at the SAE's hook for `batch`, flattened to `[tokens, d_in]` (the model
/// pass the activation store makes).
fn sae_input(model: &Transformer, sae: &Sae, batch: &[Vec<u32>]) -> Result<Tensor<2>, SaeError> {
    let x = hook_activations(model, &[sae.hook_point()], batch)?.remove(0);
    let width = x.dims()[1];
    if width != sae.cfg.d_in {
        return Err(SaeError::Hook {
            hook: sae.cfg.hook_name.clone(),
            msg: format!("the model's activation has width {width}, the SAE's d_in is {}", sae.cfg.d_in),
        });
    }
    Ok(x)
}

/// Clean, SAE-spliced and zero-ablated passes: per-token KL and next-token loss.
fn reconstruction_pass(model: &Transformer, sae: &Sae, batch: &[Vec<u32>], keep: &[bool], l: &mut Lists) -> Result<(), SaeError> {
    let (b, t) = (batch.len(), batch[0].len());
    let device = model.device();
    let ids = window_ids(model, batch)?;
    let clean = model.forward(ids.clone());
    let hook = sae.hook_point();
    let keep_rows = Tensor::<2, Bool>::from_data(TensorData::new(keep.to_vec(), [b * t, 1]), &device);
    let mut spliced = Hooks::none().with_edit(
        |p| p == hook,
        |_, act| {
            let x = sae.flatten(&act).expect("checked before the run");
            let (_, r) = sae.forward(x.clone());
            let out = x.mask_where(keep_rows.clone().expand(r.dims()), r);
            reshape_like(out, act)
        },
    );
    let with_sae = model.forward_hooked(ids.clone(), &mut spliced);
    drop(spliced);
    let mut zero = Hooks::none().with_edit(
        |p| p == hook,
        |_, act| match act {
            Activation::Rank3(a) => Activation::Rank3(a.zeros_like()),
            Activation::Rank4(a) => Activation::Rank4(a.zeros_like()),
        },
    );
    let zeroed = model.forward_hooked(ids.clone(), &mut zero);
    // Each pass's log-probabilities once, shared by its KL and its next-token loss.
    let (log_clean, log_sae, log_zero) = (log_softmax(clean, 2), log_softmax(with_sae, 2), log_softmax(zeroed, 2));
    let kl = |logp: &Tensor<3>| (log_clean.clone().exp() * (log_clean.clone() - logp.clone())).sum_dim(2).reshape([-1]);
    let ce = |logp: Tensor<3>| next_token_losses(logp, ids.clone()).reshape([-1]);
    let keep_kl: Vec<usize> = (0..b * t).filter(|&i| keep[i]).collect();
    let keep_ce: Vec<usize> = (0..b).flat_map(|p| (0..t - 1).map(move |q| (p, q))).filter(|&(p, q)| keep[p * t + q]).map(|(p, q)| p * (t - 1) + q).collect();
    let pick = |v: Vec<f32>, at: &[usize]| at.iter().map(|&i| v[i] as f64).collect::<Vec<f64>>();
    // The five come back in one read.
    let parts = vec![kl(&log_sae), kl(&log_zero), ce(log_clean.clone()), ce(log_sae), ce(log_zero)];
    let [kl_sae, kl_zero, ce_clean, ce_sae, ce_zero] = read_together(parts).try_into().expect("five reads");
    l.kl_sae.extend(pick(kl_sae, &keep_kl));
    l.kl_zero.extend(pick(kl_zero, &keep_kl));
    l.ce_clean.extend(pick(ce_clean, &keep_ce));
    l.ce_sae.extend(pick(ce_sae, &keep_ce));
    l.ce_zero.extend(pick(ce_zero, &keep_ce));
    Ok(())
}

fn reshape_like(x: Tensor<2>, like: Activation) -> Activation {
    match like {
        Activation::Rank3(t) => Activation::Rank3(x.reshape(t.dims())),
        Activation::Rank4(t) => Activation::Rank4(x.reshape(t.dims())),
    }
}

/// `[b, t − 1]`: the loss of predicting each next token (TransformerLens's `loss_per_token`),
/// from log-probabilities `[b, t, vocab]`.
fn next_token_losses(logp: Tensor<3>, ids: Tensor<2, Int>) -> Tensor<2> {
    let [b, t, _] = logp.dims();
    let logp = logp.narrow(1, 0, t - 1);
    let next = ids.narrow(1, 1, t - 1).reshape([b, t - 1, 1]);
    logp.gather(2, next).reshape([b, t - 1]).neg()
}

/// The shrinkage, sparsity and variance metrics of one batch's kept `rows`.
#[allow(clippy::too_many_arguments)]
fn variance_metrics(x: &[f32], r: &[f32], rows: &[usize], d: usize, l: &mut Lists, ev: &mut ExplainedVariance) {
    let row = |v: &[f32], i: usize, w: usize| v[i * w..(i + 1) * w].iter().map(|&a| a as f64).collect::<Vec<f64>>();
    let norm = |v: &[f64]| v.iter().map(|a| a * a).sum::<f64>().sqrt();
    let mut batch_mean = vec![0f64; d];
    for &i in rows {
        row(x, i, d).iter().zip(batch_mean.iter_mut()).for_each(|(a, m)| *m += a / rows.len() as f64);
    }
    let (mut out_sq, mut dot) = (0.0, 0.0);
    for &i in rows {
        let (xi, ri) = (row(x, i, d), row(r, i, d));
        let (nx, nr) = (norm(&xi), norm(&ri));
        let resid: f64 = xi.iter().zip(&ri).map(|(a, b)| (a - b) * (a - b)).sum();
        let centred: f64 = xi.iter().zip(&batch_mean).map(|(a, m)| (a - m) * (a - m)).sum();
        l.l2_in.push(nx);
        l.l2_out.push(nr);
        l.l2_ratio.push(nr / if nx.abs() < 1e-4 { 1.0 } else { nx });
        out_sq += nr * nr;
        dot += xi.iter().zip(&ri).map(|(a, b)| a * b).sum::<f64>();
        l.ev_legacy.push(1.0 - resid / centred);
        l.mse.push(resid);
        l.cossim.push(xi.iter().zip(&ri).map(|(a, b)| a * b).sum::<f64>() / (nx * nr));
        ev.add(&xi, resid);
    }
    l.bias.push((out_sq / rows.len() as f64) / (dot / rows.len() as f64));
}

/// SAELens's streamed explained variance: `1 − E‖x − x̂‖² / (E‖x‖² − ‖E x‖²)`.
#[derive(Default)]
struct ExplainedVariance {
    sum_x: Vec<f64>,
    sum_sq: f64,
    sum_resid: f64,
    n: usize,
}

impl ExplainedVariance {
    fn new(d: usize) -> Self {
        ExplainedVariance { sum_x: vec![0.0; d], sum_sq: 0.0, sum_resid: 0.0, n: 0 }
    }

    fn add(&mut self, x: &[f64], resid: f64) {
        x.iter().zip(self.sum_x.iter_mut()).for_each(|(a, s)| *s += a);
        self.sum_sq += x.iter().map(|a| a * a).sum::<f64>();
        self.sum_resid += resid;
        self.n += 1;
    }

    fn value(&self) -> f64 {
        if self.n == 0 {
            return 0.0;
        }
        let n = self.n as f64;
        let total = self.sum_sq / n - self.sum_x.iter().map(|s| (s / n) * (s / n)).sum::<f64>();
        let mse = self.sum_resid / n;
        if total < 1e-10 {
            return if mse < 1e-10 { 1.0 } else { 0.0 };
        }
        1.0 - mse / total
    }
}

/// Encoder norms, encoder/decoder cosine similarity and encoder biases, per feature.
fn weight_metrics(sae: &Sae) -> FeatureMetrics {
    let (d, m) = (sae.cfg.d_in, sae.cfg.d_sae);
    let enc = host(sae.dict.w_enc.clone());
    let dec = host(sae.dict.decoder().clone());
    let col = |j: usize| (0..d).map(|i| enc[i * m + j] as f64).collect::<Vec<f64>>();
    let norm = |v: &[f64]| v.iter().map(|a| a * a).sum::<f64>().sqrt();
    let (mut encoder_norm, mut cos) = (Vec::with_capacity(m), Vec::with_capacity(m));
    for j in 0..m {
        let e = col(j);
        let r: Vec<f64> = dec[j * d..(j + 1) * d].iter().map(|&a| a as f64).collect();
        let (ne, nr) = (norm(&e), norm(&r));
        encoder_norm.push(ne);
        let (eu, ru): (Vec<f64>, Vec<f64>) = (e.iter().map(|a| a / ne).collect(), r.iter().map(|a| a / nr).collect());
        let dot: f64 = eu.iter().zip(&ru).map(|(a, b)| a * b).sum();
        cos.push(dot / (norm(&eu) * norm(&ru)).max(1e-8));
    }
    FeatureMetrics {
        feature_density: Vec::new(),
        consistent_activation_heuristic: Vec::new(),
        encoder_norm,
        encoder_decoder_cosine_sim: cos,
        encoder_bias: host(sae.dict.b_enc.clone()).into_iter().map(|a| a as f64).collect(),
    }
}
