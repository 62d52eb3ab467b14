//! SAE training against SAELens itself (`tests/fixtures/sae_train/`, written by
//! `scripts/gen_sae_train_fixtures.py` with sae-lens's `SAETrainer`): from the same initial
//! weights and activation batches, each architecture's first step (loss terms and gradients)
//! within 1e-5 relative and ten steps with the learning-rate warm-up/decay, the coefficient
//! warm-up, dead-feature terms and gradient clipping within 1e-4 — on both of a step's paths,
//! the host passes and Burn's tensors (the GPU's path, run here on the CPU backend).

mod common;

use std::collections::HashMap;
use std::path::PathBuf;

use burn::tensor::{Device, Tensor, TensorData};
use burnlens::features::{Architecture, Batch, JumpReluSettings, LrSchedule, LrScheduler, PassPath, SaeTrainer, Shape, TopKSettings, Trainable, TrainerConfig};
use burnlens::lens::dictionary::Dictionary;
use common::{Stored, read_safetensors};
use serde_json::Value;

const ARCHITECTURES: [&str; 4] = ["standard", "topk", "batchtopk", "jumprelu"];

struct Case {
    meta: Value,
    t: HashMap<String, Stored>,
}

fn case(name: &str) -> Case {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sae_train").join(name);
    let meta = serde_json::from_str(&std::fs::read_to_string(dir.join("meta.json")).unwrap()).unwrap();
    Case { meta, t: read_safetensors(&dir.join("tensors.safetensors")) }
}

fn architecture(meta: &Value) -> Architecture {
    let s = &meta["sae"];
    let f = |k: &str| s[k].as_f64().unwrap();
    let topk = || TopKSettings::new(f("k"));
    match meta["architecture"].as_str().unwrap() {
        "standard" => Architecture::Standard { l1_coefficient: f("l1_coefficient"), l1_warm_up_steps: s["l1_warm_up_steps"].as_u64().unwrap() as usize },
        "topk" => Architecture::TopK(topk()),
        "batchtopk" => Architecture::BatchTopK { topk: topk(), threshold_lr: f("topk_threshold_lr") },
        "jumprelu" => Architecture::JumpRelu(JumpReluSettings {
            init_threshold: f("jumprelu_init_threshold"),
            bandwidth: f("jumprelu_bandwidth"),
            l0_coefficient: f("l0_coefficient"),
            l0_warm_up_steps: s["l0_warm_up_steps"].as_u64().unwrap() as usize,
            pre_act_loss_coefficient: s["pre_act_loss_coefficient"].as_f64(),
        }),
        other => panic!("{other}"),
    }
}

fn trainer_config(meta: &Value) -> TrainerConfig {
    let t = &meta["trainer"];
    let u = |k: &str| t[k].as_u64().unwrap() as usize;
    TrainerConfig {
        lr: LrSchedule {
            lr: t["lr"].as_f64().unwrap(),
            lr_end: t["lr_end"].as_f64().unwrap(),
            scheduler: LrScheduler::Constant,
            warm_up_steps: u("lr_warm_up_steps"),
            decay_steps: u("lr_decay_steps"),
            total_steps: meta["steps"].as_u64().unwrap() as usize,
        },
        adam_beta1: 0.9,
        adam_beta2: 0.999,
        dead_feature_window: u("dead_feature_window"),
    }
}

fn tensor2(s: &Stored, device: &Device) -> Tensor<2> {
    let shape = if s.shape.len() == 1 { vec![1, s.shape[0]] } else { s.shape.clone() };
    Tensor::from_data(TensorData::new(s.f32.clone(), [shape[0], shape[1]]), device)
}

fn params(c: &Case, prefix: &str, device: &Device) -> Dictionary {
    let get = |n: &str| tensor2(&c.t[&format!("{prefix}.{n}")], device);
    let row = |n: &str| get(n).squeeze_dim::<1>(0);
    Dictionary {
        w_enc: get("W_enc"),
        b_enc: row("b_enc"),
        w_dec: vec![get("W_dec")],
        b_dec: row("b_dec"),
        threshold: c.t.contains_key(&format!("{prefix}.threshold")).then(|| row("threshold")),
        w_skip: None,
        rule: architecture(&c.meta).rule(),
        subtract_b_dec: true,
    }
}

fn batch(c: &Case, step: usize, device: &Device) -> Tensor<2> {
    let s = &c.t["batches"];
    let (n, d) = (s.shape[1], s.shape[2]);
    Tensor::from_data(TensorData::new(s.f32[step * n * d..(step + 1) * n * d].to_vec(), [n, d]), device)
}

