//! Gemma 2 and Gemma 3 text (`Gemma2Config`, `Gemma3TextConfig`): Llama's attention with
//! the token embedding scaled by `sqrt(d_model)`, RMSNorms that multiply by `1 + w` (stored
//! here as the gain `1 + w`, as TransformerLens converts them), norms before and after
//! attention and the MLP, scores scaled by `query_pre_attn_scalar^-1/2`, local (sliding)
//! and global layers, a GeGLU MLP (`gelu_pytorch_tanh`) and a tied unembedding. Gemma 2
//! soft-caps attention scores and logits; Gemma 3 adds a per-head QK-norm and its own rotary
//! base for local layers (`rope_parameters.sliding_attention`) beside the global ones'.

use burnlens_model::{ActivationFn, AttentionSpan, NormPlacement, QkNorm, ScoreScale, TransformerConfig};
use serde_json::{Map, Value, json};

use super::llama::{Defaults, fresh_common, json_common, layer_types, parse_common, tensors_common};
use super::spec::{FamilySpec, FreshShape, Names};
use crate::error::Result;
use crate::fields::{Fields, activation_named};
use crate::layout::{Placement, Tensors};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    Two,
    Three,
}

pub struct Gemma(pub Version);

pub const GEMMA2: Gemma = Gemma(Version::Two);
pub const GEMMA3: Gemma = Gemma(Version::Three);

impl Gemma {
    fn defaults(&self) -> Defaults {
        Defaults {
            hidden_size: 2304,
            heads: 8,
            layers: 26,
            intermediate: 9216,
            vocab: if self.0 == Version::Two { 256000 } else { 262_208 },
            positions: if self.0 == Version::Two { 8192 } else { 131_072 },
            eps: 1e-6,
            rope_theta: 10000.0,
            tie: true,
            head_dim: Some(256),
        }
    }

    fn name(&self) -> &'static str {
        if self.0 == Version::Two { "Gemma 2" } else { "Gemma 3" }
    }
}

impl FamilySpec for Gemma {
    fn names(&self) -> Names {
        let model_type = match self.0 {
            Version::Two => "gemma2",
            Version::Three => "gemma3_text",
        };
        let architecture = match self.0 {
            Version::Two => "Gemma2ForCausalLM",
            Version::Three => "Gemma3ForCausalLM",
        };
        Names { model_type, architecture, base_prefix: "model.", embed_name: "embed_tokens.weight" }
    }

    fn parse(&self, f: &Fields) -> Result<TransformerConfig> {
        if f.bool("use_bidirectional_attention", false)? {
            return Err(f.err("use_bidirectional_attention", "is true; burnlens runs causal decoders only"));
        }
        let v3 = self.0 == Version::Three;
        // Gemma 3 keeps one rope_parameters per layer type; parse_common reads the global one.
        let per_type = f.get("rope_parameters").and_then(Value::as_object).filter(|o| o.contains_key("full_attention")).cloned();
        let global_fields: Option<Map<String, Value>> = per_type.as_ref().map(|o| sub_config(f, o, "full_attention"));
        let mut d = self.defaults();
        if v3 {
            d.rope_theta = 1_000_000.0;
        }
        let mut cfg = match &global_fields {
            Some(obj) => parse_common(&f.with(obj), d)?,
            None => parse_common(f, d)?,
        };
        if v3 {
            let local_obj = per_type.as_ref().map(|o| sub_config(f, o, "sliding_attention"));
            let base = f.float("rope_local_base_freq", 10000.0)?;
            let local = match &local_obj {
                Some(obj) => f.with(obj).rope(&[], base, &[], 1.0)?,
                None => {
                    let empty = Map::new();
                    f.with(&empty).rope(&[], base, &[], 1.0)?
                }
            };
            cfg.rotary_local = Some(local.into_rotary(f, cfg.d_head)?);
            cfg.qk_norm = Some(QkNorm::PerHead);
        }
        let bias = f.bool("attention_bias", false)?;
        (cfg.qkv_bias, cfg.attn_out_bias) = (bias, bias);
        cfg.activation = activation_named(f, "hidden_activation", "gelu_pytorch_tanh")?;
        cfg.scale_embed = true;
        cfg.norm_placement = NormPlacement::Sandwich;
        cfg.score_scale = ScoreScale::InvSqrtOf(f.size(&["query_pre_attn_scalar"], 256)?);
        let cap = |name: &str, default: Option<f64>| -> Result<Option<f64>> {
            match f.get(name) {
                None if f.obj_has(name) => Ok(None),
                None => Ok(default),
                Some(v) => v.as_f64().map(Some).ok_or_else(|| f.err(name, format!("must be a number or null, found {v}"))),
            }
        };
        let (attn_cap, final_cap) = if v3 { (None, None) } else { (Some(50.0), Some(30.0)) };
        cfg.attn_softcap = cap("attn_logit_softcapping", attn_cap)?;
        cfg.final_softcap = cap("final_logit_softcapping", final_cap)?;
        let size = f.size(&["sliding_window"], 4096)?;
        let window = Some(size);
        cfg.spans = match f.get("layer_types") {
            Some(_) => layer_types(f, cfg.n_layers(), window)?,
            None => {
                // Gemma 2: every other layer from the first slides; Gemma 3: five of six.
                let pattern = if v3 { f.size(&["sliding_window_pattern"], 6)? } else { 2 };
                (0..cfg.n_layers()).map(|i| if (i + 1) % pattern != 0 { AttentionSpan::Local(size) } else { AttentionSpan::Global }).collect()
            }
        };
        Ok(cfg)
    }

