//! Writing result files: atomically (a temporary file beside the target, then a rename), so
//! an interrupted run never leaves a half-written file where a good one was.

use std::path::Path;

use anyhow::Result;
use safetensors::Dtype;

use crate::UserError;

/// A tensor to save: name, shape and values.
pub enum Saved {
    F32(String, Vec<usize>, Vec<f32>),
    I64(String, Vec<usize>, Vec<i64>),
}

/// Write `bytes` to `path` through [`burnlens_model::files::write_atomic`] (temporary file, fsync,
/// rename), with errors for the user.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    check_dir(path)?;
    burnlens_model::files::write_atomic(path, bytes).map_err(cannot_write)
}

/// An output path whose directory exists, or the user's error naming it.
fn check_dir(path: &Path) -> Result<()> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if !dir.is_dir() {
        return Err(UserError(format!("{}: the output directory {} does not exist", path.display(), dir.display())).into());
    }
    if path.file_name().is_none() {
        return Err(UserError(format!("{}: not a file path", path.display())).into());
    }
    Ok(())
}

/// Serialise tensors as a safetensors file and write it atomically.
pub fn write_safetensors(path: &Path, tensors: &[Saved]) -> Result<()> {
    use burnlens_model::files::{FileTensor, f32_bytes, i64_bytes};
    let bytes: Vec<(&str, Dtype, &[usize], Vec<u8>)> = tensors
        .iter()
        .map(|t| match t {
            Saved::F32(n, s, v) => (n.as_str(), Dtype::F32, s.as_slice(), f32_bytes(v)),
            Saved::I64(n, s, v) => (n.as_str(), Dtype::I64, s.as_slice(), i64_bytes(v)),
        })
        .collect();
    let files: Vec<FileTensor> = bytes.iter().map(|(n, dt, s, b)| FileTensor { name: n, dtype: *dt, shape: s.to_vec(), bytes: b }).collect();
    check_dir(path)?;
    burnlens_model::files::write_safetensors(path, &files, None).map_err(cannot_write)
}

/// A failed write as the user's error (exit 2): `PATH: cannot write: why`.
fn cannot_write(e: burnlens_model::files::FileError) -> anyhow::Error {
    UserError(format!("{}: cannot write: {}", e.path.display(), e.source)).into()
}
