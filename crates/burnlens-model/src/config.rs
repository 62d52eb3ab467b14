//! The one configuration every burnlens model is built from.
//!
//! The families differ only in the settings below; each family's file in `burnlens-hf`
//! (`family/*.rs`) translates its `config.json` into this struct, and nothing inside the model
//! ever asks which family it is.

use serde::{Deserialize, Serialize};

use crate::error::ModelError;

/// Which keys a query may attend to, besides the causal rule `key <= query`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttentionSpan {
    /// Every earlier position (and itself).
    Global,
    /// Only the last `w` positions: key `k` is visible from query `q` iff `q - w < k <= q`.
    Local(usize),
}

impl AttentionSpan {
    /// Whether key position `k` is visible from query position `q` (absolute positions).
    #[inline]
    pub fn allows(self, q: usize, k: usize) -> bool {
        k <= q
            && match self {
                AttentionSpan::Global => true,
                AttentionSpan::Local(w) => k + w > q,
            }
    }
}

/// The constant the raw scores `q·k` are multiplied by before the softmax.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScoreScale {
    /// `1 / sqrt(d_head)` (GPT-2, and most transformers).
    InvSqrtDHead,
    /// No scaling at all (GPT-Neo).
    None,
    /// `1 / sqrt(n)` for a fixed `n` (Gemma's `query_pre_attn_scalar`).
    InvSqrtOf(usize),
}

/// The MLP's non-linearity, named as in Hugging Face's `activation_function`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActivationFn {
    /// `gelu_new` / `gelu_pytorch_tanh`: `0.5 x (1 + tanh(sqrt(2/π) (x + 0.044715 x³)))`.
    GeluNew,
    /// `gelu`: the exact form `x Φ(x)` with the error function.
    Gelu,
    /// `gelu_fast`: `0.5 x (1 + tanh(0.7978845608 x (1 + 0.044715 x²)))`.
    GeluFast,
    /// `relu`.
    Relu,
    /// `quick_gelu`: `x σ(1.702 x)`.
    QuickGelu,
    /// `silu` / `swish`: `x σ(x)`.
    Silu,
}

impl ActivationFn {
    /// Every name accepted by [`ActivationFn::from_hf_name`].
    pub const HF_NAMES: &'static [&'static str] = &["gelu_new", "gelu_pytorch_tanh", "gelu", "gelu_fast", "relu", "quick_gelu", "silu", "swish"];

    /// Parse Hugging Face's `activation_function` string.
    pub fn from_hf_name(name: &str) -> Option<Self> {
        Some(match name {
            "gelu_new" | "gelu_pytorch_tanh" => Self::GeluNew,
            "gelu" => Self::Gelu,
            "gelu_fast" => Self::GeluFast,
            "relu" => Self::Relu,
            "quick_gelu" => Self::QuickGelu,
            "silu" | "swish" => Self::Silu,
            _ => return None,
        })
    }

    /// The canonical Hugging Face name, used when exporting.
    pub fn hf_name(self) -> &'static str {
        match self {
            Self::GeluNew => "gelu_new",
            Self::Gelu => "gelu",
            Self::GeluFast => "gelu_fast",
            Self::Relu => "relu",
            Self::QuickGelu => "quick_gelu",
            Self::Silu => "silu",
        }
    }
}

/// The most layers a config may ask for. Far above any real GPT-2/GPT-Neo (48 and 44), it
/// stops a corrupt or hostile config from allocating per-layer state for billions of layers
/// before anything else can be checked.
pub const MAX_LAYERS: usize = 4096;

/// How positions enter the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Positional {
    /// Learned embeddings added to the token embedding at the bottom of the residual stream
    /// (GPT-2, GPT-Neo).
    #[default]
    Residual,
    /// Learned embeddings added only to the inputs of the query and key projections of every
    /// layer, never to the residual stream or the values ("shortformer" toy models).
    QueryKeyOnly,
    /// No learned positions: queries and keys are rotated by [`TransformerConfig::rotary`]
    /// (GPT-NeoX, Llama and its relatives).
    Rotary,
}

/// Rotary position embeddings in the "rotate half" form of GPT-NeoX and Llama: the first
/// `dims` dimensions of each query and key head are split into two halves `(x1, x2)` and
/// position `p` maps them to `(x1 cos θ - x2 sin θ, x2 cos θ + x1 sin θ)` with
/// `θ_i = p · base^(-2i / dims)`; the remaining dimensions pass through.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Rotary {
    /// Rotated dimensions per head (even; all of `d_head` for Llama, a quarter for Pythia).
    pub dims: usize,
    /// `rope_theta` / `rotary_emb_base`.
    pub base: f64,
    /// Frequency scaling, if the checkpoint asks for one.
    #[serde(default)]
    pub scaling: Option<RopeScaling>,
    /// GPT-J's form: pairs `(x[2i], x[2i+1])` rotate by `θ_i` ("rotate every two")
    /// instead of the two halves.
    #[serde(default)]
    pub interleaved: bool,
}

