//! Linear projection `y = x W + b` (right-multiplying, `W: [d_in, d_out]`).
//!
//! Contract: `x: [.., d_in]`, `W: [d_in, d_out]` (any strides, so a transposed view such
//! as the tied unembedding `W_Eᵀ` is read in place), `b: [d_out]` optional, f32. All leading
//! dimensions fold into one GEMM of `m = batch · positions` rows; the bias initialises the
//! output, which the product accumulates into. Backward: `dx = dy Wᵀ`, `dW = xᵀ dy`,
//! `db = Σ_rows dy`, each one GEMM (or one pass); `dW` comes back in the weight's own layout
//! (a transposed view gets a transposed gradient). Threading follows [`super::gemm`].
//! Tolerance against `burn::tensor::module::linear`: 1e-5 relative (values), 1e-4
//! (gradients).

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::flex::FlexTensor;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Backend, Dispatch, Flex, backend_extension};
use burn::tensor::{DType, Shape, Tensor, bf16, f16};

use super::bf16_gemm::{RowPanels, View, kept_cols, kept_panels, matmul_bf16, matmul_bf16_f32, matmul_bf16_panels};
use super::bf16_pack::{Cols, ColsBuf};
use super::bf16_path::{Bf16Path, path, runs_bf16};
use super::compute::{Compute, compute};
use super::flex::{contiguous, flex_strided, flex_vec, use_kernels};
use super::gemm::{MatRef, matmul};
use super::half::{Half, HalfRef, STREAM_ROWS, matmul_half};
use super::half_panels::half_panels;
use super::half_panels_prefill::{available as reads_prefill, matmul_from_panels};
use super::half_widened::{self, widened_weight};
use super::packed::{matmul_packed, packed_weight};
use super::pool;
use super::unfilled::unfilled;

#[backend_extension(Flex, Autodiff)]
pub trait LinearKernel: Backend {
    fn bl_linear(x: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self>;
    fn bl_linear_bias(x: FloatTensor<Self>, w: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self>;
}

/// `x W + b` for `x: [.., d_in]`, `W: [d_in, d_out]`: the kernel on flex, Burn's
/// `module::linear` elsewhere. A half-precision `W` gives an f32 result either way.
pub fn linear<const D: usize>(x: Tensor<D>, weight: Tensor<2>, bias: Option<Tensor<1>>) -> Tensor<D> {
    let mut dtypes = vec![x.dtype()];
    dtypes.extend(bias.as_ref().map(|b| b.dtype()));
    let half_ok = matches!(weight.dtype(), DType::BF16 | DType::F16);
    if !half_ok {
        dtypes.push(weight.dtype());
    }
    if use_kernels(&[&x.device(), &weight.device()], &dtypes) {
        Tensor::from_dispatch(match bias {
            None => Dispatch::bl_linear(x.into_dispatch(), weight.into_dispatch()),
            Some(b) => Dispatch::bl_linear_bias(x.into_dispatch(), weight.into_dispatch(), b.into_dispatch()),
        })
    } else {
        linear_reference(x, weight, bias)
    }
}

/// The composed reference (a half weight widened to `x`'s dtype first: Burn's products
/// take one dtype); on a GPU whose products take the exact kernel, its product folds the
/// leading dimensions into one of those ([`crate::matmul::matmul_weight`]).
pub fn linear_reference<const D: usize>(x: Tensor<D>, weight: Tensor<2>, bias: Option<Tensor<1>>) -> Tensor<D> {
    let weight = weight.cast(x.dtype());
    if crate::matmul::exact_on(&x.device()) {
        let y = crate::matmul::matmul_weight(x, weight);
        return match bias {
            Some(b) => y + b.unsqueeze(),
            None => y,
        };
    }
    burn::tensor::module::linear(x, weight, bias)
}

/// `dst (+)= a · w` for the weight view `w` of `owner`. A constant f32 weight (`pack`: not
/// trained in this pass) goes through its packed copy (packed at first use and kept, see
/// [`super::packed`]) where the CPU has micro-kernels for it; a weight an optimizer is about
/// to change, or one packing does not apply to, through one `gemm` call that packs it again.
/// A half weight is read as stored, except by decoding's few rows, which read its decoding
/// panels ([`super::half_panels`]) while the copies' budget has room, and by prefill: on AVX2
/// CPUs from those panels too ([`super::half_panels_prefill`]), on Intel's AVX-512 cores from
/// a copy widened to f32 and packed ([`super::half_widened`]).
fn weight_product(dst: &mut [f32], dst_rs: usize, a: MatRef, owner: &FlexTensor, w: WeightRef, accumulate: bool, pack: bool) {
    if compute() == Compute::Bf16 && a.rows > STREAM_ROWS && runs_bf16() {
        return weight_product_bf16(dst, dst_rs, a, owner, w, accumulate, pack);
    }
    match w {
        WeightRef::Half(w) if pack => {
            let copy = match (a.rows <= STREAM_ROWS, HalfPrefill::here(w.kind)) {
                (false, HalfPrefill::Widened) => widened_weight(owner, w).map(|p| matmul_packed(dst, dst_rs, a, &p, accumulate)),
                (true, _) | (false, HalfPrefill::Panels) => half_panels(owner, w).map(|p| matmul_from_panels(dst, dst_rs, a, &p, accumulate)),
                (false, HalfPrefill::Blocks) => None,
            };
            if copy.is_none() {
                matmul_half(dst, dst_rs, a, w, accumulate);
            }
        }
        WeightRef::Half(w) => matmul_half(dst, dst_rs, a, w, accumulate),
        WeightRef::F32(w) => match pack.then(|| packed_weight(owner, w)).flatten() {
            Some(p) => matmul_packed(dst, dst_rs, a, &p, accumulate),
            None => matmul(dst, dst_rs, a, w, accumulate),
        },
    }
}

/// How prefill (more than [`STREAM_ROWS`] rows) reads a constant half weight in f32
/// arithmetic on this CPU, while the copies' budget has room.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum HalfPrefill {
    /// From a copy widened to f32 once and packed ([`super::half_widened`]).
    Widened,
    /// From the decoding panels, widened in registers ([`super::half_panels_prefill`]).
    Panels,
    /// As stored, widened a block at a time ([`super::half`]).
    Blocks,
}

impl HalfPrefill {
    pub fn here(kind: Half) -> Self {
        if half_widened::applies() {
            HalfPrefill::Widened
        } else if reads_prefill(kind) {
            HalfPrefill::Panels
        } else {
            HalfPrefill::Blocks
        }
    }

