//! burnlens's own GPU kernels (`burnlens::model::gpu`) against the host rules they replace,
//! on every GPU backend the build has: wgpu (Mesa's lavapipe runs them on the CPU where there
//! is no GPU; CI does not build the feature) and cuda (on the lent GPU, through
//! `scripts/device_check.sh`).
#![cfg(any(feature = "wgpu", feature = "cuda"))]

use burn::tensor::{Device, Tensor, TensorData};
use burnlens::lens::dictionary::select::{SelectRoute, kth_largest, kth_largest_rows};
use burnlens::model::gpu;

fn devices() -> Vec<(&'static str, Device)> {
    ["wgpu", "cuda"]
        .into_iter()
        .filter(|n| burnlens::model::backend::is_compiled(n))
        .map(|n| (n, burnlens::model::backend::device(n, None).unwrap_or_else(|e| panic!("{n}: {e}"))))
        .collect()
}

/// Values with everything an order has to get right: ties, both signs, both zeros, −∞ runs,
/// a few +∞, and spread magnitudes.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
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
