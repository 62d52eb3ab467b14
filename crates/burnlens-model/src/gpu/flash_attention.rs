//! A prompt's causal attention on a GPU in one launch, in f32 arithmetic: cubek's flash
//! attention on its unit routine (each unit multiplies and adds f32 values: no tensor cores,
//! so no TF32), launched with that routine named — Burn's own `attention` autotunes over
//! cubek's tensor-core routine too, which rounds f32 to TF32. Where the written-out path
//! launches five kernels a layer and writes the `[batch, heads, queries, keys]` scores and
//! pattern to memory, this keeps a tile of keys and values on chip and a running softmax per
//! query, reads the queries, keys and values where the projection left them (strided views)
//! and writes `z` as the output projection's rows (through a strided view of them): no
//! copies. Inference only; the scale is cubek's `1/√d_head`, and queries see the keys up to
//! their own position (a prompt: as many queries as keys).

use std::sync::atomic::{AtomicUsize, Ordering};

use burn::backend::{
    Backend, backend_extension,
    tensor::{BoolTensor, FloatTensor},
};
use burn::tensor::{Bool, DType, Tensor};
use burn_cubecl::CubeBackend;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::ir::{ElemType, FloatKind, UIntKind};
use cubek::attention::forward::definition::{AccumulatorPrecision, AttentionGlobalTypes, AttentionOptions};
use cubek::attention::forward::launch::{BlueprintStrategy, Strategy, launch_ref};

use super::exact_matmul::on_cube;

/// The extension that carries dispatch tensors to the kernel.
#[backend_extension(Cube, Fusion: cfg(feature = "fusion"))]
pub trait FlashAttention: Backend {
    /// `z: [batch, queries, heads, d_head]` (rows of the output projection's input) from `q`,
    /// `k`, `v: [batch, heads, pos, d_head]`, causal.
    #[fusion(dtype = q, shape = burn::tensor::Shape::new([q[0], q[2], q[1], q[3]]))]
    fn bl_gpu_flash_attention(q: FloatTensor<Self>, k: FloatTensor<Self>, v: FloatTensor<Self>) -> FloatTensor<Self>;

    /// The same, the keys `mask` (`[batch, heads, queries, keys]`, any strides) marks true
    /// hidden as well (a local window's).
    #[fusion(dtype = q, shape = burn::tensor::Shape::new([q[0], q[2], q[1], q[3]]))]
    fn bl_gpu_flash_attention_masked(q: FloatTensor<Self>, k: FloatTensor<Self>, v: FloatTensor<Self>, mask: BoolTensor<Self>) -> FloatTensor<Self>;
}

static CALLS: AtomicUsize = AtomicUsize::new(0);
static DECLINED: AtomicUsize = AtomicUsize::new(0);

/// Calls in this process that ran the kernel.
pub fn calls() -> usize {
    CALLS.load(Ordering::Relaxed)
}

/// Calls in this process that cubek declined (the composed attention took them).
pub fn declined() -> usize {
    DECLINED.load(Ordering::Relaxed)
}

impl FlashAttention for CubeBackend {
    fn bl_gpu_flash_attention(q: CubeTensor, k: CubeTensor, v: CubeTensor) -> CubeTensor {
        launch(q, k, v, None)
    }

    fn bl_gpu_flash_attention_masked(q: CubeTensor, k: CubeTensor, v: CubeTensor, mask: CubeTensor) -> CubeTensor {
        launch(q, k, v, Some(mask))
    }
}