/// `max |got − want| / max |want|`.
fn rel(got: &Tensor<2>, want: &Tensor<2>) -> f32 {
    let g: Vec<f32> = got.to_data().try_into_vec_as::<f32>().unwrap();
    let w: Vec<f32> = want.to_data().try_into_vec_as::<f32>().unwrap();
    common::max_abs_diff(&g, &w) / common::max_abs(&w).max(1e-12)
}

fn assert_params(got: &Dictionary, want: &Dictionary, tol: f32, what: &str) {
    for ((name, g), (_, w)) in got.named().into_iter().zip(want.named()) {
        let r = rel(&g, &w);
        assert!(r <= tol, "{what}: {name} differs from sae-lens by {r:e} (relative), more than {tol:e}");
    }
}

/// Both of a step's paths: the host passes (the CPU's) and Burn's tensors (a GPU's), here
/// on the CPU backend.
const PATHS: [PassPath; 2] = [PassPath::Host, PassPath::Tensors];

#[test]
fn the_cpu_backend_takes_the_host_passes() {
    let cpu = burnlens::model::backend::device("flex", None).expect("flex");
    assert_eq!(PassPath::for_device(&cpu), PassPath::Host);
    assert_eq!(PassPath::for_device(&cpu.autodiff()), PassPath::Host);
}

