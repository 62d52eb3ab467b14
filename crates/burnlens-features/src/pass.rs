//! The model pass of the activation store (the lens crate's, shared with the dashboards),
//! and what can go wrong producing activations.

use burn::tensor::Tensor;
use burnlens_model::{HookPoint, Transformer};

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
    #[error(transparent)]
    Pass(#[from] burnlens_lens::hook_pass::PassError),
}

/// Where windows come from: any iterator of windows of `context_size` token ids.
pub type WindowSource<'a> = burnlens_data::WindowIter<'a>;

/// The activations at `hooks` for `windows` (one model pass), each `[tokens, width]`: the
/// lens crate's [`hook_activations`](burnlens_lens::hook_pass::hook_activations).
pub fn pass(model: &Transformer, hooks: &[HookPoint], windows: &[Vec<u32>]) -> Result<Vec<Tensor<2>>, StoreError> {
    Ok(burnlens_lens::hook_pass::hook_activations(model, hooks, windows)?)
}

impl From<burnlens_model::files::FileError> for StoreError {
    fn from(e: burnlens_model::files::FileError) -> Self {
        StoreError::Config(e.to_string())
    }
}
