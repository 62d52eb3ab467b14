//! Corpora as people have them, streamed: plain text, `.jsonl` and `.parquet` files, folders
//! of shards, or Hub datasets in the Hugging Face cache; text tokenized while reading and cut
//! into context windows exactly as SAELens's activation store cuts them. Nothing reads a
//! corpus whole into memory: a shard is read a line or a parquet record batch at a time.
//!
//! ```text
//! DatasetSpec ──shards──▶ [files] ──Rows──▶ Row::{Text, Tokens} ──Windows──▶ Vec<u32> of context_size
//!                           (text: tokenized, then Concat: SAELens's concatenation with BOS;
//!                            tokens: each row cut to the context)
//! ```
//!
//! A stream of windows knows its position and seeks to one ([`position`]): a resumed run
//! goes back to where it was without tokenizing the rows before it.

pub mod corpus;
pub mod error;
pub mod position;
pub mod rows;
pub mod shards;
pub mod spec;
pub mod synthetic;
pub mod windows;

pub use corpus::{CorpusOptions, ForModel, WindowIter};
pub use error::{DataError, Result};
pub use position::{Counted, WindowPosition, WindowStream};
pub use rows::{Column, Row, Rows};
pub use shards::shard_files;
pub use spec::DatasetSpec;
pub use synthetic::Synthetic;
pub use windows::{Concat, Separator, SpecialIds, WindowConfig, Windows};
