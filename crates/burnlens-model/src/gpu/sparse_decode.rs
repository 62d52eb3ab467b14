//! A sparse dictionary's decode on a GPU, `acts · W_dec` for activations with a few non-zeros
//! per row (TopK's `k`, BatchTopK's `k` on average), reading only the decoder rows a token
//! uses instead of multiplying by the whole `[d_sae, d]` matrix.
//!
//! `compact_rows` lists each row's non-zero activations (their features and values, up to
//! `cap` of them; a cube of 256 units per row counts, scans the counts in shared memory and
//! writes, in a fixed order, so sums are the same run to run). `decode_rows` sums the listed
//! decoder rows per output column. In the backward, `grad_support` gives the gradient of the
//! activations **on their support only** (`g · W_dec[f]` for each listed `f`, a unit per
//! entry, zero elsewhere):
//! exact wherever what made the activations passes no gradient through its zeros (TopK's and
//! BatchTopK's mask, a ReLU), which is how the trainer uses it. The decoder's gradient
//! `actsᵀ · g` reads only the activations' non-zeros too ([`super::sparse_t_product`]). A row with more than `cap`
//! non-zeros (ties at TopK's threshold, a busy BatchTopK row) is read whole instead: slower,
//! the same result.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::{Autodiff, Backend, Cube, backend_extension, tensor::FloatTensor};
use burn::tensor::{DType, Tensor};
use burn_cubecl::CubeBackend;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::{empty_device_dtype, zeros_client};
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::exact_matmul::on_cube;
use super::grid::GRID_LIMIT;
use super::sparse_t_product::SparseTProduct;

/// Units per cube.
const UNITS: u32 = 256;

/// The extension that carries dispatch tensors to the kernels (and the autodiff wrapper, whose
/// backward is [`SupportGradient`] and [`SparseTProduct`]).
#[backend_extension(Cube, Fusion: cfg(feature = "fusion"), Autodiff)]
pub trait SparseDecode: Backend {
    /// `acts · w` for `acts: [rows, d_sae]`, zero off the non-zeros of `support` (a mask, or
    /// `acts` itself) with at most `cap` of them in most rows, and `w: [d_sae, d]`; the
    /// gradient of `acts` is wanted on all of that support.
    #[fusion(dtype = acts, shape = burn::tensor::Shape::new([acts[0], w[1]]))]
    fn bl_decode_sparse(acts: FloatTensor<Self>, support: FloatTensor<Self>, w: FloatTensor<Self>, cap: usize) -> FloatTensor<Self>;
}

/// Each row's listed entries, the non-zeros of `support`: `idx`, `val` (the values') `[rows,
/// cap]`, `cnt` `[rows]` (the true count, above `cap` for a row read whole).
#[derive(Debug, Clone)]
pub(super) struct Lists {
    idx: CubeTensor,
    pub(super) val: CubeTensor,
    cnt: CubeTensor,
    support: CubeTensor,
    cap: usize,
}

impl SparseDecode for CubeBackend {
    fn bl_decode_sparse(acts: CubeTensor, support: CubeTensor, w: CubeTensor, cap: usize) -> CubeTensor {
        let (acts, support, w) = (into_contiguous(acts), into_contiguous(support), into_contiguous(w));
        let lists = compact(&acts, &support, cap);
        decode(&acts, &w, &lists)
    }
}

/// The sparse decode's backward for the activations (the decoder's is
/// [`SparseTProduct`]'s): the rows' lists made again from `support` and `grad_support` on
/// them — one more listing launch than keeping the forward's lists, so that every tensor the
/// backward holds is one its backend (fused or not) can carry.
#[backend_extension(Cube, Fusion: cfg(feature = "fusion"))]
pub trait SupportGradient: Backend {
    /// The gradient of `acts` (`[rows, d_sae]`) on the non-zeros of `support`, for the
    /// decode's output gradient `g` (`[rows, d]`).
    #[fusion(dtype = acts, shape = acts.clone())]
    fn bl_support_gradient(acts: FloatTensor<Self>, support: FloatTensor<Self>, w: FloatTensor<Self>, g: FloatTensor<Self>, cap: usize) -> FloatTensor<Self>;
}

