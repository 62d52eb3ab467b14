//! Writing files so that a crash, a full disk or Ctrl-C never leaves a half-written file
//! where a good one was: the bytes go to a temporary file beside the target, are flushed
//! to the disk (`fsync`), and only then renamed over the target; the directory is synced
//! too, so the rename itself survives a power cut. The one writer every crate uses, and the
//! one safetensors writer on top of it.

use std::io::Write;
use std::path::{Path, PathBuf};

/// An I/O error and the file it happened to: what every writer here returns, so that each
/// crate's error type takes it with `?` (a `From` impl) and names the file, instead of each
/// call site mapping the error by hand.
#[derive(Debug, thiserror::Error)]
#[error("{}: {source}", path.display())]
pub struct FileError {
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

impl From<FileError> for std::io::Error {
    fn from(e: FileError) -> Self {
        std::io::Error::new(e.source.kind(), e)
    }
}

/// `result` with its error naming `path`.
fn at<T>(path: &Path, result: std::io::Result<T>) -> Result<T, FileError> {
    result.map_err(|source| FileError { path: path.to_path_buf(), source })
}

/// Write `bytes` to `path` atomically and durably. On error the temporary file is removed
/// and `path` is untouched.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), FileError> {
    write_atomic_with(path, |tmp| std::fs::File::create(tmp)?.write_all(bytes))
}

/// [`write_atomic`] for a writer that streams the file itself (too large to hold as one
/// buffer): `write` creates and fills the temporary path it is given.
pub fn write_atomic_with(path: &Path, write: impl FnOnce(&Path) -> std::io::Result<()>) -> Result<(), FileError> {
    at(path, write_atomic_io(path, write))
}

fn write_atomic_io(path: &Path, write: impl FnOnce(&Path) -> std::io::Result<()>) -> std::io::Result<()> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a file path"))?;
    let tmp = dir.join(format!(".{}.tmp-{}", name.to_string_lossy(), std::process::id()));
    let result = write(&tmp).and_then(|_| std::fs::File::open(&tmp)?.sync_all()).and_then(|_| std::fs::rename(&tmp, path));
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    // Best effort: some file systems cannot open or sync a directory.
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// [`write_atomic`] without the flushes to disk, for folders of many small files written
/// together (a flush each made thousands of files take minutes): a crash still never leaves a
/// half-written file under `path`, but a power cut may lose the newest ones.
pub fn write_replacing(path: &Path, bytes: &[u8]) -> Result<(), FileError> {
    at(path, write_replacing_io(path, bytes))
}

fn write_replacing_io(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a file path"))?;
    let tmp = dir.join(format!(".{}.tmp-{}", name.to_string_lossy(), std::process::id()));
    let result = std::fs::File::create(&tmp).and_then(|mut f| f.write_all(bytes)).and_then(|_| std::fs::rename(&tmp, path));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// A tensor as a safetensors file holds it: name, dtype, shape and little-endian bytes.
pub struct FileTensor<'a> {
    pub name: &'a str,
    pub dtype: safetensors::Dtype,
    pub shape: Vec<usize>,
    pub bytes: &'a [u8],
}

/// f32 values as the little-endian bytes a file stores.
pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// i64 values as the little-endian bytes a file stores.
pub fn i64_bytes(v: &[i64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// `tensors` (and `metadata`, the header's `__metadata__`) as a safetensors file at `path`,
/// written as [`write_atomic`] writes and streamed into the temporary file (never a second
/// copy of the bytes in memory). A shape that does not match its bytes is an error naming the
/// tensor.
pub fn write_safetensors(path: &Path, tensors: &[FileTensor], metadata: Option<std::collections::HashMap<String, String>>) -> Result<(), FileError> {
    let views = tensors
        .iter()
        .map(|t| {
            let view = safetensors::tensor::TensorView::new(t.dtype, t.shape.clone(), t.bytes)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("tensor {}: {e}", t.name)))?;
            Ok((t.name, view))
        })
        .collect::<std::io::Result<Vec<_>>>();
    let views = at(path, views)?;
    write_atomic_with(path, |tmp| safetensors::serialize_to_file(views, metadata, tmp).map_err(std::io::Error::other))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_the_file_and_leaves_no_temporary_behind() {
        let tmp = std::env::temp_dir().join(format!("burnlens-files-{}", std::process::id()));
        std::fs::create_dir_all(&tmp).unwrap();
        let p = tmp.join("a.json");
        write_atomic(&p, b"one").unwrap();
        write_atomic(&p, b"two").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        let names: Vec<_> = std::fs::read_dir(&tmp).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names.len(), 1, "{names:?}");
        // A target in a missing directory fails and creates nothing.
        let e = write_atomic(&tmp.join("missing/b.json"), b"x").unwrap_err();
        // The error names the file once, and keeps the cause and its kind through io::Error.
        assert_eq!(e.to_string().matches("b.json").count(), 1, "{e}");
        assert_eq!(std::io::Error::from(e).kind(), std::io::ErrorKind::NotFound);
        std::fs::remove_dir_all(&tmp).unwrap();
    }
}