/// The frequency scalings of Hugging Face's `rope_scaling` / `rope_parameters` that burnlens
/// implements.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RopeScaling {
    /// `linear`: every frequency divided by `factor` (positions interpolated).
    Linear { factor: f64 },
    /// `llama3`: low frequencies divided by `factor`, high ones kept, a smooth blend between.
    Llama3 { factor: f64, low_freq_factor: f64, high_freq_factor: f64, original_max_position: usize },
}

/// The normalisation before attention, MLP and unembedding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NormKind {
    /// `(x - mean) / sqrt(var + eps) * w + b`.
    #[default]
    LayerNorm,
    /// `x / sqrt(mean(x²) + eps) * w`, no centring and no bias (Llama).
    RmsNorm,
}

/// Where a block's norms sit around attention and the MLP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NormPlacement {
    /// `x + f(ln(x))` (GPT-2 and nearly everything since).
    #[default]
    Pre,
    /// `x + ln(f(x))`: OLMo 2. As in TransformerLens, `ln1` and `ln2` are then the norms
    /// after attention and after the MLP.
    Post,
    /// `x + ln_post(f(ln(x)))`: Gemma 2 and 3 (`ln1_post`, `ln2_post`).
    Sandwich,
}

/// RMSNorm of the queries and keys before rotary embeddings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QkNorm {
    /// Over each head's `d_head` values, one gain `[d_head]` shared by all heads (Qwen3,
    /// Gemma 3).
    PerHead,
    /// Over the whole projection, `[n_heads d_head]` for queries and `[n_kv_heads d_head]`
    /// for keys (OLMo 2).
    Whole,
}

/// The MLP's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MlpKind {
    /// `act(x W_in + b_in) W_out + b_out`.
    #[default]
    Standard,
    /// `(act(x W_gate) * (x W_in)) W_out` (Llama's SwiGLU).
    Gated,
}

fn yes() -> bool {
    true
}

/// Architecture of a decoder-only transformer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TransformerConfig {
    /// Number of token ids (rows of the embedding, columns of the logits).
    pub vocab_size: usize,
    /// Largest sequence length: number of learned position embeddings.
    pub n_ctx: usize,
    /// Width of the residual stream.
    pub d_model: usize,
    /// Number of attention heads per layer.
    pub n_heads: usize,
    /// Width of each head's query, key and value.
    pub d_head: usize,
    /// Hidden width of each MLP; `None` makes an attention-only model.
    pub d_mlp: Option<usize>,
    /// One entry per layer: global or local attention.
    pub spans: Vec<AttentionSpan>,
    /// Base scale of the attention scores.
    pub score_scale: ScoreScale,
    /// GPT-2's `scale_attn_by_inverse_layer_idx`: scores of layer `l` are also divided by `l + 1`.
    pub scale_by_inverse_layer: bool,
    /// Whether the query, key and value projections have biases (GPT-2 yes, GPT-Neo no).
    pub qkv_bias: bool,
    /// MLP non-linearity.
    pub activation: ActivationFn,
    /// LayerNorm epsilon.
    pub layer_norm_eps: f64,
    /// Where position embeddings are added.
    #[serde(default)]
    pub positional: Positional,
    /// Dropout probability on embeddings, attention pattern and residual writes (training only).
    #[serde(default)]
    pub dropout: f64,
    /// An unembedding `W_U [d_model, vocab]` of its own instead of `W_Eᵀ`: GPT-NeoX and
    /// some Llama-family checkpoints; weight processing (folding the final norm, centring)
    /// unties the others, and toy models can be trained untied (`model.tie_embeddings =
    /// false` in a run config).
    #[serde(default)]
    pub untied_unembed: bool,
    /// Whether an untied unembedding has a bias `b_U` (toy models and weight processing
    /// yes; Hugging Face `lm_head` / `embed_out` no).
    #[serde(default = "yes")]
    pub unembed_bias: bool,
    /// LayerNorm or RMSNorm.
    #[serde(default)]
    pub norm: NormKind,
    /// Standard or gated MLP.
    #[serde(default)]
    pub mlp: MlpKind,
    /// Key/value heads: `n_heads` (multi-head), fewer (grouped-query) or 1 (multi-query);
    /// `None` means `n_heads`.
    #[serde(default)]
    pub n_kv_heads: Option<usize>,
    /// Attention and MLP both read the block input, each through its own norm, and both
    /// add to the residual stream (GPT-NeoX's `use_parallel_residual`).
    #[serde(default)]
    pub parallel_residual: bool,
    /// Rotary embeddings, when `positional` is [`Positional::Rotary`].
    #[serde(default)]
    pub rotary: Option<Rotary>,
    /// Whether the attention output projection has a bias `b_O` (Llama: no).
    #[serde(default = "yes")]
    pub attn_out_bias: bool,
    /// Whether the MLP projections have biases (Llama: no).
    #[serde(default = "yes")]
    pub mlp_bias: bool,
    /// Norms before, after or around attention and the MLP.
    #[serde(default)]
    pub norm_placement: NormPlacement,
    /// QK-norm, if any (Qwen3, OLMo 2, Gemma 3).
    #[serde(default)]
    pub qk_norm: Option<QkNorm>,
    /// With a parallel residual, the MLP reads `ln1`'s output too and the block has no `ln2`
    /// (GPT-J).
    #[serde(default)]
    pub shared_norm: bool,
    /// The token embedding is multiplied by `sqrt(d_model)` (rounded to f32) before
    /// `hook_embed` (Gemma); the tied unembedding is not.
    #[serde(default)]
    pub scale_embed: bool,
    /// Attention scores soft-capped as `c tanh(s / c)` after scaling, before the mask
    /// (Gemma 2's `attn_logit_softcapping`).
    #[serde(default)]
    pub attn_softcap: Option<f64>,
    /// Logits soft-capped as `c tanh(l / c)` (Gemma 2's `final_logit_softcapping`).
    #[serde(default)]
    pub final_softcap: Option<f64>,
    /// Rotary settings of the local (sliding-window) layers when they differ from the
    /// global ones (Gemma 3's `rope_local_base_freq`).
    #[serde(default)]
    pub rotary_local: Option<Rotary>,
}

