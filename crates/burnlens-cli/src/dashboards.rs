//! `burnlens dashboards`: SAEDashboard's feature dashboards for an SAE's features over a
//! corpus, in two streamed passes, written as an offline HTML browser, Neuronpedia's batch
//! JSON, circuit-tracer's feature files and burnlens's own JSON per feature.

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::Result;
use std::ops::ControlFlow;

use burnlens_dashboards::{Context, DashboardConfig, FeatureSource, Resume, RunInfo, RunSpec};
use burnlens_data::CorpusOptions;
use serde_json::json;

use crate::{Common, ModelArgs, UserError};

/// `burnlens dashboards` options.
#[derive(clap::Args)]
pub struct DashboardsArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// An SAE in SAELens's layout (a folder with cfg.json), Gemma Scope's params.npz folder,
    /// or a Hub release org/name[@revision]:folder.
    #[arg(long, required_unless_present = "transcoders")]
    pub sae: Option<String>,
    /// Transcoders instead (every layer's features): a folder with circuit-tracer's
    /// config.yaml and layer files, a cross-layer transcoder, or a Hub repository
    /// org/name[@revision][:folder]. `--features` then picks indices within each layer.
    #[arg(long, conflicts_with = "sae")]
    pub transcoders: Option<String>,
    #[command(flatten)]
    pub corpus: CorpusOptions,
    /// Tokens read (whole windows; each pass reads them).
    #[arg(long, default_value_t = 100_000)]
    pub tokens: u64,
    /// Features: all, or ids and ranges such as 0-99,512.
    #[arg(long)]
    pub features: Option<String>,
    /// Examples in the top group.
    #[arg(long, default_value_t = 20)]
    pub top_k: usize,
    /// Quantile groups, and examples sampled in each.
    #[arg(long, default_value_t = 10)]
    pub quantiles: usize,
    #[arg(long, default_value_t = 5)]
    pub quantile_size: usize,
    /// Tokens shown before and after an example's token.
    #[arg(long, default_value_t = 5)]
    pub before: usize,
    #[arg(long, default_value_t = 5)]
    pub after: usize,
    /// Show each example's whole window (SAEDashboard's Neuronpedia runner) instead.
    #[arg(long)]
    pub whole_window: bool,
    /// Count activations on BOS too (by default they read zero, as SAEDashboard's Neuronpedia
    /// runner ignores BOS, EOS and padding).
    #[arg(long)]
    pub keep_bos: bool,
    /// Windows per model pass.
    #[arg(long, default_value_t = 16)]
    pub batch: usize,
    /// Seconds between checkpoints (OUT/checkpoint.cbor; the same command resumes from it).
    #[arg(long, default_value_t = 60.0)]
    pub checkpoint_every: f64,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Output folder.
    #[arg(long)]
    pub out: PathBuf,
    #[command(flatten)]
    pub common: Common,
}

/// `0-99,512` as ids.
pub fn parse_features(s: &str) -> Result<Vec<usize>, UserError> {
    let bad = |p: &str| UserError(format!("--features: `{p}` is not a feature id or a range such as 0-99"));
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.trim().parse().map_err(|_| bad(part))?, b.trim().parse().map_err(|_| bad(part))?);
                if b < a {
                    return Err(bad(part));
                }
                out.extend(a..=b);
            }
            None => out.push(part.parse().map_err(|_| bad(part))?),
        }
    }
    Ok(out)
}

