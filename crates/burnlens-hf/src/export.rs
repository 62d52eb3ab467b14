//! Writing a model back as a Hugging Face directory that `transformers` loads unchanged:
//! `config.json` of the family, `model.safetensors` with HF names and layouts (the inverse
//! of the import table in [`crate::layout`]), and the tokenizer when there is one.

use std::collections::HashMap;
use std::path::Path;

use burn_store::{ModuleSnapshot, bridge};
use burnlens_model::{AttentionSpan, Positional, ScoreScale, Transformer, TransformerConfig};
use safetensors::{Dtype, tensor::TensorView};
use serde_json::{Value, json};

use crate::config::Family;
use crate::error::{HfError, Result};
use crate::layout::{Placement, entries, transpose};
use crate::tokenizer::Tokenizer;

/// The HF family that can represent `cfg`, if any; `family` is the one asked for.
pub fn check_exportable(cfg: &TransformerConfig, family: Family) -> Result<()> {
    let fail = |why: String| Err(HfError::Export(format!("cannot export as {family}: {why}")));
    if cfg.d_mlp.is_none() {
        return fail("attention-only models have no Hugging Face equivalent".into());
    }
    if cfg.untied_unembed {
        return fail("the unembedding is untied (its own W_U and b_U); Hugging Face GPT-2/GPT-Neo tie it to the embedding".into());
    }
    if cfg.positional != Positional::Residual {
        return fail("positions added only to queries and keys have no Hugging Face equivalent".into());
    }
    if cfg.n_heads * cfg.d_head != cfg.d_model {
        return fail(format!("n_heads * d_head = {} must equal d_model = {}", cfg.n_heads * cfg.d_head, cfg.d_model));
    }
    match family {
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
    check_exportable(cfg, family)?;
    let d_mlp = cfg.d_mlp.expect("checked");
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
    };
    let obj = v.as_object_mut().expect("object");
    obj.insert("initializer_range".into(), json!(0.02));
    obj.insert("tie_word_embeddings".into(), json!(true));
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
    std::fs::create_dir_all(dir).map_err(|e| HfError::io(dir, e))?;

    // Canonical parameters by module path, read back from the device through burn-store.
    let mut params: HashMap<String, (Vec<usize>, Vec<f32>)> = HashMap::new();
    for t in model.collect(None, None, false) {
        let name = t.name.clone();
        let data = bridge::into_data(t).map_err(|e| HfError::Export(format!("reading parameter `{name}`: {e}")))?;
        let shape = data.shape().to_vec();
        params.insert(name, (shape, data.try_into_vec_as::<f32>().expect("float parameter")));
    }
    let hd = cfg.n_heads * cfg.d_head;
    let mut out: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for e in entries(family, cfg) {
        let (shape, values) = params.get(&e.canonical).ok_or_else(|| HfError::Export(format!("model has no parameter `{}`", e.canonical)))?;
        let hf_values = match e.placement {
            Placement::Same => values.clone(),
            Placement::Transposed => transpose(values, shape[0], shape[1]),
            Placement::QkvBlockTransposed { part } => {
                let d = shape[0];
                let block: Vec<f32> = (0..d).flat_map(|r| values[r * 3 * hd + part * hd..r * 3 * hd + (part + 1) * hd].iter().copied()).collect();
                transpose(&block, d, hd)
            }
        };
        let bytes = hf_values.iter().flat_map(|x| x.to_le_bytes()).collect();
        out.push((format!("transformer.{}", e.hf), e.hf_shape.clone(), bytes));
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

/// Write through a temporary file in the same directory and rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(format!(".{}.tmp-{}", path.file_name().map(|n| n.to_string_lossy()).unwrap_or_default(), std::process::id()));
    let result = std::fs::write(&tmp, bytes).and_then(|_| std::fs::rename(&tmp, path));
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(HfError::io(path, e));
    }
    Ok(())
}
