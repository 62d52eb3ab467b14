//! Writing a model back as a Hugging Face directory that `transformers` loads unchanged:
//! `config.json` of the family, `model.safetensors` with HF names and layouts (the inverse
//! of the import table in [`crate::layout`]), and the tokenizer when there is one.

use std::collections::HashMap;
use std::path::Path;

use burn_store::{ModuleSnapshot, bridge};
use burnlens_model::{ActivationFn, AttentionSpan, MlpKind, NormKind, Positional, RopeScaling, ScoreScale, Transformer, TransformerConfig};
use safetensors::{Dtype, tensor::TensorView};
use serde_json::{Value, json};

use crate::config::Family;
use crate::error::{HfError, Result};
use crate::layout::{entries, extract};
use crate::tokenizer::Tokenizer;

/// Whether `family` can represent `cfg`: the rules below name the usual reasons in words, and
/// then the round trip decides — the `config.json` written for `cfg` must parse back to `cfg`
/// itself (dropout aside, which `config.json` does not carry for every family), so nothing a
/// rule forgot can export silently as a different model.
pub fn check_exportable(cfg: &TransformerConfig, family: Family) -> Result<()> {
    let json = hf_config_json(cfg, family, None)?;
    reads_back_as(cfg, family, &json)
}

/// The round trip of [`check_exportable`] on an already written `config.json`.
fn reads_back_as(cfg: &TransformerConfig, family: Family, json: &Value) -> Result<()> {
    let back = crate::config::parse_config(&json.to_string(), Path::new("config.json"))?.model;
    let fields = |c: &TransformerConfig| -> serde_json::Map<String, Value> {
        let mut c = c.clone();
        c.dropout = 0.0;
        match serde_json::to_value(&c).expect("a config serialises") {
            Value::Object(m) => m,
            _ => unreachable!("a config is a JSON object"),
        }
    };
    let (want, got) = (fields(cfg), fields(&back));
    let differ: Vec<String> = want.iter().filter(|(k, v)| got.get(*k) != Some(v)).map(|(k, v)| format!("{k} = {v} reads back as {}", got.get(k).unwrap_or(&Value::Null))).collect();
    if !differ.is_empty() {
        return Err(HfError::Export(format!("cannot export as {family}: its config.json would describe another model ({})", differ.join("; "))));
    }
    Ok(())
}

