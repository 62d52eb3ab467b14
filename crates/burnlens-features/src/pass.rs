//! One model pass for the activation store: the activations at some hook points for a batch
//! of windows, flattened to `[tokens, width]`, stopping after the last block read (SAELens's
//! `stop_at_layer`); and what can go wrong producing them.

use burn::tensor::{Int, Tensor, TensorData};
use burnlens_model::{Activation, AttnHook, Forward, HookPoint, Hooks, Stop, Transformer};

/// A problem producing activations.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("hook point `{hook}`: {msg}")]
    Hook { hook: String, msg: String },
    #[error("{0}")]
    Data(#[from] burnlens_data::DataError),
    #[error("activation store: {0}")]
    Config(String),
    #[error(transparent)]
    Ranks(#[from] burnlens_dist::DistError),
}

/// Where windows come from: any iterator of windows of `context_size` token ids.
pub type WindowSource<'a> = burnlens_data::WindowIter<'a>;

/// The activations at `hooks` for `windows` (one model pass), each `[tokens, width]`.
pub fn pass(model: &Transformer, hooks: &[HookPoint], windows: &[Vec<u32>]) -> Result<Vec<Tensor<2>>, StoreError> {
    let (b, t) = (windows.len(), windows[0].len());
    let flat: Vec<i64> = windows.iter().flatten().map(|&id| id as i64).collect();
    if let Some(&bad) = flat.iter().find(|&&id| id as usize >= model.config.vocab_size) {
        return Err(StoreError::Config(format!("token id {bad} is outside the model's vocabulary of {}", model.config.vocab_size)));
    }
    let ids = Tensor::<2, Int>::from_data(TensorData::new(flat, [b, t]), &model.device());
    let mut h = Hooks::capture(|p| hooks.contains(&p));
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
            Some(a) => Err(StoreError::Hook {
                hook: point.name(),
                msg: format!("activation of shape {:?}: only [batch, pos, d] points and hook_z can be trained on", a.dims()),
            }),
            None => Err(StoreError::Hook { hook: point.name(), msg: "not produced by the forward pass".into() }),
        })
        .collect()
}

impl From<burnlens_model::files::FileError> for StoreError {
    fn from(e: burnlens_model::files::FileError) -> Self {
        StoreError::Config(e.to_string())
    }
}
