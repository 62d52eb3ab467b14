//! burnlens's one-launch row kernels on the GPU (`burnlens::model::gpu`: LayerNorm and
//! RMSNorm, softmax, attention's pattern, the sigmoid-gated activations) against the same functions in f64, and
//! their backward kernels against Burn's autodiff of the composed ops, on every GPU backend the
//! build has (wgpu: Mesa's lavapipe where there is no GPU; cuda on the lent GPU).
#![cfg(any(feature = "wgpu", feature = "cuda"))]

mod common;

use burn::tensor::{Device, Tensor, TensorData};
use burnlens::model::gpu;
use common::{gpu_devices as devices, uniform};

/// LayerNorm and RMSNorm in one launch equal the norms taken in f64 within f32 rounding: rows
/// narrower and wider than a cube, a rank-3 input, and more rows than the grid holds (a cube
/// takes several); an input tracked while its weight is not is refused, as is a weight of the
/// wrong length.
#[test]
fn the_row_norms_equal_the_norms_in_f64() {
    let eps = 1e-5;
    for (name, device) in devices() {
        for (i, &(rows, d)) in [(1, 1), (5, 7), (3, 256), (9, 300), (4, 1000), (65_537, 3)].iter().enumerate() {
            // Off-centre values (a mean to take off) with spread magnitudes.
            let x: Vec<f32> = uniform(rows * d, 40 + i as u64).iter().enumerate().map(|(j, v)| 3.0 + v * (1 + j % 5) as f32).collect();
            let (w, b) = (uniform(d, 50 + i as u64), uniform(d, 60 + i as u64));
            let tensor = |v: &[f32]| Tensor::<1>::from_data(TensorData::new(v.to_vec(), [v.len()]), &device);
            let xt = Tensor::<3>::from_data(TensorData::new(x.clone(), [rows, 1, d]), &device);
            for center in [true, false] {
                let got: Vec<f32> = gpu::row_norm(xt.clone(), tensor(&w), center.then(|| tensor(&b)), eps)
                    .unwrap_or_else(|| panic!("{name}: the kernel runs"))
                    .into_data()
                    .try_into_vec_as::<f32>()
                    .unwrap();
                for (r, (xr, gr)) in x.chunks(d).zip(got.chunks(d)).enumerate() {
                    let mean = if center { xr.iter().map(|&v| v as f64).sum::<f64>() / d as f64 } else { 0.0 };
                    let var = xr.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / d as f64;
                    let rstd = 1.0 / (var + eps).sqrt();
                    for j in 0..d {
                        let want = (xr[j] as f64 - mean) * rstd * w[j] as f64 + if center { b[j] as f64 } else { 0.0 };
                        assert!((gr[j] as f64 - want).abs() <= 2e-5 * (1.0 + want.abs()), "{name} {rows}x{d} center={center} [{r}, {j}]: {} vs {want}", gr[j]);
                    }
                }
            }
            assert!(!gpu::row_norm_runs(&xt.clone().autodiff(), &[&tensor(&w)]), "{name}: an input tracked with a weight that is not is refused");
            assert!(!gpu::row_norm_runs(&xt, &[&tensor(&w[..d - 1])]), "{name}: a weight of {} for rows of {d} is refused", d - 1);
        }
    }
}

/// Softmax in one launch equals the f64 softmax: rows narrower and wider than a cube, masked
/// scores (−1e30 and −∞) giving 0, a row of only −∞ giving the uniform row (as the composed
/// ops do), more rows than the grid holds; a tracked input runs too.
#[test]
fn the_row_softmax_equals_the_softmax_in_f64() {
    for (name, device) in devices() {
        for (i, &(rows, d)) in [(1, 1), (6, 5), (4, 300), (3, 1000), (65_537, 2)].iter().enumerate() {
            let mut x: Vec<f32> = uniform(rows * d, 70 + i as u64).iter().map(|v| v * 30.0).collect();
            for (j, v) in x.iter_mut().enumerate() {
                match (j / d, j % 3) {
                    (1, _) => *v = f32::NEG_INFINITY,
                    (2, 0) if j % d != 0 => *v = -1e30,
                    (3, 1) => *v = f32::NEG_INFINITY,
                    _ => {}
                }
            }
            let xt = Tensor::<2>::from_data(TensorData::new(x.clone(), [rows, d]), &device);
            let got: Vec<f32> = gpu::softmax(xt.clone()).unwrap_or_else(|| panic!("{name}: the kernel runs")).into_data().try_into_vec_as::<f32>().unwrap();
            for (r, (xr, gr)) in x.chunks(d).zip(got.chunks(d)).enumerate() {
                let top = xr.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
                let e: Vec<f64> = xr.iter().map(|&v| if top == f64::NEG_INFINITY { 1.0 } else { (v as f64 - top).exp() }).collect();
                let sum: f64 = e.iter().sum();
                for (j, (&g, &e)) in gr.iter().zip(&e).enumerate() {
                    let want = e / sum;
                    assert!((g as f64 - want).abs() <= 1e-6, "{name} {rows}x{d} [{r}, {j}]: {g} vs {want}");
                }
            }
            assert!(gpu::softmax_runs(&xt.autodiff()), "{name}: a tracked input runs (its backward is the kernel's)");
        }
    }
}

