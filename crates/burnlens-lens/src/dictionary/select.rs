//! Selections (no sort on the host): the `k`-th largest value of a slice, of each row of a
//! matrix on the host, of each row of a tensor (a bisection on a GPU); and the
//! entries TopK and BatchTopK keep, as sparse codes ([`Scores`]). TopK's choice (inference and training), BatchTopK's, and the auxiliary
//! loss's all ask this.

use burn::tensor::{Tensor, TensorData};
use rayon::prelude::*;

use super::codes::Codes;

/// The `k`-th largest of `v` (`1 ≤ k ≤ v.len()`, in `total_cmp`'s order), reordering it.
/// A long `v` is narrowed first: the `k`-th largest of its blocks' maxima is a lower bound
/// (`k` distinct values reach it), so only the values at or above it are selected among.
pub fn kth_largest(v: &mut [f32], k: usize) -> f32 {
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

/// The `k`-th largest value of each row of `x`, `[rows, 1]`, by the [`SelectRoute`] its
/// device takes. On an autodiff tensor the result is a constant of the graph.
pub fn kth_largest_rows(x: &Tensor<2>, k: usize) -> Tensor<2> {
    let plain = if x.is_autodiff() { x.clone().detach().inner() } else { x.clone() };
    let t = match SelectRoute::of(&plain, k) {
        SelectRoute::Host => kth_largest_rows_on_host(plain, k),
        SelectRoute::RadixKernel => burnlens_model::gpu::kth_largest_rows(&plain, k).expect("the kernel takes what it said it runs"),
        SelectRoute::Bisection => kth_largest_rows_by_bisection(plain, k),
    };
    if x.is_autodiff() { t.autodiff() } else { t }
}

/// How [`kth_largest_rows`] finds its values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SelectRoute {
    /// On a host device: read back once, rows in parallel on the host.
    Host,
    /// On a GPU with Burn's `Cube` backend (wgpu, CUDA): burnlens's radix-selection kernel
    /// ([`burnlens_model::gpu::kth_largest_rows`]), nothing read back.
    RadixKernel,
    /// On any other GPU (LibTorch's CUDA): a bisection on the device in Burn's ops
    /// ([`kth_largest_rows_by_bisection`]), one boolean read back every 32 steps.
    Bisection,
}

impl SelectRoute {
    /// The route for `x` (plain, not tracked) and `k`.
    pub fn of(x: &Tensor<2>, k: usize) -> Self {
        if burnlens_model::backend::is_host(&x.device()) {
            SelectRoute::Host
        } else if burnlens_model::gpu::kth_largest_rows_runs(x, k) {
            SelectRoute::RadixKernel
        } else {
            SelectRoute::Bisection
        }
    }

    /// Its name in reports (`bench select`).
    pub fn name(self) -> &'static str {
        match self {
            SelectRoute::Host => "host",
            SelectRoute::RadixKernel => "radix kernel",
            SelectRoute::Bisection => "bisection",
        }
    }
}

/// [`kth_largest_rows`] read back once, rows in parallel on the host.
fn kth_largest_rows_on_host(x: Tensor<2>, k: usize) -> Tensor<2> {
    let [n, m] = x.dims();
    let device = x.device();
    let mut v: Vec<f32> = x.into_data().try_into_vec_as::<f32>().expect("f32");
    let kth: Vec<f32> = v.par_chunks_mut(m).map(|row| kth_largest(row, k)).collect();
    Tensor::from_data(TensorData::new(kth, [n, 1]), &device)
}

/// Bisection steps between the device selection's exactness checks.
const BISECTION_STEPS: usize = 32;
/// Checks before the device selection gives up and reads the rows back.
const BISECTION_ROUNDS: usize = 4;

