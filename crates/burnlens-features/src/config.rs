//! What a training run is told (its `config.json`: the sites trained, the architecture,
//! the trainer's, store's and schedule's settings) and what can go wrong with one.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::architecture::Architecture;
use crate::pass::StoreError;
use crate::store::StoreConfig;
use crate::trainer::TrainerConfig;

/// What one SAE or transcoder of a run reads and reconstructs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Site {
    /// The TransformerLens hook name it reads.
    pub input: String,
    /// A transcoder's target hook (an SAE reconstructs its input).
    pub output: Option<String>,
}

impl Site {
    /// An SAE on `hook`.
    pub fn sae(hook: &str) -> Self {
        Site { input: hook.to_string(), output: None }
    }
}

/// Everything a run depends on (its `config.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SaeRunConfig {
    /// One trainer per site, all fed by the same model passes.
    pub sites: Vec<Site>,
    /// Transcoders get a skip connection `W_skip`.
    pub skip: bool,
    /// The transcoder sites are one cross-layer transcoder ([`crate::cross_layer`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cross_layer: bool,
    pub d_sae: usize,
    pub architecture: Architecture,
    pub trainer: TrainerConfig,
    pub store: StoreConfig,
    /// Training steps (batches of `store.train_batch_size_tokens`).
    pub steps: usize,
    pub seed: u64,
    pub checkpoint_every: usize,
    /// Log a metrics line every this many steps.
    pub log_every: usize,
}

impl SaeRunConfig {
    /// What each trainer of the run is called in its metrics: the hook it reads, or
    /// `cross_layer_transcoder`.
    pub fn trainer_names(&self) -> Vec<String> {
        match self.cross_layer {
            true => vec!["cross_layer_transcoder".to_string()],
            false => self.sites.iter().map(|s| s.input.clone()).collect(),
        }
    }
}

/// A problem with a run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("{path}: {msg}")]
    File { path: PathBuf, msg: String },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0}")]
    Config(String),
    #[error(transparent)]
    Ranks(#[from] burnlens_dist::DistError),
}

pub(crate) fn file_err(path: &Path, e: impl std::fmt::Display) -> RunError {
    RunError::File { path: path.to_path_buf(), msg: e.to_string() }
}

impl From<burnlens_model::files::FileError> for RunError {
    fn from(e: burnlens_model::files::FileError) -> Self {
        file_err(&e.path, e.source)
    }
}
