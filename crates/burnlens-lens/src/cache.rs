//! Activation caches and interventions on top of the model's hook points.
//!
//! ```ignore
//! let cache = run_with_cache(&model, &ids, |p| matches!(p, HookPoint::Attn(_, AttnHook::Pattern)));
//! let pattern = cache.pattern(0);                  // [head, query, key], row-major
//! // Zero-ablate head 3 of layer 1 and read the logits:
//! let mut hooks = ablate_heads(Hooks::none(), &[(1, 3)], Ablation::Zero);
//! let logits = model.forward_hooked(model.ids_tensor(&ids), &mut hooks);
//! ```

use std::collections::BTreeMap;

use burn::tensor::{Tensor, TensorData};
use burnlens_model::{Activation, AttnHook, HookPoint, Hooks, Transformer};

/// Activations of one forward pass by hook point, batch dimension kept.
pub struct ActivationCache {
    pub activations: BTreeMap<HookPoint, Activation>,
    pub logits: Tensor<3>,
}

impl ActivationCache {
    /// The activation TransformerLens calls `name`, if it was cached.
    pub fn get(&self, name: &str) -> Option<&Activation> {
        HookPoint::parse(name).and_then(|p| self.activations.get(&p))
    }

    /// The activation at hook point `p`, if it was cached.
    pub fn at(&self, p: HookPoint) -> Option<&Activation> {
        self.activations.get(&p)
    }

    /// `blocks.{layer}.attn.hook_pattern` of the first sequence, `[head, query, key]` flattened.
    pub fn pattern(&self, layer: usize) -> Vec<f32> {
        let point = HookPoint::Attn(layer, AttnHook::Pattern);
        let p = self.at(point).unwrap_or_else(|| panic!("`{point}` was not cached"));
        let [_, h, q, k] = <[usize; 4]>::try_from(p.dims()).expect("rank 4");
        let v = p.to_vec();
        v[..h * q * k].to_vec()
    }
}

/// Run `ids` and keep the activations at the points `filter` accepts.
pub fn run_with_cache(model: &Transformer, ids: &[i64], filter: impl Fn(HookPoint) -> bool) -> ActivationCache {
    let mut hooks = Hooks::capture(filter);
    let logits = model.forward_hooked(model.ids_tensor(ids), &mut hooks);
    ActivationCache { activations: hooks.take_cache(), logits }
}

/// How to remove a head's contribution.
#[derive(Debug, Clone)]
pub enum Ablation {
    /// Its `z` (the per-head attention output before `W_O`) becomes zero.
    Zero,
    /// Its `z` becomes its mean over batch and positions in `reference`, a cache of the same
    /// model holding `blocks.{l}.attn.hook_z`.
    Mean(BTreeMap<HookPoint, Activation>),
}

/// Add head ablations to `hooks`: each `(layer, head)` has its `hook_z` replaced.
pub fn ablate_heads<'a>(hooks: Hooks<'a>, heads: &[(usize, usize)], how: Ablation) -> Hooks<'a> {
    let heads = heads.to_vec();
    let layers: Vec<usize> = heads.iter().map(|&(l, _)| l).collect();
    hooks.with_edit(
        move |p| matches!(p, HookPoint::Attn(l, AttnHook::Z) if layers.contains(&l)),
        move |point, act| {
            let z = act.rank4().expect("hook_z is rank 4"); // [batch, pos, head, d_head]
            let [b, t, h, dh] = z.dims();
            let device = z.device();
            let layer = point.layer().expect("a hook_z of a block");
            let mut keep = vec![1.0f32; h];
            for &(l, head) in &heads {
                if l == layer {
                    keep[head] = 0.0;
                }
            }
            let keep_t = Tensor::<4>::from_data(TensorData::new(keep.clone(), [1, 1, h, 1]), &device);
            let kept = z * keep_t.clone();
            let replaced = match &how {
                Ablation::Zero => kept,
                Ablation::Mean(reference) => {
                    let r = reference.get(&point).and_then(|a| a.rank4()).unwrap_or_else(|| panic!("mean ablation needs `{point}` in the reference cache"));
                    let [rb, rt, _, _] = r.dims();
                    let mean = r.sum_dim(0).sum_dim(1) / (rb * rt) as f64; // [1, 1, h, dh]
                    let drop = keep_t.neg() + 1.0;
                    kept + (mean * drop).expand([b, t, h, dh])
                }
            };
            burnlens_model::Activation::Rank4(replaced)
        },
    )
}

/// Add a patch to `hooks`: the activation at `target` is replaced by `source` (same shape),
/// e.g. the same activation from a run on another prompt (activation patching).
pub fn patch<'a>(hooks: Hooks<'a>, target: HookPoint, source: Activation) -> Hooks<'a> {
    hooks.with_edit(move |p| p == target, move |_, _| source.clone())
}
