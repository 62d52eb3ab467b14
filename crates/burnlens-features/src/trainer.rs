//! The training loop's step, as SAELens 6's `SAETrainer._train_step`: the coefficient and
//! learning rate of the step, the dead-feature mask from the counters (`passes since fired >
//! dead_feature_window`), the training pass, the counters updated from which features fired,
//! backward, global gradient clipping, Adam; JumpReLU thresholds clamped at 0 before the
//! pass, BatchTopK's inference threshold moved towards the batch's smallest kept activation.

use burn::tensor::Tensor;
use burnlens_dist::{DistError, Ranks};
use burnlens_lens::dictionary::Dictionary;
use serde::{Deserialize, Serialize};

use crate::adam::Adam;
use crate::architecture::{Architecture, LossTerm};
use crate::cross_layer::Blocks;
use crate::dense_pass::{self, DenseInput};
use crate::forward::TrainPassValues;
use crate::host::Scratch;
use crate::params::Trainable;
use crate::schedule::{CoefficientSchedule, LrSchedule};
use crate::share::{self, InFlight, Share};
use crate::sparse_pass::{self, SparseInput};
use crate::tensor_pass::{self, PassPath, TensorInput};

/// SAELens's trainer settings (`SAETrainerConfig`'s optimisation fields).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TrainerConfig {
    pub lr: LrSchedule,
    pub adam_beta1: f64,
    pub adam_beta2: f64,
    /// A feature is dead after this many steps without firing.
    pub dead_feature_window: usize,
}

/// What a step did.
#[derive(Debug, Clone, Serialize)]
pub struct StepReport {
    pub step: usize,
    pub lr: f64,
    pub coefficient: f64,
    /// Each loss term (SAELens's names), then their sum.
    pub losses: Vec<(LossTerm, f64)>,
    pub loss: f64,
    /// Mean number of features firing per token.
    pub l0: f64,
    /// Features dead before the step.
    pub dead: usize,
    /// Over several ranks: seconds this rank waited for the step's all-reduce (of the
    /// gradients and the shared values) after making the next batch: its exposed part.
    pub allreduce_s: Option<f64>,
    /// Over several ranks: seconds the all-reduce ran in the background, waiting for the
    /// slowest rank included.
    pub allreduce_total_s: Option<f64>,
}

/// A dictionary (an SAE, a transcoder, a CLT as one masked transcoder) being trained and
/// everything its next step depends on.
#[derive(Debug, Clone)]
pub struct SaeTrainer {
    pub arch: Architecture,
    pub cfg: TrainerConfig,
    pub params: Dictionary,
    pub adam: Adam,
    /// Steps taken.
    pub step: usize,
    /// Per feature: steps since it last fired (SAELens's `n_forward_passes_since_fired`).
    pub since_fired: Vec<u32>,
    /// Per feature: tokens it fired on since the counts were last reset.
    pub fired_tokens: Vec<u64>,
    /// BatchTopK's running inference threshold (f64, as SAELens keeps it).
    pub topk_threshold: f64,
    /// A cross-layer transcoder's blocks: gradients outside them are dropped.
    pub blocks: Option<Blocks>,
    /// The ranks sharing each step's batch ([`crate::share`]); one process by default.
    pub ranks: Ranks,
    /// Where each step's pass runs; `None`: chosen by the batch's device.
    pub path: Option<PassPath>,
    /// The sparse pass's pre-activations, kept between steps.
    scratch: Scratch,
}

impl SaeTrainer {
    pub fn new(arch: Architecture, cfg: TrainerConfig, params: Dictionary) -> Self {
        let d_sae = params.d_sae();
        let adam = Adam::new(&params, cfg.adam_beta1, cfg.adam_beta2);
        SaeTrainer {
            arch,
            cfg,
            params,
            adam,
            step: 0,
            since_fired: vec![0; d_sae],
            fired_tokens: vec![0; d_sae],
            topk_threshold: 0.0,
            blocks: None,
            ranks: Ranks::single(),
            path: None,
            scratch: Scratch::default(),
        }
    }

    /// The same trainer with each step's batch shared by `ranks`: every rank is given the
    /// whole batch and computes its rows' part.
    pub fn shared_by(mut self, ranks: Ranks) -> Self {
        self.ranks = ranks;
        self
    }

    /// The same trainer with every step's pass on `path`, whatever the batch's device.
    pub fn on_path(self, path: PassPath) -> Self {
        self.chosen_path(Some(path))
    }

    /// [`on_path`](Self::on_path) when `path` is given, by device otherwise.
    pub fn chosen_path(mut self, path: Option<PassPath>) -> Self {
        self.path = path;
        self
    }

    fn coefficient(&self) -> f64 {
        self.arch.coefficient().map_or(0.0, |(value, warm_up_steps)| CoefficientSchedule { value, warm_up_steps }.at(self.step))
    }

    /// Features dead now.
    pub fn dead(&self) -> Vec<bool> {
        self.since_fired.iter().map(|&s| s as usize > self.cfg.dead_feature_window).collect()
    }

    /// The gradients of the loss at the current parameters on `batch` (before clipping),
    /// with the pass's report; nothing changes.
    pub fn gradients(&self, batch: Batch) -> Result<(Dictionary, TrainPassValues), DistError> {
        let (g, v, _) = self.backward(&thresholds_clamped(&self.params), batch)?.finish()?;
        Ok((g, v))
    }

    /// A cross-layer transcoder: `params` masked to its blocks, as its gradients will be.
    pub fn cross_layer(mut self, blocks: Blocks) -> Self {
        self.params = blocks.mask(self.params);
        self.blocks = Some(blocks);
        self
    }

