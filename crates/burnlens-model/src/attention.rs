//! Masked multi-head self-attention (grouped keys and values, rotary, QK norms, local windows),
//! the paths that compute it, its per-head weights, and what a layer reads besides its weights.

use crate::matmul::matmul;
use burn::module::Module;
use burn::nn::{Dropout, Linear};
use burn::tensor::{Bool, Device, Tensor};

use crate::config::{AttentionSpan, QkNorm};
use crate::hook_point::{AttnHook, HookPoint, NormSite};
use crate::hooks::Hooks;
use crate::kernels::{self, AttentionMask, linear};
use crate::kv_cache::KvCache;
use crate::norm::Norm;
use crate::rotary::{RotaryAngles, apply_rotary};
use crate::weights::f32_val;

/// Fill value for masked attention scores. Finite (as in Hugging Face) so that a row with
/// every key masked, such as a left-padding query, gives a uniform row instead of NaN.
pub const MASKED_SCORE: f32 = f32::MIN;

/// Masked multi-head self-attention, with grouped keys and values when `n_kv_heads <
/// n_heads`.
#[derive(Module, Debug)]
pub struct Attention {
    /// Fused Q, K, V projection: weight `[d_model, (n_heads + 2 n_kv_heads) d_head]`,
    /// optional bias.
    pub qkv: Linear,
    /// Output projection `W_O`: weight `[n_heads * d_head, d_model]`, optional bias `[d_model]`.
    pub out: Linear,
    pub attn_dropout: Dropout,
    /// QK-norm of the queries and keys (before rotary), if the model has one.
    pub q_norm: Option<Norm>,
    pub k_norm: Option<Norm>,
    #[module(skip)]
    pub qk_norm: Option<QkNorm>,
    /// Soft-capping of the scores: `c tanh(s / c)`.
    #[module(skip)]
    pub softcap: Option<f64>,
    #[module(skip)]
    pub n_heads: usize,
    #[module(skip)]
    pub n_kv_heads: usize,
    #[module(skip)]
    pub d_head: usize,
    /// The factor the raw scores are multiplied by.
    #[module(skip)]
    pub scale: f64,
    #[module(skip)]
    pub span: AttentionSpan,
}

/// The ways [`Attention::forward`] computes attention ([`Attention::path`] chooses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AttentionPath {
    /// burnlens's fused kernel (flex): softmax(q kᵀ) v without the pattern, keys of a local
    /// window only.
    Kernel { window: Option<usize> },
    /// burnlens's one-launch attention of a few new queries over the cache on a GPU
    /// (decoding): `z` without the scores or the pattern, keys of a local window only.
    Decode { window: Option<usize> },
    /// A prompt's causal attention on a GPU in one launch, f32 arithmetic (cubek's flash
    /// attention, unit routine); `padded`: the layer's mask hides padding keys too.
    Flash { padded: bool },
    /// The backend's own fused attention, causal or over every key.
    Backend { causal: bool },
    /// Scores, mask, pattern and `z` written out, with their hook points.
    Explicit,
}

