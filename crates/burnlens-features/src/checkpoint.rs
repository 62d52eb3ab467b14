//! A training run's checkpoint, in the format of every long run
//! ([`burnlens_model::checkpoints`]: a directory per checkpoint written whole and renamed,
//! `LATEST` after it, two kept):
//!
//! ```text
//! RUN_DIR/checkpoints/step-000500/state.json          RunState: the step, Adam's step counts,
//!                                                     BatchTopK thresholds, the data position,
//!                                                     the shuffling state
//! RUN_DIR/checkpoints/step-000500/tensors.safetensors site{i}.param.*, site{i}.adam_m.*,
//!                                                     site{i}.adam_v.*, site{i}.since_fired,
//!                                                     site{i}.fired_tokens, buffer.storage,
//!                                                     buffer.serving
//! ```

use std::path::{Path, PathBuf};

use burn::tensor::{Device, Tensor, TensorData};
use burnlens_data::WindowPosition;
use burnlens_lens::dictionary::Dictionary;
use burnlens_model::Rng;
use burnlens_model::checkpoints::{Checkpoints, read_state};
use burnlens_model::files::{FileTensor, write_safetensors};
use safetensors::Dtype;
use serde::{Deserialize, Serialize};

use crate::config::{RunError, file_err};
use crate::params::Trainable;
use crate::store::ActivationStore;
use crate::trainer::SaeTrainer;

const TENSORS: &str = "tensors.safetensors";
/// The checkpoint's layout: 3 holds a skip transcoder's `W_skip` as the dictionary does
/// (`[d_in, d_out]`) and the corpus's position as a [`WindowPosition`].
const FORMAT: u64 = 3;

/// What a checkpoint records besides its tensors.
#[derive(Debug, Serialize, Deserialize)]
struct RunState {
    format: u64,
    step: usize,
    /// Per site.
    adam_t: Vec<u64>,
    topk_threshold: Vec<f64>,
    /// Where the store's corpus stood (a cache's: the passes read).
    position: WindowPosition,
    rng: Rng,
}

type Entry = (String, Dtype, Vec<usize>, Vec<u8>);

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn tensor_entry(name: String, t: &Tensor<2>) -> Entry {
    (name, Dtype::F32, t.dims().to_vec(), f32_bytes(&t.to_data().try_into_vec_as::<f32>().expect("f32")))
}

fn u64_entry(name: String, v: &[u64]) -> Entry {
    (name, Dtype::U64, vec![v.len()], v.iter().flat_map(|x| x.to_le_bytes()).collect())
}

/// Write the checkpoint of the trainers' step; returns its directory.
pub fn save(run_dir: &Path, trainers: &[SaeTrainer], store: &ActivationStore) -> Result<PathBuf, RunError> {
    let mut tensors: Vec<Entry> = Vec::new();
    for (i, t) in trainers.iter().enumerate() {
        for (prefix, p) in [("param", &t.params), ("adam_m", &t.adam.m), ("adam_v", &t.adam.v)] {
            tensors.extend(p.named().into_iter().map(|(name, v)| tensor_entry(format!("site{i}.{prefix}.{name}"), &v)));
        }
        let since: Vec<u64> = t.since_fired.iter().map(|&x| x as u64).collect();
        tensors.push(u64_entry(format!("site{i}.since_fired"), &since));
        tensors.push(u64_entry(format!("site{i}.fired_tokens"), &t.fired_tokens));
    }
    let w = store.buffer.width;
    // A batch made ahead of its step is the first to serve.
    let (storage, serving) = store.buffer.saved(store.ahead.as_ref());
    for (name, rows) in [("buffer.storage", &storage), ("buffer.serving", &serving)] {
        tensors.push((name.into(), Dtype::F32, vec![rows.len() / w, w], f32_bytes(rows)));
    }
    let state = RunState {
        format: FORMAT,
        step: trainers[0].step,
        adam_t: trainers.iter().map(|t| t.adam.t).collect(),
        topk_threshold: trainers.iter().map(|t| t.topk_threshold).collect(),
        position: store.position,
        rng: store.buffer.rng.clone(),
    };
    let files: Vec<FileTensor> = tensors.iter().map(|(n, d, s, b)| FileTensor { name: n, dtype: *d, shape: s.clone(), bytes: b }).collect();
    Checkpoints::of_run(run_dir).save(state.step as u64, &state, |dir| -> Result<(), RunError> { Ok(write_safetensors(&dir.join(TENSORS), &files, None)?) })
}

