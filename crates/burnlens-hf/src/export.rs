//! Writing a model back as a Hugging Face directory that `transformers` loads unchanged:
//! `config.json` of the family, `model.safetensors` with HF names and layouts (the inverse
//! of the import table in [`crate::layout`]), and the tokenizer when there is one.

use std::collections::HashMap;
use std::path::Path;

use burn_store::{ModuleSnapshot, bridge};
use burnlens_model::{Positional, Transformer, TransformerConfig};
use safetensors::Dtype;
use serde_json::{Value, json};

use crate::dtype::WeightDtype;
use crate::error::{HfError, Result};
use crate::family::Family;
use crate::layout::{Placement, extract};
use crate::tokenizer::Tokenizer;

/// Whether `family` can represent `cfg`: the family's rules name the usual reasons in words,
/// and then the round trip decides — the `config.json` written for `cfg` must parse back to `cfg`
/// itself (dropout aside, which `config.json` does not carry for every family), so nothing a
/// rule forgot can export silently as a different model.
pub fn check_exportable(cfg: &TransformerConfig, family: Family) -> Result<()> {
    let json = hf_config_json(cfg, family, None)?;
    reads_back_as(cfg, family, &json)
}

/// The round trip of [`check_exportable`] on an already written `config.json`.
fn reads_back_as(cfg: &TransformerConfig, family: Family, json: &Value) -> Result<()> {
    let back = crate::config::parse_config(&json.to_string(), Path::new("config.json"))?.model;
    let fields = |c: &TransformerConfig| -> serde_json::Map<String, Value> {
        let mut c = c.clone();
        c.dropout = 0.0;
        match serde_json::to_value(&c).expect("a config serialises") {
            Value::Object(m) => m,
            _ => unreachable!("a config is a JSON object"),
        }
    };
    let (want, got) = (fields(cfg), fields(&back));
    let differ: Vec<String> =
        want.iter().filter(|(k, v)| got.get(*k) != Some(v)).map(|(k, v)| format!("{k} = {v} reads back as {}", got.get(k).unwrap_or(&Value::Null))).collect();
    if !differ.is_empty() {
        return Err(HfError::Export(format!("cannot export as {family}: its config.json would describe another model ({})", differ.join("; "))));
    }
    Ok(())
}

/// `config.json` for `cfg` as `family`; `bos_eos` is the id of the end-of-text token, if
/// the tokenizer has one. The family writes its own fields (and says in words what it cannot
/// hold); the fields every family shares are added here.
pub fn hf_config_json(cfg: &TransformerConfig, family: Family, bos_eos: Option<u32>) -> Result<Value> {
    let fail = |why: String| HfError::Export(format!("cannot export as {family}: {why}"));
    if cfg.d_mlp.is_none() {
        return Err(fail("attention-only models have no Hugging Face equivalent".into()));
    }
    if cfg.positional == Positional::QueryKeyOnly {
        return Err(fail("positions added only to queries and keys have no Hugging Face equivalent".into()));
    }
    let spec = family.spec();
    let mut v = spec.config_json(cfg).map_err(fail)?;
    let obj = v.as_object_mut().ok_or_else(|| fail("the family wrote a config.json that is not an object".into()))?;
    obj.insert("architectures".into(), json!([spec.names().architecture]));
    obj.insert("model_type".into(), json!(spec.names().model_type));
    obj.insert("vocab_size".into(), json!(cfg.vocab_size));
    obj.insert("initializer_range".into(), json!(0.02));
    obj.insert("tie_word_embeddings".into(), json!(!cfg.untied_unembed));
    obj.insert("use_cache".into(), json!(true));
    obj.insert("torch_dtype".into(), json!("float32"));
    obj.insert("bos_token_id".into(), json!(bos_eos));
    obj.insert("eos_token_id".into(), json!(bos_eos));
    // Some config classes default to a padding id past a small vocabulary (Phi-3: 32000).
    obj.insert("pad_token_id".into(), Value::Null);
    Ok(v)
}

/// What [`export_hf`] writes besides the weights, and in which dtype.
#[derive(Default, Clone, Copy)]
pub struct ExportOptions<'a> {
    /// Saved beside the model (its `<|endoftext|>` becomes `eos_token_id`).
    pub tokenizer: Option<&'a Tokenizer>,
    /// The dtype of every tensor written (`auto`: the model's weight dtype).
    pub dtype: WeightDtype,
}