#[test]
fn first_step_losses_and_gradients_equal_saelens() {
    let device = Device::default();
    for (name, path) in ARCHITECTURES.into_iter().flat_map(|a| PATHS.map(|p| (a, p))) {
        let c = case(name);
        let name = format!("{name} ({path:?})");
        let name = name.as_str();
        let trainer = SaeTrainer::new(architecture(&c.meta), trainer_config(&c.meta), params(&c, "init", &device)).on_path(path);
        let (grads, values) = trainer.gradients(Batch::sae(batch(&c, 0, &device))).expect("one process");
        assert_params(&grads, &params(&c, "grad", &device), 1e-5, &format!("{name} gradients"));
        let terms: Vec<&str> = c.meta["loss_terms"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
        let want = &c.t["losses"].f32[..terms.len()];
        let got: Vec<f32> = values.losses.iter().map(|(_, v)| *v as f32).chain([values.loss as f32]).collect();
        let names: Vec<&str> = values.losses.iter().map(|(t, _)| t.name()).chain(["loss"]).collect();
        assert_eq!(names, terms, "{name}: loss terms");
        for ((n, g), w) in names.iter().zip(&got).zip(want) {
            assert!((g - w).abs() <= 1e-5 * w.abs().max(1e-3), "{name} {n}: {g} vs sae-lens {w}");
        }
    }
}

#[test]
fn ten_steps_with_schedules_equal_saelens() {
    for path in PATHS {
        ten_steps_equal_saelens(&Device::default(), Some(path));
    }
}

/// Every architecture's ten steps on `device`, on `path` (`None`: the one the device picks),
/// against sae-lens's.
fn ten_steps_equal_saelens(device: &Device, path: Option<PassPath>) {
    for name in ARCHITECTURES {
        let c = case(name);
        let name = format!("{name} ({path:?} on {device:?})");
        let name = name.as_str();
        let steps = c.meta["steps"].as_u64().unwrap() as usize;
        let n_terms = c.meta["loss_terms"].as_array().unwrap().len();
        let mut trainer = SaeTrainer::new(architecture(&c.meta), trainer_config(&c.meta), params(&c, "init", device));
        if let Some(path) = path {
            trainer = trainer.on_path(path);
        }
        for s in 0..steps {
            let r = trainer.train_step(Batch::sae(batch(&c, s, device))).expect("one process");
            assert!((r.lr - c.t["lr"].f32[s] as f64).abs() < 1e-9, "{name} step {s}: lr {} vs {}", r.lr, c.t["lr"].f32[s]);
            assert!((r.coefficient - c.t["coefficient"].f32[s] as f64).abs() < 1e-7, "{name} step {s}: coefficient");
            let want = c.t["losses"].f32[s * n_terms + n_terms - 1];
            assert!((r.loss as f32 - want).abs() <= 1e-4 * want.abs(), "{name} step {s}: loss {} vs sae-lens {want}", r.loss);
            // Each term, by SAELens's name for it.
            assert_eq!(r.losses.len(), n_terms - 1, "{name} step {s}: terms {:?}", r.losses);
            for (i, term) in c.meta["loss_terms"].as_array().unwrap()[..n_terms - 1].iter().enumerate() {
                let got = r.losses.iter().find(|(t, _)| t.name() == term.as_str().unwrap()).unwrap_or_else(|| panic!("{name}: no {term}")).1;
                let want = c.t["losses"].f32[s * n_terms + i];
                assert!((got as f32 - want).abs() <= 1e-4 * want.abs() + 1e-7, "{name} step {s}: {term} {got} vs sae-lens {want}");
            }
            if s == 0 {
                assert_params(&trainer.params, &params(&c, "step1", device), 1e-5, &format!("{name} after one step"));
            }
        }
        assert_params(&trainer.params, &params(&c, "final", device), 1e-4, &format!("{name} after {steps} steps"));
        let since: Vec<u32> = c.t["n_forward_passes_since_fired"].f32.iter().map(|&v| v as u32).collect();
        assert_eq!(trainer.since_fired, since, "{name}: steps since each feature fired");
        if let Some(t) = c.meta["topk_threshold"].as_f64() {
            assert!((trainer.topk_threshold - t).abs() <= 1e-4 * t.abs(), "{name}: threshold {} vs {t}", trainer.topk_threshold);
        }
    }
}

/// The tensor path's report (its one read of the device) equals the host passes' step by
/// step: L0, the dead features, the loss and its terms.
#[test]
fn the_tensor_path_reports_what_the_host_passes_report() {
    let device = Device::default();
    for name in ARCHITECTURES {
        let c = case(name);
        let trainer = |path| SaeTrainer::new(architecture(&c.meta), trainer_config(&c.meta), params(&c, "init", &device)).on_path(path);
        let (mut host, mut tensors) = (trainer(PassPath::Host), trainer(PassPath::Tensors));
        for s in 0..c.meta["steps"].as_u64().unwrap() as usize {
            let a = host.train_step(Batch::sae(batch(&c, s, &device))).unwrap();
            let b = tensors.train_step(Batch::sae(batch(&c, s, &device))).unwrap();
            assert!(a.l0 > 0.0 && a.l0 == b.l0, "{name} step {s}: L0 {} on the host, {} on the tensors", a.l0, b.l0);
            assert_eq!(a.dead, b.dead, "{name} step {s}: dead features");
            assert!((a.loss - b.loss).abs() <= 1e-5 * a.loss.abs(), "{name} step {s}: loss {} vs {}", a.loss, b.loss);
            assert_eq!(a.losses.iter().map(|t| t.0).collect::<Vec<_>>(), b.losses.iter().map(|t| t.0).collect::<Vec<_>>(), "{name}: terms");
            for ((t, x), (_, y)) in a.losses.iter().zip(&b.losses) {
                assert!((x - y).abs() <= 1e-5 * x.abs() + 1e-7, "{name} step {s}: {t:?} {x} vs {y}");
            }
        }
        assert_eq!(host.since_fired, tensors.since_fired, "{name}: steps since each feature fired");
    }
}

/// On a GPU backend the trainer takes the tensor path by itself, and its steps still equal
/// sae-lens's: wgpu (with Mesa's lavapipe it runs on the CPU where there is no GPU; not in CI,
/// which does not build the feature), and cuda on an NVIDIA GPU (f32 products there run on
/// TF32 tensor cores unless burn is told otherwise: ~1e-3, beyond these bounds).
#[cfg(any(feature = "wgpu", feature = "cuda"))]
#[test]
fn on_a_gpu_backend_the_steps_take_the_tensor_path_and_equal_saelens() {
    for name in ["wgpu", "cuda"].into_iter().filter(|n| burnlens::model::backend::is_compiled(n)) {
        let device = burnlens::model::backend::device(name, None).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(PassPath::for_device(&device), PassPath::Tensors, "{name}");
        ten_steps_equal_saelens(&device, None);
    }
}

#[test]
fn a_fresh_sae_is_initialised_as_saelens_does() {
    let device = Device::default();
    let arch = Architecture::JumpRelu(JumpReluSettings::default());
    let p = burnlens::features::params::init(&arch, Shape::sae(16, 64), Some(0.1), &mut burnlens::model::Rng::new(1), &device);
    let norms: Vec<f32> = p.decoder().clone().square().sum_dim(1).sqrt().into_data().try_into_vec_as::<f32>().unwrap();
    assert!(norms.iter().all(|n| (n - 0.1).abs() < 1e-6), "decoder rows of norm 0.1: {norms:?}");
    assert_eq!(rel(&p.w_enc, &p.decoder().clone().transpose()), 0.0, "encoder = decoder transposed");
    let t: Vec<f32> = p.threshold.unwrap().into_data().try_into_vec_as::<f32>().unwrap();
    assert!(t.iter().all(|&v| v == 0.01));
    assert_eq!(p.b_dec.into_data().try_into_vec_as::<f32>().unwrap(), vec![0.0; 16]);
}
