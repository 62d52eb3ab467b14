//! Fused causal (and local-window) attention, forward and backward, tiled over queries.
//!
//! Contract: `q: [batch, heads, queries, d_head]`, `k, v: [batch, kv_heads, keys, d_head]`
//! (`heads` a multiple of `kv_heads`: grouped-query attention shares one key/value head
//! among `heads / kv_heads` query heads), any strides with unit stride along `d_head` (so
//! the per-head views of a fused QKV projection are read in place), f32. Query `i` sits at
//! absolute position `q_offset + i` (cached generation passes the cache length), key `j` at
//! position `j`; key `j` is visible from query `i` iff `j <= q_offset + i` and, for a
//! local window `w`, `q_offset + i - j < w`. Output `softmax(q kᵀ · scale) v` as
//! `[batch, heads, queries, d_head]`, laid out in memory as `[batch, queries, heads,
//! d_head]` so that merging the heads afterwards is free. A query that sees no key gets
//! zeros.
//!
//! Work is split into blocks of [`BLOCK`] queries per (batch, head). Each block computes its
//! scores against only the keys some row of it can see, takes the softmax in place and
//! multiplies by `v`: the largest temporary is `BLOCK × keys` per thread, never the
//! `[heads, queries, keys]` pattern. In the forward, a block that sees more than
//! [`KEY_TILE`] keys goes through them one tile at a time with an online softmax, so that its
//! scores in flight stay 128 KB at any length (not `BLOCK × keys`: 8 MB per task at 32k). The forward keeps one log-sum-exp per query; the
//! backward recomputes each block's probabilities from it (as FlashAttention does) and
//! accumulates `dk`, `dv` per key/value head. Tolerance against the composed ops: 1e-5
//! relative (values), 1e-4 (gradients).

use crate::matmul::matmul;
use burn::backend::flex::FlexTensor;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Backend, Dispatch, Flex, backend_extension};
use burn::tensor::activation::softmax;
use burn::tensor::{Bool, Shape, Tensor, TensorData};
use std::sync::OnceLock;

use super::exp;
use super::flex::{flex_strided, use_kernels};
use super::gemm::{MatRef, matmul_single};
use super::packed::{Packed, matmul_packed_part};
use super::pool::{self, SendPtr};
use super::simd::{self, dispatch};
use super::unfilled::unfilled;

/// Queries per block.
pub const BLOCK: usize = 64;
/// Query rows per key/value head from which the forward packs `kᵀ` and `v` once.
const PACK_MIN_QUERIES: usize = 16;
/// Keys per tile where a block sees more keys than this (the forward at long sequences):
/// shorter blocks take the whole softmax at once, with no running rescale.
pub const KEY_TILE: usize = 512;

/// Which keys each query sees (always causal).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionMask {
    /// Absolute position of the first query (the number of cached keys before it).
    pub q_offset: usize,
    /// Local attention window, or `None` for every earlier position.
    pub window: Option<usize>,
}

impl AttentionMask {
    /// Plain causal attention over a sequence that starts at position 0.
    pub fn causal() -> Self {
        Self { q_offset: 0, window: None }
    }

    /// The keys `lo..hi` visible from query `i`, among `keys` keys.
    #[inline]
    fn visible(&self, i: usize, keys: usize) -> (usize, usize) {
        let p = self.q_offset + i;
        let hi = (p + 1).min(keys);
        let lo = self.window.map_or(0, |w| (p + 1).saturating_sub(w)).min(hi);
        (lo, hi)
    }
}

#[backend_extension(Flex, Autodiff)]
pub trait AttentionKernel: Backend {
    fn bl_attention(q: FloatTensor<Self>, k: FloatTensor<Self>, v: FloatTensor<Self>, scale: f64, q_offset: usize, window: usize) -> FloatTensor<Self>;
    fn bl_attention_qkv(qkv: FloatTensor<Self>, heads: [usize; 2], scale: f64, q_offset: usize, window: usize) -> FloatTensor<Self>;
}

/// `softmax(q kᵀ · scale + mask) v`: the fused kernel on flex, composed ops elsewhere.
/// Shapes as in the module documentation.
pub fn attention(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, scale: f64, mask: AttentionMask) -> Tensor<4> {
    if use_kernels(&[&q.device(), &k.device(), &v.device()], &[q.dtype(), k.dtype(), v.dtype()]) {
        let window = mask.window.unwrap_or(0);
        Tensor::from_dispatch(Dispatch::bl_attention(q.into_dispatch(), k.into_dispatch(), v.into_dispatch(), scale, mask.q_offset, window))
    } else {
        attention_reference(q, k, v, scale, mask)
    }
}