/// The rules of [`check_exportable`] that have a reason in words.
fn exportable_rules(cfg: &TransformerConfig, family: Family) -> Result<()> {
    let fail = |why: String| Err(HfError::Export(format!("cannot export as {family}: {why}")));
    if cfg.d_mlp.is_none() {
        return fail("attention-only models have no Hugging Face equivalent".into());
    }
    if cfg.untied_unembed && cfg.unembed_bias {
        return fail("the unembedding has a bias b_U; Hugging Face's lm_head has none".into());
    }
    if cfg.positional == Positional::QueryKeyOnly {
        return fail("positions added only to queries and keys have no Hugging Face equivalent".into());
    }
    let classic = matches!(family, Family::Gpt2 | Family::GptNeo);
    let llama = matches!(family, Family::Llama | Family::Qwen2 | Family::Mistral);
    if classic {
        if cfg.untied_unembed {
            return fail("the unembedding is untied (its own W_U); Hugging Face GPT-2/GPT-Neo tie it to the embedding".into());
        }
        if cfg.positional != Positional::Residual || cfg.norm != NormKind::LayerNorm || cfg.mlp != MlpKind::Standard || cfg.parallel_residual || cfg.kv_heads() != cfg.n_heads {
            return fail("GPT-2 and GPT-Neo have learned positions, LayerNorm, a plain MLP, sequential residuals and one key/value head per query head".into());
        }
        if !cfg.attn_out_bias || !cfg.mlp_bias {
            return fail("GPT-2 and GPT-Neo have output and MLP biases".into());
        }
    } else if cfg.positional != Positional::Rotary {
        return fail(format!("{family} uses rotary positions"));
    }
    if family == Family::GptNeoX {
        if cfg.norm != NormKind::LayerNorm || cfg.mlp != MlpKind::Standard || cfg.kv_heads() != cfg.n_heads || cfg.spans.iter().any(|s| *s != AttentionSpan::Global) {
            return fail("GPT-NeoX has LayerNorm, a plain MLP, global attention and one key/value head per query head".into());
        }
        if cfg.qkv_bias != cfg.attn_out_bias || !cfg.mlp_bias {
            return fail("GPT-NeoX has q/k/v and output biases together (attention_bias) and MLP biases".into());
        }
    }
    if llama {
        if cfg.norm != NormKind::RmsNorm || cfg.mlp != MlpKind::Gated || cfg.parallel_residual {
            return fail(format!("{family} has RMSNorm, a gated MLP and sequential residuals"));
        }
        let qwen = family == Family::Qwen2;
        if (qwen && (!cfg.qkv_bias || cfg.attn_out_bias)) || (!qwen && cfg.qkv_bias != cfg.attn_out_bias) {
            return fail(format!("{family}'s biases are q/k/v {}", if qwen { "only" } else { "and output together (attention_bias)" }));
        }
        let windows: Vec<usize> = cfg.spans.iter().filter_map(|s| if let AttentionSpan::Local(w) = s { Some(*w) } else { None }).collect();
        if family == Family::Llama && !windows.is_empty() {
            return fail("Llama has no sliding window".into());
        }
        if windows.windows(2).any(|w| w[0] != w[1]) {
            return fail(format!("one sliding window size for all layers, found {windows:?}"));
        }
    }
    if !llama && cfg.n_heads * cfg.d_head != cfg.d_model {
        return fail(format!("n_heads * d_head = {} must equal d_model = {}", cfg.n_heads * cfg.d_head, cfg.d_model));
    }
    if cfg.scale_by_inverse_layer && family != Family::Gpt2 {
        return fail("only GPT-2 scales attention by the inverse layer index".into());
    }
    if !classic && cfg.score_scale != ScoreScale::InvSqrtDHead {
        return fail(format!("{family} scales attention scores by 1/sqrt(d_head)"));
    }
    match family {
        Family::GptNeoX | Family::Llama | Family::Qwen2 | Family::Mistral => {}
        Family::Gpt2 => {
            if cfg.spans.iter().any(|s| *s != AttentionSpan::Global) {
                return fail("GPT-2 has only global attention layers".into());
            }
            if !cfg.qkv_bias {
                return fail("GPT-2 has q/k/v biases".into());
            }
        }
        Family::GptNeo => {
            if cfg.qkv_bias {
                return fail("GPT-Neo has no q/k/v biases".into());
            }
            if cfg.score_scale != ScoreScale::None || cfg.scale_by_inverse_layer {
                return fail("GPT-Neo does not scale attention scores".into());
            }
            let mut windows: Vec<usize> = cfg.spans.iter().filter_map(|s| if let AttentionSpan::Local(w) = s { Some(*w) } else { None }).collect();
            windows.dedup();
            if windows.len() > 1 {
                return fail(format!("GPT-Neo has one window size for all local layers, found {windows:?}"));
            }
        }
    }
    Ok(())
}

