//! burnlens's own GPU kernels (`burnlens::model::gpu`) against the host rules they replace,
//! on every GPU backend the build has: wgpu (Mesa's lavapipe runs them on the CPU where there
//! is no GPU; CI does not build the feature) and cuda (on the lent GPU, through
//! `scripts/device_check.sh`).
#![cfg(any(feature = "wgpu", feature = "cuda"))]

mod common;

use burn::tensor::{Device, Tensor, TensorData};
use burnlens::lens::dictionary::select::{SelectRoute, kth_largest, kth_largest_rows};
use burnlens::model::gpu;
use common::{gpu_devices as devices, uniform, xorshift};

/// Values with everything an order has to get right: ties, both signs, both zeros, −∞ runs,
/// a few +∞, and spread magnitudes.
fn values(n: usize, seed: u64) -> Vec<f32> {
    xorshift(seed)
        .take(n)
        .enumerate()
        .map(|(i, s)| {
            match s % 23 {
                0 => f32::NEG_INFINITY,
                1 => 0.0,
                2 => -0.0,
                3 => ((s >> 8) % 5) as f32, // ties
                4 if i % 97 == 0 => f32::INFINITY,
                _ => ((s >> 11) as f32 / (1u64 << 53) as f32 - 0.5) * 10f32.powi(((s >> 3) % 9) as i32 - 4),
            }
        })
        .collect()
}

