//! Low-rank matrices kept as the product of their factors.
//!
//! A head's `QK = W_Q W_Kᵀ` is `d_model × d_model` but has rank `d_head`; its full circuit
//! `W_E QK W_Eᵀ` is `vocab × vocab`. [`FactoredMatrix`] stores `A [n, l, m]` and
//! `B [n, m, r]` (a batch of `n`, usually one per head) and answers questions about `AB`
//! through `m × m` matrices, materialising `l × r` only when [`FactoredMatrix::ab`] is asked.

use burn::tensor::{Tensor, TensorData};
use burnlens_model::matmul::matmul;
use nalgebra::{Complex, DMatrix};

/// `A B` for a batch of `n` pairs: `A [n, l, m]`, `B [n, m, r]`.
#[derive(Debug, Clone)]
pub struct FactoredMatrix {
    pub a: Tensor<3>,
    pub b: Tensor<3>,
}

/// The singular value decomposition `AB = U diag(S) Vᵀ` of one matrix of the batch.
///
/// Note which factor is which: `v` holds the right singular vectors **as columns**, i.e. it
/// is `V`, not `Vᵀ` (TransformerLens's `FactoredMatrix.svd` also returns `V`; its docs once
/// called it `Vh`). So `AB = u · diag(s) · vᵀ`.
#[derive(Debug, Clone)]
pub struct Svd {
    /// `[l, k]`, orthonormal columns.
    pub u: DMatrix<f64>,
    /// `[k]`, descending, non-negative.
    pub s: Vec<f64>,
    /// `[r, k]`, orthonormal columns (this is `V`).
    pub v: DMatrix<f64>,
}

/// Row-major host copy of a rank-3 tensor's element `i` as an `f64` matrix.
pub fn host_matrix(t: &Tensor<3>, i: usize) -> DMatrix<f64> {
    let [_, rows, cols] = t.dims();
    let v: Vec<f32> = t.clone().narrow(0, i, 1).into_data().try_into_vec_as::<f32>().expect("f32");
    DMatrix::from_row_iterator(rows, cols, v.into_iter().map(f64::from))
}

fn to_tensor(m: &DMatrix<f64>, device: &burn::tensor::Device) -> Tensor<2> {
    let data: Vec<f32> = m.transpose().iter().map(|&x| x as f32).collect(); // row-major
    Tensor::from_data(TensorData::new(data, [m.nrows(), m.ncols()]), device)
}

impl FactoredMatrix {
    pub fn new(a: Tensor<3>, b: Tensor<3>) -> Self {
        let ([na, _, ma], [nb, mb, _]) = (a.dims(), b.dims());
        assert_eq!(na, nb, "FactoredMatrix: batch sizes differ ({na} vs {nb})");
        assert_eq!(ma, mb, "FactoredMatrix: inner dimensions differ ({ma} vs {mb})");
        Self { a, b }
    }

    /// A single `[l, m] × [m, r]` product as a batch of one.
    pub fn single(a: Tensor<2>, b: Tensor<2>) -> Self {
        Self::new(a.unsqueeze(), b.unsqueeze())
    }

    /// `[n, l, r]`.
    pub fn shape(&self) -> [usize; 3] {
        let [n, l, _] = self.a.dims();
        [n, l, self.b.dims()[2]]
    }

    /// Shared dimension `m` (an upper bound on the rank).
    pub fn inner(&self) -> usize {
        self.a.dims()[2]
    }

    /// The full product `AB`, `[n, l, r]`.
    pub fn ab(&self) -> Tensor<3> {
        matmul(self.a.clone(), self.b.clone())
    }

    /// `BA`, `[n, m, m]` (needs `l == r`): same non-zero eigenvalues as `AB`.
    pub fn ba(&self) -> Tensor<3> {
        let [_, l, r] = self.shape();
        assert_eq!(l, r, "BA needs a square AB, found {l} x {r}");
        matmul(self.b.clone(), self.a.clone())
    }

