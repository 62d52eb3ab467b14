//! The optimizer pieces nanoGPT uses: AdamW without weight decay on biases, LayerNorm and
//! embeddings; global-norm gradient clipping as `torch.nn.utils.clip_grad_norm_`; linear
//! warm-up then cosine decay to a floor.

use burn::module::{Module, ModuleVisitor, Param, ParamGroup, ParamId};
use burn::optim::{AdamWState, AdaptiveMomentumState, GradientsParams, LearningRate, ModuleOptimizer, Optimizer};
use burn::tensor::{Device, Tensor};
use burnlens_model::kernels::adamw::{AdamWStep, adamw_first_step, adamw_step};
use burnlens_model::kernels::{self, sum_squares};

use crate::config::TrainingSection;

/// Parameters that are never weight-decayed: biases, LayerNorm gains, embeddings.
pub const NO_DECAY: &str = r"(\.bias$|^ln_final\.|\.ln[12]\.|^embed\.|^pos_embed\.)";

/// AdamW with PyTorch's epsilon, decaying only the matrices of the projections.
pub fn optimizer(t: &TrainingSection) -> ModuleOptimizer {
    let adamw = |wd: f64| FusedAdamW { beta_1: t.beta1 as f32, beta_2: t.beta2 as f32, epsilon: 1e-8, weight_decay: wd as f32 };
    let no_decay = ParamGroup::from_regex(NO_DECAY).expect("valid regex");
    ModuleOptimizer::from(adamw(t.weight_decay)).with_group(no_decay, adamw(0.0), None)
}

/// Burn's `AdamW` (the same state, so the same checkpoints) with each parameter's step, its
/// moments and its update, one pass over memory (`burnlens_model::kernels::adamw`) instead
/// of a fresh tensor per operation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FusedAdamW {
    pub beta_1: f32,
    pub beta_2: f32,
    pub epsilon: f32,
    pub weight_decay: f32,
}

impl Optimizer for FusedAdamW {
    type State<const D: usize> = AdamWState<D>;

    fn step<const D: usize>(&self, lr: LearningRate, tensor: Tensor<D>, grad: Tensor<D>, state: Option<AdamWState<D>>) -> (Tensor<D>, Option<AdamWState<D>>) {
        // Burn's first step, moments from the gradient alone, is a step from zero moments.
        let (moments, time) = match state {
            Some(s) => (Some((s.momentum.moment_1, s.momentum.moment_2)), s.momentum.time + 1),
            None => (None, 1),
        };
        let t = time as i32;
        let step = AdamWStep {
            beta_1: self.beta_1,
            beta_2: self.beta_2,
            lr,
            decay_rate: lr * self.weight_decay as f64,
            epsilon: self.epsilon,
            correction_1: 1.0 - self.beta_1.powi(t),
            correction_2: 1.0 - self.beta_2.powi(t),
        };
        let (updated, m, v) = match moments {
            Some((m, v)) => adamw_step(tensor, m, v, grad, step),
            None => adamw_first_step(tensor, grad, step),
        };
        (updated, Some(AdamWState::new(AdaptiveMomentumState::new(time, m, v))))
    }

    fn to_device<const D: usize>(state: AdamWState<D>, device: &Device) -> AdamWState<D> {
        AdamWState::new(state.momentum.to_device(device))
    }
}

/// Learning rate at `step` (0-based): linear warm-up, cosine decay to `min_lr` at
/// `lr_decay_steps`, then `min_lr` (nanoGPT's `get_lr`).
pub fn learning_rate(t: &TrainingSection, step: usize) -> f64 {
    let decay = t.lr_decay_steps.unwrap_or(t.steps);
    if step < t.warmup_steps {
        return t.learning_rate * (step + 1) as f64 / (t.warmup_steps + 1) as f64;
    }
    if step > decay || decay <= t.warmup_steps {
        return t.min_lr;
    }
    let ratio = (step - t.warmup_steps) as f64 / (decay - t.warmup_steps) as f64;
    let coeff = 0.5 * (1.0 + (std::f64::consts::PI * ratio).cos());
    t.min_lr + coeff * (t.learning_rate - t.min_lr)
}

/// Scale all gradients together so their global L2 norm is at most `max_norm` (as
/// `clip_grad_norm_`: multiply by `max_norm / (norm + 1e-6)` when that is below one).
/// Returns the norm before clipping. `max_norm <= 0` only measures.
pub fn clip_global_norm<M: Module>(model: &M, grads: &mut GradientsParams, max_norm: f64) -> f64 {
    let Some(total) = squared_norm(model, grads) else { return 0.0 };
    let norm = norm_of(total.into_scalar::<f32>());
    clip_to_norm(model, grads, norm, max_norm);
    norm
}

/// The gradients' global squared L2 norm, summed on their device (one read of each
/// gradient, nothing read back); `None` without gradients.
pub fn squared_norm<M: Module>(model: &M, grads: &GradientsParams) -> Option<Tensor<1>> {
    let mut total: Option<Tensor<1>> = None;
    for &(id, rank) in &float_params(model) {
        let sq = match rank {
            1 => grads.get::<1>(id).map(sum_squares),
            2 => grads.get::<2>(id).map(sum_squares),
            r => panic!("unexpected parameter rank {r}"),
        };
        if let Some(sq) = sq {
            total = Some(match total {
                Some(t) => t + sq,
                None => sq,
            });
        }
    }
    total
}