/// [`attention`] over the heads of one fused projection `qkv: [batch, pos, h + 2 hk,
/// d_head]` (queries, then keys, then values; `heads = [h, hk]`). The same numbers; in
/// training its gradient is one `[batch, pos, h + 2 hk, d_head]` tensor written once, where
/// splitting first makes Burn's backward of each split zero a whole `qkv`-sized tensor
/// (copying it too: flex's zeros), write its part and add the three up.
pub fn attention_qkv(qkv: Tensor<4>, heads: [usize; 2], scale: f64, mask: AttentionMask) -> Tensor<4> {
    if use_kernels(&[&qkv.device()], &[qkv.dtype()]) {
        let window = mask.window.unwrap_or(0);
        Tensor::from_dispatch(Dispatch::bl_attention_qkv(qkv.into_dispatch(), heads, scale, mask.q_offset, window))
    } else {
        let [h, hk] = heads;
        let part = |start: usize, n: usize| qkv.clone().narrow(2, start, n).swap_dims(1, 2);
        attention(part(0, h), part(h, hk), part(h + hk, hk), scale, mask)
    }
}

/// The composed reference: scores, mask, softmax, weighted sum (grouped heads repeated).
pub fn attention_reference(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, scale: f64, mask: AttentionMask) -> Tensor<4> {
    let [b, h, t, _] = q.dims();
    let [_, hk, s, dh] = k.dims();
    let (k, v) = if hk == h { (k, v) } else { (repeat_heads(k, h / hk), repeat_heads(v, h / hk)) };
    let hidden: Vec<bool> = (0..t)
        .flat_map(|i| {
            let (lo, hi) = mask.visible(i, s);
            (0..s).map(move |j| !(lo..hi).contains(&j))
        })
        .collect();
    let hidden = Tensor::<4, Bool>::from_data(TensorData::new(hidden, [1, 1, t, s]), &q.device());
    let scores = (matmul(q, k.swap_dims(2, 3)) * scale).mask_fill(hidden.clone().expand([b, h, t, s]), f32::NEG_INFINITY);
    let pattern = softmax(scores, 3);
    // Rows with no visible key are NaN after the softmax; the kernel gives them zeros.
    let pattern = pattern.clone().mask_fill(pattern.is_nan(), 0.0);
    let _ = dh;
    matmul(pattern, v)
}

/// `[b, hk, s, dh]` -> `[b, hk * g, s, dh]`, each key/value head repeated for its `g` query heads.
pub fn repeat_heads(x: Tensor<4>, g: usize) -> Tensor<4> {
    let [b, hk, s, dh] = x.dims();
    x.reshape([b, hk, 1, s, dh]).expand([b, hk, g, s, dh]).reshape([b, hk * g, s, dh])
}

/// A rank-4 `[batch, heads, pos, d_head]` view with unit stride along `d_head`.
#[derive(Clone, Copy)]
pub(super) struct Heads<'a> {
    data: &'a [f32],
    offset: usize,
    pub(super) dims: [usize; 4],
    strides: [isize; 3],
}

impl<'a> Heads<'a> {
    pub(super) fn of(t: &'a FlexTensor) -> Self {
        let l = t.layout();
        let st = l.strides();
        let d = l.shape();
        Heads { data: t.storage::<f32>(), offset: l.start_offset(), dims: [d[0], d[1], d[2], d[3]], strides: [st[0], st[1], st[2]] }
    }

    /// Rows `r0..r0 + n` of head `(bi, hi)` as an `[n, d_head]` matrix.
    fn mat(&self, bi: usize, hi: usize, r0: usize, n: usize) -> MatRef<'a> {
        let off = self.offset as isize + bi as isize * self.strides[0] + hi as isize * self.strides[1] + r0 as isize * self.strides[2];
        MatRef { data: self.data, offset: off as usize, rows: n, cols: self.dims[3], rs: self.strides[2], cs: 1 }
    }

    fn row(&self, bi: usize, hi: usize, r: usize) -> &'a [f32] {
        let off = (self.offset as isize + bi as isize * self.strides[0] + hi as isize * self.strides[1] + r as isize * self.strides[2]) as usize;
        &self.data[off..off + self.dims[3]]
    }
}

