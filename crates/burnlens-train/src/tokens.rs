//! What a user types, as token ids for a model: a text (through the model's tokenizer, its
//! BOS first if asked), several texts (right-padded, with the mask of real tokens), or one
//! token (an id, or a text that is exactly one token). The CLI and Python both call these,
//! so both refuse the same input with the same words; each front end adds only its flag.

use crate::any::AnyModel;

/// Why a text or token was refused.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("{dir} has no tokenizer.json or char_vocab.json")]
    NoTokenizer { dir: String },
    #[error("{text:?} encodes to no tokens")]
    Empty { text: String },
    #[error("{text:?} encodes to {} tokens {ids:?}; give one token (or its id)", ids.len())]
    NotOneToken { text: String, ids: Vec<i64> },
    #[error("token {id} is outside the vocabulary of {vocab} tokens")]
    OutOfVocabulary { id: i64, vocab: usize },
    #[error("{0}")]
    Tokenizer(#[from] burnlens_hf::HfError),
}

/// Texts as one `[batch, seq]` block of ids, right-padded when their lengths differ.
#[derive(Debug, Clone, PartialEq)]
pub struct Encoded {
    /// Row-major `[batch, seq]`; padding repeats the BOS id (0 without one).
    pub ids: Vec<i64>,
    pub batch: usize,
    pub seq: usize,
    /// `[batch, seq]`, true for real tokens; `None` when no row is padded.
    pub mask: Option<Vec<bool>>,
}

impl AnyModel {
    fn tokenizer(&self) -> Result<&burnlens_hf::Tokenizer, TokenError> {
        self.tokenizer.as_ref().ok_or_else(|| TokenError::NoTokenizer { dir: self.dir.display().to_string() })
    }

    /// Every id inside the model's vocabulary, or the first that is not.
    pub fn check_vocabulary(&self, ids: &[i64]) -> Result<(), TokenError> {
        let vocab = self.model.config.vocab_size;
        match ids.iter().find(|&&id| id < 0 || id as usize >= vocab) {
            Some(&id) => Err(TokenError::OutOfVocabulary { id, vocab }),
            None => Ok(()),
        }
    }

    /// The ids of `text`, after the checkpoint's BOS if `prepend_bos` (and it has one); at
    /// least one token, each inside the model's vocabulary.
    pub fn encode(&self, text: &str, prepend_bos: bool) -> Result<Vec<i64>, TokenError> {
        let mut ids: Vec<i64> = self.bos.filter(|_| prepend_bos).into_iter().collect();
        ids.extend(self.tokenizer()?.encode(text)?.into_iter().map(i64::from));
        if ids.is_empty() {
            return Err(TokenError::Empty { text: text.to_string() });
        }
        self.check_vocabulary(&ids)?;
        Ok(ids)
    }

    /// Each of `texts` encoded as [`AnyModel::encode`] does, right-padded to the longest.
    pub fn encode_batch(&self, texts: &[&str], prepend_bos: bool) -> Result<Encoded, TokenError> {
        let rows = texts.iter().map(|t| self.encode(t, prepend_bos)).collect::<Result<Vec<_>, _>>()?;
        let seq = rows.iter().map(Vec::len).max().unwrap_or(0);
        let pad = self.bos.unwrap_or(0);
        let padded = rows.iter().any(|r| r.len() != seq);
        let mut ids = Vec::with_capacity(rows.len() * seq);
        let mut mask = Vec::with_capacity(rows.len() * seq);
        for r in &rows {
            ids.extend(r.iter().copied().chain(std::iter::repeat_n(pad, seq - r.len())));
            mask.extend((0..seq).map(|i| i < r.len()));
        }
        Ok(Encoded { ids, batch: rows.len(), seq, mask: padded.then_some(mask) })
    }

    /// One token: an id, or a text that encodes to exactly one token (no BOS).
    pub fn single_token(&self, s: &str) -> Result<i64, TokenError> {
        let id = match s.trim().parse::<i64>() {
            Ok(id) => id,
            Err(_) => match self.encode(s, false)?.as_slice() {
                [one] => *one,
                ids => return Err(TokenError::NotOneToken { text: s.to_string(), ids: ids.to_vec() }),
            },
        };
        self.check_vocabulary(&[id])?;
        Ok(id)
    }

    /// The text of `ids` if the model has a tokenizer, else the ids joined by commas.
    pub fn text(&self, ids: &[i64]) -> String {
        match (&self.tokenizer, ids.iter().map(|&i| u32::try_from(i)).collect::<Result<Vec<u32>, _>>()) {
            (Some(t), Ok(ids)) => t.decode(&ids),
            _ => ids.iter().map(i64::to_string).collect::<Vec<_>>().join(","),
        }
    }

    /// A label per token: its text if the model has a tokenizer, else its id.
    pub fn labels(&self, ids: &[i64]) -> Vec<String> {
        ids.iter()
            .map(|&i| match (&self.tokenizer, u32::try_from(i)) {
                (Some(t), Ok(i)) => t.decode(&[i]),
                _ => i.to_string(),
            })
            .collect()
    }
}
