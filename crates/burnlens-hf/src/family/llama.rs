//! The Llama family (`LlamaConfig`, `Qwen2Config`, `MistralConfig`): RMSNorm, rotary over
//! whole heads, gated SiLU MLP, grouped-query attention, `nn.Linear` projections. Qwen2 has
//! q/k/v biases; Mistral and Qwen2 may slide a window. Qwen3 and OLMo 2 build on the
//! helpers here.

use burnlens_model::{AttentionSpan, MlpKind, NormKind, Positional, ScoreScale, TransformerConfig};
use serde_json::{Value, json};

use super::spec::{FamilySpec, FreshShape, Names};
use crate::error::Result;
use crate::fields::{Fields, activation_named, head_dim};
use crate::layout::{Placement, Tensors};

/// Which member of the family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Llama,
    Qwen2,
    Mistral,
}

pub struct LlamaLike(pub Kind);

pub const LLAMA: LlamaLike = LlamaLike(Kind::Llama);
pub const QWEN2: LlamaLike = LlamaLike(Kind::Qwen2);
pub const MISTRAL: LlamaLike = LlamaLike(Kind::Mistral);

impl FamilySpec for LlamaLike {
    fn names(&self) -> Names {
        let model_type = match self.0 {
            Kind::Llama => "llama",
            Kind::Qwen2 => "qwen2",
            Kind::Mistral => "mistral",
        };
        let architecture = match self.0 {
            Kind::Llama => "LlamaForCausalLM",
            Kind::Qwen2 => "Qwen2ForCausalLM",
            Kind::Mistral => "MistralForCausalLM",
        };
        Names { model_type, architecture, base_prefix: "model.", embed_name: "embed_tokens.weight" }
    }

    fn parse(&self, f: &Fields) -> Result<TransformerConfig> {
        let mut cfg = parse_common(f, Defaults::LLAMA)?;
        let attention_bias = f.bool("attention_bias", false)?;
        (cfg.qkv_bias, cfg.attn_out_bias) = match self.0 {
            Kind::Qwen2 => (true, false),
            _ => (attention_bias, attention_bias),
        };
        let window = f.opt_size(&["sliding_window"])?;
        cfg.spans = match (f.get("layer_types"), self.0) {
            (Some(_), _) => layer_types(f, cfg.n_layers(), window)?,
            (None, Kind::Mistral) => vec![window.map_or(AttentionSpan::Global, AttentionSpan::Local); cfg.n_layers()],
            (None, Kind::Qwen2) if f.bool("use_sliding_window", false)? => {
                // Layers from max_window_layers on slide.
                let from = f.count(&["max_window_layers"], 28)?;
                let w = window.ok_or_else(|| f.err("sliding_window", "is missing but use_sliding_window is true"))?;
                (0..cfg.n_layers()).map(|l| if l >= from { AttentionSpan::Local(w) } else { AttentionSpan::Global }).collect()
            }
            (None, _) => vec![AttentionSpan::Global; cfg.n_layers()],
        };
        Ok(cfg)
    }

    fn tensors(&self, cfg: &TransformerConfig, t: &mut Tensors) {
        tensors_common(cfg, t, |t, h, b| {
            t.norm(&format!("{h}.input_layernorm"), &format!("{b}.ln1"));
            t.norm(&format!("{h}.post_attention_layernorm"), &format!("{b}.ln2"));
        });
    }

