//! A cross-layer transcoder trained as one transcoder with block-structured weights. Its input
//! is every layer's input hook side by side (`[n, L·d_in]`), its target every layer's output
//! hook (`[n, L·d_out]`), its features the layers' features one after another (`L·F`). Layer
//! `l`'s features read only layer `l`'s input (`W_enc`'s diagonal blocks) and write to layers
//! `l..L` (`W_dec`'s blocks on and above the diagonal): both matrices are masked at
//! initialisation and their gradients masked at every step, so Adam never moves the other
//! blocks off zero. The loss is the transcoder's: the MSE summed over all output layers, the
//! sparsity of every feature with its decoder norm taken over all the layers it writes to
//! (Anthropic's CLT penalty). The zero blocks cost memory and products (an `L×` wider encoder,
//! twice the decoder): fine for small models, a known cost for large ones.

use burn::tensor::{Device, Tensor, TensorData};

use burnlens_lens::dictionary::Dictionary;

use crate::params::Shape;

/// Where a cross-layer transcoder's blocks lie in the one transcoder's matrices.
#[derive(Debug, Clone)]
pub struct Blocks {
    pub layers: usize,
    /// Per layer.
    pub d_in: usize,
    pub d_out: usize,
    pub features: usize,
    /// `[L·d_in, L·F]` and `[L·F, L·d_out]`: 1 inside the blocks, 0 outside.
    enc_mask: Tensor<2>,
    dec_mask: Tensor<2>,
}

impl Blocks {
    pub fn new(layers: usize, d_in: usize, d_out: usize, features: usize, device: &Device) -> Self {
        let (fs, ins, outs) = (layers * features, layers * d_in, layers * d_out);
        let enc: Vec<f32> = (0..ins * fs).map(|i| f32::from(i / fs / d_in == i % fs / features)).collect();
        let dec: Vec<f32> = (0..fs * outs).map(|i| f32::from(i / outs / features <= i % outs / d_out)).collect();
        Blocks {
            layers,
            d_in,
            d_out,
            features,
            enc_mask: Tensor::from_data(TensorData::new(enc, [ins, fs]), device),
            dec_mask: Tensor::from_data(TensorData::new(dec, [fs, outs]), device),
        }
    }

    /// The one transcoder's shape.
    pub fn shape(&self) -> Shape {
        Shape { d_in: self.layers * self.d_in, d_sae: self.layers * self.features, d_out: self.layers * self.d_out, transcoder: true, skip: false }
    }

    /// `p` (or gradients shaped like it) with everything outside the blocks zero.
    pub fn mask(&self, p: Dictionary) -> Dictionary {
        let w_dec = p.w_dec.into_iter().map(|w| w * self.dec_mask.clone()).collect();
        Dictionary { w_enc: p.w_enc * self.enc_mask.clone(), w_dec, ..p }
    }

    /// Layer `l`'s encoder `[d_in, F]` out of the one transcoder's `[L·d_in, L·F]`.
    pub fn encoder(&self, w_enc: &Tensor<2>, l: usize) -> Tensor<2> {
        w_enc.clone().slice([l * self.d_in..(l + 1) * self.d_in, l * self.features..(l + 1) * self.features])
    }

    /// Layer `l`'s decoders `[F, L − l, d_out]`, to layers `l..L`.
    pub fn decoders(&self, w_dec: &Tensor<2>, l: usize) -> Tensor<3> {
        let rows = w_dec.clone().slice([l * self.features..(l + 1) * self.features, l * self.d_out..self.layers * self.d_out]);
        rows.reshape([self.features, self.layers - l, self.d_out])
    }

    /// Layer `l`'s part of a per-feature vector (`[L·F]` → `[F]`).
    pub fn features_of(&self, v: &Tensor<1>, l: usize) -> Tensor<1> {
        v.clone().slice([l * self.features..(l + 1) * self.features])
    }

    /// Layer `l`'s part of a per-output vector (`[L·d_out]` → `[d_out]`).
    pub fn outputs_of(&self, v: &Tensor<1>, l: usize) -> Tensor<1> {
        v.clone().slice([l * self.d_out..(l + 1) * self.d_out])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_masks_keep_the_diagonal_encoders_and_the_later_decoders() {
        let device = Device::default();
        let b = Blocks::new(3, 2, 2, 1, &device);
        let enc: Vec<f32> = b.enc_mask.clone().into_data().try_into_vec_as::<f32>().unwrap();
        // [6, 3]: rows 0-1 read by feature 0, 2-3 by 1, 4-5 by 2.
        assert_eq!(enc, vec![1., 0., 0., 1., 0., 0., 0., 1., 0., 0., 1., 0., 0., 0., 1., 0., 0., 1.]);
        let dec: Vec<f32> = b.dec_mask.clone().into_data().try_into_vec_as::<f32>().unwrap();
        // [3, 6]: feature 0 writes to layers 0-2, feature 1 to 1-2, feature 2 to 2.
        assert_eq!(dec, vec![1., 1., 1., 1., 1., 1., 0., 0., 1., 1., 1., 1., 0., 0., 0., 0., 1., 1.]);
        let w = Tensor::<2>::from_data(TensorData::new((0..18).map(|i| i as f32).collect::<Vec<_>>(), [3, 6]), &device);
        let d1: Vec<f32> = b.decoders(&w, 1).into_data().try_into_vec_as::<f32>().unwrap();
        assert_eq!(d1, vec![8., 9., 10., 11.]);
    }
}
