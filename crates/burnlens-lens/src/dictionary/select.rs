//! The `k`-th largest value, found by selection (no sort): of a slice, of each row of a
//! matrix on the host, and of each row of a tensor. TopK's choice (inference and training),
//! BatchTopK's, and the auxiliary loss's all ask this.

use burn::tensor::{Tensor, TensorData};
use rayon::prelude::*;

/// The `k`-th largest of `v` (`1 ≤ k ≤ v.len()`, in `total_cmp`'s order), reordering it.
/// A long `v` is narrowed first: the `k`-th largest of its blocks' maxima is a lower bound
/// (`k` distinct values reach it), so only the values at or above it are selected among.
pub fn kth_largest(v: &mut [f32], k: usize) -> f32 {
    const BLOCK: usize = 64;
    let desc = |a: &f32, b: &f32| b.total_cmp(a);
    if v.len() < 4 * k * BLOCK || v.iter().any(|x| x.is_nan()) {
        return *v.select_nth_unstable_by(k - 1, desc).1;
    }
    let mut maxima: Vec<f32> = v.chunks(BLOCK).map(|c| c.iter().fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a })).collect();
    let lower = *maxima.select_nth_unstable_by(k - 1, desc).1;
    let mut candidates: Vec<f32> = v.iter().copied().filter(|&x| x >= lower).collect();
    *candidates.select_nth_unstable_by(k - 1, desc).1
}

/// Per row of width `m`: the `k`-th largest value (`k ≤ m`) among the entries `score` gives
/// (`None` entries left out; `NEG_INFINITY` where a row has fewer than `k`).
pub fn kth_largest_per_row(n: usize, m: usize, k: usize, score: impl Fn(usize, usize) -> Option<f32> + Sync) -> Vec<f32> {
    (0..n)
        .into_par_iter()
        .map(|r| {
            let mut row: Vec<f32> = (0..m).filter_map(|j| score(r, j)).collect();
            if k == 0 || row.len() < k {
                return f32::NEG_INFINITY;
            }
            kth_largest(&mut row, k)
        })
        .collect()
}

/// The `k`-th largest value of each row of `x`, `[rows, 1]`, rows in parallel on the host
/// (read back once). On an autodiff tensor the result is a constant of the graph.
pub fn kth_largest_rows(x: &Tensor<2>, k: usize) -> Tensor<2> {
    let [n, m] = x.dims();
    let plain = if x.is_autodiff() { x.clone().detach().inner() } else { x.clone() };
    let device = plain.device();
    let mut v: Vec<f32> = plain.into_data().try_into_vec_as::<f32>().expect("f32");
    let kth: Vec<f32> = v.par_chunks_mut(m).map(|row| kth_largest(row, k)).collect();
    let t = Tensor::<2>::from_data(TensorData::new(kth, [n, 1]), &device);
    if x.is_autodiff() { t.autodiff() } else { t }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_narrowed_selection_agrees_with_a_sort() {
        let sorted_desc = |mut v: Vec<f32>| {
            v.sort_by(|a, b| b.total_cmp(a));
            v
        };
        // Long rows with ties and both signs.
        let long: Vec<f32> = (0..20000).map(|i| (((i * 7919) % 2003) as f32 - 1000.0) / 7.0).collect();
        let sorted = sorted_desc(long.clone());
        for k in [1, 5, 32, 77] {
            assert_eq!(kth_largest(&mut long.clone(), k), sorted[k - 1]);
        }
        let kth = kth_largest_per_row(2, 3, 2, |r, j| (r == 0 || j == 2).then_some((r * 3 + j) as f32));
        assert_eq!(kth, vec![1.0, f32::NEG_INFINITY]);
        let x = Tensor::<2>::from_data(TensorData::new(vec![3.0f32, -1.0, 2.0, 0.5, 0.25, 4.0], [2, 3]), &Default::default());
        let rows: Vec<f32> = kth_largest_rows(&x, 2).into_data().try_into_vec_as::<f32>().unwrap();
        assert_eq!(rows, vec![2.0, 0.5]);
    }
}