/// [`kth_largest_rows`] on the tensor's device, by bisection on the values (no sort, and
/// not the backend's `topk`: burn 0.22's on wgpu returned `-f32::MAX` for 119 of 127 values
/// at k = 127 of 2,048, and its kernels grow as k² — cubek #570): per row,
/// `count(x ≥ lo) ≥ k > count(x ≥ hi)` narrowed by halving `[lo, hi]` (the finite values'
/// range at first: the auxiliary loss masks live features with −∞), then the answer is
/// `hi` where `count(x ≥ hi) ≥ k`, else the smallest value at or above `lo`. It is the
/// `k`-th largest exactly when `count(x > v) < k`, checked (one boolean read back) every
/// [`BISECTION_STEPS`] steps; rows still unsettled after [`BISECTION_ROUNDS`] checks are
/// read back and selected on the host.
pub fn kth_largest_rows_by_bisection(x: Tensor<2>, k: usize) -> Tensor<2> {
    let [n, m] = x.dims();
    let k = k as i64;
    let at_least = |t: &Tensor<2>| x.clone().greater_equal(t.clone().expand([n, m])).int().sum_dim(1).greater_equal_elem(k);
    let masked = x.clone().equal_elem(f32::NEG_INFINITY);
    let mut lo = x.clone().mask_fill(masked, f32::INFINITY).min_dim(1);
    let mut hi = x.clone().max_dim(1);
    let too_few = at_least(&lo).bool_not();
    for _ in 0..BISECTION_ROUNDS {
        for _ in 0..BISECTION_STEPS {
            let mid = lo.clone() + (hi.clone() - lo.clone()) * 0.5;
            let enough = at_least(&mid);
            lo = lo.mask_where(enough.clone(), mid.clone());
            hi = hi.mask_where(enough.bool_not(), mid);
        }
        let from_lo = x.clone().mask_fill(x.clone().lower(lo.clone().expand([n, m])), f32::INFINITY).min_dim(1);
        // Rows with fewer than k finite values: the k-th largest is −∞.
        let v = from_lo.mask_where(at_least(&hi), hi.clone()).mask_fill(too_few.clone(), f32::NEG_INFINITY);
        let exact = x.clone().greater(v.clone().expand([n, m])).int().sum_dim(1).lower_elem(k).all().into_scalar::<bool>();
        if exact {
            return v;
        }
    }
    kth_largest_rows_on_host(x, k as usize)
}

/// Scores: `pre` itself, or `pre · scale[j]` column by column (TopK's choice on
/// pre-activations times the decoder rows' norms).
#[derive(Clone, Copy)]
pub struct Scores<'a> {
    pub pre: &'a [f32],
    /// Row width.
    pub m: usize,
    pub scale: Option<&'a [f32]>,
}

