//! Where the adjacency rows live: in memory while they fit a budget, past it in an unlinked
//! temporary file mapped into memory. The kernel writes a mapped file's pages out and drops
//! them under memory pressure and reads them back when a row is used again, so past the
//! budget the rows are bounded by the disk, not by RAM (`TMPDIR` picks the folder). Either
//! way the rows are one `[f32]`.

use std::ops::{Deref, DerefMut};

use crate::TraceError;

/// A zero-initialised run of floats, on the heap or in a mapped temporary file.
pub struct Floats {
    len: usize,
    backing: Backing,
}

enum Backing {
    Heap(Vec<f32>),
    File(memmap2::MmapMut),
}

impl Floats {
    /// `len` zeros: on the heap if they take at most `budget` bytes, else in a temporary file.
    pub fn zeros(len: usize, budget: u64) -> Result<Self, TraceError> {
        let bytes = len as u64 * 4;
        if bytes <= budget || len == 0 {
            return Ok(Floats { len, backing: Backing::Heap(vec![0f32; len]) });
        }
        let dir = std::env::temp_dir();
        let fail = |e: std::io::Error| {
            TraceError::file(&dir, format!("cannot hold {:.1} GB of attribution rows past the memory budget in a temporary file: {e}", bytes as f64 / 1e9))
        };
        // Unlinked at once: the space returns to the disk when the mapping goes, crash or not.
        let file = tempfile::tempfile().map_err(fail)?;
        file.set_len(bytes).map_err(fail)?;
        // SAFETY: the file is private to this process (unlinked, never shared), so nothing
        // else can change or truncate it while it is mapped.
        let map = unsafe { memmap2::MmapMut::map_mut(&file) }.map_err(fail)?;
        Ok(Floats { len, backing: Backing::File(map) })
    }

    /// Whether the floats are in a mapped file rather than on the heap.
    pub fn is_mapped(&self) -> bool {
        matches!(self.backing, Backing::File(_))
    }

    /// Keep the first `len` floats.
    pub fn truncate(&mut self, len: usize) {
        assert!(len <= self.len, "truncate to {len} of {}", self.len);
        self.len = len;
        if let Backing::Heap(v) = &mut self.backing {
            v.truncate(len);
            v.shrink_to_fit();
        }
    }
}

impl From<Vec<f32>> for Floats {
    fn from(v: Vec<f32>) -> Self {
        Floats { len: v.len(), backing: Backing::Heap(v) }
    }
}

impl Deref for Floats {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        match &self.backing {
            Backing::Heap(v) => &v[..self.len],
            // SAFETY: a mapping is page-aligned (so aligned for f32), at least `len * 4`
            // bytes long, and every bit pattern is a valid f32.
            Backing::File(m) => unsafe { std::slice::from_raw_parts(m.as_ptr().cast::<f32>(), self.len) },
        }
    }
}

impl DerefMut for Floats {
    fn deref_mut(&mut self) -> &mut [f32] {
        match &mut self.backing {
            Backing::Heap(v) => &mut v[..self.len],
            // SAFETY: as for `deref`, and the mapping is borrowed mutably.
            Backing::File(m) => unsafe { std::slice::from_raw_parts_mut(m.as_mut_ptr().cast::<f32>(), self.len) },
        }
    }
}

/// A copy on the heap.
impl Clone for Floats {
    fn clone(&self) -> Self {
        Floats::from(self.to_vec())
    }
}

impl PartialEq for Floats {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl std::fmt::Debug for Floats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Floats({} {})", self.len, if self.is_mapped() { "mapped" } else { "on the heap" })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_the_budget_the_floats_are_a_mapped_file_and_read_back_the_same() {
        for budget in [u64::MAX, 1000] {
            let mut f = Floats::zeros(10_000, budget).unwrap();
            assert_eq!(f.is_mapped(), budget == 1000);
            assert!(f.iter().all(|&x| x == 0.0));
            f.iter_mut().enumerate().for_each(|(i, x)| *x = i as f32 * 0.5);
            f.truncate(7_000);
            assert_eq!(f.len(), 7_000);
            assert_eq!(f[6_999], 3_499.5);
            assert_eq!(f.clone(), f);
            assert!(!f.clone().is_mapped());
        }
    }
}
