//! Gemma Scope SAEs in their own release layout: a folder such as
//! `gemma-scope-2b-pt-res/layer_20/width_16k/average_l0_71` holding only `params.npz`
//! (`W_enc [d_in, d_sae]`, `W_dec [d_sae, d_in]`, `b_enc`, `b_dec`, `threshold`; JumpReLU).
//! There is no config file: as SAELens's Gemma 2 loader does, the hook point comes from the
//! path — `layer_N` from the folder, the site from the release name (`-res` → `hook_resid_post`,
//! `-mlp` → `hook_mlp_out`, `-att` → `attn.hook_z`; an `embedding` folder of a `-res` release
//! reads `hook_embed`, with `W_enc / √d_in` and `W_dec · √d_in` as SAELens scales them) —
//! and the SAE does not subtract `b_dec` from its input and does not normalise it.

use std::io::Read;
use std::path::{Path, PathBuf};

use burn::tensor::{Device, Tensor, TensorData};
use burnlens_model::{AttnHook, BlockHook, HookPoint, LayerHook};

use super::core::{Normalize, Sae, SaeConfig, SaeError};
use crate::dictionary::{Dictionary, Rule};

/// The file a Gemma Scope folder holds.
pub const PARAMS_FILE: &str = "params.npz";

fn file_err(path: &Path, msg: impl Into<String>) -> SaeError {
    SaeError::File { path: path.to_path_buf(), msg: msg.into() }
}

/// One array of an `.npz`: its shape and values as f32 (from `<f4`, `<f8` or `<f2`).
#[derive(Debug)]
pub struct Npy {
    pub shape: Vec<usize>,
    pub values: Vec<f32>,
}

/// Parse one `.npy` file (format versions 1–3, C order, little-endian floats).
fn parse_npy(bytes: &[u8]) -> Result<Npy, String> {
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err("not a .npy array".into());
    }
    let (header_len, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => (u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize, 12),
        v => return Err(format!(".npy format version {v} is not supported")),
    };
    let header = bytes.get(start..start + header_len).ok_or("truncated .npy header")?;
    let header = std::str::from_utf8(header).map_err(|_| "the .npy header is not text")?;
    let field = |key: &str| -> Option<&str> {
        let at = header.find(&format!("'{key}'"))? + key.len() + 2;
        Some(header[at..].trim_start().strip_prefix(':')?.trim_start())
    };
    let descr = field("descr").and_then(|d| d.strip_prefix('\'')).and_then(|d| d.split('\'').next()).ok_or("the .npy header has no descr")?;
    if field("fortran_order").is_some_and(|f| f.starts_with("True")) {
        return Err("Fortran-ordered arrays are not supported".into());
    }
    let shape_text = field("shape").and_then(|s| s.strip_prefix('(')).and_then(|s| s.split(')').next()).ok_or("the .npy header has no shape")?;
    let shape: Vec<usize> = shape_text
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<usize>().map_err(|_| format!("bad shape ({shape_text})")))
        .collect::<Result<_, _>>()?;
    let data = &bytes[start + header_len..];
    let n: usize = shape.iter().product();
    let width = match descr {
        "<f4" => 4,
        "<f8" => 8,
        "<f2" => 2,
        other => return Err(format!("dtype {other}, expected little-endian float32, float64 or float16")),
    };
    if data.len() != n * width {
        return Err(format!("holds {} bytes of data, shape {shape:?} of {descr} needs {}", data.len(), n * width));
    }
    let values = match width {
        4 => data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
        8 => data.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")) as f32).collect(),
        _ => data.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
    };
    Ok(Npy { shape, values })
}

