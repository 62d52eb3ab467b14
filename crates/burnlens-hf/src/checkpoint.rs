//! Reading the tensors of a Hugging Face model directory through `burn-store`.
//!
//! A directory holds one of: `model.safetensors`; `model.safetensors.index.json` with its
//! shards; `pytorch_model.bin` (zip or legacy pickle format); `pytorch_model.bin.index.json`
//! with its shards. Tensors stay lazy (memory-mapped or unread) until asked for, so a
//! tensor that is never used costs nothing.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use burn::tensor::{DType, TensorData};
use burn_store::burn_pack::Tensor as PackTensor;
use burn_store::{ModuleStore, PytorchStore, SafetensorsStore, bridge};

use crate::error::{HfError, Result};

/// How the weights of a directory are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightFormat {
    Safetensors,
    ShardedSafetensors,
    PytorchBin,
    ShardedPytorchBin,
}

impl std::fmt::Display for WeightFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            WeightFormat::Safetensors => "safetensors",
            WeightFormat::ShardedSafetensors => "sharded safetensors",
            WeightFormat::PytorchBin => "pytorch_model.bin",
            WeightFormat::ShardedPytorchBin => "sharded pytorch_model.bin",
        })
    }
}

/// The tensors of a model directory, by name, not yet read.
pub struct Checkpoint {
    pub dir: PathBuf,
    pub format: WeightFormat,
    /// The weight files, in the order they were opened.
    pub files: Vec<PathBuf>,
    tensors: BTreeMap<String, (PackTensor, usize)>,
}

impl Checkpoint {
    /// Find and open the weights in `dir`.
    pub fn open(dir: &Path) -> Result<Self> {
        if !dir.is_dir() {
            let e = std::io::Error::new(std::io::ErrorKind::NotFound, "not a directory (expected a Hugging Face model directory)");
            return Err(HfError::io(dir, e));
        }
        let candidates = [
            ("model.safetensors", WeightFormat::Safetensors),
            ("model.safetensors.index.json", WeightFormat::ShardedSafetensors),
            ("pytorch_model.bin", WeightFormat::PytorchBin),
            ("pytorch_model.bin.index.json", WeightFormat::ShardedPytorchBin),
        ];
        let (file, format) = candidates
            .iter()
            .map(|(f, fmt)| (dir.join(f), *fmt))
            .find(|(p, _)| p.is_file())
            .ok_or_else(|| HfError::NoWeights { dir: dir.to_path_buf() })?;
        let files = match format {
            WeightFormat::Safetensors | WeightFormat::PytorchBin => vec![file],
            WeightFormat::ShardedSafetensors | WeightFormat::ShardedPytorchBin => shard_files(&file)?,
        };
        let mut ckpt = Checkpoint { dir: dir.to_path_buf(), format, files: files.clone(), tensors: BTreeMap::new() };
        for (i, path) in files.iter().enumerate() {
            let tensors = match format {
                WeightFormat::Safetensors | WeightFormat::ShardedSafetensors => read_safetensors(path)?,
                _ => read_pytorch(path)?,
            };
            for t in tensors {
                ckpt.tensors.insert(t.name.clone(), (t, i));
            }
        }
        Ok(ckpt)
    }

    /// Every tensor name, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// Shape of a tensor, without reading it.
    pub fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.tensors.get(name).map(|(t, _)| t.shape.to_vec())
    }

    /// Storage dtype of a tensor, without reading it.
    pub fn dtype(&self, name: &str) -> Option<DType> {
        self.tensors.get(name).map(|(t, _)| t.dtype)
    }

    /// The file a tensor lives in.
    pub fn file_of(&self, name: &str) -> &Path {
        self.tensors.get(name).map_or(&self.dir, |(_, i)| &self.files[*i])
    }

    /// Read tensor `name`, check its shape against `expected`, and convert it to `f32`.
    pub fn read_f32(&self, name: &str, expected: &[usize]) -> Result<TensorData> {
        let (t, i) = self.tensors.get(name).ok_or_else(|| HfError::MissingTensor {
            path: self.files.first().cloned().unwrap_or_else(|| self.dir.clone()),
            name: name.to_string(),
            expected: expected.to_vec(),
        })?;
        let path = &self.files[*i];
        if t.shape.as_slice() != expected {
            return Err(HfError::Shape { path: path.clone(), name: name.to_string(), expected: expected.to_vec(), found: t.shape.to_vec() });
        }
        if !matches!(t.dtype, DType::F32 | DType::F16 | DType::BF16 | DType::F64) {
            return Err(HfError::Dtype { path: path.clone(), name: name.to_string(), found: dtype_name(t.dtype).into() });
        }
        let data = bridge::into_data(t.clone()).map_err(|e| HfError::checkpoint(path, format!("tensor `{name}`: {e}")))?;
        Ok(if data.dtype() == DType::F32 { data } else { data.convert::<f32>() })
    }
}

/// Lower-case dtype name as users know it from PyTorch (`f32`, `bf16`, ...).
pub fn dtype_name(dtype: DType) -> &'static str {
    match dtype {
        DType::F64 => "f64",
        DType::F32 | DType::Flex32 => "f32",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::I64 => "i64",
        DType::I32 => "i32",
        DType::I16 => "i16",
        DType::I8 => "i8",
        DType::U64 => "u64",
        DType::U32 => "u32",
        DType::U16 => "u16",
        DType::U8 => "u8",
        DType::Bool(_) => "bool",
        _ => "other",
    }
}

/// The distinct shard files named by an index, in first-mention order.
fn shard_files(index: &Path) -> Result<Vec<PathBuf>> {
    let text = std::fs::read_to_string(index).map_err(|e| HfError::io(index, e))?;
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| HfError::Json { path: index.into(), msg: e.to_string() })?;
    let map = value.get("weight_map").and_then(|m| m.as_object()).ok_or_else(|| HfError::Field {
        path: index.into(),
        field: "weight_map".into(),
        msg: "is missing; expected an object mapping tensor names to shard files".into(),
    })?;
    let dir = index.parent().unwrap_or(Path::new("."));
    let mut files: Vec<PathBuf> = Vec::new();
    for (name, file) in map {
        let file = file.as_str().ok_or_else(|| HfError::Field {
            path: index.into(),
            field: format!("weight_map.{name}"),
            msg: format!("must be a file name, found {file}"),
        })?;
        let path = dir.join(file);
        if !files.contains(&path) {
            if !path.is_file() {
                let e = std::io::Error::new(std::io::ErrorKind::NotFound, format!("shard named by {} is missing", index.display()));
                return Err(HfError::io(path, e));
            }
            files.push(path);
        }
    }
    if files.is_empty() {
        return Err(HfError::Field { path: index.into(), field: "weight_map".into(), msg: "is empty".into() });
    }
    Ok(files)
}

fn read_safetensors(path: &Path) -> Result<Vec<PackTensor>> {
    let mut store = SafetensorsStore::from_file(path);
    let tensors = store
        .get_all_tensors()
        .map_err(|e| HfError::checkpoint(path, format!("not a readable safetensors file (truncated or corrupt?): {e}")))?;
    Ok(tensors.values().cloned().collect())
}

fn read_pytorch(path: &Path) -> Result<Vec<PackTensor>> {
    let mut store = PytorchStore::from_file(path);
    let tensors = store
        .get_all_tensors()
        .map_err(|e| HfError::checkpoint(path, format!("not a readable PyTorch checkpoint (truncated or corrupt?): {e}")))?;
    Ok(tensors.values().cloned().collect())
}
