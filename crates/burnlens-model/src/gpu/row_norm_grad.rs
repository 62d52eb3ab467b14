//! The backward of [`super::row_norm`]'s LayerNorm and RMSNorm under autodiff, in four
//! launches where the composed ops' backward takes about twenty: each row's `(mean, rstd)`
//! (a cube per row, as the forward), the input's gradient
//! `dx = rstd (g w - mean(g w) - x̂ mean(g w x̂))` (RMSNorm: without `mean(g w)`) with
//! `x̂ = (x - mean) rstd` (a cube per row), the weight's `dw = Σ g x̂` as partial sums over
//! chunks of rows (a unit per column and chunk, so a large batch still fills the device)
//! summed by Burn, and the bias's `db = Σ g` by Burn.

use burn::backend::autodiff::NodeId;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::{Autodiff, Backend, Cube, TensorMetadata, backend_extension, tensor::FloatTensor};
use burn::tensor::{DType, Shape};
use burn_cubecl::CubeBackend;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::cube_reduce::{cube_sum, row_units};
use super::grid::GRID_LIMIT;
use super::row_norm::{RowNorm, row_mean, row_rstd};

/// Rows per chunk of the weight's partial sums, at least.
const CHUNK_ROWS: usize = 64;
/// Columns per cube of the weight's partial sums (a unit each).
const COLUMN_UNITS: u32 = 256;

/// The backward's kernels.
#[backend_extension(Cube, Fusion: cfg(feature = "fusion"))]
pub trait RowNormGrad: Backend {
    /// Each row's `(mean, rstd)` of `x: [rows, d]` (mean 0 unless `center`), `[rows, 2]`.
    #[fusion(dtype = x, shape = Shape::new([x[0], 2]))]
    fn bl_gpu_norm_stats(x: FloatTensor<Self>, eps: f32, center: bool) -> FloatTensor<Self>;
    /// The input's gradient from the output's `g`, `[rows, d]`.
    #[fusion(dtype = x, shape = x.clone())]
    fn bl_gpu_norm_input_grad(x: FloatTensor<Self>, stats: FloatTensor<Self>, w: FloatTensor<Self>, g: FloatTensor<Self>, center: bool) -> FloatTensor<Self>;
    /// `Σ g x̂` over each chunk of rows, `[chunks, d]`.
    #[fusion(dtype = x, shape = Shape::new([chunking(x[0]).1, x[1]]))]
    fn bl_gpu_norm_weight_grad(x: FloatTensor<Self>, stats: FloatTensor<Self>, g: FloatTensor<Self>) -> FloatTensor<Self>;
}

/// The rows per chunk and the chunks for `rows` rows: [`CHUNK_ROWS`], or more where the grid
/// would not hold the chunks.
fn chunking(rows: usize) -> (usize, usize) {
    let chunk = CHUNK_ROWS.max(rows.div_ceil(GRID_LIMIT));
    (chunk, rows.div_ceil(chunk).max(1))
}

impl RowNormGrad for CubeBackend {
    fn bl_gpu_norm_stats(x: CubeTensor, eps: f32, center: bool) -> CubeTensor {
        let x = into_contiguous(x);
        let (rows, d) = (x.meta.shape()[0], x.meta.shape()[1]);
        let stats = empty_device_dtype(x.client.clone(), x.device.clone(), [rows, 2].into(), DType::F32);
        let cubes = CubeCount::Static(rows.clamp(1, GRID_LIMIT) as u32, 1, 1);
        let (xa, sa) = unsafe { (BufferArg::from_raw_parts(x.handle.clone(), rows * d), BufferArg::from_raw_parts(stats.handle.clone(), rows * 2)) };
        let units = row_units(d);
        norm_stats::launch(&x.client, cubes, CubeDim::new_1d(units), xa, sa, rows as u32, d as u32, eps, center, units);
        stats
    }

