//! The subcommands: each parses its inputs, loads what it needs through the libraries and
//! writes or prints the result.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use burn::module::Module;
use burn::tensor::Device;
use burnlens_hf::{LoadOptions, LoadedModel, Tokenizer, load_model_with};
use burnlens_model::backend;
use burnlens_model::{AttentionSpan, Hooks, Sampling, Transformer, generate, next_token_loss};
use burnlens_train::{AnyModel, RunConfig, TrainOptions};
use serde_json::json;

use crate::output::{Saved, write_atomic, write_safetensors};
use crate::{Common, Input, ModelArgs, UserError};

pub fn device_of(common: &Common) -> Result<Device> {
    device(common)
}

fn device(common: &Common) -> Result<Device> {
    let name = backend::resolve_name(&[common.backend.as_deref()]);
    Ok(backend::device(&name, common.device_index)?)
}

fn load(model: &Path, common: &Common) -> Result<LoadedModel> {
    let device = device(common)?;
    let loaded = load_model_with(model, &device, &LoadOptions::dtype(common.dtype))?;
    for w in &loaded.info.warnings {
        eprintln!("warning: {w}");
    }
    Ok(loaded)
}

/// Parse `1, 2,3` into token ids, checked against the model.
fn parse_ids(text: &str, model: &Transformer, flag: &str) -> Result<Vec<i64>> {
    let ids = text
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<i64>().map_err(|_| UserError(format!("{flag}: \"{s}\" is not an integer token id"))))
        .collect::<Result<Vec<_>, _>>()?;
    model.check_ids(&ids).with_context(|| flag.to_string())?;
    Ok(ids)
}

pub fn info(dir: &Path, common: &Common) -> Result<()> {
    let LoadedModel { model, hf, info } = load(dir, common)?;
    let c = &model.config;
    let local: Vec<String> = c
        .spans
        .iter()
        .enumerate()
        .filter_map(|(l, s)| match s {
            AttentionSpan::Local(w) => Some(format!("{l} (window {w})")),
            AttentionSpan::Global => None,
        })
        .collect();
    println!("model:       {}", dir.display());
    println!("family:      {}", hf.family);
    println!("parameters:  {} ({:.2}M)", model.num_params(), model.num_params() as f64 / 1e6);
    println!("layers:      {}", c.n_layers());
    let kv = if c.kv_heads() == c.n_heads { String::new() } else { format!(", {} key/value head{} (grouped-query)", c.kv_heads(), if c.kv_heads() == 1 { "" } else { "s" }) };
    println!("heads:       {} x d_head {}{kv}", c.n_heads, c.d_head);
    println!("d_model:     {}", c.d_model);
    println!("d_mlp:       {}", c.d_mlp.map_or("none (attention-only)".into(), |m| m.to_string()));
    println!("context:     {}", c.n_ctx);
    println!("vocab:       {}", c.vocab_size);
    println!("activation:  {}{}", c.activation.hf_name(), if c.mlp == burnlens_model::MlpKind::Gated { " (gated MLP)" } else { "" });
    println!("norm:        {}", match c.norm {
        burnlens_model::NormKind::LayerNorm => format!("LayerNorm, eps {}", c.layer_norm_eps),
        burnlens_model::NormKind::RmsNorm => format!("RMSNorm, eps {}", c.layer_norm_eps),
    });
    let positions = match (c.positional, c.rotary) {
        (burnlens_model::Positional::Rotary, Some(r)) => format!(
            "rotary on {} of {} head dims, base {}{}",
            r.dims,
            c.d_head,
            r.base,
            match r.scaling {
                None => String::new(),
                Some(burnlens_model::RopeScaling::Linear { factor }) => format!(", linear scaling x{factor}"),
                Some(burnlens_model::RopeScaling::Llama3 { factor, .. }) => format!(", llama3 scaling x{factor}"),
            }
        ),
        (burnlens_model::Positional::QueryKeyOnly, _) => "learned, added to queries and keys only".into(),
        _ => "learned, added to the residual stream".into(),
    };
    println!("positions:   {positions}");
    println!("residual:    {}", if c.parallel_residual { "parallel (attention and MLP read the block input)" } else { "sequential" });
    println!("norms:       {:?}{}{}", c.norm_placement, c.qk_norm.map_or(String::new(), |q| format!(", QK-norm {q:?}")), if c.scale_embed { ", embedding x sqrt(d_model)" } else { "" });
    if c.attn_softcap.is_some() || c.final_softcap.is_some() {
        println!("soft caps:   attention {:?}, logits {:?}", c.attn_softcap, c.final_softcap);
    }
    let scale = match c.score_scale {
        burnlens_model::ScoreScale::InvSqrtDHead => format!("1/sqrt(d_head) = {:.4}", 1.0 / (c.d_head as f64).sqrt()),
        burnlens_model::ScoreScale::None => "none (1.0)".to_string(),
        burnlens_model::ScoreScale::InvSqrtOf(n) => format!("1/sqrt(query_pre_attn_scalar = {n}) = {:.4}", 1.0 / (n as f64).sqrt()),
    };
    println!("score scale: {scale}{}", if c.scale_by_inverse_layer { ", then / (layer + 1)" } else { "" });
    println!("local attn:  {}", if local.is_empty() { "none (all layers global)".into() } else { local.join(", ") });
    println!("checkpoint:  {} ({} file{}), dtype {}", info.format, info.files.len(), if info.files.len() == 1 { "" } else { "s" }, info.dtypes.join("/"));
    println!("weights:     {} matrices, f32 vectors and compute", info.weight_dtype);
    let unembed = match (c.untied_unembed, info.lm_head_present) {
        (true, _) => "untied",
        (false, true) => "present (tied)",
        (false, false) => "absent (tied)",
    };
    println!(
        "names:       {}{} prefix, unembedding {}, {} legacy buffer{} ignored",
        if info.prefixed { "" } else { "no " },
        hf.family.base_prefix(),
        unembed,
        info.ignored_buffers,
        if info.ignored_buffers == 1 { "" } else { "s" }
    );
    Ok(())
}

