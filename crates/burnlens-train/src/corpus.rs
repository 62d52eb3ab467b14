//! Corpora `burnlens fetch` knows: where each lives and the sha256 it must have. A download
//! is checked before anything is written, and written atomically.

use std::path::Path;

use crate::error::{Result, TrainError};

/// A known text corpus.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Corpus {
    pub name: &'static str,
    /// The canonical address (`BURNLENS_DATA_URL` replaces it, for mirrors and tests).
    pub url: &'static str,
    pub sha256: &'static str,
}

/// Every corpus [`fetch`] knows.
pub const CORPORA: &[Corpus] = &[Corpus {
    name: "tinyshakespeare",
    url: "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt",
    sha256: "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
}];

/// The corpus called `name`.
pub fn corpus(name: &str) -> Result<&'static Corpus> {
    CORPORA.iter().find(|c| c.name == name).ok_or_else(|| TrainError::Config {
        path: name.into(),
        msg: format!("unknown dataset; known: {}", CORPORA.iter().map(|c| c.name).collect::<Vec<_>>().join(", ")),
    })
}

/// Download corpus `name` to `out` (its parent created) after checking its sha256; returns
/// the number of bytes written. Nothing is written when the download fails or differs.
pub fn fetch(name: &str, out: &Path) -> Result<usize> {
    use sha2::Digest;
    let c = corpus(name)?;
    let url = std::env::var("BURNLENS_DATA_URL").unwrap_or_else(|_| c.url.to_string());
    let offline = |e: &dyn std::fmt::Display| TrainError::Data {
        path: out.to_path_buf(),
        msg: format!("downloading {url}: {e}; without network, copy the file here yourself (its sha256 must be {}) or point data.path at a copy", c.sha256),
    };
    let mut body = ureq::get(&url).call().map_err(|e| offline(&e))?.into_body();
    let bytes = body.read_to_vec().map_err(|e| offline(&e))?;
    let got = format!("{:x}", sha2::Sha256::digest(&bytes));
    if got != c.sha256 {
        return Err(TrainError::Data { path: out.to_path_buf(), msg: format!("{url}: sha256 is {got}, expected {}; not saved", c.sha256) });
    }
    if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|e| TrainError::io(parent, e))?;
    }
    burnlens_model::files::write_atomic(out, &bytes)?;
    Ok(bytes.len())
}