    fn bl_gpu_norm_input_grad(x: CubeTensor, stats: CubeTensor, w: CubeTensor, g: CubeTensor, center: bool) -> CubeTensor {
        let [x, stats, w, g] = [x, stats, w, g].map(into_contiguous);
        let (rows, d) = (x.meta.shape()[0], x.meta.shape()[1]);
        let dx = empty_device_dtype(x.client.clone(), x.device.clone(), [rows, d].into(), DType::F32);
        let arg = |t: &CubeTensor, n: usize| unsafe { BufferArg::from_raw_parts(t.handle.clone(), n) };
        let cubes = CubeCount::Static(rows.clamp(1, GRID_LIMIT) as u32, 1, 1);
        let args = (arg(&x, rows * d), arg(&stats, rows * 2), arg(&w, d), arg(&g, rows * d), arg(&dx, rows * d));
        let units = row_units(d);
        norm_input_grad::launch(&x.client, cubes, CubeDim::new_1d(units), args.0, args.1, args.2, args.3, args.4, rows as u32, d as u32, center, units);
        dx
    }

    fn bl_gpu_norm_weight_grad(x: CubeTensor, stats: CubeTensor, g: CubeTensor) -> CubeTensor {
        let [x, stats, g] = [x, stats, g].map(into_contiguous);
        let (rows, d) = (x.meta.shape()[0], x.meta.shape()[1]);
        let (chunk, chunks) = chunking(rows);
        let partial = empty_device_dtype(x.client.clone(), x.device.clone(), [chunks, d].into(), DType::F32);
        let arg = |t: &CubeTensor, n: usize| unsafe { BufferArg::from_raw_parts(t.handle.clone(), n) };
        let cubes = CubeCount::Static(d.div_ceil(COLUMN_UNITS as usize) as u32, chunks as u32, 1);
        let args = (arg(&x, rows * d), arg(&stats, rows * 2), arg(&g, rows * d), arg(&partial, chunks * d));
        norm_weight_grad::launch(&x.client, cubes, CubeDim::new_1d(COLUMN_UNITS), args.0, args.1, args.2, args.3, rows as u32, d as u32, chunk as u32);
        partial
    }
}

/// What a norm's backward keeps: the input, the weight, `eps`.
type NormState = (FloatTensor<Cube>, FloatTensor<Cube>, f32);

#[derive(Debug)]
struct LayerNormBackward;

impl Backward<Cube, 3> for LayerNormBackward {
    type State = NormState;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let g = grads.consume::<Cube>(&ops.node);
        register(grads, ops.parents.map(|p| p.map(|n| n.id)), ops.state, g, true);
    }
}

#[derive(Debug)]
struct RmsNormBackward;

impl Backward<Cube, 2> for RmsNormBackward {
    type State = NormState;

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let g = grads.consume::<Cube>(&ops.node);
        let [x, w] = ops.parents.map(|p| p.map(|n| n.id));
        register(grads, [x, w, None], ops.state, g, false);
    }
}

/// The gradients of the input, weight and bias (those whose node is given) from the output's
/// gradient `g`.
fn register(grads: &mut Gradients, [nx, nw, nb]: [Option<NodeId>; 3], (x, w, eps): NormState, g: FloatTensor<Cube>, center: bool) {
    let d = w.shape()[0];
    if let Some(id) = nb {
        grads.register::<Cube>(id, column_sums::<Cube>(g.clone(), d));
    }
    if nx.is_none() && nw.is_none() {
        return;
    }
    let stats = Cube::bl_gpu_norm_stats(x.clone(), eps, center);
    if let Some(id) = nw {
        grads.register::<Cube>(id, column_sums::<Cube>(Cube::bl_gpu_norm_weight_grad(x.clone(), stats.clone(), g.clone()), d));
    }
    if let Some(id) = nx {
        grads.register::<Cube>(id, Cube::bl_gpu_norm_input_grad(x, stats, w, g, center));
    }
}

/// The sums of `t: [n, d]`'s columns, `[d]`.
fn column_sums<B: Backend>(t: FloatTensor<B>, d: usize) -> FloatTensor<B> {
    B::float_reshape(B::float_sum_dim(t, 0), Shape::new([d]))
}

