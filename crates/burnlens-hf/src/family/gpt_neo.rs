//! GPT-Neo (`GPTNeoConfig`, `GPTNeoForCausalLM`): GPT-2's shape with unscaled attention
//! scores, no q/k/v biases, `nn.Linear` weights and global and local (windowed) layers.

use burnlens_model::{AttentionSpan, ScoreScale, TransformerConfig};
use serde_json::{Value, json};

use super::spec::{FamilySpec, FreshShape, Names};
use crate::error::Result;
use crate::fields::{Fields, activation, head_dim};
use crate::layout::Tensors;

pub struct GptNeo;

impl FamilySpec for GptNeo {
    fn names(&self) -> Names {
        Names { model_type: "gpt_neo", architecture: "GPTNeoForCausalLM", base_prefix: "transformer.", embed_name: "wte.weight" }
    }

    fn parse(&self, f: &Fields) -> Result<TransformerConfig> {
        let d_model = f.size(&["hidden_size"], 2048)?;
        let n_heads = f.size(&["num_heads"], 16)?;
        let n_layers = f.layers(&["num_layers"], 24)?;
        let window = f.count(&["window_size"], 256)?;
        let kinds = attention_layers(f)?;
        if kinds.len() != n_layers {
            return Err(f.err("attention_types", format!("describes {} layers but num_layers is {n_layers}; they must agree", kinds.len())));
        }
        if window == 0 && kinds.iter().any(|k| k == "local") {
            return Err(f.err("window_size", "is 0; a local attention layer needs a window of at least 1 token"));
        }
        Ok(TransformerConfig {
            vocab_size: f.size(&["vocab_size"], 50257)?,
            n_ctx: f.size(&["max_position_embeddings"], 2048)?,
            d_model,
            n_heads,
            d_head: head_dim(f, d_model, n_heads, "hidden_size", "num_heads")?,
            d_mlp: Some(f.opt_size(&["intermediate_size"])?.unwrap_or(4 * d_model)),
            spans: kinds.iter().map(|k| if k == "local" { AttentionSpan::Local(window) } else { AttentionSpan::Global }).collect(),
            score_scale: ScoreScale::None,
            qkv_bias: false,
            activation: activation(f)?,
            layer_norm_eps: f.float("layer_norm_epsilon", 1e-5)?,
            ..TransformerConfig::gpt2_like(1, 1, 1, 1, 1)
        })
    }

    fn tensors(&self, cfg: &TransformerConfig, t: &mut Tensors) {
        let (d, hd, m) = (cfg.d_model, cfg.n_heads * cfg.d_head, cfg.d_mlp.unwrap_or(4 * cfg.d_model));
        super::gpt2::classic_embeddings(cfg, t);
        for l in 0..cfg.n_layers() {
            let (h, b) = (format!("h.{l}"), format!("blocks.{l}"));
            t.norm(&format!("{h}.ln_1"), &format!("{b}.ln1"));
            t.norm(&format!("{h}.ln_2"), &format!("{b}.ln2"));
            t.split_qkv(&format!("{h}.attn.attention"), &format!("{b}.attn"), ["q_proj", "k_proj", "v_proj"]);
            t.linear(&format!("{h}.attn.attention.out_proj"), &format!("{b}.attn.out"), hd, d, true);
            t.linear(&format!("{h}.mlp.c_fc"), &format!("{b}.mlp.fc_in"), d, m, true);
            t.linear(&format!("{h}.mlp.c_proj"), &format!("{b}.mlp.fc_out"), m, d, true);
        }
        t.norm("ln_f", "ln_final");
    }