    fn config_json(&self, cfg: &TransformerConfig) -> std::result::Result<Value, String> {
        let family = self.names().model_type;
        let mut v = json_common(cfg, family)?;
        let qwen = self.0 == Kind::Qwen2;
        if (qwen && (!cfg.qkv_bias || cfg.attn_out_bias)) || (!qwen && cfg.qkv_bias != cfg.attn_out_bias) {
            return Err(format!("{family}'s biases are q/k/v {}", if qwen { "only" } else { "and output together (attention_bias)" }));
        }
        let window = super::spec::one_window(cfg)?;
        match self.0 {
            Kind::Llama if window.is_some() => return Err("Llama has no sliding window".into()),
            Kind::Llama => {}
            Kind::Mistral => v["sliding_window"] = json!(window),
            Kind::Qwen2 => {
                v["layer_types"] = super::spec::layer_types(cfg);
                v["use_sliding_window"] = json!(window.is_some());
                v["sliding_window"] = json!(window);
                v["max_window_layers"] = json!(cfg.spans.iter().position(|s| matches!(s, AttentionSpan::Local(_))).unwrap_or(cfg.n_layers()));
            }
        }
        if !qwen {
            v["attention_bias"] = json!(cfg.qkv_bias);
            v["mlp_bias"] = json!(cfg.mlp_bias);
        }
        Ok(v)
    }

    fn fresh(&self, s: &FreshShape) -> TransformerConfig {
        let mut cfg = fresh_common(s);
        if self.0 == Kind::Qwen2 {
            cfg.qkv_bias = true;
            cfg.untied_unembed = false;
        }
        cfg
    }
}

/// The `transformers` defaults a Llama-like config class starts from.
#[derive(Debug, Clone, Copy)]
pub(super) struct Defaults {
    pub hidden_size: usize,
    pub heads: usize,
    pub layers: usize,
    pub intermediate: usize,
    pub vocab: usize,
    pub positions: usize,
    pub eps: f64,
    pub rope_theta: f64,
    pub tie: bool,
    pub head_dim: Option<usize>,
}

impl Defaults {
    pub const LLAMA: Defaults = Defaults {
        hidden_size: 4096,
        heads: 32,
        layers: 32,
        intermediate: 11008,
        vocab: 32000,
        positions: 2048,
        eps: 1e-6,
        rope_theta: 10000.0,
        tie: false,
        head_dim: None,
    };
}

/// Everything Llama-like configs share: sizes, grouped-query heads, `head_dim`, rotary,
/// `hidden_act`, `rms_norm_eps`, tying, `mlp_bias`; global attention and no q/k/v biases
/// until the caller says otherwise.
pub(super) fn parse_common(f: &Fields, d: Defaults) -> Result<TransformerConfig> {
    let d_model = f.size(&["hidden_size"], d.hidden_size)?;
    let n_heads = f.size(&["num_attention_heads"], d.heads)?;
    let n_layers = f.layers(&["num_hidden_layers"], d.layers)?;
    let n_kv = f.size(&["num_key_value_heads"], n_heads)?;
    let d_head = match f.opt_size(&["head_dim"])?.or(d.head_dim) {
        Some(h) => h,
        None => head_dim(f, d_model, n_heads, "hidden_size", "num_attention_heads")?,
    };
    let rope = f.rope(&[], d.rope_theta, &[], 1.0)?;
    Ok(TransformerConfig {
        vocab_size: f.size(&["vocab_size"], d.vocab)?,
        n_ctx: f.size(&["max_position_embeddings"], d.positions)?,
        d_model,
        n_heads,
        d_head,
        d_mlp: Some(f.size(&["intermediate_size"], d.intermediate)?),
        spans: vec![AttentionSpan::Global; n_layers],
        score_scale: ScoreScale::InvSqrtDHead,
        scale_by_inverse_layer: false,
        qkv_bias: false,
        activation: activation_named(f, "hidden_act", "silu")?,
        layer_norm_eps: f.float("rms_norm_eps", d.eps)?,
        positional: Positional::Rotary,
        dropout: 0.0,
        untied_unembed: !f.bool("tie_word_embeddings", d.tie)?,
        unembed_bias: false,
        norm: NormKind::RmsNorm,
        mlp: MlpKind::Gated,
        n_kv_heads: Some(n_kv),
        parallel_residual: false,
        rotary: Some(rope.into_rotary(f, d_head)?),
        attn_out_bias: false,
        mlp_bias: f.bool("mlp_bias", false)?,
        ..TransformerConfig::gpt2_like(1, 1, 1, 1, 1)
    })
}

