//! Loading a Hugging Face model directory into the canonical [`Transformer`].

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use burn::tensor::{AllocationProperty, Bytes, DType, Device, TensorData, bf16, f16};
use burnlens_model::kernels::pages::{PageBuf, Plain};
use burnlens_model::{ParamInit, Transformer};

use crate::checkpoint::{Checkpoint, Elem, WeightFormat, dtype_name};
use crate::config::{HfConfig, read_config};
use crate::dtype::{LoadOptions, WeightDtype};
use crate::error::{HfError, Result};
use crate::family::is_legacy_buffer;
use crate::layout::{Entry, Placement, place};

/// A model loaded from a Hugging Face directory, with what was learned on the way.
pub struct LoadedModel {
    pub model: Transformer,
    pub hf: HfConfig,
    pub info: CheckpointInfo,
}

/// What the weight files looked like.
#[derive(Debug, Clone)]
pub struct CheckpointInfo {
    pub dir: PathBuf,
    pub format: WeightFormat,
    pub files: Vec<PathBuf>,
    /// Storage dtypes of the weights (`f32`, `f16`, ...), usually one.
    pub dtypes: Vec<String>,
    /// The dtype the weight matrices were loaded as (`f32`, `bf16`, `f16`); vectors are f32.
    pub weight_dtype: String,
    /// Whether names carried the family's base-model prefix (`transformer.`, `gpt_neox.`, `model.`).
    pub prefixed: bool,
    /// Whether an explicit `lm_head.weight` was present (for a tied model it must equal the
    /// token embedding).
    pub lm_head_present: bool,
    /// Legacy buffers skipped.
    pub ignored_buffers: usize,
    /// Things worth telling the user that did not stop the load: unexpected tensors,
    /// non-finite values.
    pub warnings: Vec<String>,
}

/// Read `dir/config.json` and the weights beside it onto `device`, the weight matrices in
/// the dtype the checkpoint stores them in ([`WeightDtype::Auto`]).
pub fn load_model(dir: &Path, device: &Device) -> Result<LoadedModel> {
    load_model_with(dir, device, &LoadOptions::default())
}

/// [`load_model`] with the weight matrices in the dtype `options` asks for.
pub fn load_model_with(dir: &Path, device: &Device, options: &LoadOptions) -> Result<LoadedModel> {
    let config_path = dir.join("config.json");
    if !config_path.is_file() && !dir.is_dir() {
        let e = std::io::Error::new(std::io::ErrorKind::NotFound, "no such model directory");
        return Err(HfError::io(dir, e));
    }
    let hf = read_config(&config_path)?;
    let ckpt = Checkpoint::open(dir)?;
    let (model, info) = import(&hf, &ckpt, device, options)?;
    Ok(LoadedModel { model, hf, info })
}

