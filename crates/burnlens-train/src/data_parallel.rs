//! What data-parallel training adds to a step: the gradients summed over ranks (one flat
//! buffer per parameter order, sent in buckets), and a digest of the parameters that every
//! rank compares at each checkpoint, so ranks that drifted apart stop the run.

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::{Tensor, TensorData};
use burnlens_dist::{DistError, Ranks};
use sha2::{Digest, Sha256};

use crate::optim::float_params;

/// Sum every gradient over the ranks, in place. Each rank's loss was already weighted by
/// its share of the global batch, so the sum is the global batch's gradient. A large
/// gradient is all-reduced on its own values; the small ones (biases, norms, anything under
/// [`SMALL`] values) together in one buffer, so that a step costs a few dozen collectives
/// rather than one per parameter (their latency is what grows with the number of hosts).
pub(crate) fn all_reduce_grads<M: Module>(ranks: &Ranks, model: &M, grads: &mut GradientsParams, step: usize) -> Result<(), DistError> {
    if ranks.size() == 1 {
        return Ok(());
    }
    let what = format!("the gradient all-reduce of step {}", step + 1);
    let (mut small, mut flat) = (Vec::new(), Vec::new());
    for (id, rank) in float_params(model) {
        let Some(mut g) = Grad::take(grads, id, rank) else { continue };
        if g.values.len() >= SMALL {
            ranks.sum_f32(&mut g.values, &what)?;
            g.register(grads);
        } else {
            flat.append(&mut g.values);
            small.push(g);
        }
    }
    ranks.sum_f32(&mut flat, &what)?;
    let mut at = 0;
    for mut g in small {
        let n: usize = g.shape.iter().product();
        g.values = flat[at..at + n].to_vec();
        at += n;
        g.register(grads);
    }
    Ok(())
}

/// Gradients with fewer values than this share one all-reduce.
const SMALL: usize = 1 << 20;

/// A parameter's gradient taken out of [`GradientsParams`] as values.
struct Grad {
    id: ParamId,
    rank: usize,
    shape: Vec<usize>,
    device: burn::tensor::Device,
    values: Vec<f32>,
}

impl Grad {
    fn take(grads: &mut GradientsParams, id: ParamId, rank: usize) -> Option<Grad> {
        let (device, shape, data) = match rank {
            1 => grads.remove::<1>(id).map(|g| (g.device(), g.dims().to_vec(), g.into_data()))?,
            _ => grads.remove::<2>(id).map(|g| (g.device(), g.dims().to_vec(), g.into_data()))?,
        };
        let values = f32_values(data);
        Some(Grad { id, rank, shape, device, values })
    }

    fn register(self, grads: &mut GradientsParams) {
        let data = TensorData::new(self.values, self.shape);
        match self.rank {
            1 => grads.register(self.id, Tensor::<1>::from_data(data, &self.device)),
            _ => grads.register(self.id, Tensor::<2>::from_data(data, &self.device)),
        }
    }
}

/// Rank 0's parameters on every rank: a fresh model's initialisation draws from each
/// process's own generator, so ranks start apart unless rank 0's values are sent.
pub(crate) fn broadcast_params<M: Module>(ranks: &Ranks, model: M) -> Result<M, DistError> {
    if ranks.size() == 1 {
        return Ok(model);
    }
    struct Flatten(Vec<f32>);
    impl ModuleVisitor for Flatten {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            self.0.extend(f32_values(param.val().into_data()));
        }
    }
    let mut flat = Flatten(Vec::new());
    model.visit(&mut flat);
    let mut flat = flat.0;
    ranks.broadcast_f32(&mut flat, "sending rank 0's parameters")?;
    struct Unflatten(Vec<f32>, usize);
    impl ModuleMapper for Unflatten {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
            param.map(|t| {
                let (shape, device, grad) = (t.dims(), t.device(), t.is_require_grad());
                let n: usize = shape.iter().product();
                let data = TensorData::new(self.0[self.1..self.1 + n].to_vec(), shape);
                self.1 += n;
                Tensor::from_data(data, &device).set_require_grad(grad)
            })
        }
    }
    Ok(model.map(&mut Unflatten(flat, 0)))
}

/// SHA-256 over every parameter's f32 values, in the module's order.
pub(crate) fn params_digest<M: Module>(model: &M) -> [u8; 32] {
    struct Hasher(Sha256);
    impl ModuleVisitor for Hasher {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            let values = f32_values(param.val().into_data());
            let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            self.0.update(&bytes);
        }
    }
    let mut h = Hasher(Sha256::new());
    model.visit(&mut h);
    h.0.finalize().into()
}

/// A tensor's values as f32 (moved out when they are f32 already).
fn f32_values(data: TensorData) -> Vec<f32> {
    data.convert::<f32>().try_into_vec::<f32>().expect("converted to f32")
}
