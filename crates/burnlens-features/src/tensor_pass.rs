//! The step's pass on Burn's tensors with autodiff, wherever the batch lives: a GPU's path
//! (what comes back to the host is scalars — the loss terms, L0, BatchTopK's smallest kept
//! activation, the gradients' norm Adam clips by — and the per-feature firing counts; over
//! several ranks, BatchTopK's candidates too, [`crate::share::batch_kth_of`]),
//! and the CPU's for what the hand-written host passes leave (JumpReLU's pre-activation loss
//! on dead features). Which of the two a step takes is [`PassPath`].

use std::cell::RefCell;

use burn::tensor::{Bool, Device, Tensor, TensorData};
use burnlens_dist::DistError;
use burnlens_lens::dictionary::Dictionary;

use crate::architecture::Architecture;
use crate::forward::{BatchShare, PassInput, TrainPassValues, training_pass};
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
    let acts = pass.feature_acts.clone().inner();
    let fired = acts.clone().not_equal_elem(0.0);
    let counts: Vec<i64> = fired.clone().int().sum_dim(0).into_data().convert::<i64>().try_into_vec::<i64>().expect("counts");
    let l0 = fired.int().sum().into_scalar::<i64>() as f64 / acts.dims()[0] as f64;
    let min_positive = match arch {
        Architecture::BatchTopK { .. } => {
            let pos = acts.clone().greater_elem(0.0);
            let any = pos.clone().any().into_scalar::<bool>();
            any.then(|| acts.mask_fill(pos.bool_not(), f32::INFINITY).min().into_scalar::<f32>() as f64)
        }
        _ => None,
    };
    let values = TrainPassValues {
        losses: pass.terms.iter().map(|(t, v)| (*t, v.clone().inner().into_scalar::<f32>() as f64)).collect(),
        loss: pass.loss.clone().inner().into_scalar::<f32>() as f64,
        l0,
        dead: n_dead,
        fired: counts.iter().map(|&c| c as u64).collect(),
        min_positive,
    };
    let grads = pass.loss.backward();
    Ok((leaves.grads(&grads), values))
}
