//! A whole dashboard job, as the CLI and Python run it: the run (resumable, its checkpoint in
//! the output folder, keyed by everything asked for), then every output
//! written, and a summary.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use burnlens_data::{CorpusOptions, ForModel};
use burnlens_model::Transformer;
use burnlens_model::checkpoints::Checkpoints;
use serde::Serialize;

use crate::checkpoint::RunKey;
use crate::error::DashboardError;
use crate::options::DashboardOptions;
use crate::run::{Progress, Resume, RunSpec, run};
use crate::source::FeatureSource;
use crate::write::{RunInfo, write_all};

/// Everything a job reads.
pub struct Job<'a> {
    pub source: FeatureSource<'a>,
    /// Where the model and the encoder came from (for the files and the fingerprint).
    pub model_id: String,
    pub encoder_id: String,
    /// The layer Neuronpedia files an SAE under.
    pub layer: usize,
    /// The model's tokenizer, BOS and vocabulary, which the corpus is cut for.
    pub for_model: ForModel<'a>,
    pub corpus: CorpusOptions,
    pub options: DashboardOptions,
    pub out: PathBuf,
    /// The processes sharing the passes (this one alone unless set); rank 0 writes.
    pub ranks: burnlens_dist::Ranks,
}

/// What a job did.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub features: usize,
    pub tokens: u64,
    pub ran_out: bool,
    pub seconds: Seconds,
    pub state_bytes: usize,
    /// (pass, windows read in it) where a resumed job started.
    pub resumed: Option<(usize, u64)>,
    pub index: PathBuf,
}

#[derive(Debug, Clone, Serialize)]
pub struct Seconds {
    pub first_pass: f64,
    pub second_pass: f64,
    pub logits: f64,
    pub writing: f64,
}

/// The features a job explains: an SAE's, or every layer's of a transcoder set; `id` names
/// it in the files (its folder, or the set's scan).
pub enum Explained<'s> {
    Sae { sae: &'s burnlens_lens::sae::Sae, id: String },
    Transcoders { set: burnlens_trace::TranscoderSet, id: String },
}

/// The model a job reads: its weights, what its corpus is cut for, and where it came from.
pub struct JobModel<'a> {
    pub model: &'a Transformer,
    pub for_model: ForModel<'a>,
    pub id: String,
}

impl<'a> Job<'a> {
    /// A job on a loaded model (`options.features` picks the features).
    pub fn new(m: JobModel<'a>, explained: Explained, corpus: CorpusOptions, options: DashboardOptions, out: PathBuf) -> Result<Self, DashboardError> {
        let features = options.feature_ids()?;
        let (source, encoder_id, layer) = match explained {
            Explained::Sae { sae, id } => (FeatureSource::new(m.model, sae, features)?, id, sae.hook_point().layer().unwrap_or(0)),
            Explained::Transcoders { set, id } => (FeatureSource::transcoders(m.model, set, features)?, id, 0),
        };
        Ok(Job { source, model_id: m.id, encoder_id, layer, for_model: m.for_model, corpus, options, out, ranks: burnlens_dist::Ranks::single() })
    }
}

/// Where a job writing into `out` keeps its checkpoints.
pub fn checkpoints(out: &Path) -> Checkpoints {
    Checkpoints::of_run(out)
}

/// Runs `job`; `control` hears the progress and may stop it (its state saved:
/// [`DashboardError::Interrupted`]).
pub fn make(job: &Job, control: &mut dyn FnMut(&Progress) -> ControlFlow<()>) -> Result<Summary, DashboardError> {
    let (o, c) = (&job.options, &job.corpus);
    let cfg = o.config(c.seq_len, job.for_model.bos)?;
    let ranks = &job.ranks;
    let spill_name = if ranks.size() > 1 { format!("inputs.rank-{}.spill", ranks.rank()) } else { "inputs.spill".into() };
    let spill = (o.spill_gb > 0.0).then(|| (job.out.join(spill_name), (o.spill_gb * 1e9) as u64));
    let spec = RunSpec { cfg: cfg.clone(), tokens: o.tokens, batch_windows: o.batch, spill, ranks: ranks.clone(), place: None };
    let key = RunKey {
        model: job.model_id.clone(),
        encoder: job.encoder_id.clone(),
        corpus: c.clone(),
        seed: o.seed,
        tokens: o.tokens,
        features: o.features.clone(),
        batch: o.batch,
        config: cfg.clone(),
    };
    let resume = Resume { out: job.out.clone(), key, every: Duration::from_secs_f64(o.checkpoint_every.max(0.0)) };
    std::fs::create_dir_all(&job.out).map_err(|e| DashboardError::io(&job.out, e))?;
    let hub = burnlens_hf::Hub::from_env();
    let mut windows = || Ok(c.windows(job.for_model, o.seed, &hub)?);
    // Over several ranks a job runs through (no checkpoint: each rank's would have to match).
    let resumable = (ranks.size() == 1).then_some(&resume);
    let out = run(&job.source, &spec, resumable, &mut windows, control)?;
    if out.stopped {
        return Err(DashboardError::Interrupted(checkpoints(&job.out).latest()?.unwrap_or_else(|| checkpoints(&job.out).latest_file())));
    }
    let tok = |t: u32| match job.for_model.tokenizer {
        Some(k) => k.decode(&[t]),
        None => format!("#{t}"),
    };
    let seconds = Seconds { first_pass: out.seconds[0], second_pass: out.seconds[1], logits: out.seconds[2], writing: 0.0 };
    let extra = serde_json::json!({ "seconds": seconds, "state_bytes": out.state_bytes, "ran_out": out.ran_out });
    let info = RunInfo { model_id: &job.model_id, layer: job.layer, sae_set: &job.encoder_id, dataset: &c.data, tokens: out.tokens, seq_len: c.seq_len, extra };
    let writing = Instant::now();
    let index = if ranks.is_writer() { write_all(&job.out, &out.dashboards, &cfg, &info, &tok)? } else { job.out.join("html/index.html") };
    Ok(Summary {
        features: out.dashboards.len(),
        tokens: out.tokens,
        ran_out: out.ran_out,
        seconds: Seconds { writing: writing.elapsed().as_secs_f64(), ..seconds },
        state_bytes: out.state_bytes,
        resumed: out.resumed,
        index,
    })
}