/// `layer_types` (transformers 5): `full_attention` or `sliding_attention` per layer.
pub(super) fn layer_types(f: &Fields, n_layers: usize, window: Option<usize>) -> Result<Vec<AttentionSpan>> {
    let list = f
        .get("layer_types")
        .and_then(Value::as_array)
        .filter(|a| a.len() == n_layers)
        .ok_or_else(|| f.err("layer_types", format!("must list \"full_attention\" or \"sliding_attention\" for each of the {n_layers} layers")))?;
    list.iter()
        .map(|t| match t.as_str() {
            Some("full_attention") => Ok(AttentionSpan::Global),
            Some("sliding_attention") => {
                window.map(AttentionSpan::Local).ok_or_else(|| f.err("sliding_window", "is missing but a layer uses sliding attention"))
            }
            _ => Err(f.err("layer_types", format!("has {t}; expected \"full_attention\" or \"sliding_attention\""))),
        })
        .collect()
}

/// The tensor table of a Llama-like checkpoint under `model.`; `norms(t, hf_layer,
/// canonical_block)` lists the layer's norms.
pub(super) fn tensors_common(cfg: &TransformerConfig, t: &mut Tensors, norms: impl Fn(&mut Tensors, &str, &str)) {
    let (d, hd) = (cfg.d_model, cfg.n_heads * cfg.d_head);
    t.add("embed_tokens.weight".into(), vec![cfg.vocab_size, d], "embed.weight".into(), Placement::Same);
    for l in 0..cfg.n_layers() {
        let (h, b) = (format!("layers.{l}"), format!("blocks.{l}"));
        norms(t, &h, &b);
        t.split_qkv(&format!("{h}.self_attn"), &format!("{b}.attn"), ["q_proj", "k_proj", "v_proj"]);
        t.linear(&format!("{h}.self_attn.o_proj"), &format!("{b}.attn.out"), hd, d, cfg.attn_out_bias);
        t.gated_mlp(&format!("{h}.mlp"), &format!("{b}.mlp"));
    }
    t.norm("norm", "ln_final");
    t.unembed("lm_head");
}

/// The `config.json` fields Llama-like families share, after the checks they share.
pub(super) fn json_common(cfg: &TransformerConfig, family: &str) -> std::result::Result<Value, String> {
    let r = cfg.rotary.filter(|_| cfg.positional == Positional::Rotary).ok_or_else(|| format!("{family} uses rotary positions"))?;
    if cfg.norm != NormKind::RmsNorm || cfg.mlp != MlpKind::Gated || cfg.parallel_residual {
        return Err(format!("{family} has RMSNorm, a gated MLP and sequential residuals"));
    }
    if cfg.score_scale != ScoreScale::InvSqrtDHead || cfg.scale_by_inverse_layer {
        return Err(format!("{family} scales attention scores by 1/sqrt(d_head)"));
    }
    Ok(json!({
        "max_position_embeddings": cfg.n_ctx,
        "hidden_size": cfg.d_model,
        "num_hidden_layers": cfg.n_layers(),
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.kv_heads(),
        "head_dim": cfg.d_head,
        "intermediate_size": cfg.d_mlp,
        "hidden_act": super::spec::hidden_act(cfg.activation),
        "rms_norm_eps": cfg.layer_norm_eps,
        "rope_parameters": super::spec::rope_parameters(&r, cfg.d_head),
        "rope_theta": r.base,
        "attention_dropout": 0.0,
    }))
}

/// A fresh Llama-like model: RMSNorm, rotary over whole heads, gated SiLU MLP, no biases,
/// untied unembedding without bias.
pub(super) fn fresh_common(s: &FreshShape) -> TransformerConfig {
    TransformerConfig { d_mlp: Some(4 * s.d_model), ..TransformerConfig::llama_like(s.vocab, s.n_ctx, s.d_model, s.n_layers, s.n_heads, s.n_heads) }
}
