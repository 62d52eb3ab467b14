//! Rows of a corpus, read one at a time from its files: a line of a text file, one JSON
//! object of a `.jsonl` file, one row of a parquet file (read by record batches of
//! [`PARQUET_BATCH_ROWS`], projected on the one column used). A row is text to tokenize or
//! tokens already (an integer-list column, as `pretokenize` writes `tokens` / `input_ids`).

use std::fs::File;
use std::io::{BufRead, BufReader, Lines};
use std::path::{Path, PathBuf};

use arrow_array::cast::AsArray;
use arrow_array::types::{Int16Type, Int32Type, Int64Type, UInt16Type, UInt32Type, UInt64Type};
use arrow_array::{Array, ArrayRef};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};

use crate::error::{DataError, Result};
use crate::shards::Format;

/// Rows per parquet record batch: the memory a parquet shard holds at once.
pub const PARQUET_BATCH_ROWS: usize = 1024;

/// The columns looked for when none is named, in SAELens's order: tokens first.
pub const AUTO_COLUMNS: &[&str] = &["tokens", "input_ids", "text"];

/// One row of a corpus.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Row {
    Text(String),
    Tokens(Vec<u32>),
}

/// Which column (jsonl field) holds the rows; `None` takes the first of [`AUTO_COLUMNS`]
/// the file has. Text files have no columns: each line is a text row.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Column(pub Option<String>);

/// The rows of a list of files, in order.
pub struct Rows {
    files: Vec<PathBuf>,
    column: Column,
    next_file: usize,
    current: Option<FileRows>,
}

impl Rows {
    pub fn new(files: Vec<PathBuf>, column: Column) -> Self {
        Rows { files, column, next_file: 0, current: None }
    }

    /// The file being read (for messages).
    pub fn current_file(&self) -> Option<&Path> {
        self.next_file.checked_sub(1).and_then(|i| self.files.get(i)).map(|p| p.as_path())
    }
}

impl Iterator for Rows {
    type Item = Result<Row>;

    fn next(&mut self) -> Option<Result<Row>> {
        loop {
            if let Some(cur) = &mut self.current {
                match cur.next() {
                    Some(row) => return Some(row),
                    None => self.current = None,
                }
            }
            let path = self.files.get(self.next_file)?.clone();
            self.next_file += 1;
            match FileRows::open(&path, &self.column) {
                Ok(r) => self.current = Some(r),
                Err(e) => {
                    self.next_file = self.files.len();
                    return Some(Err(e));
                }
            }
        }
    }
}

/// The rows of one file.
enum FileRows {
    Text { lines: Lines<BufReader<File>>, path: PathBuf },
    Jsonl { lines: Lines<BufReader<File>>, path: PathBuf, column: Column, line: usize },
    Parquet { reader: ParquetRecordBatchReader, path: PathBuf, column: String, batch: Vec<Row>, at: usize },
}

impl FileRows {
    fn open(path: &Path, column: &Column) -> Result<Self> {
        let open = || File::open(path).map_err(|e| DataError::file(path, format!("cannot open: {e}")));
        let path_buf = path.to_path_buf();
        match Format::of(path) {
            Some(Format::Text) => Ok(FileRows::Text { lines: BufReader::new(open()?).lines(), path: path_buf }),
            Some(Format::Jsonl) => Ok(FileRows::Jsonl { lines: BufReader::new(open()?).lines(), path: path_buf, column: column.clone(), line: 0 }),
            Some(Format::Parquet) => open_parquet(path, open()?, column),
            None => Err(DataError::file(path, "not a dataset file (expected .txt, .jsonl, .json or .parquet)")),
        }
    }
}

fn open_parquet(path: &Path, file: File, column: &Column) -> Result<FileRows> {
    let bad = |e: parquet::errors::ParquetError| DataError::file(path, format!("not a readable parquet file: {e}"));
    let builder = ParquetRecordBatchReaderBuilder::try_new(file).map_err(bad)?;
    let names: Vec<String> = builder.schema().fields().iter().map(|f| f.name().clone()).collect();
    let name = pick_column(path, column, |c| names.iter().any(|n| n == c), &names.join(", "))?;
    let index = names.iter().position(|n| *n == name).expect("picked from the names");
    let mask = ProjectionMask::roots(builder.parquet_schema(), [index]);
    let reader = builder.with_projection(mask).with_batch_size(PARQUET_BATCH_ROWS).build().map_err(bad)?;
    Ok(FileRows::Parquet { reader, path: path.to_path_buf(), column: name, batch: Vec::new(), at: 0 })
}

/// The column to read: the one named (which must exist), else the first of [`AUTO_COLUMNS`].
fn pick_column(path: &Path, column: &Column, has: impl Fn(&str) -> bool, listing: &str) -> Result<String> {
    match &column.0 {
        Some(c) if has(c) => Ok(c.clone()),
        Some(c) => Err(DataError::column(path, c, format!("not there (the file has: {listing})"))),
        None => {
            AUTO_COLUMNS.iter().find(|c| has(c)).map(|c| c.to_string()).ok_or_else(|| {
                DataError::file(path, format!("has none of the columns {} (it has: {listing}); name one with --column", AUTO_COLUMNS.join(", ")))
            })
        }
    }
}

