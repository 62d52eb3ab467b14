//! Tensors as host vectors for the hand-written passes: reading them back, making them again,
//! and the row-parallel element-wise loops they share.

use burn::tensor::{Device, Tensor, TensorData};
use rayon::prelude::*;

/// The values of an f32 tensor, row-major.
pub fn host<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().try_into_vec_as::<f32>().expect("an f32 tensor")
}

/// A tensor of `shape` holding `v`.
pub fn tensor<const D: usize>(v: Vec<f32>, shape: [usize; D], device: &Device) -> Tensor<D> {
    Tensor::from_data(TensorData::new(v, shape), device)
}

/// `Σ_rows f(v[r, j])` for each column `j` of `v` (`[n, m]`), blocks of rows in parallel.
pub fn column_sums(v: &[f32], m: usize, f: impl Fn(f32) -> f32 + Sync) -> Vec<f32> {
    const ROWS: usize = 64;
    v.par_chunks(ROWS * m)
        .map(|block| {
            let mut s = vec![0.0f32; m];
            block.chunks(m).for_each(|row| s.iter_mut().zip(row).for_each(|(s, &x)| *s += f(x)));
            s
        })
        .reduce(
            || vec![0.0f32; m],
            |mut a, b| {
                a.iter_mut().zip(b).for_each(|(a, b)| *a += b);
                a
            },
        )
}

/// A buffer kept between steps, so that a large product's output is not a fresh allocation
/// (and fresh pages) every step. Clones start empty.
#[derive(Default)]
pub struct Scratch(std::sync::Mutex<Vec<f32>>);

impl Scratch {
    /// The buffer, `len` long, its contents unspecified.
    pub fn take(&self, len: usize) -> Vec<f32> {
        let mut v = std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()));
        v.resize(len, 0.0);
        v
    }

    /// Keep `v` for the next [`take`](Self::take).
    pub fn give(&self, v: Vec<f32>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = v;
    }
}

impl Clone for Scratch {
    fn clone(&self) -> Self {
        Scratch::default()
    }
}

impl std::fmt::Debug for Scratch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Scratch")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transposed_sums_and_rows_are_placed_right() {
        let t = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]; // [3, 2]
        assert_eq!(column_sums(&t, 2, |x| x * 2.0), vec![18.0, 24.0]);
        let scratch = Scratch::default();
        let out = scratch.take(4);
        scratch.give(out);
        assert!(scratch.take(2).capacity() >= 4);
    }
}
