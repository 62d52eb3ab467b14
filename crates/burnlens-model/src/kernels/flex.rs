//! What every kernel stands on: the per-kernel call counters ([`Op`], [`calls`]), the
//! `BURNLENS_KERNELS` switch ([`enabled`], [`set_enabled`]), the test of whether a call may
//! take a kernel ([`use_kernels`]) and the flex tensor helpers the kernels share.

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

use burn::backend::DispatchDevice;
use burn::backend::flex::{FlexTensor, Layout};
use burn::tensor::{Bytes, DType, Device, Shape};

/// The kernels, for call counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Linear,
    Attention,
    LayerNorm,
    Activation,
    CrossEntropy,
    Softmax,
    Embedding,
}

impl Op {
    pub const ALL: [Op; 7] = [Op::Linear, Op::Attention, Op::LayerNorm, Op::Activation, Op::CrossEntropy, Op::Softmax, Op::Embedding];
}

static CALLS: [[AtomicUsize; 2]; Op::ALL.len()] = [const { [const { AtomicUsize::new(0) }; 2] }; Op::ALL.len()];

/// Count one forward (or backward) run of `op`.
pub(crate) fn record(op: Op, backward: bool) {
    CALLS[op as usize][backward as usize].fetch_add(1, Ordering::Relaxed);
}

/// How many times `op` ran in this process: `(forward, backward)`. Tests use it to prove a
/// path went through a kernel.
pub fn calls(op: Op) -> (usize, usize) {
    let c = &CALLS[op as usize];
    (c[0].load(Ordering::Relaxed), c[1].load(Ordering::Relaxed))
}

static ENABLED: AtomicU8 = AtomicU8::new(0); // 0: not read yet, 1: on, 2: off

/// Whether the kernels are used where they apply (default: yes; `BURNLENS_KERNELS=0`: no).
pub fn enabled() -> bool {
    match ENABLED.load(Ordering::Relaxed) {
        1 => true,
        2 => false,
        _ => {
            let on = !matches!(std::env::var("BURNLENS_KERNELS").as_deref(), Ok("0") | Ok("off") | Ok("false"));
            ENABLED.store(if on { 1 } else { 2 }, Ordering::Relaxed);
            on
        }
    }
}

/// Turn the kernels on or off for the whole process (the reference path when off).
pub fn set_enabled(on: bool) {
    ENABLED.store(if on { 1 } else { 2 }, Ordering::Relaxed);
}

/// Whether `device` runs on the flex backend (with or without autodiff).
pub fn is_flex(device: &Device) -> bool {
    matches!(device.clone().inner().as_dispatch(), DispatchDevice::Flex(_))
}

/// Whether burnlens's kernels run on `device` (kernels on, the flex backend): what a caller
/// choosing between a kernel and another backend's own fused op asks.
pub fn runs_on(device: &Device) -> bool {
    enabled() && is_flex(device)
}

/// Whether a kernel may run: kernels on, every tensor on flex and f32.
pub(crate) fn use_kernels(devices: &[&Device], dtypes: &[DType]) -> bool {
    let yes = enabled() && devices.iter().all(|d| is_flex(d)) && dtypes.iter().all(|t| *t == DType::F32);
    if yes {
        super::memory::keep_freed_memory();
    }
    yes
}

/// A contiguous f32 flex tensor whose `storage()` is exactly its elements in order.
pub(crate) fn contiguous(t: &FlexTensor) -> FlexTensor {
    assert_eq!(t.dtype(), DType::F32, "burnlens kernels take f32 tensors only");
    // Copies only when the layout is not already the whole buffer in row-major order.
    t.to_contiguous()
}

/// The whole buffer of `t`, to be written in place: `Some` only when `t` is f32, row-major
/// over all of its storage, and the only owner of it (a shared buffer is never written).
pub(crate) fn owned_f32(t: &mut FlexTensor) -> Option<&mut [f32]> {
    let n = t.layout().num_elements();
    let whole = t.dtype() == DType::F32 && t.is_contiguous() && t.layout().start_offset() == 0 && t.bytes().len() == n * 4;
    if whole { t.try_storage_mut::<f32>() } else { None }
}

/// `t` as an f32 tensor owning its whole buffer (for [`owned_f32`]): itself when it does,
/// else its contiguous copy (one copy: a strided view's is already its own).
pub(crate) fn owned(mut t: FlexTensor) -> FlexTensor {
    if owned_f32(&mut t).is_some() {
        return t;
    }
    let mut c = contiguous(&t);
    drop(t);
    if owned_f32(&mut c).is_some() {
        return c;
    }
    flex_vec(c.storage::<f32>().to_vec(), c.layout().shape().clone())
}

/// The elements of an i64 or i32 flex tensor (`what` names it in the panic otherwise), in
/// row-major order, as indices.
pub(crate) fn indices(t: &FlexTensor, what: &str) -> Vec<usize> {
    let t = t.to_contiguous();
    match t.dtype() {
        DType::I64 => t.storage::<i64>().iter().map(|&v| v as usize).collect(),
        DType::I32 => t.storage::<i32>().iter().map(|&v| v as usize).collect(),
        other => panic!("{what} must be i64 or i32, found {other:?}"),
    }
}

/// Wrap a vector as a contiguous f32 flex tensor of `shape`.
pub(crate) fn flex_vec(v: Vec<f32>, shape: Shape) -> FlexTensor {
    assert_eq!(v.len(), shape.num_elements());
    FlexTensor::new(Bytes::from_elems(v), Layout::contiguous(shape), DType::F32)
}

/// Wrap a vector as an f32 flex tensor with an explicit layout (a permuted view of it).
pub(crate) fn flex_strided(v: Vec<f32>, shape: Shape, strides: Vec<isize>) -> FlexTensor {
    FlexTensor::new(Bytes::from_elems(v), Layout::new(shape, strides, 0), DType::F32)
}