pub fn logits(args: &ModelArgs, input: &Input, out: Option<&Path>, common: &Common) -> Result<()> {
    let (m, dir) = load_model_args(args, common)?;
    let (ids, tokens) = ids_and_labels(&m, &dir, input, "")?;
    let model = &m.model;
    let input_t = model.ids_tensor(&ids);
    let logits = model.forward(input_t.clone());
    let loss = (ids.len() >= 2).then(|| next_token_loss(logits.clone(), input_t).into_scalar::<f32>() as f64);
    let [_, t, v] = logits.dims();
    let values: Vec<f32> = logits.into_data().try_into_vec_as::<f32>().expect("f32 logits");
    match out.map(|p| (p, p.extension().and_then(|e| e.to_str()).unwrap_or(""))) {
        Some((path, "json")) => {
            let rows: Vec<&[f32]> = values.chunks(v).collect();
            let doc = json!({ "ids": ids, "tokens": tokens, "logits": rows, "loss": loss });
            write_atomic(path, serde_json::to_string(&doc)?.as_bytes())?;
            println!("wrote {} ({} positions x {} logits)", path.display(), t, v);
        }
        Some((path, "safetensors")) => {
            let mut tensors = vec![Saved::I64("ids".into(), vec![t], ids.clone()), Saved::F32("logits".into(), vec![t, v], values)];
            if let Some(l) = loss {
                tensors.push(Saved::F32("loss".into(), vec![1], vec![l as f32]));
            }
            write_safetensors(path, &tensors)?;
            println!("wrote {} ({} positions x {} logits)", path.display(), t, v);
        }
        Some((path, _)) => {
            return Err(UserError(format!("--out {}: expected a .json or .safetensors file name", path.display())).into());
        }
        None => {
            println!("{} tokens, vocab {}", t, v);
            if m.tokenizer.is_some() {
                println!("tokens: {}", tokens.iter().map(|s| format!("{s:?}")).collect::<Vec<_>>().join(" "));
            }
            match loss {
                Some(l) => println!("loss (mean next-token cross-entropy): {l:.6}"),
                None => println!("loss: n/a (needs at least two tokens)"),
            }
            let last = &values[(t - 1) * v..];
            let mut top: Vec<(usize, f32)> = last.iter().copied().enumerate().collect();
            top.sort_by(|a, b| b.1.total_cmp(&a.1));
            let shown: Vec<String> = top.iter().take(5).map(|(i, x)| format!("{i}{} ({x:.3})", token_suffix(&m, *i as i64))).collect();
            println!("top next tokens after the last position: {}", shown.join(", "));
        }
    }
    Ok(())
}

/// ` "text"` for a token id when the model has a tokenizer.
fn token_suffix(m: &AnyModel, id: i64) -> String {
    m.tokenizer.as_ref().map_or(String::new(), |t| format!(" {:?}", t.decode(&[id as u32])))
}

/// Hook names from `--names` ([`burnlens_lens::HookSelection`]'s grammar).
fn hook_filter(spec: &str, all: &[String]) -> Result<Box<dyn Fn(&str) -> bool>> {
    let selection = burnlens_lens::HookSelection::parse(spec, all).map_err(|why| UserError(format!("--names: {why}")))?;
    Ok(Box::new(move |n| selection.matches(n)))
}

