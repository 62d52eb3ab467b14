//! What can go wrong reading a corpus: always a file (or dataset id) and what was expected.

use std::path::{Path, PathBuf};

/// A problem with a dataset, naming the file or field.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("{path}: {msg}")]
    File { path: PathBuf, msg: String },
    #[error("{path}: column `{column}`: {msg}")]
    Column { path: PathBuf, column: String, msg: String },
    #[error("dataset {spec}: {msg}")]
    Spec { spec: String, msg: String },
}

impl DataError {
    pub(crate) fn file(path: &Path, msg: impl Into<String>) -> Self {
        DataError::File { path: path.to_path_buf(), msg: msg.into() }
    }
    pub(crate) fn column(path: &Path, column: &str, msg: impl Into<String>) -> Self {
        DataError::Column { path: path.to_path_buf(), column: column.into(), msg: msg.into() }
    }
}

pub type Result<T, E = DataError> = std::result::Result<T, E>;
