//! Reading the tensors of a Hugging Face model directory through `burn-store`.
//!
//! A directory holds one of: `model.safetensors`; `model.safetensors.index.json` with its
//! shards; `pytorch_model.bin` (zip or legacy pickle format); `pytorch_model.bin.index.json`
//! with its shards. `burn-store` opens and validates every file and lists its tensors;
//! nothing is read until asked for, so a tensor that is never used costs nothing.
//!
//! A tensor kept exactly as stored (a half weight matrix loaded in its own dtype) is read in
//! place: [`Checkpoint::mapped`] hands out a view of the memory-mapped file, shared with the
//! page cache and with other processes, so loading costs no copy. Everything that is
//! converted on the way in (widened to f32, transposed, fused, `1 + w`) is read with
//! positioned reads instead, never through the map: pages touched through a map stay
//! resident until the whole map goes, so converting through it would hold the file and the
//! model in memory at once.
//!
//! Every safetensors file is checked at open to hold all the bytes its header promises, so
//! a truncated file is refused with the file and the tensor named instead of becoming a
//! SIGBUS when a mapped page past its end is first read.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use std::sync::OnceLock;

use burn::tensor::{AllocationProperty, Bytes, DType, TensorData, bf16, f16};
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

/// Where a tensor's bytes are.
enum Source {
    /// Through burn-store (PyTorch pickles).
    Pack(PackTensor),
    /// A byte range of a safetensors file.
    Range { start: u64, len: usize },
}

struct Entry {
    dtype: DType,
    shape: Vec<usize>,
    file: usize,
    source: Source,
}

/// The tensors of a model directory, by name, not yet read.
pub struct Checkpoint {
    pub dir: PathBuf,
    pub format: WeightFormat,
    /// The weight files, in the order they were opened.
    pub files: Vec<PathBuf>,
    tensors: BTreeMap<String, Entry>,
    /// Each file's read-only mapping, made when a tensor is first read in place.
    maps: Vec<OnceLock<bytes::Bytes>>,
}

/// A float type a tensor can be read as.
pub trait Elem: burn::tensor::Element + Copy + Default + Send {
    const DTYPE: DType;
    fn from_f32(v: f32) -> Self;
    fn to_f32(self) -> f32;
}

impl Elem for f32 {
    const DTYPE: DType = DType::F32;
    fn from_f32(v: f32) -> Self {
        v
    }
    fn to_f32(self) -> f32 {
        self
    }
}

impl Elem for bf16 {
    const DTYPE: DType = DType::BF16;
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
}