pub fn cache(args: &ModelArgs, input: &Input, names: &str, grad: Option<&str>, out: &Path, common: &Common) -> Result<()> {
    if out.extension().and_then(|e| e.to_str()) != Some("safetensors") {
        return Err(UserError(format!("--out {}: expected a .safetensors file name", out.display())).into());
    }
    let (m, dir) = load_model_args(args, common)?;
    let (ids, tokens) = ids_and_labels(&m, &dir, input, "")?;
    let model = &m.model;
    let all = burnlens_model::hook_names(&model.config);
    let filter = hook_filter(names, &all)?;
    let (cache, grads, metric) = match grad {
        None => {
            let mut hooks = Hooks::capture(filter);
            model.forward_hooked(model.ids_tensor(&ids), &mut hooks);
            (hooks.take_cache(), Default::default(), None)
        }
        Some(spec) => {
            let metric = parse_metric(&m, spec, ids.len())?;
            let g = burnlens_lens::hook_gradients(model, &ids, &filter, &metric)?;
            (g.activations, g.gradients, Some((metric, g.metric)))
        }
    };
    let mut tensors: Vec<Saved> = cache.iter().map(|(name, act)| Saved::F32(name.clone(), act.dims(), act.to_vec())).collect();
    tensors.extend(grads.iter().map(|(name, g): (&String, &burnlens_model::Activation)| Saved::F32(format!("grad.{name}"), g.dims(), g.to_vec())));
    tensors.push(Saved::I64("ids".into(), vec![ids.len()], ids.clone()));
    if let Some((_, value)) = &metric {
        tensors.push(Saved::F32("metric".into(), vec![1], vec![*value as f32]));
    }
    write_safetensors(out, &tensors)?;
    let with_grads = if grads.is_empty() { String::new() } else { format!(" and their gradients (grad.NAME)") };
    println!("wrote {} activations{with_grads} (and the token ids) to {}", cache.len(), out.display());
    if let Some((metric, value)) = &metric {
        println!("metric {}: {value:.6}", metric.describe());
    }
    if m.tokenizer.is_some() {
        println!("tokens: {}", tokens.iter().map(|s| format!("{s:?}")).collect::<Vec<_>>().join(" "));
    }
    for (name, act) in &cache {
        println!("  {name} {:?}", act.dims());
    }
    Ok(())
}

pub fn train(config: Option<&Path>, sets: &[String], resume: Option<&Path>, quiet: bool, common: &Common) -> Result<()> {
    let cfg = match (config, resume) {
        (_, Some(run)) => {
            let mut sets = sets.to_vec();
            // The run directory stays where it is, whatever its config says.
            sets.push(format!("output.dir={:?}", run.display().to_string()));
            RunConfig::load(&run.join("config.toml"), &sets)?
        }
        (Some(path), None) => RunConfig::load(path, sets)?,
        (None, None) => return Err(UserError("train: give --config FILE (or --resume RUN_DIR)".into()).into()),
    };
    burnlens_train::install_interrupt_handler();
    let opts = TrainOptions { backend_flag: common.backend.clone(), resume: resume.is_some(), quiet, on_step: None };
    let s = burnlens_train::train(&cfg, &opts)?;
    println!(
        "trained {} steps in {:.1}s ({:.0} tokens/s): final train loss {:.4}, validation loss {}",
        s.steps,
        s.seconds,
        s.tokens_per_s,
        s.final_train_loss,
        s.final_val_loss.map_or("n/a".into(), |v| format!("{v:.4}"))
    );
    println!("run directory: {}", s.run_dir.display());
    if let Some(hf) = s.exported {
        println!("Hugging Face export: {}", hf.display());
    }
    Ok(())
}

pub fn export(run: &Path, out: &Path, dtype: burnlens_hf::WeightDtype) -> Result<()> {
    burnlens_train::export_run(run, out, dtype)?;
    println!("exported {} to {}", run.display(), out.display());
    Ok(())
}

/// [`burnlens_train::load_any`] on the chosen device, its warnings printed.
fn load_any(dir: &Path, common: &Common) -> Result<AnyModel> {
    let m = burnlens_train::load_any(dir, &device(common)?, &LoadOptions::dtype(common.dtype))?;
    for w in &m.warnings {
        eprintln!("warning: {w}");
    }
    Ok(m)
}

pub fn sample(dir: &Path, prompt: Option<&str>, ids: Option<&str>, s: &Sampling, common: &Common) -> Result<()> {
    let AnyModel { model, tokenizer, .. } = load_any(dir, common)?;
    let prompt_ids: Vec<i64> = match (prompt, ids) {
        (Some(text), _) => {
            let tok = tokenizer.as_ref().ok_or_else(|| {
                UserError(format!("--prompt: {} has no tokenizer.json or char_vocab.json; pass token ids with --ids", dir.display()))
            })?;
            let ids: Vec<i64> = tok.encode(text)?.into_iter().map(i64::from).collect();
            if ids.is_empty() {
                return Err(UserError(format!("--prompt: {text:?} encodes to no tokens")).into());
            }
            ids
        }
        (None, Some(text)) => parse_ids(text, &model, "--ids")?,
        (None, None) => return Err(UserError("sample: give --prompt TEXT or --ids 1,2,3".into()).into()),
    };
    model.check_ids(&prompt_ids).context("prompt")?;
    let new = generate(&model, &prompt_ids, s)?;
    if new.len() < s.max_new_tokens {
        eprintln!("note: stopped after {} new tokens: the context of {} positions is full", new.len(), model.config.n_ctx);
    }
    match (&tokenizer, prompt) {
        (Some(tok), Some(_)) => {
            let all: Vec<u32> = prompt_ids.iter().chain(&new).map(|&i| i as u32).collect();
            println!("{}", tok.decode(&all));
        }
        _ => {
            let text: Vec<String> = new.iter().map(|i| i.to_string()).collect();
            println!("{}", text.join(","));
            if let Some(tok) = &tokenizer {
                eprintln!("text: {:?}", tok.decode(&new.iter().map(|&i| i as u32).collect::<Vec<_>>()));
            }
        }
    }
    Ok(())
}

