//! `burnlens train-sae`: train SAEs on a model's activations at one or more hook points (or a
//! transcoder per layer), streamed from a corpus (or synthetic windows) through the
//! activation store, in a resumable run directory; SAEs are written in SAELens's layout under
//! `OUT/sae`, transcoders in circuit-tracer's under `OUT/transcoders`.

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::Result;
use burnlens_features::{Architecture, JumpReluSettings, LrSchedule, LrScheduler, SaeRunConfig, Site, StoreConfig, TopKSettings, TrainerConfig};

use crate::corpus_args::CorpusArgs;
use crate::{Common, ModelArgs, UserError};

/// `burnlens train-sae` options (SAELens's names where it has them).
#[derive(clap::Args)]
pub struct TrainSaeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The hook point, e.g. blocks.1.hook_resid_pre; several, comma-separated, train one SAE
    /// each from the same model passes.
    #[arg(long, required_unless_present = "transcoders")]
    pub hook: Option<String>,
    /// Train a transcoder per layer instead, from `blocks.{l}.<transcoder-input>` to
    /// `blocks.{l}.<transcoder-output>`, written as a circuit-tracer transcoder set.
    #[arg(long, conflicts_with = "hook")]
    pub transcoders: bool,
    #[arg(long, default_value = "ln2.hook_normalized")]
    pub transcoder_input: String,
    #[arg(long, default_value = "hook_mlp_out")]
    pub transcoder_output: String,
    /// Transcoders with a skip connection (W_skip).
    #[arg(long)]
    pub skip: bool,
    /// Number of features (default: 4 x d_model).
    #[arg(long)]
    pub d_sae: Option<usize>,
    /// standard (ReLU, L1 weighted by decoder norms), topk, batchtopk or jumprelu.
    #[arg(long, default_value = "standard")]
    pub architecture: String,
    /// Active features per token (topk), or per token on average over the batch (batchtopk).
    #[arg(long, default_value_t = 32.0)]
    pub k: f64,
    /// The sparsity coefficient: L1 for standard, L0 for jumprelu.
    #[arg(long, default_value_t = 0.1)]
    pub l1: f64,
    /// Steps over which the sparsity coefficient grows linearly from 0.
    #[arg(long, default_value_t = 0)]
    pub coefficient_warm_up_steps: usize,
    #[arg(long, default_value_t = 1e-3)]
    pub lr: f64,
    #[arg(long, default_value_t = 0)]
    pub lr_warm_up_steps: usize,
    /// Steps of linear decay to 0 at the end (default: the last fifth).
    #[arg(long)]
    pub lr_decay_steps: Option<usize>,
    #[arg(long, default_value_t = 2000)]
    pub steps: usize,
    /// Windows (sequences) per training batch: batch x seq-len activations a step.
    #[arg(long, default_value_t = 16)]
    pub batch: usize,
    /// Windows per model pass (SAELens's store_batch_size_prompts; default: --batch).
    #[arg(long)]
    pub store_batch: Option<usize>,
    /// Model passes the mixing buffer holds.
    #[arg(long, default_value_t = 8)]
    pub n_batches_in_buffer: usize,
    #[command(flatten)]
    pub corpus: CorpusArgs,
    #[arg(long, default_value_t = 200)]
    pub checkpoint_every: usize,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Run directory: config.json, checkpoint.safetensors, metrics.jsonl, sae/ (SAELens's
    /// layout). Running again with the same options resumes.
    #[arg(long)]
    pub out: PathBuf,
    #[command(flatten)]
    pub common: Common,
}

impl TrainSaeArgs {
    fn architecture(&self) -> Result<Architecture> {
        let topk = TopKSettings::new(self.k);
        Ok(match self.architecture.as_str() {
            "standard" => Architecture::Standard { l1_coefficient: self.l1, l1_warm_up_steps: self.coefficient_warm_up_steps },
            "topk" => Architecture::TopK(topk),
            "batchtopk" => Architecture::BatchTopK { topk, threshold_lr: 0.01 },
            "jumprelu" => Architecture::JumpRelu(JumpReluSettings { l0_coefficient: self.l1, l0_warm_up_steps: self.coefficient_warm_up_steps, ..JumpReluSettings::default() }),
            other => return Err(UserError(format!("--architecture: \"{other}\" is not one of standard, topk, batchtopk, jumprelu")).into()),
        })
    }