/// The query, key and value heads of a fused projection `[b, pos, h + 2 hk, dh]` (unit
/// stride along `dh`), as `[b, heads, pos, dh]` views.
pub(super) fn qkv_heads(t: &FlexTensor, [h, hk]: [usize; 2]) -> [Heads<'_>; 3] {
    let l = t.layout();
    let (st, d) = (l.strides(), l.shape());
    assert!(d[2] == h + 2 * hk && st[3] == 1, "attention kernel: a fused projection of {:?} for {h} + 2 × {hk} heads", d.as_slice());
    let part = |first: usize, n: usize| Heads {
        data: t.storage::<f32>(),
        offset: (l.start_offset() as isize + first as isize * st[2]) as usize,
        dims: [d[0], n, d[1], d[3]],
        strides: [st[0], st[2], st[1]],
    };
    [part(0, h), part(h, hk), part(h + hk, hk)]
}

/// Unit stride along the last dimension and no negative strides, copying only if needed.
pub(super) fn headwise(t: &FlexTensor) -> FlexTensor {
    assert_eq!(t.dtype(), burn::tensor::DType::F32, "attention kernel takes f32");
    assert_eq!(t.layout().num_dims(), 4, "attention kernel takes rank-4 tensors");
    let st = t.layout().strides();
    if st[3] == 1 && st.iter().all(|&s| s >= 0) { t.clone() } else { t.to_contiguous() }
}

/// Softmax of one block's scores in place (`p[r, j]` for visible keys, zero elsewhere);
/// returns nothing, writes each row's log-sum-exp.
#[allow(clippy::too_many_arguments)]
fn softmax_block(p: &mut [f32], kw: usize, klo: usize, i0: usize, rows: usize, keys: usize, mask: AttentionMask, scale: f32, lse: &mut [f32]) {
    for r in 0..rows {
        let (lo, hi) = mask.visible(i0 + r, keys);
        let row = &mut p[r * kw..(r + 1) * kw];
        let (lo, hi) = (lo - klo, hi - klo);
        row[..lo].fill(0.0);
        row[hi..].fill(0.0);
        if lo == hi {
            lse[r] = f32::NEG_INFINITY;
            continue;
        }
        lse[r] = dispatch!(|row: &mut [f32], lo: usize, hi: usize, scale: f32| -> f32 {
            let x = &mut row[lo..hi];
            let m = simd::max_by(x, |v| v * scale);
            let acc = exp::exp_scaled_sum(x, scale, m);
            let inv = 1.0 / acc;
            for v in x.iter_mut() {
                *v *= inv;
            }
            m + acc.ln()
        });
    }
}

/// The forward's two products per query block, `q kᵀ` and `p v`: through `kᵀ` and `v`
/// packed once per key/value head for every block (gemm-f32's micro-kernels, as
/// [`super::packed`] drives them for weights) where the CPU has them, else one gemm call
/// each, which packs its operands again every time (22% of the forward at 4096 tokens).
struct Products<'a> {
    q: &'a Heads<'a>,
    k: &'a Heads<'a>,
    v: &'a Heads<'a>,
    /// `(kᵀ, v)` of each `(batch, kv head)`, at `bi · kv_heads + kh`.
    packed: Option<Vec<(Packed, Packed)>>,
}

impl<'a> Products<'a> {
    fn new(q: &'a Heads<'a>, k: &'a Heads<'a>, v: &'a Heads<'a>) -> Self {
        let [_, hk, s, _] = k.dims;
        // Packing reads and writes each key and value once: worth it when many query rows
        // share them, not for a decoding step's one query per head.
        let queries_per_kv_head = q.dims[2] * (q.dims[1] / hk.max(1));
        let packed = (s > 0 && queries_per_kv_head >= PACK_MIN_QUERIES).then(|| pack_heads(k, v)).flatten();
        Self { q, k, v, packed }
    }

    /// Where a block's keys may start: a panel boundary of the packed `kᵀ` (scores for the
    /// few keys before the first visible one are computed and masked).
    fn align(&self, key: usize) -> usize {
        match &self.packed {
            Some(p) => key / p[0].0.panel() * p[0].0.panel(),
            None => key,
        }
    }

