//! The activation store: context windows in, shuffled activation batches out. Model passes
//! run without gradients on `store_batch_size_prompts` windows at a time; one pass feeds
//! every requested hook point (several SAEs from one pass, as SAELens's multi-SAE runner);
//! activations are flattened to `[tokens, d]` per hook, laid side by side and mixed in a
//! [`MixingBuffer`] of `n_batches_in_buffer` model passes (`n_batches_in_buffer ×
//! store_batch_size_prompts × context_size` tokens). SAELens 6.54 sizes it
//! `n_batches_in_buffer × context_size` tokens, which is smaller than one training batch
//! with its own defaults (20 × 128 < 4096) and so refused by its own mixing buffer; the
//! earlier SAELens meaning of `n_batches_in_buffer` (model batches held) is kept here.
//!
//! Memory: the buffer (see [`StoreConfig::buffer_rows`]) plus one pass's rows
//! (`store_batch_size_prompts × context_size`), each row the hooks' widths summed, in f32
//! ([`StoreConfig::buffer_bytes`]); the corpus itself is streamed.

use burn::tensor::{Int, Tensor, TensorData};
use burnlens_model::{Activation, Forward, HookPoint, Hooks, Stop, Transformer};
use serde::{Deserialize, Serialize};

use crate::mixing::MixingBuffer;

/// SAELens's activation-store settings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct StoreConfig {
    pub context_size: usize,
    /// Windows per model pass.
    pub store_batch_size_prompts: usize,
    pub n_batches_in_buffer: usize,
    /// Rows (tokens) per training batch.
    pub train_batch_size_tokens: usize,
    /// Fraction of the buffer kept for mixing (SAELens's `activations_mixing_fraction`).
    pub mix_fraction: f64,
}

impl StoreConfig {
    /// Rows the mixing buffer holds before it serves: `n_batches_in_buffer` model passes.
    pub fn buffer_rows(&self) -> usize {
        self.n_batches_in_buffer * self.store_batch_size_prompts * self.context_size
    }

    /// The most bytes of activations held at once, for rows of `width` floats.
    pub fn buffer_bytes(&self, width: usize) -> usize {
        (self.buffer_rows() + self.store_batch_size_prompts * self.context_size) * width * 4
    }
}

/// A problem producing activations.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("hook point `{hook}`: {msg}")]
    Hook { hook: String, msg: String },
    #[error("{0}")]
    Data(#[from] burnlens_data::DataError),
    #[error("activation store: {0}")]
    Config(String),
}

/// Where windows come from: any iterator of windows of `context_size` token ids.
pub type WindowSource<'a> = burnlens_data::WindowIter<'a>;

/// The store: a model, its hook points, a window source and the mixing buffer.
pub struct ActivationStore<'a> {
    model: &'a Transformer,
    hooks: Vec<HookPoint>,
    /// Width of each hook's rows.
    pub widths: Vec<usize>,
    windows: WindowSource<'a>,
    pub buffer: MixingBuffer,
    pub cfg: StoreConfig,
    /// Windows taken from the source so far (where a resumed run skips to).
    pub windows_read: u64,
    exhausted: bool,
}

impl<'a> ActivationStore<'a> {
    /// A store over `windows`, reading `hooks` of `model`; each hook's width is found by a
    /// one-window probe pass of the model. `seed` drives the buffer's shuffles.
    pub fn new(model: &'a Transformer, hooks: Vec<HookPoint>, windows: WindowSource<'a>, cfg: StoreConfig, seed: u64) -> Result<Self, StoreError> {
        if cfg.context_size > model.config.n_ctx || cfg.context_size < 2 {
            return Err(StoreError::Config(format!("context_size {} is not between 2 and the model's context {}", cfg.context_size, model.config.n_ctx)));
        }
        let known = burnlens_model::hook_points(&model.config);
        if let Some(h) = hooks.iter().find(|h| !known.contains(h)) {
            return Err(StoreError::Hook { hook: h.name(), msg: "the model has no hook point of that name".into() });
        }
        let probe = pass(model, &hooks, &[vec![0; 2]])?;
        let widths: Vec<usize> = probe.iter().map(|t| t.dims()[1]).collect();
        let buffer = MixingBuffer::new(cfg.buffer_rows(), cfg.train_batch_size_tokens, cfg.mix_fraction, widths.iter().sum(), seed).map_err(StoreError::Config)?;
        Ok(ActivationStore { model, hooks, widths, windows, buffer, cfg, windows_read: 0, exhausted: false })
    }

