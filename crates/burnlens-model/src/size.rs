//! A model's size, from one walk over its parameters: [`TransformerConfig::build`] with every
//! parameter left uninitialised (Burn's lazy parameters: nothing is allocated, so an 8B
//! shape costs microseconds) names each parameter and its shape. The parameter count, the
//! weights each token's products read and a forward pass's FLOPs all come from that walk,
//! so they follow the builder wherever the architecture goes.

use burn::tensor::Device;

use crate::{ModelError, ParamInit, TransformerConfig};

/// One parameter of the architecture: its module path (`blocks.0.attn.qkv.weight`) and
/// canonical shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamShape {
    pub name: String,
    pub shape: Vec<usize>,
}

impl ParamShape {
    pub fn numel(&self) -> u128 {
        self.shape.iter().map(|&d| d as u128).product()
    }

    /// Whether every token's forward pass multiplies by it: a matrix other than the
    /// embeddings, which are looked up.
    pub fn is_product(&self) -> bool {
        self.shape.len() == 2 && !self.name.starts_with("embed.") && !self.name.starts_with("pos_embed.")
    }
}

impl TransformerConfig {
    /// Every parameter, in the order [`build`](Self::build) makes them.
    pub fn param_shapes(&self) -> Result<Vec<ParamShape>, ModelError> {
        let mut out = Vec::new();
        self.build(&Device::flex(), |name, shape, init| {
            out.push(ParamShape { name: name.to_string(), shape: shape.to_vec() });
            Ok::<_, ModelError>(ParamInit::Random(init))
        })?;
        Ok(out)
    }

    /// Number of trainable scalars (a tied unembedding counted once).
    pub fn n_params(&self) -> Result<u128, ModelError> {
        Ok(self.param_shapes()?.iter().map(ParamShape::numel).sum())
    }

    /// Weights one token's products read: every projection and the unembedding (the
    /// embedding matrix again when the two are tied). Times the dtype's size, what a
    /// decoding step streams from memory.
    pub fn product_weights(&self) -> Result<u128, ModelError> {
        let tied = if self.untied_unembed { 0 } else { self.vocab_size as u128 * self.d_model as u128 };
        Ok(self.param_shapes()?.iter().filter(|p| p.is_product()).map(ParamShape::numel).sum::<u128>() + tied)
    }

    /// Floating-point operations of one forward pass over `batch × seq` tokens: the
    /// products (two per weight per token) and the attention core (`QKᵀ` and `PV` over the
    /// keys each query sees); the element-wise work is not counted.
    pub fn forward_flops(&self, batch: usize, seq: usize) -> Result<f64, ModelError> {
        let tokens = (batch * seq) as f64;
        let visible_keys = batch as f64 * (seq * (seq + 1) / 2) as f64;
        let attention = 4.0 * (self.n_heads * self.d_head) as f64 * self.n_layers() as f64 * visible_keys;
        Ok(2.0 * self.product_weights()? as f64 * tokens + attention)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MlpKind;

    #[test]
    fn the_walk_counts_gpt2_small_and_a_gated_grouped_model() {
        let gpt2 = TransformerConfig::gpt2_like(50257, 1024, 768, 12, 12);
        // GPT-2 small: 124,439,808 parameters, the unembedding tied to the embedding.
        assert_eq!(gpt2.n_params().unwrap(), 124_439_808);
        let per_layer = 768 * 3 * 768 + 768 * 768 + 2 * 768 * 3072;
        assert_eq!(gpt2.product_weights().unwrap(), 12 * per_layer + 768 * 50257);
        let shapes = gpt2.param_shapes().unwrap();
        assert_eq!(shapes[0], ParamShape { name: "blocks.0.ln1.weight".into(), shape: vec![768] });
        assert!(shapes.iter().any(|p| p.name == "embed.weight" && !p.is_product()));
        let mut c = TransformerConfig::gpt2_like(1000, 64, 64, 2, 8);
        (c.mlp, c.n_kv_heads, c.d_mlp, c.untied_unembed) = (MlpKind::Gated, Some(2), Some(96), true);
        let qkv = 64 * (8 + 2 * 2) * 8;
        assert_eq!(c.product_weights().unwrap(), 2 * (qkv + 64 * 64 + 3 * 64 * 96) + 64 * 1000);
        let flops = c.forward_flops(2, 10).unwrap();
        assert_eq!(flops, 2.0 * c.product_weights().unwrap() as f64 * 20.0 + 4.0 * 64.0 * 2.0 * 2.0 * 55.0);
    }

    /// The walk allocates nothing: Llama 3.1 8B's shape (32 GB in f32) is counted at once.
    #[test]
    fn an_8b_shape_is_walked_without_allocating() {
        let mut c = TransformerConfig::gpt2_like(128_256, 8192, 4096, 32, 32);
        (c.norm, c.mlp, c.n_kv_heads, c.d_mlp, c.untied_unembed, c.qkv_bias, c.mlp_bias, c.attn_out_bias, c.unembed_bias) =
            (crate::NormKind::RmsNorm, MlpKind::Gated, Some(8), Some(14_336), true, false, false, false, false);
        (c.positional, c.rotary) = (crate::Positional::Rotary, Some(crate::Rotary { dims: 128, base: 500_000.0, scaling: None, interleaved: false }));
        let t = std::time::Instant::now();
        assert_eq!(c.n_params().unwrap(), 8_030_261_248);
        assert!(t.elapsed().as_secs_f64() < 5.0, "the walk took {:?}: it allocated", t.elapsed());
    }
}
