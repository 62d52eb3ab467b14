//! Loading a Hugging Face model directory into the canonical [`Transformer`].

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use burn::tensor::{Device, TensorData};
use burnlens_model::{ParamInit, Transformer};

use crate::checkpoint::{Checkpoint, WeightFormat, dtype_name};
use crate::config::{HfConfig, read_config};
use crate::error::{HfError, Result};
use crate::layout::{Placement, entries, is_legacy_buffer, transpose};

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
    /// Whether names carried the `transformer.` prefix.
    pub prefixed: bool,
    /// Whether an explicit `lm_head.weight` was present (it must equal `wte.weight`).
    pub lm_head_present: bool,
    /// Legacy buffers skipped.
    pub ignored_buffers: usize,
    /// Things worth telling the user that did not stop the load: unexpected tensors,
    /// non-finite values.
    pub warnings: Vec<String>,
}

/// Read `dir/config.json` and the weights beside it onto `device`, as `f32`.
pub fn load_model(dir: &Path, device: &Device) -> Result<LoadedModel> {
    let config_path = dir.join("config.json");
    if !config_path.is_file() && !dir.is_dir() {
        let e = std::io::Error::new(std::io::ErrorKind::NotFound, "no such model directory");
        return Err(HfError::io(dir, e));
    }
    let hf = read_config(&config_path)?;
    let ckpt = Checkpoint::open(dir)?;
    let (model, info) = import(&hf, &ckpt, device)?;
    Ok(LoadedModel { model, hf, info })
}

/// Build the model of `hf` from the tensors of `ckpt`.
pub fn import(hf: &HfConfig, ckpt: &Checkpoint, device: &Device) -> Result<(Transformer, CheckpointInfo)> {
    let cfg = &hf.model;
    let prefixed = ckpt.names().any(|n| n.starts_with("transformer."));
    let resolve = |name: &str| -> String {
        let with = format!("transformer.{name}");
        if ckpt.contains(&with) || (prefixed && !ckpt.contains(name)) { with } else { name.to_string() }
    };

    let table = entries(hf.family, cfg);
    let mut warnings = Vec::new();
    let mut dtypes: BTreeSet<&'static str> = BTreeSet::new();
    let mut used: BTreeSet<String> = BTreeSet::new();

    // Every tensor present with the right shape and a float dtype, before anything is read.
    for e in &table {
        let name = resolve(&e.hf);
        ckpt.check(&name, &e.hf_shape)?;
        dtypes.insert(dtype_name(ckpt.dtype(&name).expect("checked")));
        used.insert(name);
    }

    // The unembedding is tied: an explicit lm_head must be the token embedding again.
    let lm_head_present = ckpt.contains("lm_head.weight");
    if lm_head_present {
        let shape = [cfg.vocab_size, cfg.d_model];
        let lm = ckpt.read_f32("lm_head.weight", &shape)?;
        if lm != ckpt.read_f32(&resolve("wte.weight"), &shape)? {
            return Err(HfError::Untied { path: ckpt.file_of("lm_head.weight").to_path_buf() });
        }
        used.insert("lm_head.weight".into());
    }

    let mut ignored_buffers = 0;
    for name in ckpt.names() {
        if used.contains(name) {
            continue;
        }
        if is_legacy_buffer(name) {
            ignored_buffers += 1;
        } else {
            warnings.push(format!("tensor `{name}` is not part of a {} causal LM and was ignored", hf.family));
        }
    }

    // Build the model one parameter at a time, reading each from the checkpoint only when
    // it is needed, so that at most one tensor is held besides the model.
    let hd = cfg.n_heads * cfg.d_head;
    let model = cfg.build(device, |canonical, shape, _| {
        let mut out: Option<Vec<f32>> = None;
        for e in table.iter().filter(|e| e.canonical == canonical) {
            let name = resolve(&e.hf);
            let values = ckpt.read_f32(&name, &e.hf_shape)?;
            if let Some(bad) = values.iter().position(|v| !v.is_finite()) {
                let n = values.iter().filter(|v| !v.is_finite()).count();
                warnings.push(format!("tensor `{name}` has {n} non-finite values (first at flat index {bad}: {})", values[bad]));
            }
            match e.placement {
                Placement::Same => out = Some(values),
                Placement::Transposed => out = Some(transpose(&values, e.hf_shape[0], e.hf_shape[1])),
                Placement::QkvBlockTransposed { part } => {
                    // HF [hd, d] -> canonical columns part*hd..(part+1)*hd of [d, 3*hd].
                    let d = e.hf_shape[1];
                    let block = transpose(&values, hd, d);
                    let fused = out.get_or_insert_with(|| vec![0.0; d * 3 * hd]);
                    for row in 0..d {
                        fused[row * 3 * hd + part * hd..row * 3 * hd + (part + 1) * hd].copy_from_slice(&block[row * hd..(row + 1) * hd]);
                    }
                }
            }
        }
        let values = out.unwrap_or_else(|| panic!("layout table has no entry for `{canonical}`"));
        Ok::<_, HfError>(ParamInit::Data(TensorData::new(values, shape.to_vec())))
    })?;

    let info = CheckpointInfo {
        dir: ckpt.dir.clone(),
        format: ckpt.format,
        files: ckpt.files.clone(),
        dtypes: dtypes.into_iter().map(String::from).collect(),
        prefixed,
        lm_head_present,
        ignored_buffers,
        warnings,
    };
    Ok((model, info))
}
