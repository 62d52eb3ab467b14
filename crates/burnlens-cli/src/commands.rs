//! What the commands share: the device, models, SAEs, token ids, metrics and tokens resolved
//! from their flags, with the errors the CLI gives for them; and the few commands without
//! arguments of their own (`download`, `data fetch`, `backends`). Every other command is a
//! file of its own: its arguments and its `run`.

use std::path::Path;

use anyhow::{Context, Result};
use burn::tensor::Device;
use burnlens_hf::{LoadOptions, LoadedModel, load_model_with};
use burnlens_model::Transformer;
use burnlens_model::backend;
use burnlens_train::{AnyModel, TokenError};

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

pub(crate) fn load(model: &Path, common: &Common) -> Result<LoadedModel> {
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

/// ` "text"` for a token id when the model has a tokenizer.
pub(crate) fn token_suffix(m: &AnyModel, id: i64) -> String {
    m.tokenizer.as_ref().map_or(String::new(), |t| format!(" {:?}", t.decode(&[id as u32])))
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
pub(crate) fn ids_and_labels(m: &AnyModel, input: &Input, prefix: &str) -> Result<(Vec<i64>, Vec<String>)> {
    let ids: Vec<i64> = match (&input.text, &input.ids) {
        (Some(t), _) => m.encode(t, false).map_err(|e| token_err(&format!("--{prefix}text"), &format!("pass token ids with --{prefix}ids"), e))?,
        (None, Some(s)) => parse_ids(s, &m.model, &format!("--{prefix}ids"))?,
        (None, None) => return Err(UserError(format!("give --{prefix}text TEXT or --{prefix}ids 1,2,3")).into()),
    };
    let labels = m.labels(&ids);
    Ok((ids, labels))
}

/// A token given on the command line: an id, or a text that encodes to exactly one token.
pub(crate) fn parse_token(m: &AnyModel, flag: &str, s: &str) -> Result<i64> {
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

pub(crate) fn report_err(out: &Path) -> impl FnOnce(std::io::Error) -> anyhow::Error + '_ {
    move |e| UserError(format!("{}: cannot write the report: {e}", out.display())).into()
}

/// Parse `--metric` with the library's grammar ([`burnlens_lens::Metric::parse`]); tokens may
/// be ids or text of one token.
pub(crate) fn parse_metric(m: &AnyModel, spec: &str, len: usize) -> Result<burnlens_lens::Metric> {
    use burnlens_lens::{Metric, MetricParseError};
    let metric = Metric::parse(spec, |t| parse_token(m, "--metric", t)).map_err(|e| match e {
        MetricParseError::Syntax(why) => UserError(format!("--metric {spec:?}: {why}; expected {}", Metric::GRAMMAR)).into(),
        MetricParseError::Token(e) => e,
    })?;
    metric.check(len, m.model.config.vocab_size).map_err(|e| UserError(format!("--metric {spec:?}: {e}")))?;
    Ok(metric)
}

/// An SAE by folder or Hub release `org/name[@revision]:folder` (only its files fetched),
/// and where it was read from.
pub(crate) fn load_sae(spec: &str, device: &Device) -> Result<(std::path::PathBuf, burnlens_lens::Sae)> {
    let dir = crate::progress::folder(Path::new(spec), burnlens_lens::sae::folder_files(spec))?;
    let sae = burnlens_lens::Sae::load(&dir, device)?;
    Ok((dir, sae))
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
    let fusion = if burnlens_model::gpu::FUSED { "on: Burn fuses element-wise chains on cuda and wgpu" } else { "off (build with --features fusion)" };
    println!("operation fusion: {fusion}");
    use burnlens_model::gpu::OneLaunch;
    let (on, out): (Vec<OneLaunch>, Vec<OneLaunch>) = OneLaunch::ALL.into_iter().partition(|k| k.runs());
    let names = |ks: &[OneLaunch]| ks.iter().map(|k| k.name()).collect::<Vec<_>>().join(", ");
    let left = if out.is_empty() { String::new() } else { format!("; left out by BURNLENS_GPU_ROW_KERNELS: {}", names(&out)) };
    println!("one-launch GPU kernels (cuda, wgpu): {}{left}", if on.is_empty() { "none, Burn's composed ops".to_string() } else { names(&on) });
    Ok(())
}
