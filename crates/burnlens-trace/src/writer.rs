//! The active features that write one layer's MLP output, laid out for the backward pass.
//!
//! A feature's direct effect on a batch of targets is its scaled decoder row dotted with the
//! targets' gradient at its own position: a product per position. Done so, a 1,024-token
//! prompt costs 1,024 small products (and as many launches on a GPU) per layer and batch.
//! Here positions are grouped into blocks of consecutive positions, each padded to its
//! busiest position's feature count (padding rows scaled by zero), so a block's effects are
//! one batched product `[positions, batch, d] · [positions, d, width]` and one `select` of
//! the real slots. Blocks grow while padding stays under about half of the slots and the
//! block's decoder rows under [`BLOCK_FLOATS`].

use std::ops::Range;

use burn::tensor::{Device, Int, Tensor, TensorData};
use burnlens_model::matmul::matmul;

use crate::transcoder::indices;

/// The most floats of decoder rows one block gathers (`slots · d_model`).
pub const BLOCK_FLOATS: usize = 1 << 24;

/// A block of several positions holds at most `2 · real + SLACK` slots (`real`: its active
/// features).
const SLACK: usize = 64;

/// One source layer's active features as they write one output layer: decoder `decoder` of
/// layer `source`'s transcoder, read for the active features when needed (a copy of every
/// active feature's decoder row would take `n_active · d_model` floats).
pub(crate) struct Writer {
    pub source: usize,
    pub decoder: usize,
    /// Index of the source layer's first active feature among all active features.
    pub first_feature: usize,
    pub layout: Layout,
}

/// A source layer's active features by position, in blocks (shared by its decoders).
#[derive(Clone)]
pub(crate) struct Layout {
    /// Position `p`'s active features are `starts[p]..starts[p + 1]` (in position order).
    pub starts: Vec<usize>,
    blocks: Vec<Block>,
}

/// Consecutive positions whose features are contracted in one product.
#[derive(Clone)]
struct Block {
    positions: Range<usize>,
    /// Slots per position.
    width: usize,
    /// Each slot's feature index `[len · width]` (padding: feature 0)...
    features: Tensor<1, Int>,
    /// ...and activation `[len · width, 1]` (padding: 0).
    scales: Tensor<2>,
    /// The slot of each active feature of the block, in order `[n]`.
    slots: Tensor<1, Int>,
}

/// The blocks of positions for per-position feature counts `counts`, each with its width.
pub(crate) fn plan(counts: &[usize], d_model: usize) -> Vec<(Range<usize>, usize)> {
    let max_slots = (BLOCK_FLOATS / d_model.max(1)).max(1);
    let mut out = Vec::new();
    let mut start = 0;
    while start < counts.len() {
        let (mut width, mut real, mut end) = (counts[start], counts[start], start + 1);
        while end < counts.len() {
            let (w, r) = (width.max(counts[end]), real + counts[end]);
            let slots = (end + 1 - start) * w;
            if slots > 2 * r + SLACK || (slots > max_slots && end > start) {
                break;
            }
            (width, real, end) = (w, r, end + 1);
        }
        out.push((start..end, width));
        start = end;
    }
    out
}

impl Layout {
    /// The layout of active features with indices `features` and activations `values`,
    /// position `p`'s at `starts[p]..starts[p + 1]`.
    pub(crate) fn new(starts: Vec<usize>, features: &[i64], values: &[f32], d_model: usize, device: &Device) -> Self {
        let counts: Vec<usize> = starts.windows(2).map(|w| w[1] - w[0]).collect();
        let blocks = plan(&counts, d_model)
            .into_iter()
            .map(|(positions, width)| {
                let len = positions.len();
                let (mut idx, mut scale, mut slots) = (vec![0i64; len * width], vec![0f32; len * width], Vec::new());
                for (k, p) in positions.clone().enumerate() {
                    for (r, j) in (starts[p]..starts[p + 1]).enumerate() {
                        (idx[k * width + r], scale[k * width + r]) = (features[j], values[j]);
                        slots.push((k * width + r) as i64);
                    }
                }
                Block {
                    positions,
                    width,
                    features: indices(idx, device),
                    scales: Tensor::from_data(TensorData::new(scale, [len * width, 1]), device),
                    slots: indices(slots, device),
                }
            })
            .collect();
        Self { starts, blocks }
    }