impl Attention {
    /// One attention layer on `input` (see [`AttentionInput`]): returns `[batch, pos,
    /// d_model]`. With `fused` and its attention not hooked, a fused attention computes
    /// softmax(q kᵀ) v without materialising the pattern: burnlens's kernel on flex
    /// (inference and training), the backend's own elsewhere (inference).
    pub fn forward(&self, input: AttentionInput, hooks: &mut Hooks) -> Tensor<3> {
        let AttentionInput { x, qk_input, layer: LayerInput { rotary, mask, blind, cache, layer, fused } } = input;
        let [b, t, _] = x.dims();
        let qkv = self.project_qkv(x, qk_input);
        // No cache, nothing between the projection and the kernel: the kernel reads the
        // heads of the projection itself (in training, one gradient for it, written once).
        if cache.is_none()
            && rotary.is_none()
            && self.qk_norm.is_none()
            && let AttentionPath::Kernel { window } = self.path(fused, hooks, layer, &qkv.device(), t, t)
        {
            let heads = qkv.reshape([b, t, self.n_heads + 2 * self.n_kv_heads, self.d_head]);
            let z = kernels::attention::attention_qkv(heads, [self.n_heads, self.n_kv_heads], self.scale, AttentionMask { q_offset: 0, window });
            return self.project_out(z.swap_dims(1, 2).reshape([b, t, self.n_heads * self.d_head]));
        }
        let (q, k, v) = self.split_heads(qkv);
        let q = hooks.at(HookPoint::Attn(layer, AttnHook::Q), q);
        let k = hooks.at(HookPoint::Attn(layer, AttnHook::K), k);
        let v = hooks.at(HookPoint::Attn(layer, AttnHook::V), v);
        let (q, k) = self.position(q, k, rotary, layer, hooks);

        // [batch, head, pos, d_head]
        let (q, k, v) = (q.swap_dims(1, 2), k.swap_dims(1, 2), v.swap_dims(1, 2));
        let (k, v) = match cache {
            Some(cache) => cache.extend(layer, k, v),
            None => (k, v),
        };
        let s = k.dims()[2];
        let hd = self.n_heads * self.d_head;
        let path = self.path(fused, hooks, layer, &q.device(), t, s);
        if let AttentionPath::Decode { window } = path
            && let Some(z) = crate::gpu::decode_attention(q.clone(), k.clone(), v.clone(), self.scale as f32, s - t, window.unwrap_or(0))
        {
            return self.project_out(z.reshape([b, t, hd]));
        }
        let z = match path {
            AttentionPath::Kernel { window } => kernels::attention(q, k, v, self.scale, AttentionMask { q_offset: s - t, window }),
            AttentionPath::Flash { padded } => {
                let (k, v) = self.every_query_head(k, v);
                // Padding keys or a local window's hidden by the layer's mask (global attention
                // without padding: the causal rule alone).
                let hidden = (padded || self.span != AttentionSpan::Global).then(|| mask.clone());
                match crate::gpu::flash_attention(q.clone(), k.clone(), v.clone(), self.scale as f32, hidden) {
                    // `[batch, pos, heads, d_head]`: the output projection's rows already.
                    Some(z) => {
                        let z = if padded { blind_rows_uniform(z, blind.unwrap_or_else(|| blind_queries(&mask)), &v) } else { z };
                        return self.project_out(z.reshape([b, t, hd]));
                    }
                    // Declined (the scale, the head width): written out under the same mask.
                    None => {
                        let rule = (!padded).then_some(AttentionMask { q_offset: 0, window: self.window() });
                        return self.attend_explicit(q, k, v, Masking { tensor: mask, rule }, layer, hooks);
                    }
                }
            }
            AttentionPath::Backend { causal } => {
                let (k, v) = self.every_query_head(k, v);
                // Burn's `Cube` backends take their flash kernels only at the default scale
                // (any scale named, even that one, runs their composed fallback).
                let default = (self.scale * (self.d_head as f64).sqrt() - 1.0).abs() < 1e-12;
                let scale = (!default).then_some(self.scale);
                let options = burn::tensor::ops::AttentionModuleOptions { scale, softcap: None, is_causal: causal };
                burn::tensor::module::attention(q, k, v, None, None, options)
            }
            // The one-launch kernel refused the shapes: written out.
            AttentionPath::Explicit | AttentionPath::Decode { .. } => {
                let (k, v) = self.every_query_head(k, v);
                // Without padding the mask is the span's rule, which a GPU applies as it reads.
                let rule = fused.then_some(AttentionMask { q_offset: s - t, window: self.window() });
                return self.attend_explicit(q, k, v, Masking { tensor: mask, rule }, layer, hooks);
            }
        };
        self.project_out(z.swap_dims(1, 2).reshape([b, t, hd]))
    }

    /// `qkv` `[batch, pos, (h + 2 hk) d_head]` as queries `[batch, pos, h, d_head]`, keys and
    /// values `[batch, pos, hk, d_head]`: views of it, not copies (the heads are split by a
    /// reshape of the whole projection first; narrowing first and reshaping then copied each
    /// part).
    fn split_heads(&self, qkv: Tensor<3>) -> (Tensor<4>, Tensor<4>, Tensor<4>) {
        let [b, t, _] = qkv.dims();
        let (h, hk, dh) = (self.n_heads, self.n_kv_heads, self.d_head);
        let heads = qkv.reshape([b, t, h + 2 * hk, dh]);
        let q = heads.clone().narrow(2, 0, h);
        let k = heads.clone().narrow(2, h, hk);
        let v = heads.narrow(2, h + hk, hk);
        (q, k, v)
    }