/// Known corpora: name, canonical address, sha256.
const CORPORA: &[(&str, &str, &str)] = &[(
    "tinyshakespeare",
    "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt",
    "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
)];

/// `burnlens download ID`: fetch into the Hugging Face cache and say where it is.
pub fn download(id: &str) -> Result<()> {
    let hub_id = burnlens_hf::HubId::parse(id).ok_or_else(|| UserError(format!("\"{id}\" is not a Hugging Face Hub id (org/name or org/name@revision)")))?;
    let dir = crate::progress::hub_snapshot(&hub_id)?;
    let hf = burnlens_hf::read_config(&dir.join("config.json"))?;
    println!("{hub_id}: {} model in {}", hf.family, dir.display());
    Ok(())
}

pub fn fetch(name: &str, out: Option<&Path>) -> Result<()> {
    use sha2::Digest;
    let (_, url, sha) = CORPORA.iter().find(|(n, ..)| *n == name).ok_or_else(|| {
        UserError(format!("unknown dataset \"{name}\"; known: {}", CORPORA.iter().map(|c| c.0).collect::<Vec<_>>().join(", ")))
    })?;
    let default = Path::new("data").join(format!("{name}.txt"));
    let out = out.unwrap_or(&default);
    if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    let url = std::env::var("BURNLENS_DATA_URL").unwrap_or_else(|_| url.to_string());
    let offline = |e: &dyn std::fmt::Display| {
        UserError(format!("downloading {url}: {e}; without network, copy the file to {} yourself (its sha256 must be {sha}) or point data.path at a copy", out.display()))
    };
    let mut body = ureq::get(&url).call().map_err(|e| offline(&e))?.into_body();
    let bytes = body.read_to_vec().map_err(|e| offline(&e))?;
    let got = format!("{:x}", sha2::Sha256::digest(&bytes));
    if got != *sha {
        return Err(UserError(format!("{url}: sha256 is {got}, expected {sha}; not saved")).into());
    }
    write_atomic(out, &bytes)?;
    println!("wrote {} ({} bytes, sha256 {sha})", out.display(), bytes.len());
    Ok(())
}

/// Token ids from `--{prefix}text` (through the model's tokenizer) or `--{prefix}ids`, with a
/// label per token.
fn ids_and_labels(m: &AnyModel, dir: &Path, input: &Input, prefix: &str) -> Result<(Vec<i64>, Vec<String>)> {
    let ids: Vec<i64> = match (&input.text, &input.ids) {
        (Some(t), _) => {
            let tok = m.tokenizer.as_ref().ok_or_else(|| UserError(format!("--{prefix}text: {} has no tokenizer.json or char_vocab.json; pass --{prefix}ids", dir.display())))?;
            let ids: Vec<i64> = tok.encode(t)?.into_iter().map(i64::from).collect();
            if ids.is_empty() {
                return Err(UserError(format!("--{prefix}text: {t:?} encodes to no tokens")).into());
            }
            m.model.check_ids(&ids).with_context(|| format!("--{prefix}text"))?;
            ids
        }
        (None, Some(s)) => parse_ids(s, &m.model, &format!("--{prefix}ids"))?,
        (None, None) => return Err(UserError(format!("give --{prefix}text TEXT or --{prefix}ids 1,2,3")).into()),
    };
    let labels = labels(m, &ids);
    Ok((ids, labels))
}

/// A label per token: its text if the model has a tokenizer, else its id.
fn labels(m: &AnyModel, ids: &[i64]) -> Vec<String> {
    ids.iter()
        .map(|&i| match &m.tokenizer {
            Some(t) => t.decode(&[i as u32]),
            None => i.to_string(),
        })
        .collect()
}

/// A token given on the command line: an id, or a text that encodes to exactly one token.
fn parse_token(m: &AnyModel, flag: &str, s: &str) -> Result<i64> {
    let id = match s.trim().parse::<i64>() {
        Ok(id) => id,
        Err(_) => {
            let tok = m.tokenizer.as_ref().ok_or_else(|| UserError(format!("{flag} {s:?}: not a token id, and the model has no tokenizer to read text with")))?;
            let ids = tok.encode(s)?;
            match ids.as_slice() {
                [one] => i64::from(*one),
                _ => return Err(UserError(format!("{flag} {s:?}: encodes to {} tokens {ids:?}; give one token (or its id)", ids.len())).into()),
            }
        }
    };
    let vocab = m.model.config.vocab_size;
    if id < 0 || id as usize >= vocab {
        return Err(UserError(format!("{flag} {id}: outside the vocabulary of {vocab} tokens")).into());
    }
    Ok(id)
}

