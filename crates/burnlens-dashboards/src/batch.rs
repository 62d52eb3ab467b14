//! One model pass's feature activations, as the passes read them: a row per token of
//! `windows × seq_len`, a column per feature, with the tokens they were read at.

use crate::config::DashboardConfig;

/// Feature activations of consecutive windows.
pub struct ActBatch {
    /// `[rows, n_features]`, row-major.
    pub acts: Vec<f32>,
    pub n_features: usize,
    /// The token of each row.
    pub tokens: Vec<u32>,
    pub seq_len: usize,
    /// The corpus index of the first window.
    pub first_window: u64,
}

impl ActBatch {
    pub fn rows(&self) -> usize {
        self.tokens.len()
    }

    /// Row `r`'s activations.
    pub fn row(&self, r: usize) -> &[f32] {
        &self.acts[r * self.n_features..(r + 1) * self.n_features]
    }

    /// Ignored tokens and positions read zero for every feature (SAEDashboard multiplies
    /// the activations by its ignore mask before any statistic).
    pub fn mask(&mut self, cfg: &DashboardConfig) {
        for r in 0..self.rows() {
            if !cfg.counts(self.tokens[r], r % self.seq_len) {
                let n = self.n_features;
                self.acts[r * n..(r + 1) * n].fill(0.0);
            }
        }
    }
}

/// Where an example stands: its value, window and position in the window.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct Key {
    pub value: f32,
    pub window: u64,
    pub pos: u32,
}

/// Examples kept per owner (a feature, or a feature's quantile group): `per` slots, each
/// with its key and the tokens and activations it shows (`width` of each).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Slots {
    pub per: usize,
    pub width: usize,
    pub keys: Vec<Key>,
    pub tokens: Vec<u32>,
    pub acts: Vec<f32>,
}

impl Slots {
    pub fn new(owners: usize, per: usize, width: usize) -> Self {
        Slots { per, width, keys: vec![Key::default(); owners * per], tokens: vec![0; owners * per * width], acts: vec![0.0; owners * per * width] }
    }

    /// Slot `slot` of `owner` becomes the example centred on batch row `row`, reading
    /// column `col`.
    pub fn set(&mut self, owner: usize, slot: usize, b: &ActBatch, row: usize, col: usize, cfg: &DashboardConfig) {
        let (s, pos) = (owner * self.per + slot, row % b.seq_len);
        self.keys[s] = Key { value: b.acts[row * b.n_features + col], window: b.first_window + (row / b.seq_len) as u64, pos: pos as u32 };
        let start = row - pos;
        for (i, p) in cfg.shown(pos, b.seq_len).enumerate() {
            self.tokens[s * self.width + i] = b.tokens[start + p];
            self.acts[s * self.width + i] = b.acts[(start + p) * b.n_features + col];
        }
    }

    /// Moves `owner`'s slots `from..to-1` one place up (to make room at `from`).
    pub fn shift_up(&mut self, owner: usize, from: usize, to: usize) {
        let base = owner * self.per;
        self.keys.copy_within(base + from..base + to - 1, base + from + 1);
        let w = self.width;
        self.tokens.copy_within((base + from) * w..(base + to - 1) * w, (base + from + 1) * w);
        self.acts.copy_within((base + from) * w..(base + to - 1) * w, (base + from + 1) * w);
    }

    /// Slot `slot` of `owner` becomes a copy of `src`'s slot `src_slot` of `src_owner`.
    pub fn copy_from(&mut self, owner: usize, slot: usize, src: &Slots, src_owner: usize, src_slot: usize) {
        let (d, s, w) = (owner * self.per + slot, src_owner * src.per + src_slot, self.width);
        self.keys[d] = src.keys[s];
        self.tokens[d * w..(d + 1) * w].copy_from_slice(&src.tokens[s * w..(s + 1) * w]);
        self.acts[d * w..(d + 1) * w].copy_from_slice(&src.acts[s * w..(s + 1) * w]);
    }

    /// A copy of `owner`'s slots alone (as owner 0).
    pub fn owner(&self, owner: usize) -> Slots {
        let (a, b, w) = (owner * self.per, (owner + 1) * self.per, self.width);
        Slots { per: self.per, width: w, keys: self.keys[a..b].to_vec(), tokens: self.tokens[a * w..b * w].to_vec(), acts: self.acts[a * w..b * w].to_vec() }
    }

    pub fn key(&self, owner: usize, slot: usize) -> Key {
        self.keys[owner * self.per + slot]
    }

    /// The example in a slot.
    pub fn example(&self, owner: usize, slot: usize) -> Example {
        let s = owner * self.per + slot;
        let k = self.keys[s];
        let range = s * self.width..(s + 1) * self.width;
        Example { window: k.window, position: k.pos as usize, value: k.value, tokens: self.tokens[range.clone()].to_vec(), acts: self.acts[range].to_vec() }
    }
}

/// One example: the window and position it is centred on, its activation there, and the
/// tokens and activations shown around it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Example {
    pub window: u64,
    pub position: usize,
    pub value: f32,
    pub tokens: Vec<u32>,
    pub acts: Vec<f32>,
}