    /// Which way to compute attention of `t` new queries over `s` keys on `device`.
    ///
    /// - burnlens's fused kernel on flex (inference and training, grouped heads read in
    ///   place), when `unpadded` (no padding), the hooks do not have this layer write its
    ///   attention out ([`Hooks::writes_out`]), no dropout is live and there is no
    ///   soft-cap;
    /// - on a `Cube` GPU outside training, under the same conditions, burnlens's one-launch
    ///   attention for a few new queries over the cache (decoding), and with f32 products
    ///   (padding or not) a prompt's causal attention (a local window's or the padding's
    ///   mask read too) by cubek's flash kernel in f32;
    /// - another backend's own fused attention where no mask is needed (global attention
    ///   over the whole sequence is plain causal attention, and one new token sees every
    ///   cached key), outside training. Explicit masks take the explicit path: LibTorch's
    ///   fused attention read burnlens's boolean mask with the opposite meaning (measured on
    ///   tch: local-window fixtures off by 25 in the logits);
    /// - else written out, every hook point on the way.
    fn path(&self, unpadded: bool, hooks: &Hooks, layer: usize, device: &Device, t: usize, s: usize) -> AttentionPath {
        let unhooked = self.softcap.is_none() && !hooks.writes_out(AttnHook::ALL.iter().map(|&h| HookPoint::Attn(layer, h)));
        let fused = unpadded && unhooked;
        let dropout_live = self.attn_dropout.prob > 0.0 && device.is_autodiff();
        if fused && !dropout_live && kernels::runs_on(device) {
            return AttentionPath::Kernel { window: self.window() };
        }
        if fused && crate::gpu::decode_attention_on(device, t) {
            return AttentionPath::Decode { window: self.window() };
        }
        // f32 products asked for: cubek's flash attention on its f32 routine (with TF32 asked
        // for, Burn's own attention below chooses among all of cubek's).
        if unhooked && t == s && crate::gpu::flash_attention_on(device) && crate::matmul::exact_on(device) {
            return AttentionPath::Flash { padded: !unpadded };
        }
        let no_mask_needed = self.span == AttentionSpan::Global && (t == s || t == 1);
        // On a GPU whose products take the exact kernel, Burn's fused attention would multiply
        // in TF32 (its fallback composes Burn's own products).
        if fused && no_mask_needed && !device.is_autodiff() && !crate::matmul::exact_on(device) {
            return AttentionPath::Backend { causal: t == s && t > 1 };
        }
        AttentionPath::Explicit
    }

    /// The local window's length, `None` for global attention.
    fn window(&self) -> Option<usize> {
        match self.span {
            AttentionSpan::Global => None,
            AttentionSpan::Local(w) => Some(w),
        }
    }

    /// Keys and values `[batch, hk, pos, d_head]` repeated for every query head of their
    /// group (unchanged without grouped-query attention).
    fn every_query_head(&self, k: Tensor<4>, v: Tensor<4>) -> (Tensor<4>, Tensor<4>) {
        let (h, hk) = (self.n_heads, self.n_kv_heads);
        if hk == h {
            return (k, v);
        }
        (kernels::attention::repeat_heads(k, h / hk), kernels::attention::repeat_heads(v, h / hk))
    }

    /// `x W_QKV (+ b)`, `[batch, pos, (h + 2 hk) d_head]`; with `qk_input`, queries and keys
    /// read it and values read `x`.
    fn project_qkv(&self, x: Tensor<3>, qk_input: Option<Tensor<3>>) -> Tensor<3> {
        let (hk, dh) = (self.n_kv_heads, self.d_head);
        let qk_width = (self.n_heads + hk) * dh;
        match qk_input {
            None => linear(x, self.qkv.weight.val(), self.qkv.bias.as_ref().map(|b| b.val())),
            Some(qk_in) => {
                // Queries and keys see `qk_in`, values see `x`.
                let w = self.qkv.weight.val();
                let bias = self.qkv.bias.as_ref().map(|b| b.val());
                let qk_w = w.clone().narrow(1, 0, qk_width);
                let v_w = w.narrow(1, qk_width, hk * dh);
                let mut qk = linear(qk_in, qk_w, bias.clone().map(|b| b.narrow(0, 0, qk_width)));
                let v = linear(x, v_w, bias.map(|b| b.narrow(0, qk_width, hk * dh)));
                qk = Tensor::cat(vec![qk, v], 2);
                qk
            }
        }
    }