/// Write `model` into `dir` (created if needed) as a Hugging Face `family` model. Each file
/// is written beside its target and renamed into place, so an interrupted export never
/// leaves a half-written file.
pub fn export_hf(model: &Transformer, family: Family, dir: &Path, options: &ExportOptions) -> Result<()> {
    let cfg = &model.config;
    let tokenizer = options.tokenizer;
    let eos = match tokenizer {
        Some(Tokenizer::Hf { inner, .. }) => inner.token_to_id("<|endoftext|>"),
        _ => None,
    };
    // `auto`: the dtype the model's weights are kept in (f32 for a model being trained).
    let dtype = options.dtype.resolve(model.weight_dtype(), &burn::tensor::Device::flex()).unwrap_or(burn::tensor::DType::F32);
    let (st_dtype, torch_name) = match dtype {
        burn::tensor::DType::BF16 => (Dtype::BF16, "bfloat16"),
        burn::tensor::DType::F16 => (Dtype::F16, "float16"),
        _ => (Dtype::F32, "float32"),
    };
    let mut config = hf_config_json(cfg, family, eos)?;
    config["torch_dtype"] = serde_json::json!(torch_name);
    reads_back_as(cfg, family, &config)?;
    std::fs::create_dir_all(dir).map_err(|e| HfError::io(dir, e))?;

    // Canonical parameters by module path, read back from the device through burn-store.
    let mut params: HashMap<String, (Vec<usize>, Vec<f32>)> = HashMap::new();
    for t in model.collect(None, None, false) {
        let name = t.name.clone();
        let data = bridge::into_data(t).map_err(|e| HfError::Export(format!("reading parameter `{name}`: {e}")))?;
        let shape = data.shape().to_vec();
        params.insert(name, (shape, data.try_into_vec_as::<f32>().expect("float parameter")));
    }
    let mut out: Vec<(String, Vec<usize>, Vec<f32>)> = Vec::new();
    for e in family.entries(cfg) {
        let (shape, values) = params.get(&e.canonical).ok_or_else(|| HfError::Export(format!("model has no parameter `{}`", e.canonical)))?;
        let hf_values = extract(&e, values, shape);
        let name = family.full_name(&e);
        match e.placement {
            // A block of rows of a tensor several entries share: write it into that tensor.
            Placement::Rows { start, .. } => {
                let n: usize = e.hf_shape.iter().product();
                let pos = match out.iter().position(|(n, _, _)| *n == name) {
                    Some(i) => i,
                    None => {
                        out.push((name, e.hf_shape.clone(), vec![0.0; n]));
                        out.len() - 1
                    }
                };
                let d_in = e.hf_shape[1];
                out[pos].2[start * d_in..start * d_in + hf_values.len()].copy_from_slice(&hf_values);
            }
            _ => out.push((name, e.hf_shape.clone(), hf_values)),
        }
    }
    // Every tensor in the one dtype, as `save_pretrained` writes a model (half values rounded
    // to nearest even).
    let bytes_of = |v: &[f32]| -> Vec<u8> {
        match st_dtype {
            Dtype::BF16 => v.iter().flat_map(|&x| half::bf16::from_f32(x).to_le_bytes()).collect(),
            Dtype::F16 => v.iter().flat_map(|&x| half::f16::from_f32(x).to_le_bytes()).collect(),
            _ => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }
    };
    let out: Vec<(String, Vec<usize>, Vec<u8>)> = out.into_iter().map(|(n, s, v)| (n, s, bytes_of(&v))).collect();
    let files: Vec<crate::files::FileTensor> =
        out.iter().map(|(n, s, b)| crate::files::FileTensor { name: n, dtype: st_dtype, shape: s.clone(), bytes: b }).collect();
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    let weights = dir.join("model.safetensors");
    crate::files::write_safetensors(&weights, &files, Some(metadata))?;
    crate::files::write_atomic(&dir.join("config.json"), serde_json::to_string_pretty(&config).expect("json").as_bytes())?;
    if let Some(tok) = tokenizer {
        let tmp = dir.join(format!(".tokenizer-{}", std::process::id()));
        std::fs::create_dir_all(&tmp).map_err(|e| HfError::io(&tmp, e))?;
        let written = tok.save(&tmp)?;
        let target = dir.join(written.file_name().expect("file name"));
        std::fs::rename(&written, &target).map_err(|e| HfError::io(&target, e))?;
        let _ = std::fs::remove_dir(&tmp);
    }
    Ok(())
}
