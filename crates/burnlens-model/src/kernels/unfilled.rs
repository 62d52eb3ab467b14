//! Output buffers that the kernel about to run writes whole, allocated without zeroing.
//!
//! `vec![0.0; n]` zeroes its buffer (glibc's `calloc` clears a block reused from the heap's
//! free lists, which is where [`super::memory`] keeps a step's buffers), and a product or an
//! element-wise kernel then overwrites every element: one more pass over the output's
//! memory. On the shakespeare-char training step that `memset` was 2.2% of the samples
//! (`perf`, 2-core AMD EPYC Zen 3), spread over the products' outputs and gradients, the
//! norms', activations' and attention's. [`unfilled`] hands such a kernel its buffer as the
//! allocator gives it.
//!
//! The contract is the caller's: every element is written before anything reads it (a
//! product with `accumulate = false`, which every product of [`super::gemm`],
//! [`super::packed`], [`super::half`] and [`super::bf16_gemm`] honours and tests with a
//! destination of ones; an element-wise kernel over the whole output). The kernels' tests
//! turn on [`poison_unfilled`], which fills these buffers with NaN, so that a kernel leaving
//! an element unwritten fails its comparison against the composed reference.

use std::sync::atomic::{AtomicBool, Ordering};

static POISON: AtomicBool = AtomicBool::new(cfg!(test));

/// For tests: fill every [`unfilled`] buffer with NaN from now on (or stop, `false`).
pub fn poison_unfilled(on: bool) {
    POISON.store(on, Ordering::Relaxed);
}

/// A buffer of `len` floats whose values are unspecified until written (NaN when poisoned).
pub(crate) fn unfilled(len: usize) -> Vec<f32> {
    if POISON.load(Ordering::Relaxed) {
        return vec![f32::NAN; len];
    }
    let mut v = Vec::with_capacity(len);
    // SAFETY: `f32` has no invalid bit patterns and no drop; the callers write every element
    // before reading any (the module's contract), as Burn's own flex kernels do with their
    // output buffers.
    #[allow(clippy::uninit_vec)]
    unsafe {
        v.set_len(len)
    };
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_buffer_is_nan_so_a_missed_write_shows() {
        let v = unfilled(5);
        assert_eq!(v.len(), 5);
        assert!(v.iter().all(|x| x.is_nan()));
    }
}
