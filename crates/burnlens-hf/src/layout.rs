//! Where each Hugging Face tensor goes in the canonical model, per family. Import and export
//! both read this one table, so the two directions cannot disagree.
//!
//! - GPT-2 stores its projections as `Conv1D` weights, already `[in, out]` like burnlens's
//!   right-multiplying layout, with Q, K and V fused in `c_attn`.
//! - GPT-Neo and the Llama family store `nn.Linear` weights `[out, in]`, which are
//!   transposed, and Q, K, V separately: they become column blocks of the fused canonical
//!   `qkv` weight (K and V narrower than Q under grouped-query attention). Llama's gated MLP
//!   has `gate_proj` (`W_gate`), `up_proj` (`W_in`) and `down_proj` (`W_out`).
//! - GPT-NeoX fuses Q, K, V in `query_key_value` with rows grouped per head,
//!   `[head, (q, k, v), d_head]`; they are regrouped into the canonical Q | K | V blocks.
//! - Untied unembeddings (`embed_out` in GPT-NeoX, `lm_head` in Llama-family checkpoints that
//!   do not tie) are `[vocab, d_model]` and transposed into `W_U`.

use burnlens_model::{NormKind, TransformerConfig};

use crate::config::Family;

/// How an HF tensor's values relate to its canonical parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// The same values in the same layout.
    Same,
    /// The HF tensor is the transpose of the canonical one.
    Transposed,
    /// The HF `nn.Linear` weight `[width, d_in]` (transposed) or bias `[width]` is column
    /// block (element block for a bias) `start..start + width` of the canonical parameter.
    Block { start: usize },
    /// GPT-NeoX's fused `query_key_value` weight `[heads * 3 * d_head, d_in]` or bias, rows
    /// ordered `(head, q/k/v, i)`, is the whole canonical Q | K | V (`(q/k/v, head, i)`).
    NeoxQkv { heads: usize, d_head: usize },
}

/// One tensor of an HF checkpoint.
#[derive(Debug, Clone)]
pub struct Entry {
    /// HF name without the family's base-model prefix (`transformer.`, `gpt_neox.`, `model.`).
    pub hf: String,
    /// Whether the name lives under that prefix (`lm_head.weight` and `embed_out.weight` do not).
    pub prefixed: bool,
    /// Shape in the HF file.
    pub hf_shape: Vec<usize>,
    /// Canonical parameter path (`blocks.0.attn.qkv.weight`).
    pub canonical: String,
    pub placement: Placement,
}

impl Entry {
    /// The full name written on export.
    pub fn full_name(&self, family: Family) -> String {
        if self.prefixed { format!("{}{}", family.base_prefix(), self.hf) } else { self.hf.clone() }
    }
}

/// Buffers older HF versions saved next to the weights; never parameters.
pub fn is_legacy_buffer(name: &str) -> bool {
    let mut prefixes: Vec<&str> = Family::ALL.iter().map(|f| f.base_prefix()).collect();
    prefixes.dedup();
    let name = prefixes.iter().fold(name, |n, p| n.strip_prefix(p).unwrap_or(n));
    let Some(rest) = name.strip_prefix("h.").or_else(|| name.strip_prefix("layers.")) else { return false };
    let Some((layer, tail)) = rest.split_once('.') else { return false };
    layer.parse::<usize>().is_ok()
        && [
            "attn.bias",
            "attn.masked_bias",
            "attn.attention.bias",
            "attn.attention.masked_bias",
            "attention.bias",
            "attention.masked_bias",
            "attention.rotary_emb.inv_freq",
            "self_attn.rotary_emb.inv_freq",
        ]
        .contains(&tail)
}

