//! Hugging Face interop for burnlens: `config.json` parsing, checkpoint import (safetensors,
//! sharded safetensors, `pytorch_model.bin`) and export.
//!
//! Files are read through `burn-store` (`SafetensorsStore`, `PytorchStore`); the
//! family-specific name and layout mapping lives in [`layout`], shared by import and export.

pub mod checkpoint;
pub mod config;
pub mod describe;
pub mod dtype;
pub mod error;
pub mod export;
pub mod family;
pub mod fields;
pub use burnlens_model::files;
pub mod hub;
pub mod hub_id;
pub mod import;
pub mod layout;
pub mod tokenizer;

pub use checkpoint::{Checkpoint, WeightFormat};
pub use config::{HfConfig, parse_config, read_config};
pub use dtype::{LoadOptions, WeightDtype};
pub use error::HfError;
pub use export::{ExportOptions, check_exportable, export_hf, hf_config_json};
pub use family::{Family, FamilySpec, FreshShape};
pub use hub::{Hub, HubId, resolve_folder, resolve_model};
pub use import::{CheckpointInfo, LoadedModel, import, load_model, load_model_with};
pub use tokenizer::Tokenizer;