    fn tensors(&self, cfg: &TransformerConfig, t: &mut Tensors) {
        let d = cfg.d_model;
        let v3 = self.0 == Version::Three;
        let dh = cfg.d_head;
        tensors_common(cfg, t, |t, h, b| {
            let norm = |t: &mut Tensors, hf: &str, c: &str, w: usize| t.norm_of_width(&format!("{h}.{hf}"), &format!("{b}.{c}"), w, Placement::PlusOne);
            norm(t, "input_layernorm", "ln1", d);
            norm(t, "post_attention_layernorm", "ln1_post", d);
            norm(t, "pre_feedforward_layernorm", "ln2", d);
            norm(t, "post_feedforward_layernorm", "ln2_post", d);
            if v3 {
                norm(t, "self_attn.q_norm", "attn.q_norm", dh);
                norm(t, "self_attn.k_norm", "attn.k_norm", dh);
            }
        });
        t.set_placement("ln_final.weight", Placement::PlusOne);
    }

    fn config_json(&self, cfg: &TransformerConfig) -> std::result::Result<Value, String> {
        let name = self.name();
        let v3 = self.0 == Version::Three;
        let mut v = json_common(&TransformerConfig { score_scale: ScoreScale::InvSqrtDHead, ..cfg.clone() }, self.names().model_type)?;
        if !cfg.scale_embed || cfg.norm_placement != NormPlacement::Sandwich || cfg.activation != ActivationFn::GeluNew {
            return Err(format!("{name} scales the embedding, has norms before and after attention and the MLP and a GeGLU MLP"));
        }
        let ScoreScale::InvSqrtOf(scalar) = cfg.score_scale else {
            return Err(format!("{name} scales attention scores by query_pre_attn_scalar^-1/2"));
        };
        if cfg.qk_norm != if v3 { Some(QkNorm::PerHead) } else { None } || (cfg.rotary_local.is_some() != v3) {
            return Err(format!("{name} {} a per-head QK-norm and a rotary base of its own for local layers", if v3 { "has" } else { "has no" }));
        }
        if cfg.qkv_bias != cfg.attn_out_bias {
            return Err(format!("{name}'s biases are q/k/v and output together (attention_bias)"));
        }
        let window = super::spec::one_window(cfg)?;
        v["hidden_activation"] = json!("gelu_pytorch_tanh");
        v["query_pre_attn_scalar"] = json!(scalar);
        v["attention_bias"] = json!(cfg.qkv_bias);
        v["attn_logit_softcapping"] = json!(cfg.attn_softcap);
        v["final_logit_softcapping"] = json!(cfg.final_softcap);
        v["sliding_window"] = json!(window.unwrap_or(4096));
        v["layer_types"] = super::spec::layer_types(cfg);
        if let (true, Some(local), Some(global)) = (v3, cfg.rotary_local, cfg.rotary) {
            v["rope_parameters"] = json!({
                "full_attention": super::spec::rope_parameters(&global, cfg.d_head),
                "sliding_attention": super::spec::rope_parameters(&local, cfg.d_head),
            });
            v["rope_local_base_freq"] = json!(local.base);
        }
        Ok(v)
    }

    fn fresh(&self, s: &FreshShape) -> TransformerConfig {
        let d_head = s.d_model / s.n_heads.max(1);
        let mut cfg = TransformerConfig {
            activation: ActivationFn::GeluNew,
            untied_unembed: false,
            scale_embed: true,
            norm_placement: NormPlacement::Sandwich,
            score_scale: ScoreScale::InvSqrtOf(d_head),
            spans: (0..s.n_layers).map(|i| if (i + 1) % 2 != 0 { AttentionSpan::Local(4096) } else { AttentionSpan::Global }).collect(),
            ..fresh_common(s)
        };
        if self.0 == Version::Two {
            cfg.attn_softcap = Some(50.0);
            cfg.final_softcap = Some(30.0);
        } else {
            cfg.qk_norm = Some(QkNorm::PerHead);
            cfg.rotary_local = cfg.rotary;
            if let Some(r) = cfg.rotary.as_mut() {
                r.base = 1_000_000.0;
            }
        }
        cfg
    }
}

/// One layer type's `rope_parameters` as a config of its own, so the shared rope reader
/// reads it (`{"rope_parameters": {...}}`).
fn sub_config(f: &Fields, per_type: &Map<String, Value>, kind: &str) -> Map<String, Value> {
    let mut obj = f.raw().clone();
    match per_type.get(kind) {
        Some(p) => obj.insert("rope_parameters".into(), p.clone()),
        None => obj.remove("rope_parameters"),
    };
    obj
}
