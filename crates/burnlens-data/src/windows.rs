//! Context windows cut from a stream of token rows exactly as SAELens's activation store
//! cuts them (`tokenization_and_batching.concat_and_batch_sequences`, SAELens 6):
//!
//! - **text** rows are tokenized without special tokens and concatenated; each window starts
//!   with BOS when `prepend_bos` (unless its first token already is BOS), and where one row
//!   ends and the next begins inside a window, the separator (BOS by default) stands
//!   between them (unless the next row already starts with it). A row longer than what is
//!   left of a window continues in the next window. The last, incomplete window is dropped.
//! - with `disable_concat`, each row is its own window: BOS put first (replacing the row's
//!   last tokens) when the row has at least `context_size − 1` tokens, rows shorter than
//!   `context_size` after that skipped, longer ones cut to it.
//! - **pretokenized** rows (an integer column) are taken as they are, cut to
//!   `context_size`: BOS and separators were the pretokenizer's business. A row shorter than
//!   `context_size` is an error (SAELens refuses such a dataset).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use burnlens_hf::Tokenizer;

use crate::error::{DataError, Result};
use crate::position::{WindowPosition, WindowStream, ended_before, started};
use crate::rows::{Row, Rows};

/// SAELens's settings for cutting windows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowConfig {
    /// Tokens per window.
    pub context_size: usize,
    /// Start every window with BOS (SAELens's `prepend_bos`).
    pub prepend_bos: bool,
    /// Between concatenated rows (SAELens's `sequence_separator_token`, default BOS).
    pub separator: Separator,
    /// One window per row, no concatenation (SAELens's `disable_concat_sequences`).
    pub disable_concat: bool,
}

/// What stands between two rows concatenated into one window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Separator {
    #[default]
    Bos,
    Token(u32),
    None,
}

impl WindowConfig {
    /// SAELens's defaults: BOS first and between rows, rows concatenated.
    pub fn new(context_size: usize) -> Self {
        WindowConfig { context_size, prepend_bos: true, separator: Separator::Bos, disable_concat: false }
    }

    /// The special token ids for a tokenizer whose BOS is `bos`.
    pub fn special_ids(&self, bos: Option<u32>) -> SpecialIds {
        SpecialIds {
            begin_batch: bos.filter(|_| self.prepend_bos),
            begin_sequence: None,
            separator: match self.separator {
                Separator::Bos => bos,
                Separator::Token(t) => Some(t),
                Separator::None => None,
            },
        }
    }
}

/// The token ids `concat_and_batch_sequences` takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SpecialIds {
    /// First token of every window.
    pub begin_batch: Option<u32>,
    /// First token of every row.
    pub begin_sequence: Option<u32>,
    /// Between rows inside a window.
    pub separator: Option<u32>,
}

/// `concat_and_batch_sequences` over token rows: windows of exactly `context_size` tokens.
pub struct Concat<I> {
    rows: I,
    ctx: usize,
    ids: SpecialIds,
    disable_concat: bool,
    row: Vec<u32>,
    offset: usize,
    is_start: bool,
    batch: Option<Vec<u32>>,
    /// Rows taken from `rows` so far.
    taken: u64,
}

impl<I: Iterator<Item = Result<Vec<u32>>>> Concat<I> {
    /// Windows of `ctx` tokens. `ctx` must exceed the number of special tokens a window can
    /// begin with (else no row token would ever be taken).
    pub fn new(rows: I, ctx: usize, mut ids: SpecialIds, disable_concat: bool) -> Result<Self> {
        // As SAELens: without concatenation the window's first token starts each row. (Its
        // test is Python truthiness, so a BOS of id 0 is not used there; kept, for exactness.)
        if disable_concat && ids.begin_sequence.is_none() && ids.begin_batch.is_some_and(|b| b != 0) {
            ids.begin_sequence = ids.begin_batch;
        }
        let prefix = ids.begin_batch.is_some() as usize + ids.begin_sequence.is_some() as usize;
        if ctx <= prefix.max(1) {
            return Err(DataError::Spec { spec: "context_size".into(), msg: format!("{ctx} is too short: expected more than {} tokens", prefix.max(1)) });
        }
        Ok(Concat { rows, ctx, ids, disable_concat, row: Vec::new(), offset: 0, is_start: true, batch: None, taken: 0 })
    }

    /// The next row, counted.
    fn next_row(&mut self) -> Option<Result<Vec<u32>>> {
        let r = self.rows.next()?;
        self.taken += 1;
        Some(r)
    }

    /// Where the next window begins (at a window's end: nothing is held part-cut besides
    /// the current row), with `windows` handed out.
    pub fn cursor(&self, windows: u64) -> WindowPosition {
        WindowPosition { windows, rows: self.taken, offset: self.offset, row_start: self.is_start }
    }

