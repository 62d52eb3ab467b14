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
//!
//! Long caches with few queries (batch 1, a few heads: fewer cubes than the GPU has
//! multiprocessors) split each query's keys into ranges ([`splits`]), a cube per range, each
//! writing its range's maximum, sum and unnormalised values; a second launch weighs the ranges
//! by `e^(m_range - m)` and divides (flash-decoding). Short caches keep one launch.

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
static SPLIT: AtomicUsize = AtomicUsize::new(0);

/// Calls in this process (tests prove a path took the kernel).
pub fn calls() -> usize {
    CALLS.load(Ordering::Relaxed)
}

/// Calls in this process that split the keys into ranges.
pub fn split_calls() -> usize {
    SPLIT.load(Ordering::Relaxed)
}

impl DecodeAttention for CubeBackend {
    fn bl_gpu_decode_attention(q: CubeTensor, k: CubeTensor, v: CubeTensor, scale: f32, q_offset: usize, window: usize) -> CubeTensor {
        CALLS.fetch_add(1, Ordering::Relaxed);
        let [b, h, t, dh] = [0, 1, 2, 3].map(|i| q.meta.shape()[i]);
        let keys = k.meta.shape()[2];
        let z = empty_device_dtype(q.client.clone(), q.device.clone(), [b, t, h, dh].into(), DType::F32);
        let rows = b * h * t;
        if rows == 0 || keys == 0 {
            return z;
        }
        let client = q.client.clone();
        // A window bounds the keys a query sees, whatever the cache holds.
        let seen = if window > 0 { keys.min(window + t) } else { keys };
        let parts = splits(rows, seen, multiprocessors(&client));
        let mask = [q_offset as u32, window as u32];
        let (q, k, v) = (q.into_tensor_arg(), k.into_tensor_arg(), v.into_tensor_arg());
        let (units, whole) = (CubeDim::new_1d(UNITS), parts == 1);
        let count = |n: usize| CubeCount::Static(n.min(GRID_LIMIT) as u32, 1, 1);
        let arg = |t: &CubeTensor, len: usize| unsafe { BufferArg::from_raw_parts(t.handle.clone(), len) };
        if whole {
            decode_rows::launch(&client, count(rows), units, q, k, v, arg(&z, rows * dh), rows as u32, 1, scale, mask[0], mask[1], dh as u32, false);
            return z;
        }
        SPLIT.fetch_add(1, Ordering::Relaxed);
        // Each range's unnormalised values, then its maximum and sum: `dh + 2` values.
        let len = rows * parts * (dh + 2);
        let ranges = empty_device_dtype(client.clone(), z.device.clone(), [len].into(), DType::F32);
        let work = rows * parts;
        #[rustfmt::skip]
        decode_rows::launch(&client, count(work), units, q, k, v, arg(&ranges, len), work as u32, parts as u32, scale, mask[0], mask[1], dh as u32, true);
        let shape = [h as u32, t as u32];
        #[rustfmt::skip]
        combine_ranges::launch(&client, count(rows), CubeDim::new_1d(dh as u32), arg(&ranges, len), arg(&z, rows * dh), rows as u32, parts as u32, shape[0], shape[1], dh as u32);
        z
    }
}

/// Keys a range holds at least: two tiles, so a range's cube is never mostly setting up.
const KEYS_PER_RANGE: usize = 2 * UNITS as usize;

/// The most ranges a query's keys are split into.
const MAX_RANGES: usize = 32;

/// Into how many ranges each of `rows` queries splits its `keys` on a device of
/// `multiprocessors`: enough cubes for two a multiprocessor, each range at least
/// [`KEYS_PER_RANGE`] keys, at most [`MAX_RANGES`]; 1 (one launch) where the rows alone fill
/// the device or the keys are few.
pub fn splits(rows: usize, keys: usize, multiprocessors: usize) -> usize {
    let wanted = (2 * multiprocessors).div_ceil(rows.max(1));
    wanted.min(keys.div_ceil(KEYS_PER_RANGE)).clamp(1, MAX_RANGES)
}