impl SupportGradient for CubeBackend {
    fn bl_support_gradient(acts: CubeTensor, support: CubeTensor, w: CubeTensor, g: CubeTensor, cap: usize) -> CubeTensor {
        let (acts, support, w) = (into_contiguous(acts), into_contiguous(support), into_contiguous(w));
        let lists = compact(&acts, &support, cap);
        support_gradient(&acts, &w, g, &lists)
    }
}

/// Whether the kernels run for `acts · w`: f32 `[rows, d_sae] · [d_sae, d]` on a `Cube`
/// device, rows and output columns within the grid, `cap ≥ 1`.
pub fn applies(acts: &Tensor<2>, w: &Tensor<2>, cap: usize) -> bool {
    let ([rows, m], [m2, d]) = (acts.dims(), w.dims());
    let fits =
        (1..=GRID_LIMIT).contains(&rows) && m == m2 && d.div_ceil(UNITS as usize) <= GRID_LIMIT && rows * m < u32::MAX as usize && m * d < u32::MAX as usize;
    fits && cap >= 1 && on_cube(&acts.device()) && on_cube(&w.device()) && acts.dtype() == DType::F32 && w.dtype() == DType::F32
}

/// See [`super::decode_sparse_on`]; the caller checked [`applies`] and that `support` is an
/// f32 tensor of `acts`'s shape on its device, tracked or not as `acts` is.
pub fn decode_sparse(acts: Tensor<2>, support: Tensor<2>, w: Tensor<2>, cap: usize) -> Tensor<2> {
    Tensor::from_dispatch(<burn::backend::Dispatch as SparseDecode>::bl_decode_sparse(acts.into_dispatch(), support.into_dispatch(), w.into_dispatch(), cap))
}

fn shape2(t: &CubeTensor) -> (usize, usize) {
    (t.meta.shape()[0], t.meta.shape()[1])
}

/// `compact_rows`: the non-zeros of contiguous `support`, with `acts`'s values (rows within
/// the grid; `support` may be `acts` itself).
pub(super) fn compact(acts: &CubeTensor, support: &CubeTensor, cap: usize) -> Lists {
    let (rows, m) = shape2(acts);
    let (client, device) = (acts.client.clone(), acts.device.clone());
    let idx = empty_device_dtype(client.clone(), device.clone(), [rows, cap].into(), DType::U32);
    let val = empty_device_dtype(client.clone(), device.clone(), [rows, cap].into(), DType::F32);
    let cnt = empty_device_dtype(client.clone(), device, [rows].into(), DType::U32);
    compact_rows::launch(
        &client,
        CubeCount::Static(rows as u32, 1, 1),
        CubeDim::new_1d(UNITS),
        unsafe { BufferArg::from_raw_parts(acts.handle.clone(), rows * m) },
        unsafe { BufferArg::from_raw_parts(support.handle.clone(), rows * m) },
        unsafe { BufferArg::from_raw_parts(idx.handle.clone(), rows * cap) },
        unsafe { BufferArg::from_raw_parts(val.handle.clone(), rows * cap) },
        unsafe { BufferArg::from_raw_parts(cnt.handle.clone(), rows) },
        m as u32,
        cap as u32,
    );
    Lists { idx, val, cnt, support: support.clone(), cap }
}