impl Scores<'_> {
    fn rows(&self) -> usize {
        self.pre.len() / self.m
    }

    /// Row `r`'s scores into `out` (`[m]`).
    fn row_into(&self, r: usize, out: &mut [f32]) {
        let row = &self.pre[r * self.m..(r + 1) * self.m];
        match self.scale {
            Some(s) => out.iter_mut().zip(row).zip(s).for_each(|((o, v), s)| *o = v * s),
            None => out.copy_from_slice(row),
        }
    }

    /// Per row, the `k` largest scores where positive (all of those tied with the `k`-th),
    /// with their `pre` as the value. A row is read three times, each vectorised: its
    /// scores, the maxima of its 64-wide blocks (the `k`-th largest of those bounds the
    /// row's `k`-th largest from below: `k` distinct values reach it), and the indices at or
    /// above that bound, among which the `k`-th largest is selected. NaN scores are never
    /// kept.
    pub fn top_k_per_row(&self, k: usize) -> Codes {
        let m = self.m;
        let k = k.clamp(1, m);
        let rows: Vec<Vec<(u32, f32)>> = (0..self.rows())
            .into_par_iter()
            .map_init(
                || (vec![0.0f32; m], Vec::new(), Vec::new(), Vec::new()),
                |(s, maxima, candidates, values), r| {
                    self.row_into(r, s);
                    maxima.clear();
                    maxima.extend(s.chunks(BLOCK).map(block_max));
                    let lower = if maxima.len() >= k { *maxima.select_nth_unstable_by(k - 1, |a: &f32, b| b.total_cmp(a)).1 } else { f32::NEG_INFINITY };
                    candidates.clear();
                    candidates.extend((0..m as u32).filter(|&j| s[j as usize] >= lower));
                    values.clear();
                    values.extend(candidates.iter().map(|&j| s[j as usize]));
                    if values.len() < k {
                        return Vec::new();
                    }
                    let kth = *values.select_nth_unstable_by(k - 1, |a: &f32, b| b.total_cmp(a)).1;
                    let pre = &self.pre[r * m..(r + 1) * m];
                    candidates.iter().filter(|&&j| s[j as usize] > 0.0 && s[j as usize] >= kth).map(|&j| (j, pre[j as usize])).collect()
                },
            )
            .collect();
        Codes::from_rows(rows)
    }

    /// The `kk` largest positive scores of the whole batch (all of those tied with the
    /// `kk`-th), BatchTopK's choice, with their `pre` as the value: this batch's
    /// [candidates](Scores::batch_candidates), their `kk`-th largest, the entries reaching it.
    pub fn batch_top_k(&self, kk: usize) -> Codes {
        let c = self.batch_candidates(kk);
        let kth = kth_or_lowest(c.values.clone(), kk);
        self.batch_at_least(&c, kth)
    }

    /// The values that can be among the `kk` largest scores of the batch, or of a larger
    /// batch this one is a part of (a superset of this part's `kk` largest). Nothing of size
    /// `[n, m]` is copied: the maxima of every row's 64-wide blocks come first (the `kk`-th
    /// largest of them bounds the `kk`-th score from below), then only the blocks reaching
    /// that bound are read.
    pub fn batch_candidates(&self, kk: usize) -> BatchCandidates {
        let (m, n) = (self.m, self.rows());
        let kk = kk.max(1);
        let maxima: Vec<f32> = self.per_row(&|_, s, out| out.extend(s.chunks(BLOCK).map(block_max))).concat();
        let lower = if maxima.len() >= kk { kth_largest(&mut maxima.clone(), kk) } else { f32::NEG_INFINITY };
        let nb = m.div_ceil(BLOCK);
        let values = self
            .per_row(&|r, s, out| {
                for b in (0..nb).filter(|&b| maxima[r * nb + b] >= lower) {
                    out.extend(s[b * BLOCK..((b + 1) * BLOCK).min(m)].iter().copied().filter(|&v| v >= lower));
                }
            })
            .concat();
        debug_assert_eq!(maxima.len(), n * nb);
        BatchCandidates { values, maxima }
    }

    /// The entries whose score is positive and at least `kth` (the batch's `kk`-th largest,
    /// found from `c`'s values, or from every part's when the batch is shared).
    pub fn batch_at_least(&self, c: &BatchCandidates, kth: f32) -> Codes {
        let m = self.m;
        let nb = m.div_ceil(BLOCK);
        let threshold = kth.max(0.0);
        let rows: Vec<Vec<(u32, f32)>> = (0..self.rows())
            .into_par_iter()
            .map_init(
                || vec![0.0f32; m],
                |s, r| {
                    self.row_into(r, s);
                    let pre = &self.pre[r * m..(r + 1) * m];
                    let mut out = Vec::new();
                    for b in (0..nb).filter(|&b| c.maxima[r * nb + b] >= threshold) {
                        let lo = b * BLOCK;
                        for (j, &v) in s[lo..(lo + BLOCK).min(m)].iter().enumerate() {
                            if v > 0.0 && v >= threshold {
                                out.push(((lo + j) as u32, pre[lo + j]));
                            }
                        }
                    }
                    out
                },
            )
            .collect();
        Codes::from_rows(rows)
    }

    /// `f` over every row's scores, rows in parallel; what each row pushes, in row order.
    fn per_row(&self, f: &(dyn Fn(usize, &[f32], &mut Vec<f32>) + Sync)) -> Vec<Vec<f32>> {
        (0..self.rows())
            .into_par_iter()
            .map_init(
                || vec![0.0f32; self.m],
                |s, r| {
                    self.row_into(r, s);
                    let mut out = Vec::new();
                    f(r, s, &mut out);
                    out
                },
            )
            .collect()
    }
}

/// Block width of the narrowed selections.
const BLOCK: usize = 64;

/// What [`Scores::batch_candidates`] found: the values that can be among the batch's
/// largest, and each row's block maxima.
pub struct BatchCandidates {
    pub values: Vec<f32>,
    maxima: Vec<f32>,
}

