use std::path::PathBuf;

use burnlens_model::ModelError;
use thiserror::Error;

/// Everything that can go wrong reading or writing a Hugging Face model directory. Each
/// message names the file, field or tensor and says what was expected.
#[derive(Debug, Error)]
pub enum HfError {
    /// The OS error is shown once, in this message (not also as a chained source).
    #[error("{}: {error}", path.display())]
    Io { path: PathBuf, error: std::io::Error },
    #[error("{}: not valid JSON: {msg}", path.display())]
    Json { path: PathBuf, msg: String },
    #[error("{}: field `{field}` {msg}", path.display())]
    Field { path: PathBuf, field: String, msg: String },
    #[error("{}: unsupported model_type \"{found}\"; supported: {}", path.display(), supported.join(", "))]
    UnknownModelType { path: PathBuf, found: String, supported: Vec<&'static str> },
    #[error("{}: no weights found: expected model.safetensors, model.safetensors.index.json or pytorch_model.bin", dir.display())]
    NoWeights { dir: PathBuf },
    #[error("{}: {msg}", path.display())]
    Checkpoint { path: PathBuf, msg: String },
    #[error("{}: missing tensor `{name}` (expected shape {expected:?})", path.display())]
    MissingTensor { path: PathBuf, name: String, expected: Vec<usize> },
    #[error("{}: tensor `{name}` has shape {found:?}, expected {expected:?}", path.display())]
    Shape { path: PathBuf, name: String, expected: Vec<usize>, found: Vec<usize> },
    #[error("{}: tensor `{name}` has dtype {found}, expected a floating-point dtype (F32, F16, BF16 or F64)", path.display())]
    Dtype { path: PathBuf, name: String, found: String },
    #[error("this backend cannot hold {dtype} tensors; load with --dtype f32 (or auto), or use the flex backend")]
    Backend { dtype: String },
    #[error("{}: `lm_head.weight` differs from `{embed}` although config.json ties them (tie_word_embeddings)", path.display())]
    Untied { path: PathBuf, embed: String },
    #[error("{}: {msg}", path.display())]
    Tokenizer { path: PathBuf, msg: String },
    #[error("{0}")]
    Export(String),
    #[error("{id}: {msg}")]
    Hub { id: String, msg: String },
    #[error(transparent)]
    Model(#[from] ModelError),
}

impl HfError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        HfError::Io { path: path.into(), error: source }
    }

    pub(crate) fn checkpoint(path: impl Into<PathBuf>, msg: impl std::fmt::Display) -> Self {
        HfError::Checkpoint { path: path.into(), msg: msg.to_string() }
    }
}

pub type Result<T, E = HfError> = std::result::Result<T, E>;

impl From<burnlens_model::files::FileError> for HfError {
    fn from(e: burnlens_model::files::FileError) -> Self {
        HfError::io(e.path, e.source)
    }
}
