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
    /// parameters. The clipping factor is read back on the CPU ([`clip_scale`]) and stays on
    /// the device on a GPU ([`clip_factor`]: no wait in the step), where each parameter's
    /// step is one launch ([`burnlens_model::gpu::adam_step`], the composed step's operations
    /// in its order); elsewhere [`composed_step`].
    pub fn step(&mut self, params: &Dictionary, g: &Dictionary, lr: f64) -> Dictionary {
        let grads = g.named();
        let on_gpu = grads.first().is_some_and(|(_, t)| !burnlens_model::backend::is_host(&t.device()));
        let clip = on_gpu.then(|| clip_factor(&grads));
        let scale = if on_gpu { 1.0 } else { clip_scale(g) };
        self.t += 1;
        let (b1, b2) = (self.beta1, self.beta2);
        let k = Coefficients { b1, b2, bc1: 1.0 - b1.powi(self.t as i32), bc2_sqrt: (1.0 - b2.powi(self.t as i32)).sqrt(), lr };
        let (m, v) = (self.m.named(), self.v.named());
        let mut moments = Vec::with_capacity(grads.len());
        let mut i = 0;
        let out = params.map(|_, p| {
            let (m, v, g) = (m[i].1.clone(), v[i].1.clone(), grads[i].1.clone());
            let stepped = match &clip {
                Some(clip) => gpu::adam_step(p.clone(), m.clone(), v.clone(), g.clone(), Some(clip.clone()), k.rule())
                    .unwrap_or_else(|| composed_step(p, m, v, g * clip.clone().unsqueeze::<2>(), &k)),
                None => composed_step(p, m, v, if scale < 1.0 { g * scale } else { g }, &k),
            };
            moments.push((stepped.1, stepped.2));
            i += 1;
            stepped.0
        });
        let mut it = moments.iter();
        self.m = self.m.map(|_, _| it.next().expect("one step per parameter").0.clone());
        let mut it = moments.iter();
        self.v = self.v.map(|_, _| it.next().expect("one step per parameter").1.clone());
        out
    }
}

/// What a step's arithmetic reads besides the tensors.
struct Coefficients {
    b1: f64,
    b2: f64,
    /// `1 - β1^t` and `√(1 - β2^t)`.
    bc1: f64,
    bc2_sqrt: f64,
    lr: f64,
}

impl Coefficients {
    /// The GPU kernel's rule: the same coefficients, rounded to f32 as Burn rounds a scalar.
    fn rule(&self) -> AdamRule {
        AdamRule::Torch {
            one_minus_beta1: (1.0 - self.b1) as f32,
            beta2: self.b2 as f32,
            one_minus_beta2: (1.0 - self.b2) as f32,
            correction2_sqrt: self.bc2_sqrt as f32,
            epsilon: EPS as f32,
            step_size: (self.lr / self.bc1) as f32,
        }
    }
}

/// One parameter's step composed of tensor operations, as torch's `Adam` takes it with the
/// gradient `g` already clipped: the new `(p, m, v)`.
fn composed_step(p: Tensor<2>, m: Tensor<2>, v: Tensor<2>, g: Tensor<2>, k: &Coefficients) -> (Tensor<2>, Tensor<2>, Tensor<2>) {
    let m = m.clone() + (g.clone() - m) * (1.0 - k.b1);
    let v = v * k.b2 + g.clone() * g * (1.0 - k.b2);
    let denom = v.clone().sqrt() / k.bc2_sqrt + EPS;
    (p - m.clone() / denom * (k.lr / k.bc1), m, v)
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