/// The norm from [`squared_norm`]'s value read back.
pub fn norm_of(squared: f32) -> f64 {
    squared.sqrt() as f64
}

/// [`clip_global_norm`] with the gradients' `norm` already known.
pub fn clip_to_norm<M: Module>(model: &M, grads: &mut GradientsParams, norm: f64, max_norm: f64) {
    if max_norm > 0.0 && norm.is_finite() {
        let coef = max_norm / (norm + 1e-6);
        if coef < 1.0 {
            for &(id, rank) in &float_params(model) {
                match rank {
                    1 => scale::<1>(grads, id, coef),
                    _ => scale::<2>(grads, id, coef),
                }
            }
        }
    }
}

/// Every float parameter's id and rank (1 or 2), in the module's order.
pub(crate) fn float_params<M: Module>(model: &M) -> Vec<(ParamId, usize)> {
    struct Ids(Vec<(ParamId, usize)>);
    impl ModuleVisitor for Ids {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            self.0.push((param.id, D));
        }
    }
    let mut ids = Ids(Vec::new());
    model.visit(&mut ids);
    ids.0
}

fn scale<const D: usize>(grads: &mut GradientsParams, id: ParamId, coef: f64) {
    if let Some(g) = grads.remove::<D>(id) {
        grads.register(id, kernels::scale(g, coef));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_warms_up_then_decays_to_the_floor() {
        let t = TrainingSection { learning_rate: 1e-3, min_lr: 1e-4, warmup_steps: 10, steps: 110, ..Default::default() };
        assert!((learning_rate(&t, 0) - 1e-3 / 11.0).abs() < 1e-12);
        assert!((learning_rate(&t, 10) - 1e-3).abs() < 1e-12);
        assert!((learning_rate(&t, 60) - 5.5e-4).abs() < 1e-9, "{}", learning_rate(&t, 60));
        assert!((learning_rate(&t, 110) - 1e-4).abs() < 1e-12);
        assert_eq!(learning_rate(&t, 500), 1e-4);
    }

    #[test]
    fn no_decay_group_matches_biases_norms_and_embeddings_only() {
        let re = regex_lite(NO_DECAY);
        for n in [
            "embed.weight",
            "pos_embed.weight",
            "blocks.0.ln1.weight",
            "blocks.3.ln2.bias",
            "ln_final.weight",
            "blocks.1.attn.qkv.bias",
            "blocks.0.mlp.fc_out.bias",
        ] {
            assert!(re(n), "{n} should not be decayed");
        }
        for n in ["blocks.0.attn.qkv.weight", "blocks.0.attn.out.weight", "blocks.2.mlp.fc_in.weight"] {
            assert!(!re(n), "{n} should be decayed");
        }
    }

    /// The fused AdamW against Burn's over several steps, with and without weight decay:
    /// the same parameters and moments to 1e-6 relative.
    #[test]
    fn fused_adamw_follows_burns_adamw() {
        use burn::optim::AdamWConfig;
        use burn::tensor::Distribution;
        let device = Device::flex();
        for wd in [0.0f32, 0.1] {
            let burns = AdamWConfig::new().with_beta_1(0.9).with_beta_2(0.99).with_epsilon(1e-8).with_weight_decay(wd).build();
            let fused = FusedAdamW { beta_1: 0.9, beta_2: 0.99, epsilon: 1e-8, weight_decay: wd };
            let start = Tensor::<2>::random([67, 129], Distribution::Normal(0.0, 1.0), &device);
            let (mut a, mut b) = (start.clone(), start);
            let (mut sa, mut sb) = (None, None);
            for step in 0..5 {
                let g = Tensor::<2>::random([67, 129], Distribution::Normal(0.0, 0.1 * (step + 1) as f64), &device);
                (a, sa) = burns.step(1e-3, a, g.clone(), sa);
                (b, sb) = fused.step(1e-3, b, g, sb);
                let close = |x: &Tensor<2>, y: &Tensor<2>, what: &str| {
                    let (x, y) = (x.to_data().try_into_vec_as::<f32>().unwrap(), y.to_data().try_into_vec_as::<f32>().unwrap());
                    let scale = y.iter().fold(0f32, |m, v| m.max(v.abs()));
                    let diff = x.iter().zip(&y).fold(0f32, |m, (p, q)| m.max((p - q).abs()));
                    assert!(diff <= 1e-6 * scale, "wd {wd}, step {step}, {what}: {diff} of {scale}");
                };
                close(&b, &a, "parameters");
                let (ma, mb) = (&sa.as_ref().unwrap().momentum, &sb.as_ref().unwrap().momentum);
                close(&mb.moment_1, &ma.moment_1, "first moment");
                close(&mb.moment_2, &ma.moment_2, "second moment");
                assert_eq!(mb.time, ma.time);
            }
        }
    }

    fn regex_lite(p: &str) -> impl Fn(&str) -> bool {
        let group = ParamGroup::from_regex(p).unwrap();
        move |name| group.matches(&ParamId::new(), Some(name))
    }
}
