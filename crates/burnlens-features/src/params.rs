//! A dictionary as it is trained ([`Trainable`]: its parameters named, as autodiff leaves,
//! their gradients) and SAELens 6's initialisation of it:
//! decoder rows drawn as `kaiming_uniform_` draws them (uniform in ±√2·√(3/d_out)), scaled
//! to norm `decoder_init_norm` (0.1, Anthropic's heuristic), the encoder their transpose
//! (a transcoder whose input and output widths differ draws its encoder the same way), biases
//! zero, JumpReLU thresholds at their initial value, a transcoder's skip connection zero.

use burn::tensor::{Device, Tensor, TensorData};
use burnlens_lens::dictionary::Dictionary;
use burnlens_model::Rng;

use crate::architecture::Architecture;

/// The shape of what is trained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub d_in: usize,
    pub d_sae: usize,
    /// `d_in` for an SAE.
    pub d_out: usize,
    /// A transcoder (its target is another hook's activation; its input keeps `b_dec`).
    pub transcoder: bool,
    /// A transcoder's skip connection.
    pub skip: bool,
}

impl Shape {
    /// An SAE on `d_in`-wide activations with `d_sae` features.
    pub const fn sae(d_in: usize, d_sae: usize) -> Shape {
        Shape { d_in, d_sae, d_out: d_in, transcoder: false, skip: false }
    }
}

/// SAELens's `decoder_init_norm` default.
pub const DECODER_INIT_NORM: f64 = 0.1;

/// A fresh SAE or transcoder as SAELens initialises one (its draws come from `rng`), with
/// the rule `arch` trains.
pub fn init(arch: &Architecture, shape: Shape, decoder_init_norm: Option<f64>, rng: &mut Rng, device: &Device) -> Dictionary {
    let Shape { d_in, d_sae, d_out, transcoder, skip } = shape;
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
    Dictionary {
        w_enc,
        b_enc: Tensor::zeros([d_sae], device),
        w_dec: vec![w_dec],
        b_dec: Tensor::zeros([d_out], device),
        threshold,
        w_skip: (transcoder && skip).then(|| Tensor::zeros([d_in, d_out], device)),
        rule: arch.rule(),
        subtract_b_dec: !transcoder,
    }
}

/// A dictionary's parameters as one trains them: named, as autodiff leaves, their
/// gradients, mapped one by one. A trained dictionary has one decoder.
pub trait Trainable: Sized {
    /// The full shape.
    fn shape(&self) -> Shape;

    /// The parameters as SAELens names them (`W_enc`, `b_enc`, `W_dec`, `b_dec`,
    /// `threshold`, `W_skip` — the skip as the dictionary holds it, `[d_in, d_out]`), in
    /// that order, each as a matrix.
    fn named(&self) -> Vec<(&'static str, Tensor<2>)>;

    /// Apply `f` to every parameter (the order of [`named`](Self::named)), building a new
    /// dictionary (the same rule) from what it returns.
    fn map(&self, f: impl FnMut(&'static str, Tensor<2>) -> Tensor<2>) -> Self;

    /// Each parameter as itself, an autodiff leaf that records its gradient.
    fn leaves(&self) -> Self;

    /// The gradients of leaves made by [`leaves`](Self::leaves) (zero where none flowed),
    /// shaped like the dictionary.
    fn grads(&self, grads: &burn::tensor::Gradients) -> Self;
}

impl Trainable for Dictionary {
    fn shape(&self) -> Shape {
        Shape { d_in: self.d_in(), d_sae: self.d_sae(), d_out: self.d_out(), transcoder: !self.subtract_b_dec, skip: self.w_skip.is_some() }
    }

    fn named(&self) -> Vec<(&'static str, Tensor<2>)> {
        debug_assert_eq!(self.w_dec.len(), 1, "a trained dictionary has one decoder");
        let mut v = vec![
            ("W_enc", self.w_enc.clone()),
            ("b_enc", self.b_enc.clone().unsqueeze()),
            ("W_dec", self.decoder().clone()),
            ("b_dec", self.b_dec.clone().unsqueeze()),
        ];
        v.extend(self.threshold.clone().map(|t| ("threshold", t.unsqueeze())));
        v.extend(self.w_skip.clone().map(|t| ("W_skip", t)));
        v
    }

    fn leaves(&self) -> Self {
        fn leaf<const D: usize>(t: &Tensor<D>) -> Tensor<D> {
            t.clone().autodiff().require_grad()
        }
        Dictionary {
            w_enc: leaf(&self.w_enc),
            b_enc: leaf(&self.b_enc),
            w_dec: self.w_dec.iter().map(leaf).collect(),
            b_dec: leaf(&self.b_dec),
            threshold: self.threshold.as_ref().map(leaf),
            w_skip: self.w_skip.as_ref().map(leaf),
            ..self.clone()
        }
    }

    fn grads(&self, grads: &burn::tensor::Gradients) -> Self {
        let g = |t: &Tensor<2>| t.grad(grads).unwrap_or_else(|| t.clone().inner().zeros_like());
        let g1 = |t: &Tensor<1>| t.grad(grads).unwrap_or_else(|| t.clone().inner().zeros_like());
        Dictionary {
            w_enc: g(&self.w_enc),
            b_enc: g1(&self.b_enc),
            w_dec: self.w_dec.iter().map(g).collect(),
            b_dec: g1(&self.b_dec),
            threshold: self.threshold.as_ref().map(g1),
            w_skip: self.w_skip.as_ref().map(g),
            rule: self.rule,
            subtract_b_dec: self.subtract_b_dec,
        }
    }

    fn map(&self, mut f: impl FnMut(&'static str, Tensor<2>) -> Tensor<2>) -> Self {
        let row = |t: Tensor<2>| -> Tensor<1> { t.squeeze_dim(0) };
        Dictionary {
            w_enc: f("W_enc", self.w_enc.clone()),
            b_enc: row(f("b_enc", self.b_enc.clone().unsqueeze())),
            w_dec: vec![f("W_dec", self.decoder().clone())],
            b_dec: row(f("b_dec", self.b_dec.clone().unsqueeze())),
            threshold: self.threshold.clone().map(|t| row(f("threshold", t.unsqueeze()))),
            w_skip: self.w_skip.clone().map(|t| f("W_skip", t)),
            rule: self.rule,
            subtract_b_dec: self.subtract_b_dec,
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
