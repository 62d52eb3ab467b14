//! For the hand-written passes' tests: a random SAE or transcoder and batch, the autodiff pass
//! ([`training_pass`]) on them, and a check that another pass gives the same loss terms,
//! counts and gradients.

use burn::tensor::{Bool, Device, Tensor, TensorData};
use burnlens_lens::dictionary::Dictionary;
use burnlens_model::Rng;

use crate::architecture::Architecture;
use crate::forward::{PassInput, TrainPassValues, training_pass};
use crate::params::{Shape, Trainable, init};

fn random(shape: [usize; 2], scale: f64, rng: &mut Rng, device: &Device) -> Tensor<2> {
    let v: Vec<f32> = (0..shape[0] * shape[1]).map(|_| ((rng.next_f64() * 2.0 - 1.0) * scale) as f32).collect();
    Tensor::from_data(TensorData::new(v, shape), device)
}

/// What is checked.
pub struct Case {
    pub arch: Architecture,
    pub shape: Shape,
    pub dead: Vec<bool>,
    pub coefficient: f64,
}

/// A pass under test: parameters, architecture, `(x, target, coefficient, dead)`.
pub type Pass<'a> = &'a dyn Fn(&Dictionary, &Architecture, (Tensor<2>, Tensor<2>, f64, &[bool])) -> (Dictionary, TrainPassValues);

pub fn check(case: Case, seed: u64, pass: Pass) {
    let device = Device::default();
    let mut rng = Rng::new(seed);
    let Shape { d_in, d_sae, d_out, .. } = case.shape;
    let mut p = init(&case.arch, case.shape, Some(0.1), &mut rng, &device);
    p.b_enc = random([1, d_sae], 0.05, &mut rng, &device).reshape([d_sae]);
    p.b_dec = random([1, d_out], 0.5, &mut rng, &device).reshape([d_out]);
    p.w_dec = vec![p.decoder().clone() * random([d_sae, 1], 1.0, &mut rng, &device).abs().expand([d_sae, d_out])];
    p.w_skip = p.w_skip.map(|w| random(w.dims(), 0.1, &mut rng, &device));
    p.threshold = p.threshold.map(|t| random([1, t.dims()[0]], 0.05, &mut rng, &device).abs().reshape([d_sae]));
    let n = 24;
    let x = random([n, d_in], 1.0, &mut rng, &device);
    let target = if case.shape.transcoder { random([n, d_out], 1.0, &mut rng, &device) } else { x.clone() };

    let n_dead = case.dead.iter().filter(|&&d| d).count();
    let mask = Tensor::<1, Bool>::from_data(TensorData::new(case.dead.clone(), [d_sae]), &device).autodiff();
    let leaves = p.leaves();
    let input =
        PassInput { x: x.clone().autodiff(), target: target.clone().autodiff(), coefficient: case.coefficient, dead: Some((&mask, n_dead)), shared: None };
    let want_pass = training_pass(&leaves, &case.arch, input);
    let want_losses: Vec<f64> = want_pass.terms.iter().map(|(_, v)| v.clone().inner().into_scalar::<f32>() as f64).collect();
    let fired = want_pass.feature_acts.clone().inner().not_equal_elem(0.0).int().sum_dim(0);
    let want_fired: Vec<i64> = fired.into_data().convert::<i64>().try_into_vec::<i64>().unwrap();
    let want = leaves.grads(&want_pass.loss.backward());

    let (got, values) = pass(&p, &case.arch, (x, target, case.coefficient, &case.dead));
    let got_losses: Vec<f64> = values.losses.iter().map(|(_, v)| *v).collect();
    assert_eq!(got_losses.len(), want_losses.len());
    for (g, w) in got_losses.iter().zip(&want_losses) {
        assert!((g - w).abs() <= 1e-5 * w.abs().max(1e-3), "losses {got_losses:?} vs {want_losses:?}");
    }
    assert_eq!(values.fired, want_fired.iter().map(|&c| c as u64).collect::<Vec<_>>());
    assert!(values.l0 > 0.0);
    for ((name, g), (_, w)) in got.named().into_iter().zip(want.named()) {
        let scale = w.clone().abs().max().into_scalar::<f32>().max(1e-6);
        let err = (g - w).abs().max().into_scalar::<f32>() / scale;
        assert!(err < 1e-5, "{name}: {err}");
    }
}

/// Every `every`-th feature dead.
pub fn dead_every(m: usize, every: usize) -> Vec<bool> {
    (0..m).map(|j| j % every == 0).collect()
}
