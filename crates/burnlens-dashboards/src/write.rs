//! A run's folder: `features/<id>.json` (each dashboard as burnlens keeps it, which
//! `burnlens graph --features` and Python read), `neuronpedia/batch-<n>.json` (Neuronpedia's
//! import), `circuit-tracer/<id>.json` (its graph viewer's local feature files), `html/`
//! (the offline browser) and `run.json` (what was read, how long it took). Every file is
//! written whole or not at all; `run.json`, written last and flushed to disk, says the
//! folder is complete (the many per-feature files are renamed into place unflushed).

use std::path::{Path, PathBuf};

use rayon::prelude::*;
use serde_json::json;

use crate::config::DashboardConfig;
use crate::dashboard::FeatureDashboard;
use crate::dashboard::FeatureKey;
use crate::error::DashboardError;
use crate::html::{centre, feature_script, index_page};
use crate::neuronpedia::{BatchInfo, batch};

/// Features per Neuronpedia batch file.
pub const NEURONPEDIA_BATCH: usize = 128;

/// What the files say about the run.
pub struct RunInfo<'a> {
    pub model_id: &'a str,
    pub layer: usize,
    pub sae_set: &'a str,
    pub dataset: &'a str,
    pub tokens: u64,
    pub seq_len: usize,
    /// Anything else for `run.json` (timings, memory).
    pub extra: serde_json::Value,
}

fn write(path: &Path, bytes: &[u8]) -> Result<(), DashboardError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| DashboardError::io(dir, e))?;
    }
    Ok(burnlens_model::files::write_replacing(path, bytes)?)
}

/// Writes every output; returns the browser's `index.html`.
pub fn write_all(
    out: &Path,
    dashboards: &[FeatureDashboard],
    cfg: &DashboardConfig,
    info: &RunInfo,
    tok: &(dyn Fn(u32) -> String + Sync),
) -> Result<PathBuf, DashboardError> {
    let ctx = cfg.context;
    let centre_of = move |p: usize| centre(ctx, p);
    dashboards.par_iter().try_for_each(|d| -> Result<(), DashboardError> {
        let stem = d.key().stem();
        write(&out.join(format!("features/{stem}.json")), serde_json::to_string(d).expect("json").as_bytes())?;
        let ct = crate::circuit_tracer::feature(d, info.sae_set, tok, &centre_of);
        write(&out.join(format!("circuit-tracer/{}.json", ct["index"])), ct.to_string().as_bytes())?;
        write(&out.join(format!("html/features/{stem}.js")), feature_script(d, tok).as_bytes())
    })?;
    let mut np = BatchInfo {
        model_id: info.model_id,
        layer: info.layer,
        sae_set: info.sae_set,
        dataset: info.dataset,
        n_prompts_total: info.tokens / info.seq_len.max(1) as u64,
        n_tokens_in_prompt: info.seq_len,
        centre_index: &centre_of,
    };
    // One series of batches per layer (a transcoder set's layers are separate SAEs to
    // Neuronpedia).
    for group in dashboards.chunk_by(|a, b| a.layer == b.layer) {
        let folder = match group[0].layer {
            Some(l) => {
                np.layer = l;
                out.join(format!("neuronpedia/layer-{l}"))
            }
            None => out.join("neuronpedia"),
        };
        for (i, chunk) in group.chunks(NEURONPEDIA_BATCH).enumerate() {
            write(&folder.join(format!("batch-{i}.json")), batch(chunk, tok, &np).to_string().as_bytes())?;
        }
    }
    let summary = format!("{} features of {} ({}) over {} tokens of {}", dashboards.len(), info.sae_set, info.model_id, info.tokens, info.dataset);
    let index = out.join("html/index.html");
    write(&index, index_page(dashboards, tok, &summary, ctx, info.tokens).as_bytes())?;
    let run = json!({ "config": cfg, "model": info.model_id, "sae": info.sae_set, "dataset": info.dataset, "tokens": info.tokens, "seq_len": info.seq_len, "features": dashboards.len(), "run": info.extra });
    let path = out.join("run.json");
    burnlens_model::files::write_atomic(&path, serde_json::to_string_pretty(&run).expect("json").as_bytes())?;
    Ok(index)
}

/// A dashboard written by [`write_all`], read back (`None` when the folder has no such
/// feature).
pub fn read_feature(dir: &Path, key: FeatureKey) -> Result<Option<FeatureDashboard>, DashboardError> {
    let path = dir.join(format!("features/{}.json", key.stem()));
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&path).map_err(|e| DashboardError::io(&path, e))?;
    serde_json::from_str(&text).map(Some).map_err(|e| DashboardError::io(&path, format!("not a feature dashboard: {e}")))
}