impl<C: CheckpointStrategy> RowNorm for Autodiff<Cube, C> {
    fn bl_gpu_layer_norm(x: FloatTensor<Self>, w: FloatTensor<Self>, b: FloatTensor<Self>, eps: f32) -> FloatTensor<Self> {
        let ((x, gx), (w, gw), (b, gb)) = (x.into_parts(), w.into_parts(), b.into_parts());
        let out = Cube::bl_gpu_layer_norm(x.clone(), w.clone(), b, eps);
        match LayerNormBackward.prepare::<C>([gx, gw, gb]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish((x, w, eps), out),
            OpsKind::UnTracked(prep) => prep.finish(out),
        }
    }

    fn bl_gpu_rms_norm(x: FloatTensor<Self>, w: FloatTensor<Self>, eps: f32) -> FloatTensor<Self> {
        let ((x, gx), (w, gw)) = (x.into_parts(), w.into_parts());
        let out = Cube::bl_gpu_rms_norm(x.clone(), w.clone(), eps);
        match RmsNormBackward.prepare::<C>([gx, gw]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish((x, w, eps), out),
            OpsKind::UnTracked(prep) => prep.finish(out),
        }
    }
}

/// Rows `CUBE_POS_X, + cubes, …`: `stats[2r] = mean`, `stats[2r + 1] = rstd`.
#[cube(launch)]
fn norm_stats(x: &[f32], stats: &mut [f32], rows: u32, d: u32, eps: f32, #[comptime] center: bool, #[comptime] units: u32) {
    let mut shared = Shared::<[f32]>::new_slice(comptime!(units as usize));
    let mut row = CUBE_POS_X;
    while row < rows {
        let base = row as usize * d as usize;
        let mean = row_mean(x, base, d, &mut shared, center, units);
        let rstd = row_rstd(x, base, d, mean, eps, &mut shared, units);
        if UNIT_POS == 0u32 {
            stats[row as usize * 2usize] = mean;
            stats[row as usize * 2usize + 1usize] = rstd;
        }
        row += CUBE_COUNT_X;
    }
}

/// Rows `CUBE_POS_X, + cubes, …` of the input's gradient (see the module's note).
#[cube(launch)]
fn norm_input_grad(x: &[f32], stats: &[f32], w: &[f32], g: &[f32], dx: &mut [f32], rows: u32, d: u32, #[comptime] center: bool, #[comptime] units: u32) {
    let mut shared = Shared::<[f32]>::new_slice(comptime!(units as usize));
    let steps = d.div_ceil(units);
    let inv_d = 1.0f32 / f32::cast_from(d);
    let mut row = CUBE_POS_X;
    while row < rows {
        let base = row as usize * d as usize;
        let mean = stats[row as usize * 2usize];
        let rstd = stats[row as usize * 2usize + 1usize];
        let mut sg = 0.0f32;
        let mut sgx = 0.0f32;
        for step in 0..steps {
            let i = step * units + UNIT_POS;
            if i < d {
                let gw = g[base + i as usize] * w[i as usize];
                sg += gw;
                sgx += gw * (x[base + i as usize] - mean) * rstd;
            }
        }
        let mut mean_g = 0.0f32;
        if center {
            mean_g = cube_sum(sg, &mut shared) * inv_d;
        }
        let mean_gx = cube_sum(sgx, &mut shared) * inv_d;
        for step in 0..steps {
            let i = step * units + UNIT_POS;
            if i < d {
                let xhat = (x[base + i as usize] - mean) * rstd;
                dx[base + i as usize] = rstd * (g[base + i as usize] * w[i as usize] - mean_g - xhat * mean_gx);
            }
        }
        row += CUBE_COUNT_X;
    }
}

/// Column `ABSOLUTE_POS_X` of chunk `CUBE_POS_Y`: `Σ g x̂` over the chunk's rows.
#[cube(launch)]
fn norm_weight_grad(x: &[f32], stats: &[f32], g: &[f32], partial: &mut [f32], rows: u32, d: u32, chunk: u32) {
    let col = ABSOLUTE_POS_X;
    if col < d {
        let first = CUBE_POS_Y * chunk;
        let mut s = 0.0f32;
        let mut r = first;
        while r < rows && r < first + chunk {
            let at = r as usize * d as usize + col as usize;
            s += g[at] * (x[at] - stats[r as usize * 2usize]) * stats[r as usize * 2usize + 1usize];
            r += 1u32;
        }
        partial[CUBE_POS_Y as usize * d as usize + col as usize] = s;
    }
}
