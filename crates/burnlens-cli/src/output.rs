//! Writing result files: atomically (a temporary file beside the target, then a rename), so
//! an interrupted run never leaves a half-written file where a good one was.

use std::path::Path;

use anyhow::{Context, Result};
use safetensors::{Dtype, tensor::TensorView};

use crate::UserError;

/// A tensor to save: name, shape and values.
pub enum Saved {
    F32(String, Vec<usize>, Vec<f32>),
    I64(String, Vec<usize>, Vec<i64>),
}

/// Write `bytes` to `path` through [`burnlens_hf::write_atomic`] (temporary file, fsync,
/// rename), with errors for the user.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if !dir.is_dir() {
        return Err(UserError(format!("{}: the output directory {} does not exist", path.display(), dir.display())).into());
    }
    if path.file_name().is_none() {
        return Err(UserError(format!("{}: not a file path", path.display())).into());
    }
    burnlens_hf::write_atomic(path, bytes).map_err(|e| UserError(format!("{}: cannot write: {e}", path.display())).into())
}

/// Serialise tensors as a safetensors file and write it atomically.
pub fn write_safetensors(path: &Path, tensors: &[Saved]) -> Result<()> {
    let bytes: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|t| match t {
            Saved::F32(n, s, v) => (n.clone(), Dtype::F32, s.clone(), v.iter().flat_map(|x| x.to_le_bytes()).collect()),
            Saved::I64(n, s, v) => (n.clone(), Dtype::I64, s.clone(), v.iter().flat_map(|x| x.to_le_bytes()).collect()),
        })
        .collect();
    let views =
        bytes.iter().map(|(n, dt, s, b)| Ok((n.as_str(), TensorView::new(*dt, s.clone(), b).context("building tensor view")?))).collect::<Result<Vec<_>>>()?;
    let data = safetensors::serialize(views, None).context("serialising safetensors")?;
    write_atomic(path, &data)
}