    /// Skip `n` windows of the source (a resumed run continues where it stopped).
    pub fn skip_windows(&mut self, n: u64) -> Result<(), StoreError> {
        for _ in 0..n {
            match self.windows.next() {
                Some(w) => drop(w?),
                None => return Err(StoreError::Config(format!("the dataset has fewer than the {n} windows this run had read"))),
            }
        }
        self.windows_read = n;
        Ok(())
    }

    /// The next training batch, one `[train_batch_size_tokens, width]` tensor per hook, or
    /// `None` once the corpus is used up (what was left served first).
    pub fn next_batch(&mut self) -> Result<Option<Vec<Tensor<2>>>, StoreError> {
        loop {
            if let Some(rows) = self.buffer.pop() {
                return Ok(Some(self.split(rows)));
            }
            if self.exhausted {
                return Ok(None);
            }
            self.refill()?;
        }
    }

    /// One model pass over the next windows, into the buffer.
    fn refill(&mut self) -> Result<(), StoreError> {
        let mut batch = Vec::with_capacity(self.cfg.store_batch_size_prompts);
        while batch.len() < self.cfg.store_batch_size_prompts {
            match self.windows.next() {
                Some(w) => batch.push(w?),
                None => break,
            }
        }
        self.windows_read += batch.len() as u64;
        if batch.len() < self.cfg.store_batch_size_prompts {
            self.exhausted = true;
        }
        if !batch.is_empty() {
            let acts = pass(self.model, &self.hooks, &batch)?;
            let rows = acts[0].dims()[0];
            let joined = if acts.len() == 1 { acts.into_iter().next().expect("one") } else { Tensor::cat(acts, 1) };
            let flat: Vec<f32> = joined.into_data().try_into_vec_as::<f32>().expect("f32 activations");
            debug_assert_eq!(flat.len(), rows * self.buffer.width);
            self.buffer.push(&flat);
        }
        if self.exhausted {
            self.buffer.finish();
        }
        Ok(())
    }

    fn split(&self, rows: Vec<f32>) -> Vec<Tensor<2>> {
        let device = self.model.device();
        let n = rows.len() / self.buffer.width;
        let all = Tensor::<2>::from_data(TensorData::new(rows, [n, self.buffer.width]), &device);
        let mut start = 0;
        self.widths
            .iter()
            .map(|&w| {
                let t = all.clone().narrow(1, start, w);
                start += w;
                t
            })
            .collect()
    }
}

/// The activations at `hooks` for `windows` (one model pass), each `[tokens, width]`.
pub fn pass(model: &Transformer, hooks: &[HookPoint], windows: &[Vec<u32>]) -> Result<Vec<Tensor<2>>, StoreError> {
    let (b, t) = (windows.len(), windows[0].len());
    let flat: Vec<i64> = windows.iter().flatten().map(|&id| id as i64).collect();
    if let Some(&bad) = flat.iter().find(|&&id| id as usize >= model.config.vocab_size) {
        return Err(StoreError::Config(format!("token id {bad} is outside the model's vocabulary of {}", model.config.vocab_size)));
    }
    let ids = Tensor::<2, Int>::from_data(TensorData::new(flat, [b, t]), &model.device());
    let names: Vec<String> = hooks.iter().map(|h| h.name()).collect();
    let mut h = Hooks::capture(|n| names.iter().any(|m| m == n));
    // As SAELens's store (`stop_at_layer`): nothing after the last block read runs.
    let layers: Option<Vec<usize>> = hooks.iter().map(|p| p.layer()).collect();
    let stop = match layers.and_then(|l| l.into_iter().max()) {
        Some(l) => Stop::AfterBlock(l),
        None => Stop::FinalStream,
    };
    model.forward_with(Forward::new(ids).hooks(&mut h).stop(stop));
    let mut cache = h.take_cache();
    names
        .iter()
        .map(|name| match cache.remove(name) {
            Some(Activation::Rank3(a)) => {
                let [b, t, d] = a.dims();
                Ok(a.reshape([b * t, d]))
            }
            Some(Activation::Rank4(a)) if name.ends_with("hook_z") => {
                let [b, t, h, d] = a.dims();
                Ok(a.reshape([b * t, h * d]))
            }
            Some(a) => Err(StoreError::Hook { hook: name.clone(), msg: format!("activation of shape {:?}: only [batch, pos, d] points and hook_z can be trained on", a.dims()) }),
            None => Err(StoreError::Hook { hook: name.clone(), msg: "not produced by the forward pass".into() }),
        })
        .collect()
}