    /// Go to `at` from the start: the rows before its row are taken and dropped (whoever
    /// makes `rows` may give them cheaply), its row taken as the current one.
    pub fn seek(&mut self, at: &WindowPosition) -> Result<()> {
        if self.taken != 0 {
            return Err(started(&self.cursor(0)));
        }
        for _ in 0..at.rows {
            self.row = self.next_row().ok_or_else(|| ended_before(at))??;
        }
        (self.offset, self.is_start, self.batch) = (at.offset, at.row_start, None);
        Ok(())
    }

    /// SAELens's `_add_tokens_to_batch`: fill the current window from `row[offset..]`.
    fn add_tokens(&mut self) {
        let (ctx, row) = (self.ctx, &self.row);
        let mut prefix: Vec<u32> = Vec::with_capacity(2);
        let mut first = row[self.offset];
        if self.is_start
            && let Some(b) = self.ids.begin_sequence
            && first != b
        {
            prefix.insert(0, b);
            first = b;
        }
        match &mut self.batch {
            None => {
                if let Some(b) = self.ids.begin_batch
                    && first != b
                {
                    prefix.insert(0, b);
                }
                let need = ctx.saturating_sub(prefix.len());
                let mut window = prefix[..prefix.len().min(ctx)].to_vec();
                window.extend_from_slice(&row[self.offset..(self.offset + need).min(row.len())]);
                self.batch = Some(window);
                self.offset += need;
            }
            Some(window) => {
                if let Some(s) = self.ids.separator
                    && first != s
                {
                    prefix.insert(0, s);
                }
                let need = ctx.saturating_sub(window.len() + prefix.len());
                let prefix_need = ctx.saturating_sub(window.len());
                window.extend_from_slice(&prefix[..prefix.len().min(prefix_need)]);
                window.extend_from_slice(&row[self.offset..(self.offset + need).min(row.len())]);
                self.offset += need;
            }
        }
    }

    fn next_unconcatenated(&mut self) -> Option<Result<Vec<u32>>> {
        loop {
            let mut seq = match self.next_row()? {
                Ok(s) => s,
                Err(e) => return Some(Err(e)),
            };
            if let Some(b) = self.ids.begin_sequence
                && seq.first().is_some_and(|&f| f != b)
                && seq.len() + 1 >= self.ctx
            {
                seq.truncate(self.ctx - 1);
                seq.insert(0, b);
            }
            if seq.len() >= self.ctx {
                seq.truncate(self.ctx);
                return Some(Ok(seq));
            }
        }
    }
}

impl<I: Iterator<Item = Result<Vec<u32>>>> Iterator for Concat<I> {
    type Item = Result<Vec<u32>>;

    fn next(&mut self) -> Option<Result<Vec<u32>>> {
        if self.disable_concat {
            return self.next_unconcatenated();
        }
        loop {
            while self.offset >= self.row.len() {
                match self.next_row()? {
                    Ok(r) => (self.row, self.offset, self.is_start) = (r, 0, true),
                    Err(e) => return Some(Err(e)),
                }
            }
            self.add_tokens();
            self.is_start = false;
            if self.batch.as_ref().is_some_and(|b| b.len() == self.ctx) {
                return self.batch.take().map(Ok);
            }
        }
    }
}

/// A corpus's rows as token rows; the next `skip` rows are given empty, not tokenized
/// (seeking reads past them).
type TokenRows<'t> = Box<dyn Iterator<Item = Result<Vec<u32>>> + 't>;

/// The windows of a corpus: text rows tokenized and concatenated ([`Concat`]), or
/// pretokenized rows cut to the context, whichever the first row is. A [`WindowStream`]:
/// seeking reads the rows before the position without tokenizing them.
pub struct Windows<'t> {
    cut: Cut<'t>,
    /// Rows still to give empty (seeking).
    skip: Arc<AtomicU64>,
    windows: u64,
    /// Whether the corpus holds token ids (an integer column) rather than text.
    pub pretokenized: bool,
}

