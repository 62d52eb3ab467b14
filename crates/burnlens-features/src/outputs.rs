//! What a finished run leaves: SAEs in SAELens's layout (`sae/`, or `sae/{hook}/` for each of
//! several), or a transcoder per layer, or a cross-layer transcoder, in circuit-tracer's
//! layouts (`transcoders/`, written by the trace crate's [`circuit_tracer`] module, which
//! reads them too; BatchTopK saved as JumpReLU).
//!
//! [`circuit_tracer`]: burnlens_trace::circuit_tracer

use std::path::{Path, PathBuf};

use burnlens_lens::dictionary::Dictionary;
use burnlens_trace::{InputHook, OutputHook, TranscoderSet};

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
        let sae = inference_sae(&cfg.architecture, &t.params, t.topk_threshold, SaeSite { hook_name: &site.input, model_name: model_name.clone() });
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

/// The set's hooks as circuit-tracer names them (checked when the run was configured).
fn set_hook_names(cfg: &SaeRunConfig) -> Result<(InputHook, OutputHook), RunError> {
    let (input, output) = set_hooks(cfg)?;
    let bad = |e: burnlens_trace::TraceError| RunError::Config(e.to_string());
    Ok((InputHook::parse(input).map_err(bad)?, OutputHook::parse(output).map_err(bad)?))
}

fn write_transcoders(out: &Path, cfg: &SaeRunConfig, trainers: &[SaeTrainer]) -> Result<PathBuf, RunError> {
    let (input, output) = set_hook_names(cfg)?;
    let layers = cfg
        .sites
        .iter()
        .zip(trainers)
        .map(|(site, t)| inference_sae(&cfg.architecture, &t.params, t.topk_threshold, SaeSite { hook_name: &site.input, model_name: None }).dict)
        .collect();
    let set = TranscoderSet { layers, input, output, scan: Some(SCAN.into()), cross_layer: false };
    set.save(out).map_err(|e| RunError::Config(e.to_string()))?;
    Ok(out.to_path_buf())
}

/// The `scan` a set trained here is written with.
const SCAN: &str = "burnlens-trained";

/// A cross-layer transcoder in circuit-tracer's layout (`transcoders/`), each layer's
/// dictionary cut from the one transcoder's blocks ([`crate::cross_layer`]).
fn write_clt(out: &Path, cfg: &SaeRunConfig, t: &SaeTrainer) -> Result<PathBuf, RunError> {
    let (input, output) = set_hook_names(cfg)?;
    let b = t.blocks.as_ref().ok_or_else(|| RunError::Config("cross_layer: the trainer has no blocks".into()))?;
    let folded = inference_sae(&cfg.architecture, &t.params, t.topk_threshold, SaeSite { hook_name: &cfg.sites[0].input, model_name: None }).dict;
    let (f, d_out) = (b.features, b.d_out);
    let layers = (0..b.layers)
        .map(|l| {
            let decoders = b.decoders(folded.decoder(), l);
            Dictionary {
                w_enc: b.encoder(&folded.w_enc, l),
                b_enc: b.features_of(&folded.b_enc, l),
                w_dec: (0..b.layers - l).map(|j| decoders.clone().slice([0..f, j..j + 1, 0..d_out]).reshape([f, d_out])).collect(),
                b_dec: b.outputs_of(&folded.b_dec, l),
                threshold: folded.threshold.as_ref().map(|th| b.features_of(th, l)),
                w_skip: None,
                rule: folded.rule,
                subtract_b_dec: false,
            }
        })
        .collect();
    let set = TranscoderSet { layers, input, output, scan: Some(SCAN.into()), cross_layer: true };
    set.save(out).map_err(|e| RunError::Config(e.to_string()))?;
    Ok(out.to_path_buf())
}
