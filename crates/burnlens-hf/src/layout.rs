//! Where each Hugging Face tensor goes in the canonical model, per family. Import and export
//! both read this one table, so the two directions cannot disagree.
//!
//! GPT-2 stores its projections as `Conv1D` weights, already `[in, out]` like burnlens's
//! right-multiplying layout, with Q, K and V fused in `c_attn`. GPT-Neo stores `nn.Linear`
//! weights `[out, in]` that must be transposed, and Q, K, V separately: they become the three
//! column blocks of the fused canonical `qkv` weight.

use burnlens_model::TransformerConfig;

use crate::config::Family;

/// How an HF tensor's values relate to its canonical parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// The same values in the same layout.
    Same,
    /// The HF tensor is the transpose of the canonical one.
    Transposed,
    /// The HF tensor, transposed, is column block `part` of 3 of the canonical one.
    QkvBlockTransposed { part: usize },
}

/// One tensor of an HF checkpoint.
#[derive(Debug, Clone)]
pub struct Entry {
    /// HF name without the `transformer.` prefix.
    pub hf: String,
    /// Shape in the HF file.
    pub hf_shape: Vec<usize>,
    /// Canonical parameter path (`blocks.0.attn.qkv.weight`).
    pub canonical: String,
    pub placement: Placement,
}

/// Buffers older HF versions saved next to the weights; never parameters.
pub fn is_legacy_buffer(name: &str) -> bool {
    let name = name.strip_prefix("transformer.").unwrap_or(name);
    ["attn.bias", "attn.masked_bias", "attn.attention.bias", "attn.attention.masked_bias"]
        .iter()
        .any(|suffix| name.starts_with("h.") && name.split_once('.').is_some_and(|(_, rest)| rest.split_once('.').is_some_and(|(_, tail)| tail == *suffix)))
}

/// The tensors a checkpoint of `family` with architecture `cfg` must hold (the tied
/// `lm_head.weight` is optional and not listed).
pub fn entries(family: Family, cfg: &TransformerConfig) -> Vec<Entry> {
    let d = cfg.d_model;
    let hd = cfg.n_heads * cfg.d_head;
    let m = cfg.d_mlp.unwrap_or(4 * d);
    let mut out = Vec::new();
    let mut add = |hf: String, hf_shape: Vec<usize>, canonical: String, placement| {
        out.push(Entry { hf, hf_shape, canonical, placement })
    };
    use Placement::*;
    add("wte.weight".into(), vec![cfg.vocab_size, d], "embed.weight".into(), Same);
    add("wpe.weight".into(), vec![cfg.n_ctx, d], "pos_embed.weight".into(), Same);
    for l in 0..cfg.n_layers() {
        let (h, b) = (format!("h.{l}"), format!("blocks.{l}"));
        for (hf_ln, ln) in [("ln_1", "ln1"), ("ln_2", "ln2")] {
            for p in ["weight", "bias"] {
                add(format!("{h}.{hf_ln}.{p}"), vec![d], format!("{b}.{ln}.{p}"), Same);
            }
        }
        match family {
            Family::Gpt2 => {
                add(format!("{h}.attn.c_attn.weight"), vec![d, 3 * hd], format!("{b}.attn.qkv.weight"), Same);
                add(format!("{h}.attn.c_attn.bias"), vec![3 * hd], format!("{b}.attn.qkv.bias"), Same);
                add(format!("{h}.attn.c_proj.weight"), vec![hd, d], format!("{b}.attn.out.weight"), Same);
                add(format!("{h}.attn.c_proj.bias"), vec![d], format!("{b}.attn.out.bias"), Same);
                add(format!("{h}.mlp.c_fc.weight"), vec![d, m], format!("{b}.mlp.fc_in.weight"), Same);
                add(format!("{h}.mlp.c_proj.weight"), vec![m, d], format!("{b}.mlp.fc_out.weight"), Same);
            }
            Family::GptNeo => {
                let a = format!("{h}.attn.attention");
                for (part, name) in ["q_proj", "k_proj", "v_proj"].iter().enumerate() {
                    add(format!("{a}.{name}.weight"), vec![hd, d], format!("{b}.attn.qkv.weight"), QkvBlockTransposed { part });
                }
                add(format!("{a}.out_proj.weight"), vec![d, hd], format!("{b}.attn.out.weight"), Transposed);
                add(format!("{a}.out_proj.bias"), vec![d], format!("{b}.attn.out.bias"), Same);
                add(format!("{h}.mlp.c_fc.weight"), vec![m, d], format!("{b}.mlp.fc_in.weight"), Transposed);
                add(format!("{h}.mlp.c_proj.weight"), vec![d, m], format!("{b}.mlp.fc_out.weight"), Transposed);
            }
        }
        add(format!("{h}.mlp.c_fc.bias"), vec![m], format!("{b}.mlp.fc_in.bias"), Same);
        add(format!("{h}.mlp.c_proj.bias"), vec![d], format!("{b}.mlp.fc_out.bias"), Same);
    }
    add("ln_f.weight".into(), vec![d], "ln_final.weight".into(), Same);
    add("ln_f.bias".into(), vec![d], "ln_final.bias".into(), Same);
    out
}

/// `[rows, cols]` row-major -> `[cols, rows]` row-major, in cache-sized tiles.
pub fn transpose(data: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    const TILE: usize = 32;
    let mut out = vec![0.0; data.len()];
    for r0 in (0..rows).step_by(TILE) {
        for c0 in (0..cols).step_by(TILE) {
            for r in r0..(r0 + TILE).min(rows) {
                for c in c0..(c0 + TILE).min(cols) {
                    out[c * rows + r] = data[r * cols + c];
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legacy_buffers_are_recognised_and_weights_are_not() {
        for b in ["h.0.attn.bias", "transformer.h.11.attn.masked_bias", "h.3.attn.attention.bias", "transformer.h.0.attn.attention.masked_bias"] {
            assert!(is_legacy_buffer(b), "{b}");
        }
        for w in ["h.0.attn.c_attn.bias", "h.0.attn.attention.out_proj.bias", "wte.weight", "h.0.mlp.c_fc.bias"] {
            assert!(!is_legacy_buffer(w), "{w}");
        }
    }

    #[test]
    fn transpose_round_trips() {
        let a: Vec<f32> = (0..6).map(|x| x as f32).collect();
        let t = transpose(&a, 2, 3);
        assert_eq!(t, vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
        assert_eq!(transpose(&t, 3, 2), a);
    }
}