impl TransformerConfig {
    /// A small GPT-2-style model; handy for tests and toy training.
    pub fn gpt2_like(vocab_size: usize, n_ctx: usize, d_model: usize, n_layers: usize, n_heads: usize) -> Self {
        Self {
            vocab_size,
            n_ctx,
            d_model,
            n_heads,
            d_head: d_model / n_heads.max(1),
            d_mlp: Some(4 * d_model),
            spans: vec![AttentionSpan::Global; n_layers],
            score_scale: ScoreScale::InvSqrtDHead,
            scale_by_inverse_layer: false,
            qkv_bias: true,
            activation: ActivationFn::GeluNew,
            layer_norm_eps: 1e-5,
            positional: Positional::Residual,
            dropout: 0.0,
            untied_unembed: false,
            unembed_bias: true,
            norm: NormKind::LayerNorm,
            mlp: MlpKind::Standard,
            n_kv_heads: None,
            parallel_residual: false,
            rotary: None,
            attn_out_bias: true,
            mlp_bias: true,
            norm_placement: NormPlacement::Pre,
            qk_norm: None,
            shared_norm: false,
            scale_embed: false,
            attn_softcap: None,
            final_softcap: None,
            rotary_local: None,
        }
    }

    /// A small Llama-style model (RMSNorm, rotary, gated SiLU MLP, no biases, untied
    /// unembedding) with `n_kv_heads` key/value heads.
    pub fn llama_like(vocab_size: usize, n_ctx: usize, d_model: usize, n_layers: usize, n_heads: usize, n_kv_heads: usize) -> Self {
        let d_head = d_model / n_heads.max(1);
        Self {
            d_mlp: Some(8 * d_model / 3),
            qkv_bias: false,
            activation: ActivationFn::Silu,
            layer_norm_eps: 1e-5,
            positional: Positional::Rotary,
            untied_unembed: true,
            unembed_bias: false,
            norm: NormKind::RmsNorm,
            mlp: MlpKind::Gated,
            n_kv_heads: Some(n_kv_heads),
            rotary: Some(Rotary { dims: d_head, base: 10000.0, scaling: None, interleaved: false }),
            attn_out_bias: false,
            mlp_bias: false,
            ..Self::gpt2_like(vocab_size, n_ctx, d_model, n_layers, n_heads)
        }
    }

    /// Number of key/value heads.
    pub fn kv_heads(&self) -> usize {
        self.n_kv_heads.unwrap_or(self.n_heads)
    }

