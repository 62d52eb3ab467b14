//! Training toy transformers from a TOML run config: data, the loop, checkpoints that survive
//! interruption, and export back to Hugging Face.

pub mod any;
pub mod config;
pub mod data;
pub mod error;
pub mod optim;
pub mod plot;
pub mod run;

pub use any::{AnyModel, is_run_dir, load_any};
pub use config::RunConfig;
pub use error::TrainError;
pub use run::{LoadedRun, OnStep, RunSummary, TrainOptions, export_run, install_interrupt_handler, load_run, request_stop, train};