/// The kernel on `q`, `k`, `v` (and `mask`): `z` as rows (see [`FlashAttention`]).
fn launch(q: CubeTensor, k: CubeTensor, v: CubeTensor, mask: Option<CubeTensor>) -> CubeTensor {
    // Read where they lie (views of the projection: heads split, dimensions swapped) where
    // each head's values are contiguous; copied otherwise.
    let [q, k, v] = [q, k, v].map(|t| if t.meta.strides()[3] == 1 { t } else { into_contiguous(t) });
    let [b, h, t, dh] = [0, 1, 2, 3].map(|i| q.meta.shape()[i]);
    // Written as rows `[b, t, h, dh]` through a `[b, h, t, dh]` view of them.
    let z = empty_device_dtype(q.client.clone(), q.device.clone(), [b, t, h, dh].into(), DType::F32);
    let f32_type = ElemType::Float(FloatKind::F32);
    // Without a mask its type is a placeholder (burn-cubecl's choice, `u8`).
    let mask_type = mask.as_ref().map_or(ElemType::UInt(UIntKind::U8), |m| burn::backend::cubecl::dtype_to_storage_type(m.dtype));
    let types = AttentionGlobalTypes { query: f32_type, key: f32_type, value: f32_type, mask: mask_type, out: f32_type };
    let options = AttentionOptions { causal: true, accumulator_precision: AccumulatorPrecision::Strict(f32_type) };
    let unit = Strategy::Unit(BlueprintStrategy::Inferred(()));
    let client = q.client.clone();
    let (qb, kb, vb, mb) = (q.clone().binding(), k.clone().binding(), v.clone().binding(), mask.clone().map(CubeTensor::binding));
    match launch_ref(unit, &client, qb, kb, vb, mb, swapped(z.clone()).binding(), &types, options) {
        Ok(()) => {
            CALLS.fetch_add(1, Ordering::Relaxed);
            z
        }
        // Declined here (a head width its tiles do not divide, a device without plane
        // operations: [`applies`] keeps such shapes away): Burn's composed attention, whose
        // products are Burn's own (TF32 on a GPU that has it), counted so tests see it.
        Err(_) => {
            DECLINED.fetch_add(1, Ordering::Relaxed);
            let options = burn::tensor::ops::AttentionModuleOptions { scale: None, softcap: None, is_causal: true };
            let z = burn::backend::ops::attention::attention_fallback::<CubeBackend>(q, k, v, mask, None, options);
            into_contiguous(swapped(z))
        }
    }
}

/// `t` with its dimensions 1 and 2 swapped (a view).
fn swapped(mut t: CubeTensor) -> CubeTensor {
    t.meta.swap(1, 2);
    t
}

/// Whether the kernel takes these tensors: plain (untracked) f32 on a `Cube` device, one
/// shape for all three (as many queries as keys), heads a multiple of 8 wide up to 256 (cubek
/// tiles a head by the vector width, 4 or fewer values for f32), and `scale` cubek's `1/√d_head`.
pub fn applies(q: &Tensor<4>, k: &Tensor<4>, v: &Tensor<4>, scale: f32) -> bool {
    let dh = q.dims()[3];
    let shapes = q.dims() == k.dims() && k.dims() == v.dims() && dh.is_multiple_of(8) && (8..=256).contains(&dh);
    let plain = [q, k, v].iter().all(|x| x.dtype() == DType::F32 && !x.device().is_autodiff() && on_cube(&x.device()));
    shapes && plain && scale == 1.0 / (dh as f32).sqrt()
}

/// See [`super::flash_attention`]: `mask` (`[batch or 1, 1, queries, keys]`, true where a key
/// is hidden), where given, hides keys besides the causal rule's.
pub fn flash_attention_causal(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, scale: f32, mask: Option<Tensor<4, Bool>>) -> Option<Tensor<4>> {
    let [b, h, t, _] = q.dims();
    let mask_fits = mask.as_ref().is_none_or(|m| {
        let [mb, mh, mt, ms] = m.dims();
        (mb == 1 || mb == b) && mh == 1 && mt == t && ms == t && m.device() == q.device()
    });
    if !mask_fits || !applies(&q, &k, &v, scale) {
        return None;
    }
    let (q, k, v) = (q.into_dispatch(), k.into_dispatch(), v.into_dispatch());
    let z = match mask {
        None => <burn::backend::Dispatch as FlashAttention>::bl_gpu_flash_attention(q, k, v),
        // Broadcast over the batch and heads (a view: strides of zero).
        Some(m) => <burn::backend::Dispatch as FlashAttention>::bl_gpu_flash_attention_masked(q, k, v, m.expand([b, h, t, t]).into_dispatch()),
    };
    Some(Tensor::from_dispatch(z))
}