pub fn run(a: &DashboardsArgs) -> Result<()> {
    let features = a.features.as_deref().map(parse_features).transpose()?;
    if a.batch == 0 || a.top_k == 0 || a.tokens == 0 {
        return Err(UserError("--batch, --top-k and --tokens must be positive".into()).into());
    }
    let m = crate::commands::load_model_args(&a.model, &a.common)?;
    let (source, sae_name, layer) = match (&a.sae, &a.transcoders) {
        (Some(spec), _) => {
            let (dir, sae) = crate::commands::load_sae(spec, &m.model.device())?;
            (FeatureSource::new(&m.model, &sae, features)?, dir.display().to_string(), sae.hook_point().layer().unwrap_or(0))
        }
        (None, Some(spec)) => {
            let set = crate::progress::transcoders(spec, &m.model.device())?;
            let name = set.scan.clone().unwrap_or_else(|| spec.clone());
            (FeatureSource::transcoders(&m.model, set, features)?, name, 0)
        }
        (None, None) => return Err(UserError("give --sae or --transcoders".into()).into()),
    };
    let context = if a.whole_window { Context::Window } else { Context::Around { before: a.before, after: a.after } };
    if let Context::Around { before, after } = context
        && before + after + 2 > a.corpus.seq_len
    {
        return Err(UserError(format!("--before {before} and --after {after} leave no room in windows of {} tokens (--seq-len)", a.corpus.seq_len)).into());
    }
    let cfg = DashboardConfig {
        top_k: a.top_k,
        n_quantiles: a.quantiles,
        quantile_size: a.quantile_size,
        context,
        ignore_tokens: if a.keep_bos { Vec::new() } else { m.bos.map(|b| b as u32).into_iter().collect() },
        seed: a.seed,
        ..DashboardConfig::default()
    };
    let spec = RunSpec { cfg: cfg.clone(), tokens: a.tokens, batch_windows: a.batch };
    let hub = burnlens_hf::Hub::from_env();
    let tty = std::io::stderr().is_terminal();
    let mut progress = |p: &burnlens_dashboards::Progress| {
        if tty {
            eprint!("\rpass {}/2  {}/{} tokens  {:.0} tokens/s  {:.0} s left   ", p.pass, p.tokens.min(p.of), p.of, p.tokens_per_s, p.seconds_left);
        }
        if burnlens_train::stop_requested() { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
    };
    // Ctrl-C / SIGTERM: checkpoint, stop, exit 130; the same command resumes.
    burnlens_train::install_interrupt_handler();
    let checkpoint = a.out.join("checkpoint.cbor");
    let fingerprint = format!(
        "model {} · {} · data {} (column {:?}, seq_len {}, bos {}) · seed {} · tokens {} · features {:?} · batch {} · {:?}",
        m.dir.display(),
        sae_name,
        a.corpus.data,
        a.corpus.column,
        a.corpus.seq_len,
        !a.corpus.no_prepend_bos,
        a.seed,
        a.tokens,
        a.features,
        a.batch,
        cfg
    );
    let resume = Resume { path: checkpoint.clone(), fingerprint, every: std::time::Duration::from_secs_f64(a.checkpoint_every.max(0.0)) };
    std::fs::create_dir_all(&a.out).map_err(|e| UserError(format!("{}: {e}", a.out.display())))?;
    let out = burnlens_dashboards::run(&source, &spec, Some(&resume), &mut || Ok(a.corpus.windows(m.corpus_model(), a.seed, &hub)?), &mut progress)?;
    if tty {
        eprintln!();
    }
    if let Some((pass, windows)) = out.resumed {
        println!("resumed in pass {pass} after {windows} windows from {}", checkpoint.display());
    }
    if out.stopped {
        return Err(burnlens_dashboards::DashboardError::Interrupted(checkpoint).into());
    }
    let tok = |t: u32| match &m.tokenizer {
        Some(k) => k.decode(&[t]),
        None => format!("#{t}"),
    };
    let model_id = m.dir.display().to_string();
    let extra = json!({ "seconds": { "first_pass": out.seconds[0], "second_pass": out.seconds[1], "logits": out.seconds[2] }, "state_bytes": out.state_bytes, "ran_out": out.ran_out });
    let info = RunInfo { model_id: &model_id, layer, sae_set: &sae_name, dataset: &a.corpus.data, tokens: out.tokens, seq_len: a.corpus.seq_len, extra };
    let writing = std::time::Instant::now();
    let index = burnlens_dashboards::write_all(&a.out, &out.dashboards, &cfg, &info, &tok)?;
    if out.ran_out {
        println!("the dataset ran out after {} tokens of the {} asked for; the dashboards are over what was read", out.tokens, a.tokens);
    }
    let secs = out.seconds.iter().sum::<f64>();
    println!(
        "{} features over {} tokens in {secs:.1} s (passes {:.1} + {:.1} s, {:.0} tokens/s each; logit effects {:.1} s); wrote {} in {:.1} s (open {}), neuronpedia/, circuit-tracer/ and features/",
        out.dashboards.len(),
        out.tokens,
        out.seconds[0],
        out.seconds[1],
        out.tokens as f64 * 2.0 / (out.seconds[0] + out.seconds[1]).max(1e-9),
        out.seconds[2],
        a.out.display(),
        writing.elapsed().as_secs_f64(),
        index.display()
    );
    Ok(())
}
