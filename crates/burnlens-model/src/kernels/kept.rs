//! Copies kept beside a weight: a layout made from a constant weight at its first use (gemm's
//! panels for f32 weights, [`super::packed`]; decoding panels for half weights,
//! [`super::half_panels`]; on Intel's AVX-512 cores, half weights widened into gemm's panels
//! for prefill, [`super::half_widened`]) and reused by every later product with that weight.
//!
//! The cache is keyed by the weight's storage (the `Arc` flex holds its bytes in), its view
//! (offset, shape, strides) and the layout, and holds only a `Weak` to that storage. That
//! makes the key sound: while the `Weak` lives the address cannot be reused, and flex cannot
//! change the bytes in place (`Arc::get_mut` refuses while a `Weak` exists, and
//! `Arc::make_mut` moves them under a new `Arc`, a new key). Every change to a weight (an
//! optimizer step, weight processing, a hook, a user's edit) therefore reaches the product as
//! a different key, and a copy whose weight is gone is dropped at the next insertion. The
//! copies held together stay under `BURNLENS_PACKED_MB` (default 1024; 0 turns them off); a
//! weight whose copy does not fit is multiplied as it is stored.

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use burn::backend::flex::FlexTensor;
use burn::tensor::Bytes;

/// Which layout a kept copy is in (a weight may have one of each).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) enum Layout {
    /// gemm-f32's panels ([`super::packed::Packed`]).
    Packed,
    /// A half weight widened to f32 in gemm-f32's panels ([`super::half_widened`]).
    Widened,
    /// Half-precision decoding panels ([`super::half_panels::HalfPanels`]).
    HalfPanels,
    /// A weight rounded to bf16 columns ([`super::bf16_pack::ColsBuf`]).
    Bf16Cols,
    /// A weight's columns rounded to bf16 panels, AMX's `B` tiles
    /// ([`super::bf16_pack::RowPanels`] of `wᵀ`).
    Bf16Panels,
}

impl Layout {
    /// The share of the budget copies in this layout may hold together: half for widened
    /// half weights (twice their weights' bytes, for a few percent of prefill), all of it for
    /// the rest.
    fn cap(self, budget: usize) -> usize {
        match self {
            Layout::Widened => budget / 2,
            _ => budget,
        }
    }

    /// Whether a copy that does not fit may evict this layout's copies: widened half weights
    /// give way to every other copy (decoding's panels of the same weights above all: per
    /// byte they gain more, and a model larger than the budget would otherwise decode with
    /// half of them).
    fn gives_way(self) -> bool {
        self == Layout::Widened
    }
}

/// How a product reads a weight's storage: element `(i, j)` at `offset + i·strides[0] +
/// j·strides[1]`, `dims` rows and columns.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct View {
    pub offset: usize,
    pub dims: [usize; 2],
    pub strides: [isize; 2],
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
struct Key {
    storage: usize,
    view: View,
    layout: Layout,
}

struct Entry {
    owner: Weak<Bytes>,
    copy: Arc<dyn Any + Send + Sync>,
    bytes: usize,
}

#[derive(Default)]
struct Cache {
    map: HashMap<Key, Entry>,
    bytes: usize,
    /// Bytes held per layout.
    by_layout: HashMap<Layout, usize>,
}

impl Cache {
    fn held(&self, layout: Layout) -> usize {
        self.by_layout.get(&layout).copied().unwrap_or(0)
    }

    fn insert(&mut self, key: Key, entry: Entry) {
        *self.by_layout.entry(key.layout).or_default() += entry.bytes;
        self.bytes += entry.bytes;
        if let Some(old) = self.map.insert(key, entry) {
            self.forget(key.layout, old.bytes);
        }
    }

    fn forget(&mut self, layout: Layout, bytes: usize) {
        *self.by_layout.entry(layout).or_default() -= bytes;
        self.bytes -= bytes;
    }

    /// Drop the copies `which` picks.
    fn drop_where(&mut self, mut which: impl FnMut(&Key, &Entry) -> bool) {
        let mut gone = Vec::new();
        self.map.retain(|key, e| {
            let drop = which(key, e);
            if drop {
                gone.push((key.layout, e.bytes));
            }
            !drop
        });
        for (layout, bytes) in gone {
            self.forget(layout, bytes);
        }
    }

    /// Whether a copy of `bytes` in `layout` fits `budget` (and its layout's share of it),
    /// after dropping the copies whose weights are gone and, if that is not enough, copies
    /// that give way ([`Layout::gives_way`]).
    fn admit(&mut self, layout: Layout, bytes: usize, budget: usize) -> bool {
        self.drop_dead();
        if self.held(layout) + bytes > layout.cap(budget) {
            return false;
        }
        let over = (self.bytes + bytes).saturating_sub(budget);
        let yielding: usize = self.by_layout.iter().filter(|(l, _)| l.gives_way() && **l != layout).map(|(_, b)| b).sum();
        if over > 0 && yielding >= over {
            let mut freed = 0;
            self.drop_where(|key, e| {
                let drop = freed < over && key.layout.gives_way() && key.layout != layout;
                if drop {
                    freed += e.bytes;
                }
                drop
            });
        }
        self.bytes + bytes <= budget
    }