    /// Scores `q kᵀ` of the block's rows against `keys` (start from [`Self::align`]) into
    /// `p`, row stride `keys.len()`.
    fn scores(&self, p: &mut [f32], blk: &QueryBlock, keys: std::ops::Range<usize>) {
        let (q, kw) = (self.q.mat(blk.bi, blk.hi, blk.i0, blk.rows), keys.len());
        assert!(p.len() >= blk.rows * kw);
        match &self.packed {
            // SAFETY: `p` holds `rows × kw` values (checked), this task's own buffer.
            Some(pk) => unsafe { matmul_packed_part(p.as_mut_ptr(), kw, q, &pk[blk.bi * self.k.dims[1] + blk.kh].0, 0..q.cols, keys, false) },
            None => unsafe { matmul_single(p.as_mut_ptr(), kw, q, self.k.mat(blk.bi, blk.kh, keys.start, kw).t(), false) },
        }
    }

    /// `dst (+)= p v[keys]` for the block's rows.
    ///
    /// # Safety
    /// `dst` must be valid for the block's rows of `d_head` values at stride `dst_rs`, and
    /// written by this task alone.
    unsafe fn times_v(&self, dst: *mut f32, dst_rs: usize, p: MatRef, blk: &QueryBlock, keys: std::ops::Range<usize>, accumulate: bool) {
        let dh = self.v.dims[3];
        match &self.packed {
            Some(pk) => unsafe { matmul_packed_part(dst, dst_rs, p, &pk[blk.bi * self.k.dims[1] + blk.kh].1, keys, 0..dh, accumulate) },
            None => unsafe { matmul_single(dst, dst_rs, p, self.v.mat(blk.bi, blk.kh, keys.start, keys.len()), accumulate) },
        }
    }
}

/// `kᵀ` and `v` of every `(batch, kv head)` packed, at `bi · kv_heads + kh`, in one job of
/// the pool: each packing is a few microseconds at short lengths, less than handing it to the
/// pool (a job per matrix was 24 hand-offs a GPT-2 layer at 128 tokens). `None` where this
/// CPU has no micro-kernels.
fn pack_heads(k: &Heads, v: &Heads) -> Option<Vec<(Packed, Packed)>> {
    let [b, hk, s, _] = k.dims;
    let slots: Vec<OnceLock<Option<Packed>>> = (0..2 * b * hk).map(|_| OnceLock::new()).collect();
    pool::run(slots.len(), |i| {
        let (bi, kh) = (i / 2 / hk, i / 2 % hk);
        let matrix = if i % 2 == 0 { k.mat(bi, kh, 0, s).t() } else { v.mat(bi, kh, 0, s) };
        let _ = slots[i].set(Packed::new(matrix));
    });
    let mut each = slots.into_iter().map(|slot| slot.into_inner().flatten());
    (0..b * hk).map(|_| Some((each.next()??, each.next()??))).collect()
}

/// One task of the forward: `rows` queries from `i0` of head `hi` (key/value head `kh`) of
/// batch `bi`, and the keys some of them see.
struct QueryBlock {
    bi: usize,
    hi: usize,
    kh: usize,
    i0: usize,
    rows: usize,
    keys: std::ops::Range<usize>,
}