    /// For reports (`burnlens bench machine`).
    pub fn describe(self) -> &'static str {
        match self {
            HalfPrefill::Widened => "a copy widened to f32 once and packed (Intel AVX-512)",
            HalfPrefill::Panels => "the decoding panels, widened in registers (AVX2)",
            HalfPrefill::Blocks => "the weight as stored, widened a block at a time",
        }
    }
}

/// [`weight_product`] in bf16 arithmetic ([`Compute::Bf16`]): on AMX tiles a constant weight
/// rounded once into panels of its columns kept beside it; elsewhere (or where the copies'
/// budget is full) a bf16 Hugging Face weight read in place, any other constant weight rounded
/// once into columns kept beside it; a weight being trained rounded per product.
fn weight_product_bf16(dst: &mut [f32], dst_rs: usize, a: MatRef, owner: &FlexTensor, w: WeightRef, accumulate: bool, pack: bool) {
    let full = match w {
        WeightRef::Half(h) => View { offset: h.offset, dims: [h.rows, h.cols], strides: [h.rs, h.cs] },
        WeightRef::F32(m) => View { offset: m.offset, dims: [m.rows, m.cols], strides: [m.rs, m.cs] },
    };
    // On AMX tiles a constant weight is kept as panels of its columns, in place or not: the
    // tiles then write their sums with no transposition (`matmul_bf16_panels`).
    if pack && path() == Bf16Path::Amx {
        let panels = || {
            w.check();
            match w.t() {
                WeightRef::Half(h) => RowPanels::pack_half(h),
                WeightRef::F32(m) => RowPanels::pack(m),
            }
        };
        if let Some(p) = kept_panels(owner, full, panels) {
            return matmul_bf16_panels(dst, dst_rs, a, &p, accumulate);
        }
    }
    if let WeightRef::Half(h) = w
        && let Some(cols) = Cols::in_place(&h)
    {
        return matmul_bf16(dst, dst_rs, a, cols, accumulate);
    }
    let cols = |w: WeightRef| {
        w.check();
        match w {
            WeightRef::Half(h) => ColsBuf::from_half(h),
            WeightRef::F32(m) => ColsBuf::from_f32(m),
        }
    };
    match (pack.then(|| kept_cols(owner, full, || cols(w))).flatten(), w) {
        (Some(kept), _) => matmul_bf16(dst, dst_rs, a, kept.view(), accumulate),
        (None, WeightRef::F32(m)) => matmul_bf16_f32(dst, dst_rs, a, m, accumulate),
        (None, w) => matmul_bf16(dst, dst_rs, a, cols(w).view(), accumulate),
    }
}

/// `dst = a · b` for two f32 operands (a weight's gradient) in the compute dtype.
fn product(dst: &mut [f32], dst_rs: usize, a: MatRef, b: MatRef) {
    if compute() == Compute::Bf16 && b.rows > STREAM_ROWS && runs_bf16() {
        matmul_bf16_f32(dst, dst_rs, a, b, false);
    } else {
        matmul(dst, dst_rs, a, b, false);
    }
}

