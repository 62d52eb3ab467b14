//! One sparse dictionary: the weights and computation that SAEs, transcoders (with or
//! without a skip connection) and each layer of a cross-layer transcoder share.
//!
//! ```text
//! pre(x)    = (x − b_dec·[subtract_b_dec]) W_enc + b_enc      W_enc [d_in, d_sae]
//! encode(x) = rule(pre(x))                                   (rule.rs: ReLU, JumpReLU, TopK)
//! encode_sparse(x): the same, as each token's active features (codes.rs, select.rs)
//! decode(f) = f W_dec[0] + b_dec                              W_dec[i] [d_sae, d_out]
//! skip(x)   = x M                                             M [d_in, d_out]
//! ```
//!
//! One orientation for everyone: SAELens's (`W_enc [d_in, d_sae]`, decoders `[d_sae, d_out]`);
//! the readers of circuit-tracer's files transpose its `[features, d_model]` encoders once
//! at load. A CLT's layer has one decoder per layer it writes (`w_dec[i]` writes layer
//! `l + i`). Written once, backend-free: the same calls run on the CPU and on a GPU device,
//! the host fast paths chosen by the device inside (the TopK selection, `rule.rs`).
//! An SAE ([`crate::sae::Sae`]) is a dictionary with SAELens's config around it (hook point,
//! input normalisation); a transcoder set is a dictionary per layer.

pub mod codes;
mod rule;
pub mod select;

use burn::tensor::{Int, Tensor};
use burnlens_model::matmul::matmul;

pub use codes::Codes;
pub use rule::Rule;

/// A sparse dictionary's weights and activation rule.
#[derive(Debug, Clone)]
pub struct Dictionary {
    /// `[d_in, d_sae]`
    pub w_enc: Tensor<2>,
    /// `[d_sae]`
    pub b_enc: Tensor<1>,
    /// Decoders `[d_sae, d_out]`: one for an SAE or a per-layer transcoder; a CLT layer's
    /// `w_dec[i]` writes layer `l + i`.
    pub w_dec: Vec<Tensor<2>>,
    /// `[d_out]`, added to the (first) reconstruction.
    pub b_dec: Tensor<1>,
    /// `[d_sae]`, JumpReLU's thresholds.
    pub threshold: Option<Tensor<1>>,
    /// `M [d_in, d_out]` of the skip term `x · M` (skip transcoders).
    pub w_skip: Option<Tensor<2>>,
    pub rule: Rule,
    /// Subtract `b_dec` from the input before encoding (SAELens's `apply_b_dec_to_input`;
    /// never for transcoders, whose `b_dec` is the output's).
    pub subtract_b_dec: bool,
}

impl Dictionary {
    pub fn d_in(&self) -> usize {
        self.w_enc.dims()[0]
    }

    /// Features.
    pub fn d_sae(&self) -> usize {
        self.w_enc.dims()[1]
    }

    pub fn d_out(&self) -> usize {
        self.b_dec.dims()[0]
    }

    /// The first (an SAE's only) decoder `[d_sae, d_out]`.
    pub fn decoder(&self) -> &Tensor<2> {
        &self.w_dec[0]
    }

    /// `[d_sae]`: each row's L2 norm of the first decoder (`W_dec.norm(dim=1)`).
    pub fn decoder_norms(&self) -> Tensor<1> {
        let d_sae = self.d_sae();
        self.decoder().clone().square().sum_dim(1).sqrt().reshape([d_sae])
    }

    /// What the encoder reads of inputs `x: [n, d_in]`: `x − b_dec` where `subtract_b_dec`
    /// (SAELens's `sae_in`), `x` otherwise.
    pub fn input(&self, x: Tensor<2>) -> Tensor<2> {
        if self.subtract_b_dec { x - self.b_dec.clone().reshape([1, self.d_in()]) } else { x }
    }

    /// Pre-activations `[n, d_sae]` of inputs `x: [n, d_in]`.
    pub fn pre(&self, x: Tensor<2>) -> Tensor<2> {
        self.pre_by(x, matmul)
    }

