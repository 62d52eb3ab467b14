//! Where each Hugging Face tensor goes in the canonical model. Each family lists its tensors
//! (`FamilySpec::tensors`, in its own file) with the [`Tensors`] builder, and
//! `Family::entries` gives the table import and export both read, so the two directions
//! cannot disagree. This module knows no family: it is the layer the families stand on.
//!
//! - `Conv1D` weights (GPT-2) are already `[in, out]` like burnlens's right-multiplying
//!   layout; `nn.Linear` weights `[out, in]` are transposed.
//! - Separate Q, K, V (and fused `qkv_proj` rows) become column blocks of the fused canonical
//!   `qkv` weight (K and V narrower than Q under grouped-query attention).
//! - GPT-NeoX fuses Q, K, V in `query_key_value` with rows grouped per head,
//!   `[head, (q, k, v), d_head]`; they are regrouped into the canonical Q | K | V blocks.
//! - Gemma's norms multiply by `1 + w`: the canonical gain is `1 + w`, so the model's norm
//!   is an ordinary one (as TransformerLens converts it).

use burnlens_model::{NormKind, TransformerConfig};

use crate::checkpoint::Elem;

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
    /// The canonical values are the HF values plus one (Gemma's norm gains `1 + w`).
    PlusOne,
    /// Rows `start..start + rows` of a fused `nn.Linear` weight `[_, d_in]` (Phi-3's
    /// `gate_up_proj`) are the whole canonical `[d_in, rows]` parameter; the HF tensor is
    /// shared with other entries (export writes it once, assembled from all of them).
    Rows { start: usize, rows: usize },
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

/// The builder a family lists its tensors with.
pub struct Tensors {
    cfg: TransformerConfig,
    out: Vec<Entry>,
}

impl Tensors {
    /// An empty table for architecture `cfg`.
    pub(crate) fn new(cfg: &TransformerConfig) -> Self {
        Tensors { cfg: cfg.clone(), out: Vec::new() }
    }

    /// The entries listed.
    pub(crate) fn into_entries(self) -> Vec<Entry> {
        self.out
    }

    /// One tensor under the base-model prefix.
    pub fn add(&mut self, hf: String, hf_shape: Vec<usize>, canonical: String, placement: Placement) {
        self.out.push(Entry { hf, prefixed: true, hf_shape, canonical, placement });
    }

    /// One tensor outside the base-model prefix (`lm_head.weight`).
    pub fn add_unprefixed(&mut self, hf: &str, hf_shape: Vec<usize>, canonical: &str, placement: Placement) {
        self.out.push(Entry { hf: hf.into(), prefixed: false, hf_shape, canonical: canonical.into(), placement });
    }

    /// A `d_model`-wide norm: `{hf}.weight` (and `{hf}.bias` for a LayerNorm).
    pub fn norm(&mut self, hf: &str, canonical: &str) {
        let d = self.cfg.d_model;
        self.norm_of_width(hf, canonical, d, Placement::Same);
    }

    /// A norm of `width` gains, placed as `gain` says (Gemma: [`Placement::PlusOne`]).
    pub fn norm_of_width(&mut self, hf: &str, canonical: &str, width: usize, gain: Placement) {
        self.add(format!("{hf}.weight"), vec![width], format!("{canonical}.weight"), gain);
        if self.cfg.norm == NormKind::LayerNorm {
            self.add(format!("{hf}.bias"), vec![width], format!("{canonical}.bias"), Placement::Same);
        }
    }

    /// An `nn.Linear` `[d_out, d_in]` that is the whole canonical `[d_in, d_out]` projection
    /// `canonical`, with its bias when `bias`.
    pub fn linear(&mut self, hf: &str, canonical: &str, d_in: usize, d_out: usize, bias: bool) {
        self.add(format!("{hf}.weight"), vec![d_out, d_in], format!("{canonical}.weight"), Placement::Transposed);
        if bias {
            self.add(format!("{hf}.bias"), vec![d_out], format!("{canonical}.bias"), Placement::Same);
        }
    }

    /// Separate `q_proj`, `k_proj`, `v_proj` `nn.Linear`s under `hf` as the column blocks of
    /// the fused canonical `{canonical}.qkv` (biases when the model has q/k/v biases).
    pub fn split_qkv(&mut self, hf: &str, canonical: &str, names: [&str; 3]) {
        let (h, hk, dh, d) = (self.cfg.n_heads, self.cfg.kv_heads(), self.cfg.d_head, self.cfg.d_model);
        let hd = h * dh;
        for (name, start, rows) in [(names[0], 0, hd), (names[1], hd, hk * dh), (names[2], hd + hk * dh, hk * dh)] {
            self.add(format!("{hf}.{name}.weight"), vec![rows, d], format!("{canonical}.qkv.weight"), Placement::Block { start });
            if self.cfg.qkv_bias {
                self.add(format!("{hf}.{name}.bias"), vec![rows], format!("{canonical}.qkv.bias"), Placement::Block { start });
            }
        }
    }