/// Every array of an `.npz` (stored or deflated), by name without `.npy`.
pub fn read_npz(path: &Path) -> Result<Vec<(String, Npy)>, SaeError> {
    let file = std::fs::File::open(path).map_err(|e| file_err(path, e.to_string()))?;
    let mut zip = zip::ZipArchive::new(std::io::BufReader::new(file)).map_err(|e| file_err(path, format!("not an .npz (zip) archive: {e}")))?;
    let mut out = Vec::new();
    for i in 0..zip.len() {
        let mut entry = zip.by_index(i).map_err(|e| file_err(path, e.to_string()))?;
        let name = entry.name().map_err(|e| file_err(path, e.to_string()))?.trim_end_matches(".npy").to_string();
        let mut bytes = Vec::with_capacity(entry.size() as usize);
        entry.read_to_end(&mut bytes).map_err(|e| file_err(path, format!("{name}: {e}")))?;
        let npy = parse_npy(&bytes).map_err(|msg| SaeError::Tensor { path: path.into(), name: name.clone(), msg })?;
        out.push((name, npy));
    }
    Ok(out)
}

/// The hook point a Gemma Scope folder's path names, and whether it is an embedding SAE.
pub fn hook_from_path(dir: &Path) -> Result<(String, bool), SaeError> {
    let parts: Vec<String> = dir.components().map(|c| c.as_os_str().to_string_lossy().to_string()).collect();
    let embedding = parts.iter().any(|p| p.contains("embedding"));
    let layer = parts.iter().rev().find_map(|p| p.strip_prefix("layer_").and_then(|n| n.parse::<usize>().ok()));
    // The release: `gemma-scope-2b-pt-res` (also as a cache folder `models--google--gemma-scope-...`).
    let site = parts.iter().rev().filter(|p| p.contains("gemma-scope")).find_map(|p| {
        let words: Vec<&str> = p.split(['-', '_']).collect();
        ["res", "mlp", "att"].into_iter().find(|s| words.contains(s))
    });
    let expected = "a Gemma Scope folder such as gemma-scope-2b-pt-res/layer_20/width_16k/average_l0_71 (a -res, -mlp or -att release, a layer_N folder)";
    let hook = match (site, layer, embedding) {
        (Some("res"), _, true) => HookPoint::Embed,
        (Some("res"), Some(l), false) => BlockHook::ResidPost.at(l),
        (Some("mlp"), Some(l), _) => BlockHook::MlpOut.at(l),
        (Some("att"), Some(l), _) => AttnHook::Z.at(l),
        (None, _, _) => {
            return Err(file_err(dir, format!("cannot tell the hook point: no release name with -res, -mlp or -att in the path; expected {expected}")));
        }
        _ => return Err(file_err(dir, format!("cannot tell the layer: no layer_N folder in the path; expected {expected}"))),
    };
    Ok((hook.name(), embedding))
}

