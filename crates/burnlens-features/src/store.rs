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

use burn::tensor::Tensor;
use burnlens_data::WindowPosition;
use burnlens_dist::Ranks;
use burnlens_model::{HookPoint, Transformer};
use serde::{Deserialize, Serialize};

use crate::cache::CacheReader;
use crate::mixing::{MixingBuffer, Rows};
use crate::pass::{StoreError, WindowSource, pass};

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

/// Where the store's rows come from.
pub enum Producer<'a> {
    /// Model passes over windows, `store_batch_size_prompts` at a time.
    Model { model: &'a Transformer, hooks: Vec<HookPoint>, windows: WindowSource<'a> },
    /// The model passes an activation cache kept ([`crate::cache`]).
    Cache(CacheReader),
}

/// The store: where activations come from and the mixing buffer.
pub struct ActivationStore<'a> {
    producer: Producer<'a>,
    /// Where batches are put.
    pub device: burn::tensor::Device,
    /// Width of each hook's rows.
    pub widths: Vec<usize>,
    pub buffer: MixingBuffer,
    pub cfg: StoreConfig,
    /// Where the corpus's windows stand (a cache's: `windows` counts the passes read), which
    /// a resumed run seeks to.
    pub position: WindowPosition,
    /// The ranks sharing the model passes ([`ActivationStore::shared_by`]).
    ranks: Ranks,
    /// A batch taken from the buffer ahead of its step ([`ActivationStore::prefetch`]); a
    /// checkpoint holds it as the first batch to serve.
    pub(crate) ahead: Option<Rows>,
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
        Self::over(Producer::Model { model, hooks, windows }, widths, cfg, seed, model.device())
    }

    /// A store reading `producer`'s rows of `widths`, at the corpus's start.
    fn over(producer: Producer<'a>, widths: Vec<usize>, cfg: StoreConfig, seed: u64, device: burn::tensor::Device) -> Result<Self, StoreError> {
        // A GPU run keeps its activations there ([`Rows`]); a CPU run's are host slices.
        let held = (!burnlens_model::backend::is_host(&device)).then(|| device.clone());
        let buffer =
            MixingBuffer::new(cfg.buffer_rows(), cfg.train_batch_size_tokens, cfg.mix_fraction, widths.iter().sum(), seed, held).map_err(StoreError::Config)?;
        Ok(ActivationStore {
            device,
            producer,
            widths,
            buffer,
            cfg,
            position: WindowPosition::default(),
            ranks: Ranks::single(),
            ahead: None,
            exhausted: false,
        })
    }

    /// A store over an activation cache, whose passes must be of `store_batch_size_prompts`
    /// windows of `context_size` tokens (what the cache holds decides the batches).
    pub fn from_cache(reader: CacheReader, cfg: StoreConfig, seed: u64, device: burn::tensor::Device) -> Result<Self, StoreError> {
        let index = reader.index();
        if (index.context_size, index.windows_per_chunk) != (cfg.context_size, cfg.store_batch_size_prompts) {
            return Err(StoreError::Config(format!(
                "the cache holds passes of {} windows of {} tokens; the run asks for {} of {}",
                index.windows_per_chunk, index.context_size, cfg.store_batch_size_prompts, cfg.context_size
            )));
        }
        let widths = reader.widths();
        Self::over(Producer::Cache(reader), widths, cfg, seed, device)
    }

    /// The same store with its model passes shared by `ranks`: every rank reads every window,
    /// runs the model on its share of each pass's windows ([`Ranks::rows`]), and the rows
    /// are gathered in window order, so that every rank's buffer is the one process's
    /// (the same batches in the same order, whatever the number of ranks). A cache is read
    /// whole by every rank.
    pub fn shared_by(mut self, ranks: Ranks) -> Self {
        self.ranks = ranks;
        self
    }

    /// Go to `position` (a resumed run continues where it stopped): the corpus's windows
    /// seek there, a cache skips its shards before it.
    pub fn seek(&mut self, position: &WindowPosition) -> Result<(), StoreError> {
        match &mut self.producer {
            Producer::Model { windows, .. } => windows.seek(position)?,
            Producer::Cache(reader) => reader.seek(position.windows)?,
        }
        self.position = *position;
        Ok(())
    }

    /// The next training batch, one `[train_batch_size_tokens, width]` tensor per hook, or
    /// `None` once the corpus is used up (what was left served first).
    pub fn next_batch(&mut self) -> Result<Option<Vec<Tensor<2>>>, StoreError> {
        if self.ahead.is_none() {
            self.prefetch()?;
        }
        Ok(self.ahead.take().map(|rows| self.split(rows)))
    }

    /// Make the next batch now (model passes as needed), to be served by the next
    /// [`ActivationStore::next_batch`]; nothing when one is made already or the corpus is
    /// used up.
    pub fn prefetch(&mut self) -> Result<(), StoreError> {
        while self.ahead.is_none() {
            if let Some(rows) = self.buffer.pop() {
                self.ahead = Some(rows);
            } else if self.exhausted {
                break;
            } else {
                self.refill()?;
            }
        }
        Ok(())
    }

    /// One model pass over the next windows (or one cached pass), into the buffer.
    fn refill(&mut self) -> Result<(), StoreError> {
        let rows = match &mut self.producer {
            Producer::Model { model, hooks, windows } => {
                let batch: Vec<Vec<u32>> = windows.by_ref().take(self.cfg.store_batch_size_prompts).collect::<Result<_, _>>()?;
                self.position = windows.cursor();
                self.exhausted = batch.len() < self.cfg.store_batch_size_prompts;
                let on_host = self.buffer.on_host();
                if batch.is_empty() { None } else { Some(shared_pass(&self.ranks, model, hooks, &batch, self.position.windows, on_host)?) }
            }
            Producer::Cache(reader) => {
                let chunk = reader.next_chunk()?;
                self.position.windows += chunk.is_some() as u64;
                self.exhausted = chunk.is_none();
                chunk.map(Rows::Host)
            }
        };
        if let Some(rows) = rows {
            self.buffer.push(rows);
        }
        if self.exhausted {
            self.buffer.finish();
        }
        Ok(())
    }

    fn split(&self, rows: Rows) -> Vec<Tensor<2>> {
        let all = rows.into_tensor(self.buffer.width, &self.device);
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

/// One pass's activations over `windows`, laid side by side: this rank's share of the
/// windows run, every rank's gathered in rank order (`at`: the windows read so far, for
/// the messages). One process on a GPU (`on_host` false) keeps them there.
fn shared_pass(ranks: &Ranks, model: &Transformer, hooks: &[HookPoint], windows: &[Vec<u32>], at: u64, on_host: bool) -> Result<Rows, StoreError> {
    if ranks.size() == 1 {
        let acts = joined(pass(model, hooks, windows)?);
        return Ok(if on_host { Rows::Host(host(acts)) } else { Rows::Device(acts) });
    }
    let mine = ranks.rows(windows.len());
    let rows = if mine.is_empty() { Vec::new() } else { host(joined(pass(model, hooks, &windows[mine])?)) };
    Ok(Rows::Host(ranks.all_gather_f32(&rows, &format!("the activations of the windows before {at}"))?.concat()))
}

/// One pass's activations laid side by side.
fn joined(acts: Vec<Tensor<2>>) -> Tensor<2> {
    if acts.len() == 1 { acts.into_iter().next().expect("one") } else { Tensor::cat(acts, 1) }
}

/// A pass's activations row-major on the host.
fn host(acts: Tensor<2>) -> Vec<f32> {
    acts.into_data().try_into_vec_as::<f32>().expect("f32 activations")
}
