//! The corpus options shared by the commands that stream one (`train-sae`, `eval-sae`), and
//! the windows they describe.

use anyhow::Result;
use burnlens_data::{Column, DatasetSpec, Rows, Separator, Synthetic, WindowConfig, Windows};
use burnlens_features::WindowSource;
use burnlens_train::AnyModel;

use crate::UserError;

/// Where tokens come from and how they are cut into windows.
#[derive(clap::Args, Clone)]
pub struct CorpusArgs {
    /// `random`, `repeated` (the induction toy's data), or a dataset: a .txt/.jsonl/.parquet
    /// file or a folder of them, or a Hub dataset org/name[@revision][:split].
    #[arg(long, default_value = "random")]
    pub data: String,
    /// The dataset's text or token column (default: tokens, input_ids, then text).
    #[arg(long)]
    pub column: Option<String>,
    /// Tokens per window (SAELens's context_size).
    #[arg(long, default_value_t = 32)]
    pub seq_len: usize,
    /// Do not start each window with BOS (SAELens's prepend_bos=False).
    #[arg(long)]
    pub no_prepend_bos: bool,
}

impl CorpusArgs {
    /// The windows of the corpus for model `m` (synthetic ones drawn with `seed`).
    pub fn windows<'a>(&self, m: &'a AnyModel, seed: u64) -> Result<WindowSource<'a>> {
        if let Some(kind) = Synthetic::parse(&self.data) {
            return Ok(Box::new(kind.windows(m.model.config.vocab_size, self.seq_len, seed).map(Ok)));
        }
        let spec = DatasetSpec::parse(&self.data).map_err(|e| UserError(format!("--data: {e}")))?;
        let files = spec.files(&burnlens_hf::Hub::from_env(), &mut |_| {})?;
        let cfg = WindowConfig { context_size: self.seq_len, prepend_bos: !self.no_prepend_bos, separator: Separator::Bos, disable_concat: false };
        let bos = m.bos.map(|b| b as u32);
        Ok(Box::new(Windows::new(Rows::new(files, Column(self.column.clone())), m.tokenizer.as_ref(), bos, &cfg)?))
    }
}
