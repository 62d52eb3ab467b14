//! Where a stream of windows stands, and going back there: a resumed run seeks to the
//! position its checkpoint saved instead of cutting every window before it again (a text
//! corpus's earlier rows are read past without being tokenized, only the row the position
//! is in is tokenized again).

use serde::{Deserialize, Serialize};

use crate::error::{DataError, Result};

/// Where a stream of windows stands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WindowPosition {
    /// Windows handed out.
    pub windows: u64,
    /// Rows taken from the corpus (the last one possibly cut into windows only in part).
    pub rows: u64,
    /// Tokens of that last row already cut into windows.
    pub offset: usize,
    /// Whether that row's next token is its first (SAELens's `is_start`).
    pub row_start: bool,
}

/// A stream of windows that knows its position and can go to one.
pub trait WindowStream: Iterator<Item = Result<Vec<u32>>> {
    fn cursor(&self) -> WindowPosition;

    /// Go to `at`, a position this corpus under the same settings gave, from the stream's
    /// start (a stream that has handed out windows is refused).
    fn seek(&mut self, at: &WindowPosition) -> Result<()>;
}

/// The error of a corpus that ends before a saved position.
pub(crate) fn ended_before(at: &WindowPosition) -> DataError {
    DataError::Spec {
        spec: "resume".into(),
        msg: format!("the corpus ends before the position the checkpoint saved ({} windows, {} rows): is it the same corpus?", at.windows, at.rows),
    }
}

/// The error of seeking a stream that has started.
pub(crate) fn started(from: &WindowPosition) -> DataError {
    DataError::Spec { spec: "resume".into(), msg: format!("a stream of windows seeks from its start only (it has handed out {})", from.windows) }
}

/// Any iterator of windows as a [`WindowStream`] (synthetic corpora, tests): its position
/// counts the windows handed out; seeking draws and drops the windows before it.
pub struct Counted<I> {
    inner: I,
    windows: u64,
}

impl<I> Counted<I> {
    pub fn new(inner: I) -> Self {
        Counted { inner, windows: 0 }
    }
}

impl<I: Iterator<Item = Result<Vec<u32>>>> Iterator for Counted<I> {
    type Item = Result<Vec<u32>>;

    fn next(&mut self) -> Option<Result<Vec<u32>>> {
        let w = self.inner.next()?;
        self.windows += 1;
        Some(w)
    }
}

impl<I: Iterator<Item = Result<Vec<u32>>>> WindowStream for Counted<I> {
    fn cursor(&self) -> WindowPosition {
        WindowPosition { windows: self.windows, ..WindowPosition::default() }
    }

    fn seek(&mut self, at: &WindowPosition) -> Result<()> {
        if self.windows != 0 {
            return Err(started(&self.cursor()));
        }
        for _ in 0..at.windows {
            self.next().ok_or_else(|| ended_before(at))??;
        }
        Ok(())
    }
}