/// The forward of a block that sees more than [`KEY_TILE`] keys, one tile of keys at a time
/// with a running maximum and sum per row (FlashAttention's online softmax): the scores in
/// flight are `BLOCK × KEY_TILE` (128 KB) rather than `BLOCK × keys` (1 MB at 4096 keys, more
/// than a core's L2), and the output accumulates in a `BLOCK × d_head` buffer, normalised
/// once at the end. Writes the block's output rows at `dst` (row stride `dst_rs`) and each
/// row's log-sum-exp.
///
/// # Safety
/// `dst` must be valid for `rows` rows of `d_head` values at stride `dst_rs`, written by
/// this call alone.
unsafe fn forward_key_tiled(pr: &Products, blk: &QueryBlock, scale: f32, mask: AttentionMask, dst: *mut f32, dst_rs: usize, row_lse: &mut [f32]) {
    let (dh, s, rows) = (pr.q.dims[3], pr.k.dims[2], blk.rows);
    let mut acc = vec![0.0f32; rows * dh];
    let mut max = [f32::NEG_INFINITY; BLOCK];
    let mut sum = [0.0f32; BLOCK];
    // Each tile's scores are written whole before they are read.
    let mut p = unfilled(rows * KEY_TILE);
    for k0 in blk.keys.clone().step_by(KEY_TILE) {
        let kt = KEY_TILE.min(blk.keys.end - k0);
        let p = &mut p[..rows * kt];
        pr.scores(p, blk, k0..k0 + kt);
        for r in 0..rows {
            let (lo, hi) = mask.visible(blk.i0 + r, s);
            // This row's visible keys inside the tile, relative to its start.
            let (a, b) = (lo.clamp(k0, k0 + kt) - k0, hi.clamp(k0, k0 + kt) - k0);
            let row = &mut p[r * kt..(r + 1) * kt];
            if a >= b {
                row.fill(0.0);
                continue;
            }
            row[..a].fill(0.0);
            row[b..].fill(0.0);
            let (m_old, acc_row) = (max[r], &mut acc[r * dh..(r + 1) * dh]);
            let (m_new, tile_sum) = dispatch!(|row: &mut [f32], a: usize, b: usize, scale: f32, m_old: f32| -> (f32, f32) {
                let x = &mut row[a..b];
                let m = simd::max_by(x, |v| v * scale).max(m_old);
                (m, exp::exp_scaled_sum(x, scale, m))
            });
            // exp(-inf) = 0 on the first visible tile, where the sum and output are still 0.
            let c = (m_old - m_new).exp();
            if c != 1.0 {
                acc_row.iter_mut().for_each(|o| *o *= c);
            }
            sum[r] = sum[r] * c + tile_sum;
            max[r] = m_new;
        }
        // SAFETY: `acc` is this block's own `rows × d_head` buffer.
        unsafe { pr.times_v(acc.as_mut_ptr(), dh, MatRef::row_major(p, rows, kt), blk, k0..k0 + kt, true) };
    }
    for r in 0..rows {
        // SAFETY: the caller's guarantee.
        let out = unsafe { std::slice::from_raw_parts_mut(dst.add(r * dst_rs), dh) };
        if sum[r] == 0.0 {
            out.fill(0.0);
            row_lse[r] = f32::NEG_INFINITY;
        } else {
            let inv = 1.0 / sum[r];
            for (o, a) in out.iter_mut().zip(&acc[r * dh..(r + 1) * dh]) {
                *o = a * inv;
            }
            row_lse[r] = max[r] + sum[r].ln();
        }
    }
}

/// Forward. `out` is `[b, t, h, dh]`; `lse`, if given, `[b, h, t]`.
fn forward(q: &Heads, k: &Heads, v: &Heads, scale: f32, mask: AttentionMask, out: &mut [f32], lse: Option<&mut [f32]>) {
    let [b, h, t, dh] = q.dims;
    let [_, hk, s, _] = k.dims;
    let group = h / hk;
    let blocks = t.div_ceil(BLOCK);
    let out_ptr = SendPtr(out.as_mut_ptr());
    let lse_ptr = lse.map(|l| SendPtr(l.as_mut_ptr()));
    let pr = Products::new(q, k, v);
    pool::run(b * h * blocks, |task| {
        let (out_ptr, lse_ptr) = (out_ptr, lse_ptr);
        let (bi, rest) = (task / (h * blocks), task % (h * blocks));
        let (hi, blk) = (rest / blocks, rest % blocks);
        let kh = hi / group;
        let i0 = blk * BLOCK;
        let rows = BLOCK.min(t - i0);
        let khi = mask.visible(i0 + rows - 1, s).1;
        let klo = pr.align(mask.visible(i0, s).0.min(khi));
        let kw = khi.saturating_sub(klo);
        let mut row_lse = [0.0f32; BLOCK];
        // SAFETY: this task alone writes rows i0..i0+rows of head hi of batch bi.
        let dst = unsafe { out_ptr.0.add((bi * t + i0) * h * dh + hi * dh) };
        let block = QueryBlock { bi, hi, kh, i0, rows, keys: klo..khi };
        if kw == 0 {
            for r in 0..rows {
                unsafe { std::slice::from_raw_parts_mut(dst.add(r * h * dh), dh).fill(0.0) };
            }
            row_lse[..rows].fill(f32::NEG_INFINITY);
        } else if kw <= KEY_TILE {
            let mut p = unfilled(rows * kw);
            pr.scores(&mut p, &block, block.keys.clone());
            softmax_block(&mut p, kw, klo, i0, rows, s, mask, scale, &mut row_lse);
            // SAFETY: as above.
            unsafe { pr.times_v(dst, h * dh, MatRef::row_major(&p, rows, kw), &block, block.keys.clone(), false) };
        } else {
            // SAFETY: as above.
            unsafe { forward_key_tiled(&pr, &block, scale, mask, dst, h * dh, &mut row_lse) };
        }
        if let Some(l) = lse_ptr {
            // SAFETY: disjoint rows of lse, as above.
            unsafe { std::slice::from_raw_parts_mut(l.0.add((bi * h + hi) * t + i0), rows).copy_from_slice(&row_lse[..rows]) };
        }
    });
}

