//! SAELens's mixing buffer (`training/mixing_buffer.py`): activations are appended as model
//! passes produce them; once `buffer_size` rows are held, they are shuffled, a fraction
//! `mix_fraction` of `buffer_size` rows is kept to mix with the next passes and the rest is
//! served in batches of `batch_size` rows. When the input ends, what is left is served in
//! whole batches. Rows are plain `f32` rows of one width (several hooks' activations side by
//! side, so one shuffle keeps them aligned, as SAELens's multi-hook buffer does).
//!
//! Memory: at most `buffer_size` + one pass's rows, times the width, in `f32`.

use std::collections::VecDeque;

use burnlens_model::Rng;
use serde::{Deserialize, Serialize};

/// The buffer and its shuffling state (saved whole in checkpoints).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MixingBuffer {
    pub buffer_size: usize,
    pub batch_size: usize,
    pub mix_fraction: f64,
    pub width: usize,
    /// Rows held for mixing, row-major.
    pub(crate) storage: Vec<f32>,
    /// Batches ready to serve.
    pub(crate) serving: VecDeque<Vec<f32>>,
    pub(crate) rng: Rng,
}

impl MixingBuffer {
    /// `buffer_size ≥ batch_size` rows of `width`, `mix_fraction` in [0, 1] (SAELens checks
    /// the same).
    pub fn new(buffer_size: usize, batch_size: usize, mix_fraction: f64, width: usize, seed: u64) -> Result<Self, String> {
        if buffer_size < batch_size || batch_size == 0 {
            return Err(format!("the buffer ({buffer_size} rows) must hold at least one batch ({batch_size} rows)"));
        }
        if !(0.0..=1.0).contains(&mix_fraction) {
            return Err(format!("mix_fraction {mix_fraction} is not in [0, 1]"));
        }
        Ok(MixingBuffer { buffer_size, batch_size, mix_fraction, width, storage: Vec::new(), serving: VecDeque::new(), rng: Rng::new(seed) })
    }

    fn rows(&self) -> usize {
        self.storage.len() / self.width
    }

    /// Append rows (`rows.len()` a multiple of the width); serve batches if the buffer is full.
    pub fn push(&mut self, rows: &[f32]) {
        debug_assert_eq!(rows.len() % self.width, 0);
        self.storage.extend_from_slice(rows);
        if self.rows() < self.buffer_size {
            return;
        }
        if self.mix_fraction > 0.0 {
            self.shuffle();
        }
        let keep = (self.buffer_size as f64 * self.mix_fraction) as usize;
        let n_batches = ((self.rows() - keep) / self.batch_size).max(1);
        let cut = n_batches * self.batch_size * self.width;
        let rest = self.storage.split_off(cut);
        let serve = std::mem::replace(&mut self.storage, rest);
        self.serving.extend(serve.chunks(self.batch_size * self.width).map(|c| c.to_vec()));
    }

    /// The input has ended: the whole batches left are served too.
    pub fn finish(&mut self) {
        let whole = self.rows() / self.batch_size * self.batch_size * self.width;
        let rest = self.storage.split_off(whole);
        let serve = std::mem::replace(&mut self.storage, rest);
        self.serving.extend(serve.chunks(self.batch_size * self.width).map(|c| c.to_vec()));
    }

    /// The next batch (`batch_size` rows), if one is ready.
    pub fn pop(&mut self) -> Option<Vec<f32>> {
        self.serving.pop_front()
    }

    /// A uniform permutation of the held rows (Fisher–Yates).
    fn shuffle(&mut self) {
        let (n, w) = (self.rows(), self.width);
        for i in (1..n).rev() {
            let j = self.rng.below(i as u64 + 1) as usize;
            if i != j {
                let (a, b) = self.storage.split_at_mut(i * w);
                a[j * w..(j + 1) * w].swap_with_slice(&mut b[..w]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows numbered 0.. in passes of 7 through a buffer of 10, batches of 4, half kept.
    fn served(mix: f64) -> (Vec<Vec<f32>>, usize) {
        let mut b = MixingBuffer::new(10, 4, mix, 1, 3).unwrap();
        let mut out = Vec::new();
        let mut max_held = 0;
        for pass in 0..6 {
            let rows: Vec<f32> = (pass * 7..pass * 7 + 7).map(|r| r as f32).collect();
            b.push(&rows);
            max_held = max_held.max(b.rows());
            while let Some(batch) = b.pop() {
                out.push(batch);
            }
        }
        b.finish();
        while let Some(batch) = b.pop() {
            out.push(batch);
        }
        (out, max_held)
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
}