/// A weight view in the dtype it is stored in.
#[derive(Clone, Copy)]
enum WeightRef<'a> {
    F32(MatRef<'a>),
    Half(HalfRef<'a>),
}

impl WeightRef<'_> {
    fn check(&self) {
        match self {
            WeightRef::F32(m) => m.check(),
            WeightRef::Half(h) => h.check(),
        }
    }

    fn t(self) -> Self {
        match self {
            WeightRef::F32(m) => WeightRef::F32(m.t()),
            WeightRef::Half(h) => WeightRef::Half(h.t()),
        }
    }
}

/// A 2-D flex tensor read in place through its strides (copied only if a stride is negative).
fn weight_view(w: &FlexTensor) -> (FlexTensor, [usize; 2], [isize; 2], usize) {
    let dims = w.layout().shape().clone();
    assert_eq!(dims.num_dims(), 2, "linear: weight must be 2-D, found {dims:?}");
    let strides = w.layout().strides();
    let w = if strides.iter().all(|&s| s >= 0) { w.clone() } else { w.to_contiguous() };
    let (s, off) = (w.layout().strides().to_vec(), w.layout().start_offset());
    (w, [dims[0], dims[1]], [s[0], s[1]], off)
}

fn mat<'a>(t: &'a FlexTensor, dims: [usize; 2], strides: [isize; 2], offset: usize) -> WeightRef<'a> {
    let [rows, cols] = dims;
    let [rs, cs] = strides;
    let half = |data: &'a [u16], kind| WeightRef::Half(HalfRef { data, kind, offset, rows, cols, rs, cs });
    match t.dtype() {
        DType::BF16 => half(bits(t.storage::<bf16>()), Half::Bf16),
        DType::F16 => half(bits(t.storage::<f16>()), Half::F16),
        _ => WeightRef::F32(MatRef { data: t.storage::<f32>(), offset, rows, cols, rs, cs }),
    }
}

/// The bits of 16-bit floats.
fn bits<T: Copy>(v: &[T]) -> &[u16] {
    assert_eq!(std::mem::size_of::<T>(), 2);
    // SAFETY: bf16 and f16 are `repr(transparent)` over `u16`: same size and alignment,
    // every bit pattern valid.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u16>(), v.len()) }
}

/// Forward on flex tensors; returns `y` and the contiguous `x` it read. `pack`: the weight
/// is constant (see [`weight_product`]).
fn flex_forward(x: &FlexTensor, w: &FlexTensor, b: Option<&FlexTensor>, pack: bool) -> (FlexTensor, FlexTensor) {
    super::flex::record(super::flex::Op::Linear, false);
    let x = contiguous(x);
    let (w, [k, n], ws, woff) = weight_view(w);
    let xs = x.layout().shape().clone();
    assert_eq!(xs[xs.num_dims() - 1], k, "linear: input width {} but weight rows {k}", xs[xs.num_dims() - 1]);
    let m = xs.num_elements() / k.max(1);
    let mut y = unfilled(m * n);
    if let Some(b) = b {
        let b = contiguous(b);
        let bias = b.storage::<f32>();
        pool::for_chunks(&mut y, pool::rows_per_task(n) * n.max(1), |_, rows| {
            for row in rows.chunks_exact_mut(n.max(1)) {
                row.copy_from_slice(bias);
            }
        });
    }
    weight_product(&mut y, n, MatRef::row_major(x.storage(), m, k), &w, mat(&w, [k, n], ws, woff), b.is_some(), pack);
    let mut out_dims = xs.to_vec();
    *out_dims.last_mut().expect("rank >= 1") = n;
    (flex_vec(y, Shape::from(out_dims)), x)
}

impl LinearKernel for Flex {
    fn bl_linear(x: FlexTensor, w: FlexTensor) -> FlexTensor {
        flex_forward(&x, &w, None, true).0
    }
    fn bl_linear_bias(x: FlexTensor, w: FlexTensor, b: FlexTensor) -> FlexTensor {
        flex_forward(&x, &w, Some(&b), true).0
    }
}