    /// The direct effects `[batch, starts[p]]` of the features at positions before `p` on
    /// targets whose gradient at this layer's output hook is `g_out [batch, p, d_model]`;
    /// `w_dec [features, d_model]` is the decoder the features write through. `None` when no
    /// feature sits before `p`.
    pub(crate) fn effects(&self, w_dec: &Tensor<2>, g_out: &Tensor<3>) -> Option<Tensor<2>> {
        let [b, p, d] = g_out.dims();
        let mut pieces = Vec::new();
        for block in self.blocks.iter().take_while(|k| k.positions.start < p) {
            let first = block.positions.start;
            let len = block.positions.len().min(p - first);
            let n = self.starts[first + len] - self.starts[first];
            if n == 0 {
                continue;
            }
            let (width, slots) = (block.width, len * block.width);
            let dec = w_dec.clone().select(0, block.features.clone().narrow(0, 0, slots)) * block.scales.clone().narrow(0, 0, slots);
            let g = g_out.clone().narrow(1, first, len).swap_dims(0, 1);
            let y = matmul(g, dec.reshape([len, width, d]).swap_dims(1, 2));
            pieces.push(y.swap_dims(0, 1).reshape([b, slots]).select(1, block.slots.clone().narrow(0, 0, n)));
        }
        (!pieces.is_empty()).then(|| Tensor::cat(pieces, 1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> u64 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        *seed >> 33
    }

    #[test]
    fn blocks_cover_the_positions_in_order_with_bounded_padding() {
        let mut seed = 3;
        for case in 0..40 {
            let n = 1 + (lcg(&mut seed) % 300) as usize;
            let spread = 1 + case as u64 * 7;
            let mut counts: Vec<usize> = (0..n).map(|_| (lcg(&mut seed) % spread) as usize).collect();
            counts[0] = 0;
            if case % 5 == 0 {
                counts[n / 2] = 5_000;
            }
            let d = [4, 64, 768, 4096][case % 4];
            let blocks = plan(&counts, d);
            assert_eq!(blocks.first().map(|b| b.0.start), Some(0));
            assert!(blocks.windows(2).all(|w| w[0].0.end == w[1].0.start), "contiguous");
            assert_eq!(blocks.last().map(|b| b.0.end), Some(n));
            for (r, width) in &blocks {
                assert_eq!(*width, counts[r.clone()].iter().copied().max().unwrap());
                let (slots, real) = (r.len() * width, counts[r.clone()].iter().sum::<usize>());
                assert!(r.len() == 1 || (slots <= 2 * real + SLACK && slots * d <= BLOCK_FLOATS), "{r:?} width {width}");
            }
        }
    }

    #[test]
    fn a_layouts_effects_are_each_features_dot_product_at_its_position() {
        let device = Device::default();
        let (n_feat, d, b, n_pos) = (40, 6, 3, 23);
        let mut seed = 11;
        let rnd = |s: &mut u64| (lcg(s) % 2001) as f32 / 1000.0 - 1.0;
        let w_dec: Vec<f32> = (0..n_feat * d).map(|_| rnd(&mut seed)).collect();
        let g: Vec<f32> = (0..b * n_pos * d).map(|_| rnd(&mut seed)).collect();
        // Uneven counts (none at 0 and 7, many at 12) so there are several blocks and padding.
        let counts: Vec<usize> = (0..n_pos)
            .map(|p| {
                if p == 0 || p == 7 {
                    0
                } else if p == 12 {
                    30
                } else {
                    1 + p % 4
                }
            })
            .collect();
        let mut starts = vec![0];
        let (mut feats, mut vals) = (Vec::new(), Vec::new());
        for &c in &counts {
            for _ in 0..c {
                feats.push((lcg(&mut seed) % n_feat as u64) as i64);
                vals.push(rnd(&mut seed).abs() + 0.1);
            }
            starts.push(feats.len());
        }
        // At d 6, BLOCK_FLOATS never splits: the padding rule splits around the busy position.
        let layout = Layout::new(starts.clone(), &feats, &vals, d, &device);
        assert!(layout.blocks.len() >= 3, "{} blocks", layout.blocks.len());
        let w_t = Tensor::<2>::from_data(TensorData::new(w_dec.clone(), [n_feat, d]), &device);
        for p in [1, 2, 7, 8, 12, 13, 20, n_pos] {
            let g_t = Tensor::<3>::from_data(TensorData::new(g.clone(), [b, n_pos, d]), &device).narrow(1, 0, p);
            let n = starts[p];
            let got: Vec<f32> = match layout.effects(&w_t, &g_t) {
                Some(t) => {
                    assert_eq!(t.dims(), [b, n]);
                    t.into_data().try_into_vec_as::<f32>().unwrap()
                }
                None => vec![],
            };
            assert_eq!(got.len(), b * n, "p {p}");
            for k in 0..b {
                for pos in 0..p {
                    for j in starts[pos]..starts[pos + 1] {
                        let f = feats[j] as usize;
                        let want: f32 = (0..d).map(|i| g[(k * n_pos + pos) * d + i] * w_dec[f * d + i] * vals[j]).sum();
                        let at = got[k * n + j];
                        assert!((at - want).abs() <= 1e-5 * (1.0 + want.abs()), "p {p} target {k} feature {j}: {at} vs {want}");
                    }
                }
            }
        }
    }
}
