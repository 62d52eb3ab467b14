//! A feature's direct effect on the logits, as SAEDashboard computes it: its decoder row
//! carried into the residual stream (`to_resid_direction`: as it is for residual, attention-
//! and MLP-output hooks; through `W_out` for MLP neurons; through `W_O` for `hook_z`), times
//! the model's `W_U` (with TransformerLens's processing when the model was loaded with it:
//! final-norm weights folded in, centred). The whole vocabulary's values make a histogram;
//! the largest and smallest make the tables.

use burn::tensor::Tensor;
use burnlens_model::matmul::matmul;
use burnlens_model::{AttnHook, HookPoint, MlpHook, NormHook, Transformer};
use serde::{Deserialize, Serialize};

use crate::histogram::Histogram;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LogitEffects {
    /// (token, logit), largest first.
    pub top: Vec<(u32, f32)>,
    /// (token, logit), smallest first.
    pub bottom: Vec<(u32, f32)>,
    pub histogram: Histogram,
}

impl LogitEffects {
    /// The effects of one feature's logit vector: one pass for the extremes and both tables
    /// (equal values keep the lower token id first), one for the histogram.
    pub fn of(logits: &[f32], rows: usize, n_bins: usize) -> Self {
        let rows = rows.min(logits.len());
        let mut top: Vec<(u32, f32)> = Vec::with_capacity(rows + 1);
        let mut bottom: Vec<(u32, f32)> = Vec::with_capacity(rows + 1);
        let (mut lo, mut hi) = (f32::INFINITY, f32::NEG_INFINITY);
        for (i, &x) in logits.iter().enumerate() {
            (lo, hi) = (lo.min(x), hi.max(x));
            if top.len() < rows || x > top[rows - 1].1 {
                let at = top.iter().position(|t| t.1 < x).unwrap_or(top.len());
                top.insert(at, (i as u32, x));
                top.truncate(rows);
            }
            if bottom.len() < rows || x < bottom[rows - 1].1 {
                let at = bottom.iter().position(|t| t.1 > x).unwrap_or(bottom.len());
                bottom.insert(at, (i as u32, x));
                bottom.truncate(rows);
            }
        }
        let histogram = if logits.is_empty() { Histogram::default() } else { Histogram::of_range(logits, lo, hi, n_bins) };
        LogitEffects { top, bottom, histogram }
    }
}

/// The residual-stream directions `[features, d_model]` of decoder rows `w_dec [features,
/// d_in]` read at `hook`, or why there is none.
pub fn resid_directions(model: &Transformer, hook: HookPoint, w_dec: Tensor<2>) -> Result<Tensor<2>, String> {
    let f32_of = |p: &burn::module::Param<Tensor<2>>| burnlens_model::f32_val(p);
    match hook {
        HookPoint::Mlp(l, MlpHook::Post | MlpHook::Pre | MlpHook::PreLinear) => match &model.blocks[l].mlp {
            Some(mlp) => Ok(matmul(w_dec, f32_of(&mlp.fc_out.weight))),
            None => Err(format!("hook point `{}`: block {l} has no MLP", hook.name())),
        },
        HookPoint::Attn(l, AttnHook::Z) => Ok(matmul(w_dec, f32_of(&model.blocks[l].attn.out.weight))),
        h if is_residual(h) => Ok(w_dec),
        h => Err(format!("hook point `{}`: SAEDashboard finds no residual-stream direction for its features", h.name())),
    }
}

/// Hooks whose space is the residual stream's: the block's stream and what attention and the
/// MLP add to it, and a norm's normalized value (SAEDashboard's test is by substrings of the
/// name; the test below holds the two equal on every point a model has).
fn is_residual(hook: HookPoint) -> bool {
    matches!(hook, HookPoint::Block(..) | HookPoint::Norm(_, NormHook::Normalized))
}

/// Each feature's effects, `chunk` features at a time (a `[chunk, vocab]` product at once).
pub fn logit_effects(dirs: Tensor<2>, w_u: Tensor<2>, rows: usize, n_bins: usize, chunk: usize) -> Vec<LogitEffects> {
    let [n, _] = dirs.dims();
    let vocab = w_u.dims()[1];
    let mut out = Vec::with_capacity(n);
    for s in (0..n).step_by(chunk.max(1)) {
        let e = (s + chunk).min(n);
        let block = matmul(dirs.clone().slice([s..e]), w_u.clone());
        let host = block.into_data().try_to_vec::<f32>().expect("f32 logits");
        use rayon::prelude::*;
        out.par_extend(host.par_chunks(vocab).map(|l| LogitEffects::of(l, rows, n_bins)).collect::<Vec<_>>());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The typed test agrees with SAEDashboard's by name on every hook point of a model.
    #[test]
    fn residual_points_are_saedashboards() {
        let by_name = |name: &str| ["resid", "_out", "hook_mlp_in", "mlp.hook_in", "hook_normalized"].iter().any(|s| name.contains(s));
        let mut cfg = burnlens_model::TransformerConfig::gpt2_like(50, 16, 8, 2, 2);
        cfg.norm_placement = burnlens_model::NormPlacement::Sandwich;
        let points = burnlens_model::hook_points(&cfg);
        assert!(points.len() > 20);
        for p in points {
            assert_eq!(is_residual(p), by_name(&p.name()), "{}", p.name());
        }
    }

    /// The tables against a full sort (value, then token id), ties included.
    #[test]
    fn tables_equal_a_sort() {
        let logits: Vec<f32> = (0..5000u32).map(|i| ((i.wrapping_mul(2654435761) >> 7) % 997) as f32 / 7.0 - 60.0).collect();
        let e = LogitEffects::of(&logits, 10, 50);
        let mut order: Vec<u32> = (0..logits.len() as u32).collect();
        order.sort_by(|a, b| logits[*b as usize].total_cmp(&logits[*a as usize]).then(a.cmp(b)));
        assert_eq!(e.top, order[..10].iter().map(|&i| (i, logits[i as usize])).collect::<Vec<_>>());
        order.sort_by(|a, b| logits[*a as usize].total_cmp(&logits[*b as usize]).then(a.cmp(b)));
        assert_eq!(e.bottom, order[..10].iter().map(|&i| (i, logits[i as usize])).collect::<Vec<_>>());
        assert_eq!(e.histogram.heights.iter().sum::<u64>(), 5000);
    }
}