    /// A gated MLP's `gate_proj`, `up_proj`, `down_proj` under `hf`.
    pub fn gated_mlp(&mut self, hf: &str, canonical: &str) {
        let (d, m, bias) = (self.cfg.d_model, self.cfg.d_mlp.unwrap_or(4 * self.cfg.d_model), self.cfg.mlp_bias);
        self.linear(&format!("{hf}.gate_proj"), &format!("{canonical}.fc_gate"), d, m, bias);
        self.linear(&format!("{hf}.up_proj"), &format!("{canonical}.fc_in"), d, m, bias);
        self.linear(&format!("{hf}.down_proj"), &format!("{canonical}.fc_out"), m, d, bias);
    }

    /// Change the placement of the entries of canonical parameter `canonical`.
    pub fn set_placement(&mut self, canonical: &str, placement: Placement) {
        for e in self.out.iter_mut().filter(|e| e.canonical == canonical) {
            e.placement = placement;
        }
    }

    /// An untied unembedding stored as `name` `[vocab, d_model]` (outside the prefix), with
    /// `{name}.bias` when the model has `b_U`.
    pub fn unembed(&mut self, name: &str) {
        if self.cfg.untied_unembed {
            let (v, d) = (self.cfg.vocab_size, self.cfg.d_model);
            self.add_unprefixed(&format!("{name}.weight"), vec![v, d], "unembed.weight", Placement::Transposed);
            if self.cfg.unembed_bias {
                self.add_unprefixed(&format!("{name}.bias"), vec![v], "unembed.bias", Placement::Same);
            }
        }
    }
}

/// The canonical column (weight) or element (bias) that row `r` of the HF tensor maps to.
fn target_index(placement: Placement, r: usize) -> usize {
    match placement {
        Placement::Block { start } => start + r,
        Placement::NeoxQkv { heads, d_head } => {
            let (head, part, i) = (r / (3 * d_head), (r / d_head) % 3, r % d_head);
            part * heads * d_head + head * d_head + i
        }
        Placement::Same | Placement::Transposed | Placement::PlusOne | Placement::Rows { .. } => r,
    }
}

/// Import: write the HF tensor `values` of entry `e` into the canonical parameter `out` of
/// shape `canonical` (allocated on first use, as several entries may share one parameter).
/// `values` is moved, not copied, when the layouts agree: loading holds at most one tensor
/// besides the model.
pub fn place<T: Elem>(e: &Entry, values: Vec<T>, canonical: &[usize], out: &mut Option<Vec<T>>) {
    let n: usize = canonical.iter().product();
    match e.placement {
        Placement::Same => *out = Some(values),
        Placement::PlusOne => *out = Some(values.into_iter().map(|v| T::from_f32(v.to_f32() + 1.0)).collect()),
        Placement::Transposed => *out = Some(transpose(&values, e.hf_shape[0], e.hf_shape[1])),
        Placement::Rows { start, rows } => {
            let d_in = e.hf_shape[1];
            *out = Some(transpose(&values[start * d_in..(start + rows) * d_in], rows, d_in));
        }
        p @ (Placement::Block { .. } | Placement::NeoxQkv { .. }) => {
            let buf = out.get_or_insert_with(|| vec![T::default(); n]);
            if canonical.len() == 1 {
                for (r, &v) in values.iter().enumerate() {
                    buf[target_index(p, r)] = v;
                }
            } else {
                // HF [rows, d_in] (rows = output features) -> canonical [d_in, cols], a tile
                // of rows at a time: each source row is read in order and each canonical row
                // written in runs (one column at a time wrote a cache line per value).
                const TILE: usize = 32;
                let (rows, d_in, cols) = (e.hf_shape[0], e.hf_shape[1], canonical[1]);
                for r0 in (0..rows).step_by(TILE) {
                    let targets: Vec<usize> = (r0..(r0 + TILE).min(rows)).map(|r| target_index(p, r)).collect();
                    for (i, dst) in buf.chunks_exact_mut(cols).enumerate().take(d_in) {
                        for (j, &c) in targets.iter().enumerate() {
                            dst[c] = values[(r0 + j) * d_in + i];
                        }
                    }
                }
            }
        }
    }
}

