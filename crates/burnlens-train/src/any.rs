//! A model to look at or sample from, whichever kind of directory holds it: a burnlens run
//! directory (its `checkpoints/`, no `config.json`) or a Hugging Face model directory. The
//! one place that tells them apart, for the CLI and any other front end.

use std::path::{Path, PathBuf};

use burn::tensor::Device;
use burnlens_hf::{LoadOptions, Tokenizer, load_model_with};
use burnlens_model::Transformer;

use crate::checkpoint::load_run;
use crate::error::TrainError;

/// A loaded model with what a front end needs beside it.
#[derive(Clone)]
pub struct AnyModel {
    pub model: Transformer,
    /// Saved beside the weights (`tokenizer.json`, or a run's `char_vocab.json`), if any.
    pub tokenizer: Option<Tokenizer>,
    /// The checkpoint's `bos_token_id`, if it has one (runs have none).
    pub bos: Option<i64>,
    /// What the import noticed and let pass (ignored legacy buffers and the like).
    pub warnings: Vec<String>,
    /// The Hugging Face family (`model_type`) of a model directory; `None` for a run.
    pub family: Option<burnlens_hf::Family>,
    /// Where it was loaded from.
    pub dir: PathBuf,
}

impl AnyModel {
    /// What a corpus is cut into windows for: this model's tokenizer, BOS and vocabulary.
    pub fn corpus_model(&self) -> burnlens_data::ForModel<'_> {
        burnlens_data::ForModel { tokenizer: self.tokenizer.as_ref(), bos: self.bos.map(|b| b as u32), vocab: self.model.config.vocab_size }
    }
}

/// Whether `dir` is a burnlens run directory rather than a Hugging Face model directory.
pub fn is_run_dir(dir: &Path) -> bool {
    dir.join("checkpoints").is_dir() && !dir.join("config.json").is_file()
}

/// Load the latest checkpoint of a run, or a Hugging Face model (its weight matrices as
/// `options` asks), from `dir`.
pub fn load_any(dir: &Path, device: &Device, options: &LoadOptions) -> Result<AnyModel, TrainError> {
    if is_run_dir(dir) {
        let run = load_run(dir, device)?;
        Ok(AnyModel { model: run.model, tokenizer: run.tokenizer, bos: None, warnings: Vec::new(), family: None, dir: dir.to_path_buf() })
    } else {
        let loaded = load_model_with(dir, device, options)?;
        let tokenizer = Tokenizer::find_in_dir(dir).transpose()?;
        Ok(AnyModel {
            model: loaded.model,
            tokenizer,
            bos: loaded.hf.bos_token_id,
            warnings: loaded.info.warnings,
            family: Some(loaded.hf.family),
            dir: dir.to_path_buf(),
        })
    }
}
