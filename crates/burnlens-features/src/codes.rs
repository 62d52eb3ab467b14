//! Sparse codes: each token's active features and their coefficients, as TopK and BatchTopK
//! SAEs produce them (a few dozen of the `d_sae` features per token), and the products that
//! need only those: decoding through the active rows of `W_dec`, and the gradients flowing
//! back through them to the decoder rows, the coefficients and the encoder's columns. Host
//! slices, row-major, tokens in parallel (rayon).

use rayon::prelude::*;

use burnlens_lens::dictionary::select::kth_largest;

use crate::host::add_transposed;

/// The active entries of an `[n, m]` activation matrix, by token (compressed rows).
#[derive(Debug, Clone, Default)]
pub struct Codes {
    /// Token `r`'s entries are `offsets[r]..offsets[r + 1]`.
    pub offsets: Vec<usize>,
    pub features: Vec<u32>,
    /// The coefficient each active decoder row is multiplied by.
    pub values: Vec<f32>,
}

impl Codes {
    /// The entries of `pre` (`[n, m]`) for which `keep(row, feature, value)` holds, with
    /// their values.
    pub fn select(pre: &[f32], m: usize, keep: impl Fn(usize, usize, f32) -> bool + Sync) -> Codes {
        let rows: Vec<Vec<(u32, f32)>> = pre
            .par_chunks(m)
            .enumerate()
            .map(|(r, row)| row.iter().enumerate().filter(|&(j, &v)| keep(r, j, v)).map(|(j, &v)| (j as u32, v)).collect())
            .collect();
        Codes::from_rows(rows)
    }

    /// Codes from each row's `(feature, value)` entries.
    fn from_rows(rows: Vec<Vec<(u32, f32)>>) -> Codes {
        let mut codes = Codes { offsets: Vec::with_capacity(rows.len() + 1), ..Codes::default() };
        codes.offsets.push(0);
        for row in rows {
            for (j, v) in row {
                codes.features.push(j);
                codes.values.push(v);
            }
            codes.offsets.push(codes.features.len());
        }
        codes
    }

    pub fn rows(&self) -> usize {
        self.offsets.len() - 1
    }

    pub fn nnz(&self) -> usize {
        self.features.len()
    }

    fn row(&self, r: usize) -> std::ops::Range<usize> {
        self.offsets[r]..self.offsets[r + 1]
    }

    /// `out[r] += Σ values · w[feature]` (`w`: `[m, d]`, `out`: `[n, d]`).
    pub fn decode_into(&self, w: &[f32], d: usize, out: &mut [f32]) {
        out.par_chunks_mut(d).enumerate().for_each(|(r, o)| {
            for e in self.row(r) {
                let (j, a) = (self.features[e] as usize, self.values[e]);
                o.iter_mut().zip(&w[j * d..(j + 1) * d]).for_each(|(o, w)| *o += a * w);
            }
        });
    }

    /// Per entry: `w[feature] · g[r]`, the gradient of the entry's coefficient when `g`
    /// (`[n, d]`) is the gradient of what [`decode_into`](Self::decode_into) wrote.
    pub fn coefficient_grads(&self, w: &[f32], g: &[f32], d: usize) -> Vec<f32> {
        let per_row: Vec<Vec<f32>> =
            g.par_chunks(d).enumerate().map(|(r, g)| self.row(r).map(|e| dot(&w[self.features[e] as usize * d..][..d], g)).collect()).collect();
        per_row.concat()
    }

    /// `gw[feature] += coefficient · g[r]` for every entry (`gw`: `[m, d]`), the decoder rows'
    /// gradient; `coefficients` default to the values.
    pub fn scatter_rows_into(&self, coefficients: Option<&[f32]>, g: &[f32], d: usize, gw: &mut [f32]) {
        let c = coefficients.unwrap_or(&self.values);
        let by_feature = self.by_feature(gw.len() / d);
        gw.par_chunks_mut(d).enumerate().for_each(|(j, row)| {
            for &(r, e) in &by_feature.entries[by_feature.offsets[j]..by_feature.offsets[j + 1]] {
                let a = c[e as usize];
                row.iter_mut().zip(&g[r as usize * d..][..d]).for_each(|(o, g)| *o += a * g);
            }
        });
    }

    /// `gw[:, feature] += x[r] · coefficient` for every entry (`gw`: `[d, m]`, `x`: `[n, d]`),
    /// the encoder's gradient for entry gradients `coefficients`: gathered by feature into
    /// contiguous rows, then added transposed.
    pub fn scatter_columns_into(&self, coefficients: &[f32], x: &[f32], d: usize, gw: &mut [f32]) {
        let m = gw.len() / d;
        let mut by_row = vec![0.0f32; m * d];
        self.scatter_rows_into(Some(coefficients), x, d, &mut by_row);
        add_transposed(&by_row, m, d, gw);
    }