    /// [`pre`](Self::pre) for a training pass whose gradient of the pre-activations holds
    /// about `cap` non-zeros a row (TopK's, BatchTopK's): on a GPU the encoder's gradients
    /// read only those ([`burnlens_model::gpu::product_sparse_grad`]); the same values and
    /// gradients as [`pre`](Self::pre).
    pub fn pre_with_sparse_gradient(&self, x: Tensor<2>, cap: usize) -> Tensor<2> {
        self.pre_by(x, |a, b| burnlens_model::gpu::product_sparse_grad(a.clone(), b.clone(), cap).unwrap_or_else(|| matmul(a, b)))
    }

    fn pre_by(&self, x: Tensor<2>, product: impl FnOnce(Tensor<2>, Tensor<2>) -> Tensor<2>) -> Tensor<2> {
        product(self.input(x), self.w_enc.clone()) + self.b_enc.clone().reshape([1, self.d_sae()])
    }

    /// [`pre`](Self::pre) on the host, into `out` (`[n, d_sae]`, a buffer the caller keeps
    /// between calls), of what the encoder reads (`input`: [`input`](Self::input)'s rows,
    /// `[n, d_in]`), with burnlens's GEMM: the hand-written training passes' fast path.
    pub fn pre_into(&self, input: &[f32], out: &mut [f32]) {
        use burnlens_model::kernels::gemm::{MatRef, matmul};
        use rayon::prelude::*;
        let (k, m) = (self.d_in(), self.d_sae());
        let w = host(self.w_enc.clone());
        let b = host(self.b_enc.clone());
        out.par_chunks_mut(m).for_each(|row| row.copy_from_slice(&b));
        matmul(out, m, MatRef::row_major(input, input.len() / k, k), MatRef::row_major(&w, k, m), true);
    }

    /// The active features of inputs `x: [n, d_in]` as sparse codes, on the host: each
    /// token's features that [`encode`](Self::encode) leaves non-zero, with the coefficient
    /// its decoder row is multiplied by (the activation, divided by the decoder norm where
    /// the TopK choice was rescaled), so that decoding the codes through `W_dec` plus `b_dec`
    /// is [`decode`](Self::decode)`(encode(x))`.
    pub fn encode_sparse(&self, x: Tensor<2>) -> Codes {
        let input = host(self.input(x));
        let mut pre = vec![0.0f32; input.len() / self.d_in() * self.d_sae()];
        self.pre_into(&input, &mut pre);
        self.codes(&pre)
    }

    /// [`encode_sparse`](Self::encode_sparse) of pre-activations `pre` (`[n, d_sae]`, host).
    pub fn codes(&self, pre: &[f32]) -> Codes {
        let m = self.d_sae();
        match self.rule {
            Rule::Relu => Codes::select(pre, m, |_, _, v| v > 0.0),
            Rule::JumpRelu { relu } => {
                let th = host(self.threshold.clone().expect("a JumpReLU dictionary has a threshold"));
                Codes::select(pre, m, |_, j, v| v > th[j] && (!relu || v > 0.0))
            }
            Rule::TopK { k, rescale_acts_by_decoder_norm, relu } => {
                let norms = rescale_acts_by_decoder_norm.then(|| host(self.decoder_norms()));
                let scores = select::Scores { pre, m, scale: norms.as_deref() };
                if relu {
                    return scores.top_k_per_row(k);
                }
                // Signs kept (circuit-tracer): the k largest scores, whatever their sign.
                let score = |j: usize, v: f32| norms.as_ref().map_or(v, |s| v * s[j]);
                let kth = select::kth_largest_per_row(pre.len() / m, m, k.min(m), |r, j| Some(score(j, pre[r * m + j])));
                Codes::select(pre, m, |r, j, v| score(j, v) >= kth[r])
            }
        }
    }

    /// Feature activations `[n, d_sae]` of inputs `x: [n, d_in]`.
    pub fn encode(&self, x: Tensor<2>) -> Tensor<2> {
        self.rule.apply(self.pre(x), self.threshold.as_ref(), || self.decoder_norms())
    }

