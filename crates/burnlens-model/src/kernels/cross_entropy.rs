//! Fused softmax–cross-entropy over the vocabulary.
//!
//! Contract: `logits: [rows, vocab]` (any strides; rows read in place), `targets: [rows]`
//! integer ids in `0..vocab`; returns the mean of `logsumexp(row) - row[target]` as `[1]`.
//! The forward keeps one log-sum-exp per row; the backward writes
//! `dlogits = g / rows * (softmax(row) - onehot(target))` in one pass, never materialising
//! the log-probabilities. Tolerance 1e-5 relative (value), 1e-4 (gradient).

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::flex::FlexTensor;
use burn::backend::tensor::{FloatTensor, IntTensor};
use burn::backend::{Autodiff, Backend, Dispatch, Flex, backend_extension};
use burn::tensor::activation::log_softmax;
use burn::tensor::{DType, Int, Shape, Tensor};

use super::exp;
use super::flex::{contiguous, flex_vec, indices, use_kernels};
use super::pool;
use super::simd::{self, dispatch};
use super::unfilled::unfilled;

#[backend_extension(Flex, Autodiff)]
pub trait CrossEntropyKernel: Backend {
    fn bl_cross_entropy(logits: FloatTensor<Self>, targets: IntTensor<Self>) -> FloatTensor<Self>;
}

/// Mean cross-entropy of `logits: [rows, vocab]` against `targets: [rows]`; returns `[1]`.
pub fn cross_entropy(logits: Tensor<2>, targets: Tensor<1, Int>) -> Tensor<1> {
    if use_kernels(&[&logits.device()], &[logits.dtype()]) && matches!(targets.dtype(), DType::I64 | DType::I32) {
        Tensor::from_dispatch(Dispatch::bl_cross_entropy(logits.into_dispatch(), targets.into_dispatch()))
    } else {
        cross_entropy_reference(logits, targets)
    }
}

/// The composed reference: log-softmax, gather, mean.
pub fn cross_entropy_reference(logits: Tensor<2>, targets: Tensor<1, Int>) -> Tensor<1> {
    let rows = logits.dims()[0];
    log_softmax(logits, 1).gather(1, targets.reshape([rows, 1])).mean().neg()
}

fn targets_vec(t: &FlexTensor) -> Vec<usize> {
    indices(t, "cross-entropy targets")
}

/// Per-row log-sum-exp of contiguous `logits [rows, vocab]`.
pub fn logsumexp_rows(logits: &[f32], vocab: usize, lse: &mut [f32]) {
    let rows_per_task = pool::rows_per_task(vocab);
    pool::for_chunks(lse, rows_per_task, |i, lse| {
        for (r, l) in lse.iter_mut().enumerate() {
            let row = &logits[(i * rows_per_task + r) * vocab..(i * rows_per_task + r + 1) * vocab];
            *l = dispatch!(|row: &[f32]| -> f32 {
                let m = simd::max_by(row, |x| x);
                if m == f32::NEG_INFINITY {
                    return m;
                }
                m + simd::sum_by(row, |x| exp::exp(x - m)).ln()
            });
        }
    });
}

/// `dlogits = scale * (exp(row - lse) - onehot(target))`.
pub fn backward(logits: &[f32], vocab: usize, lse: &[f32], targets: &[usize], scale: f32, dlogits: &mut [f32]) {
    let rows_per_task = pool::rows_per_task(vocab);
    pool::for_chunks(dlogits, rows_per_task * vocab, |i, block| {
        for (r, d) in block.chunks_exact_mut(vocab).enumerate() {
            let row_index = i * rows_per_task + r;
            let (row, l, t) = (&logits[row_index * vocab..(row_index + 1) * vocab], lse[row_index], targets[row_index]);
            dispatch!(|d: &mut [f32], row: &[f32], l: f32, scale: f32| -> () {
                for (d, &x) in d.iter_mut().zip(row) {
                    *d = scale * exp::exp(x - l);
                }
            });
            if t < d.len() {
                d[t] -= scale;
            }
        }
    });
}

/// `(loss [1], lse [rows])` on contiguous logits.
fn flex_forward(logits: &FlexTensor, targets: &[usize]) -> (FlexTensor, Vec<f32>) {
    super::flex::record(super::flex::Op::CrossEntropy, false);
    let dims = logits.layout().shape().clone();
    let (rows, vocab) = (dims[0], dims[1]);
    assert_eq!(targets.len(), rows, "cross-entropy: {rows} rows of logits but {} targets", targets.len());
    let x = logits.storage::<f32>();
    let mut lse = vec![0.0f32; rows];
    logsumexp_rows(x, vocab, &mut lse);
    let mut total = 0.0f64;
    for (r, (&l, &t)) in lse.iter().zip(targets).enumerate() {
        assert!(t < vocab, "cross-entropy: target {t} at row {r} is outside the vocabulary of {vocab}");
        total += (l - x[r * vocab + t]) as f64;
    }
    let loss = if rows == 0 { f32::NAN } else { (total / rows as f64) as f32 };
    (flex_vec(vec![loss], Shape::from(vec![1])), lse)
}

impl CrossEntropyKernel for Flex {
    fn bl_cross_entropy(logits: FlexTensor, targets: FlexTensor) -> FlexTensor {
        flex_forward(&contiguous(&logits), &targets_vec(&targets)).0
    }
}

#[derive(Debug)]
struct CrossEntropyBackward;

impl Backward<Flex, 1> for CrossEntropyBackward {
    /// Contiguous logits, per-row log-sum-exp, targets.
    type State = (FlexTensor, Vec<f32>, Vec<usize>);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        super::flex::record(super::flex::Op::CrossEntropy, true);
        let [node] = ops.parents;
        let g = contiguous(&grads.consume::<Flex>(&ops.node)).storage::<f32>()[0];
        let (logits, lse, targets) = ops.state;
        if let Some(node) = node {
            let shape = logits.layout().shape().clone();
            let (rows, vocab) = (shape[0], shape[1]);
            let mut d = unfilled(rows * vocab);
            backward(logits.storage(), vocab, &lse, &targets, g / rows as f32, &mut d);
            grads.register::<Flex>(node.id, flex_vec(d, shape));
        }
    }
}

impl<C: CheckpointStrategy> CrossEntropyKernel for Autodiff<Flex, C> {
    fn bl_cross_entropy(logits: FloatTensor<Self>, targets: IntTensor<Self>) -> FloatTensor<Self> {
        let (logits, g) = logits.into_parts();
        let logits = contiguous(&logits);
        let targets = targets_vec(&targets);
        match CrossEntropyBackward.prepare::<C>([g]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let (loss, lse) = flex_forward(&logits, &targets);
                prep.finish((logits, lse, targets), loss)
            }
            OpsKind::UnTracked(prep) => prep.finish(flex_forward(&logits, &targets).0),
        }
    }
}
