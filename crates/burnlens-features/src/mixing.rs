//! SAELens's mixing buffer (`training/mixing_buffer.py`): activations are appended as model
//! passes produce them; once `buffer_size` rows are held, they are shuffled, a fraction
//! `mix_fraction` of `buffer_size` rows is kept to mix with the next passes and the rest is
//! served in batches of `batch_size` rows. When the input ends, what is left is served in
//! whole batches. Rows are plain `f32` rows of one width (several hooks' activations side by
//! side, so one shuffle keeps them aligned, as SAELens's multi-hook buffer does).
//!
//! Where the rows live ([`Rows`]): on the host for a CPU run, where the shuffle swaps rows in
//! place; on the GPU for a GPU run, where a model pass's activations are appended as they
//! are, the shuffle gathers the rows by one permutation made on the host (its indices are
//! all that cross the bus) and a batch is a slice of the shuffled rows, so no activation
//! leaves the device. Both draw the permutation from the same generator in the same order:
//! the same seed serves the same batches on either.
//!
//! Memory: at most `buffer_size` + one pass's rows, times the width, in `f32` (a GPU run
//! briefly twice that while it appends or gathers).

use std::collections::VecDeque;

use burn::tensor::{Device, Int, Tensor, TensorData};
use burnlens_model::Rng;

/// Rows of one width: on the host (row-major) or a `[rows, width]` tensor on a device (never
/// empty: no rows are an empty host run wherever the buffer lives).
#[derive(Debug, Clone)]
pub enum Rows {
    Host(Vec<f32>),
    Device(Tensor<2>),
}

impl Rows {
    fn count(&self, width: usize) -> usize {
        match self {
            Rows::Host(v) => v.len() / width.max(1),
            Rows::Device(t) => t.dims()[0],
        }
    }

    /// The rows on the host, row-major (a device's read back: for checkpoints).
    pub fn to_host(&self) -> Vec<f32> {
        match self {
            Rows::Host(v) => v.clone(),
            Rows::Device(t) => t.to_data().try_into_vec_as::<f32>().expect("f32 rows"),
        }
    }

    /// The rows as a `[rows, width]` tensor on `device` (a device's as they are).
    pub fn into_tensor(self, width: usize, device: &Device) -> Tensor<2> {
        match self {
            Rows::Host(v) => {
                let n = v.len() / width.max(1);
                Tensor::from_data(TensorData::new(v, [n, width]), device)
            }
            Rows::Device(t) => t,
        }
    }

    /// Rows `range` (a slice of the tensor on a device).
    fn range(&self, range: std::ops::Range<usize>, width: usize) -> Rows {
        match self {
            Rows::Host(v) => Rows::Host(v[range.start * width..range.end * width].to_vec()),
            Rows::Device(_) if range.is_empty() => Rows::Host(Vec::new()),
            Rows::Device(t) => Rows::Device(t.clone().narrow(0, range.start, range.len())),
        }
    }
}

/// The buffer and its shuffling state (checkpoints save the rows, the batches ready and the
/// generator).
#[derive(Debug, Clone)]
pub struct MixingBuffer {
    pub buffer_size: usize,
    pub batch_size: usize,
    pub mix_fraction: f64,
    pub width: usize,
    /// Where the rows are held: `None` on the host, else on that device.
    device: Option<Device>,
    /// Rows held for mixing.
    storage: Rows,
    /// Batches ready to serve.
    serving: VecDeque<Rows>,
    pub(crate) rng: Rng,
}

impl MixingBuffer {
    /// `buffer_size ≥ batch_size` rows of `width`, `mix_fraction` in [0, 1] (SAELens checks
    /// the same), held on `device` (`None`: the host).
    pub fn new(buffer_size: usize, batch_size: usize, mix_fraction: f64, width: usize, seed: u64, device: Option<Device>) -> Result<Self, String> {
        if buffer_size < batch_size || batch_size == 0 {
            return Err(format!("the buffer ({buffer_size} rows) must hold at least one batch ({batch_size} rows)"));
        }
        if !(0.0..=1.0).contains(&mix_fraction) {
            return Err(format!("mix_fraction {mix_fraction} is not in [0, 1]"));
        }
        let storage = Rows::Host(Vec::new());
        Ok(MixingBuffer { buffer_size, batch_size, mix_fraction, width, device, storage, serving: VecDeque::new(), rng: Rng::new(seed) })
    }

