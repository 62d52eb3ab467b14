//! Adam as torch's `optim.Adam` computes it (no weight decay, eps 1e-8), after the global
//! gradient-norm clipping SAELens applies to every step (`clip_grad_norm_(…, 1.0)`). State is
//! one pair of moments per parameter, shaped like the dictionary.

use burn::tensor::Tensor;

use burnlens_lens::dictionary::Dictionary;

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
    /// parameters.
    pub fn step(&mut self, params: &Dictionary, g: &Dictionary, lr: f64) -> Dictionary {
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
}

/// torch's `clip_grad_norm_(params, 1.0)` factor: `1 / (‖g‖ + 1e-6)` over all gradients at
/// once, or 1 when that is larger (each parameter's norm, then the norm of those, in f32).
pub fn clip_scale(g: &Dictionary) -> f64 {
    let norms: Vec<f32> = g.named().into_iter().map(|(_, t)| t.square().sum().sqrt().into_scalar::<f32>()).collect();
    let total = norms.iter().map(|n| n * n).sum::<f32>().sqrt();
    let coef = MAX_GRAD_NORM as f32 / (total + 1e-6);
    coef.min(1.0) as f64
}
