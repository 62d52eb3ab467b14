//! What a training session reports while it runs. The library prints nothing: the CLI draws
//! a progress line, Python calls the user's `on_step`, tests collect what they need.

use std::ops::ControlFlow;
use std::path::Path;

use burnlens_hf::hub::Progress;
use serde_json::json;

/// One optimizer step, as `metrics.jsonl` records it.
#[derive(Debug, Clone, PartialEq)]
pub struct StepMetrics {
    /// Steps completed, this one included.
    pub step: usize,
    /// The run's last step.
    pub total: usize,
    /// Mean loss over the step's micro-batches.
    pub loss: f64,
    pub lr: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    /// Tokens per second since this session started.
    pub tokens_per_s: f64,
    /// Seconds since this session started.
    pub elapsed_s: f64,
}

impl StepMetrics {
    /// The `metrics.jsonl` line (and what Python's `on_step` receives).
    pub fn to_json(&self) -> serde_json::Value {
        json!({"kind": "train", "step": self.step, "loss": self.loss, "lr": self.lr, "grad_norm": self.grad_norm,
               "tokens_per_s": self.tokens_per_s, "elapsed_s": self.elapsed_s})
    }
}

/// Receives a session's events; every method has a do-nothing default.
pub trait Observer: Send {
    /// The loop starts at `first_step` (0, or a resumed run's step) of `total`, logging a
    /// line every `log_interval` steps.
    fn started(&mut self, _first_step: usize, _total: usize, _log_interval: usize) {}
    /// Something the user should know that is not an error (a skipped export, say).
    fn note(&mut self, _message: &str) {}
    /// A fine-tuning run's model is being fetched from the Hub.
    fn download(&mut self, _progress: Progress) {}
    /// After every optimizer step. `Break` stops the run after a checkpoint, as Ctrl-C does.
    fn step(&mut self, _metrics: &StepMetrics) -> ControlFlow<()> {
        ControlFlow::Continue(())
    }
    /// The validation loss after step `step`.
    fn evaluated(&mut self, _step: usize, _val_loss: f64) {}
    /// A complete checkpoint of step `step` is at `dir`.
    fn checkpointed(&mut self, _step: usize, _dir: &Path) {}
    /// The last step is done.
    fn finished(&mut self) {}
}

/// An observer that ignores everything.
#[derive(Debug, Clone, Copy, Default)]
pub struct Silent;

impl Observer for Silent {}