/// The three gradients of `y = x W (+ b)` from `dy`, each only if asked for.
fn gradients(x: &FlexTensor, w: &FlexTensor, dy: &FlexTensor, want: [bool; 3]) -> [Option<FlexTensor>; 3] {
    super::flex::record(super::flex::Op::Linear, true);
    let (w, [k, n], ws, woff) = weight_view(w);
    let dy = contiguous(dy);
    let m = dy.layout().num_elements() / n.max(1);
    let dy_m = MatRef::row_major(dy.storage(), m, n);
    let dx = want[0].then(|| {
        let mut dx = unfilled(m * k);
        weight_product(&mut dx, k, dy_m, &w, mat(&w, [k, n], ws, woff).t(), false, !want[1]);
        flex_vec(dx, x.layout().shape().clone())
    });
    let dw = want[1].then(|| {
        let x_m = MatRef::row_major(x.storage(), m, k);
        if ws == [1, k as isize] && k > 1 {
            // The weight is a transposed view of an `[n, k]` matrix (the tied unembedding
            // `W_Eᵀ`): `dW` in that layout, `dWᵀ = dyᵀ x` row-major, handed back as the same
            // view, so that it reaches `W_E` contiguous and adds to the embedding's own
            // gradient in one contiguous pass (row-major, the add ran strided: 4.4% of a
            // GPT-2 small training step).
            let mut dwt = unfilled(n * k);
            product(&mut dwt, k, dy_m.t(), x_m);
            flex_strided(dwt, Shape::from(vec![k, n]), vec![1, k as isize])
        } else {
            let mut dw = unfilled(k * n);
            product(&mut dw, n, x_m.t(), dy_m);
            flex_vec(dw, Shape::from(vec![k, n]))
        }
    });
    let db = want[2].then(|| flex_vec(column_sums(dy.storage(), n), Shape::from(vec![n])));
    [dx, dw, db]
}

/// Sum over rows of a row-major `[rows, n]` matrix.
fn column_sums(v: &[f32], n: usize) -> Vec<f32> {
    let n = n.max(1);
    let rows_per_task = pool::rows_per_task(n);
    let tasks = (v.len() / n).div_ceil(rows_per_task);
    let mut partial = vec![0.0f32; tasks * n];
    pool::for_chunks(&mut partial, n, |i, acc| {
        for row in v[i * rows_per_task * n..((i + 1) * rows_per_task * n).min(v.len())].chunks_exact(n) {
            for (a, &r) in acc.iter_mut().zip(row) {
                *a += r;
            }
        }
    });
    let mut sums = vec![0.0f32; n];
    for p in partial.chunks_exact(n) {
        for (s, x) in sums.iter_mut().zip(p) {
            *s += *x;
        }
    }
    sums
}

#[derive(Debug)]
struct LinearBackward;

impl Backward<Flex, 2> for LinearBackward {
    /// Contiguous `x` and the weight.
    type State = (FlexTensor, FlexTensor);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_x, node_w] = ops.parents;
        let dy = grads.consume::<Flex>(&ops.node);
        let (x, w) = ops.state;
        let [dx, dw, _] = gradients(&x, &w, &dy, [node_x.is_some(), node_w.is_some(), false]);
        if let (Some(node), Some(g)) = (node_x, dx) {
            grads.register::<Flex>(node.id, g);
        }
        if let (Some(node), Some(g)) = (node_w, dw) {
            grads.register::<Flex>(node.id, g);
        }
    }
}

#[derive(Debug)]
struct LinearBiasBackward;

impl Backward<Flex, 3> for LinearBiasBackward {
    type State = (FlexTensor, FlexTensor);

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_x, node_w, node_b] = ops.parents;
        let dy = grads.consume::<Flex>(&ops.node);
        let (x, w) = ops.state;
        let [dx, dw, db] = gradients(&x, &w, &dy, [node_x.is_some(), node_w.is_some(), node_b.is_some()]);
        for (node, g) in [(node_x, dx), (node_w, dw), (node_b, db)] {
            if let (Some(node), Some(g)) = (node, g) {
                grads.register::<Flex>(node.id, g);
            }
        }
    }
}

impl<C: CheckpointStrategy> LinearKernel for Autodiff<Flex, C> {
    fn bl_linear(x: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self> {
        let pack = !w.is_tracked();
        let (x, gx) = x.into_parts();
        let (w, gw) = w.into_parts();
        match LinearBackward.prepare::<C>([gx, gw]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let (y, x) = flex_forward(&x, &w, None, pack);
                prep.finish((x, w), y)
            }
            OpsKind::UnTracked(prep) => prep.finish(flex_forward(&x, &w, None, pack).0),
        }
    }

    fn bl_linear_bias(x: FloatTensor<Self>, w: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self> {
        let pack = !w.is_tracked();
        let (x, gx) = x.into_parts();
        let (w, gw) = w.into_parts();
        let (b, gb) = b.into_parts();
        match LinearBiasBackward.prepare::<C>([gx, gw, gb]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let (y, x) = flex_forward(&x, &w, Some(&b), pack);
                prep.finish((x, w), y)
            }
            OpsKind::UnTracked(prep) => prep.finish(flex_forward(&x, &w, Some(&b), pack).0),
        }
    }
}