/// `config.json` for `cfg` as `family`; `bos_eos` is the id of the end-of-text token, if
/// the tokenizer has one.
pub fn hf_config_json(cfg: &TransformerConfig, family: Family, bos_eos: Option<u32>) -> Result<Value> {
    exportable_rules(cfg, family)?;
    let d_mlp = cfg.d_mlp.expect("checked");
    let rope_parameters = |r: &burnlens_model::Rotary| -> Value {
        let mut p = json!({"rope_theta": r.base, "rope_type": "default"});
        if r.dims != cfg.d_head {
            p["partial_rotary_factor"] = json!(r.dims as f64 / cfg.d_head as f64);
        }
        match r.scaling {
            None => {}
            Some(RopeScaling::Linear { factor }) => {
                p["rope_type"] = json!("linear");
                p["factor"] = json!(factor);
            }
            Some(RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position }) => {
                p["rope_type"] = json!("llama3");
                p["factor"] = json!(factor);
                p["low_freq_factor"] = json!(low_freq_factor);
                p["high_freq_factor"] = json!(high_freq_factor);
                p["original_max_position_embeddings"] = json!(original_max_position);
            }
        }
        p
    };
    let act_name = |a: ActivationFn| if a == ActivationFn::Silu { "silu" } else { a.hf_name() };
    let mut v = match family {
        Family::Gpt2 => json!({
            "architectures": ["GPT2LMHeadModel"],
            "model_type": "gpt2",
            "vocab_size": cfg.vocab_size,
            "n_positions": cfg.n_ctx,
            "n_ctx": cfg.n_ctx,
            "n_embd": cfg.d_model,
            "n_layer": cfg.n_layers(),
            "n_head": cfg.n_heads,
            "n_inner": d_mlp,
            "activation_function": cfg.activation.hf_name(),
            "layer_norm_epsilon": cfg.layer_norm_eps,
            "scale_attn_weights": cfg.score_scale == ScoreScale::InvSqrtDHead,
            "scale_attn_by_inverse_layer_idx": cfg.scale_by_inverse_layer,
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "attn_pdrop": 0.0,
        }),
        Family::GptNeo => {
            let window = cfg.spans.iter().find_map(|s| if let AttentionSpan::Local(w) = s { Some(*w) } else { None }).unwrap_or(256);
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
            json!({
                "architectures": ["GPTNeoForCausalLM"],
                "model_type": "gpt_neo",
                "vocab_size": cfg.vocab_size,
                "max_position_embeddings": cfg.n_ctx,
                "hidden_size": cfg.d_model,
                "num_layers": cfg.n_layers(),
                "num_heads": cfg.n_heads,
                "intermediate_size": d_mlp,
                "attention_types": types,
                "window_size": window,
                "activation_function": cfg.activation.hf_name(),
                "layer_norm_epsilon": cfg.layer_norm_eps,
                "resid_dropout": 0.0,
                "embed_dropout": 0.0,
                "attention_dropout": 0.0,
            })
        }
        Family::GptNeoX => {
            let r = cfg.rotary.expect("rotary checked");
            json!({
                "architectures": ["GPTNeoXForCausalLM"],
                "model_type": "gpt_neox",
                "vocab_size": cfg.vocab_size,
                "max_position_embeddings": cfg.n_ctx,
                "hidden_size": cfg.d_model,
                "num_hidden_layers": cfg.n_layers(),
                "num_attention_heads": cfg.n_heads,
                "intermediate_size": d_mlp,
                "hidden_act": act_name(cfg.activation),
                "layer_norm_eps": cfg.layer_norm_eps,
                "use_parallel_residual": cfg.parallel_residual,
                "attention_bias": cfg.qkv_bias,
                "rope_parameters": {"rope_theta": r.base, "rope_type": "default", "partial_rotary_factor": r.dims as f64 / cfg.d_head as f64},
                "rotary_pct": r.dims as f64 / cfg.d_head as f64,
                "rotary_emb_base": r.base,
                "hidden_dropout": 0.0,
                "attention_dropout": 0.0,
            })
        }
        Family::Llama | Family::Qwen2 | Family::Mistral => {
            let r = cfg.rotary.expect("rotary checked");
            let window = cfg.spans.iter().find_map(|s| if let AttentionSpan::Local(w) = s { Some(*w) } else { None });
            let arch = match family {
                Family::Llama => "LlamaForCausalLM",
                Family::Qwen2 => "Qwen2ForCausalLM",
                _ => "MistralForCausalLM",
            };
            let mut v = json!({
                "architectures": [arch],
                "model_type": family.model_type(),
                "vocab_size": cfg.vocab_size,
                "max_position_embeddings": cfg.n_ctx,
                "hidden_size": cfg.d_model,
                "num_hidden_layers": cfg.n_layers(),
                "num_attention_heads": cfg.n_heads,
                "num_key_value_heads": cfg.kv_heads(),
                "head_dim": cfg.d_head,
                "intermediate_size": d_mlp,
                "hidden_act": act_name(cfg.activation),
                "rms_norm_eps": cfg.layer_norm_eps,
                "rope_parameters": rope_parameters(&r),
                "rope_theta": r.base,
                "attention_dropout": 0.0,
            });
            if family != Family::Qwen2 {
                v["attention_bias"] = json!(cfg.qkv_bias);
                v["mlp_bias"] = json!(cfg.mlp_bias);
            }
            if family == Family::Mistral {
                v["sliding_window"] = json!(window);
            }
            if family == Family::Qwen2 {
                let types: Vec<&str> = cfg.spans.iter().map(|s| if matches!(s, AttentionSpan::Local(_)) { "sliding_attention" } else { "full_attention" }).collect();
                v["layer_types"] = json!(types);
                v["use_sliding_window"] = json!(window.is_some());
                v["sliding_window"] = json!(window);
                v["max_window_layers"] = json!(cfg.spans.iter().position(|s| matches!(s, AttentionSpan::Local(_))).unwrap_or(cfg.n_layers()));
            }
            v
        }
    };
    let obj = v.as_object_mut().expect("object");
    obj.insert("initializer_range".into(), json!(0.02));
    obj.insert("tie_word_embeddings".into(), json!(!cfg.untied_unembed));
    obj.insert("use_cache".into(), json!(true));
    obj.insert("torch_dtype".into(), json!("float32"));
    obj.insert("bos_token_id".into(), json!(bos_eos));
    obj.insert("eos_token_id".into(), json!(bos_eos));
    Ok(v)
}

