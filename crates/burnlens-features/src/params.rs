//! An SAE's (or transcoder's) trainable parameters and SAELens 6's initialisation of them:
//! decoder rows drawn as `kaiming_uniform_` draws them (uniform in ±√2·√(3/d_out)), scaled
//! to norm `decoder_init_norm` (0.1, Anthropic's heuristic), the encoder their transpose
//! (a transcoder whose input and output widths differ draws its encoder the same way), biases
//! zero, JumpReLU thresholds at their initial value, a transcoder's skip connection zero.

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
    /// `[d_sae, d_out]` (`d_out = d_in` for an SAE)
    pub w_dec: Tensor<2>,
    /// `[d_out]`
    pub b_dec: Tensor<1>,
    /// `[d_sae]`, JumpReLU only.
    pub threshold: Option<Tensor<1>>,
    /// `[d_out, d_in]`, a skip transcoder's `W_skip`, applied as `x · W_skipᵀ` (circuit-tracer's
    /// orientation).
    pub w_skip: Option<Tensor<2>>,
}

/// The shape of what is trained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub d_in: usize,
    pub d_sae: usize,
    /// `d_in` for an SAE.
    pub d_out: usize,
    /// A transcoder's skip connection.
    pub skip: bool,
}

/// SAELens's `decoder_init_norm` default.
pub const DECODER_INIT_NORM: f64 = 0.1;

impl SaeParams {
    /// A fresh SAE or transcoder as SAELens initialises one (its draws come from `rng`).
    pub fn init(arch: &Architecture, shape: Shape, decoder_init_norm: Option<f64>, rng: &mut Rng, device: &Device) -> Self {
        let Shape { d_in, d_sae, d_out, skip } = shape;
        let w_dec = Tensor::<2>::from_data(TensorData::new(kaiming_rows(d_sae, d_out, decoder_init_norm, rng), [d_sae, d_out]), device);
        let w_enc = if d_in == d_out {
            w_dec.clone().transpose()
        } else {
            Tensor::<2>::from_data(TensorData::new(kaiming_rows(d_sae, d_in, decoder_init_norm, rng), [d_sae, d_in]), device).transpose()
        };
        let threshold = match arch {
            Architecture::JumpRelu(j) => Some(Tensor::<1>::full([d_sae], j.init_threshold as f32, device)),
            _ => None,
        };
        let w_skip = skip.then(|| Tensor::zeros([d_out, d_in], device));
        SaeParams { w_enc, b_enc: Tensor::zeros([d_sae], device), w_dec, b_dec: Tensor::zeros([d_out], device), threshold, w_skip }
    }

    /// `(d_in, d_sae)`.
    pub fn dims(&self) -> (usize, usize) {
        let [d_in, d_sae] = self.w_enc.dims();
        (d_in, d_sae)
    }

    /// `[d_sae]`: each decoder row's L2 norm (`W_dec.norm(dim=1)`).
    pub fn decoder_norms(&self) -> Tensor<1> {
        let d_sae = self.w_dec.dims()[0];
        self.w_dec.clone().square().sum_dim(1).sqrt().reshape([d_sae])
    }

    /// The full shape.
    pub fn shape(&self) -> Shape {
        let (d_in, d_sae) = self.dims();
        Shape { d_in, d_sae, d_out: self.w_dec.dims()[1], skip: self.w_skip.is_some() }
    }

    /// The parameters as SAELens names them (`W_enc`, `b_enc`, `W_dec`, `b_dec`,
    /// `threshold`, `W_skip`), in that order.
    pub fn named(&self) -> Vec<(&'static str, Tensor<2>)> {
        let mut v = vec![
            ("W_enc", self.w_enc.clone()),
            ("b_enc", self.b_enc.clone().unsqueeze()),
            ("W_dec", self.w_dec.clone()),
            ("b_dec", self.b_dec.clone().unsqueeze()),
        ];
        v.extend(self.threshold.clone().map(|t| ("threshold", t.unsqueeze())));
        v.extend(self.w_skip.clone().map(|t| ("W_skip", t)));
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
            w_skip: self.w_skip.clone().map(|t| t.autodiff().require_grad()),
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
            w_skip: self.w_skip.as_ref().map(|t| g(t, grads)),
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
            w_skip: self.w_skip.clone().map(|t| f("W_skip", t)),
        }
    }
}

/// `rows × width` values as `kaiming_uniform_` draws a `[rows, width]` weight, each row scaled
/// to `norm` when given.
fn kaiming_rows(rows: usize, width: usize, norm: Option<f64>, rng: &mut Rng) -> Vec<f32> {
    let bound = 2f64.sqrt() * (3.0 / width as f64).sqrt();
    let mut w: Vec<f32> = (0..rows * width).map(|_| ((rng.next_f64() * 2.0 - 1.0) * bound) as f32).collect();
    if let Some(norm) = norm {
        for row in w.chunks_mut(width) {
            let n = row.iter().map(|v| v * v).sum::<f32>().sqrt();
            row.iter_mut().for_each(|v| *v = *v / n * norm as f32);
        }
    }
    w
}