    /// The reconstruction `[n, d_out]` of activations `f: [n, d_sae]` through the first
    /// decoder (divided by the decoder norms first where the TopK choice was rescaled). A TopK
    /// dictionary's on a GPU reads only the decoder rows each token uses
    /// ([`burnlens_model::gpu::decode_sparse`], `k` listed a row, a row with more read whole:
    /// the same values for any `f`); not for tracked activations, whose gradient it would
    /// give on their non-zeros alone.
    pub fn decode(&self, f: Tensor<2>) -> Tensor<2> {
        let f = if self.rule.rescales() { f / self.decoder_norms().reshape([1, self.d_sae()]) } else { f };
        let w = self.decoder().clone();
        let sparse = match self.rule {
            Rule::TopK { k, .. } if !f.is_autodiff() => burnlens_model::gpu::decode_sparse(f.clone(), w.clone(), k),
            _ => None,
        };
        sparse.unwrap_or_else(|| matmul(f, w)) + self.b_dec.clone().reshape([1, self.d_out()])
    }

    /// The skip term `x · M` `[n, d_out]`, if the dictionary has one.
    pub fn skip(&self, x: Tensor<2>) -> Option<Tensor<2>> {
        self.w_skip.as_ref().map(|w| matmul(x, w.clone()))
    }

    /// The same dictionary with each first-decoder row scaled to norm 1 and the encoder
    /// column, bias and threshold scaled up by that norm (SAELens's `fold_W_dec_norm`, and
    /// how SAEDashboard reads an SAE): a feature's activation is then measured along a unit
    /// direction. A TopK choice on rescaled pre-activations becomes a plain one (the scores
    /// are unchanged); a TopK dictionary that does not rescale is returned as it is (folding
    /// would change what it chooses). Norms below 1e-8 are taken as 1e-8.
    pub fn fold_decoder_norms(&self) -> Dictionary {
        let mut d = self.clone();
        if matches!(d.rule, Rule::TopK { rescale_acts_by_decoder_norm: false, .. }) {
            return d;
        }
        let n = d.d_sae();
        let norms = d.decoder_norms().clamp_min(1e-8);
        d.w_dec = d.w_dec.into_iter().map(|w| w / norms.clone().reshape([n, 1])).collect();
        d.w_enc = d.w_enc * norms.clone().reshape([1, n]);
        d.b_enc = d.b_enc * norms.clone();
        d.threshold = d.threshold.map(|t| t * norms);
        if let Rule::TopK { k, relu, .. } = d.rule {
            d.rule = Rule::TopK { k, rescale_acts_by_decoder_norm: false, relu };
        }
        d
    }

    /// The dictionary cut down to the features `idx` (in that order).
    pub fn restrict(&self, idx: Tensor<1, Int>) -> Dictionary {
        let mut d = self.clone();
        d.w_enc = d.w_enc.select(1, idx.clone());
        d.b_enc = d.b_enc.select(0, idx.clone());
        d.w_dec = d.w_dec.into_iter().map(|w| w.select(0, idx.clone())).collect();
        d.threshold = d.threshold.map(|t| t.select(0, idx));
        d
    }
}

/// An f32 tensor's values, row-major.
fn host<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().try_into_vec_as::<f32>().expect("an f32 tensor")
}

#[cfg(test)]
mod tests {
    use burn::tensor::TensorData;

    use super::*;

    fn t2(v: Vec<f32>, shape: [usize; 2]) -> Tensor<2> {
        Tensor::from_data(TensorData::new(v, shape), &Default::default())
    }
    fn t1(v: Vec<f32>) -> Tensor<1> {
        let n = v.len();
        Tensor::from_data(TensorData::new(v, [n]), &Default::default())
    }
    fn host(t: Tensor<2>) -> Vec<f32> {
        t.into_data().try_into_vec_as::<f32>().unwrap()
    }

    /// d_in 2, d_sae 3: the encoder picks x0, x1 and x0 − x1; decoders of norms 2, 1, 0.5.
    fn dict(rule: Rule) -> Dictionary {
        Dictionary {
            w_enc: t2(vec![1.0, 0.0, 1.0, 0.0, 1.0, -1.0], [2, 3]),
            b_enc: t1(vec![0.0, 0.0, 0.0]),
            w_dec: vec![t2(vec![2.0, 0.0, 0.0, 1.0, 0.3, 0.4], [3, 2])],
            b_dec: t1(vec![0.0, 0.0]),
            threshold: Some(t1(vec![1.5, -1.0, 0.5])),
            w_skip: None,
            rule,
            subtract_b_dec: false,
        }
    }

