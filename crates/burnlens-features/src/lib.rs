//! Features from a corpus: sparse autoencoders trained the way SAELens 6 trains them
//! (its encodings, losses, initialisation, Adam with global gradient clipping, learning-rate
//! and coefficient schedules, dead-feature tracking), on activation batches from anywhere.
//!
//! ```text
//! TrainerConfig + Architecture ─▶ SaeTrainer::new(params::init: a Dictionary) ─▶ step(x) ... ─▶ params
//! ```
//! One module per concept: [`architecture`] (what each kind encodes and what it is
//! penalised for), [`params`] (a dictionary as it is trained, and SAELens's initialisation), [`forward`] (a
//! training forward pass and its loss terms, as autodiff expressions: the reference),
//! [`sparse_pass`] and [`dense_pass`] (the same pass with its backward written by hand, the
//! one the trainer takes; sparse codes are the dictionary's own), [`host`],
//! [`cross_layer`] (a CLT as one masked transcoder), [`schedule`], [`adam`], [`trainer`],
//! [`share`] (a step shared by the ranks of an MPI job);
//! [`mixing`] and [`store`] turn a corpus's windows into shuffled activation batches.

pub mod adam;
pub mod architecture;
pub mod cache;
pub mod checkpoint;
pub mod config;
pub mod cross_layer;
pub mod dense_pass;
pub mod eval_ranks;
pub mod eval_reads;
pub mod evals;
pub mod forward;
pub mod host;
pub mod inference;
pub mod metrics;
pub mod mixing;
pub mod options;
pub mod outputs;
pub mod params;
pub mod pass;
#[cfg(test)]
mod pass_check;
pub mod run;
pub mod schedule;
pub mod share;
pub mod sparse_pass;
pub mod store;
pub mod tensor_pass;
pub mod trainer;
pub mod units;

pub use architecture::{Architecture, ArchitectureName, JumpReluSettings, LossTerm, TopKSettings};
pub use cache::{CacheIndex, CacheJob, CacheReader, write_cache};
pub use config::{RunError, SaeRunConfig, Site};
pub use eval_ranks::{EvalError, evaluate_over};
pub use evals::{EvalInput, EvalMetrics, FeatureMetrics, evaluate};
pub use forward::TrainPassValues;
pub use inference::{SaeSite, inference_sae};
pub use mixing::{MixingBuffer, Rows};
pub use options::RunOptions;
pub use params::{Shape, Trainable};
pub use pass::{StoreError, WindowSource};
pub use run::{OnStep, Progress, Run, RunSummary, Source, train};
pub use schedule::{CoefficientSchedule, LrSchedule, LrScheduler};
pub use store::{ActivationStore, Producer, StoreConfig};
pub use tensor_pass::PassPath;
pub use trainer::{Batch, SaeTrainer, StepReport, TrainerConfig};