/// The `kk`-th largest of `values` (`kk` at least 1), or `NEG_INFINITY` when there are fewer.
pub fn kth_or_lowest(mut values: Vec<f32>, kk: usize) -> f32 {
    let kk = kk.max(1);
    if values.len() >= kk { kth_largest(&mut values, kk) } else { f32::NEG_INFINITY }
}

/// The largest of `v` (NEG_INFINITY if empty; NaNs ignored), sixteen lanes at a time.
fn block_max(v: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 16];
    let mut chunks = v.chunks_exact(16);
    for c in &mut chunks {
        lanes.iter_mut().zip(c).for_each(|(l, &x)| *l = l.max(x));
    }
    chunks.remainder().iter().chain(&lanes).fold(f32::NEG_INFINITY, |a, &b| a.max(b))
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
        // The bisection (a GPU without burnlens's kernel), run here on the CPU backend: the same values, ties, negative values
        // and rows masked with −∞ included.
        let mut v = long[..4000].to_vec();
        v[1000..1990].fill(f32::NEG_INFINITY);
        v[3000..3500].fill(0.0);
        let cpu = burnlens_model::backend::device("flex", None).expect("flex");
        let wide = Tensor::<2>::from_data(TensorData::new(v, [4, 1000]), &cpu);
        for k in [1, 5, 10, 77, 600, 1000] {
            let host: Vec<f32> = kth_largest_rows(&wide, k).into_data().try_into_vec_as::<f32>().unwrap();
            let device: Vec<f32> = kth_largest_rows_by_bisection(wide.clone(), k).into_data().try_into_vec_as::<f32>().unwrap();
            assert_eq!(device, host, "k {k}");
        }
    }

    /// The plain references: every score of `all`, and the entries positive and at least
    /// `t(row)`, by a full pass.
    fn scores_of(all: &Scores) -> Vec<f32> {
        all.pre.iter().enumerate().map(|(i, &v)| all.scale.map_or(v, |s| v * s[i % all.m])).collect()
    }

    fn at_least(all: &Scores, t: impl Fn(usize) -> f32 + Sync) -> Codes {
        Codes::select(all.pre, all.m, |r, j, v| {
            let s = all.scale.map_or(v, |sc| v * sc[j]);
            s > 0.0 && s >= t(r)
        })
    }

    fn sorted_desc(mut v: Vec<f32>) -> Vec<f32> {
        v.sort_by(|a, b| b.total_cmp(a));
        v
    }

    #[test]
    fn the_fast_selections_equal_full_passes() {
        let v: Vec<f32> = (0..1000).map(|i| ((i * 7919) % 1000) as f32 - 100.0).collect();
        let halved = [0.5f32; 10];
        for all in [Scores { pre: &v, m: 10, scale: None }, Scores { pre: &v, m: 10, scale: Some(&halved) }] {
            let all_sorted = sorted_desc(scores_of(&all));
            // BatchTopK: the kk largest of everything, where positive.
            for kk in [1, 37, 250, 1000] {
                let want = at_least(&all, |_| all_sorted[kk - 1].max(0.0));
                let got = all.batch_top_k(kk);
                assert_eq!((got.features, got.offsets, got.values), (want.features, want.offsets, want.values), "kk {kk}");
            }
            // TopK: each row's k largest, where positive.
            let rows: Vec<Vec<f32>> = scores_of(&all).chunks(10).map(|r| sorted_desc(r.to_vec())).collect();
            for k in [1, 2, 7] {
                let want = at_least(&all, |r| rows[r][k - 1]);
                let got = all.top_k_per_row(k);
                assert_eq!((got.features, got.offsets), (want.features, want.offsets), "k {k}");
            }
        }
        // Long rows with ties at the k-th value and negative values: the same as a sort.
        let row: Vec<f32> = (0..4096).map(|i| ((i * 7919) % 301) as f32 - 290.0).collect();
        let fast = Scores { pre: &row, m: 4096, scale: None }.top_k_per_row(40);
        let sorted = sorted_desc(row.clone());
        let want = row.iter().filter(|&&v| v > 0.0 && v >= sorted[39]).count();
        assert_eq!(fast.nnz(), want);
        assert!(fast.values.iter().all(|&v| v > 0.0 && v >= sorted[39]));
    }
}
