use std::path::PathBuf;

use burnlens_hf::HfError;
use burnlens_model::ModelError;
use burnlens_model::backend::BackendError;
use thiserror::Error;

/// Errors of configuring, feeding and running training.
#[derive(Debug, Error)]
pub enum TrainError {
    /// The OS error is shown once, in this message (not also as a chained source).
    #[error("{}: {error}", path.display())]
    Io { path: PathBuf, error: std::io::Error },
    #[error("{}: {msg}", path.display())]
    Config { path: PathBuf, msg: String },
    #[error("{}: {msg}", path.display())]
    Data { path: PathBuf, msg: String },
    #[error("{}: {msg}", path.display())]
    Checkpoint { path: PathBuf, msg: String },
    #[error("loss became {loss} at step {step}; stopped without saving it. The last good checkpoint is {}", checkpoint.as_ref().map_or("none (no checkpoint was written yet)".to_string(), |p| p.display().to_string()))]
    NonFinite { step: usize, loss: f64, checkpoint: Option<PathBuf> },
    #[error("interrupted at step {step}; checkpoint written to {}", checkpoint.display())]
    Interrupted { step: usize, checkpoint: PathBuf },
    #[error(transparent)]
    Hf(#[from] HfError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Backend(#[from] BackendError),
}

impl TrainError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        TrainError::Io { path: path.into(), error: source }
    }

    /// Whether the error is about what the user gave (exit code 2) rather than a failure.
    pub fn is_user_error(&self) -> bool {
        !matches!(self, TrainError::Interrupted { .. } | TrainError::NonFinite { .. })
    }
}

pub type Result<T, E = TrainError> = std::result::Result<T, E>;