/// The device's multiprocessors (CUDA says; wgpu does not: 64 assumed, a mid-sized GPU).
fn multiprocessors(client: &cubecl::client::Client) -> usize {
    client.properties().hardware.num_streaming_multiprocessors.unwrap_or(64) as usize
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

/// Work items `CUBE_POS_X, CUBE_POS_X + CUBE_COUNT_X, …` of `[batch, heads, queries, parts]`:
/// a query's `z` where `parts` is 1 and not `partial`; where `partial`, the `part`-th of its keys'
/// `parts` ranges, written to `out` as the range's unnormalised values, maximum and sum
/// (`dh + 2` values, [`combine_ranges`] reads them). See the module's note.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn decode_rows(
    q: &Tensor<f32>,
    k: &Tensor<f32>,
    v: &Tensor<f32>,
    out: &mut [f32],
    work: u32,
    parts: u32,
    scale: f32,
    q_offset: u32,
    window: u32,
    #[comptime] dh: u32,
    #[comptime] partial: bool,
) {
    let mut probs = Shared::<[f32]>::new_slice(comptime!(UNITS as usize));
    let mut fold = Shared::<[f32]>::new_slice(comptime!(UNITS as usize));
    // Groups of `dh` units sum the values, each a share of a tile's keys.
    let groups = comptime!(UNITS / dh);
    let per_group = comptime!(UNITS.div_ceil(UNITS / dh));
    let (group, col) = (UNIT_POS / dh, UNIT_POS % dh);
    let (h, t) = (q.shape(1), q.shape(2));
    let keys = k.shape(2) as u32;
    let mut item = CUBE_POS_X;
    while item < work {
        let (row, part) = (item / parts, item % parts);
        let r = row as usize;
        let (i, head, batch) = (r % t, (r / t) % h, r / (t * h));
        let kv = head / (h / k.shape(1));
        let qb = batch * q.stride(0) + head * q.stride(1) + i * q.stride(2);
        let kb = batch * k.stride(0) + kv * k.stride(1);
        let vb = batch * v.stride(0) + kv * v.stride(1);
        let (lo, hi) = part_of_keys(q_offset + i as u32 + 1, keys, window, parts, part);
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
            let mut sum = 0.0f32;
            if group < groups {
                #[unroll]
                for n in 0..per_group {
                    let u = group + n * groups;
                    if u < UNITS && start + u < hi {
                        sum += probs[u as usize] * v[vb + (start + u) as usize * v.stride(2) + col as usize * v.stride(3)];
                    }
                }
            }
            acc = acc * rescale + sum;
            m = m_new;
            // Every unit has read this tile's `probs` before the next tile writes them.
            sync_cube();
            start += UNITS;
        }
        store(out, &mut fold, acc, (m, l), item as usize, (batch * t + i) * h + head, dh, partial);
        item += CUBE_COUNT_X;
    }
}

/// The keys `lo..hi` (returned) that the query at position `seen - 1` sees among `keys` (the
/// last `window` where `window > 0`), narrowed to the `part`-th of `parts` equal shares.
#[cube]
fn part_of_keys(seen: u32, keys: u32, window: u32, parts: u32, part: u32) -> (u32, u32) {
    let mut hi = u32::min(seen, keys);
    let mut lo = 0u32;
    if window > 0u32 && seen > window {
        lo = u32::min(seen - window, hi);
    }
    let share = (hi - lo).div_ceil(parts);
    lo = u32::min(lo + part * share, hi);
    hi = u32::min(lo + share, hi);
    (lo, hi)
}

/// A work item's end: the units' shares of the weighted values `acc` added by column over
/// the groups (in `fold`), then written with the running maximum and sum `(m, l)` as the
/// `item`-th range (`partial`), or divided by `l` as `z`'s row `z_row`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn store(out: &mut [f32], fold: &mut Shared<[f32]>, acc: f32, running: (f32, f32), item: usize, z_row: usize, #[comptime] dh: u32, #[comptime] partial: bool) {
    let (m, l) = running;
    let groups = comptime!(UNITS / dh);
    fold[UNIT_POS as usize] = acc;
    sync_cube();
    if UNIT_POS < dh {
        let col = UNIT_POS;
        let mut total = 0.0f32;
        for g in 0..groups {
            total += fold[(g * dh + col) as usize];
        }
        if partial {
            let base = item * (dh as usize + 2);
            out[base + col as usize] = total;
            if UNIT_POS == 0u32 {
                out[base + dh as usize] = m;
                out[base + dh as usize + 1] = l;
            }
        } else {
            out[z_row * dh as usize + col as usize] = total / l;
        }
    }
    sync_cube();
}

/// Rows `CUBE_POS_X, + CUBE_COUNT_X, …` of `[batch, heads, queries]` (`h` heads, `t`
/// queries): the query's `z` from its `parts` ranges ([`decode_rows`]' partial output), each
/// weighted by `e^(m_range - m)` for the largest maximum `m`, a unit per column.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn combine_ranges(ranges: &[f32], z: &mut [f32], rows: u32, parts: u32, h: u32, t: u32, #[comptime] dh: u32) {
    let width = comptime!(dh + 2);
    let col = UNIT_POS;
    let mut row = CUBE_POS_X;
    while row < rows {
        let (i, head, batch) = (row % t, (row / t) % h, row / (t * h));
        let first = row * parts;
        let mut m = f32::min_value();
        for s in 0..parts {
            m = f32::max(m, ranges[((first + s) * width + dh) as usize]);
        }
        let mut l = 0.0f32;
        let mut total = 0.0f32;
        for s in 0..parts {
            let base = ((first + s) * width) as usize;
            let weight = f32::exp(ranges[base + dh as usize] - m);
            l += ranges[base + dh as usize + 1] * weight;
            total += ranges[base + col as usize] * weight;
        }
        z[(((batch * t + i) * h + head) * dh + col) as usize] = total / l;
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

#[cfg(test)]
mod tests {
    use super::splits;

    /// A batch-1 decode over a long cache splits; short caches, rows that fill the device and
    /// the cap keep to their bounds.
    #[test]
    fn long_caches_with_few_rows_split_their_keys() {
        // GPT-2 small decoding (12 heads) over 192 keys: one launch.
        assert_eq!(splits(12, 192, 132), 1);
        // Llama-8B-shaped (32 heads) over 8,192 keys on 132 multiprocessors: 9 ranges of 911.
        assert_eq!(splits(32, 8192, 132), 9);
        // A batch of 64 already fills it.
        assert_eq!(splits(64 * 12, 8192, 132), 1);
        // One head over a million keys: the cap.
        assert_eq!(splits(1, 1 << 20, 132), 32);
        // Keys set the floor: 600 keys make two ranges at most.
        assert_eq!(splits(1, 600, 132), 2);
    }
}
