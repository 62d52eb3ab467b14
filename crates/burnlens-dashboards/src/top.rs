//! Each feature's top group, kept while streaming: its `k` largest activations over the
//! positions examples may be centred on, largest first. Equal values keep the earlier
//! (window, position) first, and a value equal to the k-th does not displace it.

use crate::batch::{ActBatch, Slots};
use crate::config::DashboardConfig;

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct TopGroups {
    pub len: Vec<usize>,
    pub slots: Slots,
}

impl TopGroups {
    pub fn new(features: usize, k: usize, width: usize) -> Self {
        TopGroups { len: vec![0; features], slots: Slots::new(features, k, width) }
    }

    /// The smallest value that would enter feature `j`'s group (−∞ until it is full).
    #[inline]
    pub fn bar(&self, j: usize) -> f32 {
        let k = self.slots.per;
        if self.len[j] < k { f32::NEG_INFINITY } else { self.slots.key(j, k - 1).value }
    }

    /// Adds the groups another stream of windows kept (another rank's): each feature keeps
    /// the `k` largest of both, equal values by earlier (window, position) — the group one
    /// stream over all the windows keeps.
    pub fn merge(&mut self, other: &TopGroups) {
        let k = self.slots.per;
        for j in 0..self.len.len() {
            let mine = self.slots.owner(j);
            let mut union: Vec<(&Slots, usize, usize)> =
                (0..self.len[j]).map(|s| (&mine, 0, s)).chain((0..other.len[j]).map(|s| (&other.slots, j, s))).collect();
            union.sort_by(|a, b| {
                let (x, y) = (a.0.key(a.1, a.2), b.0.key(b.1, b.2));
                y.value.total_cmp(&x.value).then(x.window.cmp(&y.window)).then(x.pos.cmp(&y.pos))
            });
            union.truncate(k);
            for (slot, &(src, owner, s)) in union.iter().enumerate() {
                self.slots.copy_from(j, slot, src, owner, s);
            }
            self.len[j] = union.len();
        }
    }

    /// Offers batch row `row` (column `col`) to feature `j`'s group; call only when the value
    /// passes [`Self::bar`] (or the group is not full).
    pub fn offer(&mut self, j: usize, b: &ActBatch, row: usize, col: usize, cfg: &DashboardConfig) {
        let k = self.slots.per;
        let v = b.acts[row * b.n_features + col];
        let n = self.len[j];
        // After every kept value >= v: the stream runs in (window, position) order.
        let at = (0..n).find(|&s| self.slots.key(j, s).value < v).unwrap_or(n);
        if at >= k {
            return;
        }
        let end = (n + 1).min(k);
        self.slots.shift_up(j, at, end);
        self.slots.set(j, at, b, row, col, cfg);
        self.len[j] = end;
    }
}