/// The gated activations in one launch equal `x σ(αx + βx³)` in f64, for GELU's and SiLU's
/// coefficients, over values from −20 to 20 and more elements than one pass of the grid
/// covers; a host tensor is left to the host.
#[test]
fn the_gated_activation_equals_the_formula_in_f64() {
    let gelu = burnlens::model::kernels::activation::gate_coefficients(burnlens::model::config::ActivationFn::GeluNew).unwrap();
    for (name, device) in devices() {
        for (n, (alpha, beta)) in [(1000, gelu), (17_000_000, gelu), (4099, (1.0, 0.0))] {
            let x: Vec<f32> = uniform(n, n as u64).iter().map(|v| v * 20.0).collect();
            let xt = Tensor::<1>::from_data(TensorData::new(x.clone(), [n]), &device);
            let got: Vec<f32> =
                gpu::gated_activation(xt, alpha, beta).unwrap_or_else(|| panic!("{name}: the kernel runs")).into_data().try_into_vec_as::<f32>().unwrap();
            for (j, (&v, &g)) in x.iter().zip(&got).enumerate() {
                let z = (alpha as f64 + beta as f64 * (v as f64).powi(2)) * v as f64;
                let want = v as f64 / (1.0 + (-z).exp());
                assert!((g as f64 - want).abs() <= 1e-5 * (1.0 + want.abs()), "{name} n={n} α={alpha} [{j}]: {g} vs {want} at {v}");
            }
        }
        let host = Tensor::<1>::from_data(TensorData::new(vec![1.0f32; 4], [4]), &Device::flex());
        assert!(!gpu::gated_activation_runs(&host) && !gpu::softmax_runs(&host), "a host tensor keeps the host's kernels");
    }
}

/// Under autodiff the one-launch norms, softmax and activation give the composed ops' values
/// and gradients (input, weight, bias) on the same device: their own backward kernels against
/// Burn's autodiff of the composed ops, over rows in several of the weight's chunks.
#[test]
fn the_one_launch_kernels_gradients_equal_the_composed_ops_gradients() {
    use burnlens::model::kernels::{activation, layer_norm as ln, softmax};
    let close = |what: &str, got: Tensor<3>, want: Tensor<3>| {
        let (g, w) = (got.into_data().try_into_vec_as::<f32>().unwrap(), want.into_data().try_into_vec_as::<f32>().unwrap());
        let scale = w.iter().fold(1e-3f32, |m, v| m.max(v.abs()));
        let worst = g.iter().zip(&w).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(worst <= 1e-4 * scale, "{what}: worst |Δ| {worst:e} of {scale:e}");
    };
    for (name, device) in devices() {
        for (i, &[b, t, d]) in [[7, 10, 300], [4, 50, 1000], [3, 1, 5]].iter().enumerate() {
            let seed = 80 + 10 * i as u64;
            let data = |n: usize, s: u64, scale: f32, shift: f32| uniform(n, s).iter().map(|v| shift + v * scale).collect::<Vec<f32>>();
            let x3 = || Tensor::<3>::from_data(TensorData::new(data(b * t * d, seed, 2.0, 1.0), [b, t, d]), &device).autodiff().require_grad();
            let p1 = |s: u64, shift: f32| Tensor::<1>::from_data(TensorData::new(data(d, s, 0.5, shift), [d]), &device).autodiff().require_grad();
            let g = Tensor::<3>::from_data(TensorData::new(data(b * t * d, seed + 1, 1.0, 0.0), [b, t, d]), &device).autodiff();
            let what = |k: &str| format!("{name} {b}x{t}x{d} {k}");
            // LayerNorm and RMSNorm: every gradient.
            for center in [true, false] {
                let run = |kernel: bool| {
                    let (x, w, bias) = (x3(), p1(seed + 2, 1.0), p1(seed + 3, 0.0));
                    let y = match (center, kernel) {
                        (true, true) => ln::layer_norm(x.clone(), w.clone(), bias.clone(), 1e-5),
                        (true, false) => ln::layer_norm_reference(x.clone(), w.clone(), bias.clone(), 1e-5),
                        (false, true) => ln::rms_norm(x.clone(), w.clone(), 1e-5),
                        (false, false) => ln::rms_norm_reference(x.clone(), w.clone(), 1e-5),
                    };
                    let grads = (y.clone() * g.clone()).sum().backward();
                    let gw = w.grad(&grads).expect("dw").reshape([1, 1, d]);
                    let gb = center.then(|| bias.grad(&grads).expect("db").reshape([1, 1, d]));
                    (y.inner(), x.grad(&grads).expect("dx"), gw, gb)
                };
                assert!(burnlens::model::gpu::row_norm_runs(&x3(), &[&p1(1, 0.0)]), "{name}: the norm's kernel takes tracked tensors");
                let (k, r) = (run(true), run(false));
                let norm = if center { "LayerNorm" } else { "RMSNorm" };
                close(&what(&format!("{norm} y")), k.0, r.0);
                close(&what(&format!("{norm} dx")), k.1, r.1);
                close(&what(&format!("{norm} dw")), k.2, r.2);
                if let (Some(a), Some(b)) = (k.3, r.3) {
                    close(&what("LayerNorm db"), a, b);
                }
            }
            // Softmax (masked scores included) and the gated activation: the input's gradient.
            let masked = |x: Tensor<3>| x.clone().mask_fill(x.lower_elem(0.0), -1e30);
            for op in ["softmax", "gelu_new"] {
                let run = |kernel: bool| {
                    let x = x3();
                    let (alpha, beta) = activation::gate_coefficients(burnlens::model::config::ActivationFn::GeluNew).unwrap();
                    let y = match (op, kernel) {
                        ("softmax", true) => softmax::softmax(masked(x.clone())),
                        ("softmax", false) => softmax::softmax_reference(masked(x.clone())),
                        (_, true) => activation::gated_activation(x.clone(), alpha, beta),
                        (_, false) => activation::gated_activation_reference(x.clone(), alpha, beta),
                    };
                    let grads = (y.clone() * g.clone()).sum().backward();
                    (y.inner(), x.grad(&grads).expect("dx"))
                };
                let (k, r) = (run(true), run(false));
                close(&what(&format!("{op} y")), k.0, r.0);
                close(&what(&format!("{op} dx")), k.1, r.1);
            }
        }
    }
}