/// Load `--model` (a directory, Hub id or run), processing its weights if asked.
fn load_model_args(args: &ModelArgs, common: &Common) -> Result<(AnyModel, PathBuf)> {
    let dir = crate::progress::model_dir(&args.model)?;
    let mut m = load_any(&dir, common)?;
    if args.process_weights {
        let (opts, dropped) = burnlens_lens::ProcessOptions::all().allowed_for(&m.model.config);
        for why in dropped {
            eprintln!("warning: --process-weights: {why}");
        }
        m.model = burnlens_lens::process_weights(&m.model, opts)?;
    }
    Ok((m, dir))
}

fn report_err(out: &Path) -> impl FnOnce(std::io::Error) -> anyhow::Error + '_ {
    move |e| UserError(format!("{}: cannot write the report: {e}", out.display())).into()
}

pub fn analyze(args: &ModelArgs, input: &Input, out: &Path, common: &Common) -> Result<()> {
    let (m, dir) = load_model_args(args, common)?;
    let (ids, labels) = ids_and_labels(&m, &dir, input, "")?;
    let a = burnlens_lens::report::analyze(&m.model, &ids, labels);
    burnlens_lens::report::write_analysis(out, &a, &format!("burnlens analysis of {}", dir.display())).map_err(report_err(out))?;
    println!("wrote {} and {}", out.join("index.html").display(), out.join("report.json").display());
    let top = |name: &str| {
        let s = &a.detectors[name];
        let (mut best, mut at) = (f64::MIN, (0, 0));
        for (l, row) in s.iter().enumerate() {
            for (h, &v) in row.iter().enumerate() {
                if v > best {
                    best = v;
                    at = (l, h);
                }
            }
        }
        format!("{name}: L{}H{} ({best:.3})", at.0, at.1)
    };
    println!("strongest heads: {}, {}, {}", top("previous_token"), top("duplicate_token"), top("induction"));
    Ok(())
}

pub fn tokenize(dir: &Path, text: &str, as_json: bool) -> Result<()> {
    let tok = match load_tokenizer(dir)? {
        Some(t) => t,
        None => return Err(UserError(format!("{}: no tokenizer.json (or char_vocab.json of a burnlens run) to tokenize with", dir.display())).into()),
    };
    let ids: Vec<u32> = tok.encode(text)?;
    let tokens: Vec<String> = ids.iter().map(|&i| tok.decode(&[i])).collect();
    if as_json {
        println!("{}", json!({ "ids": ids, "tokens": tokens }));
    } else {
        println!("ids:    {}", ids.iter().map(u32::to_string).collect::<Vec<_>>().join(","));
        println!("tokens: {}", tokens.iter().map(|s| format!("{s:?}")).collect::<Vec<_>>().join(" "));
        println!("{} tokens ({} tokenizer)", ids.len(), tok.kind());
    }
    Ok(())
}

/// The tokenizer of a model or run directory, without loading weights.
fn load_tokenizer(dir: &Path) -> Result<Option<Tokenizer>> {
    // A run directory keeps its tokenizer beside its checkpoints, as a model directory does.
    Ok(Tokenizer::find_in_dir(dir).transpose()?)
}

/// Parse `--metric` with the library's grammar ([`burnlens_lens::Metric::parse`]); tokens may
/// be ids or text of one token.
fn parse_metric(m: &AnyModel, spec: &str, len: usize) -> Result<burnlens_lens::Metric> {
    use burnlens_lens::{Metric, MetricParseError};
    let metric = Metric::parse(spec, |t| parse_token(m, "--metric", t)).map_err(|e| match e {
        MetricParseError::Syntax(why) => UserError(format!("--metric {spec:?}: {why}; expected {}", Metric::GRAMMAR)).into(),
        MetricParseError::Token(e) => e,
    })?;
    metric.check(len, m.model.config.vocab_size).map_err(|e| UserError(format!("--metric {spec:?}: {e}")))?;
    Ok(metric)
}

