//! `burnlens dashboards`: SAEDashboard's feature dashboards for an SAE's or a transcoder
//! set's features over a corpus (`dashboards::make`), resumable, written as an offline HTML
//! browser, Neuronpedia's batch JSON, circuit-tracer's feature files and burnlens's own JSON.

use std::io::IsTerminal;
use std::ops::ControlFlow;
use std::path::PathBuf;

use anyhow::Result;
use burnlens_dashboards::{DashboardOptions, Explained, Job};
use burnlens_data::CorpusOptions;
use burnlens_dist::DistError;

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
    pub options: DashboardOptions,
    #[command(flatten)]
    pub corpus: CorpusOptions,
    /// Output folder (and its checkpoint: the same command resumes).
    #[arg(long)]
    pub out: PathBuf,
    #[command(flatten)]
    pub common: Common,
}

pub fn run(a: &DashboardsArgs) -> Result<()> {
    let m = crate::commands::load_model_args(&a.model, &a.common)?;
    let sae;
    let explained = match (&a.sae, &a.transcoders) {
        (Some(spec), _) => {
            let (dir, loaded) = crate::commands::load_sae(spec, &m.model.device())?;
            sae = loaded;
            Explained::Sae { sae: &sae, id: dir.display().to_string() }
        }
        (None, Some(spec)) => {
            let set = crate::progress::transcoders(spec, &m.model.device())?;
            let id = set.scan.clone().unwrap_or_else(|| spec.clone());
            Explained::Transcoders { set, id }
        }
        (None, None) => return Err(UserError("give --sae or --transcoders".into()).into()),
    };
    let model = burnlens_dashboards::JobModel { model: &m.model, for_model: m.corpus_model(), id: m.dir.display().to_string() };
    let mut job = Job::new(model, explained, a.corpus.clone(), a.options.clone(), a.out.clone())?;
    // One of several ranks when an MPI launcher started this process: each scans its share
    // of the batches, rank 0 writes.
    job.ranks = burnlens_dist::Ranks::from_launcher()?;
    let ranks = job.ranks.clone();
    let tty = std::io::stderr().is_terminal() && ranks.is_writer();
    // Ctrl-C / SIGTERM: checkpoint, stop, exit 130; the same command resumes.
    burnlens_model::stop::install_interrupt_handler();
    let mut progress = |p: &burnlens_dashboards::Progress| {
        if tty {
            eprint!("\rpass {}/2  {}/{} tokens  {:.0} tokens/s  {:.0} s left   ", p.pass, p.tokens.min(p.of), p.of, p.tokens_per_s, p.seconds_left);
        }
        if burnlens_model::stop::stop_requested() { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
    };
    let s = burnlens_dashboards::make(&job, &mut progress);
    if tty {
        eprintln!();
    }
    let s = match s {
        Ok(s) => s,
        Err(burnlens_dashboards::DashboardError::Ranks(e @ (DistError::Unanswered { .. } | DistError::Diverged { .. }))) => {
            crate::commands::end_job(&ranks, &e)
        }
        Err(e) => return Err(e.into()),
    };
    if !ranks.is_writer() {
        return Ok(());
    }
    if let Some((pass, windows)) = s.resumed {
        println!("resumed in pass {pass} after {windows} windows from {}", burnlens_dashboards::job::checkpoints(&a.out).root().display());
    }
    if s.ran_out {
        println!("the dataset ran out after {} tokens of the {} asked for; the dashboards are over what was read", s.tokens, a.options.tokens);
    }
    let t = &s.seconds;
    println!(
        "{} features over {} tokens in {:.1} s (passes {:.1} + {:.1} s, {:.0} tokens/s each; logit effects {:.1} s); wrote {} in {:.1} s (open {}), neuronpedia/, circuit-tracer/ and features/",
        s.features,
        s.tokens,
        t.first_pass + t.second_pass + t.logits,
        t.first_pass,
        t.second_pass,
        s.tokens as f64 * 2.0 / (t.first_pass + t.second_pass).max(1e-9),
        t.logits,
        a.out.display(),
        t.writing,
        s.index.display()
    );
    Ok(())
}
