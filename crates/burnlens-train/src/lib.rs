//! Training toy transformers from a TOML run config: data, a session of small steps with
//! checkpoints that survive interruption, and export back to Hugging Face.

pub mod any;
pub mod checkpoint;
pub mod config;
pub mod corpus;
pub mod data;
mod data_parallel;
pub mod error;
mod metrics;
pub mod observer;
pub mod optim;
pub mod plot;
pub mod session;
pub mod spec;
pub mod tokens;

pub use any::{AnyModel, is_run_dir, load_any};
pub use checkpoint::{LoadedRun, TrainState, export_run, latest_checkpoint, load_run};
pub use config::RunConfig;
pub use error::TrainError;
pub use observer::{Observer, Silent, StepMetrics};
pub use session::{RunSummary, TrainOptions, TrainSession, train};
pub use spec::ModelSpec;
pub use tokens::{Encoded, TokenError};