    /// The whole batch's gradients: this rank's rows', masked to a CLT's blocks, their sum
    /// over the ranks started.
    fn backward(&self, params: &Dictionary, batch: Batch) -> Result<InFlight, DistError> {
        let (mine, rows) = batch.part(&self.ranks);
        let n = mine.x.dims()[0];
        let (g, values) = self.unmasked_backward(params, mine, rows)?;
        let g = match &self.blocks {
            Some(b) => b.mask(g),
            None => g,
        };
        Ok(share::start_all_reduce(&self.ranks, (g, values), (n, rows), self.step))
    }

    /// On the host ([`PassPath::Host`]), TopK and BatchTopK SAEs take the sparse pass,
    /// standard and JumpReLU the hand-written dense one, Burn's autodiff what is left
    /// (JumpReLU's pre-activation loss on dead features); on [`PassPath::Tensors`] every
    /// architecture takes Burn's autodiff on the batch's device ([`PassPath::of_step`]).
    fn unmasked_backward(&self, params: &Dictionary, batch: Batch, rows: usize) -> Result<(Dictionary, TrainPassValues), DistError> {
        let Batch { x, target } = batch;
        debug_assert_eq!(target.is_none(), params.subtract_b_dec, "an SAE's batch has no target, a transcoder's has one");
        let target = target.unwrap_or_else(|| x.clone());
        let dead = self.dead();
        let share = (self.ranks.size() > 1).then_some(Share { ranks: &self.ranks, rows, step: self.step });
        if PassPath::of_step(self.path, &x.device()) == PassPath::Host {
            if self.arch.topk().is_some() {
                return sparse_pass::gradients(params, &self.arch, SparseInput { x, target, dead: &dead, scratch: &self.scratch, share });
            }
            let n_dead = dead.iter().filter(|&&d| d).count();
            if dense_pass::handles(&self.arch, n_dead) {
                return Ok(dense_pass::gradients(params, &self.arch, DenseInput { x, target, coefficient: self.coefficient(), dead: &dead }));
            }
        }
        tensor_pass::gradients(params, &self.arch, TensorInput { x, target, coefficient: self.coefficient(), dead: &dead, share })
    }

    /// One training step on `batch` (an error only from the ranks sharing it).
    pub fn train_step(&mut self, batch: Batch) -> Result<StepReport, DistError> {
        let begun = self.begin_step(batch)?;
        self.finish_step(begun)
    }

    /// A step's first half: the pass on this rank's rows, its sums over the ranks started.
    /// [`SaeTrainer::finish_step`] ends it; other work may go between.
    pub fn begin_step(&mut self, batch: Batch) -> Result<StepBegun, DistError> {
        // SAELens clamps the thresholds in place before each pass.
        self.params = thresholds_clamped(&self.params);
        Ok(StepBegun(self.backward(&self.params, batch)?))
    }

    /// A step's second half: the sums waited for, the counters, Adam.
    pub fn finish_step(&mut self, begun: StepBegun) -> Result<StepReport, DistError> {
        let (lr, coefficient) = (self.cfg.lr.at(self.step), self.coefficient());
        let waited = std::time::Instant::now();
        let (g, v, ran) = begun.0.finish()?;
        let allreduce_s = ran.map(|_| waited.elapsed().as_secs_f64());
        for (i, &c) in v.fired.iter().enumerate() {
            self.since_fired[i] = if c > 0 { 0 } else { self.since_fired[i] + 1 };
            self.fired_tokens[i] += c;
        }
        self.params = self.adam.step(&self.params, &g, lr);
        if let (Architecture::BatchTopK { threshold_lr, .. }, Some(m)) = (self.arch, v.min_positive) {
            self.topk_threshold = (1.0 - threshold_lr) * self.topk_threshold + threshold_lr * m;
        }
        let report =
            StepReport { step: self.step, lr, coefficient, losses: v.losses, loss: v.loss, l0: v.l0, dead: v.dead, allreduce_s, allreduce_total_s: ran };
        self.step += 1;
        Ok(report)
    }
}

/// A step begun ([`SaeTrainer::begin_step`]): its sums over the ranks under way.
pub struct StepBegun(InFlight);

/// `p` with JumpReLU thresholds clamped at 0 (SAELens's `threshold.data.clamp_(min=0.0)`).
fn thresholds_clamped(p: &Dictionary) -> Dictionary {
    Dictionary { threshold: p.threshold.clone().map(|t| t.clamp_min(0.0)), ..p.clone() }
}

/// A training batch: inputs `[n, d_in]` and, for a transcoder, targets `[n, d_out]` (an SAE's
/// target is its input).
pub struct Batch {
    pub x: Tensor<2>,
    pub target: Option<Tensor<2>>,
}

impl Batch {
    /// An SAE's batch.
    pub fn sae(x: Tensor<2>) -> Self {
        Batch { x, target: None }
    }

    /// This rank's rows of the whole batch ([`Ranks::rows`]), and how many rows the whole
    /// batch has.
    fn part(self, ranks: &Ranks) -> (Batch, usize) {
        let n = self.x.dims()[0];
        if ranks.size() == 1 {
            return (self, n);
        }
        let rows = ranks.rows(n);
        let take = |t: Tensor<2>| t.narrow(0, rows.start, rows.len());
        (Batch { x: take(self.x), target: self.target.map(take) }, n)
    }
}

/// A digest of the trainers' parameters (every rank's must equal rank 0's).
pub(crate) fn params_digest(trainers: &[SaeTrainer]) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for t in trainers {
        for (_, p) in t.params.named() {
            h.update(crate::host::host(p).iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>());
        }
    }
    h.finalize().into()
}