/// Build the model of `hf` from the tensors of `ckpt`. Weight matrices (2-D parameters)
/// take the dtype `options` resolves to; vectors (norms, biases) are f32.
pub fn import(hf: &HfConfig, ckpt: &Checkpoint, device: &Device, options: &LoadOptions) -> Result<(Transformer, CheckpointInfo)> {
    let cfg = &hf.model;
    let prefix = hf.family.base_prefix();
    let prefixed = ckpt.names().any(|n| n.starts_with(prefix));
    let resolve_name = |name: &str| -> String {
        let with = format!("{prefix}{name}");
        if ckpt.contains(&with) || (prefixed && !ckpt.contains(name)) { with } else { name.to_string() }
    };
    let resolve = |e: &Entry| -> String { if e.prefixed { resolve_name(&e.hf) } else { e.hf.clone() } };

    let table = hf.family.entries(cfg);
    let mut warnings = hf.warnings.clone();
    let Inventory { dtypes, lm_head_present, ignored_buffers } = inventory(hf, ckpt, &table, &resolve_name, &mut warnings)?;

    // Build the model one parameter at a time, reading each from the checkpoint only when
    // it is needed, so that at most one tensor is held besides the model.
    let mut kept: BTreeSet<&'static str> = BTreeSet::new();
    let mut widened_for_backend = false;
    let model = cfg.build(device, |canonical, shape, _| {
        let parts: Vec<&Entry> = table.iter().filter(|e| e.canonical == canonical).collect();
        let first = parts.first().unwrap_or_else(|| panic!("layout table has no entry for `{canonical}`"));
        let stored = ckpt.dtype(&resolve(first)).expect("checked");
        let dtype = match (shape.len(), options.dtype.resolve(stored, device)) {
            (2, Ok(d)) => d,
            (2, Err(d)) if options.dtype != WeightDtype::Auto => return Err(HfError::Backend { dtype: dtype_name(d).into() }),
            (2, Err(_)) => {
                widened_for_backend = true;
                DType::F32
            }
            _ => DType::F32,
        };
        kept.insert(dtype_name(dtype));
        match dtype {
            DType::BF16 => param::<bf16>(ckpt, &parts, &resolve, shape, &mut warnings),
            DType::F16 => param::<f16>(ckpt, &parts, &resolve, shape, &mut warnings),
            _ => param::<f32>(ckpt, &parts, &resolve, shape, &mut warnings),
        }
    })?;
    if widened_for_backend {
        warnings.push(format!("this backend holds no {} tensors: the weights were widened to f32", dtypes.iter().copied().collect::<Vec<_>>().join("/")));
    }

    let info = CheckpointInfo {
        dir: ckpt.dir.clone(),
        format: ckpt.format,
        files: ckpt.files.clone(),
        dtypes: dtypes.into_iter().map(String::from).collect(),
        weight_dtype: kept.iter().copied().find(|d| *d != "f32").unwrap_or("f32").to_string(),
        prefixed,
        lm_head_present,
        ignored_buffers,
        warnings,
    };
    Ok((model, info))
}

/// What a checkpoint holds besides the family's table.
struct Inventory {
    /// The dtypes of the table's tensors.
    dtypes: BTreeSet<&'static str>,
    /// An `lm_head.weight` beside a tied embedding (checked equal to it).
    lm_head_present: bool,
    /// Buffers older HF versions saved (never parameters).
    ignored_buffers: usize,
}

/// Check, before anything is read, that every tensor of `table` is present with its shape
/// and a float dtype, that an explicit `lm_head` of a tied model is the token embedding
/// again, and warn of tensors that are neither the model's nor legacy buffers.
/// `resolve_name` puts a table name under the checkpoint's prefix when it has one.
fn inventory(hf: &HfConfig, ckpt: &Checkpoint, table: &[Entry], resolve_name: &dyn Fn(&str) -> String, warnings: &mut Vec<String>) -> Result<Inventory> {
    let cfg = &hf.model;
    let mut dtypes: BTreeSet<&'static str> = BTreeSet::new();
    let mut used: BTreeSet<String> = BTreeSet::new();
    for e in table {
        let name = if e.prefixed { resolve_name(&e.hf) } else { e.hf.clone() };
        ckpt.check(&name, &e.hf_shape)?;
        dtypes.insert(dtype_name(ckpt.dtype(&name).expect("checked")));
        used.insert(name);
    }
    let lm_head_present = ckpt.contains("lm_head.weight");
    if lm_head_present && !cfg.untied_unembed {
        let shape = [cfg.vocab_size, cfg.d_model];
        let lm = ckpt.read_f32("lm_head.weight", &shape)?;
        let embed = resolve_name(hf.family.embed_name());
        if lm != ckpt.read_f32(&embed, &shape)? {
            return Err(HfError::Untied { path: ckpt.file_of("lm_head.weight").to_path_buf(), embed });
        }
        used.insert("lm_head.weight".into());
    }
    let mut ignored_buffers = 0;
    for name in ckpt.names().filter(|n| !used.contains(*n)) {
        if is_legacy_buffer(name) {
            ignored_buffers += 1;
        } else {
            warnings.push(format!("tensor `{name}` is not part of a {} causal LM and was ignored", hf.family));
        }
    }
    Ok(Inventory { dtypes, lm_head_present, ignored_buffers })
}