    /// `(AB)ᵀ = Bᵀ Aᵀ`.
    pub fn t(&self) -> Self {
        Self { a: self.b.clone().swap_dims(1, 2), b: self.a.clone().swap_dims(1, 2) }
    }

    /// Element `i` of the batch, as a batch of one.
    pub fn select(&self, i: usize) -> Self {
        Self { a: self.a.clone().narrow(0, i, 1), b: self.b.clone().narrow(0, i, 1) }
    }

    /// Squared Frobenius norm per batch element, `[n]`: `‖AB‖² = Σ (AᵀA) ∘ (BBᵀ)`.
    pub fn norm_sq(&self) -> Tensor<1> {
        let gram_a = matmul(self.a.clone().swap_dims(1, 2), self.a.clone());
        let gram_b = matmul(self.b.clone(), self.b.clone().swap_dims(1, 2));
        let n = self.a.dims()[0];
        (gram_a * gram_b).sum_dims_squeeze::<1, _>(&[1, 2]).reshape([n])
    }

    /// Frobenius norm per batch element.
    pub fn norm(&self) -> Vec<f64> {
        let v: Vec<f32> = self.norm_sq().into_data().try_into_vec_as::<f32>().expect("f32");
        v.into_iter().map(|x| (x.max(0.0) as f64).sqrt()).collect()
    }

    /// `(AB) M` for `M [r, k]`, still factored: `A (B M)`.
    pub fn matmul_right(&self, m: Tensor<2>) -> Self {
        let n = self.a.dims()[0];
        let [r, k] = m.dims();
        Self { a: self.a.clone(), b: matmul(self.b.clone(), m.unsqueeze::<3>().expand([n, r, k])) }
    }

    /// `M (AB)` for `M [k, l]`, still factored: `(M A) B`.
    pub fn matmul_left(&self, m: Tensor<2>) -> Self {
        let n = self.a.dims()[0];
        let [k, l] = m.dims();
        Self { a: matmul(m.unsqueeze::<3>().expand([n, k, l]), self.a.clone()), b: self.b.clone() }
    }

    /// `(A₁B₁)(A₂B₂)`, factored through the smaller inner dimension.
    pub fn matmul(&self, other: &Self) -> Self {
        let middle = matmul(self.b.clone(), other.a.clone()); // [n, m1, m2]
        if self.inner() <= other.inner() {
            Self { a: self.a.clone(), b: matmul(middle, other.b.clone()) }
        } else {
            Self { a: matmul(self.a.clone(), middle), b: other.b.clone() }
        }
    }

    /// SVD of batch element `i`, from QR decompositions of the factors: with `A = Q_a R_a`
    /// and `Bᵀ = Q_b R_b`, `AB = Q_a (R_a R_bᵀ) Q_bᵀ`, so only an `m × m` SVD is needed.
    pub fn svd(&self, i: usize) -> Svd {
        let a = host_matrix(&self.a, i);
        let b = host_matrix(&self.b, i);
        let m = a.ncols();
        if a.nrows() < m || b.ncols() < m {
            let full = (&a * &b).svd(true, true);
            let v = full.v_t.expect("v").transpose();
            return Svd { u: full.u.expect("u"), s: full.singular_values.iter().copied().collect(), v };
        }
        let qa = a.qr();
        let qb = b.transpose().qr();
        let core = qa.r() * qb.r().transpose();
        let small = core.svd(true, true);
        let mut order: Vec<usize> = (0..m).collect();
        order.sort_by(|&x, &y| small.singular_values[y].total_cmp(&small.singular_values[x]));
        let u_small = small.u.expect("u");
        let v_small = small.v_t.expect("v").transpose();
        let pick = |mat: &DMatrix<f64>| DMatrix::from_fn(mat.nrows(), m, |r, c| mat[(r, order[c])]);
        Svd { u: qa.q() * pick(&u_small), s: order.iter().map(|&k| small.singular_values[k]).collect(), v: qb.q() * pick(&v_small) }
    }

