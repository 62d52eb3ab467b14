//! What a finished run leaves: SAEs in SAELens's layout (`sae/`, or `sae/{hook}/` for each of
//! several), or a transcoder per layer in circuit-tracer's per-layer layout (`transcoders/`:
//! `config.yaml` naming `feature_input_hook` / `feature_output_hook` and one
//! `layer_{i}.safetensors` each with `W_enc [F, d_in]`, `W_dec [F, d_out]`, `b_enc [F]`,
//! `b_dec [d_out]`, `activation_function.threshold [F]` for JumpReLU (and BatchTopK, saved as
//! JumpReLU), `W_skip [d_out, d_in]` with a skip connection). TopK transcoders, which
//! circuit-tracer's files cannot describe, say `activation_function: topk` and `top_k: K`,
//! burnlens's keys. A cross-layer transcoder goes to `transcoders/` in circuit-tracer's CLT
//! layout ([`write_clt`]).

use std::path::{Path, PathBuf};

use burn::tensor::Tensor;
use safetensors::Dtype;

use crate::architecture::Architecture;
use crate::config::{RunError, SaeRunConfig, file_err};
use crate::inference::{SaeSite, inference_sae};
use crate::trainer::SaeTrainer;

/// Write the run's SAEs or transcoder set under `dir`; the folders written.
pub fn write_outputs(dir: &Path, cfg: &SaeRunConfig, trainers: &[SaeTrainer], model_name: Option<String>) -> Result<Vec<PathBuf>, RunError> {
    if cfg.cross_layer {
        return write_clt(&dir.join("transcoders"), cfg, &trainers[0]).map(|d| vec![d]);
    }
    if cfg.sites.iter().all(|s| s.output.is_some()) {
        return write_transcoders(&dir.join("transcoders"), cfg, trainers).map(|d| vec![d]);
    }
    let mut out = Vec::new();
    for (site, t) in cfg.sites.iter().zip(trainers) {
        let sae_dir = if cfg.sites.len() == 1 { dir.join("sae") } else { dir.join("sae").join(&site.input) };
        let sae = inference_sae(
            &cfg.architecture,
            &t.params,
            t.topk_threshold,
            SaeSite { hook_name: &site.input, model_name: model_name.clone(), transcoder: false },
        );
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

/// The per-layer hook names of a set of transcoder sites: one per layer from 0, each from
/// `blocks.{l}.<input>` to `blocks.{l}.<output>` with the same names.
fn set_hooks(cfg: &SaeRunConfig) -> Result<(&str, &str), RunError> {
    let not_a_set = || {
        RunError::Config(
            "transcoders are written as a set: one per layer from 0, each from blocks.{l}.<input> to blocks.{l}.<output> with the same hook names".into(),
        )
    };
    let mut names = None;
    for (l, site) in cfg.sites.iter().enumerate() {
        let (li, input) = per_layer(&site.input).ok_or_else(not_a_set)?;
        let (lo, output) = per_layer(site.output.as_deref().unwrap_or_default()).ok_or_else(not_a_set)?;
        if li != l || lo != l || *names.get_or_insert((input, output)) != (input, output) {
            return Err(not_a_set());
        }
    }
    names.ok_or_else(not_a_set)
}

fn write_transcoders(out: &Path, cfg: &SaeRunConfig, trainers: &[SaeTrainer]) -> Result<PathBuf, RunError> {
    let (input, output) = set_hooks(cfg)?;
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
        let tensors = tensors.into_iter().map(|(name, v)| {
            let dims = v.dims();
            let shape = if dims[0] == 1 && name != "W_enc" && name != "W_dec" && name != "W_skip" { vec![dims[1]] } else { dims.to_vec() };
            (name.to_string(), shape, v.into_data().try_into_vec_as::<f32>().expect("f32"))
        });
        write_f32s(&out.join(&file), tensors.collect())?;
        yaml.push_str(&format!("  - {file}\n"));
    }
    let cfg_path = out.join("config.yaml");
    burnlens_model::files::write_atomic(&cfg_path, yaml.as_bytes())?;
    Ok(out.to_path_buf())
}

/// A cross-layer transcoder in circuit-tracer's layout (`transcoders/`): `config.yaml`
/// (`model_kind: cross_layer_transcoder`, the hooks, `activation_function: relu` or
/// `jump_relu`), and per layer `l` of `L`: `W_enc_{l}.safetensors` (`W_enc_{l} [F, d_in]`,
/// `b_enc_{l} [F]`, `b_dec_{l} [d_out]`, `threshold_{l} [F]` for JumpReLU and BatchTopK)
/// and `W_dec_{l}.safetensors` (`W_dec_{l} [F, L − l, d_out]`), cut from the one
/// transcoder's blocks ([`crate::cross_layer`]).
fn write_clt(out: &Path, cfg: &SaeRunConfig, t: &SaeTrainer) -> Result<PathBuf, RunError> {
    let (input, output) = set_hooks(cfg)?;
    let b = t.blocks.as_ref().ok_or_else(|| RunError::Config("cross_layer: the trainer has no blocks".into()))?;
    std::fs::create_dir_all(out).map_err(|e| file_err(out, e))?;
    let folded = inference_sae(&cfg.architecture, &t.params, t.topk_threshold, SaeSite { hook_name: &cfg.sites[0].input, model_name: None, transcoder: true });
    let host = |v: Tensor<1>| v.into_data().try_into_vec_as::<f32>().expect("f32");
    let f = b.features;
    for l in 0..b.layers {
        let mut enc = vec![
            (format!("W_enc_{l}"), vec![f, b.d_in], host(b.encoder(&folded.w_enc, l).transpose().reshape([f * b.d_in]))),
            (format!("b_enc_{l}"), vec![f], host(b.features_of(&folded.b_enc, l))),
            (format!("b_dec_{l}"), vec![b.d_out], host(b.outputs_of(&folded.b_dec, l))),
        ];
        enc.extend(folded.threshold.as_ref().map(|th| (format!("threshold_{l}"), vec![f], host(b.features_of(th, l)))));
        write_f32s(&out.join(format!("W_enc_{l}.safetensors")), enc)?;
        let k = b.layers - l;
        let dec = host(b.decoders(&folded.w_dec, l).reshape([f * k * b.d_out]));
        write_f32s(&out.join(format!("W_dec_{l}.safetensors")), vec![(format!("W_dec_{l}"), vec![f, k, b.d_out], dec)])?;
    }
    let activation = if folded.threshold.is_some() { "jump_relu" } else { "relu" };
    let yaml = format!(
        "model_kind: cross_layer_transcoder\nscan: burnlens-trained\nfeature_input_hook: {input}\nfeature_output_hook: {output}\nactivation_function: {activation}\n"
    );
    let cfg_path = out.join("config.yaml");
    burnlens_model::files::write_atomic(&cfg_path, yaml.as_bytes())?;
    Ok(out.to_path_buf())
}

/// f32 tensors `(name, shape, values)` as one safetensors file, written atomically.
fn write_f32s(path: &Path, tensors: Vec<(String, Vec<usize>, Vec<f32>)>) -> Result<(), RunError> {
    use burnlens_model::files::{FileTensor, f32_bytes, write_safetensors};
    let bytes: Vec<Vec<u8>> = tensors.iter().map(|(_, _, v)| f32_bytes(v)).collect();
    let files: Vec<FileTensor> =
        tensors.iter().zip(&bytes).map(|((n, s, _), b)| FileTensor { name: n, dtype: Dtype::F32, shape: s.clone(), bytes: b }).collect();
    Ok(write_safetensors(path, &files, None)?)
}