/// `decode_rows` of contiguous `acts` and `w`: `acts · w`, `[rows, d]`.
fn decode(acts: &CubeTensor, w: &CubeTensor, l: &Lists) -> CubeTensor {
    let ((rows, m), d) = (shape2(acts), shape2(w).1);
    let client = acts.client.clone();
    let out = empty_device_dtype(client.clone(), acts.device.clone(), [rows, d].into(), DType::F32);
    decode_rows::launch(
        &client,
        CubeCount::Static(d.div_ceil(UNITS as usize) as u32, rows as u32, 1),
        CubeDim::new_1d(UNITS),
        unsafe { BufferArg::from_raw_parts(acts.handle.clone(), rows * m) },
        unsafe { BufferArg::from_raw_parts(l.support.handle.clone(), rows * m) },
        unsafe { BufferArg::from_raw_parts(l.idx.handle.clone(), rows * l.cap) },
        unsafe { BufferArg::from_raw_parts(l.val.handle.clone(), rows * l.cap) },
        unsafe { BufferArg::from_raw_parts(l.cnt.handle.clone(), rows) },
        unsafe { BufferArg::from_raw_parts(w.handle.clone(), m * d) },
        unsafe { BufferArg::from_raw_parts(out.handle.clone(), rows * d) },
        m as u32,
        d as u32,
        l.cap as u32,
    );
    out
}

/// `grad_support`: the activations' gradient on their support, `[rows, d_sae]`.
fn support_gradient(acts: &CubeTensor, w: &CubeTensor, g: CubeTensor, l: &Lists) -> CubeTensor {
    let ((rows, m), d) = (shape2(acts), shape2(w).1);
    let g = into_contiguous(g);
    let client = acts.client.clone();
    let out = zeros_client(client.clone(), acts.device.clone(), [rows, m].into(), DType::F32);
    grad_support::launch(
        &client,
        CubeCount::Static(rows as u32, 1, 1),
        CubeDim::new_1d(UNITS),
        unsafe { BufferArg::from_raw_parts(l.support.handle.clone(), rows * m) },
        unsafe { BufferArg::from_raw_parts(l.idx.handle.clone(), rows * l.cap) },
        unsafe { BufferArg::from_raw_parts(l.cnt.handle.clone(), rows) },
        unsafe { BufferArg::from_raw_parts(g.handle.clone(), rows * d) },
        unsafe { BufferArg::from_raw_parts(w.handle.clone(), m * d) },
        unsafe { BufferArg::from_raw_parts(out.handle.clone(), rows * m) },
        m as u32,
        d as u32,
        l.cap as u32,
    );
    out
}

/// Row `CUBE_POS_X`'s non-zeros: unit `u` reads entries `u, u + 256, …` (coalesced), the
/// units' counts are scanned in shared memory, and each unit writes its own in order.
#[cube(launch)]
#[allow(clippy::collapsible_if)]
fn compact_rows(acts: &[f32], support: &[f32], idx: &mut [u32], val: &mut [f32], cnt: &mut [u32], width: u32, cap: u32) {
    let row = CUBE_POS_X as usize;
    let base = row * width as usize;
    let mut counts = Shared::<[u32]>::new_slice(256usize);
    let chunks = width.div_ceil(256u32);
    let mut c = 0u32;
    for chunk in 0..chunks {
        let i = chunk * 256u32 + UNIT_POS;
        // Nested: a kernel's `&&` reads both sides, and `i` may be past the row's end.
        if i < width {
            if support[base + i as usize] != 0.0f32 {
                c += 1u32;
            }
        }
    }
    counts[UNIT_POS as usize] = c;
    sync_cube();
    if UNIT_POS == 0u32 {
        let mut run = 0u32;
        for u in 0..256u32 {
            let t = counts[u as usize];
            counts[u as usize] = run;
            run += t;
        }
        cnt[row] = run;
    }
    sync_cube();
    let mut at = counts[UNIT_POS as usize];
    for chunk in 0..chunks {
        let i = chunk * 256u32 + UNIT_POS;
        if i < width {
            if support[base + i as usize] != 0.0f32 {
                if at < cap {
                    let slot = row * cap as usize + at as usize;
                    idx[slot] = i;
                    val[slot] = acts[base + i as usize];
                }
                at += 1u32;
            }
        }
    }
}