    /// Queries and keys `[batch, pos, heads, d_head]` normalised (QK-norm) and rotated
    /// (rotary), with their hook points.
    fn position(&self, q: Tensor<4>, k: Tensor<4>, rotary: Option<&RotaryAngles>, layer: usize, hooks: &mut Hooks) -> (Tensor<4>, Tensor<4>) {
        let [b, t, h, dh] = q.dims();
        let hk = k.dims()[2];
        let hd = h * dh;
        let (q, k) = match (&self.q_norm, &self.k_norm, self.qk_norm) {
            (Some(qn), Some(kn), Some(kind)) => {
                let (qn_name, kn_name) = (NormSite::QNorm(layer), NormSite::KNorm(layer));
                match kind {
                    QkNorm::PerHead => (qn.forward(q, hooks, qn_name), kn.forward(k, hooks, kn_name)),
                    QkNorm::Whole => (
                        qn.forward(q.reshape([b, t, hd]), hooks, qn_name).reshape([b, t, h, dh]),
                        kn.forward(k.reshape([b, t, hk * dh]), hooks, kn_name).reshape([b, t, hk, dh]),
                    ),
                }
            }
            _ => (q, k),
        };
        match rotary {
            Some(angles) => (
                hooks.at(HookPoint::Attn(layer, AttnHook::RotQ), apply_rotary(q, angles)),
                hooks.at(HookPoint::Attn(layer, AttnHook::RotK), apply_rotary(k, angles)),
            ),
            None => (q, k),
        }
    }

    /// Attention written out, every hook point on the way: scores (soft-capped), mask,
    /// pattern, `z`, per-head results if asked for, the output projection. `q`, `k`, `v`
    /// `[batch, head, pos, d_head]` with as many key heads as query heads.
    fn attend_explicit(&self, q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, masking: Masking, layer: usize, hooks: &mut Hooks) -> Tensor<3> {
        let [b, h, t, dh] = q.dims();
        let hd = h * dh;
        let pattern = self.pattern(matmul(q, k.swap_dims(2, 3)), masking, layer, hooks);
        let pattern = hooks.at(HookPoint::Attn(layer, AttnHook::Pattern), pattern);
        let pattern = self.attn_dropout.forward(pattern);

        let z = matmul(pattern, v).swap_dims(1, 2); // [batch, pos, head, d_head]
        let z = hooks.at(HookPoint::Attn(layer, AttnHook::Z), z);

        let result_point = HookPoint::Attn(layer, AttnHook::Result);
        if hooks.wants(result_point) {
            // Per-head writes into the residual stream, without b_O: [batch, pos, head, d_model].
            let w_o = f32_val(&self.out.weight);
            let d = w_o.dims()[1];
            let per_head = matmul(z.clone().swap_dims(1, 2), w_o.reshape([1, h, dh, d]).expand([b, h, dh, d]));
            let result = hooks.at(result_point, per_head.swap_dims(1, 2));
            let summed: Tensor<3> = result.sum_dim(2).reshape([b, t, d]);
            return match &self.out.bias {
                Some(bias) => summed + bias.val().reshape([1, 1, d]),
                None => summed,
            };
        }
        self.project_out(z.reshape([b, t, hd]))
    }