    /// Width of the fused query/key/value projection: `(n_heads + 2 n_kv_heads) d_head`.
    pub fn qkv_width(&self) -> usize {
        (self.n_heads + 2 * self.kv_heads()) * self.d_head
    }

    /// Whether the model has learned position embeddings (`W_pos`).
    pub fn learned_positions(&self) -> bool {
        self.positional != Positional::Rotary
    }

    /// Number of layers.
    pub fn n_layers(&self) -> usize {
        self.spans.len()
    }

    /// The factor scores of layer `layer` are multiplied by.
    pub fn score_factor(&self, layer: usize) -> f64 {
        let base = match self.score_scale {
            ScoreScale::InvSqrtDHead => 1.0 / (self.d_head as f64).sqrt(),
            ScoreScale::None => 1.0,
            ScoreScale::InvSqrtOf(n) => 1.0 / (n as f64).sqrt(),
        };
        if self.scale_by_inverse_layer { base / (layer + 1) as f64 } else { base }
    }

    /// The rotary settings of layer `layer` (local layers may have their own).
    pub fn rotary_for(&self, layer: usize) -> Option<&Rotary> {
        match (self.spans.get(layer), &self.rotary_local) {
            (Some(AttentionSpan::Local(_)), Some(local)) => Some(local),
            _ => self.rotary.as_ref(),
        }
    }

    /// Whether block `layer` has an `ln2` of its own (it has an MLP and does not share `ln1`).
    pub fn has_ln2(&self) -> bool {
        self.d_mlp.is_some() && !self.shared_norm
    }

    /// Width of the query and key norms' gains, if the model has QK-norm.
    pub fn qk_norm_widths(&self) -> Option<(usize, usize)> {
        self.qk_norm.map(|k| match k {
            QkNorm::PerHead => (self.d_head, self.d_head),
            QkNorm::Whole => (self.n_heads * self.d_head, self.kv_heads() * self.d_head),
        })
    }

    /// The parameter count in u128 arithmetic from the sizes alone, before anything is
    /// built: what [`validate`](Self::validate) refuses absurd sizes by (a corrupt config's
    /// products overflow `usize`). Equal to [`n_params`](Self::n_params), the builder's own
    /// count, on every fixture (tested); everything else counts through the builder.
    fn n_params_bound(&self) -> u128 {
        let d = self.d_model as u128;
        let hd = (self.n_heads as u128) * (self.d_head as u128);
        let qkv = (self.n_heads as u128 + 2 * self.kv_heads() as u128) * (self.d_head as u128);
        let vocab = self.vocab_size as u128;
        let ln = if self.norm == NormKind::RmsNorm { d } else { 2 * d };
        let attn = d * qkv + if self.qkv_bias { qkv } else { 0 } + hd * d + if self.attn_out_bias { d } else { 0 };
        let mlp = self.d_mlp.map_or(0, |m| {
            let m = m as u128;
            let gate = if self.mlp == MlpKind::Gated { d * m } else { 0 };
            d * m + gate + m * d + if self.mlp_bias { m + d } else { 0 }
        });
        let post = if self.norm_placement == NormPlacement::Sandwich { ln } else { 0 };
        let ln_w = |w: usize| if self.norm == NormKind::RmsNorm { w as u128 } else { 2 * w as u128 };
        let qk = self.qk_norm_widths().map_or(0, |(q, k)| ln_w(q) + ln_w(k));
        let mlp_norms = if self.has_ln2() { ln } else { 0 } + if self.d_mlp.is_some() { post } else { 0 };
        let per_layer = ln + post + qk + attn + if self.d_mlp.is_some() { mlp_norms + mlp } else { 0 };
        let unembed = if self.untied_unembed { d * vocab + if self.unembed_bias { vocab } else { 0 } } else { 0 };
        let positions = if self.learned_positions() { (self.n_ctx as u128) * d } else { 0 };
        vocab * d + positions + (self.n_layers() as u128) * per_layer + ln + unembed
    }

