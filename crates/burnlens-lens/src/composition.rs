//! Composition scores between heads of different layers (Elhage et al. 2021, as in
//! TransformerLens): `‖W_A W_B‖_F / (‖W_A‖_F ‖W_B‖_F)` with `W_A` the `OV` circuit of an
//! earlier head and `W_B` the `QK` (Q-composition), `QKᵀ` (K-composition) or `OV`
//! (V-composition) circuit of a later one. Random matrices of the same shapes score about
//! `1/sqrt(d_model)`; the measured baseline is reported beside the scores.

use burn::tensor::{Distribution, Tensor};
use burnlens_model::Transformer;
use burnlens_model::matmul::matmul;
use serde::Serialize;

use crate::circuits::{all_head_weights, ov, qk};
use crate::factored::FactoredMatrix;

/// Scores as `[L, H, L, H]` arrays, flattened row-major: `q[((l1 * H + h1) * L + l2) * H + h2]`
/// is how much head `(l2, h2)` reads, through its queries, what head `(l1, h1)` wrote. Zero
/// unless `l1 < l2`. Serialized (in `report.json`) as nested `[l1][h1][l2][h2]` arrays, like
/// the other per-head arrays.
#[derive(Debug, Clone)]
pub struct CompositionScores {
    pub n_layers: usize,
    pub n_heads: usize,
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    /// Mean score of random Gaussian factors of the same shapes.
    pub random_baseline: f64,
    /// `1 / sqrt(d_model)`, the value random matrices approach.
    pub inverse_sqrt_d_model: f64,
}

impl Serialize for CompositionScores {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let (l, h) = (self.n_layers, self.n_heads);
        let nest = |v: &[f32]| -> Vec<Vec<Vec<Vec<f32>>>> {
            (0..l).map(|l1| (0..h).map(|h1| (0..l).map(|l2| (0..h).map(|h2| v[self.index(l1, h1, l2, h2)]).collect()).collect()).collect()).collect()
        };
        let mut st = s.serialize_struct("CompositionScores", 7)?;
        st.serialize_field("n_layers", &l)?;
        st.serialize_field("n_heads", &h)?;
        st.serialize_field("q", &nest(&self.q))?;
        st.serialize_field("k", &nest(&self.k))?;
        st.serialize_field("v", &nest(&self.v))?;
        st.serialize_field("random_baseline", &self.random_baseline)?;
        st.serialize_field("inverse_sqrt_d_model", &self.inverse_sqrt_d_model)?;
        st.end()
    }
}

impl CompositionScores {
    pub fn index(&self, l1: usize, h1: usize, l2: usize, h2: usize) -> usize {
        ((l1 * self.n_heads + h1) * self.n_layers + l2) * self.n_heads + h2
    }
}

/// `[H1, H2]` scores of every earlier head (`left`, `OV`s) against every later head (`right`).
fn pair_scores(left: &FactoredMatrix, right: &FactoredMatrix) -> Vec<f32> {
    let [h1, d, m1] = left.a.dims();
    let [h2, _, m2] = right.a.dims();
    // ‖A1 (B1 A2 B2)‖² = Σ (A1ᵀA1) ∘ (C Cᵀ), C = B1 A2 B2 : [h1, h2, m1, d]
    let b1 = left.b.clone().unsqueeze_dim::<4>(1).expand([h1, h2, m1, d]);
    let a2 = right.a.clone().unsqueeze_dim::<4>(0).expand([h1, h2, d, m2]);
    let b2 = right.b.clone().unsqueeze_dim::<4>(0).expand([h1, h2, m2, d]);
    let c = matmul(matmul(b1, a2), b2);
    let cct = matmul(c.clone(), c.swap_dims(2, 3));
    let gram_a1 = matmul(left.a.clone().swap_dims(1, 2), left.a.clone()).unsqueeze_dim::<4>(1).expand([h1, h2, m1, m1]);
    let prod_sq: Tensor<2> = (gram_a1 * cct).sum_dims_squeeze::<2, _>(&[2, 3]);
    let left_norm: Tensor<1> = left.norm_sq().sqrt();
    let right_norm: Tensor<1> = right.norm_sq().sqrt();
    let denom = left_norm.reshape([h1, 1]) * right_norm.reshape([1, h2]);
    (prod_sq.clamp_min(0.0).sqrt() / denom).into_data().try_into_vec_as::<f32>().expect("f32")
}

/// Q, K and V composition scores of all head pairs of `model`.
pub fn composition_scores(model: &Transformer) -> CompositionScores {
    let weights = all_head_weights(model);
    let (l, h) = (model.config.n_layers(), model.config.n_heads);
    let mut out = CompositionScores {
        n_layers: l,
        n_heads: h,
        q: vec![0.0; l * h * l * h],
        k: vec![0.0; l * h * l * h],
        v: vec![0.0; l * h * l * h],
        random_baseline: 0.0,
        inverse_sqrt_d_model: 1.0 / (model.config.d_model as f64).sqrt(),
    };
    let ovs: Vec<FactoredMatrix> = weights.iter().map(ov).collect();
    let qks: Vec<FactoredMatrix> = weights.iter().map(qk).collect();
    for l1 in 0..l {
        for l2 in l1 + 1..l {
            for (kind, right) in [("q", qks[l2].clone()), ("k", qks[l2].t()), ("v", ovs[l2].clone())] {
                let s = pair_scores(&ovs[l1], &right);
                let dst = match kind {
                    "q" => &mut out.q,
                    "k" => &mut out.k,
                    _ => &mut out.v,
                };
                for h1 in 0..h {
                    for h2 in 0..h {
                        dst[((l1 * h + h1) * l + l2) * h + h2] = s[h1 * h + h2];
                    }
                }
            }
        }
    }
    out.random_baseline = random_baseline(model.config.d_model, model.config.d_head, 16, &model.device());
    out
}

/// Mean composition score of `samples` pairs of random Gaussian factored matrices shaped like
/// a head's circuits (`d_model × d_head` times `d_head × d_model`).
pub fn random_baseline(d_model: usize, d_head: usize, samples: usize, device: &burn::tensor::Device) -> f64 {
    let rand = |shape: [usize; 3]| Tensor::<3>::random(shape, Distribution::Normal(0.0, 1.0), device);
    let left = FactoredMatrix::new(rand([samples, d_model, d_head]), rand([samples, d_head, d_model]));
    let right = FactoredMatrix::new(rand([1, d_model, d_head]), rand([1, d_head, d_model]));
    let s = pair_scores(&left, &right);
    s.iter().map(|&x| x as f64).sum::<f64>() / s.len() as f64
}