#[allow(clippy::too_many_arguments)]
pub fn patch(args: &ModelArgs, clean: &Input, corrupted: &Input, metric: &str, nodes: &str, exact: bool, denoise: bool, out: &Path, common: &Common) -> Result<()> {
    let (m, dir) = load_model_args(args, common)?;
    let (clean_ids, clean_tokens) = ids_and_labels(&m, &dir, clean, "")?;
    let (corrupted_ids, corrupted_tokens) = ids_and_labels(&m, &dir, corrupted, "corrupted-")?;
    if clean_ids.len() != corrupted_ids.len() {
        return Err(UserError(format!(
            "the clean sequence has {} tokens and the corrupted one {}; patching needs equal lengths (clean {:?}, corrupted {:?})",
            clean_ids.len(),
            corrupted_ids.len(),
            clean_tokens,
            corrupted_tokens
        ))
        .into());
    }
    let metric = parse_metric(&m, metric, clean_ids.len())?;
    let kinds = nodes
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| burnlens_lens::NodeKind::from_name(s).map_err(|e| UserError(format!("--nodes: {e}"))))
        .collect::<Result<Vec<_>, _>>()?;
    // Denoising is noising with the roles swapped: the corrupted run is the base.
    let (base, source) = if denoise { (&corrupted_ids, &clean_ids) } else { (&clean_ids, &corrupted_ids) };
    let result = burnlens_lens::compare_patching(&m.model, base, source, &metric, &kinds, exact)?;
    let c = &m.model.config;
    let direction = if denoise { "denoising" } else { "noising" }.to_string();
    let report = burnlens_lens::tool_reports::PatchingReport { clean_ids, clean_tokens, corrupted_ids, corrupted_tokens, direction, n_layers: c.n_layers(), n_heads: c.n_heads, result };
    burnlens_lens::tool_reports::write_patching(out, &report, &format!("burnlens patching on {}", dir.display())).map_err(report_err(out))?;
    let r = &report.result;
    let (c_m, x_m) = if denoise { (r.corrupted_metric, r.clean_metric) } else { (r.clean_metric, r.corrupted_metric) };
    println!("metric {}: clean {c_m:.4}, corrupted {x_m:.4} ({})", metric.describe(), report.direction);
    let shown = |values: &[f64]| {
        let mut order: Vec<usize> = (0..values.len()).collect();
        order.sort_by(|&a, &b| values[b].abs().total_cmp(&values[a].abs()));
        order.iter().take(5).map(|&i| format!("{} {:+.4}", r.labels[i], values[i])).collect::<Vec<_>>().join(", ")
    };
    println!("largest attribution-patching estimates: {}", shown(&r.attribution));
    if let Some(p) = &r.patched {
        println!("largest activation-patching effects:    {}", shown(p));
    }
    if let Some(cor) = r.correlation {
        let by: Vec<String> = r.correlation_by_kind.iter().map(|(k, v)| format!("{k} {v:.3}")).collect();
        println!("correlation of the two over {} nodes: {cor:.3} ({})", r.nodes.len(), by.join(", "));
    }
    println!("wrote {}", out.join("index.html").display());
    Ok(())
}

#[allow(clippy::too_many_arguments)]
pub fn attribute(args: &ModelArgs, input: &Input, target: &str, wrong: Option<&str>, pos: Option<usize>, out: &Path, common: &Common) -> Result<()> {
    let (m, dir) = load_model_args(args, common)?;
    let (ids, tokens) = ids_and_labels(&m, &dir, input, "")?;
    let right = parse_token(&m, "--target", target)?;
    let wrong = wrong.map(|w| parse_token(&m, "--wrong", w)).transpose()?;
    let position = pos.unwrap_or(ids.len() - 1);
    if position >= ids.len() {
        return Err(UserError(format!("--pos {position}: the sequence has {} tokens", ids.len())).into());
    }
    let dla = burnlens_lens::direct_logit_attribution(&m.model, &ids, right, wrong);
    let name = |id: i64| format!("{id}{}", token_suffix(&m, id));
    let target_label = match wrong {
        None => format!("logit[{}]", name(right)),
        Some(w) => format!("logit[{}] - logit[{}]", name(right), name(w)),
    };
    let c = &m.model.config;
    let report = burnlens_lens::tool_reports::AttributionReport { ids, tokens, target: target_label.clone(), position, n_layers: c.n_layers(), n_heads: c.n_heads, dla };
    burnlens_lens::tool_reports::write_attribution(out, &report, &format!("burnlens direct logit attribution on {}", dir.display())).map_err(report_err(out))?;
    let d = &report.dla;
    let mut order: Vec<usize> = (0..d.labels.len()).collect();
    order.sort_by(|&a, &b| d.contributions[b][position].abs().total_cmp(&d.contributions[a][position].abs()));
    let top: Vec<String> = order.iter().take(6).map(|&i| format!("{} {:+.4}", d.labels[i], d.contributions[i][position])).collect();
    println!("{target_label} at position {position}: {:.4} = components + bias {:.4} (largest gap {:.1e})", d.logits[position], d.bias[position], d.max_error);
    println!("largest components: {}", top.join(", "));
    println!("wrote {}", out.join("index.html").display());
    Ok(())
}