/// A checkpoint's tensors.
struct Saved<'a> {
    path: &'a Path,
    st: safetensors::SafeTensors<'a>,
}

impl Saved<'_> {
    fn bad(&self, msg: String) -> RunError {
        file_err(self.path, msg)
    }

    fn f32s(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>), RunError> {
        let v = self.st.tensor(name).map_err(|_| self.bad(format!("has no tensor `{name}`")))?;
        Ok((v.shape().to_vec(), v.data().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes"))).collect()))
    }

    fn u64s(&self, name: &str) -> Result<Vec<u64>, RunError> {
        let v = self.st.tensor(name).map_err(|_| self.bad(format!("has no tensor `{name}`")))?;
        Ok(v.data().chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect())
    }

    /// Parameters shaped like `like`, from tensors `{prefix}.{name}`.
    fn params(&self, prefix: &str, like: &Dictionary, device: &Device) -> Result<Dictionary, RunError> {
        let mut err = None;
        let p = like.map(|name, like| match self.f32s(&format!("{prefix}.{name}")) {
            Ok((shape, v)) if shape == like.dims() => Tensor::from_data(TensorData::new(v, like.dims()), device),
            Ok((shape, _)) => {
                err.get_or_insert(self.bad(format!("tensor `{prefix}.{name}` has shape {shape:?}, the configuration gives {:?}", like.dims())));
                like
            }
            Err(e) => {
                err.get_or_insert(e);
                like
            }
        });
        err.map_or(Ok(p), Err)
    }
}

/// What resuming needs of each site: a dictionary shaped like it (its values unused), and
/// how to make its trainer from trained parameters.
pub struct Site<'a> {
    pub like: Dictionary,
    pub trainer: Box<dyn Fn(Dictionary) -> SaeTrainer + 'a>,
}

/// The trainers of the run's latest checkpoint (the store moved to where it was), or `None`
/// for a run without one.
pub fn load(run_dir: &Path, sites: &[Site], store: &mut ActivationStore) -> Result<Option<Vec<SaeTrainer>>, RunError> {
    let older = run_dir.join("checkpoint.safetensors");
    if older.is_file() {
        return Err(file_err(&older, "a checkpoint of an older burnlens, which this one does not resume; remove it to start again"));
    }
    let Some(dir) = Checkpoints::of_run(run_dir).latest()? else { return Ok(None) };
    let state: RunState = read_state(&dir)?;
    if state.format != FORMAT || state.adam_t.len() != sites.len() || state.topk_threshold.len() != sites.len() {
        return Err(file_err(
            &dir,
            format!("a checkpoint of another layout or run (format {}, {} sites); remove it to start again", state.format, state.adam_t.len()),
        ));
    }
    let path = dir.join(TENSORS);
    let bytes = std::fs::read(&path).map_err(|e| file_err(&path, e))?;
    let st = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| file_err(&path, format!("not a readable checkpoint: {e}")))?;
    let saved = Saved { path: &path, st };
    let device = store.device.clone();
    let mut trainers = Vec::with_capacity(sites.len());
    for (i, site) in sites.iter().enumerate() {
        let prefix = format!("site{i}");
        let mut t = (site.trainer)(saved.params(&format!("{prefix}.param"), &site.like, &device)?);
        t.adam.m = saved.params(&format!("{prefix}.adam_m"), &site.like, &device)?;
        t.adam.v = saved.params(&format!("{prefix}.adam_v"), &site.like, &device)?;
        (t.adam.t, t.topk_threshold, t.step) = (state.adam_t[i], state.topk_threshold[i], state.step);
        t.since_fired = saved.u64s(&format!("{prefix}.since_fired"))?.into_iter().map(|x| x as u32).collect();
        t.fired_tokens = saved.u64s(&format!("{prefix}.fired_tokens"))?;
        if t.since_fired.len() != site.like.d_sae() {
            return Err(saved.bad(format!("holds {} features, the configuration {}", t.since_fired.len(), site.like.d_sae())));
        }
        trainers.push(t);
    }
    store.seek(&state.position)?;
    store.buffer.restore(saved.f32s("buffer.storage")?.1, saved.f32s("buffer.serving")?.1, state.rng);
    Ok(Some(trainers))
}
