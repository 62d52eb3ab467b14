//! A feature's direct effect on the logits, as SAEDashboard computes it: its decoder row
//! carried into the residual stream (`to_resid_direction`: as it is for residual, attention-
//! and MLP-output hooks; through `W_out` for MLP neurons; through `W_O` for `hook_z`), times
//! the model's `W_U` (with TransformerLens's processing when the model was loaded with it:
//! final-norm weights folded in, centred). The whole vocabulary's values make a histogram;
//! the largest and smallest make the tables.

use burn::tensor::Tensor;
use burnlens_model::{AttnHook, HookPoint, MlpHook, Transformer};
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
    /// The effects of one feature's logit vector.
    pub fn of(logits: &[f32], rows: usize, n_bins: usize) -> Self {
        let mut order: Vec<u32> = (0..logits.len() as u32).collect();
        let rows = rows.min(logits.len());
        let by = |a: &u32, b: &u32| logits[*b as usize].total_cmp(&logits[*a as usize]).then(a.cmp(b));
        order.select_nth_unstable_by(rows.saturating_sub(1), by);
        let mut top: Vec<u32> = order[..rows].to_vec();
        top.sort_by(by);
        let by_low = |a: &u32, b: &u32| logits[*a as usize].total_cmp(&logits[*b as usize]).then(a.cmp(b));
        order.select_nth_unstable_by(rows.saturating_sub(1), by_low);
        let mut bottom: Vec<u32> = order[..rows].to_vec();
        bottom.sort_by(by_low);
        let pair = |t: u32| (t, logits[t as usize]);
        LogitEffects { top: top.into_iter().map(pair).collect(), bottom: bottom.into_iter().map(pair).collect(), histogram: Histogram::of(logits, n_bins) }
    }
}

/// The residual-stream directions `[features, d_model]` of decoder rows `w_dec [features,
/// d_in]` read at `hook`, or why there is none.
pub fn resid_directions(model: &Transformer, hook: HookPoint, w_dec: Tensor<2>) -> Result<Tensor<2>, String> {
    let f32_of = |p: &burn::module::Param<Tensor<2>>| burnlens_model::f32_val(p);
    match hook {
        HookPoint::Mlp(l, MlpHook::Post | MlpHook::Pre | MlpHook::PreLinear) => match &model.blocks[l].mlp {
            Some(mlp) => Ok(w_dec.matmul(f32_of(&mlp.fc_out.weight))),
            None => Err(format!("hook point `{}`: block {l} has no MLP", hook.name())),
        },
        HookPoint::Attn(l, AttnHook::Z) => Ok(w_dec.matmul(f32_of(&model.blocks[l].attn.out.weight))),
        h if is_residual(&h.name()) => Ok(w_dec),
        h => Err(format!("hook point `{}`: SAEDashboard finds no residual-stream direction for its features", h.name())),
    }
}

/// Hooks whose space is the residual stream's (SAEDashboard's test is by name).
fn is_residual(name: &str) -> bool {
    ["resid", "_out", "hook_mlp_in", "mlp.hook_in", "hook_normalized"].iter().any(|s| name.contains(s))
}

/// Each feature's effects, `chunk` features at a time (a `[chunk, vocab]` product at once).
pub fn logit_effects(dirs: Tensor<2>, w_u: Tensor<2>, rows: usize, n_bins: usize, chunk: usize) -> Vec<LogitEffects> {
    let [n, _] = dirs.dims();
    let vocab = w_u.dims()[1];
    let mut out = Vec::with_capacity(n);
    for s in (0..n).step_by(chunk.max(1)) {
        let e = (s + chunk).min(n);
        let block = dirs.clone().slice([s..e]).matmul(w_u.clone());
        let host = block.into_data().try_to_vec::<f32>().expect("f32 logits");
        use rayon::prelude::*;
        out.par_extend(host.par_chunks(vocab).map(|l| LogitEffects::of(l, rows, n_bins)).collect::<Vec<_>>());
    }
    out
}
