//! The canonical decoder-only transformer, top to bottom: norm, rotary embeddings,
//! attention, MLP, block, the whole model. GPT-2, GPT-Neo, GPT-NeoX (Pythia), GPT-J, the Llama
//! family, Qwen3, OLMo 2, Gemma 2/3 and Phi-3 are all this model with different
//! [`TransformerConfig`] settings.
//!
//! Weights right-multiply (`x @ W`), as in TransformerLens: a projection from `d_in` to
//! `d_out` stores `[d_in, d_out]`. The query, key and value projections are fused into one
//! `[d_model, (n_heads + 2 n_kv_heads) d_head]` matrix (columns: all of Q, then K, then V;
//! within each, head-major), so one matmul serves all three.

use burn::module::{Module, Param};
use burn::nn::{Dropout, DropoutConfig, Embedding, Initializer, Linear};
use burn::tensor::activation::{relu, sigmoid};
use burn::tensor::{Bool, DType, Device, Int, Tensor, TensorCreationOptions, TensorData};

use crate::config::{ActivationFn, AttentionSpan, MlpKind, NormKind, NormPlacement, Positional, QkNorm, RopeScaling, Rotary, TransformerConfig};
use crate::hook_point::{AttnHook, BlockHook, HookPoint, MlpHook, NormHook, NormSite};
use crate::hooks::Hookable;
use crate::error::ModelError;
use crate::hooks::Hooks;
use crate::kernels::{self, AttentionMask, linear};

/// Fill value for masked attention scores. Finite (as in Hugging Face) so that a row with
/// every key masked, such as a left-padding query, gives a uniform row instead of NaN.
pub const MASKED_SCORE: f32 = f32::MIN;

// ---------------------------------------------------------------------------------------
// Norm
// ---------------------------------------------------------------------------------------

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

/// The name the first implementation used (GPT-2's norms are LayerNorms); a [`Norm`] of
/// either kind.
pub type LayerNorm = Norm;

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
        if !hooks.is_active() {
            // One fused pass (burnlens's kernel on flex, composed ops elsewhere).
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

// ---------------------------------------------------------------------------------------
// Rotary position embeddings
// ---------------------------------------------------------------------------------------

/// `cos θ` and `sin θ` for every new token's position, `[batch, pos, dims / 2]` each,
/// computed once per forward pass and shared by every layer.
#[derive(Debug, Clone)]
pub struct RotaryAngles {
    pub cos: Tensor<3>,
    pub sin: Tensor<3>,
    /// Whether pairs are interleaved (GPT-J) rather than halves.
    pub interleaved: bool,
}

impl Rotary {
    /// The inverse frequencies `base^(-2i / dims)`, scaled as `scaling` says, computed in
    /// f32 the way Hugging Face computes them (so angles agree bit for bit at long positions).
    pub fn inv_freq(&self) -> Vec<f32> {
        let half = self.dims / 2;
        let base = self.base as f32;
        let mut inv: Vec<f32> = (0..half).map(|i| 1.0 / base.powf((2 * i) as f32 / self.dims as f32)).collect();
        match self.scaling {
            None => {}
            Some(RopeScaling::Linear { factor }) => inv.iter_mut().for_each(|f| *f /= factor as f32),
            Some(RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position }) => {
                let (factor, low, high, old) = (factor as f32, low_freq_factor as f32, high_freq_factor as f32, original_max_position as f32);
                let (low_wavelen, high_wavelen) = (old / low, old / high);
                for f in inv.iter_mut() {
                    let wavelen = 2.0 * std::f32::consts::PI / *f;
                    *f = if wavelen < high_wavelen {
                        *f
                    } else if wavelen > low_wavelen {
                        *f / factor
                    } else {
                        let smooth = (old / wavelen - low) / (high - low);
                        (1.0 - smooth) * *f / factor + smooth * *f
                    };
                }
            }
        }
        inv
    }

    /// Angles for `positions[b][p]`.
    pub fn angles(&self, positions: &[Vec<usize>], device: &Device) -> RotaryAngles {
        let inv = self.inv_freq();
        let (b, t, half) = (positions.len(), positions.first().map_or(0, Vec::len), inv.len());
        let mut cos = Vec::with_capacity(b * t * half);
        let mut sin = Vec::with_capacity(b * t * half);
        for row in positions {
            for &p in row {
                for &f in &inv {
                    // The angle as an f32 product (as HF forms it), its cos/sin rounded once.
                    let theta = (p as f32 * f) as f64;
                    cos.push(theta.cos() as f32);
                    sin.push(theta.sin() as f32);
                }
            }
        }
        RotaryAngles {
            cos: Tensor::from_data(TensorData::new(cos, [b, t, half]), device),
            sin: Tensor::from_data(TensorData::new(sin, [b, t, half]), device),
            interleaved: self.interleaved,
        }
    }
}

/// Rotate the first `2 * half` dimensions of every head of `x: [batch, pos, heads, d_head]`
/// (rotate-half form, or GPT-J's interleaved pairs); the rest pass through.
pub fn apply_rotary(x: Tensor<4>, angles: &RotaryAngles) -> Tensor<4> {
    let [b, t, h, dh] = x.dims();
    let half = angles.cos.dims()[2];
    let cos = angles.cos.clone().reshape([b, t, 1, half]);
    let sin = angles.sin.clone().reshape([b, t, 1, half]);
    let rotated = if angles.interleaved {
        // Pairs (x[2i], x[2i + 1]) rotate by θ_i.
        let pairs: Tensor<5> = x.clone().narrow(3, 0, 2 * half).reshape([b, t, h, half, 2]);
        let even: Tensor<4> = pairs.clone().narrow(4, 0, 1).reshape([b, t, h, half]);
        let odd: Tensor<4> = pairs.narrow(4, 1, 1).reshape([b, t, h, half]);
        let r_even = even.clone() * cos.clone() - odd.clone() * sin.clone();
        let r_odd = odd * cos + even * sin;
        Tensor::stack::<5>(vec![r_even, r_odd], 4).reshape([b, t, h, 2 * half])
    } else {
        let x1 = x.clone().narrow(3, 0, half);
        let x2 = x.clone().narrow(3, half, half);
        let r1 = x1.clone() * cos.clone() - x2.clone() * sin.clone();
        let r2 = x2 * cos + x1 * sin;
        Tensor::cat(vec![r1, r2], 3)
    };
    if 2 * half == dh { rotated } else { Tensor::cat(vec![rotated, x.narrow(3, 2 * half, dh - 2 * half)], 3) }
}

// ---------------------------------------------------------------------------------------
// Attention
// ---------------------------------------------------------------------------------------

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

/// The keys (after rotary embeddings) and values of earlier positions, one entry per layer,
/// `[batch, kv_head, pos, d_head]`.
#[derive(Debug, Clone, Default)]
pub struct KvCache {
    layers: Vec<Option<LayerKv>>,
    len: usize,
}

/// One layer's keys and values in buffers `[batch, kv_head, capacity, d_head]` whose first
/// `len` positions are written: a step writes its own positions in place and hands out a
/// view of the written ones, so that decoding copies no earlier key (a concatenation per
/// step copied them all: 4% of a GPT-2 small bf16 decoding step at 80 positions). The
/// capacity grows in whole chunks of [`KV_CHUNK`] positions: one copy of the cache per
/// chunk of steps, and never more than a chunk unused (doubling would leave up to half of
/// a long context's cache unused).
#[derive(Debug, Clone)]
struct LayerKv {
    k: Tensor<4>,
    v: Tensor<4>,
    len: usize,
}

