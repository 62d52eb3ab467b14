//! burnlens's one-launch Adam step on the GPU (`burnlens::model::gpu::adam_step`) against the
//! composed steps it stands for, on the same device: Burn's AdamW as nanoGPT's trainer takes
//! it (`kernels::adamw::adamw_step_reference`) and torch's Adam as SAELens's trainer takes it,
//! after a clipping factor held on the device. On every GPU backend the build has (wgpu:
//! Mesa's lavapipe where there is no GPU; cuda on the lent GPU).
#![cfg(any(feature = "wgpu", feature = "cuda"))]

mod common;

use burn::tensor::{Device, Tensor, TensorData};
use burnlens::model::gpu::{self, AdamRule};
use burnlens::model::kernels::adamw::{AdamWStep, adamw_step_reference};
use common::{gpu_devices as devices, uniform};

/// The largest difference of two tensors relative to the largest magnitude of the second.
fn worst(got: Tensor<1>, want: Tensor<1>) -> f32 {
    let (g, w) = (got.into_data().try_into_vec_as::<f32>().unwrap(), want.into_data().try_into_vec_as::<f32>().unwrap());
    let scale = w.iter().fold(1e-30f32, |m, v| m.max(v.abs()));
    g.iter().zip(&w).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max) / scale
}

/// `(p, m, v, g)` of `n` values on `device`: moments as a run has them (`v ≥ 0`), zero at the
/// first step.
fn state(n: usize, seed: u64, first: bool, device: &Device) -> [Tensor<1>; 4] {
    let t = |v: Vec<f32>| Tensor::<1>::from_data(TensorData::new(v, [n]), device);
    let moment = |s: u64, square: bool| if first { vec![0.0; n] } else { uniform(n, s).iter().map(|x| if square { x * x * 0.01 } else { x * 0.1 }).collect() };
    [t(uniform(n, seed)), t(moment(seed + 1, false)), t(moment(seed + 2, true)), t(uniform(n, seed + 3).iter().map(|x| x * 0.5).collect())]
}

/// Burn's AdamW (with and without decay, first and later steps, more elements than one pass
/// of the grid covers): the kernel's `(p, m, v)` are the composed step's.
#[test]
fn the_adamw_step_in_one_launch_equals_burns_composed_adamw() {
    for (name, device) in devices() {
        for (i, (n, decay, t)) in [(7, 0.0, 1), (300 * 257, 0.1, 5), (17_000_000, 0.1, 2)].into_iter().enumerate() {
            let [p, m, v, g] = state(n, 40 + 10 * i as u64, t == 1, &device);
            let (b1, b2, lr) = (0.9f32, 0.95f32, 6e-4f64);
            let step =
                AdamWStep { beta_1: b1, beta_2: b2, lr, decay_rate: lr * decay, epsilon: 1e-8, correction_1: 1.0 - b1.powi(t), correction_2: 1.0 - b2.powi(t) };
            let got = gpu::adam_step(p.clone(), m.clone(), v.clone(), g.clone(), None, step.rule()).unwrap_or_else(|| panic!("{name}: the kernel runs"));
            let want = adamw_step_reference(p, m, v, g, step);
            for (part, a, b) in [("p", got.0, want.0), ("m", got.1, want.1), ("v", got.2, want.2)] {
                let d = worst(a, b);
                println!("adamw {name} n={n} decay={decay} t={t} {part}: worst relative |Δ| {d:e}");
                assert!(d <= 1e-6, "{name} n={n} decay={decay} t={t} {part}: worst relative |Δ| {d:e}");
            }
        }
    }
}

/// torch's Adam after clipping (a factor below 1 and one of exactly 1, as a one-element tensor
/// on the device): the kernel's `(p, m, v)` are the composed step's; a host tensor and shapes
/// that differ are refused.
#[test]
fn the_torch_adam_step_in_one_launch_equals_the_composed_step_after_clipping() {
    for (name, device) in devices() {
        for (i, (n, factor, t)) in [(24_576, 0.37f32, 3), (768, 1.0, 1)].into_iter().enumerate() {
            let [p, m, v, g] = state(n, 70 + 10 * i as u64, t == 1, &device);
            let (b1, b2, lr) = (0.9f64, 0.999f64, 3e-4f64);
            let (bc1, bc2_sqrt) = (1.0 - b1.powi(t), (1.0 - b2.powi(t)).sqrt());
            let clip = Tensor::<1>::from_data(TensorData::new(vec![factor], [1]), &device);
            let rule = AdamRule::Torch {
                one_minus_beta1: (1.0 - b1) as f32,
                beta2: b2 as f32,
                one_minus_beta2: (1.0 - b2) as f32,
                correction2_sqrt: bc2_sqrt as f32,
                epsilon: 1e-8,
                step_size: (lr / bc1) as f32,
            };
            let got = gpu::adam_step(p.clone(), m.clone(), v.clone(), g.clone(), Some(clip.clone()), rule).unwrap_or_else(|| panic!("{name}: the kernel runs"));
            let g = g * clip;
            let m2 = m.clone() + (g.clone() - m) * (1.0 - b1);
            let v2 = v * b2 + g.clone() * g * (1.0 - b2);
            let p2 = p - m2.clone() / (v2.clone().sqrt() / bc2_sqrt + 1e-8) * (lr / bc1);
            for (part, a, b) in [("p", got.0, p2), ("m", got.1, m2), ("v", got.2, v2)] {
                let d = worst(a, b);
                println!("adam {name} n={n} clip={factor} t={t} {part}: worst relative |Δ| {d:e}");
                assert!(d <= 1e-6, "{name} n={n} clip={factor} t={t} {part}: worst relative |Δ| {d:e}");
            }
        }
        let [p, m, v, g] = state(5, 1, false, &Device::flex());
        assert!(
            gpu::adam_step(
                p,
                m,
                v,
                g,
                None,
                AdamWStep { beta_1: 0.9, beta_2: 0.95, lr: 1e-3, decay_rate: 0.0, epsilon: 1e-8, correction_1: 0.1, correction_2: 0.05 }.rule()
            )
            .is_none(),
            "a host tensor"
        );
        let [p, m, v, _] = state(5, 1, false, &device);
        let [.., g] = state(6, 1, false, &device);
        assert!(
            gpu::adam_step(
                p,
                m,
                v,
                g,
                None,
                AdamRule::Torch { one_minus_beta1: 0.1, beta2: 0.999, one_minus_beta2: 0.001, correction2_sqrt: 1.0, epsilon: 1e-8, step_size: 1e-3 }
            )
            .is_none(),
            "{name}: shapes that differ"
        );
    }
}