/// The host's answer per row (`f32::total_cmp`'s order).
fn host(v: &[f32], width: usize, k: usize) -> Vec<f32> {
    v.chunks(width).map(|r| kth_largest(&mut r.to_vec(), k)).collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn the_radix_selection_equals_the_host_selection_bit_for_bit() {
    // Rows narrower than a cube, rows spanning several (ragged last cube), and one long row
    // (BatchTopK's shape): k at both ends and between.
    let shapes: [(usize, usize, &[usize]); 4] =
        [(5, 7, &[1, 3, 7]), (37, 10_000, &[1, 32, 4_096, 9_999, 10_000]), (3, 4_096, &[64, 4_096]), (1, 300_000, &[1, 1_000, 131_072])];
    for (name, device) in devices() {
        for (seed, &(rows, width, ks)) in shapes.iter().enumerate() {
            let mut v = values(rows * width, seed as u64 + 1);
            // A row that is −∞ but for a few values (the auxiliary loss masks live features so).
            if rows > 1 {
                v[width..2 * width].iter_mut().skip(3).for_each(|x| *x = f32::NEG_INFINITY);
            }
            let x = Tensor::<2>::from_data(TensorData::new(v.clone(), [rows, width]), &device);
            for &k in ks {
                let want = host(&v, width, k);
                let got = gpu::kth_largest_rows(&x, k).unwrap_or_else(|| panic!("{name}: the kernel did not take [{rows}, {width}]"));
                let got: Vec<f32> = got.into_data().try_into_vec_as::<f32>().unwrap();
                assert_eq!(bits(&got), bits(&want), "{name} [{rows}, {width}] k {k}");
                // The selection the dictionaries call takes the kernel on this device.
                assert_eq!(SelectRoute::of(&x, k), SelectRoute::RadixKernel, "{name}");
                let via: Vec<f32> = kth_largest_rows(&x, k).into_data().try_into_vec_as::<f32>().unwrap();
                assert_eq!(bits(&via), bits(&want), "{name} [{rows}, {width}] k {k} through kth_largest_rows");
            }
        }
    }
}

/// Calls in a row on one matrix, alternating `k`: each answer read back is its own call's
/// (none read before its kernels ran, none left over from the call before).
#[test]
fn back_to_back_selections_each_read_their_own_answer() {
    let (rows, width) = (512, 24_576);
    let v = values(rows * width, 99);
    let want: Vec<Vec<u32>> = [1, 64].iter().map(|&k| bits(&host(&v, width, k))).collect();
    for (name, device) in devices() {
        let x = Tensor::<2>::from_data(TensorData::new(v.clone(), [rows, width]), &device);
        for i in 0..12 {
            let k = [1, 64][i % 2];
            let got: Vec<f32> = gpu::kth_largest_rows(&x, k).expect("the kernel runs").into_data().try_into_vec_as::<f32>().unwrap();
            assert_eq!(bits(&got), want[i % 2], "{name}: call {i}, k {k}");
        }
    }
}

#[test]
fn the_radix_selection_declines_what_it_does_not_handle() {
    for (name, device) in devices() {
        let x = Tensor::<2>::from_data(TensorData::new(vec![1.0f32, 2.0, 3.0], [1, 3]), &device);
        assert!(gpu::kth_largest_rows(&x, 0).is_none(), "{name}: k = 0");
        assert!(gpu::kth_largest_rows(&x, 4).is_none(), "{name}: k past the width");
        assert!(gpu::kth_largest_rows(&x.clone().autodiff(), 1).is_none(), "{name}: a tracked tensor");
    }
    let cpu = burnlens::model::backend::device("flex", None).expect("flex");
    let x = Tensor::<2>::from_data(TensorData::new(vec![1.0f32, 2.0, 3.0], [1, 3]), &cpu);
    assert!(gpu::kth_largest_rows(&x, 1).is_none(), "a host tensor keeps the host selection");
    assert_eq!(SelectRoute::of(&x, 1), SelectRoute::Host);
}

/// `a · b` per batch in f64, and `Σ |a||b|` per entry (the scale of its rounding error):
/// `a: [batch, m, k]`, `b: [batch, k, n]` row-major.
fn product_f64(a: &[f32], b: &[f32], [batch, m, k, n]: [usize; 4]) -> (Vec<f64>, Vec<f64>) {
    let (mut out, mut scale) = (vec![0.0f64; batch * m * n], vec![0.0f64; batch * m * n]);
    for z in 0..batch {
        for i in 0..m {
            for p in 0..k {
                let x = a[(z * m + i) * k + p] as f64;
                for j in 0..n {
                    let y = b[(z * k + p) * n + j] as f64;
                    out[(z * m + i) * n + j] += x * y;
                    scale[(z * m + i) * n + j] += (x * y).abs();
                }
            }
        }
    }
    (out, scale)
}

/// The worst error of `got` against `want`, relative to each entry's `Σ |a||b|`. f32
/// arithmetic stays near 1e-7 times `k`'s square root; TF32's 10-bit inputs give ~1e-4.
fn worst(got: &[f32], (want, scale): &(Vec<f64>, Vec<f64>)) -> f64 {
    got.iter().zip(want).zip(scale).map(|((g, w), s)| (*g as f64 - w).abs() / s.max(1e-30)).fold(0.0, f64::max)
}

fn read(t: Tensor<3>) -> Vec<f32> {
    t.into_data().try_into_vec_as::<f32>().unwrap()
}

/// One test, so that setting the compute dtype (process-wide) at its end races with nothing.
#[test]
fn the_exact_product_is_f32_arithmetic_forward_and_backward_and_tf32_is_asked_for() {
    use burnlens::model::kernels::{Compute, set_compute};
    use burnlens::model::matmul::{MatmulRoute, matmul};
    const TOL: f64 = 1e-5;
    // Odd sizes, a batch, a vector times a matrix and a matrix times a vector.
    let shapes = [[1, 37, 61, 29], [3, 17, 130, 9], [2, 64, 64, 64], [1, 1, 768, 300], [1, 300, 768, 1]];
    for (name, device) in devices() {
        for (seed, &[batch, m, k, n]) in shapes.iter().enumerate() {
            let (av, bv) = (uniform(batch * m * k, 2 * seed as u64 + 1), uniform(batch * k * n, 2 * seed as u64 + 2));
            let want = product_f64(&av, &bv, [batch, m, k, n]);
            let a = Tensor::<3>::from_data(TensorData::new(av.clone(), [batch, m, k]), &device);
            let b = Tensor::<3>::from_data(TensorData::new(bv.clone(), [batch, k, n]), &device);
            assert_eq!(MatmulRoute::of(&a, &b), MatmulRoute::ExactKernel, "{name}");
            let e = worst(&read(matmul(a.clone(), b.clone())), &want);
            assert!(e <= TOL, "{name} {batch}x{m}x{k}x{n}: worst error {e:e} of Σ|a||b|");
            // Transposed views, as the backward passes them.
            let at = Tensor::<3>::from_data(a.clone().swap_dims(1, 2).into_data(), &device).swap_dims(1, 2);
            let bt = Tensor::<3>::from_data(b.clone().swap_dims(1, 2).into_data(), &device).swap_dims(1, 2);
            let e = worst(&read(matmul(at, bt)), &want);
            assert!(e <= TOL, "{name} {batch}x{m}x{k}x{n} from transposed views: worst error {e:e}");

            // Backward of Σ (a·b) ⊙ w: dA = w bᵀ, dB = aᵀ w, each an exact product too.
            let wv = uniform(batch * m * n, 2 * seed as u64 + 3);
            let w = Tensor::<3>::from_data(TensorData::new(wv.clone(), [batch, m, n]), &device);
            let (ta, tb) = (a.clone().autodiff().require_grad(), b.clone().autodiff().require_grad());
            let grads = (matmul(ta.clone(), tb.clone()) * w.autodiff()).sum().backward();
            let (ga, gb) = (ta.grad(&grads).expect("dA"), tb.grad(&grads).expect("dB"));
            let transpose =
                |v: &[f32], [z, r, c]: [usize; 3]| -> Vec<f32> { (0..z * r * c).map(|i| v[(i / (r * c)) * r * c + (i % r) * c + (i % (r * c)) / r]).collect() };
            let want_da = product_f64(&wv, &transpose(&bv, [batch, k, n]), [batch, m, n, k]);
            let want_db = product_f64(&transpose(&av, [batch, m, k]), &wv, [batch, k, m, n]);
            let (ea, eb) = (worst(&read(ga), &want_da), worst(&read(gb), &want_db));
            assert!(ea <= TOL && eb <= TOL, "{name} {batch}x{m}x{k}x{n}: backward worst errors dA {ea:e}, dB {eb:e}");
        }
        // The model's products take it: a linear layer (leading dimensions folded) and the
        // composed attention, each equal to the host's.
        let cpu = burnlens::model::backend::device("flex", None).expect("flex");
        let on = |v: Vec<f32>, shape: Vec<usize>, d: &Device| Tensor::<3>::from_data(TensorData::new(v, shape), d);
        let (x, w) = (uniform(2 * 5 * 24, 11), uniform(24 * 7, 12));
        let before = gpu::exact_matmul_calls();
        let lin = |d: &Device| {
            let w = Tensor::<2>::from_data(TensorData::new(w.clone(), [24, 7]), d);
            read(burnlens::model::kernels::linear(on(x.clone(), vec![2, 5, 24], d), w, Some(Tensor::<1>::ones([7], d))))
        };
        let (got, want) = (lin(&device), lin(&cpu));
        assert!(gpu::exact_matmul_calls() > before, "{name}: linear took the exact kernel");
        assert!(got.iter().zip(&want).all(|(g, w)| (g - w).abs() <= 1e-5 * (1.0 + w.abs())), "{name}: linear differs from the host's");
        let qkv = uniform(3 * 2 * 4 * 9 * 8, 13);
        let attn = |d: &Device| {
            let t = |i: usize| Tensor::<4>::from_data(TensorData::new(qkv[i * 576..(i + 1) * 576].to_vec(), [2, 4, 9, 8]), d);
            let z = burnlens::model::kernels::attention_reference(t(0), t(1), t(2), 0.35, burnlens::model::kernels::AttentionMask::causal());
            z.into_data().try_into_vec_as::<f32>().unwrap()
        };
        let before = gpu::exact_matmul_calls();
        let (got, want) = (attn(&device), attn(&cpu));
        // At least: the count is the process's, and the suite's other tests run beside this one.
        assert!(gpu::exact_matmul_calls() >= before + 2, "{name}: attention's two products took the exact kernel");
        assert!(got.iter().zip(&want).all(|(g, w)| (g - w).abs() <= 1e-5 * (1.0 + w.abs())), "{name}: attention differs from the host's");
        // Broadcast leading dimensions are Burn's.
        let a = Tensor::<3>::from_data(TensorData::new(uniform(2 * 3 * 4, 7), [2, 3, 4]), &device);
        let b = Tensor::<3>::from_data(TensorData::new(uniform(4 * 5, 8), [1, 4, 5]), &device);
        assert_eq!(MatmulRoute::of(&a, &b), MatmulRoute::Burn, "{name}: broadcast");
    }
    let cpu = burnlens::model::backend::device("flex", None).expect("flex");
    let x = Tensor::<3>::from_data(TensorData::new(uniform(4, 9), [1, 2, 2]), &cpu);
    assert_eq!(MatmulRoute::of(&x, &x), MatmulRoute::Burn, "the host keeps its own products");
    set_compute(Compute::Tf32);
    for (name, device) in devices() {
        let x = Tensor::<3>::from_data(TensorData::new(uniform(4, 9), [1, 2, 2]), &device);
        assert_eq!(MatmulRoute::of(&x, &x), MatmulRoute::Burn, "{name}: --compute tf32 asks for Burn's products");
    }
    set_compute(Compute::F32);
}

/// Activations `[n, m]` with `k` non-zeros in most rows (features spread, values of both
/// signs), one row of `3k` (past the kernel's list: read whole) and one row of zeros.
fn sparse_acts(n: usize, m: usize, k: usize, seed: u64) -> Vec<f32> {
    let mut v = vec![0.0f32; n * m];
    let vals = uniform(n * 3 * k, seed);
    for r in 0..n {
        let count = match r % 7 {
            3 => 3 * k,
            5 => 0,
            _ => k,
        };
        for j in 0..count {
            let f = (r * 131 + j * 977 + j * j * 31) % m;
            v[r * m + f] = vals[r * 3 * k + j] * 4.0;
        }
    }
    v
}

#[test]
fn the_sparse_decode_is_the_product_and_its_gradients_are_exact_on_the_support() {
    const TOL: f64 = 1e-5;
    for (name, device) in devices() {
        for &(n, m, d, k) in &[(37, 1000, 70, 8), (9, 3000, 300, 32)] {
            let (av, wv, gv) = (sparse_acts(n, m, k, n as u64), uniform(m * d, 21), uniform(n * d, 22));
            let a = Tensor::<2>::from_data(TensorData::new(av.clone(), [n, m]), &device);
            let w = Tensor::<2>::from_data(TensorData::new(wv.clone(), [m, d]), &device);
            let want = product_f64(&av, &wv, [1, n, m, d]);
            let out = gpu::decode_sparse(a.clone(), w.clone(), k).expect("the kernels run");
            let e = worst(&out.into_data().try_into_vec_as::<f32>().unwrap(), &want);
            assert!(e <= TOL, "{name} {n}x{m}x{d} k {k}: worst error {e:e} of Σ|a||w|");

            let (ta, tw) = (a.clone().autodiff().require_grad(), w.clone().autodiff().require_grad());
            let g = Tensor::<2>::from_data(TensorData::new(gv.clone(), [n, d]), &device).autodiff();
            let out = gpu::decode_sparse(ta.clone(), tw.clone(), k).expect("the kernels run under autodiff");
            let grads = (out * g).sum().backward();
            let ga: Vec<f32> = ta.grad(&grads).expect("d acts").into_data().try_into_vec_as::<f32>().unwrap();
            let gw: Vec<f32> = tw.grad(&grads).expect("d W").into_data().try_into_vec_as::<f32>().unwrap();
            // d acts = g Wᵀ on the support, zero off it; d W = actsᵀ g.
            let wt: Vec<f32> = (0..d * m).map(|i| wv[(i % m) * d + i / m]).collect();
            let (full, scale) = product_f64(&gv, &wt, [1, n, d, m]);
            let on_support: (Vec<f64>, Vec<f64>) = (
                full.iter().zip(&av).map(|(x, a)| if *a != 0.0 { *x } else { 0.0 }).collect(),
                scale.iter().zip(&av).map(|(s, a)| if *a != 0.0 { *s } else { 1.0 }).collect(),
            );
            let e = worst(&ga, &on_support);
            assert!(e <= TOL, "{name} {n}x{m}x{d}: d acts worst error {e:e}");
            assert!(ga.iter().zip(&av).all(|(g, a)| *a != 0.0 || *g == 0.0), "{name}: d acts is zero off the support");
            let at: Vec<f32> = (0..m * n).map(|i| av[(i % n) * m + i / n]).collect();
            let e = worst(&gw, &product_f64(&at, &gv, [1, m, n, d]));
            assert!(e <= TOL, "{name} {n}x{m}x{d}: d W worst error {e:e}");
        }
        // Listed by a mask: values of zero inside it still get their gradient.
        let (n, m, d, k) = (37, 1000, 70, 8);
        let mask: Vec<f32> = sparse_acts(n, m, k, 41).iter().map(|v| (*v != 0.0) as u8 as f32).collect();
        let xv: Vec<f32> = uniform(n * m, 42).iter().enumerate().map(|(i, v)| if i % 3 == 0 { 0.0 } else { *v }).collect();
        let av: Vec<f32> = xv.iter().zip(&mask).map(|(x, s)| x * s).collect();
        let (wv, gv) = (uniform(m * d, 43), uniform(n * d, 44));
        let x = Tensor::<2>::from_data(TensorData::new(xv, [n, m]), &device).autodiff().require_grad();
        let s = Tensor::<2>::from_data(TensorData::new(mask.clone(), [n, m]), &device);
        let w = Tensor::<2>::from_data(TensorData::new(wv.clone(), [m, d]), &device).autodiff();
        let out = gpu::decode_sparse_on(x.clone() * s.clone().autodiff(), s, w, k).expect("the kernels run");
        let e = worst(&out.clone().inner().into_data().try_into_vec_as::<f32>().unwrap(), &product_f64(&av, &wv, [1, n, m, d]));
        assert!(e <= TOL, "{name}: masked decode worst error {e:e}");
        let g = Tensor::<2>::from_data(TensorData::new(gv.clone(), [n, d]), &device).autodiff();
        let gx: Vec<f32> = x.grad(&(out * g).sum().backward()).expect("dx").into_data().try_into_vec_as::<f32>().unwrap();
        let wt: Vec<f32> = (0..d * m).map(|i| wv[(i % m) * d + i / m]).collect();
        let (full, scale) = product_f64(&gv, &wt, [1, n, d, m]);
        let want = (full.iter().zip(&mask).map(|(x, s)| x * *s as f64).collect(), scale);
        let e = worst(&gx, &want);
        assert!(e <= TOL, "{name}: masked decode's input gradient worst error {e:e} (zeros inside the mask included)");

        let cpu = burnlens::model::backend::device("flex", None).expect("flex");
        let x = Tensor::<2>::from_data(TensorData::new(vec![1.0f32; 4], [2, 2]), &cpu);
        assert!(gpu::decode_sparse(x.clone(), x, 1).is_none(), "a host tensor keeps the dense product");
    }
}

#[test]
fn the_product_with_a_sparse_gradient_has_the_exact_gradients_of_any_gradient() {
    const TOL: f64 = 1e-5;
    for (name, device) in devices() {
        // The encoder's shape, small: a [n, k] · [k, m]; gradients of the output sparse (with
        // overflowing and empty rows) and dense.
        let (n, k, m, cap) = (37, 50, 1000, 8);
        let (av, bv) = (uniform(n * k, 31), uniform(k * m, 32));
        for (what, gv) in [("sparse", sparse_acts(n, m, cap, 33)), ("dense", uniform(n * m, 34))] {
            let a = Tensor::<2>::from_data(TensorData::new(av.clone(), [n, k]), &device).autodiff().require_grad();
            let b = Tensor::<2>::from_data(TensorData::new(bv.clone(), [k, m]), &device).autodiff().require_grad();
            let g = Tensor::<2>::from_data(TensorData::new(gv.clone(), [n, m]), &device).autodiff();
            let out = gpu::product_sparse_grad(a.clone(), b.clone(), cap).expect("the kernels run");
            let values: Vec<f32> = out.clone().inner().into_data().try_into_vec_as::<f32>().unwrap();
            let e = worst(&values, &product_f64(&av, &bv, [1, n, k, m]));
            assert!(e <= TOL, "{name}: forward worst error {e:e}");
            let grads = (out * g).sum().backward();
            let ga: Vec<f32> = a.grad(&grads).expect("dA").into_data().try_into_vec_as::<f32>().unwrap();
            let gb: Vec<f32> = b.grad(&grads).expect("dB").into_data().try_into_vec_as::<f32>().unwrap();
            let bt: Vec<f32> = (0..m * k).map(|i| bv[(i % k) * m + i / k]).collect();
            let at: Vec<f32> = (0..k * n).map(|i| av[(i % n) * k + i / n]).collect();
            let (ea, eb) = (worst(&ga, &product_f64(&gv, &bt, [1, n, m, k])), worst(&gb, &product_f64(&at, &gv, [1, k, n, m])));
            assert!(ea <= TOL && eb <= TOL, "{name}, {what} gradient: dA worst error {ea:e}, dB {eb:e}");
        }
    }
}

/// Batches of a mixing buffer held on `device` (`None`: the host) over passes of 7 rows of
/// width 3 pushed as tensors on `pass_device`, buffer 10, batches of 4, half kept.
fn mixed_batches(device: Option<Device>, pass_device: &Device) -> Vec<f32> {
    use burnlens::features::{MixingBuffer, Rows};
    let mut b = MixingBuffer::new(10, 4, 0.5, 3, 11, device).unwrap();
    let mut out = Vec::new();
    for pass in 0..6 {
        let rows: Vec<f32> = (pass * 21..pass * 21 + 21).map(|v| v as f32).collect();
        b.push(Rows::Device(Tensor::<2>::from_data(TensorData::new(rows, [7, 3]), pass_device)));
        while let Some(r) = b.pop() {
            out.extend(r.to_host());
        }
    }
    b.finish();
    while let Some(r) = b.pop() {
        out.extend(r.to_host());
    }
    out
}

#[test]
fn the_mixing_buffer_on_a_gpu_serves_the_host_buffers_batches() {
    let want = mixed_batches(None, &Device::default());
    for (name, device) in devices() {
        assert_eq!(mixed_batches(Some(device.clone()), &device), want, "{name}");
    }
}

/// Each row's non-zeros listed (rows empty, full, and sparse), the same values as the host
/// finds (the kernel's order is its units', not the columns').
#[test]
fn the_row_listing_lists_each_rows_non_zeros_in_order() {
    let (rows, width) = (37, 1000);
    let v: Vec<f32> = xorshift(5)
        .take(rows * width)
        .enumerate()
        .map(|(i, s)| match (i / width, s % 7) {
            (3, _) => 0.0,
            (4, _) => 1.0 + (s % 100) as f32,
            (_, 0) => (s % 1000) as f32 / 7.0 + 0.5,
            _ => 0.0,
        })
        .collect();
    let want: Vec<Vec<f32>> = v.chunks(width).map(|r| r.iter().copied().filter(|&x| x != 0.0).collect()).collect();
    let cap = want.iter().map(Vec::len).max().unwrap();
    assert_eq!(cap, width, "row 4 is full");
    for (name, device) in devices() {
        let x = Tensor::<2>::from_data(TensorData::new(v.clone(), [rows, width]), &device);
        let listed: Vec<f32> = gpu::row_values(&x, cap).unwrap_or_else(|| panic!("{name}: the kernel runs")).into_data().try_into_vec_as::<f32>().unwrap();
        let sorted = |v: &[f32]| {
            let mut v = v.to_vec();
            v.sort_by(f32::total_cmp);
            v
        };
        for (r, w) in want.iter().enumerate() {
            assert_eq!(sorted(&listed[r * cap..r * cap + w.len()]), sorted(w), "{name}: row {r}");
        }
        assert!(gpu::row_values(&x.clone().autodiff(), cap).is_none(), "{name}: a tracked tensor is refused");
    }
}

/// The dashboards' passes on the device (the first's reductions and the columns it reads
/// back; the second's comparisons against each feature's bin thresholds and quantile
/// boundaries, and the columns whose samples take) leave the state of the host's passes.
#[test]
fn the_dashboards_passes_on_a_gpu_leave_the_host_passes_state() {
    use burnlens::dashboards::DashboardConfig;
    use burnlens::dashboards::device_batch::{DeviceBatch, read_back};
    use burnlens::dashboards::scan::Scan;
    let cfg = DashboardConfig { ignore_tokens: vec![7], ignore_positions: vec![2], top_k: 4, quantile_size: 3, ..DashboardConfig::default() };
    let (n, seq_len, windows) = (300, 16, 8);
    let rows = windows * seq_len;
    // Mostly zeros, ties at 0, 1 and 2 (the groups' order among equals), values on the
    // quantile boundaries (every feature's maximum is 100), negatives.
    let batches: Vec<(Vec<Vec<u32>>, Vec<f32>)> = (0..5u64)
        .map(|batch| {
            let tokens = (0..windows as u32).map(|w| (0..seq_len as u32).map(|p| (p * 5 + w + batch as u32) % 11).collect()).collect();
            let a = xorshift(batch + 1)
                .take(rows * n)
                .map(|s| match s % 10 {
                    0..=4 => 0.0,
                    5 => ((s >> 20) % 11) as f32 * 10.0,
                    6 => ((s >> 20) % 3) as f32,
                    7 => -1.5,
                    _ => ((s >> 20) % 100_000) as f32 / 1000.0,
                })
                .collect();
            (tokens, a)
        })
        .collect();
    for (name, device) in devices() {
        let (mut host, mut dev) = (Scan::new(cfg.clone(), (0..n).collect(), seq_len), Scan::new(cfg.clone(), (0..n).collect(), seq_len));
        for pass in 1..=2 {
            let targets = (pass == 2).then(|| dev.second_targets(&device));
            let cpu_targets = (pass == 2).then(|| dev.second_targets(&Device::flex()));
            for (i, (tokens, a)) in batches.iter().enumerate() {
                let first = (i * windows) as u64;
                let mut b = read_back(Tensor::<2>::from_data(TensorData::new(a.clone(), [rows, n]), &Device::flex()), tokens, first).unwrap();
                b.mask(&cfg);
                let on = DeviceBatch::new(Tensor::<2>::from_data(TensorData::new(a.clone(), [rows, n]), &device), tokens, first, &cfg);
                let done = match &targets {
                    None => {
                        host.first(&b);
                        dev.first_on_device(&on)
                    }
                    Some(t) => {
                        host.second(&b);
                        // The counts are burnlens's kernel's on a GPU backend, and equal the
                        // composed operations' on the CPU backend.
                        let kernel = on.bin_counts(t, cfg.centre_range(seq_len)).unwrap();
                        let on_cpu = DeviceBatch::new(Tensor::<2>::from_data(TensorData::new(a.clone(), [rows, n]), &Device::flex()), tokens, first, &cfg);
                        let composed = on_cpu.bin_counts(cpu_targets.as_ref().unwrap(), cfg.centre_range(seq_len)).unwrap();
                        assert!(kernel.by_kernel && !composed.by_kernel, "{name}");
                        assert_eq!(kernel.all(), composed.all(), "{name}: batch {i}");
                        assert!(kernel.all().iter().filter(|&&c| c > 0).count() > n * 10, "{name}: most bins and intervals count something");
                        dev.second_on_device(&on, t)
                    }
                };
                done.unwrap_or_else(|e| panic!("{name}: {e}"));
            }
            // Debug prints every float exactly (and ±∞ apart).
            let state = |s: &Scan| format!("{:?} {:?} {:?}", s.first, s.second, s.positions);
            assert_eq!(state(&dev), state(&host), "{name}: after pass {pass}");
            if pass == 1 {
                assert!(host.first.iter().all(|p| p.top.len.iter().all(|&l| l == 4)), "the top groups fill");
                host.start_second();
                dev.start_second();
            }
        }
    }
}