impl Elem for f16 {
    const DTYPE: DType = DType::F16;
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
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
        let (file, format) =
            candidates.iter().map(|(f, fmt)| (dir.join(f), *fmt)).find(|(p, _)| p.is_file()).ok_or_else(|| HfError::NoWeights { dir: dir.to_path_buf() })?;
        let files = match format {
            WeightFormat::Safetensors | WeightFormat::PytorchBin => vec![file],
            WeightFormat::ShardedSafetensors | WeightFormat::ShardedPytorchBin => shard_files(&file)?,
        };
        let maps = files.iter().map(|_| OnceLock::new()).collect();
        let mut ckpt = Checkpoint { dir: dir.to_path_buf(), format, files: files.clone(), tensors: BTreeMap::new(), maps };
        for (file, path) in files.iter().enumerate() {
            match format {
                WeightFormat::Safetensors | WeightFormat::ShardedSafetensors => {
                    // burn-store validates the file (header, offsets, length); the data
                    // ranges come from the same header.
                    let listed = read_safetensors(path)?;
                    let ranges = safetensors_ranges(path)?;
                    for t in listed {
                        let &(start, len) = ranges.get(&t.name).ok_or_else(|| HfError::checkpoint(path, format!("tensor `{}` has no data range", t.name)))?;
                        let entry = Entry { dtype: t.dtype, shape: t.shape.to_vec(), file, source: Source::Range { start, len } };
                        ckpt.tensors.insert(t.name.clone(), entry);
                    }
                }
                _ => {
                    for t in read_pytorch(path)? {
                        let entry = Entry { dtype: t.dtype, shape: t.shape.to_vec(), file, source: Source::Pack(t.clone()) };
                        ckpt.tensors.insert(t.name.clone(), entry);
                    }
                }
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
        self.tensors.get(name).map(|e| e.shape.clone())
    }

    /// Storage dtype of a tensor, without reading it.
    pub fn dtype(&self, name: &str) -> Option<DType> {
        self.tensors.get(name).map(|e| e.dtype)
    }

    /// The file a tensor lives in.
    pub fn file_of(&self, name: &str) -> &Path {
        self.tensors.get(name).map_or(&self.dir, |e| &self.files[e.file])
    }

    /// Check that tensor `name` exists with shape `expected` and a floating-point dtype,
    /// without reading it.
    pub fn check(&self, name: &str, expected: &[usize]) -> Result<()> {
        let e = self.tensors.get(name).ok_or_else(|| HfError::MissingTensor {
            path: self.files.first().cloned().unwrap_or_else(|| self.dir.clone()),
            name: name.to_string(),
            expected: expected.to_vec(),
        })?;
        let path = &self.files[e.file];
        if e.shape.as_slice() != expected {
            return Err(HfError::Shape { path: path.clone(), name: name.to_string(), expected: expected.to_vec(), found: e.shape.clone() });
        }
        if !matches!(e.dtype, DType::F32 | DType::F16 | DType::BF16 | DType::F64) {
            return Err(HfError::Dtype { path: path.clone(), name: name.to_string(), found: dtype_name(e.dtype).into() });
        }
        Ok(())
    }

    /// Read tensor `name` (checked as [`check`](Self::check) does) as `f32` values.
    pub fn read_f32(&self, name: &str, expected: &[usize]) -> Result<Vec<f32>> {
        self.read::<f32>(name, expected)
    }

    /// Read tensor `name` (checked as [`check`](Self::check) does) as `T` values: its own
    /// bytes when it is stored as `T`, else converted through f32 (rounded to nearest even
    /// when narrowing).
    pub fn read<T: Elem>(&self, name: &str, expected: &[usize]) -> Result<Vec<T>> {
        self.check(name, expected)?;
        let e = &self.tensors[name];
        let path = &self.files[e.file];
        let fail = |msg: String| HfError::checkpoint(path, format!("tensor `{name}`: {msg}"));
        match &e.source {
            Source::Pack(t) => {
                let data = bridge::into_data(t.clone()).map_err(|err| fail(err.to_string()))?;
                if e.dtype == T::DTYPE {
                    return data.try_into_vec::<T>().map_err(|err| fail(format!("{err:?}")));
                }
                let v = data.try_into_vec_as::<f32>().map_err(|err| fail(format!("{err:?}")))?;
                Ok(v.into_iter().map(T::from_f32).collect())
            }
            Source::Range { start, len } => {
                use std::os::unix::fs::FileExt;
                let file = std::fs::File::open(path).map_err(|err| HfError::io(path, err))?;
                let n: usize = e.shape.iter().product();
                let read = |buf: &mut [u8]| file.read_exact_at(buf, *start).map_err(|err| fail(format!("reading {len} bytes: {err}")));
                if e.dtype == T::DTYPE && cfg!(target_endian = "little") {
                    let mut v = vec![T::default(); n];
                    // SAFETY: T is a plain float type (any bit pattern valid), and the byte
                    // view covers exactly v.
                    read(unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), n * std::mem::size_of::<T>()) })?;
                    return Ok(v);
                }
                let size = match e.dtype {
                    DType::F64 => 8,
                    DType::F32 => 4,
                    _ => 2,
                };
                let mut raw = vec![0u8; n * size];
                read(&mut raw)?;
                let widened = raw.chunks_exact(size).map(|c| match e.dtype {
                    DType::F64 => f64::from_le_bytes(c.try_into().expect("8 bytes")) as f32,
                    DType::F32 => f32::from_le_bytes(c.try_into().expect("4 bytes")),
                    DType::F16 => f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32(),
                    _ => bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32(),
                });
                Ok(widened.map(T::from_f32).collect())
            }
        }
    }

    /// Tensor `name` (checked as [`check`](Self::check) does) read in place from its
    /// memory-mapped safetensors file, when it is stored as `dtype`; `None` when it cannot
    /// be (a PyTorch pickle, another dtype, a misaligned offset): the caller reads a copy.
    pub fn mapped(&self, name: &str, expected: &[usize], dtype: DType) -> Result<Option<TensorData>> {
        self.check(name, expected)?;
        let e = &self.tensors[name];
        let Source::Range { start, len } = e.source else { return Ok(None) };
        if e.dtype != dtype || cfg!(target_endian = "big") || std::env::var("BURNLENS_MMAP").as_deref() == Ok("0") {
            return Ok(None);
        }
        let map = self.map(e.file)?;
        let start = start as usize;
        let bytes = map.slice(start..start + len);
        if !(bytes.as_ptr() as usize).is_multiple_of(dtype.size()) {
            return Ok(None);
        }
        let bytes = Bytes::from_shared(bytes, AllocationProperty::File);
        Ok(Some(TensorData::from_bytes(bytes, e.shape.clone(), dtype)))
    }

    /// File `file`'s read-only mapping (made once).
    fn map(&self, file: usize) -> Result<bytes::Bytes> {
        if let Some(m) = self.maps[file].get() {
            return Ok(m.clone());
        }
        let path = &self.files[file];
        let f = std::fs::File::open(path).map_err(|e| HfError::io(path, e))?;
        // SAFETY: the mapping is read-only and the file's length was checked at open
        // against every tensor's range. Like every reader of a mapped file, it assumes the
        // file is not truncated or rewritten while the model is alive (Hugging Face's cache
        // never rewrites a blob in place: downloads go to a temporary name and are renamed).
        let map = unsafe { memmap2::Mmap::map(&f) }.map_err(|e| HfError::io(path, e))?;
        let m = bytes::Bytes::from_owner(map);
        Ok(self.maps[file].get_or_init(|| m).clone())
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
    let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| HfError::Json { path: index.into(), msg: e.to_string() })?;
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
    let tensors = store.get_all_tensors().map_err(|e| HfError::checkpoint(path, format!("not a readable safetensors file (truncated or corrupt?): {e}")))?;
    Ok(tensors.values().cloned().collect())
}