/// Positions a layer's key and value buffers grow by.
const KV_CHUNK: usize = 256;

impl LayerKv {
    /// Room for `need` positions: the written ones copied into buffers of `need` rounded up
    /// to whole [`KV_CHUNK`]s if these are too small.
    fn reserve(self, need: usize) -> Self {
        let cap = self.k.dims()[2];
        if need <= cap {
            return self;
        }
        let Self { k, v, len } = self;
        let grow = |t: Tensor<4>| {
            let [b, h, _, d] = t.dims();
            let device = t.device();
            Tensor::cat(vec![t.narrow(2, 0, len), Tensor::zeros([b, h, need.next_multiple_of(KV_CHUNK) - len, d], &device)], 2)
        };
        Self { k: grow(k), v: grow(v), len }
    }
}

impl KvCache {
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of positions already cached.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Append this layer's new keys and values and return all of them (views of the
    /// layer's buffers).
    fn extend(&mut self, layer: usize, k: Tensor<4>, v: Tensor<4>) -> (Tensor<4>, Tensor<4>) {
        if self.layers.len() <= layer {
            self.layers.resize(layer + 1, None);
        }
        let new = k.dims()[2];
        let kv = match self.layers[layer].take() {
            // The first positions: the buffers are these keys and values themselves.
            None => LayerKv { k, v, len: new },
            Some(kv) => {
                let need = kv.len + new;
                let LayerKv { k: bk, v: bv, len } = kv.reserve(need);
                let [b, h, _, d] = bk.dims();
                let at = [0..b, 0..h, len..len + new, 0..d];
                LayerKv { k: bk.slice_assign(at.clone(), k), v: bv.slice_assign(at, v), len: len + new }
            }
        };
        let views = (kv.k.clone().narrow(2, 0, kv.len), kv.v.clone().narrow(2, 0, kv.len));
        self.layers[layer] = Some(kv);
        views
    }
}

/// The ways [`Attention::forward`] computes attention ([`Attention::path`] chooses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AttentionPath {
    /// burnlens's fused kernel (flex): softmax(q kᵀ) v without the pattern, keys of a local
    /// window only.
    Kernel { window: Option<usize> },
    /// The backend's own fused attention, causal or over every key.
    Backend { causal: bool },
    /// Scores, mask, pattern and `z` written out, with their hook points.
    Explicit,
}

/// One layer's attention weights split per head, in TransformerLens's right-multiplying
/// shapes: `q = x W_Q[h] + b_Q[h]`, and head `h` writes `z_h W_O[h]` into the residual stream.
/// With grouped-query attention the key and value weights are repeated for every query head
/// of their group, as TransformerLens does, so every tensor has `n_heads` rows.
#[derive(Debug, Clone)]
pub struct HeadWeights {
    /// `[n_heads, d_model, d_head]`
    pub w_q: Tensor<3>,
    /// `[n_heads, d_model, d_head]`
    pub w_k: Tensor<3>,
    /// `[n_heads, d_model, d_head]`
    pub w_v: Tensor<3>,
    /// `[n_heads, d_head, d_model]`
    pub w_o: Tensor<3>,
    /// `[n_heads, d_head]` (zeros when the model has no q/k/v biases)
    pub b_q: Tensor<2>,
    /// `[n_heads, d_head]`
    pub b_k: Tensor<2>,
    /// `[n_heads, d_head]`
    pub b_v: Tensor<2>,
    /// `[d_model]`
    pub b_o: Tensor<1>,
}

impl Attention {
    /// Split the fused projection into per-head `W_Q`, `W_K`, `W_V`, `W_O` and biases.
    pub fn head_weights(&self) -> HeadWeights {
        let (h, hk, dh) = (self.n_heads, self.n_kv_heads, self.d_head);
        let w = f32_val(&self.qkv.weight);
        let d = w.dims()[0];
        let device = w.device();
        // (first column, heads) of Q, K and V.
        let blocks = [(0, h), (h * dh, hk), ((h + hk) * dh, hk)];
        let part = |i: usize| {
            let (start, n) = blocks[i];
            let p: Tensor<3> = w.clone().narrow(1, start, n * dh).reshape([d, n, dh]).swap_dims(0, 1);
            if n == h { p } else { p.reshape([n, 1, d, dh]).expand([n, h / n, d, dh]).reshape([h, d, dh]) }
        };
        let bias = |i: usize| {
            let (start, n) = blocks[i];
            let b: Tensor<2> = match &self.qkv.bias {
                Some(b) => b.val().narrow(0, start, n * dh).reshape([n, dh]),
                None => Tensor::zeros([n, dh], &device),
            };
            if n == h { b } else { b.reshape([n, 1, dh]).expand([n, h / n, dh]).reshape([h, dh]) }
        };
        let w_o = f32_val(&self.out.weight);
        let d_out = w_o.dims()[1];
        HeadWeights {
            w_q: part(0),
            w_k: part(1),
            w_v: part(2),
            w_o: w_o.reshape([h, dh, d_out]),
            b_q: bias(0),
            b_k: bias(1),
            b_v: bias(2),
            b_o: self.out.bias.as_ref().map_or_else(|| Tensor::zeros([d_out], &device), |b| b.val()),
        }
    }

