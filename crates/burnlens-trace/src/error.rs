//! The one error type of the tracer.

use std::path::PathBuf;

/// Why transcoders cannot be loaded or a graph cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// A file is missing, unreadable or holds something other than expected.
    #[error("{path}: {msg}")]
    File { path: PathBuf, msg: String },
    /// The transcoders do not fit the model (layers, widths, hook points).
    #[error("transcoders do not fit the model: {0}")]
    Mismatch(String),
    /// A download from the Hub failed (the message names the repository and file).
    #[error(transparent)]
    Hub(#[from] burnlens_hf::HfError),
    /// A bad argument: prompt, target token, threshold.
    #[error("{0}")]
    Input(String),
}

impl TraceError {
    pub(crate) fn file(path: impl Into<PathBuf>, msg: impl Into<String>) -> Self {
        TraceError::File { path: path.into(), msg: msg.into() }
    }
}

impl From<burnlens_model::files::FileError> for TraceError {
    fn from(e: burnlens_model::files::FileError) -> Self {
        TraceError::file(e.path, e.source.to_string())
    }
}