/// Import into the transpose of the canonical layout, `[cols, d_in]` for a `[d_in, cols]`
/// parameter (how `nn.Linear` stores it): every HF row is one contiguous row there, so a
/// fused or split weight is assembled by row copies, with no transpose. Returns `false` for
/// an entry whose HF tensor is not `[out, in]` (GPT-2's `Conv1D`, vectors).
pub fn place_transposed<T: Elem>(e: &Entry, values: &[T], canonical: &[usize], out: &mut Option<Vec<T>>) -> bool {
    let [d_in, cols] = canonical[..] else { return false };
    let rows_of = |first: usize, count: usize| &values[first * d_in..(first + count) * d_in];
    match e.placement {
        Placement::Transposed => *out = Some(values.to_vec()),
        Placement::Rows { start, rows } => *out = Some(rows_of(start, rows).to_vec()),
        p @ (Placement::Block { .. } | Placement::NeoxQkv { .. }) => {
            let buf = out.get_or_insert_with(|| vec![T::default(); cols * d_in]);
            for r in 0..e.hf_shape[0] {
                let c = target_index(p, r);
                buf[c * d_in..(c + 1) * d_in].copy_from_slice(rows_of(r, 1));
            }
        }
        Placement::Same | Placement::PlusOne => return false,
    }
    true
}

/// Export: the HF tensor of entry `e` cut from the canonical parameter `values` of shape
/// `canonical` (the inverse of [`place`]).
pub fn extract(e: &Entry, values: &[f32], canonical: &[usize]) -> Vec<f32> {
    match e.placement {
        Placement::Same => values.to_vec(),
        Placement::PlusOne => values.iter().map(|v| v - 1.0).collect(),
        Placement::Transposed => transpose(values, canonical[0], canonical[1]),
        // Only this entry's rows; the exporter places them into the shared tensor.
        Placement::Rows { .. } => transpose(values, canonical[0], canonical[1]),
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
pub fn transpose<T: Copy + Default>(data: &[T], rows: usize, cols: usize) -> Vec<T> {
    const TILE: usize = 32;
    let mut out = vec![T::default(); data.len()];
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
    use crate::family::{Family, is_legacy_buffer};

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
        for w in [
            "h.0.attn.c_attn.bias",
            "h.0.attn.attention.out_proj.bias",
            "wte.weight",
            "h.0.mlp.c_fc.bias",
            "gpt_neox.layers.0.attention.dense.bias",
            "model.layers.0.self_attn.q_proj.bias",
        ] {
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
        for family in [Family::Gpt2, Family::GptNeo, Family::GptNeoX, Family::Llama, Family::GptJ, Family::Phi3] {
            let mut cfg = cfg.clone();
            if matches!(family, Family::Gpt2 | Family::GptNeo | Family::GptJ) {
                cfg = TransformerConfig::gpt2_like(11, 8, 12, 1, 4);
            }
            if family == Family::GptNeoX {
                cfg.n_kv_heads = None;
                cfg.qkv_bias = true;
            }
            let table = family.entries(&cfg);
            let mut canon: std::collections::BTreeMap<String, (Vec<usize>, Option<Vec<f32>>)> = Default::default();
            let hf: Vec<Vec<f32>> =
                table.iter().enumerate().map(|(k, e)| (0..e.hf_shape.iter().product::<usize>()).map(|i| (k * 1000 + i) as f32).collect()).collect();
            for (e, v) in table.iter().zip(&hf) {
                let shape = canonical_shape(e);
                let slot = canon.entry(e.canonical.clone()).or_insert((shape, None));
                place(e, v.clone(), &slot.0.clone(), &mut slot.1);
            }
            for (e, v) in table.iter().zip(&hf) {
                let (shape, values) = &canon[&e.canonical];
                let want = match e.placement {
                    Placement::Rows { start, rows } => &v[start * e.hf_shape[1]..(start + rows) * e.hf_shape[1]],
                    _ => &v[..],
                };
                assert_eq!(extract(e, values.as_ref().unwrap(), shape), want, "{family:?} {}", e.hf);
            }
        }
    }

    fn canonical_shape(e: &Entry) -> Vec<usize> {
        match e.placement {
            Placement::Same | Placement::PlusOne => e.hf_shape.clone(),
            Placement::Rows { rows, .. } => vec![e.hf_shape[1], rows],
            Placement::Transposed => vec![e.hf_shape[1], e.hf_shape[0]],
            Placement::NeoxQkv { .. } => {
                if e.hf_shape.len() == 1 {
                    e.hf_shape.clone()
                } else {
                    vec![e.hf_shape[1], e.hf_shape[0]]
                }
            }
            // The fused qkv of the test configs: 12 wide (q) + 2 * 6 (k, v) for Llama, 3 * 12 for GPT-Neo.
            Placement::Block { .. } => {
                let width = if e.hf.contains("self_attn") { 24 } else { 36 };
                let width = if e.hf.contains("h.0.attn.q_proj") || e.hf.contains("h.0.attn.k_proj") || e.hf.contains("h.0.attn.v_proj") { 36 } else { width };
                if e.hf_shape.len() == 1 { vec![width] } else { vec![e.hf_shape[1], width] }
            }
        }
    }
}
