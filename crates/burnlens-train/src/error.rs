use std::path::PathBuf;

use burnlens_dist::DistError;
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
    /// Between ranks of a data-parallel run; `checkpoint` is the last complete one.
    #[error("{error}{}", checkpoint.as_ref().map_or(String::new(), |p| format!("; the last checkpoint is {} (continue with --resume)", p.display())))]
    Rank { error: DistError, checkpoint: Option<PathBuf> },
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
        match self {
            TrainError::Interrupted { .. } | TrainError::NonFinite { .. } => false,
            TrainError::Rank { error, .. } => matches!(error, DistError::Peer { .. } | DistError::NoMpi { .. } | DistError::Setting(_)),
            _ => true,
        }
    }
}

impl From<DistError> for TrainError {
    fn from(error: DistError) -> Self {
        TrainError::Rank { error, checkpoint: None }
    }
}

pub type Result<T, E = TrainError> = std::result::Result<T, E>;

impl From<burnlens_model::files::FileError> for TrainError {
    fn from(e: burnlens_model::files::FileError) -> Self {
        TrainError::io(e.path, e.source)
    }
}
