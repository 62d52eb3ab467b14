use thiserror::Error;

/// Errors raised while building or running a model.
#[derive(Debug, Error)]
pub enum ModelError {
    /// A configuration value that cannot describe a model.
    #[error("invalid model config: `{field}` {msg}")]
    Config { field: &'static str, msg: String },
    /// A token id not below the vocabulary size.
    #[error("token id {id} at position {pos} is out of range: the vocabulary has {vocab} ids (0..={max})", max = vocab - 1)]
    TokenOutOfRange { id: i64, pos: usize, vocab: usize },
    /// A sequence longer than the learned position embeddings.
    #[error("sequence of {len} tokens is longer than the model's context of {n_ctx} positions")]
    TooLong { len: usize, n_ctx: usize },
    /// An empty sequence.
    #[error("the sequence is empty: at least one token id is needed")]
    Empty,
}