pub fn graph(args: &ModelArgs, input: &Input, g: &crate::GraphArgs, out: &Path, common: &Common) -> Result<()> {
    use burnlens_trace::{AttributeOptions, GraphText, LogitTargets};
    burnlens_trace::check_thresholds(g.node_threshold, g.edge_threshold)?;
    let (m, dir) = load_model_args(args, common)?;
    let (mut ids, _) = ids_and_labels(&m, &dir, input, "")?;
    if let (Some(_), Some(bos)) = (&input.text, m.bos) {
        if ids.first() != Some(&bos) {
            ids.insert(0, bos);
        }
    }
    let set = crate::progress::transcoders(&g.transcoders, &m.model.device())?;
    let targets = match &g.targets {
        Some(list) => LogitTargets::Tokens(list.split(',').map(|t| parse_token(&m, "--targets", t)).collect::<Result<_>>()?),
        None => LogitTargets::Salient { max_n_logits: g.max_n_logits, desired_prob: g.desired_logit_prob },
    };
    let (pattern_budget, row_budget) = ((g.pattern_memory_gb.max(0.0) * 1e9) as u64, (g.rows_memory_gb.max(0.0) * 1e9) as u64);
    let opts = AttributeOptions { targets, batch_size: g.batch_size, max_feature_nodes: g.max_feature_nodes, pattern_budget, row_budget, ..AttributeOptions::default() };
    let t0 = std::time::Instant::now();
    let graph = burnlens_trace::attribute(&m.model, &set, &ids, &opts)?;
    let seconds = t0.elapsed().as_secs_f64();
    let prompt = match &m.tokenizer {
        Some(t) => t.decode(&ids.iter().map(|&i| i as u32).collect::<Vec<_>>()),
        None => ids.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(","),
    };
    let slug = out.file_name().map_or("graph".into(), |n| n.to_string_lossy().into_owned());
    let text = GraphText { slug, prompt, prompt_tokens: labels(&m, &ids), logit_tokens: labels(&m, &graph.logit_token_ids) };
    let files = burnlens_trace::write_graph(out, &graph, &text, g.node_threshold, g.edge_threshold)?;
    println!(
        "{} tokens, {} active features ({} with rows), {} logit targets (p = {:.3}), {} nodes; attributed in {seconds:.2} s",
        ids.len(),
        graph.active_features.len(),
        graph.selected_features.len(),
        graph.logit_token_ids.len(),
        graph.logit_probabilities.iter().sum::<f32>(),
        graph.n_nodes()
    );
    println!("pruned to {} nodes and {} edges; replacement score {:.4}, completeness {:.4}", files.kept_nodes, files.kept_edges, files.replacement_score, files.completeness_score);
    println!("wrote {}, {} and {}", files.safetensors.display(), files.json.display(), files.html.display());
    Ok(())
}

pub fn lens(args: &ModelArgs, input: &Input, target: Option<&str>, top: usize, out: &Path, common: &Common) -> Result<()> {
    let (m, dir) = load_model_args(args, common)?;
    let (ids, tokens) = ids_and_labels(&m, &dir, input, "")?;
    let target = target.map(|t| parse_token(&m, "--target", t)).transpose()?;
    let l = burnlens_lens::logit_lens(&m.model, &ids, top.max(1), target);
    let top_tokens: Vec<Vec<Vec<String>>> = l.top.iter().map(|layer| layer.iter().map(|pos| pos.iter().map(|(id, _)| labels(&m, &[*id])[0].clone()).collect()).collect()).collect();
    let report = burnlens_lens::tool_reports::LensReport { ids, tokens, top_tokens, lens: l };
    burnlens_lens::tool_reports::write_lens(out, &report, &format!("burnlens logit lens on {}", dir.display())).map_err(report_err(out))?;
    let p = report.ids.len() - 1;
    println!("logit lens at the last position ({:?}):", report.tokens[p]);
    for (li, name) in report.lens.layers.iter().enumerate() {
        let lp = report.lens.target_logprob[li][p].map_or(String::new(), |v| format!(", target log p {v:.3}"));
        println!("  {name:<14} top {:?} ({:.3}){lp}", report.top_tokens[li][p][0], report.lens.top[li][p][0].1);
    }
    println!("wrote {}", out.join("index.html").display());
    Ok(())
}

pub fn sae(args: &ModelArgs, sae_dir: &Path, input: &Input, top: usize, out: &Path, common: &Common) -> Result<()> {
    let (m, dir) = load_model_args(args, common)?;
    let (ids, tokens) = ids_and_labels(&m, &dir, input, "")?;
    let sae_dir = &crate::progress::folder(sae_dir, burnlens_lens::sae::folder_files(&sae_dir.to_string_lossy()))?;
    let sae = burnlens_lens::Sae::load(sae_dir, &m.model.device())?;
    let run = burnlens_lens::run_sae(&m.model, &sae, &ids, top)?;
    let d_sae = sae.cfg.d_sae;
    let report = burnlens_lens::tool_reports::SaeReport { ids, tokens, sae: sae.cfg.clone(), run };
    burnlens_lens::tool_reports::write_sae(out, &report, &format!("burnlens SAE {} on {}", sae_dir.display(), dir.display())).map_err(report_err(out))?;
    let r = &report.run;
    println!("SAE on {} ({:?}, d_sae {}): mean L0 {:.2}, MSE {:.5}, explained variance {:.4}", r.hook_name, sae.cfg.architecture, d_sae, r.mean_l0, r.mse, r.explained_variance);
    if let (Some(c), Some(w), Some(z)) = (r.loss_clean, r.loss_with_sae, r.loss_zero_ablated) {
        println!("loss {c:.4}, with the SAE spliced in {w:.4}, hook zero-ablated {z:.4} (recovered {})", r.loss_recovered.map_or("n/a".into(), |v| format!("{v:.3}")));
    }
    println!("wrote {}", out.join("index.html").display());
    Ok(())
}