/// The tensors a checkpoint of `family` with architecture `cfg` must hold (a tied
/// `lm_head.weight` is optional and not listed).
pub fn entries(family: Family, cfg: &TransformerConfig) -> Vec<Entry> {
    let d = cfg.d_model;
    let (h, hk, dh) = (cfg.n_heads, cfg.kv_heads(), cfg.d_head);
    let hd = h * dh;
    let m = cfg.d_mlp.unwrap_or(4 * d);
    let mut out = Vec::new();
    let mut add = |hf: String, hf_shape: Vec<usize>, canonical: String, placement| out.push(Entry { hf, prefixed: true, hf_shape, canonical, placement });
    use Placement::*;
    let norm = |add: &mut dyn FnMut(String, Vec<usize>, String, Placement), hf: &str, canonical: &str| {
        add(format!("{hf}.weight"), vec![d], format!("{canonical}.weight"), Same);
        if cfg.norm == NormKind::LayerNorm {
            add(format!("{hf}.bias"), vec![d], format!("{canonical}.bias"), Same);
        }
    };
    match family {
        Family::Gpt2 | Family::GptNeo => {
            add("wte.weight".into(), vec![cfg.vocab_size, d], "embed.weight".into(), Same);
            add("wpe.weight".into(), vec![cfg.n_ctx, d], "pos_embed.weight".into(), Same);
        }
        Family::GptNeoX => add("embed_in.weight".into(), vec![cfg.vocab_size, d], "embed.weight".into(), Same),
        Family::Llama | Family::Qwen2 | Family::Mistral => add("embed_tokens.weight".into(), vec![cfg.vocab_size, d], "embed.weight".into(), Same),
    }
    for l in 0..cfg.n_layers() {
        let b = format!("blocks.{l}");
        match family {
            Family::Gpt2 => {
                let h = format!("h.{l}");
                norm(&mut add, &format!("{h}.ln_1"), &format!("{b}.ln1"));
                norm(&mut add, &format!("{h}.ln_2"), &format!("{b}.ln2"));
                add(format!("{h}.attn.c_attn.weight"), vec![d, 3 * hd], format!("{b}.attn.qkv.weight"), Same);
                add(format!("{h}.attn.c_attn.bias"), vec![3 * hd], format!("{b}.attn.qkv.bias"), Same);
                add(format!("{h}.attn.c_proj.weight"), vec![hd, d], format!("{b}.attn.out.weight"), Same);
                add(format!("{h}.attn.c_proj.bias"), vec![d], format!("{b}.attn.out.bias"), Same);
                add(format!("{h}.mlp.c_fc.weight"), vec![d, m], format!("{b}.mlp.fc_in.weight"), Same);
                add(format!("{h}.mlp.c_proj.weight"), vec![m, d], format!("{b}.mlp.fc_out.weight"), Same);
                add(format!("{h}.mlp.c_fc.bias"), vec![m], format!("{b}.mlp.fc_in.bias"), Same);
                add(format!("{h}.mlp.c_proj.bias"), vec![d], format!("{b}.mlp.fc_out.bias"), Same);
            }
            Family::GptNeo => {
                let h = format!("h.{l}");
                norm(&mut add, &format!("{h}.ln_1"), &format!("{b}.ln1"));
                norm(&mut add, &format!("{h}.ln_2"), &format!("{b}.ln2"));
                let a = format!("{h}.attn.attention");
                for (part, name) in ["q_proj", "k_proj", "v_proj"].iter().enumerate() {
                    add(format!("{a}.{name}.weight"), vec![hd, d], format!("{b}.attn.qkv.weight"), Block { start: part * hd });
                }
                add(format!("{a}.out_proj.weight"), vec![d, hd], format!("{b}.attn.out.weight"), Transposed);
                add(format!("{a}.out_proj.bias"), vec![d], format!("{b}.attn.out.bias"), Same);
                add(format!("{h}.mlp.c_fc.weight"), vec![m, d], format!("{b}.mlp.fc_in.weight"), Transposed);
                add(format!("{h}.mlp.c_proj.weight"), vec![d, m], format!("{b}.mlp.fc_out.weight"), Transposed);
                add(format!("{h}.mlp.c_fc.bias"), vec![m], format!("{b}.mlp.fc_in.bias"), Same);
                add(format!("{h}.mlp.c_proj.bias"), vec![d], format!("{b}.mlp.fc_out.bias"), Same);
            }
            Family::GptNeoX => {
                let h = format!("layers.{l}");
                norm(&mut add, &format!("{h}.input_layernorm"), &format!("{b}.ln1"));
                norm(&mut add, &format!("{h}.post_attention_layernorm"), &format!("{b}.ln2"));
                let qkv = NeoxQkv { heads: cfg.n_heads, d_head: dh };
                add(format!("{h}.attention.query_key_value.weight"), vec![3 * hd, d], format!("{b}.attn.qkv.weight"), qkv);
                if cfg.qkv_bias {
                    add(format!("{h}.attention.query_key_value.bias"), vec![3 * hd], format!("{b}.attn.qkv.bias"), qkv);
                }
                add(format!("{h}.attention.dense.weight"), vec![d, hd], format!("{b}.attn.out.weight"), Transposed);
                if cfg.attn_out_bias {
                    add(format!("{h}.attention.dense.bias"), vec![d], format!("{b}.attn.out.bias"), Same);
                }
                add(format!("{h}.mlp.dense_h_to_4h.weight"), vec![m, d], format!("{b}.mlp.fc_in.weight"), Transposed);
                add(format!("{h}.mlp.dense_4h_to_h.weight"), vec![d, m], format!("{b}.mlp.fc_out.weight"), Transposed);
                if cfg.mlp_bias {
                    add(format!("{h}.mlp.dense_h_to_4h.bias"), vec![m], format!("{b}.mlp.fc_in.bias"), Same);
                    add(format!("{h}.mlp.dense_4h_to_h.bias"), vec![d], format!("{b}.mlp.fc_out.bias"), Same);
                }
            }
            Family::Llama | Family::Qwen2 | Family::Mistral => {
                let h = format!("layers.{l}");
                norm(&mut add, &format!("{h}.input_layernorm"), &format!("{b}.ln1"));
                norm(&mut add, &format!("{h}.post_attention_layernorm"), &format!("{b}.ln2"));
                let a = format!("{h}.self_attn");
                for (name, start, rows) in [("q_proj", 0, hd), ("k_proj", hd, hk * dh), ("v_proj", hd + hk * dh, hk * dh)] {
                    add(format!("{a}.{name}.weight"), vec![rows, d], format!("{b}.attn.qkv.weight"), Block { start });
                    if cfg.qkv_bias {
                        add(format!("{a}.{name}.bias"), vec![rows], format!("{b}.attn.qkv.bias"), Block { start });
                    }
                }
                add(format!("{a}.o_proj.weight"), vec![d, hd], format!("{b}.attn.out.weight"), Transposed);
                if cfg.attn_out_bias {
                    add(format!("{a}.o_proj.bias"), vec![d], format!("{b}.attn.out.bias"), Same);
                }
                for (name, canonical, shape) in [("gate_proj", "fc_gate", vec![m, d]), ("up_proj", "fc_in", vec![m, d]), ("down_proj", "fc_out", vec![d, m])] {
                    let bias_len = shape[0];
                    add(format!("{h}.mlp.{name}.weight"), shape, format!("{b}.mlp.{canonical}.weight"), Transposed);
                    if cfg.mlp_bias {
                        add(format!("{h}.mlp.{name}.bias"), vec![bias_len], format!("{b}.mlp.{canonical}.bias"), Same);
                    }
                }
            }
        }
    }
    match family {
        Family::Gpt2 | Family::GptNeo => norm(&mut add, "ln_f", "ln_final"),
        Family::GptNeoX => norm(&mut add, "final_layer_norm", "ln_final"),
        Family::Llama | Family::Qwen2 | Family::Mistral => norm(&mut add, "norm", "ln_final"),
    }
    if cfg.untied_unembed {
        let name = if family == Family::GptNeoX { "embed_out.weight" } else { "lm_head.weight" };
        out.push(Entry { hf: name.into(), prefixed: false, hf_shape: vec![cfg.vocab_size, d], canonical: "unembed.weight".into(), placement: Transposed });
    }
    out
}

