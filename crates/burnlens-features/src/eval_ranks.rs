//! SAELens's evaluation over the ranks of an MPI job (`mpiexec -n N burnlens eval-sae`):
//! rank r evaluates its contiguous share of the batches ([`Ranks::rows`]), every rank's part
//! is gathered, and the parts joined in rank order are the one process's (the per-token
//! lists in the same order, the sums and feature counts added), so the metrics are the one
//! process's up to the order of the explained variance's sums.

use burnlens_dist::{DistError, Ranks};
use burnlens_lens::sae::SaeError;

use crate::evals::{EvalInput, EvalMetrics, EvalPart, FeatureMetrics, evaluate, evaluate_part};

/// What can stop an evaluation over ranks.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error(transparent)]
    Sae(#[from] SaeError),
    #[error(transparent)]
    Ranks(#[from] DistError),
}

/// [`evaluate`] with the batches shared by `ranks`; every rank returns the metrics.
pub fn evaluate_over(ranks: &Ranks, input: &EvalInput) -> Result<(EvalMetrics, FeatureMetrics), EvalError> {
    if ranks.size() == 1 {
        return Ok(evaluate(input)?);
    }
    let checked = input.sae.check_model(input.model);
    let part = checked.and_then(|()| evaluate_part(input, &input.batches[ranks.rows(input.batches.len())]));
    let shared = ranks.agree(part.as_ref().map(|_| ()).map_err(|e| e.to_string()));
    let part = part?;
    shared?;
    let all = ranks.all_gather_f64(&part.to_numbers(), "the evaluation's parts")?;
    let mut joined = EvalPart::empty(input.sae.cfg.d_in, input.sae.cfg.d_sae);
    for numbers in &all {
        joined = joined.join(numbers);
    }
    Ok(joined.finish(input))
}