    /// One attention layer on `input` (see [`AttentionInput`]): returns `[batch, pos,
    /// d_model]`. With `fused` and no hook active, a fused attention computes
    /// softmax(q kᵀ) v without materialising the pattern: burnlens's kernel on flex
    /// (inference and training), the backend's own elsewhere (inference).
    pub fn forward(&self, input: AttentionInput, hooks: &mut Hooks) -> Tensor<3> {
        let AttentionInput { x, qk_input, layer: LayerInput { rotary, mask, cache, layer, fused } } = input;
        let [b, t, _] = x.dims();
        let qkv = self.project_qkv(x, qk_input);
        // No cache, nothing between the projection and the kernel: the kernel reads the
        // heads of the projection itself (in training, one gradient for it, written once).
        if cache.is_none() && rotary.is_none() && self.qk_norm.is_none()
            && let AttentionPath::Kernel { window } = self.path(fused, hooks, &qkv.device(), t, t)
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
        let z = match self.path(fused, hooks, &q.device(), t, s) {
            AttentionPath::Kernel { window } => kernels::attention(q, k, v, self.scale, AttentionMask { q_offset: s - t, window }),
            AttentionPath::Backend { causal } => {
                let (k, v) = self.every_query_head(k, v);
                let options = burn::tensor::ops::AttentionModuleOptions { scale: Some(self.scale), softcap: None, is_causal: causal };
                burn::tensor::module::attention(q, k, v, None, None, options)
            }
            AttentionPath::Explicit => {
                let (k, v) = self.every_query_head(k, v);
                return self.attend_explicit(q, k, v, mask, layer, hooks);
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
    ///   place), when `fused` (no padding), nothing is hooked, no dropout is live and there
    ///   is no soft-cap;
    /// - another backend's own fused attention where no mask is needed (global attention
    ///   over the whole sequence is plain causal attention, and one new token sees every
    ///   cached key), outside training. Explicit masks take the explicit path: LibTorch's
    ///   fused attention read burnlens's boolean mask with the opposite meaning (measured on
    ///   tch: local-window fixtures off by 25 in the logits);
    /// - else written out, every hook point on the way.
    fn path(&self, fused: bool, hooks: &Hooks, device: &Device, t: usize, s: usize) -> AttentionPath {
        let fused = fused && self.softcap.is_none() && !hooks.is_active();
        let dropout_live = self.attn_dropout.prob > 0.0 && device.is_autodiff();
        if fused && !dropout_live && kernels::is_flex(device) && kernels::enabled() {
            let window = match self.span {
                AttentionSpan::Global => None,
                AttentionSpan::Local(w) => Some(w),
            };
            return AttentionPath::Kernel { window };
        }
        let no_mask_needed = self.span == AttentionSpan::Global && (t == s || t == 1);
        if fused && no_mask_needed && !device.is_autodiff() {
            return AttentionPath::Backend { causal: t == s && t > 1 };
        }
        AttentionPath::Explicit
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
    fn attend_explicit(&self, q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, mask: Tensor<4, Bool>, layer: usize, hooks: &mut Hooks) -> Tensor<3> {
        let [b, h, t, dh] = q.dims();
        let s = k.dims()[2];
        let hd = h * dh;
        let scores = q.matmul(k.swap_dims(2, 3)) * self.scale;
        let scores = match self.softcap {
            Some(c) => (scores / c).tanh() * c,
            None => scores,
        };
        let scores = scores.mask_fill(mask.expand([b, h, t, s]), MASKED_SCORE);
        let scores = hooks.at(HookPoint::Attn(layer, AttnHook::AttnScores), scores);
        let pattern = kernels::softmax(scores);
        let pattern = hooks.at(HookPoint::Attn(layer, AttnHook::Pattern), pattern);
        let pattern = self.attn_dropout.forward(pattern);

        let z = pattern.matmul(v).swap_dims(1, 2); // [batch, pos, head, d_head]
        let z = hooks.at(HookPoint::Attn(layer, AttnHook::Z), z);

        let result_point = HookPoint::Attn(layer, AttnHook::Result);
        if hooks.wants_point(result_point) {
            // Per-head writes into the residual stream, without b_O: [batch, pos, head, d_model].
            let w_o = f32_val(&self.out.weight);
            let d = w_o.dims()[1];
            let per_head = z.clone().swap_dims(1, 2).matmul(w_o.reshape([1, h, dh, d]).expand([b, h, dh, d]));
            let result = hooks.at(result_point, per_head.swap_dims(1, 2));
            let summed: Tensor<3> = result.sum_dim(2).reshape([b, t, d]);
            return match &self.out.bias {
                Some(bias) => summed + bias.val().reshape([1, 1, d]),
                None => summed,
            };
        }
        self.project_out(z.reshape([b, t, hd]))
    }

    /// `z W_O (+ b_O)`: `[batch, pos, n_heads * d_head]` -> `[batch, pos, d_model]`.
    fn project_out(&self, z: Tensor<3>) -> Tensor<3> {
        linear(z, self.out.weight.val(), self.out.bias.as_ref().map(|b| b.val()))
    }
}

/// A parameter's values in f32 (a half weight widened: the forward reads half weights
/// through its kernels, everything else that multiplies by a weight takes f32).
pub fn f32_val<const D: usize>(p: &Param<Tensor<D>>) -> Tensor<D> {
    p.val().cast(DType::F32)
}

/// What one layer gets from the model's forward pass besides the residual stream.
pub struct LayerInput<'a> {
    /// The angles of the new tokens' positions, for rotary models.
    pub rotary: Option<&'a RotaryAngles>,
    /// `[batch or 1, 1, query, key]`, true where a key is hidden.
    pub mask: Tensor<4, Bool>,
    /// The KV cache to extend and attend over (decoding), if any.
    pub cache: Option<&'a mut KvCache>,
    /// The layer's index: its hook names and its slot in the cache.
    pub layer: usize,
    /// Whether a fused attention may run (no padding); hooks still take the explicit path.
    pub fused: bool,
}

impl<'a> LayerInput<'a> {
    /// Layer `layer` under `mask`: no rotary, no cache, not fused.
    pub fn new(mask: Tensor<4, Bool>, layer: usize) -> Self {
        Self { rotary: None, mask, cache: None, layer, fused: false }
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


// ---------------------------------------------------------------------------------------
// MLP
// ---------------------------------------------------------------------------------------

/// Two-layer perceptron `act(x W_in + b_in) W_out + b_out`, or gated
/// `(act(x W_gate) * (x W_in)) W_out` (biases optional).
#[derive(Module, Debug)]
pub struct Mlp {
    /// `W_in`: `[d_model, d_mlp]`
    pub fc_in: Linear,
    /// `W_gate`: `[d_model, d_mlp]`, gated MLPs only.
    pub fc_gate: Option<Linear>,
    /// `W_out`: `[d_mlp, d_model]`
    pub fc_out: Linear,
    #[module(skip)]
    pub activation: ActivationFn,
}

/// Apply a Hugging Face activation function element-wise.
///
/// The tanh GELUs use `0.5 x (1 + tanh(u)) = x σ(2u)`: the same function, computed with one
/// `exp` per element instead of a `tanh`, and `x³` as two multiplications rather than `powf`.
pub fn activate<const D: usize>(act: ActivationFn, x: Tensor<D>) -> Tensor<D> {
    if let Some((alpha, beta)) = kernels::activation::gate_coefficients(act)
        && kernels::is_flex(&x.device())
        && kernels::enabled()
        && x.dtype() == burn::tensor::DType::F32
    {
        return kernels::gated_activation(x, alpha, beta);
    }
    // 2 * sqrt(2 / π)
    const TWO_SQRT_2_OVER_PI: f64 = 1.595_769_121_605_730_7;
    match act {
        ActivationFn::GeluNew => {
            let inner = (x.clone() * x.clone() * 0.044715 + 1.0) * x.clone();
            x * sigmoid(inner * TWO_SQRT_2_OVER_PI)
        }
        ActivationFn::Gelu => burn::tensor::activation::gelu(x),
        ActivationFn::GeluFast => {
            let inner = (x.clone() * x.clone() * 0.044715 + 1.0) * x.clone();
            x * sigmoid(inner * (2.0 * 0.7978845608))
        }
        ActivationFn::Relu => relu(x),
        ActivationFn::QuickGelu => x.clone() * sigmoid(x * 1.702),
        ActivationFn::Silu => x.clone() * sigmoid(x),
    }
}

impl Mlp {
    /// `x: [batch, pos, d_model]` -> `[batch, pos, d_model]`. Hook points (TransformerLens's):
    /// `mlp.hook_pre` is the activation's input (`x W_gate` when gated), `mlp.hook_pre_linear`
    /// the gated MLP's linear branch `x W_in`, `mlp.hook_post` what `W_out` reads.
    pub fn forward(&self, x: Tensor<3>, hooks: &mut Hooks, layer: usize) -> Tensor<3> {
        let project = |l: &Linear, x| linear(x, l.weight.val(), l.bias.as_ref().map(|b| b.val()));
        let post = match &self.fc_gate {
            None => {
                let pre = hooks.at(HookPoint::Mlp(layer, MlpHook::Pre), project(&self.fc_in, x));
                activate(self.activation, pre)
            }
            Some(gate) => {
                let pre = hooks.at(HookPoint::Mlp(layer, MlpHook::Pre), project(gate, x.clone()));
                let pre_linear = hooks.at(HookPoint::Mlp(layer, MlpHook::PreLinear), project(&self.fc_in, x));
                activate(self.activation, pre) * pre_linear
            }
        };
        let post = hooks.at(HookPoint::Mlp(layer, MlpHook::Post), post);
        project(&self.fc_out, post)
    }
}

// ---------------------------------------------------------------------------------------
// Block
// ---------------------------------------------------------------------------------------

/// Pre-norm block: `x + attn(ln1(x))`, then `+ mlp(ln2(.))` (no MLP in attention-only
/// models); with a parallel residual `x + attn(ln1(x)) + mlp(ln2(x))` (GPT-J: `mlp(ln1(x))`).
/// Post-norm (OLMo 2): `x + ln1(attn(x))`, then `+ ln2(mlp(.))`. Sandwich (Gemma):
/// `x + ln1_post(attn(ln1(x)))`, then `+ ln2_post(mlp(ln2(.)))`.
#[derive(Module, Debug)]
pub struct Block {
    /// Before attention (after it with [`NormPlacement::Post`]).
    pub ln1: Norm,
    /// After attention, with [`NormPlacement::Sandwich`].
    pub ln1_post: Option<Norm>,
    pub attn: Attention,
    /// Before the MLP (after it with [`NormPlacement::Post`]); none in attention-only
    /// models and when the MLP shares `ln1` (GPT-J).
    pub ln2: Option<Norm>,
    /// After the MLP, with [`NormPlacement::Sandwich`].
    pub ln2_post: Option<Norm>,
    pub mlp: Option<Mlp>,
    pub resid_dropout: Dropout,
    #[module(skip)]
    pub parallel: bool,
    #[module(skip)]
    pub placement: NormPlacement,
}

impl Block {
    /// `pos_qk`: shortformer position embeddings (queries and keys only), if any.
    fn forward(&self, resid: Tensor<3>, pos_qk: Option<Tensor<3>>, input: LayerInput, hooks: &mut Hooks) -> Tensor<3> {
        let l = input.layer;
        let resid = hooks.at(HookPoint::Block(l, BlockHook::ResidPre), resid);
        let ln1 = NormSite::Ln1(l);
        let post = self.placement == NormPlacement::Post;
        let x = if post { resid.clone() } else { self.ln1.forward(resid.clone(), hooks, ln1) };
        // Shortformer positions join the normalized stream (as TransformerLens does): the
        // query/key input is ln1(resid) + pos, the value input ln1(resid). Normalizing them
        // together instead couples position and content and, in our measurements, keeps a
        // two-layer model from forming induction heads.
        let qk_input = pos_qk.map(|p| x.clone() + p);
        let attn_out = self.attn.forward(AttentionInput { x: x.clone(), qk_input, layer: input }, hooks);
        let attn_out = match (&self.ln1_post, post) {
            (Some(n), _) => n.forward(attn_out, hooks, NormSite::Ln1Post(l)),
            (None, true) => self.ln1.forward(attn_out, hooks, ln1),
            (None, false) => attn_out,
        };
        let attn_out = hooks.at(HookPoint::Block(l, BlockHook::AttnOut), self.resid_dropout.forward(attn_out));
        if self.parallel {
            // Both branches read the block input.
            let resid = match &self.mlp {
                Some(mlp) => {
                    let x = match &self.ln2 {
                        Some(ln2) => ln2.forward(resid.clone(), hooks, NormSite::Ln2(l)),
                        None => x,
                    };
                    let mlp_out = self.mlp_out(mlp.forward(x, hooks, l), hooks, l);
                    resid + attn_out + mlp_out
                }
                None => resid + attn_out,
            };
            return hooks.at(HookPoint::Block(l, BlockHook::ResidPost), resid);
        }
        let resid = resid + attn_out;
        let resid = match (&self.ln2, &self.mlp) {
            (Some(ln2), Some(mlp)) => {
                let resid = hooks.at(HookPoint::Block(l, BlockHook::ResidMid), resid);
                let x = if post { resid.clone() } else { ln2.forward(resid.clone(), hooks, NormSite::Ln2(l)) };
                let mlp_out = mlp.forward(x, hooks, l);
                let mlp_out = if post { ln2.forward(mlp_out, hooks, NormSite::Ln2(l)) } else { mlp_out };
                resid + self.mlp_out(mlp_out, hooks, l)
            }
            _ => resid,
        };
        hooks.at(HookPoint::Block(l, BlockHook::ResidPost), resid)
    }

    /// The MLP's write into the residual stream: after `ln2_post` (Gemma), dropout and
    /// `hook_mlp_out`.
    fn mlp_out(&self, out: Tensor<3>, hooks: &mut Hooks, l: usize) -> Tensor<3> {
        let out = match &self.ln2_post {
            Some(n) => n.forward(out, hooks, NormSite::Ln2Post(l)),
            None => out,
        };
        hooks.at(HookPoint::Block(l, BlockHook::MlpOut), self.resid_dropout.forward(out))
    }
}

// ---------------------------------------------------------------------------------------
// Transformer
// ---------------------------------------------------------------------------------------

/// Decoder-only transformer.
#[derive(Module, Debug)]
pub struct Transformer {
    /// Token embedding `W_E`, `[vocab, d_model]`; its transpose is the unembedding `W_U`
    /// when tied.
    pub embed: Embedding,
    /// Position embedding `W_pos`, `[n_ctx, d_model]` (none with rotary positions).
    pub pos_embed: Option<Embedding>,
    pub blocks: Vec<Block>,
    pub ln_final: Norm,
    /// Untied unembedding, if the config asks for one (see [`TransformerConfig::untied_unembed`]).
    pub unembed: Option<Unembed>,
    pub embed_dropout: Dropout,
    #[module(skip)]
    pub config: TransformerConfig,
}

/// An unembedding of its own: `logits = x W_U (+ b_U)`.
#[derive(Module, Debug)]
pub struct Unembed {
    /// `[d_model, vocab]`
    pub weight: Param<Tensor<2>>,
    /// `[vocab]`
    pub bias: Option<Param<Tensor<1>>>,
}

/// How one parameter of a model being built gets its values.
pub enum ParamInit {
    /// These values, already in the canonical layout and of the requested shape, kept in
    /// their own dtype (f32, or bf16 / f16 for a weight matrix kept as its checkpoint
    /// stores it; the forward computes in f32 either way).
    Data(TensorData),
    /// The transpose of a 2-D parameter: values `[d_out, d_in]` for a `[d_in, d_out]`
    /// parameter, kept in that layout and read through a transposed view (an `nn.Linear`
    /// weight read in place, with no transposed copy).
    Transposed(TensorData),
    /// Drawn from this initializer.
    Random(Initializer),
}

impl TransformerConfig {
    /// Build a model with Hugging Face's initialisation: normal(0, 0.02) weights, zero
    /// biases, unit LayerNorm gains, and the residual-writing projections (`W_O`, MLP out)
    /// scaled by `1 / sqrt(2 * n_layers)` as GPT-2 does.
    pub fn init(&self, device: &Device) -> Result<Transformer, ModelError> {
        self.build(device, |_, _, init| Ok::<_, ModelError>(ParamInit::Random(init)))
    }

    /// Build a model whose every parameter comes from `source(name, shape, default)`.
    /// `name` is the parameter's module path (`blocks.0.attn.qkv.weight`, ...), `shape` its
    /// canonical shape, `default` the initializer [`init`](Self::init) would use. A
    /// checkpoint importer answers with [`ParamInit::Data`]; nothing is allocated twice.
    pub fn build<E: From<ModelError>>(
        &self,
        device: &Device,
        source: impl FnMut(&str, &[usize], Initializer) -> Result<ParamInit, E>,
    ) -> Result<Transformer, E> {
        self.validate()?;
        let mut b = Builder { device, source };
        let std = 0.02;
        let (d, eps, norm) = (self.d_model, self.layer_norm_eps, self.norm);
        let dropout = DropoutConfig::new(self.dropout);
        let blocks = (0..self.n_layers()).map(|l| self.build_block(l, &mut b)).collect::<Result<Vec<_>, E>>()?;
        Ok(Transformer {
            embed: Embedding { weight: b.param("embed.weight".into(), [self.vocab_size, d], normal(std))? },
            pos_embed: match self.learned_positions() {
                true => Some(Embedding { weight: b.param("pos_embed.weight".into(), [self.n_ctx, d], normal(std))? }),
                false => None,
            },
            blocks,
            ln_final: b.norm(NormSite::Final, d, eps, norm)?,
            unembed: match self.untied_unembed {
                true => Some(Unembed {
                    weight: b.param("unembed.weight".into(), [d, self.vocab_size], normal(std))?,
                    bias: match self.unembed_bias {
                        true => Some(b.param("unembed.bias".into(), [self.vocab_size], Initializer::Zeros)?),
                        false => None,
                    },
                }),
                false => None,
            },
            embed_dropout: dropout.init(),
            config: self.clone(),
        })
    }

    /// Block `l`'s parameters, read or initialised through `b`.
    fn build_block<F, E>(&self, l: usize, b: &mut Builder<'_, F>) -> Result<Block, E>
    where
        F: FnMut(&str, &[usize], Initializer) -> Result<ParamInit, E>,
    {
        let (std, resid_std) = (0.02, 0.02 / (2.0 * self.n_layers() as f64).sqrt());
        let (d, hd) = (self.d_model, self.n_heads * self.d_head);
        let (eps, norm) = (self.layer_norm_eps, self.norm);
        let dropout = DropoutConfig::new(self.dropout);
        let p = format!("blocks.{l}");
        let sandwich = self.norm_placement == NormPlacement::Sandwich;
        let (q_norm, k_norm) = match self.qk_norm_widths() {
            Some((wq, wk)) => (Some(b.norm(NormSite::QNorm(l), wq, eps, norm)?), Some(b.norm(NormSite::KNorm(l), wk, eps, norm)?)),
            None => (None, None),
        };
        Ok(Block {
            ln1: b.norm(NormSite::Ln1(l), d, eps, norm)?,
            ln1_post: if sandwich { Some(b.norm(NormSite::Ln1Post(l), d, eps, norm)?) } else { None },
            attn: Attention {
                qkv: b.linear(&format!("{p}.attn.qkv"), d, self.qkv_width(), self.qkv_bias, std)?,
                out: b.linear(&format!("{p}.attn.out"), hd, d, self.attn_out_bias, resid_std)?,
                attn_dropout: dropout.init(),
                q_norm,
                k_norm,
                qk_norm: self.qk_norm,
                softcap: self.attn_softcap,
                n_heads: self.n_heads,
                n_kv_heads: self.kv_heads(),
                d_head: self.d_head,
                scale: self.score_factor(l),
                span: self.spans[l],
            },
            ln2: match self.has_ln2() {
                true => Some(b.norm(NormSite::Ln2(l), d, eps, norm)?),
                false => None,
            },
            mlp: match self.d_mlp {
                Some(m) => Some(Mlp {
                    fc_in: b.linear(&format!("{p}.mlp.fc_in"), d, m, self.mlp_bias, std)?,
                    fc_gate: match self.mlp {
                        MlpKind::Gated => Some(b.linear(&format!("{p}.mlp.fc_gate"), d, m, self.mlp_bias, std)?),
                        MlpKind::Standard => None,
                    },
                    fc_out: b.linear(&format!("{p}.mlp.fc_out"), m, d, self.mlp_bias, resid_std)?,
                    activation: self.activation,
                }),
                None => None,
            },
            ln2_post: if sandwich && self.d_mlp.is_some() { Some(b.norm(NormSite::Ln2Post(l), d, eps, norm)?) } else { None },
            resid_dropout: dropout.init(),
            parallel: self.parallel_residual,
            placement: self.norm_placement,
        })
    }
}

fn normal(std: f64) -> Initializer {
    Initializer::Normal { mean: 0.0, std }
}

/// Asks the parameter source of [`TransformerConfig::build`] for each parameter in turn.
struct Builder<'a, F> {
    device: &'a Device,
    source: F,
}

impl<F, E> Builder<'_, F>
where
    F: FnMut(&str, &[usize], Initializer) -> Result<ParamInit, E>,
{
    fn param<const D: usize>(&mut self, name: String, shape: [usize; D], init: Initializer) -> Result<Param<Tensor<D>>, E> {
        // The data's own dtype: Burn's `from_data` would turn it into the device default.
        let tensor = |data: TensorData| {
            let options = TensorCreationOptions::new(self.device.clone()).with_dtype(data.dtype());
            Tensor::<D>::from_data(data, options)
        };
        Ok(match (self.source)(&name, &shape, init)? {
            ParamInit::Data(data) => {
                assert_eq!(data.shape().as_slice(), shape.as_slice(), "parameter source gave `{name}` the wrong shape");
                Param::from_tensor(tensor(data))
            }
            ParamInit::Transposed(data) => {
                let flipped: Vec<usize> = shape.iter().rev().copied().collect();
                assert!(D == 2 && data.shape().as_slice() == flipped.as_slice(), "parameter source gave `{name}` the wrong transposed shape");
                Param::from_tensor(tensor(data).transpose())
            }
            ParamInit::Random(init) => init.init_with(shape, Some(shape[0]), None, self.device),
        })
    }

    fn linear(&mut self, name: &str, d_in: usize, d_out: usize, bias: bool, std: f64) -> Result<Linear, E> {
        Ok(Linear {
            weight: self.param(format!("{name}.weight"), [d_in, d_out], normal(std))?,
            bias: if bias { Some(self.param(format!("{name}.bias"), [d_out], Initializer::Zeros)?) } else { None },
        })
    }

    fn norm(&mut self, site: NormSite, d: usize, eps: f64, kind: NormKind) -> Result<Norm, E> {
        let name = site.to_string();
        Ok(Norm {
            weight: self.param(format!("{name}.weight"), [d], Initializer::Ones)?,
            bias: match kind {
                NormKind::LayerNorm => Some(self.param(format!("{name}.bias"), [d], Initializer::Zeros)?),
                NormKind::RmsNorm => None,
            },
            eps,
            kind,
        })
    }
}

/// Where [`Transformer::forward_with`] stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Stop {
    /// The logits `[batch, pos, vocab]` (soft-capped where the model caps them).
    #[default]
    Logits,
    /// The final norm's output `[batch, pos, d_model]`, what the unembedding reads.
    FinalStream,
    /// The residual stream leaving block `l` `[batch, pos, d_model]`: later blocks, the final
    /// norm and the unembedding do not run (TransformerLens's `stop_at_layer = l + 1`).
    AfterBlock(usize),
}

/// One forward pass's input: token ids `[batch, pos]` and, by builder methods, what else it
/// takes. Padding and a KV cache do not combine.
pub struct Forward<'a, 'h> {
    ids: Tensor<2, Int>,
    hooks: Option<&'a mut Hooks<'h>>,
    padding: Option<&'a [Vec<bool>]>,
    cache: Option<&'a mut KvCache>,
    start: Option<(usize, Tensor<3>)>,
    stop: Stop,
}

impl<'a, 'h> Forward<'a, 'h> {
    /// A plain pass over `ids`: no hooks, no padding, no cache, all blocks, logits.
    pub fn new(ids: Tensor<2, Int>) -> Self {
        Self { ids, hooks: None, padding: None, cache: None, start: None, stop: Stop::Logits }
    }

    /// Hook points observed or edited by `hooks`.
    pub fn hooks(mut self, hooks: &'a mut Hooks<'h>) -> Self {
        self.hooks = Some(hooks);
        self
    }

    /// A padded batch: `mask[b][p]` false at padding; position ids count real tokens only.
    pub fn padding(mut self, mask: &'a [Vec<bool>]) -> Self {
        self.padding = Some(mask);
        self
    }

    /// Continue the sequence held in `cache` (its keys and values are extended).
    pub fn cache(mut self, cache: &'a mut KvCache) -> Self {
        self.cache = Some(cache);
        self
    }

    /// Begin at block `layer` with `resid_pre` `[batch, pos, d_model]`, the stream entering it.
    pub fn start(mut self, layer: usize, resid_pre: Tensor<3>) -> Self {
        self.start = Some((layer, resid_pre));
        self
    }

    /// Where to stop.
    pub fn stop(mut self, stop: Stop) -> Self {
        self.stop = stop;
        self
    }
}

/// Where a forward pass sits: the absolute position of every token and which keys each
/// query may see.
struct Positions {
    /// `[batch][pos]` absolute position ids of the new tokens.
    ids: Vec<Vec<usize>>,
    /// `[batch][key]` whether each key (cached and new) is a real token, if any is padding.
    keys_real: Option<Vec<Vec<bool>>>,
}

impl Transformer {
    /// The device the weights live on.
    pub fn device(&self) -> Device {
        self.embed.weight.device()
    }

    /// Check token ids against the vocabulary and the context.
    pub fn check_ids(&self, ids: &[i64]) -> Result<(), ModelError> {
        if ids.is_empty() {
            return Err(ModelError::Empty);
        }
        if ids.len() > self.config.n_ctx {
            return Err(ModelError::TooLong { len: ids.len(), n_ctx: self.config.n_ctx });
        }
        let vocab = self.config.vocab_size;
        match ids.iter().enumerate().find(|(_, id)| **id < 0 || **id as usize >= vocab) {
            Some((pos, &id)) => Err(ModelError::TokenOutOfRange { id, pos, vocab }),
            None => Ok(()),
        }
    }

    /// Put one sequence of token ids on the model's device as `[1, pos]`.
    pub fn ids_tensor(&self, ids: &[i64]) -> Tensor<2, Int> {
        Tensor::from_data(TensorData::new(ids.to_vec(), [1, ids.len()]), &self.device())
    }

    /// The forward pass as `input` describes it (hooks, padding, a KV cache, a start block,
    /// where to stop): the one entry point the shorthands below call.
    ///
    /// ```ignore
    /// let logits = model.forward_with(Forward::new(ids).hooks(&mut hooks).padding(&mask));
    /// ```
    pub fn forward_with(&self, input: Forward) -> Tensor<3> {
        let Forward { ids, hooks, padding, cache, start, stop } = input;
        let [b, t] = ids.dims();
        assert!(padding.is_none() || cache.is_none(), "forward_with: padding with a KV cache is not supported");
        let first = cache.as_ref().map_or(0, |c| c.len());
        let pos = match padding {
            Some(mask) => Positions { ids: positions_from_mask(mask, &vec![0; mask.len()]), keys_real: Some(mask.to_vec()) },
            None => Positions { ids: vec![(first..first + t).collect(); b], keys_real: None },
        };
        if let Some((layer, resid_pre)) = &start {
            assert!(*layer < self.blocks.len(), "forward_with: start at block {layer} of {}", self.blocks.len());
            assert_eq!(resid_pre.dims(), [b, t, self.config.d_model], "forward_with: the start's resid_pre must be [batch, pos, d_model]");
        }
        let mut none = Hooks::none();
        let hooks = hooks.unwrap_or(&mut none);
        let mut cache = cache;
        let x = self.run_stream(ids, pos, cache.as_deref_mut(), hooks, start, stop);
        if let Some(c) = cache {
            c.len += t;
        }
        match stop {
            Stop::Logits => self.soft_cap_logits(self.unembed(x)),
            Stop::FinalStream | Stop::AfterBlock(_) => x,
        }
    }

    /// Logits `[batch, pos, vocab]` for token ids `[batch, pos]`.
    pub fn forward(&self, ids: Tensor<2, Int>) -> Tensor<3> {
        self.forward_with(Forward::new(ids))
    }

    /// [`forward`](Self::forward) with hook points observed or edited by `hooks`.
    pub fn forward_hooked(&self, ids: Tensor<2, Int>, hooks: &mut Hooks) -> Tensor<3> {
        self.forward_with(Forward::new(ids).hooks(hooks))
    }

    /// [`forward_hooked`](Self::forward_hooked) from block `layer` on: `resid_pre` is the
    /// residual stream entering that block (`blocks.{layer}.hook_resid_pre` of an earlier run
    /// on the same `ids`), and the embedding and earlier blocks are not recomputed. Activation
    /// patching runs each patched pass from the patched layer.
    pub fn forward_from(&self, ids: Tensor<2, Int>, layer: usize, resid_pre: Tensor<3>, hooks: &mut Hooks) -> Tensor<3> {
        self.forward_with(Forward::new(ids).hooks(hooks).start(layer, resid_pre))
    }

    /// [`forward_hooked`](Self::forward_hooked) up to the final norm's output `[batch, pos,
    /// d_model]` (what the unembedding reads).
    pub fn final_stream(&self, ids: Tensor<2, Int>, hooks: &mut Hooks) -> Tensor<3> {
        self.forward_with(Forward::new(ids).hooks(hooks).stop(Stop::FinalStream))
    }

    /// [`forward_from`](Self::forward_from) up to the final norm's output `[batch, pos,
    /// d_model]`, for callers that unembed only the positions they read (block 0 with the
    /// embedded stream is a whole pass).
    pub fn final_stream_from(&self, ids: Tensor<2, Int>, layer: usize, resid_pre: Tensor<3>, hooks: &mut Hooks) -> Tensor<3> {
        self.forward_with(Forward::new(ids).hooks(hooks).start(layer, resid_pre).stop(Stop::FinalStream))
    }

    /// Logits for a padded batch. `attention_mask[b][p]` is false for padding. Position ids
    /// count only real tokens, so a left-padded sequence gets the same logits at its real
    /// positions as it would alone.
    pub fn forward_padded(&self, ids: Tensor<2, Int>, attention_mask: &[Vec<bool>], hooks: &mut Hooks) -> Tensor<3> {
        self.forward_with(Forward::new(ids).hooks(hooks).padding(attention_mask))
    }

    /// Layer `layer`'s attention pattern `[batch, head, query, key]` for the attention input
    /// `x [batch, pos, d_model]` at positions `0..pos` (what `blocks.{layer}.attn` reads: the
    /// `ln1` output, or the residual stream where the norm follows attention). The forward
    /// pass's own computation, so a caller can recompute a pattern instead of keeping it.
    pub fn attention_pattern(&self, layer: usize, x: Tensor<3>) -> Tensor<4> {
        let device = self.device();
        let [b, t, _] = x.dims();
        let pos = Positions { ids: vec![(0..t).collect(); b], keys_real: None };
        let block = &self.blocks[layer];
        let mask = build_mask(block.attn.span, &pos, t, &device);
        let is_rotary = self.config.positional == Positional::Rotary;
        let global = self.config.rotary.as_ref().filter(|_| is_rotary).map(|r| r.angles(&pos.ids, &device));
        let local = self.config.rotary_local.as_ref().filter(|_| is_rotary).map(|r| r.angles(&pos.ids, &device));
        let rotary = match (block.attn.span, &local) {
            (AttentionSpan::Local(_), Some(l)) => Some(l),
            _ => global.as_ref(),
        };
        let qk_input = match (self.config.positional, &self.pos_embed) {
            (Positional::QueryKeyOnly, Some(p)) => {
                let flat: Vec<i64> = pos.ids.iter().flatten().map(|&i| i as i64).collect();
                let ids = Tensor::<2, Int>::from_data(TensorData::new(flat, [b, t]), &device);
                Some(x.clone() + p.forward(ids).cast(DType::F32))
            }
            _ => None,
        };
        let name = HookPoint::Attn(layer, AttnHook::Pattern).name();
        let mut hooks = Hooks::capture(|n: &str| n == name);
        let input = LayerInput { rotary, mask, cache: None, layer, fused: false };
        block.attn.forward(AttentionInput { x, qk_input, layer: input }, &mut hooks);
        hooks.take_cache().remove(&name).and_then(|a| a.rank4()).expect("the attention hooks its pattern")
    }

    /// Logits for `ids` continuing the sequence held in `cache`; the new keys and values are
    /// appended to it. Each call costs only the new positions.
    pub fn forward_cached(&self, ids: Tensor<2, Int>, cache: &mut KvCache) -> Tensor<3> {
        self.forward_with(Forward::new(ids).cache(cache))
    }

    /// The forward pass up to the final norm's output.
    fn run_stream(&self, ids: Tensor<2, Int>, pos: Positions, mut cache: Option<&mut KvCache>, hooks: &mut Hooks, start: Option<(usize, Tensor<3>)>, stop: Stop) -> Tensor<3> {
        let device = self.device();
        let [b, t] = ids.dims();
        let n_keys = cache.as_ref().map_or(0, |c| c.len()) + t;
        // Fused attention knows only causal and window masks: padding takes the explicit path.
        let fused = !hooks.is_active() && pos.keys_real.is_none();
        let flat: Vec<i64> = pos.ids.iter().flatten().map(|&p| p as i64).collect();
        let pos_ids = Tensor::<2, Int>::from_data(TensorData::new(flat, [b, t]), &device);

        // A half table is gathered as stored and only the gathered rows widened.
        let mut embed = kernels::embedding(self.embed.weight.val(), ids).cast(DType::F32);
        if self.config.scale_embed {
            // Gemma: sqrt(d_model) rounded to f32, as the checkpoint's dtype holds it.
            embed = embed * ((self.config.d_model as f64).sqrt() as f32);
        }
        let first = start.as_ref().map_or(0, |(l, _)| *l);
        let embed = if first == 0 { hooks.at(HookPoint::Embed, embed) } else { embed };
        let pos_embed = self.pos_embed.as_ref().map(|p| {
            let p = kernels::embedding(p.weight.val(), pos_ids).cast(DType::F32);
            if first == 0 { hooks.at(HookPoint::PosEmbed, p) } else { p }
        });
        let (mut resid, pos_qk) = match (self.config.positional, pos_embed) {
            (Positional::Residual, Some(p)) => (embed + p, None),
            (Positional::QueryKeyOnly, Some(p)) => (embed, Some(p)),
            _ => (embed, None),
        };
        resid = self.embed_dropout.forward(resid);
        if let Some((_, r)) = start {
            resid = r;
        }
        let is_rotary = self.config.positional == Positional::Rotary;
        let rotary = self.config.rotary.as_ref().filter(|_| is_rotary).map(|r| r.angles(&pos.ids, &device));
        let rotary_local = self.config.rotary_local.as_ref().filter(|_| is_rotary).map(|r| r.angles(&pos.ids, &device));

        // One mask per distinct span, shared by the layers that use it.
        let mut masks: Vec<(AttentionSpan, Tensor<4, Bool>)> = Vec::new();
        let end = match stop {
            Stop::AfterBlock(l) => (l + 1).min(self.blocks.len()),
            _ => self.blocks.len(),
        };
        for (l, block) in self.blocks.iter().enumerate().take(end).skip(first) {
            let span = block.attn.span;
            let mask = match masks.iter().find(|(s, _)| *s == span) {
                Some((_, m)) => m.clone(),
                None => {
                    let m = build_mask(span, &pos, n_keys, &device);
                    masks.push((span, m.clone()));
                    m
                }
            };
            let angles = match (span, &rotary_local) {
                (AttentionSpan::Local(_), Some(local)) => Some(local),
                _ => rotary.as_ref(),
            };
            let input = LayerInput { rotary: angles, mask, cache: cache.as_deref_mut(), layer: l, fused };
            resid = block.forward(resid, pos_qk.clone(), input, hooks);
        }
        match stop {
            Stop::AfterBlock(_) => resid,
            _ => self.ln_final.forward(resid, hooks, NormSite::Final),
        }
    }

    /// Gemma 2's final soft-capping `c tanh(l / c)`, when the model has it (the identity
    /// otherwise). [`unembed`](Self::unembed) does not apply it: direct logit attribution
    /// and the logit lens sum and compare logits before the cap.
    pub fn soft_cap_logits(&self, logits: Tensor<3>) -> Tensor<3> {
        match self.config.final_softcap {
            Some(c) => (logits / c).tanh() * c,
            None => logits,
        }
    }

    /// `x: [batch, pos, d_model]` -> logits `[batch, pos, vocab]` through `W_U` (`W_Eᵀ` when
    /// tied), read in the dtype it is stored in.
    pub fn unembed(&self, x: Tensor<3>) -> Tensor<3> {
        let (w_u, b_u) = self.w_u_stored();
        linear(x, w_u, b_u)
    }

    /// The unembedding matrix `W_U [d_model, vocab]` (`W_Eᵀ` when tied) and its bias, if
    /// any, in f32.
    pub fn w_u(&self) -> (Tensor<2>, Option<Tensor<1>>) {
        let (w, b) = self.w_u_stored();
        (w.cast(DType::F32), b)
    }

    fn w_u_stored(&self) -> (Tensor<2>, Option<Tensor<1>>) {
        match &self.unembed {
            None => (self.embed.weight.val().transpose(), None),
            Some(u) => (u.weight.val(), u.bias.as_ref().map(|b| b.val())),
        }
    }

    /// The dtype the weight matrices are stored in (`F32`, or `BF16` / `F16` for a half
    /// checkpoint loaded as it is stored).
    pub fn weight_dtype(&self) -> DType {
        self.embed.weight.val().dtype()
    }
}

/// Position ids from a padding mask: each real token's index among the real tokens of its
/// row, plus `start`; padding gets position 0 (it is never attended to).
fn positions_from_mask(mask: &[Vec<bool>], start: &[usize]) -> Vec<Vec<usize>> {
    mask.iter()
        .zip(start)
        .map(|(row, &s)| {
            let mut n = 0;
            row.iter()
                .map(|&real| {
                    if real {
                        n += 1;
                        s + n - 1
                    } else {
                        0
                    }
                })
                .collect()
        })
        .collect()
}

/// `[batch or 1, 1, query, key]`, true where the key is hidden from the query.
fn build_mask(span: AttentionSpan, pos: &Positions, n_keys: usize, device: &Device) -> Tensor<4, Bool> {
    let t = pos.ids[0].len();
    let first_new = n_keys - t;
    match &pos.keys_real {
        None => {
            // Same positions in every row: one mask for the batch. Key k sits at position k.
            let mut m = Vec::with_capacity(t * n_keys);
            for &q in &pos.ids[0] {
                m.extend((0..n_keys).map(|k| !span.allows(q, k)));
            }
            Tensor::from_data(TensorData::new(m, [1, 1, t, n_keys]), device)
        }
        Some(real) => {
            // Padding: compare positions counted over real tokens only, and hide padding keys.
            let b = pos.ids.len();
            let mut m = Vec::with_capacity(b * t * n_keys);
            for (row, q_pos) in pos.ids.iter().enumerate() {
                let key_pos = positions_from_mask(&real[row..row + 1], &[0])[0].clone();
                for (qi, &q) in q_pos.iter().enumerate() {
                    let q_key = first_new + qi;
                    for k in 0..n_keys {
                        let visible = real[row][k] && k <= q_key && span.allows(q, key_pos[k]);
                        m.push(!visible);
                    }
                }
            }
            Tensor::from_data(TensorData::new(m, [b, 1, t, n_keys]), device)
        }
    }
}

/// Mean next-token cross-entropy: position `p` predicts token `p + 1`.
/// `logits: [batch, pos, vocab]`, `ids: [batch, pos]`; returns `[1]`.
pub fn next_token_loss(logits: Tensor<3>, ids: Tensor<2, Int>) -> Tensor<1> {
    let t = logits.dims()[1];
    assert!(t >= 2, "next-token loss needs at least two positions");
    cross_entropy(logits.narrow(1, 0, t - 1), ids.narrow(1, 1, t - 1))
}

/// [`next_token_loss`] of a padded batch: the mean over the pairs (position `p` predicting
/// `p + 1`) whose two tokens are both real (`real[b][p]`, false at padding); NaN when no
/// pair is. Every position counts without `real`.
pub fn next_token_loss_of_real(logits: Tensor<3>, ids: Tensor<2, Int>, real: Option<&[Vec<bool>]>) -> Tensor<1> {
    let Some(real) = real else { return next_token_loss(logits, ids) };
    let [b, t, v] = logits.dims();
    let device = logits.device();
    let pairs = t.saturating_sub(1);
    let keep: Vec<i64> = (0..b).flat_map(|i| (0..pairs).filter(move |&p| real[i][p] && real[i][p + 1]).map(move |p| (i * pairs + p) as i64)).collect();
    if keep.is_empty() {
        return Tensor::from_data(TensorData::new(vec![f32::NAN], [1]), &device);
    }
    let rows = Tensor::<1, Int>::from_data(TensorData::new(keep.clone(), [keep.len()]), &device);
    let x = logits.narrow(1, 0, pairs).reshape([b * pairs, v]).select(0, rows.clone());
    let y = ids.narrow(1, 1, pairs).reshape([b * pairs]).select(0, rows);
    kernels::cross_entropy(x, y)
}

/// Mean cross-entropy of `logits: [batch, pos, vocab]` against `targets: [batch, pos]`;
/// returns `[1]`.
pub fn cross_entropy(logits: Tensor<3>, targets: Tensor<2, Int>) -> Tensor<1> {
    let [b, t, v] = logits.dims();
    kernels::cross_entropy(logits.reshape([b * t, v]), targets.reshape([b * t]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{Device, TensorData};

    /// Positions appended in steps of 1 to 40 tokens, past several chunks of capacity, come
    /// back in order, and a copy of the cache taken midway keeps what it had.
    #[test]
    fn the_kv_cache_returns_every_position_in_order_across_growth() {
        let device = Device::flex();
        let [b, h, d] = [2, 3, 4];
        let step = |first: usize, n: usize, sign: f32| {
            let values: Vec<f32> = (0..b * h * n * d).map(|i| sign * (first * 1000 + i) as f32).collect();
            Tensor::<4>::from_data(TensorData::new(values, [b, h, n, d]), &device)
        };
        let mut cache = KvCache::new();
        let (mut want_k, mut want_v) = (Vec::new(), Vec::new());
        let mut copy = None;
        let mut pos = 0;
        for (i, n) in [7, 1, 1, 40, 1, 250, 3, 300, 1].into_iter().enumerate() {
            let (k, v) = (step(pos, n, 1.0), step(pos, n, -1.0));
            want_k.push(k.clone());
            want_v.push(v.clone());
            let (got_k, got_v) = cache.extend(0, k, v);
            pos += n;
            assert_eq!(got_k.dims(), [b, h, pos, d]);
            assert_eq!(got_k.into_data(), Tensor::cat(want_k.clone(), 2).into_data(), "keys after step {i}");
            assert_eq!(got_v.into_data(), Tensor::cat(want_v.clone(), 2).into_data(), "values after step {i}");
            if i == 4 {
                copy = Some((cache.clone(), pos, Tensor::cat(want_k.clone(), 2)));
            }
        }
        // The copy continues from where it was taken, and the original is untouched by it.
        let (mut copy, at, then) = copy.unwrap();
        let (k, _) = copy.extend(0, step(9999, 1, 1.0), step(9999, 1, -1.0));
        assert_eq!(k.dims(), [b, h, at + 1, d]);
        assert_eq!(k.into_data(), Tensor::cat(vec![then, step(9999, 1, 1.0)], 2).into_data(), "the copy saw the original's later steps");
        let (k, _) = cache.extend(0, step(pos, 1, 1.0), step(pos, 1, -1.0));
        want_k.push(step(pos, 1, 1.0));
        assert_eq!(k.into_data(), Tensor::cat(want_k, 2).into_data(), "the copy's step reached the original");
    }
}
