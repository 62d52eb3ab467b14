//! A run as a user describes it (the `train-sae` flags, Python's keyword arguments): names and
//! defaults written once, here, and turned into a [`SaeRunConfig`].

use serde::Deserialize;

use crate::architecture::{Architecture, ArchitectureName, JumpReluSettings, TopKSettings};
use crate::config::{RunError, SaeRunConfig, Site};
use crate::schedule::{LrSchedule, LrScheduler};
use crate::store::StoreConfig;
use crate::trainer::TrainerConfig;

/// What to train, on which hooks, and how (SAELens's names where it has them).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
#[serde(default, deny_unknown_fields)]
pub struct RunOptions {
    /// The hook point, e.g. blocks.1.hook_resid_pre; several, comma-separated, train one SAE
    /// each from the same model passes.
    #[cfg_attr(feature = "clap", arg(long))]
    pub hook: Option<String>,
    /// Train a transcoder per layer instead, from `blocks.{l}.<transcoder-input>` to
    /// `blocks.{l}.<transcoder-output>`, written as a circuit-tracer transcoder set.
    #[cfg_attr(feature = "clap", arg(long, conflicts_with = "hook"))]
    pub transcoders: bool,
    #[cfg_attr(feature = "clap", arg(long, default_value_t = RunOptions::default().transcoder_input))]
    pub transcoder_input: String,
    #[cfg_attr(feature = "clap", arg(long, default_value_t = RunOptions::default().transcoder_output))]
    pub transcoder_output: String,
    /// The transcoders as one cross-layer transcoder: each layer's features write to that
    /// layer's output and every later one's; written in circuit-tracer's CLT layout.
    #[cfg_attr(feature = "clap", arg(long, requires = "transcoders"))]
    pub cross_layer: bool,
    /// Transcoders with a skip connection (W_skip).
    #[cfg_attr(feature = "clap", arg(long))]
    pub skip: bool,
    /// Number of features (default: 4 x d_model).
    #[cfg_attr(feature = "clap", arg(long))]
    pub d_sae: Option<usize>,
    /// standard (ReLU, L1 weighted by decoder norms), topk, batchtopk or jumprelu.
    #[cfg_attr(feature = "clap", arg(long, value_enum, default_value_t = RunOptions::default().architecture))]
    pub architecture: ArchitectureName,
    /// Active features per token (topk), or per token on average over the batch (batchtopk).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = RunOptions::default().k))]
    pub k: f64,
    /// The L1 coefficient of a standard SAE (default 0.1).
    #[cfg_attr(feature = "clap", arg(long))]
    pub l1: Option<f64>,
    /// The L0 coefficient of a jumprelu SAE (default 0.1).
    #[cfg_attr(feature = "clap", arg(long))]
    pub l0: Option<f64>,
    /// Steps over which the sparsity coefficient grows linearly from 0.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 0))]
    pub coefficient_warm_up_steps: usize,
    #[cfg_attr(feature = "clap", arg(long, default_value_t = RunOptions::default().lr))]
    pub lr: f64,
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 0))]
    pub lr_warm_up_steps: usize,
    /// Steps of linear decay to 0 at the end (default: the last fifth).
    #[cfg_attr(feature = "clap", arg(long))]
    pub lr_decay_steps: Option<usize>,
    #[cfg_attr(feature = "clap", arg(long, default_value_t = RunOptions::default().steps))]
    pub steps: usize,
    /// Windows (sequences) per training batch: batch x seq-len activations a step.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = RunOptions::default().batch))]
    pub batch: usize,
    /// Windows per model pass (SAELens's store_batch_size_prompts; default: batch).
    #[cfg_attr(feature = "clap", arg(long))]
    pub store_batch: Option<usize>,
    /// Model passes the mixing buffer holds.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = RunOptions::default().n_batches_in_buffer))]
    pub n_batches_in_buffer: usize,
    /// A feature is dead after this many steps without firing.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = RunOptions::default().dead_feature_window))]
    pub dead_feature_window: usize,
    #[cfg_attr(feature = "clap", arg(long, default_value_t = RunOptions::default().checkpoint_every))]
    pub checkpoint_every: usize,
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 0))]
    pub seed: u64,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            hook: None,
            transcoders: false,
            transcoder_input: "ln2.hook_normalized".into(),
            transcoder_output: "hook_mlp_out".into(),
            cross_layer: false,
            skip: false,
            d_sae: None,
            architecture: ArchitectureName::Standard,
            k: 32.0,
            l1: None,
            l0: None,
            coefficient_warm_up_steps: 0,
            lr: 1e-3,
            lr_warm_up_steps: 0,
            lr_decay_steps: None,
            steps: 2000,
            batch: 16,
            store_batch: None,
            n_batches_in_buffer: 8,
            dead_feature_window: 1000,
            checkpoint_every: 200,
            seed: 0,
        }
    }
}

