//! Attention for a few new queries over the keys and values before them (decoding with a KV
//! cache) on a GPU in one launch, where the written-out path launches five a layer (the
//! scores' product and the copy of the keys it reads, the pattern, the values' product, the
//! copy of `z` into rows) and writes the scores and the pattern out.
//!
//! A cube of 256 units per query of a head: the keys in tiles of 256, a unit scoring one key
//! (`scale · q·k`, the dot product unrolled over the head's width), the tile's maximum and sum
//! over the cube ([`super::cube_reduce`]), the softmax kept running across tiles (each tile
//! rescales what came before by `e^(m - m')`), and the values summed by groups of `d_head`
//! units, each group a share of the tile's keys, the groups' sums added at the end. Keys and
//! values are read where they lie (the cache's buffers, any strides), a query head reading
//! the key head of its group (grouped-query attention without repeating them). Inference
//! only: no autodiff. Same masking as [`crate::kernels::attention`]'s `AttentionMask`: the
//! query at position `q_offset + i` sees the keys up to its own, and only the last `window`
//! of them where `window > 0`.

use std::sync::atomic::{AtomicUsize, Ordering};

use burn::backend::{Backend, backend_extension, tensor::FloatTensor};
use burn::tensor::DType;
use burn_cubecl::CubeBackend;
use burn_cubecl::ops::numeric::empty_device_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::cube_reduce::{cube_max, cube_sum};
use super::exact_matmul::on_cube;
use super::grid::GRID_LIMIT;

/// Units per cube, and keys per tile.
const UNITS: u32 = 256;

/// The most new queries a call takes: past a few, each query's cube rereading every key costs
/// more than the products' tiling saves (a prompt's prefill takes the written-out path).
pub const MAX_QUERIES: usize = 8;

/// The extension that carries dispatch tensors to the kernel.
#[backend_extension(Cube, Fusion: cfg(feature = "fusion"))]
pub trait DecodeAttention: Backend {
    /// `z: [batch, queries, heads, d_head]` (rows of the output projection's input) from
    /// `q: [batch, heads, queries, d_head]` and `k`, `v: [batch, kv_heads, keys, d_head]`.
    #[fusion(dtype = q, shape = burn::tensor::Shape::new([q[0], q[2], q[1], q[3]]))]
    fn bl_gpu_decode_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        scale: f32,
        q_offset: usize,
        window: usize,
    ) -> FloatTensor<Self>;
}

static CALLS: AtomicUsize = AtomicUsize::new(0);

/// Launches of the kernel in this process (tests prove a path took it).
pub fn calls() -> usize {
    CALLS.load(Ordering::Relaxed)
}

impl DecodeAttention for CubeBackend {
    fn bl_gpu_decode_attention(q: CubeTensor, k: CubeTensor, v: CubeTensor, scale: f32, q_offset: usize, window: usize) -> CubeTensor {
        CALLS.fetch_add(1, Ordering::Relaxed);
        let [b, h, t, dh] = [0, 1, 2, 3].map(|i| q.meta.shape()[i]);
        let z = empty_device_dtype(q.client.clone(), q.device.clone(), [b, t, h, dh].into(), DType::F32);
        let rows = b * h * t;
        if rows == 0 || k.meta.shape()[2] == 0 {
            return z;
        }
        let client = q.client.clone();
        let out = unsafe { BufferArg::from_raw_parts(z.handle.clone(), rows * dh) };
        let count = CubeCount::Static(rows.min(GRID_LIMIT) as u32, 1, 1);
        let mask = [q_offset as u32, window as u32];
        let (q, k, v) = (q.into_tensor_arg(), k.into_tensor_arg(), v.into_tensor_arg());
        decode_rows::launch(&client, count, CubeDim::new_1d(UNITS), q, k, v, out, rows as u32, scale, mask[0], mask[1], dh as u32);
        z
    }
}

/// Whether the kernel takes these tensors: plain (untracked) f32 on a `Cube` device, at most
/// [`MAX_QUERIES`] queries, heads of at most [`UNITS`] values, a whole number of query heads
/// per key head, keys and values of one shape.
pub fn applies(q: &burn::tensor::Tensor<4>, k: &burn::tensor::Tensor<4>, v: &burn::tensor::Tensor<4>) -> bool {
    let ([_, h, t, dh], kd) = (q.dims(), k.dims());
    let shapes =
        t <= MAX_QUERIES && (1..=UNITS as usize).contains(&dh) && kd[1] >= 1 && h % kd[1] == 0 && kd[3] == dh && v.dims() == kd && kd[0] == q.dims()[0];
    let plain = [q, k, v].iter().all(|x| x.dtype() == DType::F32 && !x.device().is_autodiff() && on_cube(&x.device()));
    shapes && plain && k.shape().num_elements() < u32::MAX as usize
}

