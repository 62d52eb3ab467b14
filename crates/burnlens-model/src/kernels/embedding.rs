//! Embedding lookup with a backward that writes its gradient once.
//!
//! Contract: `weight: [vocab, d]` f32, `ids: [batch, pos]` integer ids in `0..vocab`;
//! returns `[batch, pos, d]`, row `ids[b, p]` of `weight`. The backward adds each position's
//! output gradient into row `ids[b, p]` of a zeroed `[vocab, d]` gradient. Exact (the same
//! additions in the same order as Burn's `embedding_backward`).
//!
//! Why a kernel: Burn's flex makes the `[vocab, d]` gradient with `FlexTensor::zeros`, which
//! zeroes a byte vector and then copies it into a buffer of the runtime's alignment (its
//! alignment check reads the vector's declared alignment, one byte, so it always copies): for
//! GPT-2 small's 154 MB table that is a zeroing, a copy and a second 154 MB allocation per
//! training step, and in the second step 75,000 page faults (measured on the 2-core Zen 4
//! machine with `perf record -e page-faults`). Here the gradient is one zeroed `Vec<f32>`
//! handed to flex without a copy.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::flex::FlexTensor;
use burn::backend::tensor::{FloatTensor, IntTensor};
use burn::backend::{Autodiff, Backend, Dispatch, Flex, backend_extension};
use burn::tensor::{DType, Int, Shape, Tensor};

use super::flex::{contiguous, flex_vec, indices, use_kernels};
use super::unfilled::unfilled;

#[backend_extension(Flex, Autodiff)]
pub trait EmbeddingKernel: Backend {
    fn bl_embedding(weight: FloatTensor<Self>, ids: IntTensor<Self>) -> FloatTensor<Self>;
}

/// Rows `ids` of `weight`: the kernel on flex with an f32 table, Burn's
/// `module::embedding` elsewhere (half tables included: gathered as stored).
pub fn embedding(weight: Tensor<2>, ids: Tensor<2, Int>) -> Tensor<3> {
    if use_kernels(&[&weight.device()], &[weight.dtype()]) && matches!(ids.dtype(), DType::I64 | DType::I32) {
        Tensor::from_dispatch(Dispatch::bl_embedding(weight.into_dispatch(), ids.into_dispatch()))
    } else {
        burn::tensor::module::embedding(weight, ids)
    }
}

/// `out[t] = weight[ids[t]]` for a `[vocab, d]` table whose element `(i, j)` is
/// `weight[offset + i·rs + j·cs]` (read in place: a view is never copied whole).
pub fn forward(weight: &[f32], [offset, rs, cs]: [isize; 3], d: usize, ids: &[usize], out: &mut [f32]) {
    for (o, &id) in out.chunks_exact_mut(d).zip(ids) {
        let row = offset + id as isize * rs;
        if cs == 1 {
            o.copy_from_slice(&weight[row as usize..row as usize + d]);
        } else {
            o.iter_mut().enumerate().for_each(|(j, o)| *o = weight[(row + j as isize * cs) as usize]);
        }
    }
}

/// `dw[ids[t]] += dy[t]` for contiguous `dy [tokens, d]`, `dw` zeroed by the caller.
pub fn backward(dy: &[f32], d: usize, ids: &[usize], dw: &mut [f32]) {
    for (g, &id) in dy.chunks_exact(d).zip(ids) {
        dw[id * d..(id + 1) * d].iter_mut().zip(g).for_each(|(w, g)| *w += g);
    }
}

/// The ids as indices, each checked against the table's `vocab` rows.
fn checked_ids(ids: &FlexTensor, vocab: usize) -> Vec<usize> {
    let ids = indices(ids, "embedding ids");
    if let Some(bad) = ids.iter().find(|&&i| i >= vocab) {
        panic!("embedding: id {bad} is outside the table's {vocab} rows");
    }
    ids
}

fn flex_forward(weight: &FlexTensor, ids: &[usize], dims: [usize; 2]) -> FlexTensor {
    super::flex::record(super::flex::Op::Embedding, false);
    let layout = weight.layout();
    let d = layout.shape()[1];
    let view = [layout.start_offset() as isize, layout.strides()[0], layout.strides()[1]];
    let mut out = unfilled(ids.len() * d);
    forward(weight.storage(), view, d, ids, &mut out);
    flex_vec(out, Shape::from(vec![dims[0], dims[1], d]))
}

fn ids_dims(ids: &FlexTensor) -> [usize; 2] {
    let s = ids.layout().shape();
    assert_eq!(s.num_dims(), 2, "embedding: ids must be [batch, pos], found {} dimensions", s.num_dims());
    [s[0], s[1]]
}

impl EmbeddingKernel for Flex {
    fn bl_embedding(weight: FlexTensor, ids: FlexTensor) -> FlexTensor {
        let vocab = weight.layout().shape()[0];
        flex_forward(&weight, &checked_ids(&ids, vocab), ids_dims(&ids))
    }
}

#[derive(Debug)]
struct EmbeddingBackward;

impl Backward<Flex, 1> for EmbeddingBackward {
    /// The ids and the table's `[vocab, d]`.
    type State = (Vec<usize>, [usize; 2]);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        super::flex::record(super::flex::Op::Embedding, true);
        let [node] = ops.parents;
        let dy = contiguous(&grads.consume::<Flex>(&ops.node));
        let (ids, [vocab, d]) = ops.state;
        if let Some(node) = node {
            let mut dw = vec![0.0f32; vocab * d];
            backward(dy.storage(), d, &ids, &mut dw);
            grads.register::<Flex>(node.id, flex_vec(dw, Shape::from(vec![vocab, d])));
        }
    }
}

impl<C: CheckpointStrategy> EmbeddingKernel for Autodiff<Flex, C> {
    fn bl_embedding(weight: FloatTensor<Self>, ids: IntTensor<Self>) -> FloatTensor<Self> {
        let (weight, g) = weight.into_parts();
        let table = [weight.layout().shape()[0], weight.layout().shape()[1]];
        let dims = ids_dims(&ids);
        let ids = checked_ids(&ids, table[0]);
        match EmbeddingBackward.prepare::<C>([g]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let out = flex_forward(&weight, &ids, dims);
                prep.finish((ids, table), out)
            }
            OpsKind::UnTracked(prep) => prep.finish(flex_forward(&weight, &ids, dims)),
        }
    }
}