    /// `out[feature] += coefficient` summed over tokens (`out`: `[m]`).
    pub fn sum_by_feature_into(&self, coefficients: &[f32], out: &mut [f32]) {
        for (&j, &c) in self.features.iter().zip(coefficients) {
            out[j as usize] += c;
        }
    }

    /// How many tokens each feature is active on.
    pub fn counts(&self, m: usize) -> Vec<u64> {
        let mut c = vec![0u64; m];
        self.features.iter().for_each(|&j| c[j as usize] += 1);
        c
    }

    /// The entries regrouped by feature: `(token, entry)` pairs, features in order.
    fn by_feature(&self, m: usize) -> ByFeature {
        let mut offsets = vec![0usize; m + 1];
        self.features.iter().for_each(|&j| offsets[j as usize + 1] += 1);
        (0..m).for_each(|j| offsets[j + 1] += offsets[j]);
        let mut next = offsets.clone();
        let mut entries = vec![(0u32, 0u32); self.nnz()];
        for r in 0..self.rows() {
            for e in self.row(r) {
                let j = self.features[e] as usize;
                entries[next[j]] = (r as u32, e as u32);
                next[j] += 1;
            }
        }
        ByFeature { offsets, entries }
    }
}

struct ByFeature {
    offsets: Vec<usize>,
    entries: Vec<(u32, u32)>,
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(a, b)| a * b).sum()
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
        const BLOCK: usize = 64;
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
    /// `kk`-th), BatchTopK's choice, with their `pre` as the value. Nothing of size `[n, m]` is
    /// copied: the maxima of every row's 64-wide blocks come first (the `kk`-th largest of
    /// them bounds the `kk`-th score from below), then only the blocks reaching that bound
    /// are read for candidates, and only those reaching the final threshold for entries.
    pub fn batch_top_k(&self, kk: usize) -> Codes {
        const BLOCK: usize = 64;
        let m = self.m;
        let n = self.rows();
        let nb = m.div_ceil(BLOCK);
        let per_row = |f: &(dyn Fn(usize, &[f32], &mut Vec<f32>) + Sync)| -> Vec<Vec<f32>> {
            (0..n)
                .into_par_iter()
                .map_init(
                    || vec![0.0f32; m],
                    |s, r| {
                        self.row_into(r, s);
                        let mut out = Vec::new();
                        f(r, s, &mut out);
                        out
                    },
                )
                .collect()
        };
        let maxima: Vec<f32> = per_row(&|_, s, out| out.extend(s.chunks(BLOCK).map(block_max))).concat();
        let kk = kk.clamp(1, n * m);
        let lower = if maxima.len() >= kk { kth_largest(&mut maxima.clone(), kk) } else { f32::NEG_INFINITY };
        let maxima = &maxima;
        let blocks_at_least = move |r: usize, t: f32| (0..nb).filter(move |&b| maxima[r * nb + b] >= t);
        let mut candidates: Vec<f32> = per_row(&|r, s, out| {
            for b in blocks_at_least(r, lower) {
                out.extend(s[b * BLOCK..((b + 1) * BLOCK).min(m)].iter().copied().filter(|&v| v >= lower));
            }
        })
        .concat();
        let kth = if candidates.len() >= kk { kth_largest(&mut candidates, kk) } else { f32::NEG_INFINITY };
        let threshold = kth.max(0.0);
        let rows: Vec<Vec<(u32, f32)>> = (0..n)
            .into_par_iter()
            .map_init(
                || vec![0.0f32; m],
                |s, r| {
                    self.row_into(r, s);
                    let pre = &self.pre[r * m..(r + 1) * m];
                    let mut out = Vec::new();
                    for b in blocks_at_least(r, threshold) {
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
    fn decode_and_its_gradients_agree_with_the_dense_products() {
        // acts [2, 3] with two active entries, w [3, 2].
        let pre = [0.0, 2.0, 0.0, 3.0, 0.0, -1.0];
        let codes = Codes::select(&pre, 3, |_, _, v| v != 0.0);
        assert_eq!((codes.nnz(), codes.offsets.clone()), (3, vec![0, 1, 3]));
        let w = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let mut out = vec![0.0; 4];
        codes.decode_into(&w, 2, &mut out);
        assert_eq!(out, vec![6.0, 8.0, 3.0 - 5.0, 6.0 - 6.0]);
        let g = [1.0, 1.0, 0.5, -1.0];
        assert_eq!(codes.coefficient_grads(&w, &g, 2), vec![7.0, 0.5 - 2.0, 2.5 - 6.0]);
        let mut gw = vec![0.0; 6];
        codes.scatter_rows_into(None, &g, 2, &mut gw);
        assert_eq!(gw, vec![1.5, -3.0, 2.0, 2.0, -0.5, 1.0]);
        let x = [1.0, 2.0, 3.0, 4.0];
        let mut ge = vec![0.0; 6];
        codes.scatter_columns_into(&[1.0, 1.0, 2.0], &x, 2, &mut ge);
        assert_eq!(ge, vec![3.0, 1.0, 6.0, 4.0, 2.0, 8.0]);
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