/// Where [`backward`] writes one of `dq`, `dk`, `dv`: head `hi` of position `i` of batch
/// `bi` starts at `(bi · positions + i) · row + first + hi · d_head` (separate tensors, or
/// the three parts of one fused projection's gradient).
#[derive(Clone, Copy)]
pub(super) struct GradOut {
    pub(super) ptr: SendPtr,
    pub(super) row: usize,
    pub(super) first: usize,
}

/// Backward: `dq` (`[b, t, h, dh]` positions and heads), `dk`, `dv` (`[b, s, hk, dh]`),
/// written where `[dq, dk, dv]` say.
///
/// # Safety
/// Each `GradOut` must be valid for every position and head it addresses, and the three
/// must not overlap.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn backward(
    q: &Heads,
    k: &Heads,
    v: &Heads,
    o: &Heads,
    d_o: &Heads,
    lse: &[f32],
    scale: f32,
    mask: AttentionMask,
    [dq, dk, dv]: [GradOut; 3],
) {
    let [b, h, t, dh] = q.dims;
    let [_, hk, s, _] = k.dims;
    let group = h / hk;
    pool::run(b * hk, |task| {
        let (dq_ptr, dk_ptr, dv_ptr) = (dq.ptr, dk.ptr, dv.ptr);
        let (bi, kh) = (task / hk, task % hk);
        let mut dk_acc = vec![0.0f32; s * dh];
        let mut dv_acc = vec![0.0f32; s * dh];
        for hi in kh * group..(kh + 1) * group {
            for i0 in (0..t).step_by(BLOCK) {
                let rows = BLOCK.min(t - i0);
                // SAFETY: this task alone writes the dq rows of head hi of batch bi.
                let dq_dst = unsafe { dq_ptr.0.add((bi * t + i0) * dq.row + dq.first + hi * dh) };
                let klo = mask.visible(i0, s).0;
                let khi = mask.visible(i0 + rows - 1, s).1;
                let kw = khi.saturating_sub(klo);
                if kw == 0 {
                    for r in 0..rows {
                        unsafe { std::slice::from_raw_parts_mut(dq_dst.add(r * dq.row), dh).fill(0.0) };
                    }
                    continue;
                }
                // Both products below write them whole.
                let (mut p, mut dp) = (unfilled(rows * kw), unfilled(rows * kw));
                let q_blk = q.mat(bi, hi, i0, rows);
                let do_blk = d_o.mat(bi, hi, i0, rows);
                let (k_blk, v_blk) = (k.mat(bi, kh, klo, kw), v.mat(bi, kh, klo, kw));
                unsafe { matmul_single(p.as_mut_ptr(), kw, q_blk, k_blk.t(), false) };
                unsafe { matmul_single(dp.as_mut_ptr(), kw, do_blk, v_blk.t(), false) };
                for r in 0..rows {
                    let i = i0 + r;
                    let (lo, hi_) = mask.visible(i, s);
                    let l = lse[(bi * h + hi) * t + i];
                    let d = simd::dot(d_o.row(bi, hi, i), o.row(bi, hi, i));
                    let (pr, dpr) = (&mut p[r * kw..(r + 1) * kw], &mut dp[r * kw..(r + 1) * kw]);
                    dispatch!(|pr: &mut [f32], dpr: &mut [f32], lo: usize, hi_: usize, klo: usize, l: f32, d: f32, scale: f32| -> () {
                        // The probabilities as the forward made them, 0 where the key is hidden.
                        let (a, b) = (lo - klo, hi_ - klo);
                        pr[..a].fill(0.0);
                        pr[b..].fill(0.0);
                        exp::exp_scaled_sum(&mut pr[a..b], scale, l);
                        for (dp, &p) in dpr.iter_mut().zip(pr.iter()) {
                            *dp = p * (*dp - d) * scale;
                        }
                    });
                }
                let (pm, dsm) = (MatRef::row_major(&p, rows, kw), MatRef::row_major(&dp, rows, kw));
                unsafe {
                    matmul_single(dv_acc.as_mut_ptr().add(klo * dh), dh, pm.t(), do_blk, true);
                    matmul_single(dq_dst, dq.row, dsm, k_blk, false);
                    matmul_single(dk_acc.as_mut_ptr().add(klo * dh), dh, dsm.t(), q_blk, true);
                }
            }
        }
        for j in 0..s {
            // SAFETY: this task alone writes key/value head kh of batch bi.
            unsafe {
                let (at_k, at_v) = ((bi * s + j) * dk.row + dk.first + kh * dh, (bi * s + j) * dv.row + dv.first + kh * dh);
                std::slice::from_raw_parts_mut(dk_ptr.0.add(at_k), dh).copy_from_slice(&dk_acc[j * dh..(j + 1) * dh]);
                std::slice::from_raw_parts_mut(dv_ptr.0.add(at_v), dh).copy_from_slice(&dv_acc[j * dh..(j + 1) * dh]);
            }
        }
    });
}

