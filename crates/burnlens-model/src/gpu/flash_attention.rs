//! A prompt's causal attention on a GPU in one launch, in f32 arithmetic: cubek's flash
//! attention on its unit routine (each unit multiplies and adds f32 values: no tensor cores,
//! so no TF32), through burn-cubecl's `flash_attention` with that routine named — Burn's own
//! `attention` autotunes over the tensor-core routine too, which rounds f32 to TF32. Where
//! the written-out path launches five kernels a layer and writes the `[batch, heads, queries,
//! keys]` scores and pattern to memory, this keeps a tile of keys and values on chip and a
//! running softmax per query. Inference only; the scale is cubek's `1/√d_head`, and queries
//! see the keys up to their own position (a prompt: as many queries as keys).

use std::sync::atomic::{AtomicUsize, Ordering};

use burn::backend::{Backend, backend_extension, tensor::FloatTensor};
use burn::tensor::{DType, Tensor};
use burn_cubecl::CubeBackend;
use burn_cubecl::kernel::attention::flash_attention;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use cubek::attention::forward::launch::{BlueprintStrategy, Strategy};

use super::exact_matmul::on_cube;

/// The extension that carries dispatch tensors to the kernel.
#[backend_extension(Cube, Fusion: cfg(feature = "fusion"))]
pub trait FlashAttention: Backend {
    /// `[batch, heads, queries, d_head]` from `q`, `k`, `v` of that shape, causal; `None`
    /// where cubek declines the shapes on this device.
    #[fusion(dtype = q, shape = q.clone())]
    fn bl_gpu_flash_attention(q: FloatTensor<Self>, k: FloatTensor<Self>, v: FloatTensor<Self>) -> FloatTensor<Self>;
}

static CALLS: AtomicUsize = AtomicUsize::new(0);
static DECLINED: AtomicUsize = AtomicUsize::new(0);

/// Calls in this process that ran the kernel.
pub fn calls() -> usize {
    CALLS.load(Ordering::Relaxed)
}

impl FlashAttention for CubeBackend {
    fn bl_gpu_flash_attention(q: CubeTensor, k: CubeTensor, v: CubeTensor) -> CubeTensor {
        let [q, k, v] = [q, k, v].map(into_contiguous);
        let options = burn::tensor::ops::AttentionModuleOptions { scale: None, softcap: None, is_causal: true };
        let unit = || Strategy::Unit(BlueprintStrategy::Inferred(()));
        match flash_attention(q.clone(), k.clone(), v.clone(), None, None, options, unit()) {
            Ok(z) => {
                CALLS.fetch_add(1, Ordering::Relaxed);
                z
            }
            // Declined here (a head width its tiles do not divide, a device without plane
            // operations): Burn's composed attention, in f32 (its products are cubek's unit
            // matmul only where asked; the fallback's are Burn's own: kept for shapes the
            // caller's checks let through by mistake, counted so tests see it).
            Err(_) => {
                DECLINED.fetch_add(1, Ordering::Relaxed);
                burn::backend::ops::attention::attention_fallback::<CubeBackend>(q, k, v, None, None, options)
            }
        }
    }
}

/// Calls in this process that cubek declined.
pub fn declined() -> usize {
    DECLINED.load(Ordering::Relaxed)
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

/// See [`super::flash_attention`].
pub fn flash_attention_causal(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, scale: f32) -> Option<Tensor<4>> {
    if !applies(&q, &k, &v, scale) {
        return None;
    }
    let z = <burn::backend::Dispatch as FlashAttention>::bl_gpu_flash_attention(q.into_dispatch(), k.into_dispatch(), v.into_dispatch());
    Some(Tensor::from_dispatch(z))
}