/// The canonical column (weight) or element (bias) that row `r` of the HF tensor maps to.
fn target_index(placement: Placement, r: usize) -> usize {
    match placement {
        Placement::Block { start } => start + r,
        Placement::NeoxQkv { heads, d_head } => {
            let (head, part, i) = (r / (3 * d_head), (r / d_head) % 3, r % d_head);
            part * heads * d_head + head * d_head + i
        }
        Placement::Same | Placement::Transposed => r,
    }
}

/// Import: write the HF tensor `values` of entry `e` into the canonical parameter `out` of
/// shape `canonical` (allocated on first use, as several entries may share one parameter).
/// `values` is moved, not copied, when the layouts agree: loading holds at most one tensor
/// besides the model.
pub fn place(e: &Entry, values: Vec<f32>, canonical: &[usize], out: &mut Option<Vec<f32>>) {
    let n: usize = canonical.iter().product();
    match e.placement {
        Placement::Same => *out = Some(values),
        Placement::Transposed => *out = Some(transpose(&values, e.hf_shape[0], e.hf_shape[1])),
        p @ (Placement::Block { .. } | Placement::NeoxQkv { .. }) => {
            let buf = out.get_or_insert_with(|| vec![0.0; n]);
            if canonical.len() == 1 {
                for (r, &v) in values.iter().enumerate() {
                    buf[target_index(p, r)] = v;
                }
            } else {
                // HF [rows, d_in] (rows = output features) -> canonical [d_in, cols].
                let (rows, d_in, cols) = (e.hf_shape[0], e.hf_shape[1], canonical[1]);
                for r in 0..rows {
                    let c = target_index(p, r);
                    for i in 0..d_in {
                        buf[i * cols + c] = values[r * d_in + i];
                    }
                }
            }
        }
    }
}