    #[test]
    fn each_rule_switches_on_what_its_reference_does() {
        let x = t2(vec![2.0, -0.5, 1.0, 3.0], [2, 2]);
        // pre: [2, -0.5, 2.5], [1, 3, -2]
        assert_eq!(host(dict(Rule::Relu).encode(x.clone())), vec![2.0, 0.0, 2.5, 1.0, 3.0, 0.0]);
        // SAELens's JumpReLU has a ReLU after the mask; circuit-tracer's keeps the sign (the
        // threshold −1 lets −0.5 through).
        assert_eq!(host(dict(Rule::JUMP_RELU).encode(x.clone())), vec![2.0, 0.0, 2.5, 0.0, 3.0, 0.0]);
        assert_eq!(host(dict(Rule::JumpRelu { relu: false }).encode(x.clone())), vec![2.0, -0.5, 2.5, 0.0, 3.0, 0.0]);
        assert_eq!(host(dict(Rule::top_k(1, false)).encode(x.clone())), vec![0.0, 0.0, 2.5, 0.0, 3.0, 0.0]);
        // Rescaled by the decoder norms [2, 1, 0.5]: scores [4, -0.5, 1.25], [2, 3, -1].
        assert_eq!(host(dict(Rule::top_k(1, true)).encode(x.clone())), vec![4.0, 0.0, 0.0, 0.0, 3.0, 0.0]);
        let signed = Rule::TopK { k: 2, rescale_acts_by_decoder_norm: false, relu: false };
        // pre [-1, -2, 1]: the two largest are kept with their signs.
        assert_eq!(host(dict(signed).encode(t2(vec![-1.0, -2.0], [1, 2]))), vec![-1.0, 0.0, 1.0]);
    }

    #[test]
    fn folding_keeps_reconstructions_and_makes_unit_decoders() {
        let x = t2(vec![2.0, -0.5, 1.0, 3.0, 0.2, 0.1], [3, 2]);
        for rule in [Rule::Relu, Rule::JUMP_RELU, Rule::top_k(1, true), Rule::top_k(2, false)] {
            let d = dict(rule);
            let f = d.fold_decoder_norms();
            let (a, b) = (host(d.decode(d.encode(x.clone()))), host(f.decode(f.encode(x.clone()))));
            a.iter().zip(&b).for_each(|(a, b)| assert!((a - b).abs() < 1e-6, "{rule:?}: {a} vs {b}"));
            if rule != Rule::top_k(2, false) {
                let norms: Vec<f32> = f.decoder_norms().into_data().try_into_vec_as::<f32>().unwrap();
                norms.iter().for_each(|n| assert!((n - 1.0).abs() < 1e-6, "{rule:?}: {norms:?}"));
                assert!(!f.rule.rescales());
            }
        }
    }

    #[test]
    fn sparse_codes_are_the_dense_encoding() {
        let x = t2(vec![2.0, -0.5, 1.0, 3.0, 0.2, 0.1, -1.0, -2.0], [4, 2]);
        let rules = [
            Rule::Relu,
            Rule::JUMP_RELU,
            Rule::JumpRelu { relu: false },
            Rule::top_k(1, false),
            Rule::top_k(2, true),
            Rule::TopK { k: 2, rescale_acts_by_decoder_norm: false, relu: false },
            Rule::TopK { k: 1, rescale_acts_by_decoder_norm: true, relu: false },
        ];
        for rule in rules {
            let d = dict(rule);
            let dense = host(d.encode(x.clone()));
            let codes = d.encode_sparse(x.clone());
            let nonzero: Vec<u32> = dense.chunks(3).flat_map(|r| r.iter().enumerate().filter(|(_, v)| **v != 0.0).map(|(j, _)| j as u32)).collect();
            assert_eq!(codes.features, nonzero, "{rule:?}: which features are active");
            let mut sparse = vec![0.0f32; 4 * 2];
            codes.decode_into(&host(d.decoder().clone()), 2, &mut sparse);
            let want = host(d.decode(d.encode(x.clone())));
            sparse.iter().zip(&want).for_each(|(a, b)| assert!((a - b).abs() < 1e-6, "{rule:?}: {sparse:?} vs {want:?}"));
        }
    }
}