pub fn induction(dir: &Path, len: usize, batch: usize, seed: u64, bos: Option<i64>, out: &Path, common: &Common) -> Result<()> {
    let m = load_any(dir, common)?;
    let bos = bos.or(m.bos);
    let needed = 2 * len + usize::from(bos.is_some());
    if len < 2 {
        return Err(UserError(format!("--len must be at least 2, found {len}")).into());
    }
    if needed > m.model.config.n_ctx {
        return Err(UserError(format!("--len {len}: the sequence [BOS] + r + r has {needed} tokens, more than the model's context of {}", m.model.config.n_ctx)).into());
    }
    if batch == 0 {
        return Err(UserError("--batch must be at least 1".into()).into());
    }
    if let Some(b) = bos {
        m.model.check_ids(&[b]).context("--bos")?;
    }
    let r = burnlens_lens::report::induction_report(out, &m.model, len, batch, seed, bos)
        .map_err(|e| UserError(format!("{}: cannot write the report: {e}", out.display())))?;
    println!("mean log-probability: first half {:.3}, second half {:.3}", r.mean_logprob_first_half, r.mean_logprob_second_half);
    let mut best: Vec<(f64, usize, usize)> = r.induction_scores.iter().enumerate().flat_map(|(l, row)| row.iter().enumerate().map(move |(h, &v)| (v, l, h))).collect();
    best.sort_by(|a, b| b.0.total_cmp(&a.0));
    let shown: Vec<String> = best.iter().take(5).map(|(v, l, h)| format!("L{l}H{h} {v:.3}")).collect();
    println!("top induction heads: {}", shown.join(", "));
    println!("wrote {}", out.join("index.html").display());
    Ok(())
}

pub fn backends() -> Result<()> {
    for r in backend::probe_all() {
        let status = match (&r.compiled, &r.probe) {
            (false, Err(why)) => format!("absent   {why}"),
            (true, Ok(dev)) => format!("works    {dev}"),
            (true, Err(why)) => format!("compiled but unusable here: {why}"),
            (false, Ok(_)) => unreachable!("a backend that is not compiled cannot run"),
        };
        println!("{:<8} {status}", r.name);
    }
    println!("default: {} (set with --backend, [backend] in a run config, or BURNLENS_BACKEND)", backend::DEFAULT_BACKEND);
    Ok(())
}

/// `burnlens train-sae` options.
pub struct SaeTrainArgs {
    pub hook: String,
    pub d_sae: Option<usize>,
    pub architecture: String,
    pub k: usize,
    pub l1: f64,
    pub lr: f64,
    pub steps: usize,
    pub batch: usize,
    pub seq_len: usize,
    pub data: String,
    pub seed: u64,
}

pub fn train_sae(args: &ModelArgs, a: &SaeTrainArgs, out: &Path, common: &Common) -> Result<()> {
    use burnlens_lens::sae::Architecture;
    use burnlens_lens::sae_train::{SaeTrainConfig, TokenSource, train_sae};
    let (m, dir) = load_model_args(args, common)?;
    let vocab = m.model.config.vocab_size;
    let source = match a.data.as_str() {
        "random" => TokenSource::Random { vocab },
        "repeated" => TokenSource::Repeated { vocab },
        path => {
            let tok = m.tokenizer.as_ref().ok_or_else(|| UserError(format!("--data {path}: {} has no tokenizer to read text with; use --data random or repeated", dir.display())))?;
            let text = std::fs::read_to_string(path).map_err(|e| UserError(format!("--data {path}: {e} (expected random, repeated or a text file)")))?;
            TokenSource::Text(tok.encode(&text)?.into_iter().map(i64::from).collect())
        }
    };
    let architecture = match a.architecture.as_str() {
        "standard" => Architecture::Standard,
        "topk" => Architecture::TopK { k: a.k, rescale_acts_by_decoder_norm: false },
        other => return Err(UserError(format!("--architecture {other:?}: expected standard or topk")).into()),
    };
    let d_sae = a.d_sae.unwrap_or(4 * m.model.config.d_model);
    if let Architecture::TopK { k, .. } = architecture
        && (k == 0 || k > d_sae)
    {
        return Err(UserError(format!("--k {k}: must be between 1 and d_sae = {d_sae}")).into());
    }
    let cfg = SaeTrainConfig { hook_name: a.hook.clone(), d_sae, architecture, l1_coefficient: a.l1, learning_rate: a.lr, steps: a.steps, batch: a.batch, seq_len: a.seq_len, seed: a.seed };
    let (mut sae, report) = train_sae(&m.model, &source, &cfg)?;
    sae.cfg.model_name = Some(dir.display().to_string());
    sae.save(out)?;
    write_atomic(&out.join("training.json"), serde_json::to_string_pretty(&report)?.as_bytes())?;
    let (first, last) = (report.curve.first().expect("a step"), report.curve.last().expect("a step"));
    println!("trained {:?} SAE on {} ({} features) over {} activations: loss {:.4} -> {:.4}", architecture, a.hook, d_sae, report.tokens, first.1, last.1);
    println!("held out: explained variance {:.4}, mean L0 {:.2}, MSE {:.5}, dead features {}", report.explained_variance, report.mean_l0, report.mse, report.dead_features);
    println!("wrote {} (SAELens layout) and training.json", out.display());
    Ok(())
}
