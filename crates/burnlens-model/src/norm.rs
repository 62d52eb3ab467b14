//! LayerNorm and RMSNorm over the last dimension, with their hook points.

use burn::module::{Module, Param};
use burn::tensor::Tensor;

use crate::config::NormKind;
use crate::hook_point::{HookPoint, NormHook, NormSite};
use crate::hooks::{Hookable, Hooks};
use crate::kernels;

/// LayerNorm (`(x - mean) / sqrt(var + eps) * w + b`, biased variance) or RMSNorm
/// (`x / sqrt(mean(x²) + eps) * w`) over the last dimension.
#[derive(Module, Debug)]
pub struct Norm {
    /// `[d_model]`
    pub weight: Param<Tensor<1>>,
    /// `[d_model]`; `None` for RMSNorm.
    pub bias: Option<Param<Tensor<1>>>,
    #[module(skip)]
    pub eps: f64,
    #[module(skip)]
    pub kind: NormKind,
}

impl Norm {
    /// The norm's output from its `hook_normalized` value (which is before the affine map):
    /// times the gain, plus the bias for a LayerNorm.
    pub fn finish<const D: usize>(&self, normalized: Tensor<D>) -> Tensor<D> {
        let mut shape = [1usize; D];
        shape[D - 1] = self.weight.dims()[0];
        let out = normalized * self.weight.val().reshape(shape);
        match &self.bias {
            Some(b) => out + b.val().reshape(shape),
            None => out,
        }
    }

    /// `x: [batch, pos, d_model]`. Hook points `{site}.hook_scale` `[batch, pos, 1]` and
    /// `{site}.hook_normalized` `[batch, pos, d_model]` where TransformerLens (3.x) has them:
    /// the normalized value **before** the affine map (`(x - mean) / scale` for a
    /// LayerNorm, `x / scale` for an RMSNorm); the gain and bias apply to whatever the hook
    /// returns ([`finish`](Self::finish)).
    ///
    /// Any rank works (QK-norm normalizes `[batch, pos, head, d_head]`); the norm is over the
    /// last dimension.
    pub fn forward<const D: usize>(&self, x: Tensor<D>, hooks: &mut Hooks, site: NormSite) -> Tensor<D>
    where
        Tensor<D>: Hookable,
    {
        let bias = self.bias.as_ref().map(|b| b.val());
        if !hooks.writes_out(NormHook::ALL.iter().map(|&h| HookPoint::Norm(site, h))) {
            // One fused pass (burnlens's kernel on flex, one launch on a GPU).
            return match self.kind {
                NormKind::LayerNorm => kernels::layer_norm(x, self.weight.val(), bias.expect("LayerNorm has a bias"), self.eps),
                NormKind::RmsNorm => kernels::rms_norm(x, self.weight.val(), self.eps),
            };
        }
        let normalized = match self.kind {
            NormKind::LayerNorm => {
                let (var, mean) = x.clone().var_mean_bias(D - 1);
                let scale = hooks.at(HookPoint::Norm(site, NormHook::Scale), (var + self.eps).sqrt());
                (x - mean) / scale
            }
            NormKind::RmsNorm => {
                let scale = hooks.at(HookPoint::Norm(site, NormHook::Scale), (x.clone().square().mean_dim(D - 1) + self.eps).sqrt());
                x / scale
            }
        };
        self.finish(hooks.at(HookPoint::Norm(site, NormHook::Normalized), normalized))
    }
}