/// Output column `CUBE_POS_X · 256 + UNIT_POS` of row `CUBE_POS_Y`: the listed decoder rows
/// weighted by their activations (the whole row of activations where it overflowed).
#[cube(launch)]
fn decode_rows(acts: &[f32], support: &[f32], idx: &[u32], val: &[f32], cnt: &[u32], w: &[f32], out: &mut [f32], width: u32, d: u32, cap: u32) {
    let row = CUBE_POS_Y as usize;
    let col = CUBE_POS_X * 256u32 + UNIT_POS;
    if col < d {
        let n = cnt[row];
        let mut acc = 0.0f32;
        if n <= cap {
            for j in 0..n {
                let slot = row * cap as usize + j as usize;
                acc += val[slot] * w[idx[slot] as usize * d as usize + col as usize];
            }
        } else {
            for f in 0..width {
                let at = row * width as usize + f as usize;
                if support[at] != 0.0f32 {
                    acc += acts[at] * w[f as usize * d as usize + col as usize];
                }
            }
        }
        out[row * d as usize + col as usize] = acc;
    }
}

/// Row `CUBE_POS_X` of the activations' gradient: unit `u` takes listed entries `u, u + 256,
/// …` (every feature of an overflowed row), each the dot product of `g[row]` (read by every
/// unit at once) and its decoder row. No barrier: the entries a unit takes depend on the data.
#[cube(launch)]
fn grad_support(support: &[f32], idx: &[u32], cnt: &[u32], g: &[f32], w: &[f32], out: &mut [f32], width: u32, d: u32, cap: u32) {
    let row = CUBE_POS_X as usize;
    let n = cnt[row];
    let listed = n <= cap;
    let mut entries = width;
    if listed {
        entries = n;
    }
    let steps = entries.div_ceil(256u32);
    for step in 0..steps {
        let j = step * 256u32 + UNIT_POS;
        if j < entries {
            let mut f = j;
            let mut live = true;
            if listed {
                f = idx[row * cap as usize + j as usize];
            } else {
                live = support[row * width as usize + j as usize] != 0.0f32;
            }
            if live {
                let mut s = 0.0f32;
                for c in 0..d {
                    s += g[row * d as usize + c as usize] * w[f as usize * d as usize + c as usize];
                }
                out[row * width as usize + f as usize] = s;
            }
        }
    }
}

#[derive(Debug)]
struct SparseDecodeBackward;

impl Backward<Cube, 2> for SparseDecodeBackward {
    /// The activations, their support, the decoder and the lists' capacity.
    type State = (FloatTensor<Cube>, FloatTensor<Cube>, FloatTensor<Cube>, usize);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_acts, node_w] = ops.parents;
        let g = grads.consume::<Cube>(&ops.node);
        let (acts, support, w, cap) = ops.state;
        if let Some(node) = node_acts {
            grads.register::<Cube>(node.id, Cube::bl_support_gradient(acts.clone(), support, w, g.clone(), cap));
        }
        if let Some(node) = node_w {
            grads.register::<Cube>(node.id, Cube::bl_sparse_t_product(acts, g));
        }
    }
}

impl<C: CheckpointStrategy> SparseDecode for Autodiff<Cube, C> {
    fn bl_decode_sparse(acts: FloatTensor<Self>, support: FloatTensor<Self>, w: FloatTensor<Self>, cap: usize) -> FloatTensor<Self> {
        let (acts, ga) = acts.into_parts();
        let (w, gw) = w.into_parts();
        let support = support.into_primitive();
        let out = Cube::bl_decode_sparse(acts.clone(), support.clone(), w.clone(), cap);
        match SparseDecodeBackward.prepare::<C>([ga, gw]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish((acts, support, w, cap), out),
            OpsKind::UnTracked(prep) => prep.finish(out),
        }
    }
}
