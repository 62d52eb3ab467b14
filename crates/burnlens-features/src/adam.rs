//! Adam as torch's `optim.Adam` computes it (no weight decay, eps 1e-8), after the global
//! gradient-norm clipping SAELens applies to every step (`clip_grad_norm_(…, 1.0)`). State is
//! one pair of moments per parameter, shaped like the dictionary.

use burn::tensor::Tensor;

use burnlens_lens::dictionary::Dictionary;
use burnlens_model::gpu::{self, AdamRule};

use crate::params::Trainable;

/// torch's default.
pub const EPS: f64 = 1e-8;
/// SAELens's `clip_grad_norm_` bound.
pub const MAX_GRAD_NORM: f64 = 1.0;

/// The moments and the step count.
#[derive(Debug, Clone)]
pub struct Adam {
    pub beta1: f64,
    pub beta2: f64,
    /// First and second moments, zero before the first step.
    pub m: Dictionary,
    pub v: Dictionary,
    /// Steps taken.
    pub t: u64,
}

impl Adam {
    pub fn new(like: &Dictionary, beta1: f64, beta2: f64) -> Self {
        let zeros = like.map(|_, p| p.zeros_like());
        Adam { beta1, beta2, m: zeros.clone(), v: zeros, t: 0 }
    }

    /// One step at learning rate `lr` with gradients `g` (clipped first); returns the new
    /// parameters. On a GPU the clipping factor stays on the device and each parameter's
    /// step is one launch ([`Adam::step_on_device`]); on the CPU, composed as below.
    pub fn step(&mut self, params: &Dictionary, g: &Dictionary, lr: f64) -> Dictionary {
        let on_gpu = g.named().first().is_some_and(|(_, t)| !burnlens_model::backend::is_host(&t.device()));
        if on_gpu {
            return self.step_on_device(params, g, lr);
        }
        let scale = clip_scale(g);
        self.t += 1;
        let (b1, b2) = (self.beta1, self.beta2);
        let bc1 = 1.0 - b1.powi(self.t as i32);
        let bc2_sqrt = (1.0 - b2.powi(self.t as i32)).sqrt();
        let grads: Vec<Tensor<2>> = g.named().into_iter().map(|(_, t)| if scale < 1.0 { t * scale } else { t }).collect();
        let mut it = grads.iter();
        self.m = self.m.map(|_, m| {
            let g = it.next().expect("one gradient per parameter").clone();
            m.clone() + (g - m) * (1.0 - b1)
        });
        let mut it = grads.iter();
        self.v = self.v.map(|_, v| {
            let g = it.next().expect("one gradient per parameter").clone();
            v * b2 + g.clone() * g * (1.0 - b2)
        });
        let (m, v) = (self.m.named(), self.v.named());
        let mut i = 0;
        params.map(|_, p| {
            let denom = v[i].1.clone().sqrt() / bc2_sqrt + EPS;
            let out = p - m[i].1.clone() / denom * (lr / bc1);
            i += 1;
            out
        })
    }

    /// [`Adam::step`] on a GPU: the clipping factor computed there ([`clip_factor`], no
    /// read-back), and each parameter's moments and value in one launch
    /// ([`burnlens_model::gpu::adam_step`]: the composed step's operations, in its order),
    /// or composed with the same factor where that kernel does not run (LibTorch's CUDA).
    fn step_on_device(&mut self, params: &Dictionary, g: &Dictionary, lr: f64) -> Dictionary {
        let grads = g.named();
        let clip = clip_factor(&grads);
        self.t += 1;
        let (b1, b2) = (self.beta1, self.beta2);
        let bc1 = 1.0 - b1.powi(self.t as i32);
        let bc2_sqrt = (1.0 - b2.powi(self.t as i32)).sqrt();
        let rule = AdamRule::Torch {
            one_minus_beta1: (1.0 - b1) as f32,
            beta2: b2 as f32,
            one_minus_beta2: (1.0 - b2) as f32,
            correction2_sqrt: bc2_sqrt as f32,
            epsilon: EPS as f32,
            step_size: (lr / bc1) as f32,
        };
        let (m, v) = (self.m.named(), self.v.named());
        let mut moments = Vec::with_capacity(grads.len());
        let mut i = 0;
        let out = params.map(|_, p| {
            let (m, v, g) = (m[i].1.clone(), v[i].1.clone(), grads[i].1.clone());
            let (p, m, v) = match gpu::adam_step(p.clone(), m.clone(), v.clone(), g.clone(), Some(clip.clone()), rule) {
                Some(stepped) => stepped,
                None => {
                    let g = g * clip.clone().unsqueeze::<2>();
                    let m = m.clone() + (g.clone() - m) * (1.0 - b1);
                    let v = v * b2 + g.clone() * g * (1.0 - b2);
                    (p - m.clone() / (v.clone().sqrt() / bc2_sqrt + EPS) * (lr / bc1), m, v)
                }
            };
            moments.push((m, v));
            i += 1;
            p
        });
        let mut it = moments.iter();
        self.m = self.m.map(|_, _| it.next().expect("one step per parameter").0.clone());
        let mut it = moments.iter();
        self.v = self.v.map(|_, _| it.next().expect("one step per parameter").1.clone());
        out
    }
}

/// torch's `clip_grad_norm_(params, 1.0)` factor as [`clip_scale`] computes it, left on the
/// gradients' device as a one-element tensor: each parameter's norm, the norm of those,
/// `1 / (‖g‖ + 1e-6)` at most 1 (what torch multiplies by, 1 included).
pub fn clip_factor(grads: &[(&'static str, Tensor<2>)]) -> Tensor<1> {
    let norms: Vec<Tensor<1>> = grads.iter().map(|(_, t)| t.clone().square().sum().sqrt()).collect();
    let total = Tensor::cat(norms, 0).square().sum().sqrt();
    (total.ones_like() * MAX_GRAD_NORM / (total + 1e-6)).clamp_max(1.0)
}

/// torch's `clip_grad_norm_(params, 1.0)` factor: `1 / (‖g‖ + 1e-6)` over all gradients at
/// once, or 1 when that is larger (each parameter's norm, then the norm of those, in f32).
pub fn clip_scale(g: &Dictionary) -> f64 {
    let norms: Vec<f32> = g.named().into_iter().map(|(_, t)| t.square().sum().sqrt().into_scalar::<f32>()).collect();
    let total = norms.iter().map(|n| n * n).sum::<f32>().sqrt();
    let coef = MAX_GRAD_NORM as f32 / (total + 1e-6);
    coef.min(1.0) as f64
}