    /// The pattern from the raw scores `q kᵀ` `[batch, head, query, key]`: scaled,
    /// soft-capped, masked (the scores' hook point) and softmaxed. On a GPU, where the mask
    /// is a rule, the scale and the mask are applied as the softmax reads the scores
    /// ([`crate::gpu::attention_pattern`], one launch for three) unless the scores are hooked.
    fn pattern(&self, raw: Tensor<4>, masking: Masking, layer: usize, hooks: &mut Hooks) -> Tensor<4> {
        let scores_point = HookPoint::Attn(layer, AttnHook::AttnScores);
        let one_launch = masking.rule.filter(|_| self.softcap.is_none() && !hooks.writes_out([scores_point]));
        if let Some(rule) = one_launch
            && let Some(pattern) = crate::gpu::attention_pattern(raw.clone(), self.scale as f32, rule.q_offset, rule.window.unwrap_or(0))
        {
            return pattern;
        }
        let [b, h, t, s] = raw.dims();
        let scores = raw * self.scale;
        let scores = match self.softcap {
            Some(c) => (scores / c).tanh() * c,
            None => scores,
        };
        let scores = scores.mask_fill(masking.tensor.expand([b, h, t, s]), MASKED_SCORE);
        kernels::softmax(hooks.at(scores_point, scores))
    }

    /// `z W_O (+ b_O)`: `[batch, pos, n_heads * d_head]` -> `[batch, pos, d_model]`.
    fn project_out(&self, z: Tensor<3>) -> Tensor<3> {
        linear(z, self.out.weight.val(), self.out.bias.as_ref().map(|b| b.val()))
    }
}

/// `z: [batch, pos, heads, d_head]` with the rows of queries that see no key (`blind`,
/// `[batch or 1, pos, 1, 1]`: padding before a row's first real token) as the written-out
/// path gives them — every score [`MASKED_SCORE`], so an equal weight on every key: the
/// values' mean — where a flash kernel leaves them undefined. `v: [batch, heads, keys,
/// d_head]`.
fn blind_rows_uniform(z: Tensor<4>, blind: Tensor<4, Bool>, v: &Tensor<4>) -> Tensor<4> {
    let [b, t, h, dh] = z.dims();
    let mean = v.clone().mean_dim(2).swap_dims(1, 2).expand([b, t, h, dh]);
    z.mask_where(blind.expand([b, t, h, dh]), mean)
}

/// The queries `mask` (`[batch or 1, 1, pos, keys]`) hides every key from, `[batch or 1, pos,
/// 1, 1]` (one reduction on the device; the model's pass lists them on the host instead).
fn blind_queries(mask: &Tensor<4, Bool>) -> Tensor<4, Bool> {
    let [b, _, t, _] = mask.dims();
    mask.clone().all_dim(3).reshape([b, t, 1, 1])
}

/// The keys each query may not see: the mask's tensor `[batch or 1, 1, query, key]`, and
/// where it is a causal (or local-window) rule with no padding, that rule.
struct Masking {
    tensor: Tensor<4, Bool>,
    rule: Option<AttentionMask>,
}

/// What one layer gets from the model's forward pass besides the residual stream.
pub struct LayerInput<'a> {
    /// The angles of the new tokens' positions, for rotary models.
    pub rotary: Option<&'a RotaryAngles>,
    /// `[batch or 1, 1, query, key]`, true where a key is hidden.
    pub mask: Tensor<4, Bool>,
    /// `[batch or 1, query, 1, 1]`, true for the queries `mask` hides every key from
    /// (padding before a row's first real token), where the caller has them: a GPU's flash
    /// kernel leaves those rows undefined and they are put back as the written-out path gives
    /// them. `None`: found from `mask` where needed (one more reduction a layer).
    pub blind: Option<Tensor<4, Bool>>,
    /// The KV cache to extend and attend over (decoding), if any.
    pub cache: Option<&'a mut KvCache>,
    /// The layer's index: its hook names and its slot in the cache.
    pub layer: usize,
    /// Whether a fused attention may run (no padding); a layer the hooks have write its
    /// attention out still takes the explicit path.
    pub fused: bool,
}

impl<'a> LayerInput<'a> {
    /// Layer `layer` under `mask`: no rotary, no cache, not fused.
    pub fn new(mask: Tensor<4, Bool>, layer: usize) -> Self {
        Self { rotary: None, mask, blind: None, cache: None, layer, fused: false }
    }
}

/// What an attention layer reads besides its weights (as burn-nn's `MhaInput`).
pub struct AttentionInput<'a> {
    /// `[batch, pos, d_model]`: the normalized residual stream; values always read it.
    pub x: Tensor<3>,
    /// What queries and keys read instead of `x`, if anything (shortformer models pass
    /// `x + pos_embed`).
    pub qk_input: Option<Tensor<3>>,
    pub layer: LayerInput<'a>,
}
