//! burnlens's one-launch decoding attention on the GPU (`burnlens::model::gpu::decode_attention`)
//! against attention taken in f64, with the cache's strided views, grouped heads, local
//! windows and long caches split into ranges, and decoding through it against the CPU's full
//! forward pass; a prompt's flash attention (`gpu::flash_attention`) likewise, padded batches
//! too; on every GPU backend the build has (wgpu: Mesa's lavapipe where there is no GPU; cuda
//! on the lent GPU).
#![cfg(any(feature = "wgpu", feature = "cuda"))]

mod common;

use burn::tensor::{Bool, Device, Int, Tensor, TensorData};
use burnlens::hf::load_model;
use burnlens::model::{AttentionInput, Forward, Hooks, KvCache, LayerInput, gpu};
use common::{fixture, gpu_devices as devices, max_abs_diff, uniform};

/// One case: batch, query heads, key heads, new queries, keys, head width, window (0: none).
type Case = [usize; 7];

/// `z` `[batch, queries, heads, d_head]` in f64 for `q` `[b, h, t, dh]` and `k`, `v` `[b, hk,
/// s, dh]` (row-major), as the written-out attention computes it.
fn reference(case: Case, q: &[f32], k: &[f32], v: &[f32], scale: f64) -> Vec<f64> {
    let [b, h, hk, t, s, dh, window] = case;
    let mut z = vec![0.0; b * t * h * dh];
    for (bi, hi, i) in (0..b).flat_map(|bi| (0..h).flat_map(move |hi| (0..t).map(move |i| (bi, hi, i)))) {
        let kv = hi / (h / hk);
        let pos = s - t + i;
        let seen: Vec<usize> = (0..s).filter(|&j| j <= pos && (window == 0 || j + window > pos)).collect();
        let qr = &q[((bi * h + hi) * t + i) * dh..][..dh];
        let row = |m: &[f32], j: usize| m[((bi * hk + kv) * s + j) * dh..][..dh].to_vec();
        let scores: Vec<f64> = seen.iter().map(|&j| scale * qr.iter().zip(row(k, j)).map(|(a, b)| *a as f64 * b as f64).sum::<f64>()).collect();
        let top = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = scores.iter().map(|x| (x - top).exp()).sum();
        for (&j, x) in seen.iter().zip(&scores) {
            for (c, val) in row(v, j).iter().enumerate() {
                z[((bi * t + i) * h + hi) * dh + c] += (x - top).exp() / sum * *val as f64;
            }
        }
    }
    z
}

