//! Loading a Hugging Face model directory into the canonical [`Transformer`].

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use burn::tensor::{Device, TensorData};
use burnlens_model::{ParamInit, Transformer};

use crate::checkpoint::{Checkpoint, WeightFormat, dtype_name};
use crate::config::{HfConfig, read_config};
use crate::error::{HfError, Result};
use crate::layout::{entries, is_legacy_buffer, place};

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
    let prefix = hf.family.base_prefix();
    let prefixed = ckpt.names().any(|n| n.starts_with(prefix));
    let resolve_name = |name: &str| -> String {
        let with = format!("{prefix}{name}");
        if ckpt.contains(&with) || (prefixed && !ckpt.contains(name)) { with } else { name.to_string() }
    };
    let resolve = |e: &crate::layout::Entry| -> String { if e.prefixed { resolve_name(&e.hf) } else { e.hf.clone() } };

    let table = entries(hf.family, cfg);
    let mut warnings = hf.warnings.clone();
    let mut dtypes: BTreeSet<&'static str> = BTreeSet::new();
    let mut used: BTreeSet<String> = BTreeSet::new();

    // Every tensor present with the right shape and a float dtype, before anything is read.
    for e in &table {
        let name = resolve(e);
        ckpt.check(&name, &e.hf_shape)?;
        dtypes.insert(dtype_name(ckpt.dtype(&name).expect("checked")));
        used.insert(name);
    }

    // A tied unembedding: an explicit lm_head must be the token embedding again.
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
    let model = cfg.build(device, |canonical, shape, _| {
        let mut out: Option<Vec<f32>> = None;
        for e in table.iter().filter(|e| e.canonical == canonical) {
            let name = resolve(e);
            let values = ckpt.read_f32(&name, &e.hf_shape)?;
            if let Some(bad) = values.iter().position(|v| !v.is_finite()) {
                let n = values.iter().filter(|v| !v.is_finite()).count();
                warnings.push(format!("tensor `{name}` has {n} non-finite values (first at flat index {bad}: {})", values[bad]));
            }
            place(e, values, shape, &mut out);
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