    fn config_json(&self, cfg: &TransformerConfig) -> std::result::Result<Value, String> {
        super::gpt2::classic_rules(cfg, "GPT-Neo")?;
        if cfg.qkv_bias {
            return Err("GPT-Neo has no q/k/v biases".into());
        }
        if cfg.score_scale != ScoreScale::None || cfg.scale_by_inverse_layer {
            return Err("GPT-Neo does not scale attention scores".into());
        }
        let window = super::spec::one_window(cfg)?.unwrap_or(256);
        // Runs of identical kinds, in HF's [[kinds, repeat]] form.
        let mut types: Vec<Value> = Vec::new();
        let mut run: Option<(&str, usize)> = None;
        for s in &cfg.spans {
            let k = if matches!(s, AttentionSpan::Local(_)) { "local" } else { "global" };
            run = match run {
                Some((prev, n)) if prev == k => Some((prev, n + 1)),
                Some((prev, n)) => {
                    types.push(json!([[prev], n]));
                    Some((k, 1))
                }
                None => Some((k, 1)),
            };
        }
        if let Some((k, n)) = run {
            types.push(json!([[k], n]));
        }
        Ok(json!({
            "max_position_embeddings": cfg.n_ctx,
            "hidden_size": cfg.d_model,
            "num_layers": cfg.n_layers(),
            "num_heads": cfg.n_heads,
            "intermediate_size": cfg.d_mlp,
            "attention_types": types,
            "window_size": window,
            "activation_function": cfg.activation.hf_name(),
            "layer_norm_epsilon": cfg.layer_norm_eps,
            "resid_dropout": 0.0,
            "embed_dropout": 0.0,
            "attention_dropout": 0.0,
        }))
    }

    /// Alternating global and local layers (window 256), unscaled scores, no q/k/v biases.
    fn fresh(&self, s: &FreshShape) -> TransformerConfig {
        TransformerConfig {
            spans: (0..s.n_layers).map(|l| if l % 2 == 0 { AttentionSpan::Global } else { AttentionSpan::Local(256) }).collect(),
            score_scale: ScoreScale::None,
            qkv_bias: false,
            ..TransformerConfig::gpt2_like(s.vocab, s.n_ctx, s.d_model, s.n_layers, s.n_heads)
        }
    }
}

/// GPT-Neo's per-layer attention kinds: `attention_types` (`[[["global", "local"], 12]]`)
/// expanded, checked against `attention_layers` when the file has both.
fn attention_layers(f: &Fields) -> Result<Vec<String>> {
    let expanded = match f.get("attention_types") {
        None => ["global", "local"].repeat(12).into_iter().map(String::from).collect(),
        Some(v) => {
            let bad = || f.err("attention_types", r#"must look like [[["global", "local"], 12]]: a list of [list of "global"/"local", repeat count]"#);
            let mut out = Vec::new();
            for item in v.as_array().ok_or_else(bad)? {
                let pair = item.as_array().filter(|p| p.len() == 2).ok_or_else(bad)?;
                let kinds = pair[0].as_array().ok_or_else(bad)?;
                let times = pair[1].as_u64().ok_or_else(bad)?;
                let kinds: Vec<String> = kinds.iter().map(|k| k.as_str().map(String::from).ok_or_else(bad)).collect::<Result<_>>()?;
                let total = (times as u128) * (kinds.len() as u128) + out.len() as u128;
                if total > burnlens_model::MAX_LAYERS as u128 {
                    return Err(f.err("attention_types", format!("expands to {total} layers; at most {} are supported", burnlens_model::MAX_LAYERS)));
                }
                for _ in 0..times {
                    out.extend(kinds.iter().cloned());
                }
            }
            out
        }
    };
    for k in &expanded {
        if k != "global" && k != "local" {
            return Err(f.err("attention_types", format!("has attention kind \"{k}\"; expected \"global\" or \"local\"")));
        }
    }
    if let Some(v) = f.get("attention_layers") {
        let listed: Option<Vec<&str>> = v.as_array().and_then(|a| a.iter().map(Value::as_str).collect());
        match listed {
            Some(l) if l == expanded.iter().map(String::as_str).collect::<Vec<_>>() => {}
            Some(_) => return Err(f.err("attention_layers", "disagrees with the expansion of attention_types")),
            None => return Err(f.err("attention_layers", "must be a list of \"global\"/\"local\" strings")),
        }
    }
    Ok(expanded)
}