    fn sites(&self, n_layers: usize) -> Vec<Site> {
        match &self.hook {
            Some(hooks) => hooks.split(',').map(|h| Site::sae(h.trim())).collect(),
            None => (0..n_layers)
                .map(|l| Site { input: format!("blocks.{l}.{}", self.transcoder_input), output: Some(format!("blocks.{l}.{}", self.transcoder_output)) })
                .collect(),
        }
    }

    fn config(&self, d_model: usize, n_layers: usize) -> Result<SaeRunConfig> {
        let d_sae = self.d_sae.unwrap_or(4 * d_model);
        if self.architecture.contains("topk") && !(self.k >= 1.0 && self.k <= d_sae as f64) {
            return Err(UserError(format!("--k: {} is not between 1 and d_sae = {d_sae}", self.k)).into());
        }
        if self.steps == 0 || self.batch == 0 || d_sae == 0 {
            return Err(UserError("--steps, --batch and --d-sae must be positive".into()).into());
        }
        let store_batch = self.store_batch.unwrap_or(self.batch);
        Ok(SaeRunConfig {
            sites: self.sites(n_layers),
            skip: self.skip,
            d_sae,
            architecture: self.architecture()?,
            trainer: TrainerConfig {
                lr: LrSchedule {
                    lr: self.lr,
                    lr_end: self.lr / 10.0,
                    scheduler: LrScheduler::Constant,
                    warm_up_steps: self.lr_warm_up_steps,
                    decay_steps: self.lr_decay_steps.unwrap_or(self.steps / 5),
                    total_steps: self.steps,
                },
                adam_beta1: 0.9,
                adam_beta2: 0.999,
                dead_feature_window: 1000,
            },
            store: StoreConfig {
                context_size: self.corpus.seq_len,
                store_batch_size_prompts: store_batch,
                n_batches_in_buffer: self.n_batches_in_buffer,
                train_batch_size_tokens: self.batch * self.corpus.seq_len,
                mix_fraction: 0.5,
            },
            steps: self.steps,
            seed: self.seed,
            checkpoint_every: self.checkpoint_every,
            log_every: (self.steps / 100).max(1),
        })
    }
}

pub fn run(a: &TrainSaeArgs) -> Result<()> {
    let m = crate::commands::load_model_args(&a.model, &a.common)?;
    let cfg = a.config(m.model.config.d_model, m.model.config.n_layers())?;
    let windows = a.corpus.windows(&m, a.seed)?;
    let tty = std::io::stderr().is_terminal();
    let mut on_step = |r: &[burnlens_features::StepReport], p: &burnlens_features::Progress| {
        if tty && (p.step % 10 == 0 || p.step == p.steps) {
            eprint!("\rstep {}/{}  loss {:.4}  L0 {:.1}  {:.0} tokens/s  {:.0} s left   ", p.step, p.steps, r[0].loss, r[0].l0, p.tokens_per_s, p.seconds_left);
        }
    };
    let model_name = Some(m.dir.display().to_string());
    let s = burnlens_features::train(&a.out, &cfg, &m.model, model_name, windows, &mut on_step)?;
    if tty {
        eprintln!();
    }
    if let Some(from) = s.resumed_from {
        println!("resumed at step {from} from {}", a.out.join("checkpoint.safetensors").display());
    }
    if s.data_ran_out {
        println!("the dataset ran out after {} steps of {}; what was trained so far is saved", s.steps, cfg.steps);
    }
    for ((r, site), dead) in s.last.iter().zip(&cfg.sites).zip(&s.dead_features) {
        let terms: Vec<String> = r.losses.iter().map(|(t, v)| format!("{} {v:.4}", t.name())).collect();
        println!("{}: step {}, loss {:.4} ({}), L0 {:.2}, dead features {dead}", site.input, r.step + 1, r.loss, terms.join(", "), r.l0);
    }
    let what = if a.transcoders { "transcoders" } else { "SAEs" };
    println!("trained {} {} {what} ({} features each) over {} activations", cfg.sites.len(), cfg.architecture.name(), cfg.d_sae, s.tokens);
    let outs: Vec<String> = s.outputs.iter().map(|p| p.display().to_string()).collect();
    println!("wrote {} ({}), metrics.jsonl and checkpoint.safetensors in {}", outs.join(", "), if a.transcoders { "circuit-tracer's layout" } else { "SAELens's layout" }, a.out.display());
    Ok(())
}
