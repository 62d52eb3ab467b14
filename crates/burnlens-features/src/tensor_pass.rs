//! The step's pass on Burn's tensors with autodiff, wherever the batch lives: a GPU's path
//! (what comes back to the host is one read a step, made once the backward is enqueued — the
//! loss and its terms, BatchTopK's smallest kept activation and the per-feature firing
//! counts, L0 their sum ([`PassReport`]); Adam's clipping stays on the device; over several
//! ranks, BatchTopK's candidates too, [`crate::share::batch_kth_of`]),
//! and the CPU's for what the hand-written host passes leave (JumpReLU's pre-activation loss
//! on dead features). Which of the two a step takes is [`PassPath`].

use std::cell::RefCell;

use burn::tensor::{Bool, Device, Tensor, TensorData};
use burnlens_dist::DistError;
use burnlens_lens::dictionary::Dictionary;
use burnlens_model::read_back::read_together;

use crate::architecture::{Architecture, LossTerm};
use crate::forward::{BatchShare, PassInput, TrainPass, TrainPassValues, training_pass};
use crate::params::Trainable;
use crate::share::{Share, batch_kth_of};

/// Where a training step's pass runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum PassPath {
    /// The hand-written passes over host slices (`sparse_pass`, `dense_pass`): the CPU's
    /// fast path.
    Host,
    /// Burn's tensors with autodiff ([`gradients`]): the tensors stay on their device.
    Tensors,
}

impl PassPath {
    /// The host passes on a CPU device, the tensors on a GPU.
    pub fn for_device(device: &Device) -> Self {
        if burnlens_model::backend::is_host(device) { PassPath::Host } else { PassPath::Tensors }
    }

    /// The path a step on `device` takes: `forced` if given, else by device.
    pub fn of_step(forced: Option<PassPath>, device: &Device) -> Self {
        forced.unwrap_or_else(|| PassPath::for_device(device))
    }

    /// How a run's summary says it.
    pub fn describe(self) -> &'static str {
        match self {
            PassPath::Host => "the hand-written passes over host memory",
            PassPath::Tensors => "autodiff tensors kept on the device",
        }
    }
}

/// What the tensor pass is given: the batch (`target` is `x` for an SAE), the sparsity
/// coefficient, the dead features, and the ranks sharing the batch (for BatchTopK's choice
/// across them; `None` alone).
pub struct TensorInput<'a> {
    pub x: Tensor<2>,
    pub target: Tensor<2>,
    pub coefficient: f64,
    pub dead: &'a [bool],
    pub share: Option<Share<'a>>,
}

/// The gradients of the loss at `params` on the batch, and the pass's report (an error only
/// from the ranks sharing the batch).
pub fn gradients(params: &Dictionary, arch: &Architecture, input: TensorInput) -> Result<(Dictionary, TrainPassValues), DistError> {
    let TensorInput { x, target, coefficient, dead, share } = input;
    let device: Device = x.device();
    let n_dead = dead.iter().filter(|&&d| d).count();
    let mask = Tensor::<1, Bool>::from_data(TensorData::new(dead.to_vec(), [dead.len()]), &device);
    let leaves = params.leaves();
    // The ranks' collective runs inside the pass; its error is kept and returned after it.
    let failed = RefCell::new(None);
    let threshold = |acts: Tensor<2>, kk: usize| {
        let s = share.as_ref().expect("a threshold is asked for only when the batch is shared");
        batch_kth_of(s, acts, kk).unwrap_or_else(|e| {
            failed.replace(Some(e));
            f32::INFINITY
        })
    };
    let shared = share.as_ref().map(|s| BatchShare { rows: s.rows, threshold: &threshold });
    let input = PassInput { x: x.autodiff(), target: target.autodiff(), coefficient, dead: Some((&mask.autodiff(), n_dead)), shared };
    let pass = training_pass(&leaves, arch, input);
    if let Some(e) = failed.take() {
        return Err(e);
    }
    let report = PassReport::of(&pass, arch);
    // The backward is enqueued before anything is read: the device runs it while the host
    // waits for the one read of the report.
    let grads = pass.loss.backward();
    let values = report.read(n_dead);
    Ok((leaves.grads(&grads), values))
}

/// What a step reports of its pass, left on the device until the backward is enqueued and
/// then read back in one read ([`read_together`]): the loss, its terms, BatchTopK's smallest
/// positive activation (infinite where nothing fired) and each feature's firing count (whole
/// numbers in f32: exact below 2²⁴ rows).
struct PassReport {
    /// The loss, each term and (BatchTopK) the smallest activation, `[1]` each, then the
    /// counts `[d_sae]`.
    parts: Vec<Tensor<1>>,
    terms: Vec<LossTerm>,
    min_positive: bool,
    rows: usize,
}

impl PassReport {
    fn of(pass: &TrainPass, arch: &Architecture) -> Self {
        let acts = pass.feature_acts.clone().inner();
        let rows = acts.dims()[0];
        assert!(rows < 1 << 24, "a step of {rows} rows: its firing counts would not be whole in f32");
        let min_positive = matches!(arch, Architecture::BatchTopK { .. }).then(|| {
            let hidden = acts.clone().greater_elem(0.0).bool_not();
            acts.clone().mask_fill(hidden, f32::INFINITY).min()
        });
        let counts = acts.not_equal_elem(0.0).float().sum_dim(0).reshape([-1]);
        let scalars = pass.terms.iter().map(|(_, v)| v.clone().inner().reshape([1]));
        let parts = std::iter::once(pass.loss.clone().inner().reshape([1])).chain(scalars).chain(min_positive.clone()).chain([counts]).collect();
        PassReport { parts, terms: pass.terms.iter().map(|(t, _)| *t).collect(), min_positive: min_positive.is_some(), rows }
    }

    /// The report read back (one wait for the device), with `dead` features before the step.
    fn read(self, dead: usize) -> TrainPassValues {
        let mut parts = read_together(self.parts);
        let fired: Vec<u64> = parts.pop().expect("the counts").into_iter().map(|c| c as u64).collect();
        let scalars: Vec<f32> = parts.into_iter().map(|p| p[0]).collect();
        let min_positive = self.min_positive.then(|| scalars[scalars.len() - 1]).filter(|m| m.is_finite()).map(f64::from);
        TrainPassValues {
            losses: self.terms.iter().zip(&scalars[1..]).map(|(t, &v)| (*t, v as f64)).collect(),
            loss: scalars[0] as f64,
            l0: fired.iter().sum::<u64>() as f64 / self.rows as f64,
            dead,
            fired,
            min_positive,
        }
    }
}