/// The L1 (standard) and L0 (jumprelu) coefficients where none is given.
const DEFAULT_COEFFICIENT: f64 = 0.1;

fn bad(msg: String) -> RunError {
    RunError::Config(msg)
}

impl RunOptions {
    /// The architecture named, with its settings.
    pub fn architecture(&self) -> Result<Architecture, RunError> {
        let topk = TopKSettings::new(self.k);
        let a = self.architecture;
        // Each coefficient belongs to one architecture: given to another, it would be ignored.
        for (field, given, owner) in [("l1", self.l1, ArchitectureName::Standard), ("l0", self.l0, ArchitectureName::Jumprelu)] {
            if given.is_some() && a != owner {
                return Err(bad(format!("{field}: the sparsity coefficient of {owner}, not of {a}")));
            }
        }
        Ok(match a {
            ArchitectureName::Standard => {
                Architecture::Standard { l1_coefficient: self.l1.unwrap_or(DEFAULT_COEFFICIENT), l1_warm_up_steps: self.coefficient_warm_up_steps }
            }
            ArchitectureName::Topk => Architecture::TopK(topk),
            ArchitectureName::Batchtopk => Architecture::BatchTopK { topk, threshold_lr: 0.01 },
            ArchitectureName::Jumprelu => Architecture::JumpRelu(JumpReluSettings {
                l0_coefficient: self.l0.unwrap_or(DEFAULT_COEFFICIENT),
                l0_warm_up_steps: self.coefficient_warm_up_steps,
                ..JumpReluSettings::default()
            }),
        })
    }

    /// The sites trained: the hooks named, or a transcoder per layer of `n_layers`.
    pub fn sites(&self, n_layers: usize) -> Result<Vec<Site>, RunError> {
        match (&self.hook, self.transcoders) {
            (Some(_), true) => Err(bad("hook and transcoders: choose one".into())),
            (Some(hooks), false) => Ok(hooks.split(',').map(|h| Site::sae(h.trim())).collect()),
            (None, true) => Ok((0..n_layers)
                .map(|l| Site { input: format!("blocks.{l}.{}", self.transcoder_input), output: Some(format!("blocks.{l}.{}", self.transcoder_output)) })
                .collect()),
            (None, false) => Err(bad("hook: name the hook point(s) to train on, or ask for transcoders".into())),
        }
    }

    /// The run's configuration for a model of `d_model` and `n_layers`, on windows of
    /// `context_size` tokens.
    pub fn config(&self, d_model: usize, n_layers: usize, context_size: usize) -> Result<SaeRunConfig, RunError> {
        let d_sae = self.d_sae.unwrap_or(4 * d_model);
        if self.architecture.keeps_k() && !(self.k >= 1.0 && self.k <= d_sae as f64) {
            return Err(bad(format!("k: {} is not between 1 and d_sae = {d_sae}", self.k)));
        }
        if self.transcoders {
            // Checked now, not when the trained set is written in circuit-tracer's layout.
            let named = |field: &str, e: burnlens_trace::TraceError| bad(format!("{field}: {e}"));
            burnlens_trace::InputHook::parse(&self.transcoder_input).map_err(|e| named("transcoder_input", e))?;
            burnlens_trace::OutputHook::parse(&self.transcoder_output).map_err(|e| named("transcoder_output", e))?;
        }
        if self.cross_layer && !self.transcoders {
            return Err(bad("cross_layer: a cross-layer transcoder is trained from transcoders = true".into()));
        }
        if self.cross_layer && (self.skip || self.architecture == ArchitectureName::Topk) {
            return Err(bad(format!(
                "cross_layer: circuit-tracer's CLT files hold no skip connection and no TopK ({}); train standard, jumprelu or batchtopk without skip",
                if self.skip { "skip asked for" } else { "topk asked for" }
            )));
        }
        if self.steps == 0 || self.batch == 0 || d_sae == 0 {
            return Err(bad("steps, batch and d_sae must be positive".into()));
        }
        Ok(SaeRunConfig {
            sites: self.sites(n_layers)?,
            skip: self.skip,
            cross_layer: self.cross_layer,
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
                dead_feature_window: self.dead_feature_window,
            },
            store: StoreConfig {
                context_size,
                store_batch_size_prompts: self.store_batch.unwrap_or(self.batch),
                n_batches_in_buffer: self.n_batches_in_buffer,
                train_batch_size_tokens: self.batch * context_size,
                mix_fraction: 0.5,
            },
            steps: self.steps,
            seed: self.seed,
            checkpoint_every: self.checkpoint_every,
            log_every: (self.steps / 100).max(1),
        })
    }
}
