//! The subcommands: each parses its inputs, loads what it needs through the libraries and
//! writes or prints the result.

use std::path::Path;

use anyhow::{Context, Result};
use burn::tensor::Device;
use burnlens_hf::{LoadOptions, LoadedModel, Tokenizer, load_model_with};
use burnlens_model::backend;
use burnlens_model::{HookPoint, Hooks, Transformer, next_token_loss};
use burnlens_train::{AnyModel, TokenError};
use serde_json::json;

use crate::output::{Saved, write_atomic, write_safetensors};
use crate::{Common, Input, ModelArgs, UserError};

pub fn device_of(common: &Common) -> Result<Device> {
    device(common)
}

fn device(common: &Common) -> Result<Device> {
    if let Some(c) = common.compute {
        burnlens_model::kernels::set_compute(c);
    }
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
pub(crate) fn parse_ids(text: &str, model: &Transformer, flag: &str) -> Result<Vec<i64>> {
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
    let loaded = load(dir, common)?;
    for (label, text) in burnlens_hf::describe::describe(&loaded) {
        println!("{:<13}{text}", format!("{label}:"));
    }
    Ok(())
}

pub fn logits(args: &ModelArgs, input: &Input, out: Option<&Path>, common: &Common) -> Result<()> {
    let m = load_model_args(args, common)?;
    let (ids, tokens) = ids_and_labels(&m, input, "")?;
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

/// The hook points `--names` selects ([`burnlens_lens::HookSelection`]'s grammar over names).
fn hook_filter(spec: &str, all: &[String]) -> Result<Box<dyn Fn(HookPoint) -> bool>> {
    let selection = burnlens_lens::HookSelection::parse(spec, all).map_err(|why| UserError(format!("--names: {why}")))?;
    Ok(Box::new(HookPoint::by_name(move |n| selection.matches(n))))
}

pub fn cache(args: &ModelArgs, input: &Input, names: &str, grad: Option<&str>, out: &Path, common: &Common) -> Result<()> {
    if out.extension().and_then(|e| e.to_str()) != Some("safetensors") {
        return Err(UserError(format!("--out {}: expected a .safetensors file name", out.display())).into());
    }
    let m = load_model_args(args, common)?;
    let (ids, tokens) = ids_and_labels(&m, input, "")?;
    let model = &m.model;
    let all = burnlens_model::hook_names(&model.config);
    let filter = hook_filter(names, &all)?;
    let (cache, grads, metric) = match grad {
        None => {
            let mut hooks = Hooks::capture(filter);
            model.forward_hooked(model.ids_tensor(&ids), &mut hooks);
            (burnlens_model::named(hooks.take_cache()), Default::default(), None)
        }
        Some(spec) => {
            let metric = parse_metric(&m, spec, ids.len())?;
            let g = burnlens_lens::hook_gradients(model, &ids, &filter, &metric)?;
            (burnlens_model::named(g.activations), burnlens_model::named(g.gradients), Some((metric, g.metric)))
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

/// A rank lost or diverged: say so on this rank, then end every rank of the job.
pub fn end_job(ranks: &burnlens_dist::Ranks, e: &dyn std::fmt::Display) -> ! {
    // One write, so that the ranks' lines arrive whole through the launcher.
    let _ = std::io::Write::write_all(&mut std::io::stderr(), format!("error: {e}\n").as_bytes());
    // The other surviving ranks report too before the job ends.
    std::thread::sleep(std::time::Duration::from_secs(1));
    ranks.abort(1)
}

/// [`burnlens_train::load_any`] on the chosen device, its warnings printed.
pub(crate) fn load_any(dir: &Path, common: &Common) -> Result<AnyModel> {
    let m = burnlens_train::load_any(dir, &device(common)?, &LoadOptions::dtype(common.dtype))?;
    for w in &m.warnings {
        eprintln!("warning: {w}");
    }
    Ok(m)
}

/// `burnlens download ID`: fetch into the Hugging Face cache and say where it is.
pub fn download(id: &str) -> Result<()> {
    let hub_id = burnlens_hf::HubId::parse(id).ok_or_else(|| UserError(format!("\"{id}\" is not a Hugging Face Hub id (org/name or org/name@revision)")))?;
    let dir = crate::progress::hub_snapshot(&hub_id)?;
    let hf = burnlens_hf::read_config(&dir.join("config.json"))?;
    println!("{hub_id}: {} model in {}", hf.family, dir.display());
    Ok(())
}

pub fn fetch(name: &str, out: Option<&Path>) -> Result<()> {
    let default = Path::new("data").join(format!("{name}.txt"));
    let out = out.unwrap_or(&default);
    let bytes = burnlens_train::corpus::fetch(name, out)?;
    println!("wrote {} ({bytes} bytes, sha256 {})", out.display(), burnlens_train::corpus::corpus(name)?.sha256);
    Ok(())
}

/// Token ids from `--{prefix}text` (through the model's tokenizer) or `--{prefix}ids`, with a
/// label per token.
fn ids_and_labels(m: &AnyModel, input: &Input, prefix: &str) -> Result<(Vec<i64>, Vec<String>)> {
    let ids: Vec<i64> = match (&input.text, &input.ids) {
        (Some(t), _) => m.encode(t, false).map_err(|e| token_err(&format!("--{prefix}text"), &format!("pass token ids with --{prefix}ids"), e))?,
        (None, Some(s)) => parse_ids(s, &m.model, &format!("--{prefix}ids"))?,
        (None, None) => return Err(UserError(format!("give --{prefix}text TEXT or --{prefix}ids 1,2,3")).into()),
    };
    let labels = m.labels(&ids);
    Ok((ids, labels))
}

/// A token given on the command line: an id, or a text that encodes to exactly one token.
fn parse_token(m: &AnyModel, flag: &str, s: &str) -> Result<i64> {
    m.single_token(s).map_err(|e| token_err(flag, "give a token id", e))
}

/// A refused text or token as the CLI says it: the flag first, and for a model without a
/// tokenizer, `hint` (what to pass instead).
pub(crate) fn token_err(flag: &str, hint: &str, e: TokenError) -> anyhow::Error {
    match e {
        TokenError::NoTokenizer { .. } => UserError(format!("{flag}: {e}; {hint}")),
        e => UserError(format!("{flag}: {e}")),
    }
    .into()
}

/// Load `--model` (a directory, Hub id or run), processing its weights if asked.
pub(crate) fn load_model_args(args: &ModelArgs, common: &Common) -> Result<AnyModel> {
    let dir = crate::progress::model_dir(&args.model)?;
    let mut m = load_any(&dir, common)?;
    if args.process_weights {
        let (opts, dropped) = burnlens_lens::ProcessOptions::all().allowed_for(&m.model.config);
        for why in dropped {
            eprintln!("warning: --process-weights: {why}");
        }
        m.model = burnlens_lens::process_weights(&m.model, opts)?;
    }
    Ok(m)
}

fn report_err(out: &Path) -> impl FnOnce(std::io::Error) -> anyhow::Error + '_ {
    move |e| UserError(format!("{}: cannot write the report: {e}", out.display())).into()
}

pub fn analyze(args: &ModelArgs, input: &Input, out: &Path, common: &Common) -> Result<()> {
    let m = load_model_args(args, common)?;
    let (ids, labels) = ids_and_labels(&m, input, "")?;
    let a = burnlens_lens::report::analyze(&m.model, &ids, labels);
    burnlens_lens::report::write_analysis(out, &a, &format!("burnlens analysis of {}", m.dir.display())).map_err(report_err(out))?;
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
pub fn patch(
    args: &ModelArgs,
    clean: &Input,
    corrupted: &Input,
    metric: &str,
    nodes: &str,
    exact: bool,
    denoise: bool,
    out: &Path,
    common: &Common,
) -> Result<()> {
    let m = load_model_args(args, common)?;
    let (clean_ids, clean_tokens) = ids_and_labels(&m, clean, "")?;
    let (corrupted_ids, corrupted_tokens) = ids_and_labels(&m, corrupted, "corrupted-")?;
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
    let report = burnlens_lens::tool_reports::PatchingReport {
        clean_ids,
        clean_tokens,
        corrupted_ids,
        corrupted_tokens,
        direction,
        n_layers: c.n_layers(),
        n_heads: c.n_heads,
        result,
    };
    burnlens_lens::tool_reports::write_patching(out, &report, &format!("burnlens patching on {}", m.dir.display())).map_err(report_err(out))?;
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
    let m = load_model_args(args, common)?;
    let (ids, tokens) = ids_and_labels(&m, input, "")?;
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
    let report =
        burnlens_lens::tool_reports::AttributionReport { ids, tokens, target: target_label.clone(), position, n_layers: c.n_layers(), n_heads: c.n_heads, dla };
    burnlens_lens::tool_reports::write_attribution(out, &report, &format!("burnlens direct logit attribution on {}", m.dir.display()))
        .map_err(report_err(out))?;
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
    let m = load_model_args(args, common)?;
    let (mut ids, _) = ids_and_labels(&m, input, "")?;
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
    let opts = AttributeOptions {
        targets,
        batch_size: g.batch_size,
        max_feature_nodes: g.max_feature_nodes,
        pattern_budget,
        row_budget,
        ..AttributeOptions::default()
    };
    let t0 = std::time::Instant::now();
    let graph = burnlens_trace::attribute(&m.model, &set, &ids, &opts)?;
    let seconds = t0.elapsed().as_secs_f64();
    let prompt = match &m.tokenizer {
        Some(t) => t.decode(&ids.iter().map(|&i| i as u32).collect::<Vec<_>>()),
        None => ids.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(","),
    };
    let slug = out.file_name().map_or("graph".into(), |n| n.to_string_lossy().into_owned());
    let text = GraphText { slug, prompt, prompt_tokens: m.labels(&ids), logit_tokens: m.labels(&graph.logit_token_ids) };
    let dashboards = g.features.as_deref().map(|dir| burnlens_dashboards::read_config(dir).map(|cfg| (dir, cfg))).transpose()?;
    let (mut with, mut feature_nodes) = (0usize, 0usize);
    let mut failed = None;
    let tok = |t: u32| m.labels(&[t as i64]).remove(0);
    let mut annotate = |n: &mut burnlens_trace::Node| {
        let (Some((dir, cfg)), Some((layer, index))) = (&dashboards, n.transcoder_feature()) else { return };
        feature_nodes += 1;
        match burnlens_dashboards::read_feature(dir, burnlens_dashboards::FeatureKey { layer: Some(layer), index }) {
            Ok(Some(d)) => {
                let (label, dashboard) = burnlens_dashboards::node_fields(&d, cfg, &tok);
                (n.clerp, n.dashboard) = (label, Some(dashboard));
                with += 1;
            }
            Ok(None) => {}
            Err(e) => failed = Some(e),
        }
    };
    let files = burnlens_trace::write_graph_with(out, &graph, &text, g.node_threshold, g.edge_threshold, &mut annotate)?;
    if let Some(e) = failed {
        return Err(e.into());
    }
    if let Some((dir, _)) = &dashboards {
        println!("{with} of {feature_nodes} feature nodes have dashboards in {}", dir.display());
    }
    println!(
        "{} tokens, {} active features ({} with rows), {} logit targets (p = {:.3}), {} nodes; attributed in {seconds:.2} s",
        ids.len(),
        graph.active_features.len(),
        graph.selected_features.len(),
        graph.logit_token_ids.len(),
        graph.logit_probabilities.iter().sum::<f32>(),
        graph.n_nodes()
    );
    println!(
        "pruned to {} nodes and {} edges; replacement score {:.4}, completeness {:.4}",
        files.kept_nodes, files.kept_edges, files.replacement_score, files.completeness_score
    );
    println!("wrote {}, {} and {}", files.safetensors.display(), files.json.display(), files.html.display());
    Ok(())
}

pub fn lens(args: &ModelArgs, input: &Input, target: Option<&str>, top: usize, out: &Path, common: &Common) -> Result<()> {
    let m = load_model_args(args, common)?;
    let (ids, tokens) = ids_and_labels(&m, input, "")?;
    let target = target.map(|t| parse_token(&m, "--target", t)).transpose()?;
    let l = burnlens_lens::logit_lens(&m.model, &ids, top.max(1), target);
    let top_tokens: Vec<Vec<Vec<String>>> =
        l.top.iter().map(|layer| layer.iter().map(|pos| pos.iter().map(|(id, _)| m.labels(&[*id])[0].clone()).collect()).collect()).collect();
    let report = burnlens_lens::tool_reports::LensReport { ids, tokens, top_tokens, lens: l };
    burnlens_lens::tool_reports::write_lens(out, &report, &format!("burnlens logit lens on {}", m.dir.display())).map_err(report_err(out))?;
    let p = report.ids.len() - 1;
    println!("logit lens at the last position ({:?}):", report.tokens[p]);
    for (li, name) in report.lens.layers.iter().enumerate() {
        let lp = report.lens.target_logprob[li][p].map_or(String::new(), |v| format!(", target log p {v:.3}"));
        println!("  {name:<14} top {:?} ({:.3}){lp}", report.top_tokens[li][p][0], report.lens.top[li][p][0].1);
    }
    println!("wrote {}", out.join("index.html").display());
    Ok(())
}

/// An SAE by folder or Hub release `org/name[@revision]:folder` (only its files fetched),
/// and where it was read from.
pub(crate) fn load_sae(spec: &str, device: &Device) -> Result<(std::path::PathBuf, burnlens_lens::Sae)> {
    let dir = crate::progress::folder(Path::new(spec), burnlens_lens::sae::folder_files(spec))?;
    let sae = burnlens_lens::Sae::load(&dir, device)?;
    Ok((dir, sae))
}

pub fn sae(args: &ModelArgs, sae_dir: &Path, input: &Input, top: usize, out: &Path, common: &Common) -> Result<()> {
    let m = load_model_args(args, common)?;
    let (ids, tokens) = ids_and_labels(&m, input, "")?;
    let (sae_dir, sae) = load_sae(&sae_dir.to_string_lossy(), &m.model.device())?;
    let sae_dir = &sae_dir;
    let run = burnlens_lens::run_sae(&m.model, &sae, &ids, top)?;
    let d_sae = sae.cfg.d_sae;
    let report = burnlens_lens::tool_reports::SaeReport { ids, tokens, sae: sae.cfg.clone(), run };
    burnlens_lens::tool_reports::write_sae(out, &report, &format!("burnlens SAE {} on {}", sae_dir.display(), m.dir.display())).map_err(report_err(out))?;
    let r = &report.run;
    println!(
        "SAE on {} ({:?}, d_sae {}): mean L0 {:.2}, MSE {:.5}, explained variance {:.4}",
        r.hook_name, sae.cfg.architecture, d_sae, r.mean_l0, r.mse, r.explained_variance
    );
    if let (Some(c), Some(w), Some(z)) = (r.loss_clean, r.loss_with_sae, r.loss_zero_ablated) {
        println!(
            "loss {c:.4}, with the SAE spliced in {w:.4}, hook zero-ablated {z:.4} (recovered {})",
            r.loss_recovered.map_or("n/a".into(), |v| format!("{v:.3}"))
        );
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
        return Err(UserError(format!(
            "--len {len}: the sequence [BOS] + r + r has {needed} tokens, more than the model's context of {}",
            m.model.config.n_ctx
        ))
        .into());
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
    let mut best: Vec<(f64, usize, usize)> =
        r.induction_scores.iter().enumerate().flat_map(|(l, row)| row.iter().enumerate().map(move |(h, &v)| (v, l, h))).collect();
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
