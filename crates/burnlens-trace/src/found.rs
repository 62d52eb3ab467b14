//! A layer's active transcoder features, listed by position from its activations where the
//! transcoder computed them: on a GPU only the non-zeros come back, on the CPU the matrix is
//! read whole. The graph's replacement model and the QK decomposition's stream both start
//! from this list.

use burn::tensor::{Int, Tensor};
use burnlens_lens::dictionary::Dictionary;

/// A layer's active features by position: position `p`'s are `starts[p]..starts[p + 1]`,
/// with their features (rising) and activations.
pub(crate) struct Found {
    pub(crate) starts: Vec<usize>,
    pub(crate) features: Vec<i64>,
    pub(crate) values: Vec<f32>,
}

impl Found {
    /// A layer's transcoder activations on `x` (`[positions, d_model]`), with the first
    /// `zeroed` positions' set to zero (positions attribution leaves out), and their active
    /// features ([`Found::of`]).
    pub(crate) fn encode(tc: &Dictionary, x: Tensor<2>, zeroed: usize) -> (Tensor<2>, Self) {
        let mut acts = tc.encode(x);
        let [n_pos, f] = acts.dims();
        let z = zeroed.min(n_pos);
        if z > 0 {
            let zeros = Tensor::zeros([z, f], &acts.device());
            acts = acts.slice_assign([0..z, 0..f], zeros);
        }
        let found = Self::of(&acts);
        (acts, found)
    }

    /// The non-zeros of `acts` (`[positions, features]`, where the transcoder computed them).
    /// On a GPU each position's are listed there (`gpu::row_nonzeros`, of the activations and
    /// of their column numbers) and only they come back, not the whole matrix
    /// (1.2 GB for 1,024 tokens of GPT-2 small's 12 layers × 24,576 features).
    pub(crate) fn of(acts: &Tensor<2>) -> Self {
        let [n_pos, f] = acts.dims();
        let device = acts.device();
        if !burnlens_model::backend::is_host(&device) && f < 1 << 24 {
            // Column numbers from 1, so that every listed entry is non-zero; listed in the
            // activations' order, as they have the same non-zeros.
            let columns = Tensor::<1, Int>::arange(1..f as i64 + 1, &device).float().reshape([1, f]);
            let numbered = acts.clone().not_equal_elem(0.0).float() * columns;
            if let (Some(v), Some(c)) = (burnlens_model::gpu::row_nonzeros(acts), burnlens_model::gpu::row_nonzeros(&numbered)) {
                return Self::from_rows(c.into_iter().zip(v).map(|(c, v)| c.iter().map(|&j| j as i64 - 1).zip(v).collect()));
            }
        }
        let host: Vec<f32> = acts.clone().into_data().try_into_vec_as::<f32>().expect("f32");
        Self::from_rows(
            host.chunks(f.max(1)).take(n_pos).map(|row| row.iter().enumerate().filter(|(_, a)| **a != 0.0).map(|(j, &a)| (j as i64, a)).collect::<Vec<_>>()),
        )
    }

    /// From each position's (feature, activation) pairs, in any order.
    fn from_rows(rows: impl Iterator<Item = Vec<(i64, f32)>>) -> Self {
        let mut out = Found { starts: vec![0], features: Vec::new(), values: Vec::new() };
        for mut row in rows {
            row.sort_by_key(|&(j, _)| j);
            for (j, a) in row {
                out.features.push(j);
                out.values.push(a);
            }
            out.starts.push(out.features.len());
        }
        out
    }
}
