//! One Adam step of a parameter on a GPU in one element-wise launch — its moments and its
//! new value — where the composed step launches a kernel per operation (thirteen to fifteen a
//! parameter a step: SAELens's Adam on an SAE's four parameters, nanoGPT's AdamW on every
//! matrix, bias and gain of a model). Each unit does, for its elements, exactly the
//! operations of the composed step in the same order and in f32 (the rule's coefficients
//! rounded to f32 as Burn rounds a scalar), so the two agree to the last bit where the
//! device's division and square root are correctly rounded. The gradient is multiplied by a
//! one-element device tensor first (global-norm clipping's factor, computed on the device:
//! no read-back in the step).

use burn::backend::{Backend, backend_extension, tensor::FloatTensor};
use burn::tensor::{DType, Tensor};
use burn_cubecl::CubeBackend;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::adam_rule::AdamRule;
use super::exact_matmul::on_cube;
use super::grid::GRID_LIMIT;

/// Units per cube.
const UNITS: u32 = 256;

/// The extension that carries dispatch tensors to the kernel.
#[backend_extension(Cube, Fusion: cfg(feature = "fusion"))]
pub trait AdamStep: Backend {
    /// The new `(p, m, v)` from the parameter `p`, its moments `m`, `v` and its gradient `g`
    /// (times `clip[0]` where `clipped`; `clip` is not read otherwise) by `rule`.
    #[fusion(meta = adam_meta)]
    #[allow(clippy::too_many_arguments)]
    fn bl_gpu_adam_step(
        p: FloatTensor<Self>,
        m: FloatTensor<Self>,
        v: FloatTensor<Self>,
        g: FloatTensor<Self>,
        clip: FloatTensor<Self>,
        clipped: bool,
        rule: AdamRule,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);
}

/// The outputs' metadata: three tensors shaped like the parameter.
#[cfg(feature = "fusion")]
fn adam_meta<T: Clone>(p: &T, _m: &T, _v: &T, _g: &T, _clip: &T, _clipped: &bool, _rule: &AdamRule) -> (T, T, T) {
    (p.clone(), p.clone(), p.clone())
}

impl AdamStep for CubeBackend {
    fn bl_gpu_adam_step(
        p: CubeTensor,
        m: CubeTensor,
        v: CubeTensor,
        g: CubeTensor,
        clip: CubeTensor,
        clipped: bool,
        rule: AdamRule,
    ) -> (CubeTensor, CubeTensor, CubeTensor) {
        let [p, m, v, g, clip] = [p, m, v, g, clip].map(into_contiguous);
        let n = p.meta.shape().num_elements();
        let client = p.client.clone();
        let out = || empty_device_dtype(client.clone(), p.device.clone(), p.meta.shape().clone(), DType::F32);
        let (p2, m2, v2) = (out(), out(), out());
        if n == 0 {
            return (p2, m2, v2);
        }
        let arg = |t: &CubeTensor, len: usize| unsafe { BufferArg::from_raw_parts(t.handle.clone(), len) };
        let cubes = n.div_ceil(UNITS as usize).min(GRID_LIMIT) as u32;
        let (torch, c) = coefficients(rule);
        let count = CubeCount::Static(cubes, 1, 1);
        let tensors = (arg(&p, n), arg(&m, n), arg(&v, n), arg(&g, n), arg(&clip, 1));
        let outputs = (arg(&p2, n), arg(&m2, n), arg(&v2, n));
        let (t, o) = (tensors, outputs);
        #[rustfmt::skip]
        adam_elements::launch(&client, count, CubeDim::new_1d(UNITS), t.0, t.1, t.2, t.3, t.4, o.0, o.1, o.2, n as u32, c.a, c.b, c.c, c.d, c.e, c.f, c.g, c.h, c.i, clipped, torch);
        (p2, m2, v2)
    }
}

/// The kernel's coefficients for `rule` (see [`adam_elements`]) and whether it is torch's.
fn coefficients(rule: AdamRule) -> (bool, Coefficients) {
    match rule {
        AdamRule::Torch { one_minus_beta1, beta2, one_minus_beta2, correction2_sqrt, epsilon, step_size } => {
            (true, Coefficients { a: one_minus_beta1, b: beta2, c: one_minus_beta2, d: correction2_sqrt, e: epsilon, f: step_size, ..Coefficients::default() })
        }
        AdamRule::BurnW { beta1, one_minus_beta1, beta2, one_minus_beta2, correction1, correction2, epsilon, lr, keep } => {
            (false, Coefficients { a: beta1, b: one_minus_beta1, c: beta2, d: one_minus_beta2, e: correction1, f: correction2, g: epsilon, h: lr, i: keep })
        }
    }
}