/// The kernel equals attention in f64: a decoded token, grouped heads, keys past one tile,
/// a local window with a head width that is no power of two, eight queries with the widest
/// heads; keys and values read as the cache hands them over (views of longer buffers), queries
/// as the projection's heads (a transposed view). The last three cases are long caches with
/// few queries (one, three; a window of 700 of 3,000 keys), which split the keys into ranges
/// on any device (two cubes a multiprocessor wanted, ranges of at least 512 keys).
#[test]
fn the_decoding_attention_equals_attention_in_f64() {
    let cases: [Case; 8] = [
        [1, 4, 4, 1, 37, 64, 0],
        [2, 6, 2, 3, 300, 32, 0],
        [1, 2, 1, 2, 600, 80, 16],
        [1, 1, 1, 8, 8, 256, 0],
        [2, 3, 3, 1, 513, 16, 100],
        [1, 2, 1, 1, 4096, 64, 0],
        [1, 1, 1, 3, 2000, 80, 0],
        [1, 2, 2, 2, 3000, 32, 700],
    ];
    for (name, device) in devices() {
        let split_before = gpu::decode_attention_split_calls();
        for (n, case) in cases.into_iter().enumerate() {
            let [b, h, hk, t, s, dh, window] = case;
            let scale = 1.0 / (dh as f64).sqrt();
            let what = format!("{name} {case:?}");
            let data = |len: usize, seed: u64| uniform(len, seed).iter().map(|x| x * 3.0).collect::<Vec<f32>>();
            let (q, k, v) = (data(b * h * t * dh, 10 + n as u64), data(b * hk * s * dh, 20 + n as u64), data(b * hk * s * dh, 30 + n as u64));
            // Queries stored [b, t, h, dh] and viewed [b, h, t, dh]; keys and values in buffers
            // longer than the keys seen, narrowed.
            let mut q_rows = vec![0.0; q.len()];
            for (bi, hi, i, c) in (0..b).flat_map(|bi| (0..h).flat_map(move |hi| (0..t).flat_map(move |i| (0..dh).map(move |c| (bi, hi, i, c))))) {
                q_rows[((bi * t + i) * h + hi) * dh + c] = q[((bi * h + hi) * t + i) * dh + c];
            }
            let qt = Tensor::<4>::from_data(TensorData::new(q_rows, [b, t, h, dh]), &device).swap_dims(1, 2);
            let buffer = |m: &[f32]| {
                let t = Tensor::<4>::from_data(TensorData::new(m.to_vec(), [b, hk, s, dh]), &device);
                Tensor::cat(vec![t, Tensor::zeros([b, hk, 7, dh], &device)], 2).narrow(2, 0, s)
            };
            let got: Vec<f32> = gpu::decode_attention(qt, buffer(&k), buffer(&v), scale as f32, s - t, window)
                .unwrap_or_else(|| panic!("{what}: the kernel runs"))
                .into_data()
                .try_into_vec_as::<f32>()
                .unwrap();
            let want = reference(case, &q, &k, &v, scale);
            let worst = got.iter().zip(&want).map(|(g, w)| (*g as f64 - w).abs()).fold(0.0, f64::max);
            assert!(worst <= 1e-5, "{what}: worst |Δz| {worst:e}");
        }
        let split = gpu::decode_attention_split_calls() - split_before;
        assert!(split >= 3, "{name}: the long caches split their keys ({split} calls split)");
        // Refused: tracked tensors, more queries than it takes.
        let x = || Tensor::<4>::zeros([1, 2, 2, 8], &device);
        assert!(gpu::decode_attention(x().autodiff(), x().autodiff(), x().autodiff(), 1.0, 0, 0).is_none(), "{name}: a tracked input");
        let many = Tensor::<4>::zeros([1, 2, 9, 8], &device);
        assert!(gpu::decode_attention(many, x(), x(), 1.0, 0, 0).is_none(), "{name}: nine queries");
    }
}

/// Decoding on the GPU through the kernel (a prefix of three tokens, then one at a time) gives
/// the CPU's full-pass logits, on fixtures with plain, grouped-query and local-window attention
/// (GPT-Neo's local layers, Mistral's window), and every layer of every step took the kernel.
#[test]
fn decoding_on_the_gpu_through_the_kernel_gives_the_full_pass_logits() {
    for (name, device) in devices() {
        for fixture_name in ["gpt2", "llama_gqa", "gpt_neo_local", "mistral_window"] {
            let cpu = load_model(&fixture(fixture_name), &Device::flex()).unwrap().model;
            let ids: Vec<i64> = (0..20).map(|i| (i * 37 % 128) as i64).collect();
            let full: Vec<f32> = cpu.forward(cpu.ids_tensor(&ids)).into_data().try_into_vec_as().unwrap();
            let model = load_model(&fixture(fixture_name), &device).unwrap().model;
            let before = gpu::decode_attention_calls();
            let mut cache = KvCache::new();
            let step = |ids: &[i64], cache: &mut KvCache| model.forward_cached(model.ids_tensor(ids), cache).into_data().try_into_vec_as::<f32>().unwrap();
            let mut got = step(&ids[..3], &mut cache);
            for i in 3..ids.len() {
                got.extend(step(&ids[i..i + 1], &mut cache));
            }
            let d = max_abs_diff(&got, &full);
            assert!(d <= 1e-4, "{name} {fixture_name}: decoded logits differ from the CPU's full pass by {d:e}");
            let launches = gpu::decode_attention_calls() - before;
            let want = model.config.n_layers() * (ids.len() - 2);
            assert!(launches >= want, "{name} {fixture_name}: {launches} launches of the kernel, {want} expected");
        }
    }
}

