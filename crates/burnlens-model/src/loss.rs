//! Next-token cross-entropy losses.

use burn::tensor::{Int, Tensor, TensorData};

use crate::kernels;

/// Mean next-token cross-entropy: position `p` predicts token `p + 1`.
/// `logits: [batch, pos, vocab]`, `ids: [batch, pos]`; returns `[1]`.
pub fn next_token_loss(logits: Tensor<3>, ids: Tensor<2, Int>) -> Tensor<1> {
    let t = logits.dims()[1];
    assert!(t >= 2, "next-token loss needs at least two positions");
    cross_entropy(logits.narrow(1, 0, t - 1), ids.narrow(1, 1, t - 1))
}

/// [`next_token_loss`] of a padded batch: the mean over the pairs (position `p` predicting
/// `p + 1`) whose two tokens are both real (`real[b][p]`, false at padding); NaN when no
/// pair is. Every position counts without `real`.
pub fn next_token_loss_of_real(logits: Tensor<3>, ids: Tensor<2, Int>, real: Option<&[Vec<bool>]>) -> Tensor<1> {
    let Some(real) = real else { return next_token_loss(logits, ids) };
    let [b, t, v] = logits.dims();
    let device = logits.device();
    let pairs = t.saturating_sub(1);
    let keep: Vec<i64> = (0..b).flat_map(|i| (0..pairs).filter(move |&p| real[i][p] && real[i][p + 1]).map(move |p| (i * pairs + p) as i64)).collect();
    if keep.is_empty() {
        return Tensor::from_data(TensorData::new(vec![f32::NAN], [1]), &device);
    }
    let rows = Tensor::<1, Int>::from_data(TensorData::new(keep.clone(), [keep.len()]), &device);
    let x = logits.narrow(1, 0, pairs).reshape([b * pairs, v]).select(0, rows.clone());
    let y = ids.narrow(1, 1, pairs).reshape([b * pairs]).select(0, rows);
    kernels::cross_entropy(x, y)
}

/// Mean cross-entropy of `logits: [batch, pos, vocab]` against `targets: [batch, pos]`;
/// returns `[1]`.
pub fn cross_entropy(logits: Tensor<3>, targets: Tensor<2, Int>) -> Tensor<1> {
    let [b, t, v] = logits.dims();
    kernels::cross_entropy(logits.reshape([b * t, v]), targets.reshape([b * t]))
}