/// `name -> (absolute byte offset, byte length)` of every tensor of a safetensors file
/// (already validated by burn-store).
fn safetensors_ranges(path: &Path) -> Result<std::collections::HashMap<String, (u64, usize)>> {
    use std::io::Read;
    let bad = |msg: String| HfError::checkpoint(path, format!("not a readable safetensors file (truncated or corrupt?): {msg}"));
    let mut file = std::fs::File::open(path).map_err(|e| HfError::io(path, e))?;
    let mut len = [0u8; 8];
    file.read_exact(&mut len).map_err(|e| bad(e.to_string()))?;
    let n = u64::from_le_bytes(len);
    let mut header = vec![0u8; usize::try_from(n).map_err(|_| bad("header too large".into()))?];
    file.read_exact(&mut header).map_err(|e| bad(e.to_string()))?;
    let value: serde_json::Value = serde_json::from_slice(&header).map_err(|e| bad(e.to_string()))?;
    let obj = value.as_object().ok_or_else(|| bad("header is not a JSON object".into()))?;
    let base = 8 + n;
    let file_len = file.metadata().map_err(|e| HfError::io(path, e))?.len();
    let mut out = std::collections::HashMap::new();
    for (name, info) in obj {
        if name == "__metadata__" {
            continue;
        }
        let offsets = info["data_offsets"].as_array().filter(|a| a.len() == 2).ok_or_else(|| bad(format!("tensor `{name}` has no data_offsets")))?;
        let (s, e) = (offsets[0].as_u64().unwrap_or(0), offsets[1].as_u64().unwrap_or(0));
        // Mapped tensors are read in place: a file shorter than its header says must be
        // refused here, not become a SIGBUS when the missing page is touched.
        if base + e > file_len {
            return Err(bad(format!("tensor `{name}` ends at byte {} but the file has {file_len} bytes", base + e)));
        }
        out.insert(name.clone(), (base + s, e.saturating_sub(s) as usize));
    }
    Ok(out)
}

fn read_pytorch(path: &Path) -> Result<Vec<PackTensor>> {
    let mut store = PytorchStore::from_file(path);
    let tensors = store.get_all_tensors().map_err(|e| HfError::checkpoint(path, format!("not a readable PyTorch checkpoint (truncated or corrupt?): {e}")))?;
    Ok(tensors.values().cloned().collect())
}