/// Export: the HF tensor of entry `e` cut from the canonical parameter `values` of shape
/// `canonical` (the inverse of [`place`]).
pub fn extract(e: &Entry, values: &[f32], canonical: &[usize]) -> Vec<f32> {
    match e.placement {
        Placement::Same => values.to_vec(),
        Placement::Transposed => transpose(values, canonical[0], canonical[1]),
        p @ (Placement::Block { .. } | Placement::NeoxQkv { .. }) => {
            if canonical.len() == 1 {
                (0..e.hf_shape[0]).map(|r| values[target_index(p, r)]).collect()
            } else {
                let (rows, d_in, cols) = (e.hf_shape[0], e.hf_shape[1], canonical[1]);
                let mut out = vec![0.0; rows * d_in];
                for r in 0..rows {
                    let c = target_index(p, r);
                    for i in 0..d_in {
                        out[r * d_in + i] = values[i * cols + c];
                    }
                }
                out
            }
        }
    }
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
        for b in [
            "h.0.attn.bias",
            "transformer.h.11.attn.masked_bias",
            "h.3.attn.attention.bias",
            "transformer.h.0.attn.attention.masked_bias",
            "gpt_neox.layers.2.attention.rotary_emb.inv_freq",
            "gpt_neox.layers.0.attention.bias",
            "model.layers.5.self_attn.rotary_emb.inv_freq",
        ] {
            assert!(is_legacy_buffer(b), "{b}");
        }
        for w in ["h.0.attn.c_attn.bias", "h.0.attn.attention.out_proj.bias", "wte.weight", "h.0.mlp.c_fc.bias", "gpt_neox.layers.0.attention.dense.bias", "model.layers.0.self_attn.q_proj.bias"] {
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

    #[test]
    fn every_placement_round_trips_through_place_and_extract() {
        let cfg = TransformerConfig::llama_like(11, 8, 12, 1, 4, 2);
        for family in [Family::Gpt2, Family::GptNeo, Family::GptNeoX, Family::Llama] {
            let mut cfg = cfg.clone();
            if matches!(family, Family::Gpt2 | Family::GptNeo) {
                cfg = TransformerConfig::gpt2_like(11, 8, 12, 1, 4);
            }
            if family == Family::GptNeoX {
                cfg.n_kv_heads = None;
                cfg.qkv_bias = true;
            }
            let table = entries(family, &cfg);
            let mut canon: std::collections::BTreeMap<String, (Vec<usize>, Option<Vec<f32>>)> = Default::default();
            let hf: Vec<Vec<f32>> = table.iter().enumerate().map(|(k, e)| (0..e.hf_shape.iter().product::<usize>()).map(|i| (k * 1000 + i) as f32).collect()).collect();
            for (e, v) in table.iter().zip(&hf) {
                let shape = canonical_shape(e);
                let slot = canon.entry(e.canonical.clone()).or_insert((shape, None));
                place(e, v.clone(), &slot.0.clone(), &mut slot.1);
            }
            for (e, v) in table.iter().zip(&hf) {
                let (shape, values) = &canon[&e.canonical];
                assert_eq!(&extract(e, values.as_ref().unwrap(), shape), v, "{family:?} {}", e.hf);
            }
        }
    }

    fn canonical_shape(e: &Entry) -> Vec<usize> {
        match e.placement {
            Placement::Same => e.hf_shape.clone(),
            Placement::Transposed => vec![e.hf_shape[1], e.hf_shape[0]],
            Placement::NeoxQkv { .. } => if e.hf_shape.len() == 1 { e.hf_shape.clone() } else { vec![e.hf_shape[1], e.hf_shape[0]] },
            // The fused qkv of the test configs: 12 wide (q) + 2 * 6 (k, v) for Llama, 3 * 12 for GPT-Neo.
            Placement::Block { .. } => {
                let width = if e.hf.contains("self_attn") { 24 } else { 36 };
                if e.hf_shape.len() == 1 { vec![width] } else { vec![e.hf_shape[1], width] }
            }
        }
    }
}