/// See [`super::decode_attention`].
pub fn decode_attention(
    q: burn::tensor::Tensor<4>,
    k: burn::tensor::Tensor<4>,
    v: burn::tensor::Tensor<4>,
    scale: f32,
    q_offset: usize,
    window: usize,
) -> Option<burn::tensor::Tensor<4>> {
    if !applies(&q, &k, &v) {
        return None;
    }
    let z =
        <burn::backend::Dispatch as DecodeAttention>::bl_gpu_decode_attention(q.into_dispatch(), k.into_dispatch(), v.into_dispatch(), scale, q_offset, window);
    Some(burn::tensor::Tensor::from_dispatch(z))
}

/// Rows `CUBE_POS_X, CUBE_POS_X + CUBE_COUNT_X, …` of `[batch, heads, queries]`, each one
/// query's `z` (see the module's note).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn decode_rows(q: &Tensor<f32>, k: &Tensor<f32>, v: &Tensor<f32>, z: &mut [f32], rows: u32, scale: f32, q_offset: u32, window: u32, #[comptime] dh: u32) {
    let mut probs = Shared::<[f32]>::new_slice(comptime!(UNITS as usize));
    let mut fold = Shared::<[f32]>::new_slice(comptime!(UNITS as usize));
    // Groups of `dh` units sum the values, each a share of a tile's keys.
    let groups = comptime!(UNITS / dh);
    let per_group = comptime!(UNITS.div_ceil(UNITS / dh));
    let (group, col) = (UNIT_POS / dh, UNIT_POS % dh);
    let (h, t) = (q.shape(1), q.shape(2));
    let keys = k.shape(2) as u32;
    let mut row = CUBE_POS_X;
    while row < rows {
        let r = row as usize;
        let (i, head, batch) = (r % t, (r / t) % h, r / (t * h));
        let kv = head / (h / k.shape(1));
        let qb = batch * q.stride(0) + head * q.stride(1) + i * q.stride(2);
        let kb = batch * k.stride(0) + kv * k.stride(1);
        let vb = batch * v.stride(0) + kv * v.stride(1);
        // The keys `lo..hi` are seen.
        let seen = q_offset + i as u32 + 1;
        let hi = u32::min(seen, keys);
        let mut lo = 0u32;
        if window > 0u32 && seen > window {
            lo = u32::min(seen - window, hi);
        }
        // The running maximum, sum and (this unit's share of) the weighted values.
        let mut m = f32::min_value();
        let mut l = 0.0f32;
        let mut acc = 0.0f32;
        let mut start = lo;
        while start < hi {
            let j = start + UNIT_POS;
            let mut score = f32::min_value();
            if j < hi {
                score = scale * dot(q, k, qb, kb + j as usize * k.stride(2), dh);
            }
            let m_new = f32::max(m, cube_max(score, &mut fold));
            let mut p = 0.0f32;
            if j < hi {
                p = f32::exp(score - m_new);
            }
            probs[UNIT_POS as usize] = p;
            // The sum's barriers also make every unit's `p` visible.
            let tile_sum = cube_sum(p, &mut fold);
            let rescale = f32::exp(m - m_new);
            l = l * rescale + tile_sum;
            let mut part = 0.0f32;
            if group < groups {
                #[unroll]
                for n in 0..per_group {
                    let u = group + n * groups;
                    if u < UNITS && start + u < hi {
                        part += probs[u as usize] * v[vb + (start + u) as usize * v.stride(2) + col as usize * v.stride(3)];
                    }
                }
            }
            acc = acc * rescale + part;
            m = m_new;
            // Every unit has read this tile's `probs` before the next tile writes them.
            sync_cube();
            start += UNITS;
        }
        // The groups' sums added, each column by its first group's unit.
        fold[UNIT_POS as usize] = acc;
        sync_cube();
        if UNIT_POS < dh {
            let mut total = 0.0f32;
            for g in 0..groups {
                total += fold[(g * dh + col) as usize];
            }
            z[((batch * t + i) * h + head) * dh as usize + col as usize] = total / l;
        }
        sync_cube();
        row += CUBE_COUNT_X;
    }
}

/// `q·k` for the query at `qb` and the key at `kb` (their first values' indices), over `dh`
/// values (unrolled: every load issued before the sums wait on them).
#[cube]
fn dot(q: &Tensor<f32>, k: &Tensor<f32>, qb: usize, kb: usize, #[comptime] dh: u32) -> f32 {
    let mut sum = 0.0f32;
    #[unroll]
    for d in 0..dh {
        sum += q[qb + d as usize * q.stride(3)] * k[kb + d as usize * k.stride(3)];
    }
    sum
}