/// A prompt's causal attention through cubek's flash kernel (unit routine, f32) equals
/// attention in f64 — one tile of queries, several, heads 32 to 128 wide, a width of 80,
/// local windows of 16 and 128 keys read from the model's kind of mask;
/// queries, keys and values read as views of one projection —
/// and the kernel ran every time (cubek declined none); a scale other than `1/√d_head` and a
/// head width not a multiple of 8 are refused. The model-level parity suite runs every prompt
/// on the GPU through it.
#[test]
fn a_prompts_flash_attention_equals_attention_in_f64() {
    let cases: [Case; 6] = [
        [1, 2, 2, 37, 37, 64, 0],
        [2, 3, 3, 130, 130, 32, 0],
        [1, 1, 1, 300, 300, 128, 0],
        [1, 2, 2, 20, 20, 80, 0],
        [1, 2, 2, 100, 100, 32, 16],
        [2, 1, 1, 300, 300, 64, 128],
    ];
    for (name, device) in devices() {
        let (ran, declined) = gpu::flash_attention_calls();
        for (n, case) in cases.into_iter().enumerate() {
            let [b, h, _, t, _, dh, window] = case;
            let scale = 1.0 / (dh as f64).sqrt();
            let data = |seed: u64| uniform(b * h * t * dh, seed).iter().map(|x| x * 3.0).collect::<Vec<f32>>();
            let (q, k, v) = (data(40 + n as u64), data(50 + n as u64), data(60 + n as u64));
            // As the projection hands them over: one `[b, t, 3h, dh]` tensor, split and swapped.
            let heads = |m: &[f32]| Tensor::<4>::from_data(TensorData::new(m.to_vec(), [b, h, t, dh]), &device).swap_dims(1, 2);
            let qkv = Tensor::cat(vec![heads(&q), heads(&k), heads(&v)], 2);
            let part = |i: usize| qkv.clone().narrow(2, i * h, h).swap_dims(1, 2);
            // A window's mask as the model builds it: `[1, 1, t, t]`, true where a key is hidden.
            let hidden = (0..t * t).map(|n| (n % t) > n / t || (window > 0 && (n % t) + window <= n / t)).collect::<Vec<bool>>();
            let mask = (window > 0).then(|| Tensor::<4, Bool>::from_data(TensorData::new(hidden, [1, 1, t, t]), &device));
            let z =
                gpu::flash_attention(part(0), part(1), part(2), 1.0 / (dh as f32).sqrt(), mask).unwrap_or_else(|| panic!("{name} {case:?}: the kernel runs"));
            // Rows `[b, t, h, dh]`, as the reference's.
            assert_eq!(z.dims(), [b, t, h, dh], "{name} {case:?}");
            let got: Vec<f32> = z.into_data().try_into_vec_as::<f32>().unwrap();
            let want = reference(case, &q, &k, &v, scale);
            let worst = got.iter().zip(&want).map(|(g, w)| (*g as f64 - w).abs()).fold(0.0, f64::max);
            assert!(worst <= 1e-5, "{name} {case:?}: worst |Δz| {worst:e}");
        }
        let (ran, declined) = (gpu::flash_attention_calls().0 - ran, gpu::flash_attention_calls().1 - declined);
        assert!(ran >= cases.len() && declined == 0, "{name}: {ran} calls ran the kernel, {declined} were declined");
        let x = |dh: usize| Tensor::<4>::zeros([1, 2, 16, dh], &device);
        assert!(gpu::flash_attention(x(64), x(64), x(64), 0.2, None).is_none(), "{name}: a scale not 1/√64");
        assert!(gpu::flash_attention(x(20), x(20), x(20), 1.0 / 20f32.sqrt(), None).is_none(), "{name}: heads 20 wide");
        let short = Tensor::<4, Bool>::from_data(TensorData::new(vec![false; 15 * 16], [1, 1, 15, 16]), &device);
        assert!(gpu::flash_attention(x(64), x(64), x(64), 0.125, Some(short)).is_none(), "{name}: a mask of another shape");
    }
}

/// A prompt's forward pass on the GPU gives the CPU's logits with every layer's attention
/// through the flash kernel (plain and grouped-query heads, Mistral's window of 6 keys over
/// the 24-token prompt), and GPT-Neo's too, whose unscaled scores the kernel refuses (written
/// out).
#[test]
fn a_prompts_forward_through_the_flash_kernel_gives_the_cpus_logits() {
    for (name, device) in devices() {
        for (fixture_name, flash_layers) in [("gpt2", true), ("llama_gqa", true), ("mistral_window", true), ("gpt_neo_local", false)] {
            let cpu = load_model(&fixture(fixture_name), &Device::flex()).unwrap().model;
            let ids: Vec<i64> = (0..24).map(|i| (i * 29 % 128) as i64).collect();
            let want: Vec<f32> = cpu.forward(cpu.ids_tensor(&ids)).into_data().try_into_vec_as().unwrap();
            let model = load_model(&fixture(fixture_name), &device).unwrap().model;
            let before = gpu::flash_attention_calls().0;
            let got: Vec<f32> = model.forward(model.ids_tensor(&ids)).into_data().try_into_vec_as().unwrap();
            let d = max_abs_diff(&got, &want);
            assert!(d <= 1e-4, "{name} {fixture_name}: logits differ from the CPU's by {d:e}");
            // (Tests running beside this one count too: no exact count, and none for GPT-Neo.)
            let ran = gpu::flash_attention_calls().0 - before;
            let layers = model.config.n_layers();
            assert!(!flash_layers || ran >= layers, "{name} {fixture_name}: {ran} calls of the kernel, {layers} layers");
        }
    }
}