/// Attention's pattern in one launch (scale and causal or local-window mask applied as the
/// scores are read) equals the softmax of the scaled visible scores in f64, 0 elsewhere: a
/// prefill, a decoded token over a cache, rows wider than a cube, a window; and under
/// autodiff its values and the scores' gradient equal the composed ops' (scale, mask fill,
/// softmax).
#[test]
fn the_attention_pattern_equals_the_masked_softmax_in_f64() {
    use burnlens::model::kernels::softmax;
    for (name, device) in devices() {
        for (i, &[b, h, t, s, window]) in [[2, 3, 9, 9, 0], [1, 2, 1, 37, 0], [1, 2, 5, 300, 0], [2, 1, 6, 20, 4], [1, 1, 40, 40, 7]].iter().enumerate() {
            let (offset, scale) = (s - t, 0.125f32);
            let x: Vec<f32> = uniform(b * h * t * s, 200 + i as u64).iter().map(|v| v * 40.0).collect();
            let xt = || Tensor::<4>::from_data(TensorData::new(x.clone(), [b, h, t, s]), &device);
            let sees = |q: usize, k: usize| k <= offset + q && (window == 0 || k + window > offset + q);
            let what = format!("{name} {b}x{h}x{t}x{s} window {window}");
            let got: Vec<f32> = gpu::attention_pattern(xt(), scale, offset, window)
                .unwrap_or_else(|| panic!("{what}: the kernel runs"))
                .into_data()
                .try_into_vec_as::<f32>()
                .unwrap();
            for (r, (xr, gr)) in x.chunks(s).zip(got.chunks(s)).enumerate() {
                let q = r % t;
                let top = (0..s).filter(|&k| sees(q, k)).fold(f64::NEG_INFINITY, |m, k| m.max(scale as f64 * xr[k] as f64));
                let sum: f64 = (0..s).filter(|&k| sees(q, k)).map(|k| (scale as f64 * xr[k] as f64 - top).exp()).sum();
                for k in 0..s {
                    let want = if sees(q, k) { (scale as f64 * xr[k] as f64 - top).exp() / sum } else { 0.0 };
                    assert!((gr[k] as f64 - want).abs() <= 1e-6, "{what} [{r}, {k}]: {} vs {want}", gr[k]);
                }
            }
            // Tracked: the composed ops' values and gradient.
            let g = Tensor::<4>::from_data(TensorData::new(uniform(b * h * t * s, 300 + i as u64), [b, h, t, s]), &device).autodiff();
            let hidden: Vec<bool> = (0..t * s).map(|j| !sees(j / s, j % s)).collect();
            let mask = Tensor::<4, burn::tensor::Bool>::from_data(TensorData::new(hidden, [1, 1, t, s]), &device.clone().autodiff());
            let run = |kernel: bool| {
                let x = xt().autodiff().require_grad();
                let y = if kernel {
                    gpu::attention_pattern(x.clone(), scale, offset, window).expect("a tracked input runs")
                } else {
                    softmax::softmax_reference((x.clone() * scale).mask_fill(mask.clone().expand([b, h, t, s]), f32::MIN))
                };
                let grads = (y.clone() * g.clone()).sum().backward();
                (y.inner().into_data().try_into_vec_as::<f32>().unwrap(), x.grad(&grads).expect("dx").into_data().try_into_vec_as::<f32>().unwrap())
            };
            let (k, r) = (run(true), run(false));
            for (part, got, want) in [("y", &k.0, &r.0), ("dx", &k.1, &r.1)] {
                let top = want.iter().fold(1e-3f32, |m, v| m.max(v.abs()));
                let worst = got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
                assert!(worst <= 1e-5 * top, "{what} {part}: worst |Δ| {worst:e} of {top:e}");
            }
        }
    }
}