/// Write `model` into `dir` (created if needed) as a Hugging Face `family` model. Each file
/// is written beside its target and renamed into place, so an interrupted export never
/// leaves a half-written file.
pub fn export_hf(model: &Transformer, family: Family, dir: &Path, tokenizer: Option<&Tokenizer>) -> Result<()> {
    let cfg = &model.config;
    let eos = match tokenizer {
        Some(Tokenizer::Hf { inner, .. }) => inner.token_to_id("<|endoftext|>"),
        _ => None,
    };
    let config = hf_config_json(cfg, family, eos)?;
    reads_back_as(cfg, family, &config)?;
    std::fs::create_dir_all(dir).map_err(|e| HfError::io(dir, e))?;

    // Canonical parameters by module path, read back from the device through burn-store.
    let mut params: HashMap<String, (Vec<usize>, Vec<f32>)> = HashMap::new();
    for t in model.collect(None, None, false) {
        let name = t.name.clone();
        let data = bridge::into_data(t).map_err(|e| HfError::Export(format!("reading parameter `{name}`: {e}")))?;
        let shape = data.shape().to_vec();
        params.insert(name, (shape, data.try_into_vec_as::<f32>().expect("float parameter")));
    }
    let mut out: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for e in entries(family, cfg) {
        let (shape, values) = params.get(&e.canonical).ok_or_else(|| HfError::Export(format!("model has no parameter `{}`", e.canonical)))?;
        let hf_values = extract(&e, values, shape);
        let bytes = hf_values.iter().flat_map(|x| x.to_le_bytes()).collect();
        out.push((e.full_name(family), e.hf_shape.clone(), bytes));
    }
    let views: Vec<(&str, TensorView)> = out
        .iter()
        .map(|(n, s, b)| (n.as_str(), TensorView::new(Dtype::F32, s.clone(), b).expect("shape matches data")))
        .collect();
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    let bytes = safetensors::serialize(views, Some(metadata)).map_err(|e| HfError::Export(format!("serialising safetensors: {e}")))?;
    write_atomic(&dir.join("model.safetensors"), &bytes)?;
    write_atomic(&dir.join("config.json"), serde_json::to_string_pretty(&config).expect("json").as_bytes())?;
    if let Some(tok) = tokenizer {
        let tmp = dir.join(format!(".tokenizer-{}", std::process::id()));
        std::fs::create_dir_all(&tmp).map_err(|e| HfError::io(&tmp, e))?;
        let written = tok.save(&tmp)?;
        let target = dir.join(written.file_name().expect("file name"));
        std::fs::rename(&written, &target).map_err(|e| HfError::io(&target, e))?;
        let _ = std::fs::remove_dir(&tmp);
    }
    Ok(())
}

/// [`crate::files::write_atomic`] with the error naming the file.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    crate::files::write_atomic(path, bytes).map_err(|e| HfError::io(path, e))
}