    fn drop_dead(&mut self) {
        self.drop_where(|_, e| e.owner.strong_count() == 0);
    }
}

fn cache() -> &'static Mutex<Cache> {
    static CACHE: OnceLock<Mutex<Cache>> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// Bytes the kept copies may hold together (`BURNLENS_PACKED_MB`, default 1024).
fn budget() -> usize {
    static BUDGET: OnceLock<usize> = OnceLock::new();
    *BUDGET.get_or_init(|| {
        let mb = std::env::var("BURNLENS_PACKED_MB").ok().and_then(|v| v.trim().parse::<usize>().ok()).unwrap_or(1024);
        mb.saturating_mul(1 << 20)
    })
}

/// The copy of `owner`'s weight `view` in `layout`, made now by `make` if it is not kept yet;
/// `None` where copies are turned off, the copy (`bytes` long) would not fit the budget (or
/// its layout's share of it, [`Layout::cap`]) even once copies that give way are dropped, or
/// `make` declines.
pub(crate) fn kept<T: Any + Send + Sync>(owner: &FlexTensor, view: View, layout: Layout, bytes: usize, make: impl FnOnce() -> Option<T>) -> Option<Arc<T>> {
    let budget = budget();
    if budget == 0 {
        return None;
    }
    let storage = owner.data_arc();
    let key = Key { storage: Arc::as_ptr(&storage) as usize, view, layout };
    {
        let mut c = cache().lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = c.map.get(&key)
            && e.owner.strong_count() > 0
        {
            return e.copy.clone().downcast::<T>().ok();
        }
        if !c.admit(layout, bytes, budget) {
            return None;
        }
    }
    let copy = Arc::new(make()?);
    let mut c = cache().lock().unwrap_or_else(|p| p.into_inner());
    c.insert(key, Entry { owner: Arc::downgrade(&storage), copy: copy.clone(), bytes });
    Some(copy)
}

/// Copies held now: `(entries, bytes)`, dead ones included until the next insertion.
pub fn cached() -> (usize, usize) {
    let c = cache().lock().unwrap_or_else(|p| p.into_inner());
    (c.map.len(), c.bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(owner: &Arc<Bytes>, bytes: usize) -> Entry {
        Entry { owner: Arc::downgrade(owner), copy: Arc::new(()), bytes }
    }

    fn key(n: usize, layout: Layout) -> Key {
        Key { storage: n, view: View { offset: 0, dims: [1, 1], strides: [1, 1] }, layout }
    }

    /// Widened half weights hold at most half of the budget and give way to any other copy
    /// that does not fit; other copies never evict each other, and dead ones go first.
    #[test]
    fn widened_copies_hold_half_the_budget_and_give_way_to_the_rest() {
        let owner = Arc::new(Bytes::from_elems(vec![0u8; 4]));
        let mut c = Cache::default();
        assert!(!c.admit(Layout::Widened, 51, 100), "a widened copy over half the budget was admitted");
        assert!(c.admit(Layout::Widened, 50, 100));
        c.insert(key(1, Layout::Widened), entry(&owner, 30));
        c.insert(key(2, Layout::Widened), entry(&owner, 20));
        assert!(!c.admit(Layout::Widened, 1, 100), "widened copies passed half the budget");
        // Decoding panels: 40 fit beside the 50; 30 more evict widened copies.
        assert!(c.admit(Layout::HalfPanels, 40, 100));
        c.insert(key(3, Layout::HalfPanels), entry(&owner, 40));
        assert!(c.admit(Layout::HalfPanels, 30, 100), "the panels did not evict a widened copy");
        assert!(c.held(Layout::Widened) <= 30 && c.bytes <= 70, "held {} widened, {} in all", c.held(Layout::Widened), c.bytes);
        c.insert(key(4, Layout::HalfPanels), entry(&owner, 30));
        // Nothing gives way to a copy that cannot fit even so, and panels never give way.
        let widened = c.held(Layout::Widened);
        assert!(!c.admit(Layout::Packed, 31, 100), "a copy was admitted past the budget");
        assert_eq!(c.held(Layout::Widened), widened, "widened copies were evicted for a copy that could not fit");
        assert_eq!(c.held(Layout::HalfPanels), 70, "panels were evicted");
        // A copy whose weight is gone is dropped before anything is evicted.
        let gone = Arc::new(Bytes::from_elems(vec![0u8; 4]));
        c.insert(key(5, Layout::Packed), entry(&gone, 10));
        drop(gone);
        let widened = c.held(Layout::Widened);
        assert!(c.admit(Layout::Packed, 100 - 70 - widened, 100));
        assert_eq!(c.held(Layout::Widened), widened, "a widened copy was evicted where a dead copy made room");
        assert_eq!(c.held(Layout::Packed), 0, "the dead copy was kept");
    }
}