enum Cut<'t> {
    /// Pretokenized rows, a window each.
    Rows(TokenRows<'t>),
    Concat(Concat<TokenRows<'t>>),
}

impl<'t> Windows<'t> {
    /// Windows of `rows` under `cfg`; text is encoded by `tokenizer`, whose BOS id is `bos`.
    pub fn new(mut rows: Rows, tokenizer: Option<&'t Tokenizer>, bos: Option<u32>, cfg: &WindowConfig) -> Result<Self> {
        let first = rows.next().transpose()?;
        let pretokenized = matches!(first, Some(Row::Tokens(_)));
        let path = rows.current_file().map(|p| p.to_path_buf()).unwrap_or_default();
        let all = first.map(Ok).into_iter().chain(rows);
        let ctx = cfg.context_size;
        let skip = Arc::new(AtomicU64::new(0));
        let skipping = skip.clone();
        let skipped = move || skipping.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1)).is_ok();
        let cut = if pretokenized {
            Cut::Rows(Box::new(all.map(move |row| match row? {
                _ if skipped() => Ok(Vec::new()),
                Row::Tokens(t) if t.len() >= ctx => Ok(t[..ctx].to_vec()),
                Row::Tokens(t) => Err(DataError::file(&path, format!("a pretokenized row has {} tokens, fewer than context_size {ctx}", t.len()))),
                Row::Text(_) => Err(DataError::file(&path, "mixes text rows with token rows")),
            })))
        } else {
            let encode = move |row: Result<Row>| -> Result<Vec<u32>> {
                match row? {
                    _ if skipped() => Ok(Vec::new()),
                    Row::Tokens(t) => Ok(t),
                    Row::Text(text) => match tokenizer {
                        Some(tok) => tok.encode(&text).map_err(|e| DataError::file(&path, format!("cannot tokenize a row: {e}"))),
                        None => Err(DataError::file(&path, "holds text, and the model has no tokenizer to encode it")),
                    },
                }
            };
            let rows: TokenRows<'t> = Box::new(all.map(encode));
            Cut::Concat(Concat::new(rows, ctx, cfg.special_ids(bos), cfg.disable_concat)?)
        };
        Ok(Windows { cut, skip, windows: 0, pretokenized })
    }
}

impl Iterator for Windows<'_> {
    type Item = Result<Vec<u32>>;

    fn next(&mut self) -> Option<Result<Vec<u32>>> {
        let w = match &mut self.cut {
            Cut::Rows(rows) => rows.next()?,
            Cut::Concat(c) => c.next()?,
        };
        self.windows += 1;
        Some(w)
    }
}

impl WindowStream for Windows<'_> {
    fn cursor(&self) -> WindowPosition {
        match &self.cut {
            Cut::Rows(_) => WindowPosition { windows: self.windows, rows: self.windows, offset: 0, row_start: true },
            Cut::Concat(c) => c.cursor(self.windows),
        }
    }

    fn seek(&mut self, at: &WindowPosition) -> Result<()> {
        if self.windows != 0 {
            return Err(started(&self.cursor()));
        }
        match &mut self.cut {
            Cut::Rows(rows) => {
                self.skip.store(at.windows, Ordering::Relaxed);
                for _ in 0..at.windows {
                    rows.next().ok_or_else(|| ended_before(at))??;
                }
            }
            Cut::Concat(c) => {
                // The row the position is in is tokenized again; a run of rows that are each
                // a window (no concatenation) has none part-cut.
                let part_cut = !c.disable_concat && at.rows > 0;
                self.skip.store(at.rows - u64::from(part_cut), Ordering::Relaxed);
                c.seek(at)?;
            }
        }
        self.skip.store(0, Ordering::Relaxed);
        self.windows = at.windows;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cut(rows: &[&[u32]], ctx: usize, ids: SpecialIds, disable: bool) -> Vec<Vec<u32>> {
        let it = rows.iter().map(|r| Ok(r.to_vec()));
        Concat::new(it, ctx, ids, disable).unwrap().collect::<Result<_>>().unwrap()
    }

    #[test]
    fn bos_first_and_between_rows_and_rows_continue() {
        let ids = SpecialIds { begin_batch: Some(0), begin_sequence: None, separator: Some(0) };
        let w = cut(&[&[1, 2, 3], &[4, 5, 6, 7, 8, 9], &[0, 10]], 5, ids, false);
        // [BOS 1 2 3 | SEP] [BOS 4 5 6 7] [BOS 8 9 | 0 10]: a row starting with BOS gets no separator.
        assert_eq!(w, vec![vec![0, 1, 2, 3, 0], vec![0, 4, 5, 6, 7], vec![0, 8, 9, 0, 10]]);
    }

    #[test]
    fn without_concatenation_short_rows_are_skipped() {
        let ids = SpecialIds { begin_batch: Some(9), begin_sequence: None, separator: None };
        let w = cut(&[&[1, 2], &[1, 2, 3], &[1, 2, 3, 4, 5]], 4, ids, true);
        assert_eq!(w, vec![vec![9, 1, 2, 3], vec![9, 1, 2, 3]]);
    }

    #[test]
    fn a_context_with_no_room_for_tokens_is_refused() {
        let ids = SpecialIds { begin_batch: Some(0), begin_sequence: Some(1), separator: None };
        assert!(Concat::new(std::iter::empty(), 2, ids, false).is_err());
    }
}
