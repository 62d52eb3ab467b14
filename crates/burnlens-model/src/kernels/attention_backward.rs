//! The attention kernel under autodiff: what the forward keeps (`out` and the
//! log-sum-exp of each row) and the backward steps that recompute the pattern block by
//! block from it (see [`super::attention`]).

use super::attention::{AttentionKernel, AttentionMask, GradOut, Heads, backward, flex_forward, flex_forward_qkv, heads_layout, headwise, mask_of, qkv_heads};
use super::flex::{flex_strided, flex_vec};
use super::pool::SendPtr;
use super::unfilled::unfilled;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::flex::FlexTensor;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Flex};

#[derive(Debug)]
struct AttentionBackward;

/// What both backward steps keep from the forward besides their inputs.
#[derive(Debug, Clone)]
struct Saved {
    out: FlexTensor,
    lse: Vec<f32>,
    scale: f64,
    mask: AttentionMask,
}

impl Saved {
    /// The gradients of the heads `[q, k, v]` from `d_out`, written where `outs` say.
    ///
    /// # Safety
    /// As for [`backward`].
    unsafe fn backward(&self, [qh, kh, vh]: [Heads; 3], d_out: &FlexTensor, outs: [GradOut; 3]) {
        let (o, d_out) = (headwise(&self.out), headwise(d_out));
        unsafe { backward(&qh, &kh, &vh, &Heads::of(&o), &Heads::of(&d_out), &self.lse, self.scale as f32, self.mask, outs) };
    }
}

#[derive(Debug, Clone)]
struct AttentionState {
    q: FlexTensor,
    k: FlexTensor,
    v: FlexTensor,
    saved: Saved,
}

impl Backward<Flex, 3> for AttentionBackward {
    type State = AttentionState;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        super::flex::record(super::flex::Op::Attention, true);
        let [node_q, node_k, node_v] = ops.parents;
        let d_out = grads.consume::<Flex>(&ops.node);
        let st = ops.state;
        let (q, k, v) = (headwise(&st.q), headwise(&st.k), headwise(&st.v));
        let (qh, kh) = (Heads::of(&q), Heads::of(&k));
        let [b, h, t, dh] = qh.dims;
        let [_, hk, s, _] = kh.dims;
        let mut dq = unfilled(b * t * h * dh);
        let mut dk = unfilled(b * s * hk * dh);
        let mut dv = unfilled(b * s * hk * dh);
        let out = |g: &mut Vec<f32>, heads: usize| GradOut { ptr: SendPtr(g.as_mut_ptr()), row: heads * dh, first: 0 };
        let outs = [out(&mut dq, h), out(&mut dk, hk), out(&mut dv, hk)];
        // SAFETY: three separate buffers of exactly `[b, positions, heads, dh]`.
        unsafe { st.saved.backward([qh, kh, Heads::of(&v)], &d_out, outs) };
        for (node, g, heads, len) in [(node_q, dq, h, t), (node_k, dk, hk, s), (node_v, dv, hk, s)] {
            if let Some(node) = node {
                let (shape, strides) = heads_layout(b, heads, len, dh);
                grads.register::<Flex>(node.id, flex_strided(g, shape, strides));
            }
        }
    }
}

#[derive(Debug)]
struct AttentionQkvBackward;

#[derive(Debug, Clone)]
struct AttentionQkvState {
    qkv: FlexTensor,
    heads: [usize; 2],
    saved: Saved,
}

impl Backward<Flex, 1> for AttentionQkvBackward {
    type State = AttentionQkvState;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        super::flex::record(super::flex::Op::Attention, true);
        let [node] = ops.parents;
        let d_out = grads.consume::<Flex>(&ops.node);
        let Some(node) = node else { return };
        let st = ops.state;
        let qkv = headwise(&st.qkv);
        let shape = qkv.layout().shape().clone();
        let ([h, hk], dh) = (st.heads, shape[3]);
        let row = (h + 2 * hk) * dh;
        let mut g = unfilled(shape.num_elements());
        let ptr = SendPtr(g.as_mut_ptr());
        let outs = [0, h, h + hk].map(|first| GradOut { ptr, row, first: first * dh });
        // SAFETY: the three parts of one `[b, pos, h + 2 hk, dh]` buffer, disjoint heads.
        unsafe { st.saved.backward(qkv_heads(&qkv, st.heads), &d_out, outs) };
        grads.register::<Flex>(node.id, flex_vec(g, shape));
    }
}

impl<C: CheckpointStrategy> AttentionKernel for Autodiff<Flex, C> {
    fn bl_attention_qkv(qkv: FloatTensor<Self>, heads: [usize; 2], scale: f64, q_offset: usize, window: usize) -> FloatTensor<Self> {
        let mask = mask_of(q_offset, window);
        let (qkv, g) = qkv.into_parts();
        match AttentionQkvBackward.prepare::<C>([g]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let (out, lse) = flex_forward_qkv(&qkv, heads, scale, mask, true);
                prep.finish(AttentionQkvState { qkv, heads, saved: Saved { out: out.clone(), lse, scale, mask } }, out)
            }
            OpsKind::UnTracked(prep) => prep.finish(flex_forward_qkv(&qkv, heads, scale, mask, false).0),
        }
    }

    fn bl_attention(q: FloatTensor<Self>, k: FloatTensor<Self>, v: FloatTensor<Self>, scale: f64, q_offset: usize, window: usize) -> FloatTensor<Self> {
        let mask = mask_of(q_offset, window);
        let (q, gq) = q.into_parts();
        let (k, gk) = k.into_parts();
        let (v, gv) = v.into_parts();
        match AttentionBackward.prepare::<C>([gq, gk, gv]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let (out, lse) = flex_forward(&q, &k, &v, scale, mask, true);
                prep.finish(AttentionState { q, k, v, saved: Saved { out: out.clone(), lse, scale, mask } }, out)
            }
            OpsKind::UnTracked(prep) => prep.finish(flex_forward(&q, &k, &v, scale, mask, false).0),
        }
    }
}
