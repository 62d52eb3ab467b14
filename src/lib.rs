//! burnlens: GPT-2, GPT-Neo, GPT-NeoX (Pythia), GPT-J, the Llama family (Llama, Qwen2,
//! Mistral), Qwen3, OLMo 2, Phi-3 and Gemma 2/3 on Burn. Import Hugging Face checkpoints with
//! exact parity, train them, run them on any Burn backend, and look inside.
//!
//! This facade re-exports the workspace crates:
//! - [`model`]: the canonical [`Transformer`](model::Transformer), its config and hook points;
//! - [`hf`]: Hugging Face `config.json` parsing, checkpoint import and export, tokenizers;
//! - [`train`]: run configs, data, the training loop and checkpoints;
//! - [`lens`]: caches, interventions, circuits, composition, detectors, SAEs, reports;
//! - [`data`]: corpora (text, jsonl, parquet, Hub datasets) streamed into context windows;
//! - [`features`]: SAE trainers with SAELens's definitions;
//! - [`dashboards`]: feature dashboards (SAEDashboard's statistics) over a corpus;
//! - [`dist`]: several processes (MPI ranks) as one job;
//! - [`trace`]: transcoders and attribution graphs (circuit-tracer's method).

pub use burnlens_dashboards as dashboards;
pub use burnlens_data as data;
pub use burnlens_dist as dist;
pub use burnlens_features as features;
pub use burnlens_hf as hf;
pub use burnlens_lens as lens;
pub use burnlens_model as model;
pub use burnlens_trace as trace;
pub use burnlens_train as train;

pub use burnlens_hf::{LoadedModel, load_model};
pub use burnlens_model::{Hooks, Transformer, TransformerConfig};