/// A left-padded batch (a 24-token row beside a 9-token one) through the flash kernel with
/// the padding's mask gives the CPU's padded logits at every position, the padding's own
/// included: queries before a row's first real token see no key, and the written-out
/// attention gives them an equal weight on every key (HF's finite mask value), which the
/// flash path puts back.
#[test]
fn a_padded_batch_through_the_flash_kernel_gives_the_cpus_logits() {
    let a: Vec<i64> = (0..24).map(|i| (i * 29 % 128) as i64).collect();
    let b: Vec<i64> = (0..9).map(|i| (i * 13 % 97 + 3) as i64).collect();
    let (t, pad) = (a.len(), a.len() - b.len());
    let ids: Vec<i64> = a.iter().copied().chain(std::iter::repeat_n(0, pad)).chain(b.iter().copied()).collect();
    let mask: Vec<Vec<bool>> = vec![vec![true; t], (0..t).map(|i| i >= pad).collect()];
    let logits = |device: &Device, name: &str| -> Vec<f32> {
        let model = load_model(&fixture(name), device).unwrap().model;
        let batch = Tensor::<2, Int>::from_data(TensorData::new(ids.clone(), [2, t]), device);
        model.forward_with(Forward::new(batch).padding(&mask)).into_data().try_into_vec_as().unwrap()
    };
    for (name, device) in devices() {
        for fixture_name in ["gpt2", "llama_gqa", "mistral_window"] {
            let want = logits(&Device::flex(), fixture_name);
            let before = gpu::flash_attention_calls().0;
            let got = logits(&device, fixture_name);
            let ran = gpu::flash_attention_calls().0 - before;
            assert!(got.iter().all(|x| x.is_finite()), "{name} {fixture_name}: non-finite logits");
            let d = max_abs_diff(&got, &want);
            assert!(d <= 1e-4, "{name} {fixture_name}: padded logits differ from the CPU's by {d:e}");
            let layers = load_model(&fixture(fixture_name), &Device::flex()).unwrap().model.config.n_layers();
            assert!(ran >= layers, "{name} {fixture_name}: {ran} calls of the kernel, {layers} layers");
        }
    }
}

/// A layer handed a padded mask alone (`LayerInput::new`, no list of the queries that see no
/// key: the layer finds them from the mask) gives the written-out attention's output at every
/// position, as the model's pass (which lists them once) does above.
#[test]
fn a_layer_given_only_a_padded_mask_finds_the_blind_queries_itself() {
    let (t, pad) = (16, 5);
    let [d, b] = [32, 2];
    // Row 0 full, row 1 left-padded by `pad`: causal, padding keys hidden.
    let hidden: Vec<bool> = (0..b).flat_map(|r| (0..t).flat_map(move |q| (0..t).map(move |k| k > q || (r == 1 && k < pad)))).collect();
    let x = uniform(b * t * d, 17);
    let out = |device: &Device| -> Vec<f32> {
        let model = load_model(&fixture("gpt2"), device).unwrap().model;
        assert_eq!(model.config.d_model, d, "the gpt2 fixture's width");
        let mask = Tensor::<4, Bool>::from_data(TensorData::new(hidden.clone(), [b, 1, t, t]), device);
        let x = Tensor::<3>::from_data(TensorData::new(x.clone(), [b, t, d]), device);
        let input = AttentionInput { x, qk_input: None, layer: LayerInput::new(mask, 0) };
        model.blocks[0].attn.forward(input, &mut Hooks::none()).into_data().try_into_vec_as().unwrap()
    };
    let want = out(&Device::flex());
    for (name, device) in devices() {
        let before = gpu::flash_attention_calls().0;
        let got = out(&device);
        assert!(gpu::flash_attention_calls().0 > before, "{name}: the flash kernel did not run");
        let diff = max_abs_diff(&got, &want);
        assert!(diff <= 1e-5, "{name}: the padded layer differs from the CPU's by {diff:e}");
    }
}
