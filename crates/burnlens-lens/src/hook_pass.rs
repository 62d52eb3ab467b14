//! The model pass that the corpus tools share (the activation store, caches, evals,
//! dashboards): a batch of windows of token ids in, the activations at some hook points out,
//! flattened to `[tokens, width]`, stopping after the last block read (SAELens's
//! `stop_at_layer`). Beside [`run_with_cache`](crate::run_with_cache), which keeps them as
//! the model shapes them.

use burn::tensor::{Int, Tensor, TensorData};
use burnlens_model::{Activation, AttnHook, Forward, HookPoint, Hooks, ModelError, Stop, Transformer};

/// A problem producing activations.
#[derive(Debug, thiserror::Error)]
pub enum PassError {
    #[error("hook point `{hook}`: {msg}")]
    Hook { hook: String, msg: String },
    /// A window the model cannot read (a token outside its vocabulary, too long).
    #[error("window {window}: {source}")]
    Ids { window: usize, source: ModelError },
}

/// The token ids of `windows` (each as long as the first), checked against `model` by its
/// own check, as the `[windows, tokens]` tensor the model reads.
pub fn window_ids(model: &Transformer, windows: &[Vec<u32>]) -> Result<Tensor<2, Int>, PassError> {
    let (b, t) = (windows.len(), windows[0].len());
    let flat: Vec<i64> = windows.iter().flatten().map(|&id| id as i64).collect();
    for (window, ids) in flat.chunks(t).enumerate() {
        model.check_ids(ids).map_err(|source| PassError::Ids { window, source })?;
    }
    Ok(Tensor::from_data(TensorData::new(flat, [b, t]), &model.device()))
}

/// The activations at `hooks` for `windows` (one model pass), each `[tokens, width]`.
pub fn hook_activations(model: &Transformer, hooks: &[HookPoint], windows: &[Vec<u32>]) -> Result<Vec<Tensor<2>>, PassError> {
    let ids = window_ids(model, windows)?;
    // Layers whose attention nobody reads keep the fused attention.
    let mut h = Hooks::capture(|p| hooks.contains(&p)).fusing_unhooked();
    // As SAELens's store (`stop_at_layer`): nothing after the last block read runs.
    let layers: Option<Vec<usize>> = hooks.iter().map(|p| p.layer()).collect();
    let stop = match layers.and_then(|l| l.into_iter().max()) {
        Some(l) => Stop::AfterBlock(l),
        None => Stop::FinalStream,
    };
    model.forward_with(Forward::new(ids).hooks(&mut h).stop(stop));
    let mut cache = h.take_cache();
    hooks
        .iter()
        .map(|point| match cache.remove(point) {
            Some(Activation::Rank3(a)) => {
                let [b, t, d] = a.dims();
                Ok(a.reshape([b * t, d]))
            }
            Some(Activation::Rank4(a)) if matches!(point, HookPoint::Attn(_, AttnHook::Z)) => {
                let [b, t, h, d] = a.dims();
                Ok(a.reshape([b * t, h * d]))
            }
            Some(a) => Err(PassError::Hook {
                hook: point.name(),
                msg: format!("activation of shape {:?}: only [batch, pos, d] points and hook_z can be trained on", a.dims()),
            }),
            None => Err(PassError::Hook { hook: point.name(), msg: "not produced by the forward pass".into() }),
        })
        .collect()
}
