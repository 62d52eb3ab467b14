//! What a finished run leaves: SAEs in SAELens's layout (`sae/`, or `sae/{hook}/` for each of
//! several), or a transcoder per layer in circuit-tracer's per-layer layout (`transcoders/`:
//! `config.yaml` naming `feature_input_hook` / `feature_output_hook` and one
//! `layer_{i}.safetensors` each with `W_enc [F, d_in]`, `W_dec [F, d_out]`, `b_enc [F]`,
//! `b_dec [d_out]`, `activation_function.threshold [F]` for JumpReLU (and BatchTopK, saved as
//! JumpReLU), `W_skip [d_out, d_in]` with a skip connection). TopK transcoders, which
//! circuit-tracer's files cannot describe, say `activation_function: topk` and `top_k: K`,
//! burnlens's keys.

use std::path::{Path, PathBuf};

use burn::tensor::Tensor;
use safetensors::Dtype;

use crate::architecture::Architecture;
use crate::inference::{SaeSite, inference_sae};
use crate::config::{RunError, SaeRunConfig, file_err};
use crate::trainer::SaeTrainer;

/// Write the run's SAEs or transcoder set under `dir`; the folders written.
pub fn write_outputs(dir: &Path, cfg: &SaeRunConfig, trainers: &[SaeTrainer], model_name: Option<String>) -> Result<Vec<PathBuf>, RunError> {
    if cfg.sites.iter().all(|s| s.output.is_some()) {
        return write_transcoders(&dir.join("transcoders"), cfg, trainers).map(|d| vec![d]);
    }
    let mut out = Vec::new();
    for (site, t) in cfg.sites.iter().zip(trainers) {
        let sae_dir = if cfg.sites.len() == 1 { dir.join("sae") } else { dir.join("sae").join(&site.input) };
        let sae = inference_sae(&cfg.architecture, &t.params, t.topk_threshold, SaeSite { hook_name: &site.input, model_name: model_name.clone(), transcoder: false });
        sae.save(&sae_dir).map_err(|e| file_err(&sae_dir, e))?;
        out.push(sae_dir);
    }
    Ok(out)
}

/// `blocks.{layer}.{rest}` → `(layer, rest)`.
fn per_layer(hook: &str) -> Option<(usize, &str)> {
    let rest = hook.strip_prefix("blocks.")?;
    let (layer, name) = rest.split_once('.')?;
    Some((layer.parse().ok()?, name))
}

fn write_transcoders(out: &Path, cfg: &SaeRunConfig, trainers: &[SaeTrainer]) -> Result<PathBuf, RunError> {
    let not_a_set = || RunError::Config("transcoders are written as a set: one per layer from 0, each from blocks.{l}.<input> to blocks.{l}.<output> with the same hook names".into());
    let mut names = None;
    for (l, site) in cfg.sites.iter().enumerate() {
        let (li, input) = per_layer(&site.input).ok_or_else(not_a_set)?;
        let (lo, output) = per_layer(site.output.as_deref().unwrap_or_default()).ok_or_else(not_a_set)?;
        if li != l || lo != l || *names.get_or_insert((input, output)) != (input, output) {
            return Err(not_a_set());
        }
    }
    let (input, output) = names.ok_or_else(not_a_set)?;
    std::fs::create_dir_all(out).map_err(|e| file_err(out, e))?;
    let mut yaml = format!("model_kind: transcoder_set\nscan: burnlens-trained\nfeature_input_hook: {input}\nfeature_output_hook: {output}\n");
    if let Architecture::TopK(t) = cfg.architecture {
        yaml.push_str(&format!("activation_function: topk\ntop_k: {}\n", t.k as usize));
    }
    yaml.push_str("transcoders:\n");
    for (l, (site, t)) in cfg.sites.iter().zip(trainers).enumerate() {
        let file = format!("layer_{l}.safetensors");
        let folded = inference_sae(&cfg.architecture, &t.params, t.topk_threshold, SaeSite { hook_name: &site.input, model_name: None, transcoder: true });
        let mut tensors: Vec<(&str, Tensor<2>)> = vec![
            ("W_enc", folded.w_enc.clone().transpose()),
            ("W_dec", folded.w_dec.clone()),
            ("b_enc", folded.b_enc.clone().unsqueeze()),
            ("b_dec", folded.b_dec.clone().unsqueeze()),
        ];
        tensors.extend(folded.threshold.clone().map(|th| ("activation_function.threshold", th.unsqueeze())));
        tensors.extend(t.params.w_skip.clone().map(|w| ("W_skip", w)));
        let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
            .into_iter()
            .map(|(name, v)| {
                let dims = v.dims();
                let shape = if dims[0] == 1 && name != "W_enc" && name != "W_dec" && name != "W_skip" { vec![dims[1]] } else { dims.to_vec() };
                let data: Vec<f32> = v.into_data().try_into_vec_as::<f32>().expect("f32");
                (name.to_string(), shape, data.iter().flat_map(|x| x.to_le_bytes()).collect())
            })
            .collect();
        let views: Vec<(String, safetensors::tensor::TensorView)> =
            bytes.iter().map(|(n, s, b)| (n.clone(), safetensors::tensor::TensorView::new(Dtype::F32, s.clone(), b).expect("consistent view"))).collect();
        let path = out.join(&file);
        let st = safetensors::serialize(views, None).map_err(|e| file_err(&path, e))?;
        burnlens_model::files::write_atomic(&path, &st).map_err(|e| file_err(&path, e))?;
        yaml.push_str(&format!("  - {file}\n"));
    }
    let cfg_path = out.join("config.yaml");
    burnlens_model::files::write_atomic(&cfg_path, yaml.as_bytes()).map_err(|e| file_err(&cfg_path, e))?;
    Ok(out.to_path_buf())
}