/// `[b, h, t, dh]` shape with `[b, t, h, dh]` memory order.
pub(super) fn heads_layout(b: usize, h: usize, t: usize, dh: usize) -> (Shape, Vec<isize>) {
    (Shape::from(vec![b, h, t, dh]), vec![(t * h * dh) as isize, dh as isize, (h * dh) as isize, 1])
}

pub(super) fn mask_of(q_offset: usize, window: usize) -> AttentionMask {
    AttentionMask { q_offset, window: (window > 0).then_some(window) }
}

/// Forward on flex tensors: output, and the log-sum-exp per query when `keep_lse`.
pub(super) fn flex_forward(q: &FlexTensor, k: &FlexTensor, v: &FlexTensor, scale: f64, mask: AttentionMask, keep_lse: bool) -> (FlexTensor, Vec<f32>) {
    let (q, k, v) = (headwise(q), headwise(k), headwise(v));
    forward_heads([Heads::of(&q), Heads::of(&k), Heads::of(&v)], scale, mask, keep_lse)
}

/// Forward on the heads of one fused projection (see [`attention_qkv`]).
pub(super) fn flex_forward_qkv(qkv: &FlexTensor, heads: [usize; 2], scale: f64, mask: AttentionMask, keep_lse: bool) -> (FlexTensor, Vec<f32>) {
    let qkv = headwise(qkv);
    forward_heads(qkv_heads(&qkv, heads), scale, mask, keep_lse)
}

fn forward_heads([qh, kh, vh]: [Heads; 3], scale: f64, mask: AttentionMask, keep_lse: bool) -> (FlexTensor, Vec<f32>) {
    super::flex::record(super::flex::Op::Attention, false);
    let [b, h, t, dh] = qh.dims;
    let [kb, hk, s, kdh] = kh.dims;
    assert!(kb == b && kdh == dh && vh.dims == kh.dims && hk > 0 && h % hk == 0, "attention kernel: q {:?}, k {:?}, v {:?}", qh.dims, kh.dims, vh.dims);
    let _ = s;
    let mut out = unfilled(b * t * h * dh);
    let mut lse = if keep_lse { unfilled(b * h * t) } else { Vec::new() };
    forward(&qh, &kh, &vh, scale as f32, mask, &mut out, keep_lse.then_some(&mut lse[..]));
    let (shape, strides) = heads_layout(b, h, t, dh);
    (flex_strided(out, shape, strides), lse)
}

impl AttentionKernel for Flex {
    fn bl_attention(q: FlexTensor, k: FlexTensor, v: FlexTensor, scale: f64, q_offset: usize, window: usize) -> FlexTensor {
        flex_forward(&q, &k, &v, scale, mask_of(q_offset, window), false).0
    }

    fn bl_attention_qkv(qkv: FlexTensor, heads: [usize; 2], scale: f64, q_offset: usize, window: usize) -> FlexTensor {
        flex_forward_qkv(&qkv, heads, scale, mask_of(q_offset, window), false).0
    }
}
