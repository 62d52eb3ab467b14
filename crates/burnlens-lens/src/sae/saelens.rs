//! SAELens's saved layout: a directory with `cfg.json` and `sae_weights.safetensors`
//! (`W_enc [d_in, d_sae]`, `b_enc [d_sae]`, `W_dec [d_sae, d_in]`, `b_dec [d_in]`,
//! `threshold [d_sae]` for JumpReLU). Configs written before SAELens 6 (`hook_point`/`hook_name`
//! at the top level, `activation_fn_str = "topk"` with `activation_fn_kwargs.k`, boolean
//! `normalize_activations`) are read the way SAELens itself upgrades them.

use std::collections::BTreeMap;
use std::path::Path;

use burn::tensor::{Device, Tensor, TensorData};

use super::core::{Sae, SaeConfig, SaeError};
use crate::dictionary::{Dictionary, Rule};

/// SAELens's file names.
pub const CFG_FILE: &str = "cfg.json";
pub const WEIGHTS_FILE: &str = "sae_weights.safetensors";

fn read_weights(path: &Path, cfg: &SaeConfig, device: &Device) -> Result<BTreeMap<String, TensorData>, SaeError> {
    let bytes = std::fs::read(path).map_err(|e| SaeError::File { path: path.into(), msg: e.to_string() })?;
    let st = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| SaeError::File { path: path.into(), msg: format!("not a safetensors file: {e}") })?;
    let _ = device;
    let (d_in, d_sae) = (cfg.d_in, cfg.d_sae);
    let mut wanted: Vec<(&str, Vec<usize>)> = vec![("W_enc", vec![d_in, d_sae]), ("b_enc", vec![d_sae]), ("W_dec", vec![d_sae, d_in]), ("b_dec", vec![d_in])];
    if matches!(cfg.architecture, Rule::JumpRelu { .. }) {
        wanted.push(("threshold", vec![d_sae]));
    }
    let mut out = BTreeMap::new();
    for (name, shape) in wanted {
        let terr = |msg: String| SaeError::Tensor { path: path.into(), name: name.into(), msg };
        let t = st.tensor(name).map_err(|_| terr(format!("missing (expected shape {shape:?})")))?;
        if t.shape() != shape.as_slice() {
            return Err(terr(format!("shape {:?}, expected {shape:?} from d_in = {d_in}, d_sae = {d_sae}", t.shape())));
        }
        use safetensors::Dtype;
        let raw = t.data();
        let values: Vec<f32> = match t.dtype() {
            Dtype::F32 => raw.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes"))).collect(),
            Dtype::F64 => raw.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")) as f32).collect(),
            Dtype::F16 => raw.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
            Dtype::BF16 => raw.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
            other => return Err(terr(format!("dtype {other:?}, expected a float type"))),
        };
        out.insert(name.to_string(), TensorData::new(values, shape));
    }
    Ok(out)
}

/// Load an SAE directory written by SAELens (`SAE.save_model`) or by burnlens.
pub fn load(dir: &Path, device: &Device) -> Result<Sae, SaeError> {
    let cfg_path = dir.join(CFG_FILE);
    let text = std::fs::read_to_string(&cfg_path)
        .map_err(|e| SaeError::File { path: cfg_path.clone(), msg: format!("{e} (an SAE directory holds {CFG_FILE} and {WEIGHTS_FILE})") })?;
    let cfg = SaeConfig::parse(&text, &cfg_path)?;
    let mut w = read_weights(&dir.join(WEIGHTS_FILE), &cfg, device)?;
    let mut take = |n: &str| w.remove(n);
    let t2 = |d: TensorData| Tensor::<2>::from_data(d, device);
    let t1 = |d: TensorData| Tensor::<1>::from_data(d, device);
    let dict = Dictionary {
        w_enc: t2(take("W_enc").expect("read")),
        b_enc: t1(take("b_enc").expect("read")),
        w_dec: vec![t2(take("W_dec").expect("read"))],
        b_dec: t1(take("b_dec").expect("read")),
        threshold: take("threshold").map(t1),
        w_skip: None,
        rule: cfg.architecture,
        subtract_b_dec: cfg.apply_b_dec_to_input,
    };
    Ok(Sae::new(cfg, dict))
}

impl Sae {
    /// Write `cfg.json` and `sae_weights.safetensors` in SAELens 6's layout (each through a
    /// temporary file, so an existing SAE is replaced only by a complete one).
    pub fn save(&self, dir: &Path) -> Result<(), SaeError> {
        let io = |path: &Path, e: std::io::Error| SaeError::File { path: path.into(), msg: e.to_string() };
        std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
        let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
        let mut push = |name: &str, dims: Vec<usize>, data: TensorData| {
            let v: Vec<f32> = data.try_into_vec_as::<f32>().expect("f32");
            tensors.push((name.to_string(), dims, v.iter().flat_map(|x| x.to_le_bytes()).collect()));
        };
        let d = &self.dict;
        push("W_enc", d.w_enc.dims().to_vec(), d.w_enc.to_data());
        push("b_enc", d.b_enc.dims().to_vec(), d.b_enc.to_data());
        push("W_dec", d.decoder().dims().to_vec(), d.decoder().to_data());
        push("b_dec", d.b_dec.dims().to_vec(), d.b_dec.to_data());
        if let Some(t) = &d.threshold {
            push("threshold", t.dims().to_vec(), t.to_data());
        }
        let files: Vec<burnlens_model::files::FileTensor> = tensors
            .iter()
            .map(|(n, dims, bytes)| burnlens_model::files::FileTensor { name: n, dtype: safetensors::Dtype::F32, shape: dims.clone(), bytes })
            .collect();
        let weights = dir.join(WEIGHTS_FILE);
        burnlens_model::files::write_safetensors(&weights, &files, None)?;
        let write = |name: &str, data: &[u8]| -> Result<(), SaeError> {
            let path = dir.join(name);
            Ok(burnlens_model::files::write_atomic(&path, data)?)
        };
        write(CFG_FILE, serde_json::to_string_pretty(&self.cfg.to_json()).expect("json").as_bytes())
    }
}
