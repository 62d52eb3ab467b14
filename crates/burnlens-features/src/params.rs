//! An SAE's trainable parameters and SAELens 6's initialisation of them: decoder rows drawn
//! as `kaiming_uniform_` draws them (uniform in ±√2·√(3/d_in)), scaled to norm
//! `decoder_init_norm` (0.1, Anthropic's heuristic), the encoder their transpose, biases
//! zero, JumpReLU thresholds at their initial value.

use burn::tensor::{Device, Tensor, TensorData};
use burnlens_model::Rng;

use crate::architecture::Architecture;

/// The weights being trained, in SAELens's shapes.
#[derive(Debug, Clone)]
pub struct SaeParams {
    /// `[d_in, d_sae]`
    pub w_enc: Tensor<2>,
    /// `[d_sae]`
    pub b_enc: Tensor<1>,
    /// `[d_sae, d_in]`
    pub w_dec: Tensor<2>,
    /// `[d_in]`
    pub b_dec: Tensor<1>,
    /// `[d_sae]`, JumpReLU only.
    pub threshold: Option<Tensor<1>>,
}

/// SAELens's `decoder_init_norm` default.
pub const DECODER_INIT_NORM: f64 = 0.1;

impl SaeParams {
    /// A fresh SAE as SAELens initialises one (its random draws come from `rng`).
    pub fn init(arch: &Architecture, d_in: usize, d_sae: usize, decoder_init_norm: Option<f64>, rng: &mut Rng, device: &Device) -> Self {
        let bound = 2f64.sqrt() * (3.0 / d_in as f64).sqrt();
        let mut w: Vec<f32> = (0..d_sae * d_in).map(|_| ((rng.next_f64() * 2.0 - 1.0) * bound) as f32).collect();
        if let Some(norm) = decoder_init_norm {
            for row in w.chunks_mut(d_in) {
                let n = row.iter().map(|v| v * v).sum::<f32>().sqrt();
                row.iter_mut().for_each(|v| *v = *v / n * norm as f32);
            }
        }
        let w_dec = Tensor::<2>::from_data(TensorData::new(w, [d_sae, d_in]), device);
        let threshold = match arch {
            Architecture::JumpRelu(j) => Some(Tensor::<1>::full([d_sae], j.init_threshold as f32, device)),
            _ => None,
        };
        SaeParams { w_enc: w_dec.clone().transpose(), b_enc: Tensor::zeros([d_sae], device), w_dec, b_dec: Tensor::zeros([d_in], device), threshold }
    }

    /// `(d_in, d_sae)`.
    pub fn dims(&self) -> (usize, usize) {
        let [d_sae, d_in] = self.w_dec.dims();
        (d_in, d_sae)
    }

    /// The parameters as SAELens names them (`W_enc`, `b_enc`, `W_dec`, `b_dec`,
    /// `threshold`), in that order.
    pub fn named(&self) -> Vec<(&'static str, Tensor<2>)> {
        let mut v = vec![
            ("W_enc", self.w_enc.clone()),
            ("b_enc", self.b_enc.clone().unsqueeze()),
            ("W_dec", self.w_dec.clone()),
            ("b_dec", self.b_dec.clone().unsqueeze()),
        ];
        v.extend(self.threshold.clone().map(|t| ("threshold", t.unsqueeze())));
        v
    }

    /// Each parameter as itself, an autodiff leaf that records its gradient.
    pub fn leaves(&self) -> SaeParams {
        SaeParams {
            w_enc: self.w_enc.clone().autodiff().require_grad(),
            b_enc: self.b_enc.clone().autodiff().require_grad(),
            w_dec: self.w_dec.clone().autodiff().require_grad(),
            b_dec: self.b_dec.clone().autodiff().require_grad(),
            threshold: self.threshold.clone().map(|t| t.autodiff().require_grad()),
        }
    }

    /// The gradients of leaves made by [`leaves`](Self::leaves) (zero where none flowed).
    pub fn grads(&self, grads: &burn::tensor::Gradients) -> SaeParams {
        fn g<const D: usize>(t: &Tensor<D>, grads: &burn::tensor::Gradients) -> Tensor<D> {
            t.grad(grads).unwrap_or_else(|| t.clone().inner().zeros_like())
        }
        SaeParams {
            w_enc: g(&self.w_enc, grads),
            b_enc: g(&self.b_enc, grads),
            w_dec: g(&self.w_dec, grads),
            b_dec: g(&self.b_dec, grads),
            threshold: self.threshold.as_ref().map(|t| g(t, grads)),
        }
    }

    /// Apply `f` to every parameter (the same order as [`named`](Self::named)), building new
    /// parameters from what it returns.
    pub fn map(&self, mut f: impl FnMut(&'static str, Tensor<2>) -> Tensor<2>) -> SaeParams {
        let row = |t: Tensor<2>| -> Tensor<1> { t.squeeze_dim(0) };
        SaeParams {
            w_enc: f("W_enc", self.w_enc.clone()),
            b_enc: row(f("b_enc", self.b_enc.clone().unsqueeze())),
            w_dec: f("W_dec", self.w_dec.clone()),
            b_dec: row(f("b_dec", self.b_dec.clone().unsqueeze())),
            threshold: self.threshold.clone().map(|t| row(f("threshold", t.unsqueeze()))),
        }
    }
}