/// Load the Gemma Scope SAE in folder `dir` (which holds [`PARAMS_FILE`]).
pub fn load(dir: &Path, device: &Device) -> Result<Sae, SaeError> {
    let path: PathBuf = dir.join(PARAMS_FILE);
    let (hook_name, embedding) = hook_from_path(dir)?;
    let mut arrays = read_npz(&path)?;
    let mut take = |name: &str| -> Result<Npy, SaeError> {
        // SAELens also accepts a lower-case `w_` prefix.
        let alt = name.replace("W_", "w_");
        let i = arrays.iter().position(|(n, _)| n == name || *n == alt).ok_or_else(|| SaeError::Tensor {
            path: path.clone(),
            name: name.into(),
            msg: "missing".into(),
        })?;
        Ok(arrays.swap_remove(i).1)
    };
    let w_enc = take("W_enc")?;
    let [d_in, d_sae] = w_enc.shape[..] else {
        return Err(SaeError::Tensor { path: path.clone(), name: "W_enc".into(), msg: format!("shape {:?}, expected [d_in, d_sae]", w_enc.shape) });
    };
    let (w_dec, b_enc, b_dec, threshold) = (take("W_dec")?, take("b_enc")?, take("b_dec")?, take("threshold")?);
    for (name, a, want) in
        [("W_dec", &w_dec, vec![d_sae, d_in]), ("b_enc", &b_enc, vec![d_sae]), ("b_dec", &b_dec, vec![d_in]), ("threshold", &threshold, vec![d_sae])]
    {
        if a.shape != want {
            return Err(SaeError::Tensor {
                path: path.clone(),
                name: name.into(),
                msg: format!("shape {:?}, expected {want:?} from W_enc's [d_in = {d_in}, d_sae = {d_sae}]", a.shape),
            });
        }
    }
    if let Ok(s) = take("scaling_factor")
        && s.values.iter().any(|&v| v != 1.0)
    {
        return Err(SaeError::Tensor {
            path: path.clone(),
            name: "scaling_factor".into(),
            msg: "a fine-tuning scaling factor other than 1 is not supported".into(),
        });
    }
    let (mut enc, mut dec) = (w_enc.values, w_dec.values);
    if embedding {
        let s = (d_in as f32).sqrt();
        enc.iter_mut().for_each(|v| *v /= s);
        dec.iter_mut().for_each(|v| *v *= s);
    }
    let reshape_hook_z = super::core::is_hook_z(&hook_name);
    let cfg = SaeConfig {
        d_in,
        d_sae,
        architecture: Rule::JUMP_RELU,
        apply_b_dec_to_input: false,
        normalize_activations: Normalize::None,
        hook_name,
        reshape_hook_z,
        model_name: None,
    };
    let dict = Dictionary {
        w_enc: Tensor::from_data(TensorData::new(enc, [d_in, d_sae]), device),
        b_enc: Tensor::from_data(TensorData::new(b_enc.values, [d_sae]), device),
        w_dec: vec![Tensor::from_data(TensorData::new(dec, [d_sae, d_in]), device)],
        b_dec: Tensor::from_data(TensorData::new(b_dec.values, [d_in]), device),
        threshold: Some(Tensor::from_data(TensorData::new(threshold.values, [d_sae]), device)),
        w_skip: None,
        rule: cfg.architecture,
        subtract_b_dec: cfg.apply_b_dec_to_input,
    };
    Ok(Sae::new(cfg, dict))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hook_points_from_release_paths() {
        let h = |p: &str| hook_from_path(Path::new(p));
        assert_eq!(h("x/gemma-scope-2b-pt-res/layer_20/width_16k/average_l0_71").unwrap(), ("blocks.20.hook_resid_post".into(), false));
        assert_eq!(h("gemma-scope-9b-pt-mlp/layer_3/width_131k/average_l0_9").unwrap().0, "blocks.3.hook_mlp_out");
        assert_eq!(h("/c/models--google--gemma-scope-2b-pt-att/snapshots/abc/layer_0/width_16k/average_l0_10").unwrap().0, "blocks.0.attn.hook_z");
        assert_eq!(h("gemma-scope-2b-pt-res/embedding/width_4k/average_l0_6").unwrap(), ("hook_embed".into(), true));
        assert!(h("saes/layer_3/width_16k").unwrap_err().to_string().contains("no release name"));
        assert!(h("gemma-scope-2b-pt-res/width_16k").unwrap_err().to_string().contains("no layer_N folder"));
    }

    #[test]
    fn npy_headers() {
        let mut b = b"\x93NUMPY\x01\x00".to_vec();
        let header = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
        let padded = format!("{header:<54}\n");
        b.extend_from_slice(&(padded.len() as u16).to_le_bytes());
        b.extend_from_slice(padded.as_bytes());
        for i in 0..6 {
            b.extend_from_slice(&(i as f32).to_le_bytes());
        }
        let a = parse_npy(&b).unwrap();
        assert_eq!((a.shape, a.values), (vec![2, 3], vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]));
        b.pop();
        assert!(parse_npy(&b).unwrap_err().contains("holds 23 bytes of data"));
        assert!(parse_npy(b"not numpy").is_err());
    }
}
