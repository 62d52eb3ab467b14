//! A training step shared by the ranks of an MPI job (`mpiexec -n N burnlens train-sae`):
//! every rank holds the same global batch (the store's buffer is the one process's on every
//! rank) and takes its rows of it ([`Ranks::rows`]); each rank's gradients and loss values,
//! weighted by its share of the rows, are summed over the ranks, so that every rank steps
//! with the one-process gradient of the whole batch. Feature counts are summed (the
//! dead-feature counters agree), BatchTopK's smallest kept activation is the minimum over
//! ranks, and BatchTopK's selection itself is the whole batch's: its threshold comes from
//! every rank's candidates ([`batch_kth`]). The sums run in the background
//! ([`start_all_reduce`]) while the rank goes on (the run makes its next batch meanwhile).

use burn::tensor::Tensor;
use burnlens_dist::{DistError, Pending, Ranks};
use burnlens_lens::dictionary::Dictionary;
use burnlens_lens::dictionary::select::{kth_largest_rows, kth_or_lowest};

use crate::forward::TrainPassValues;
use crate::host::{host, tensor};
use crate::params::Trainable;

/// One rank's part of a step's batch.
#[derive(Clone, Copy)]
pub struct Share<'a> {
    pub ranks: &'a Ranks,
    /// Rows of the whole batch.
    pub rows: usize,
    /// The step (for the collectives' messages).
    pub step: usize,
}

/// The `kk`-th largest of every rank's BatchTopK `candidates` together (see
/// [`Scores::batch_candidates`](burnlens_lens::dictionary::select::Scores::batch_candidates)).
pub(crate) fn batch_kth(ranks: &Ranks, candidates: Vec<f32>, kk: usize, step: usize) -> Result<f32, DistError> {
    if ranks.size() == 1 {
        return Ok(kth_or_lowest(candidates, kk));
    }
    let all = ranks.all_gather_f32(&candidates, &format!("BatchTopK's candidates of step {}", step + 1))?;
    Ok(kth_or_lowest(all.concat(), kk))
}

/// [`batch_kth`] from this rank's activations `acts` (`[rows, d_sae]`, ReLU'd) where they lie.
/// The batch's `kk`-th largest is at least each rank's own `kk`-th largest (a rank holding
/// `kk` values): every rank finds its own on its device, the largest of them is agreed on, and
/// only the positive values reaching it come back to be gathered (zeros never decide the
/// choice: with fewer than `kk` positives all of them are kept).
pub(crate) fn batch_kth_of(share: &Share, acts: Tensor<2>, kk: usize) -> Result<f32, DistError> {
    let acts = if acts.is_autodiff() { acts.inner() } else { acts };
    let [n, m] = acts.dims();
    let own = if n * m >= kk { kth_largest_rows(&acts.clone().reshape([1, n * m]), kk).into_scalar::<f32>() } else { f32::NEG_INFINITY };
    let what = format!("BatchTopK's bound of step {}", share.step + 1);
    let bound = share.ranks.all_gather_f32(&[own], &what)?.into_iter().flatten().fold(f32::NEG_INFINITY, f32::max);
    batch_kth(share.ranks, positives_reaching(acts, bound), kk, share.step)
}

/// The positive values of `acts` (non-negative) at or above `bound`: on a GPU listed there
/// row by row ([`burnlens_model::gpu::row_nonzeros`]), elsewhere by their positions.
fn positives_reaching(acts: Tensor<2>, bound: f32) -> Vec<f32> {
    let [n, m] = acts.dims();
    let kept = acts.clone().mask_fill(acts.lower_elem(bound), 0.0);
    if let Some(rows) = burnlens_model::gpu::row_nonzeros(&kept) {
        return rows.concat();
    }
    let flat = kept.reshape([n * m]);
    let at = flat.clone().greater_elem(0.0).argwhere();
    let c = at.dims()[0];
    host(flat.select(0, at.reshape([c])))
}

/// A step's all-reduce under way ([`start_all_reduce`]).
pub(crate) struct InFlight {
    /// This rank's gradients, whose shapes the sums take.
    local: Dictionary,
    values: TrainPassValues,
    pending: Option<Pending<(Vec<f32>, Vec<Vec<f64>>, f64)>>,
}

/// Start summing the whole batch's gradients and values from this rank's (`rows` of
/// `total`) in the background: each weighted by `rows / total` and summed over the ranks.
/// Alone, nothing to do.
pub(crate) fn start_all_reduce(ranks: &Ranks, local: (Dictionary, TrainPassValues), share: (usize, usize), step: usize) -> InFlight {
    let (g, v) = local;
    if ranks.size() == 1 {
        return InFlight { local: g, values: v, pending: None };
    }
    let weight = share.0 as f64 / share.1 as f64;
    let named = g.named();
    let mut flat: Vec<f32> = Vec::with_capacity(named.iter().map(|(_, t)| t.dims().iter().product::<usize>()).sum());
    for (_, t) in &named {
        flat.extend(host(t.clone()).into_iter().map(|x| (x as f64 * weight) as f32));
    }
    // The loss terms, the loss and L0 weighted, BatchTopK's smallest activation, the
    // feature counts: every rank's, added up in rank order on each.
    let mut mine: Vec<f64> = v.losses.iter().map(|(_, x)| x * weight).chain([v.loss * weight, v.l0 * weight]).collect();
    mine.push(v.min_positive.unwrap_or(f64::INFINITY));
    mine.extend(v.fired.iter().map(|&c| c as f64));
    let pending = ranks.in_background(move |ranks| {
        let start = std::time::Instant::now();
        ranks.sum_f32(&mut flat, &format!("the gradient all-reduce of step {}", step + 1))?;
        let all = ranks.all_gather_f64(&mine, &format!("the loss and feature counts of step {}", step + 1))?;
        Ok((flat, all, start.elapsed().as_secs_f64()))
    });
    InFlight { local: g, values: v, pending: Some(pending) }
}

impl InFlight {
    /// Wait for the sums: the whole batch's gradients and values, and the seconds the
    /// all-reduce ran (in the background; `None` alone).
    pub(crate) fn finish(self) -> Result<(Dictionary, TrainPassValues, Option<f64>), DistError> {
        let InFlight { local, mut values, pending } = self;
        let Some(pending) = pending else { return Ok((local, values, None)) };
        let (flat, all, seconds) = pending.wait()?;
        let mut at = 0;
        let device = local.w_enc.device();
        let g = local.map(|_, t| {
            let dims = t.dims();
            let len = dims[0] * dims[1];
            at += len;
            tensor(flat[at - len..at].to_vec(), dims, &device)
        });
        sum_values(&mut values, &all);
        Ok((g, values, Some(seconds)))
    }
}

/// `v` from every rank's values (as [`start_all_reduce`] sent them, in rank order): the
/// loss terms, loss, L0 and feature counts summed, the smallest activation the least.
fn sum_values(v: &mut TrainPassValues, all: &[Vec<f64>]) {
    let terms = v.losses.len();
    let at_min = terms + 2;
    let mut sums = vec![0.0f64; at_min + 1 + v.fired.len()];
    let mut least = f64::INFINITY;
    for part in all {
        for (i, &x) in part.iter().enumerate() {
            if i == at_min { least = least.min(x) } else { sums[i] += x }
        }
    }
    v.losses.iter_mut().zip(&sums).for_each(|((_, x), s)| *x = *s);
    (v.loss, v.l0) = (sums[terms], sums[terms + 1]);
    v.min_positive = least.is_finite().then_some(least);
    v.fired.iter_mut().zip(&sums[at_min + 1..]).for_each(|(c, s)| *c = *s as u64);
}
