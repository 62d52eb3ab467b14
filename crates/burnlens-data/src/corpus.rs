//! A corpus as a user names it (the `--data` flags, Python's keyword arguments) and the
//! windows it gives: synthetic (`random`, `repeated`) or a dataset ([`DatasetSpec`]) read
//! through its rows and cut as SAELens cuts them.

use burnlens_hf::Tokenizer;
use burnlens_hf::hub::Hub;
use serde::{Deserialize, Serialize};

use crate::error::{DataError, Result};
use crate::position::{Counted, WindowStream};
use crate::rows::{Column, Rows};
use crate::spec::DatasetSpec;
use crate::synthetic::Synthetic;
use crate::windows::{Separator, WindowConfig, Windows};

/// Where tokens come from and how they are cut into windows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
#[serde(default, deny_unknown_fields)]
pub struct CorpusOptions {
    /// `random`, `repeated` (the induction toy's data), or a dataset: a .txt/.jsonl/.parquet
    /// file or a folder of them, or a Hub dataset org/name[@revision][:split].
    #[cfg_attr(feature = "clap", arg(long, default_value_t = CorpusOptions::default().data))]
    pub data: String,
    /// The dataset's text or token column (default: tokens, input_ids, then text).
    #[cfg_attr(feature = "clap", arg(long))]
    pub column: Option<String>,
    /// Tokens per window (SAELens's context_size).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = CorpusOptions::default().seq_len))]
    pub seq_len: usize,
    /// Start each window with BOS (SAELens's `prepend_bos`); the flag `--no-prepend-bos`
    /// turns it off.
    #[cfg_attr(feature = "clap", arg(long = "no-prepend-bos", action = clap::ArgAction::SetFalse))]
    pub prepend_bos: bool,
}

impl Default for CorpusOptions {
    fn default() -> Self {
        CorpusOptions { data: "random".into(), column: None, seq_len: 32, prepend_bos: true }
    }
}

/// Windows of token ids, read lazily, that know their position and seek to one.
pub type WindowIter<'a> = Box<dyn WindowStream + 'a>;

/// What the windows are cut for: the model's tokenizer, BOS and vocabulary.
#[derive(Clone, Copy)]
pub struct ForModel<'a> {
    pub tokenizer: Option<&'a Tokenizer>,
    pub bos: Option<u32>,
    pub vocab: usize,
}

impl CorpusOptions {
    /// The windows of the corpus (synthetic ones drawn with `seed`; a Hub dataset fetched
    /// through `hub` first).
    pub fn windows<'a>(&self, model: ForModel<'a>, seed: u64, hub: &Hub) -> Result<WindowIter<'a>> {
        if let Some(kind) = Synthetic::parse(&self.data) {
            return Ok(Box::new(Counted::new(kind.windows(model.vocab, self.seq_len, seed).map(Ok))));
        }
        let spec = DatasetSpec::parse(&self.data)?;
        let files = spec.files(hub, &mut |_| {})?;
        let cfg = WindowConfig { context_size: self.seq_len, prepend_bos: self.prepend_bos, separator: Separator::Bos, disable_concat: false };
        let windows = Windows::new(Rows::new(files, Column(self.column.clone())), model.tokenizer, model.bos, &cfg)?;
        Ok(Box::new(windows))
    }

    /// `n` batches of `size` windows, or an error saying how many windows there were.
    pub fn batches(&self, windows: &mut WindowIter, n: usize, size: usize) -> Result<Vec<Vec<Vec<u32>>>> {
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let batch: Vec<Vec<u32>> = windows.by_ref().take(size).collect::<Result<_>>()?;
            if batch.len() < size {
                let had = out.len() * size + batch.len();
                return Err(DataError::Spec { spec: self.data.clone(), msg: format!("ran out after {had} windows; {n} batches of {size} were asked for") });
            }
            out.push(batch);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_read_with_saelens_names_and_refuse_unknown_ones() {
        let o: CorpusOptions = serde_json::from_str(r#"{"data": "x.txt", "prepend_bos": false}"#).unwrap();
        assert_eq!(o, CorpusOptions { data: "x.txt".into(), prepend_bos: false, ..CorpusOptions::default() });
        assert!(CorpusOptions::default().prepend_bos);
        let e = serde_json::from_str::<CorpusOptions>(r#"{"no_prepend_bos": true}"#).unwrap_err().to_string();
        assert!(e.contains("no_prepend_bos"), "{e}");
    }

    #[cfg(feature = "clap")]
    #[test]
    fn the_flag_turns_bos_off() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            corpus: CorpusOptions,
        }
        assert!(Cli::parse_from(["x"]).corpus.prepend_bos);
        assert!(!Cli::parse_from(["x", "--no-prepend-bos"]).corpus.prepend_bos);
    }
}
