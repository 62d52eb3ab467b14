//! The files a dataset is read from: one file, or every data file under a folder in path
//! order (shards named `…-00000-of-00004` read in their order).

use std::path::{Path, PathBuf};

use crate::error::{DataError, Result};

/// The kinds of file a corpus may be made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// One row per line.
    Text,
    /// One JSON object per line.
    Jsonl,
    Parquet,
}

impl Format {
    /// The format a file's name says, if it is a data file.
    pub fn of(path: &Path) -> Option<Format> {
        match path.extension()?.to_str()? {
            "txt" => Some(Format::Text),
            "jsonl" | "json" => Some(Format::Jsonl),
            "parquet" => Some(Format::Parquet),
            _ => None,
        }
    }
}

/// Whether `path` names a file the readers understand.
pub fn is_data_file(path: &Path) -> bool {
    Format::of(path).is_some()
}

/// The data files of `path` (a file, or a folder searched recursively, sorted by path),
/// those of `split` only when given. An empty result is an error naming the folder.
pub fn shard_files(path: &Path, split: Option<&str>) -> Result<Vec<PathBuf>> {
    if path.is_file() {
        return match Format::of(path) {
            Some(_) => Ok(vec![path.to_path_buf()]),
            None => Err(DataError::file(path, "not a dataset file (expected .txt, .jsonl, .json or .parquet)")),
        };
    }
    let mut out = Vec::new();
    walk(path, path, split, &mut out)?;
    out.sort();
    if out.is_empty() {
        let which = split.map(|s| format!(" of split `{s}`")).unwrap_or_default();
        return Err(DataError::file(path, format!("holds no .txt, .jsonl, .json or .parquet files{which}")));
    }
    Ok(out)
}

fn walk(root: &Path, dir: &Path, split: Option<&str>, out: &mut Vec<PathBuf>) -> Result<()> {
    let entries = std::fs::read_dir(dir).map_err(|e| DataError::file(dir, format!("cannot read the folder: {e}")))?;
    for entry in entries {
        let path = entry.map_err(|e| DataError::file(dir, e.to_string()))?.path();
        // Hidden entries (`.cache`, `.git`, `.incomplete` downloads) are never data.
        if path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with('.')) {
            continue;
        }
        if path.is_dir() {
            walk(root, &path, split, out)?;
        } else if is_data_file(&path) {
            let rel = path.strip_prefix(root).unwrap_or(&path).to_string_lossy().replace('\\', "/");
            if in_split(&rel, split) {
                out.push(path);
            }
        }
    }
    Ok(())
}

/// Whether a file of a dataset repository belongs to `split`, by the Hub's file-naming
/// conventions: a folder named after it (`train/…`), or a file name that starts with it
/// followed by `-`, `_` or `.` (`data/train-00000-of-00002.parquet`, `test.jsonl`).
pub fn in_split(path: &str, split: Option<&str>) -> bool {
    let Some(split) = split else { return true };
    let mut parts: Vec<&str> = path.split('/').collect();
    let name = parts.pop().unwrap_or_default();
    parts.contains(&split) || name.strip_prefix(split).is_some_and(|rest| rest.starts_with(['-', '_', '.']))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_by_folder_or_file_name() {
        assert!(in_split("data/train-00000-of-00002.parquet", Some("train")));
        assert!(in_split("train/shard_0.jsonl", Some("train")));
        assert!(in_split("test.jsonl", Some("test")));
        assert!(!in_split("data/test-00000-of-00001.parquet", Some("train")));
        assert!(!in_split("data/trainer.parquet", Some("train")));
        assert!(in_split("anything.parquet", None));
    }
}