impl Iterator for FileRows {
    type Item = Result<Row>;

    fn next(&mut self) -> Option<Result<Row>> {
        match self {
            FileRows::Text { lines, path } => loop {
                match lines.next()? {
                    // Empty lines tokenize to nothing: skipping them changes no window.
                    Ok(l) if l.is_empty() => continue,
                    Ok(l) => return Some(Ok(Row::Text(l))),
                    Err(e) => return Some(Err(DataError::file(path, format!("cannot read: {e}")))),
                }
            },
            FileRows::Jsonl { lines, path, column, line } => loop {
                *line += 1;
                match lines.next()? {
                    Ok(l) if l.trim().is_empty() => continue,
                    Ok(l) => return Some(json_row(path, *line, &l, column)),
                    Err(e) => return Some(Err(DataError::file(path, format!("cannot read: {e}")))),
                }
            },
            FileRows::Parquet { reader, path, column, batch, at } => {
                while *at == batch.len() {
                    let rb = match reader.next()? {
                        Ok(rb) => rb,
                        Err(e) => return Some(Err(DataError::file(path, format!("cannot read a record batch: {e}")))),
                    };
                    match arrow_rows(path, column, rb.column(0)) {
                        Ok(rows) => (*batch, *at) = (rows, 0),
                        Err(e) => return Some(Err(e)),
                    }
                }
                *at += 1;
                Some(Ok(std::mem::replace(&mut batch[*at - 1], Row::Tokens(Vec::new()))))
            }
        }
    }
}

fn json_row(path: &Path, line: usize, text: &str, column: &Column) -> Result<Row> {
    let at = |msg: String| DataError::file(path, format!("line {line}: {msg}"));
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| at(format!("not valid JSON: {e}")))?;
    let obj = v.as_object().ok_or_else(|| at("expected a JSON object per line".into()))?;
    let keys: Vec<&str> = obj.keys().map(|k| k.as_str()).collect();
    let name = pick_column(path, column, |c| obj.contains_key(c), &keys.join(", ")).map_err(|e| at(e.to_string()))?;
    match &obj[&name] {
        serde_json::Value::String(s) => Ok(Row::Text(s.clone())),
        serde_json::Value::Array(a) => a
            .iter()
            .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()))
            .collect::<Option<Vec<u32>>>()
            .map(Row::Tokens)
            .ok_or_else(|| DataError::column(path, &name, format!("line {line}: expected token ids (integers from 0 to 2^32-1)"))),
        other => Err(DataError::column(path, &name, format!("line {line}: expected a string or a list of token ids, found {other}"))),
    }
}

/// The rows of one record batch's column: strings are text, integer lists are tokens.
fn arrow_rows(path: &Path, column: &str, array: &ArrayRef) -> Result<Vec<Row>> {
    let wrong = || DataError::column(path, column, format!("has type {}; expected a string or a list of integers", array.data_type()));
    let texts: Option<Vec<Option<&str>>> = if let Some(a) = array.as_string_opt::<i32>() {
        Some(a.iter().collect())
    } else if let Some(a) = array.as_string_opt::<i64>() {
        Some(a.iter().collect())
    } else {
        array.as_string_view_opt().map(|a| a.iter().collect())
    };
    if let Some(texts) = texts {
        return Ok(texts.into_iter().map(|t| Row::Text(t.unwrap_or_default().to_string())).collect());
    }
    let lists: Vec<Option<ArrayRef>> = if let Some(a) = array.as_list_opt::<i32>() {
        a.iter().collect()
    } else if let Some(a) = array.as_list_opt::<i64>() {
        a.iter().collect()
    } else {
        return Err(wrong());
    };
    lists.into_iter().map(|l| l.map_or(Ok(Vec::new()), |l| token_ids(&l).ok_or_else(wrong)).map(Row::Tokens)).collect()
}

/// An integer array as token ids (`None` if it is not integers or one is out of range).
fn token_ids(a: &ArrayRef) -> Option<Vec<u32>> {
    fn ids<T: TryInto<u32> + Copy>(v: impl Iterator<Item = Option<T>>) -> Option<Vec<u32>> {
        v.map(|t| t.and_then(|t| t.try_into().ok())).collect()
    }
    if a.null_count() > 0 {
        return None;
    }
    if let Some(p) = a.as_primitive_opt::<Int64Type>() {
        ids(p.iter())
    } else if let Some(p) = a.as_primitive_opt::<Int32Type>() {
        ids(p.iter())
    } else if let Some(p) = a.as_primitive_opt::<UInt32Type>() {
        ids(p.iter())
    } else if let Some(p) = a.as_primitive_opt::<UInt16Type>() {
        ids(p.iter())
    } else if let Some(p) = a.as_primitive_opt::<Int16Type>() {
        ids(p.iter())
    } else if let Some(p) = a.as_primitive_opt::<UInt64Type>() {
        ids(p.iter())
    } else {
        None
    }
}
