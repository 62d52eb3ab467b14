//! Sparse codes: each token's active features and the coefficients their decoder rows are
//! multiplied by, as a sparse dictionary produces them ([`Dictionary::encode_sparse`]: a
//! few dozen of the `d_sae` features per token), and the products that need only those:
//! decoding through the active rows of `W_dec`, and the gradients flowing back through them
//! to the decoder rows, the coefficients and the encoder's columns (the training passes').
//! Host slices, row-major, tokens in parallel (rayon).
//!
//! [`Dictionary::encode_sparse`]: super::Dictionary::encode_sparse

use rayon::prelude::*;

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
    pub(super) fn from_rows(rows: Vec<Vec<(u32, f32)>>) -> Codes {
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

/// `out[i, j] += t[j, i]` (`t`: `[m, d]`, `out`: `[d, m]`), in blocks, rows of `out` in
/// parallel.
fn add_transposed(t: &[f32], m: usize, d: usize, out: &mut [f32]) {
    const B: usize = 32;
    out.par_chunks_mut(B * m).enumerate().for_each(|(bi, rows)| {
        let (i0, h) = (bi * B, rows.len() / m);
        for j in 0..m {
            let src = &t[j * d + i0..j * d + i0 + h];
            src.iter().enumerate().for_each(|(ii, v)| rows[ii * m + j] += v);
        }
    });
}

struct ByFeature {
    offsets: Vec<usize>,
    entries: Vec<(u32, u32)>,
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(a, b)| a * b).sum()
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
        let t = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]; // [3, 2]
        let mut out = vec![10.0; 6]; // [2, 3]
        add_transposed(&t, 3, 2, &mut out);
        assert_eq!(out, vec![11.0, 13.0, 15.0, 12.0, 14.0, 16.0]);
    }
}
