//! Copies kept beside a weight: a layout made from a constant weight at its first use (gemm's
//! panels for f32 weights, [`super::packed`]; decoding panels for half weights,
//! [`super::half_panels`]) and reused by every later product with that weight.
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
    /// Half-precision decoding panels ([`super::half_panels::HalfPanels`]).
    HalfPanels,
    /// A weight rounded to bf16 columns ([`super::bf16_pack::ColsBuf`]).
    Bf16Cols,
    /// A weight's columns rounded to bf16 panels, AMX's `B` tiles
    /// ([`super::bf16_pack::RowPanels`] of `wᵀ`).
    Bf16Panels,
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
}

impl Cache {
    fn drop_dead(&mut self) {
        let mut freed = 0;
        self.map.retain(|_, e| {
            let alive = e.owner.strong_count() > 0;
            if !alive {
                freed += e.bytes;
            }
            alive
        });
        self.bytes -= freed;
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
/// `None` where copies are turned off, the copy (`bytes` long) would not fit the budget, or
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
        c.drop_dead();
        if c.bytes + bytes > budget {
            return None;
        }
    }
    let copy = Arc::new(make()?);
    let mut c = cache().lock().unwrap_or_else(|p| p.into_inner());
    let entry = Entry { owner: Arc::downgrade(&storage), copy: copy.clone(), bytes };
    if let Some(old) = c.map.insert(key, entry) {
        c.bytes -= old.bytes;
    }
    c.bytes += bytes;
    Some(copy)
}

/// Copies held now: `(entries, bytes)`, dead ones included until the next insertion.
pub fn cached() -> (usize, usize) {
    let c = cache().lock().unwrap_or_else(|p| p.into_inner());
    (c.map.len(), c.bytes)
}