    fn rows(&self) -> usize {
        self.storage.count(self.width)
    }

    /// Append rows (a host run's length a multiple of the width); serve batches if the
    /// buffer is full. Rows not where the buffer holds them are moved there.
    pub fn push(&mut self, rows: Rows) {
        self.storage = match (std::mem::replace(&mut self.storage, Rows::Host(Vec::new())), &self.device) {
            (Rows::Host(mut held), None) => {
                match rows {
                    Rows::Host(rows) => held.extend_from_slice(&rows),
                    rows => held.extend(rows.to_host()),
                }
                debug_assert_eq!(held.len() % self.width.max(1), 0);
                Rows::Host(held)
            }
            (held, device) => {
                let device = device.as_ref().expect("a device buffer");
                let w = self.width;
                match (held.count(w), rows.count(w)) {
                    (_, 0) => held,
                    (0, _) => Rows::Device(rows.into_tensor(w, device)),
                    _ => Rows::Device(Tensor::cat(vec![held.into_tensor(w, device), rows.into_tensor(w, device)], 0)),
                }
            }
        };
        if self.rows() < self.buffer_size {
            return;
        }
        if self.mix_fraction > 0.0 {
            self.shuffle();
        }
        let keep = (self.buffer_size as f64 * self.mix_fraction) as usize;
        let n_batches = ((self.rows() - keep) / self.batch_size).max(1);
        self.serve(n_batches * self.batch_size);
    }

    /// The input has ended: the whole batches left are served too.
    pub fn finish(&mut self) {
        self.serve(self.rows() / self.batch_size * self.batch_size);
    }

    /// The first `n` held rows (whole batches) move to the batches ready (each row copied
    /// once on the host, sliced on a device).
    fn serve(&mut self, n: usize) {
        let (held, w, batch) = (self.rows(), self.width, self.batch_size);
        let storage = &self.storage;
        self.serving.extend((0..n).step_by(batch).map(|r| storage.range(r..r + batch, w)));
        self.storage = self.storage.range(n..held, w);
    }

    /// Whether the rows are held on the host (a CPU run).
    pub fn on_host(&self) -> bool {
        self.device.is_none()
    }

    /// The next batch (`batch_size` rows), if one is ready.
    pub fn pop(&mut self) -> Option<Rows> {
        self.serving.pop_front()
    }

    /// A uniform permutation of the held rows (Fisher–Yates): on the host the rows swap in
    /// place; on a device the same swaps, made on a list of indices, gather them.
    fn shuffle(&mut self) {
        let (n, w) = (self.rows(), self.width);
        match &mut self.storage {
            Rows::Host(storage) => {
                for i in (1..n).rev() {
                    let j = self.rng.below(i as u64 + 1) as usize;
                    if i != j {
                        let (a, b) = storage.split_at_mut(i * w);
                        a[j * w..(j + 1) * w].swap_with_slice(&mut b[..w]);
                    }
                }
            }
            Rows::Device(t) => {
                let mut order: Vec<i64> = (0..n as i64).collect();
                for i in (1..n).rev() {
                    let j = self.rng.below(i as u64 + 1) as usize;
                    order.swap(i, j);
                }
                let device = t.device();
                let order = Tensor::<1, Int>::from_data(TensorData::new(order, [n]), &device);
                *t = t.clone().select(0, order);
            }
        }
    }

    /// What a checkpoint saves: the held rows and the batches ready after `ahead` (one made
    /// ahead of its step, the first to serve), on the host.
    pub(crate) fn saved(&self, ahead: Option<&Rows>) -> (Vec<f32>, Vec<f32>) {
        (self.storage.to_host(), ahead.into_iter().chain(&self.serving).flat_map(|r| r.to_host()).collect())
    }