    /// Eigenvalues of batch element `i` (square `AB` only), computed from `BA [m, m]`:
    /// these are the non-zero eigenvalues of `AB` (plus zeros if `m` exceeds the rank).
    pub fn eigenvalues(&self, i: usize) -> Vec<Complex<f64>> {
        let ba = self.ba();
        host_matrix(&ba, i).complex_eigenvalues().iter().copied().collect()
    }

    /// Materialise batch element `i` as a device tensor `[l, r]` (for small matrices).
    pub fn ab_one(&self, i: usize) -> Tensor<2> {
        let device = self.a.device();
        let prod = host_matrix(&self.a, i) * host_matrix(&self.b, i);
        to_tensor(&prod, &device)
    }
}

/// `Σ Re(λ) / Σ |λ|`: +1 for a matrix that copies (positive eigenvalues), −1 for one that
/// suppresses, near 0 for neither.
pub fn copying_score(eigenvalues: &[Complex<f64>]) -> f64 {
    let total: f64 = eigenvalues.iter().map(|z| z.norm()).sum();
    if total == 0.0 { 0.0 } else { eigenvalues.iter().map(|z| z.re).sum::<f64>() / total }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{Device, Distribution};

    fn random(shape: [usize; 3], device: &Device) -> Tensor<3> {
        Tensor::random(shape, Distribution::Normal(0.0, 1.0), device)
    }

    #[test]
    fn factored_operations_match_the_materialised_product() {
        let device = Device::flex();
        let f = FactoredMatrix::new(random([3, 10, 4], &device), random([3, 4, 10], &device));
        let full = f.ab();
        // Norm.
        let direct: Vec<f32> = full.clone().powi_scalar(2).sum_dims_squeeze::<1, _>(&[1, 2]).into_data().try_into_vec_as().unwrap();
        for (n, d) in f.norm().iter().zip(direct) {
            assert!((n - (d as f64).sqrt()).abs() < 1e-3 * n, "{n} vs {}", d.sqrt());
        }
        // Transpose and products.
        let t = f.t().ab();
        assert!((t - full.clone().swap_dims(1, 2)).abs().max().into_scalar::<f32>() < 1e-4);
        let g = FactoredMatrix::new(random([3, 10, 2], &device), random([3, 2, 10], &device));
        let fg = f.matmul(&g);
        assert_eq!(fg.inner(), 2);
        let want = full.clone().matmul(g.ab());
        assert!((fg.ab() - want.clone()).abs().max().into_scalar::<f32>() < 1e-3 * want.abs().max().into_scalar::<f32>());
        // SVD reconstructs AB; V is V, not Vᵀ.
        let svd = f.svd(1);
        let m = host_matrix(&full, 1);
        let rebuilt = &svd.u * DMatrix::from_diagonal(&nalgebra::DVector::from_vec(svd.s.clone())) * svd.v.transpose();
        assert!((rebuilt - &m).abs().max() < 1e-3);
        assert!(svd.s.windows(2).all(|w| w[0] >= w[1]));
        assert_eq!((svd.u.nrows(), svd.v.nrows(), svd.s.len()), (10, 10, 4));
        // Eigenvalues of BA are the non-zero eigenvalues of AB: same trace.
        let eig = f.eigenvalues(2);
        let trace: f64 = (0..10).map(|k| host_matrix(&full, 2)[(k, k)]).sum();
        let sum: f64 = eig.iter().map(|z| z.re).sum();
        assert!((trace - sum).abs() < 1e-3 * trace.abs().max(1.0), "{trace} vs {sum}");
    }

    #[test]
    fn copying_score_of_identity_and_its_negative() {
        let device = Device::flex();
        let eye: Tensor<2> = Tensor::eye(5, &device);
        let id = FactoredMatrix::single(eye.clone(), eye.clone());
        assert!((copying_score(&id.eigenvalues(0)) - 1.0).abs() < 1e-9);
        let neg = FactoredMatrix::single(eye.clone(), eye.neg());
        assert!((copying_score(&neg.eigenvalues(0)) + 1.0).abs() < 1e-9);
    }
}
