//! Buffers that start on a cache line: the operands and tiles of the bf16 products.
//!
//! An AMX tile load or store moves sixteen rows of 64 bytes; a row that starts off a cache
//! line touches two lines and splits. A `Vec` of a few megabytes starts 16 bytes past a page
//! (glibc's mapping header), so every row of the panels, the weight's columns and the task's
//! tile did: measured on a 2-core Xeon with AMX (family 6, model 167, 2026-12-02), the tile
//! loop of a `128 × 768 × 2304` product ran at 710 GFLOP/s with all three 16 bytes off a
//! line and at 1,346 GFLOP/s with all three on one (a C copy of the loop, one thread).

use super::pages::Plain;

/// One cache line.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; LINE]);

/// Bytes per cache line.
pub const LINE: usize = 64;

/// `len` values of `T` from the start of a cache line.
pub struct LineBuf<T: Plain> {
    lines: Vec<Line>,
    len: usize,
    _values: std::marker::PhantomData<T>,
}

impl<T: Plain> Default for LineBuf<T> {
    fn default() -> Self {
        Self { lines: Vec::new(), len: 0, _values: std::marker::PhantomData }
    }
}

impl<T: Plain> LineBuf<T> {
    /// `len` values: those the buffer held before where it held any (the callers write every
    /// value they read), zeros past them.
    pub fn resize(&mut self, len: usize) {
        let lines = (len * std::mem::size_of::<T>()).div_ceil(LINE);
        self.lines.resize(lines, Line([0; LINE]));
        self.len = len;
    }

    /// Values it can hold without growing.
    pub fn capacity(&self) -> usize {
        self.lines.capacity() * LINE / std::mem::size_of::<T>()
    }
}

impl<T: Plain> std::ops::Deref for LineBuf<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: the lines hold at least `len` values' bytes, aligned for `T` (64 is a
        // multiple of every `Plain` type's alignment); every bit pattern is a `T` (`Plain`).
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr().cast(), self.len) }
    }
}

impl<T: Plain> std::ops::DerefMut for LineBuf<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as for `deref`, borrowed mutably.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr().cast(), self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_starts_on_a_line_keeps_its_values_and_zeroes_the_new_ones() {
        let mut b = LineBuf::<u16>::default();
        b.resize(3);
        assert_eq!(&b[..], &[0, 0, 0]);
        b[1] = 7;
        b.resize(1000);
        assert_eq!(b.as_ptr() as usize % LINE, 0);
        assert_eq!((b[1], b[999]), (7, 0));
        assert!(b.capacity() >= 1000);
        let mut f = LineBuf::<f32>::default();
        f.resize(17);
        assert_eq!((f.as_ptr() as usize % LINE, f.len()), (0, 17));
    }
}
