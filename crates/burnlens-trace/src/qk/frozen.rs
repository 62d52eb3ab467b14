//! A norm with its scale frozen, as the attribution graph freezes it: at each position (and
//! head, for a per-head QK-norm) `v ↦ center(v) / s · w`, a linear map, plus the norm's
//! bias (a LayerNorm's) as a constant. Summing the map over the parts of a vector gives the
//! norm of the whole vector exactly, because the scale `s` is that of the whole.

use std::ops::Range;

use burn::tensor::Tensor;
use burnlens_model::{Activation, Norm, NormKind, f32_val};

use crate::TraceError;
use crate::transcoder::tensor;

pub(crate) struct Frozen<'m> {
    norm: &'m Norm,
    /// The captured scales, `per` a position (one, or one per head).
    scales: Vec<f32>,
    per: usize,
}

impl<'m> Frozen<'m> {
    /// `norm` with the scales captured at its `hook_scale` (`[1, pos, 1]`, or `[1, pos,
    /// heads, 1]` for a per-head QK-norm).
    pub fn new(norm: &'m Norm, scale: &Activation) -> Result<Self, TraceError> {
        // Flattened position-major: position `p`, head `h` at `p · per + h`.
        let (per, data) = match (scale.rank3(), scale.rank4()) {
            (Some(s), _) => (1, s.into_data()),
            (None, Some(s)) => (s.dims()[2], s.into_data()),
            _ => return Err(TraceError::Mismatch("a norm's hook_scale is neither [batch, pos, 1] nor [batch, pos, head, 1]".into())),
        };
        let scales = data.try_into_vec_as::<f32>().expect("f32");
        Ok(Self { norm, scales, per })
    }

    /// The linear part for `rows [n, w]` at `positions` (their `head`'s scale where there is
    /// one per head), with the gain's elements `range`.
    pub fn linear(&self, rows: Tensor<2>, positions: &[usize], head: usize, range: Range<usize>) -> Tensor<2> {
        let [n, w] = rows.dims();
        let rows = match self.norm.kind {
            NormKind::LayerNorm => rows.clone() - rows.mean_dim(1),
            NormKind::RmsNorm => rows,
        };
        let s: Vec<f32> = positions.iter().map(|&p| self.scales[p * self.per + head]).collect();
        let device = rows.device();
        let gain = f32_val(&self.norm.weight).slice([range]).reshape([1, w]);
        rows / tensor(s, [n, 1], &device) * gain
    }

    /// `w [d, n]` with the linear part's position-free factors folded in: the gain, and a
    /// LayerNorm's centring (`(v − mean v)·g·w = v·(g·w − its column means)`), so that
    /// `linear(v)·w = (v · fold(w)) / s` at each position.
    pub fn fold(&self, w: Tensor<2>) -> Tensor<2> {
        let d = w.dims()[0];
        let gained = w * f32_val(&self.norm.weight).reshape([d, 1]);
        match self.norm.kind {
            NormKind::LayerNorm => gained.clone() - gained.mean_dim(0),
            NormKind::RmsNorm => gained,
        }
    }

    /// The frozen scales `s` at `positions` (per position; `[n, 1]`), that `fold`'s product divides by.
    pub fn scales_at(&self, positions: &[usize], device: &burn::tensor::Device) -> Tensor<2> {
        tensor(positions.iter().map(|&p| self.scales[p * self.per]).collect(), [positions.len(), 1], device)
    }

    /// The constant part, `[w]`: the bias's elements `range`, if the norm has a bias.
    pub fn bias(&self, range: Range<usize>) -> Option<Tensor<1>> {
        self.norm.bias.as_ref().map(|b| b.val().slice([range]))
    }
}
