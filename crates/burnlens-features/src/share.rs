//! A training step shared by the ranks of an MPI job (`mpiexec -n N burnlens train-sae`):
//! every rank holds the same global batch (the store's buffer is the one process's on every
//! rank) and takes its rows of it ([`Ranks::rows`]); each rank's gradients and loss values,
//! weighted by its share of the rows, are summed over the ranks, so that every rank steps
//! with the one-process gradient of the whole batch. Feature counts are summed (the
//! dead-feature counters agree), BatchTopK's smallest kept activation is the minimum over
//! ranks, and BatchTopK's selection itself is the whole batch's: its threshold comes from
//! every rank's candidates ([`batch_kth`]).

use burnlens_dist::{DistError, Ranks};
use burnlens_lens::dictionary::Dictionary;
use burnlens_lens::dictionary::select::kth_or_lowest;

use crate::forward::TrainPassValues;
use crate::host::{host, tensor};
use crate::params::Trainable;

/// One rank's part of a step's batch.
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
    let bytes: Vec<u8> = candidates.iter().flat_map(|v| v.to_le_bytes()).collect();
    let all = ranks.all_gather_bytes(&bytes, &format!("BatchTopK's candidates of step {}", step + 1))?;
    let values = all.iter().flat_map(|b| b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))).collect();
    Ok(kth_or_lowest(values, kk))
}

/// The whole batch's gradients and values from this rank's (`rows` of `total`): each
/// weighted by `rows / total` and summed over the ranks.
pub(crate) fn all_reduce(
    ranks: &Ranks,
    local: (Dictionary, TrainPassValues),
    share: (usize, usize),
    step: usize,
) -> Result<(Dictionary, TrainPassValues), DistError> {
    let (g, mut v) = local;
    if ranks.size() == 1 {
        return Ok((g, v));
    }
    let weight = share.0 as f64 / share.1 as f64;
    let named = g.named();
    let mut flat: Vec<f32> = Vec::with_capacity(named.iter().map(|(_, t)| t.dims().iter().product::<usize>()).sum());
    for (_, t) in &named {
        flat.extend(host(t.clone()).into_iter().map(|x| (x as f64 * weight) as f32));
    }
    ranks.sum_f32(&mut flat, &format!("the gradient all-reduce of step {}", step + 1))?;
    let mut at = 0;
    let device = named[0].1.device();
    let g = g.map(|_, t| {
        let dims = t.dims();
        let len = dims[0] * dims[1];
        at += len;
        tensor(flat[at - len..at].to_vec(), dims, &device)
    });
    // The loss terms, the loss and L0 weighted and summed, BatchTopK's smallest activation
    // the least, the feature counts summed: every rank's, added up in rank order on each.
    let mut mine: Vec<f64> = v.losses.iter().map(|(_, x)| x * weight).chain([v.loss * weight, v.l0 * weight]).collect();
    mine.push(v.min_positive.unwrap_or(f64::INFINITY));
    mine.extend(v.fired.iter().map(|&c| c as f64));
    let bytes: Vec<u8> = mine.iter().flat_map(|x| x.to_le_bytes()).collect();
    let all = ranks.all_gather_bytes(&bytes, &format!("the loss and feature counts of step {}", step + 1))?;
    let mut sums = vec![0.0f64; mine.len()];
    let mut least = f64::INFINITY;
    let at_min = mine.len() - v.fired.len() - 1;
    for part in &all {
        for (i, c) in part.chunks_exact(8).enumerate() {
            let x = f64::from_le_bytes(c.try_into().expect("8 bytes"));
            if i == at_min { least = least.min(x) } else { sums[i] += x }
        }
    }
    let terms = v.losses.len();
    v.losses.iter_mut().zip(&sums).for_each(|((_, x), s)| *x = *s);
    (v.loss, v.l0) = (sums[terms], sums[terms + 1]);
    v.min_positive = least.is_finite().then_some(least);
    v.fired.iter_mut().zip(&sums[at_min + 1..]).for_each(|(c, s)| *c = *s as u64);
    Ok((g, v))
}