/// Whether the kernel takes the step: parameter, moments and gradient of one shape, plain f32
/// on a `Cube` device, and a one-element factor there.
pub fn applies<const D: usize>(p: &Tensor<D>, m: &Tensor<D>, v: &Tensor<D>, g: &Tensor<D>, clip: Option<&Tensor<1>>) -> bool {
    let same = p.dims() == m.dims() && m.dims() == v.dims() && v.dims() == g.dims();
    let plain = [p, m, v, g].iter().all(|t| t.dtype() == DType::F32 && !t.device().is_autodiff() && on_cube(&t.device()));
    let clip = clip.is_none_or(|c| c.dims() == [1] && c.dtype() == DType::F32 && c.device() == p.device());
    same && plain && clip && p.shape().num_elements() < u32::MAX as usize
}

/// See [`super::adam_step`].
pub fn adam_step<const D: usize>(
    p: Tensor<D>,
    m: Tensor<D>,
    v: Tensor<D>,
    g: Tensor<D>,
    clip: Option<Tensor<1>>,
    rule: AdamRule,
) -> Option<(Tensor<D>, Tensor<D>, Tensor<D>)> {
    if !applies(&p, &m, &v, &g, clip.as_ref()) {
        return None;
    }
    let dims = p.dims();
    let flat = |t: Tensor<D>| t.reshape([dims.iter().product::<usize>()]);
    let clipped = clip.is_some();
    // Without a factor the kernel reads none: the parameter stands in for the argument.
    let clip = clip.unwrap_or_else(|| flat(p.clone())).into_dispatch();
    let [p, m, v, g] = [p, m, v, g].map(|t| flat(t).into_dispatch());
    let (p, m, v) = <burn::backend::Dispatch as AdamStep>::bl_gpu_adam_step(p, m, v, g, clip, clipped, rule);
    let back = |t| Tensor::<1>::from_dispatch(t).reshape(dims);
    Some((back(p), back(m), back(v)))
}

/// A rule's coefficients, by position (see [`coefficients`]).
#[derive(Debug, Clone, Copy, Default)]
struct Coefficients {
    a: f32,
    b: f32,
    c: f32,
    d: f32,
    e: f32,
    f: f32,
    g: f32,
    h: f32,
    i: f32,
}

/// Elements `ABSOLUTE_POS_X, + the grid's units, …` of the step, `g ← g · clip[0]` first where
/// `clipped` (`g · 1 = g`: the unclipped step's values), with
/// the coefficients `k = [k1, …, k9]` ([`Coefficients`]' fields in order).
/// Torch's (`torch`): `m' = m + (g - m) k1`, `v' = v k2 + g g k3`, `p' = p - m' / (√v' / k4 + k5) · k6`.
/// Burn's AdamW: `m' = m k1 + g k2`, `v' = v k3 + g g k4`, `p' = p k9 - (m' / k5) / (√(v' / k6) + k7) · k8`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn adam_elements(
    p: &[f32],
    m: &[f32],
    v: &[f32],
    g: &[f32],
    clip: &[f32],
    p2: &mut [f32],
    m2: &mut [f32],
    v2: &mut [f32],
    n: u32,
    k1: f32,
    k2: f32,
    k3: f32,
    k4: f32,
    k5: f32,
    k6: f32,
    k7: f32,
    k8: f32,
    k9: f32,
    #[comptime] clipped: bool,
    #[comptime] torch: bool,
) {
    let stride = CUBE_COUNT_X * 256u32;
    let mut factor = 1.0f32;
    if clipped {
        factor = clip[0usize];
    }
    let mut i = ABSOLUTE_POS_X;
    while i < n {
        let k = i as usize;
        let grad = g[k] * factor;
        if torch {
            let mk = m[k] + (grad - m[k]) * k1;
            let vk = v[k] * k2 + grad * grad * k3;
            let denom = f32::sqrt(vk) / k4 + k5;
            p2[k] = p[k] - mk / denom * k6;
            m2[k] = mk;
            v2[k] = vk;
        } else {
            let mk = m[k] * k1 + grad * k2;
            let vk = v[k] * k3 + grad * grad * k4;
            let delta = mk / k5 / (f32::sqrt(vk / k6) + k7);
            p2[k] = p[k] * k9 - delta * k8;
            m2[k] = mk;
            v2[k] = vk;
        }
        i += stride;
    }
}