/// One canonical parameter from its checkpoint tensors, as `T`. A parameter that is one
/// tensor stored as `T` and needing no change (a half one: but perhaps a transpose) is read
/// in place from the mapped file (or copied as it is) and kept in that layout; everything
/// else is read, converted and placed. Values are scanned for NaN and infinities except
/// in a mapped half matrix (scanning would read the whole file at load; its values are
/// exactly the checkpoint's).
fn param<T: Elem + Plain>(
    ckpt: &Checkpoint,
    parts: &[&Entry],
    resolve: &dyn Fn(&Entry) -> String,
    shape: &[usize],
    warnings: &mut Vec<String>,
) -> Result<ParamInit> {
    if let [e] = parts
        && matches!(e.placement, Placement::Same | Placement::Transposed)
        && (T::DTYPE != DType::F32 || e.placement == Placement::Same)
    {
        let name = resolve(e);
        let data = match ckpt.mapped(&name, &e.hf_shape, T::DTYPE)? {
            Some(data) if T::DTYPE == DType::F32 => {
                warn_non_finite(&name, data.as_slice::<T>().expect("read as T"), warnings);
                data
            }
            Some(data) => data,
            None => {
                let values = ckpt.read::<T>(&name, &e.hf_shape)?;
                warn_non_finite(&name, &values, warnings);
                if T::DTYPE == DType::F32 {
                    TensorData::new(values, e.hf_shape.clone())
                } else {
                    // A converted half matrix is what decoding streams: on huge pages.
                    on_pages(&values, e.hf_shape.clone())
                }
            }
        };
        return Ok(if e.placement == Placement::Same { ParamInit::Data(data) } else { ParamInit::Transposed(data) });
    }
    // A half weight assembled from several `[out, in]` tensors (fused Q/K/V, Phi-3's split
    // gate/up): kept in their `[out, in]` layout and read through a transposed view, so
    // assembling is row copies and decoding streams contiguous columns.
    let transposed = T::DTYPE != DType::F32 && shape.len() == 2 && parts.iter().all(|e| !matches!(e.placement, Placement::Same | Placement::PlusOne));
    let mut out: Option<Vec<T>> = None;
    for e in parts {
        let name = resolve(e);
        let values = ckpt.read::<T>(&name, &e.hf_shape)?;
        warn_non_finite(&name, &values, warnings);
        if transposed {
            assert!(crate::layout::place_transposed(e, &values, shape, &mut out), "`{name}` is an [out, in] tensor");
        } else {
            place(e, values, shape, &mut out);
        }
    }
    let values = out.expect("at least one entry");
    Ok(if transposed {
        ParamInit::Transposed(TensorData::new(values, vec![shape[1], shape[0]]))
    } else {
        ParamInit::Data(TensorData::new(values, shape.to_vec()))
    })
}

/// `values` as tensor data in a [`PageBuf`] of its own (huge pages where the OS gives them),
/// shared with flex without another copy.
fn on_pages<T: Elem + Plain>(values: &[T], shape: Vec<usize>) -> TensorData {
    let bytes = Bytes::from_shared(bytes::Bytes::from_owner(PageBuf::copy_of(values)), AllocationProperty::Native);
    TensorData::from_bytes(bytes, shape, T::DTYPE)
}

fn warn_non_finite<T: Elem>(name: &str, values: &[T], warnings: &mut Vec<String>) {
    if let Some(bad) = values.iter().position(|v| !v.to_f32().is_finite()) {
        let n = values.iter().filter(|v| !v.to_f32().is_finite()).count();
        warnings.push(format!("tensor `{name}` has {n} non-finite values (first at flat index {bad}: {})", values[bad].to_f32()));
    }
}