    /// Check that the numbers describe a model that can be built.
    pub fn validate(&self) -> Result<(), ModelError> {
        let bad = |field: &'static str, msg: String| Err(ModelError::Config { field, msg });
        for (field, v) in
            [("vocab_size", self.vocab_size), ("n_ctx", self.n_ctx), ("d_model", self.d_model), ("n_heads", self.n_heads), ("d_head", self.d_head)]
        {
            if v == 0 {
                return bad(field, "must be at least 1, found 0".into());
            }
        }
        if self.spans.is_empty() {
            return bad("n_layers", "must be at least 1, found 0".into());
        }
        if self.d_mlp == Some(0) {
            return bad("d_mlp", "must be at least 1 (or absent for attention-only), found 0".into());
        }
        for (l, span) in self.spans.iter().enumerate() {
            if *span == AttentionSpan::Local(0) {
                return bad("spans", format!("layer {l} has a local window of 0 tokens; expected at least 1"));
            }
        }
        if !(self.layer_norm_eps.is_finite() && self.layer_norm_eps > 0.0) {
            return bad("layer_norm_eps", format!("must be a positive number, found {}", self.layer_norm_eps));
        }
        let kv = self.kv_heads();
        if kv == 0 || !self.n_heads.is_multiple_of(kv) {
            return bad("n_kv_heads", format!("= {kv} must divide n_heads = {} (each key/value head serves a whole group of query heads)", self.n_heads));
        }
        match (self.positional, &self.rotary) {
            (Positional::Rotary, None) => return bad("rotary", "is missing; rotary positions need their settings".into()),
            (Positional::Rotary, Some(r)) => {
                if r.dims == 0 || r.dims % 2 != 0 || r.dims > self.d_head {
                    return bad("rotary.dims", format!("= {} must be even and between 2 and d_head = {}", r.dims, self.d_head));
                }
                if !(r.base.is_finite() && r.base > 1.0) {
                    return bad("rotary.base", format!("must be a number above 1, found {}", r.base));
                }
            }
            _ => {}
        }
        if let Some(local) = &self.rotary_local
            && (self.positional != Positional::Rotary || self.rotary.map(|r| (r.dims, r.interleaved)) != Some((local.dims, local.interleaved)))
        {
            return bad("rotary_local", "needs rotary positions and the same rotated dimensions as `rotary`".into());
        }
        if self.shared_norm && !self.parallel_residual {
            return bad("shared_norm", "needs a parallel residual (the MLP reads ln1's output beside attention)".into());
        }
        if self.norm_placement == NormPlacement::Post && self.parallel_residual {
            return bad("norm_placement", "\"post\" norms with a parallel residual are not supported".into());
        }
        for (field, cap) in [("attn_softcap", self.attn_softcap), ("final_softcap", self.final_softcap)] {
            if let Some(c) = cap
                && !(c.is_finite() && c > 0.0)
            {
                return bad(field, format!("must be a positive number, found {c}"));
            }
        }
        if self.score_scale == ScoreScale::InvSqrtOf(0) {
            return bad("score_scale", "query_pre_attn_scalar must be at least 1, found 0".into());
        }
        if self.mlp == MlpKind::Gated && self.d_mlp.is_none() {
            return bad("mlp", "is gated but the model has no MLP (d_mlp absent)".into());
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return bad("dropout", format!("must be in [0, 1), found {}", self.dropout));
        }
        // Sizes whose product no machine could hold are a corrupt config, not a model.
        const MAX_PARAMS: u128 = 1 << 40;
        let n = self.n_params_bound();
        if n > MAX_PARAMS {
            return bad("n_params", format!("would be {n} (from vocab_size, n_ctx, d_model, n_heads, d_mlp and the layer count); at most 2^40 are supported"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod size_bound_tests {
    use super::*;

    /// The overflow guard's arithmetic count equals the builder's walk on every kind of
    /// block (norm placements, QK-norm, gated MLPs, grouped heads, biases, untied unembeddings).
    #[test]
    fn the_guard_counts_what_the_builder_builds() {
        let mut configs = vec![TransformerConfig::gpt2_like(300, 40, 48, 2, 4)];
        let mut c = configs[0].clone();
        (c.norm, c.mlp, c.n_kv_heads, c.positional, c.untied_unembed, c.qkv_bias, c.mlp_bias) =
            (NormKind::RmsNorm, MlpKind::Gated, Some(2), Positional::Rotary, true, false, false);
        c.rotary = Some(Rotary { dims: 12, base: 10000.0, scaling: None, interleaved: false });
        configs.push(c.clone());
        for (placement, qk) in [(NormPlacement::Sandwich, Some(QkNorm::PerHead)), (NormPlacement::Post, Some(QkNorm::Whole))] {
            let mut v = c.clone();
            (v.norm_placement, v.qk_norm, v.unembed_bias) = (placement, qk, true);
            configs.push(v);
        }
        let mut attn_only = configs[0].clone();
        attn_only.d_mlp = None;
        configs.push(attn_only);
        for c in configs {
            c.validate().unwrap();
            assert_eq!(c.n_params_bound(), c.n_params().unwrap(), "{c:?}");
        }
    }
}