    /// A checkpoint's rows and batches back (where the buffer holds them), and its generator.
    pub(crate) fn restore(&mut self, storage: Vec<f32>, serving: Vec<f32>, rng: Rng) {
        let batch = self.batch_size * self.width;
        let on = |v: Vec<f32>| match &self.device {
            Some(d) if !v.is_empty() => Rows::Device(Rows::Host(v).into_tensor(self.width, d)),
            _ => Rows::Host(v),
        };
        self.storage = on(storage);
        self.serving = serving.chunks(batch.max(1)).map(|c| on(c.to_vec())).collect();
        self.rng = rng;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows numbered 0.. in passes of 7 through a buffer of 10, batches of 4, half kept
    /// (rows of `width` values: row `r`'s are `r, r + 0.25, …`), held on `device`; each
    /// pass pushed as host rows, or as a tensor where `tensors`.
    fn served_on(mix: f64, width: usize, device: Option<Device>, tensors: bool) -> (Vec<Vec<f32>>, usize) {
        let mut b = MixingBuffer::new(10, 4, mix, width, 3, device).unwrap();
        let mut out = Vec::new();
        let mut max_held = 0;
        let take = |b: &mut MixingBuffer, out: &mut Vec<Vec<f32>>| {
            while let Some(batch) = b.pop() {
                out.push(batch.to_host());
            }
        };
        for pass in 0..6 {
            let rows: Vec<f32> = (pass * 7..pass * 7 + 7).flat_map(|r| (0..width).map(move |c| r as f32 + c as f32 / 4.0)).collect();
            b.push(if tensors { Rows::Device(Rows::Host(rows).into_tensor(width, &Device::default())) } else { Rows::Host(rows) });
            max_held = max_held.max(b.rows());
            take(&mut b, &mut out);
        }
        b.finish();
        take(&mut b, &mut out);
        (out, max_held)
    }

    fn served(mix: f64) -> (Vec<Vec<f32>>, usize) {
        served_on(mix, 1, None, false)
    }

    #[test]
    fn every_row_is_served_once_in_whole_batches_and_mixed() {
        let (batches, held) = served(0.5);
        assert!(batches.iter().all(|b| b.len() == 4));
        let mut rows: Vec<f32> = batches.concat();
        assert_ne!(rows, (0..rows.len()).map(|r| r as f32).collect::<Vec<_>>(), "shuffled");
        rows.sort_by(f32::total_cmp);
        rows.dedup();
        assert_eq!(rows.len(), 40, "42 rows in, 40 served in whole batches, none twice");
        assert!(held <= 10 + 7, "at most the buffer plus one pass is held: {held}");
        // Without mixing, rows come out in order.
        let (plain, _) = served(0.0);
        assert_eq!(plain.concat(), (0..40).map(|r| r as f32).collect::<Vec<_>>());
    }

    #[test]
    fn a_buffer_on_a_device_serves_the_host_buffers_batches() {
        // A device's buffer runs its own code (tensors appended, gathered by a permutation,
        // sliced); the CPU's backend stands in for a GPU here, `tests/gpu_kernels.rs` runs
        // it on one.
        for mix in [0.5, 0.0, 1.0] {
            let (want, _) = served_on(mix, 3, None, false);
            for tensors in [false, true] {
                let (got, held) = served_on(mix, 3, Some(Device::default()), tensors);
                assert_eq!(got, want, "mix {mix}, passes as tensors: {tensors}");
                assert!(held <= 17, "{held}");
            }
        }
    }

    #[test]
    fn a_checkpoint_moves_between_host_and_device_and_serves_on() {
        let push = |b: &mut MixingBuffer, pass: usize| b.push(Rows::Host((pass * 7..pass * 7 + 7).map(|r| r as f32).collect()));
        for device in [None, Some(Device::default())] {
            let mut a = MixingBuffer::new(10, 4, 0.5, 1, 5, device.clone()).unwrap();
            for pass in 0..3 {
                push(&mut a, pass);
            }
            let ahead = a.pop();
            let (storage, serving) = a.saved(ahead.as_ref());
            // Restored where the other kind of run holds it.
            let other = if device.is_none() { Some(Device::default()) } else { None };
            let mut b = MixingBuffer::new(10, 4, 0.5, 1, 99, other).unwrap();
            b.restore(storage, serving, a.rng.clone());
            let mut from_a: Vec<f32> = ahead.map(|r| r.to_host()).unwrap_or_default();
            let (mut from_b, mut rest) = (Vec::new(), Vec::new());
            for pass in 3..6 {
                push(&mut a, pass);
                push(&mut b, pass);
            }
            for (buf, out) in [(&mut a, &mut rest), (&mut b, &mut from_b)] {
                buf.finish();
                while let Some(r) = buf.pop() {
                    out.extend(r.to_host());
                }
            }
            from_a.extend(rest);
            assert_eq!(from_b, from_a, "held on {device:?}");
        }
    }
}
