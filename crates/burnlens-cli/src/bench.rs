//! `burnlens bench WORKLOAD`: one benchmark workload, timed, printed as one JSON line. The
//! orchestration (PyTorch peers, alternation, medians, ratios) is `cargo xtask bench`.

use std::time::Instant;

use anyhow::Result;
use burn::tensor::{Device, Distribution, Int, Tensor, TensorData};
use burnlens_hf::{LoadOptions, load_model_with};
use burnlens_model::{
    AttentionInput, BlockHook, Hooks, KvCache, LayerHook, LayerInput, Rng, Sampling, Transformer, TransformerConfig, cross_entropy, generate,
};
use burnlens_train::config::TrainingSection;
use burnlens_train::optim::{clip_global_norm, optimizer};
use serde_json::json;

use burnlens_model::kernels::bench::timed;

use crate::UserError;

/// Which workload and its sizes.
#[derive(clap::Args, Clone)]
pub struct BenchArgs {
    /// forward | generate | train | load | scale | attention | gemm | matmul | select | machine
    pub workload: String,
    /// Model directory (forward, generate, load, scale).
    #[arg(long)]
    pub model: Option<std::path::PathBuf>,
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    #[arg(long, default_value_t = 128)]
    pub seq: usize,
    /// Timed repetitions (after one warm-up).
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// generate: new tokens after the prompt.
    #[arg(long, default_value_t = 64)]
    pub new_tokens: usize,
    /// generate: the prompt's tokens (a long one times decoding over a long cache).
    #[arg(long, default_value_t = 16)]
    pub prompt: usize,
    /// gemm, matmul: the product's shape `MxKxN`; (gemm) a trailing `t` reads the `[K, N]` operand through a
    /// transposed view of an `[N, K]` matrix (the tied unembedding's layout).
    #[arg(long)]
    pub shape: Option<String>,
    /// gemm with a half `--dtype`: multiply one copy of the weight every time, so that it
    /// is read from the cache (by default each product reads a different copy, 256 MB in
    /// all, from memory as a decoding step does).
    #[arg(long)]
    pub in_cache: bool,
    /// gemm with a half `--dtype`: multiply the decoding panels made from each copy
    /// (`kernels::half_panels`, what decoding reads, and prefill too on AVX2 CPUs without
    /// AVX-512, through `kernels::half_panels_prefill`), not the weight as stored.
    #[arg(long)]
    pub panels: bool,
    /// train: the model and batch trained (the PyTorch peer has the same three).
    #[arg(long, value_enum, default_value_t = TrainShape::Cpu)]
    pub train_shape: TrainShape,
    /// select: the `k`-th largest of each row of a `--shape ROWSxWIDTH` matrix (TopK's
    /// choice at `k`; BatchTopK's is one row of the whole batch at `k · rows`).
    #[arg(long, default_value_t = 64)]
    pub k: usize,
    /// select: the route timed, `chosen` (what the trainer takes on this device) or
    /// `bisection` (the composed-ops route a GPU without burnlens's kernel takes).
    #[arg(long, default_value = "chosen")]
    pub route: String,
}

/// What `bench train` trains, on random tokens: nanoGPT's sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TrainShape {
    /// nanoGPT's CPU shakespeare-char settings: 4 layers, 4 heads, d 128, context 64, batch 12.
    Cpu,
    /// nanoGPT's `train_shakespeare_char`: 6 layers, 6 heads, d 384, context 256, batch 8.
    ShakespeareChar,
    /// GPT-2 small (12 layers, d 768, vocabulary 50,257) at context 256, batch 1.
    Gpt2,
}

impl TrainShape {
    /// The architecture (dropout off), the batch, and how many steps one repetition times.
    fn setup(self) -> (TransformerConfig, usize, usize) {
        let (cfg, batch, steps) = match self {
            TrainShape::Cpu => (TransformerConfig::gpt2_like(65, 64, 128, 4, 4), 12, 10),
            TrainShape::ShakespeareChar => (TransformerConfig::gpt2_like(65, 256, 384, 6, 6), 8, 3),
            TrainShape::Gpt2 => (TransformerConfig::gpt2_like(50257, 256, 768, 12, 12), 1, 2),
        };
        (TransformerConfig { dropout: 0.0, ..cfg }, batch, steps)
    }
}

/// Minor page faults of this process so far (Linux `/proc/self/stat`, field 10).
fn minor_faults() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) may hold spaces; count fields after its closing parenthesis.
    stat.rsplit_once(')')?.1.split_whitespace().nth(7)?.parse().ok()
}

/// Peak resident memory of this process so far, in bytes (Linux `VmHWM`).
pub fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kb| kb * 1024)
}

/// `f`'s result and the minor page faults it took (none where they cannot be read).
fn faults_during<T>(f: &mut impl FnMut() -> T) -> (T, Option<u64>) {
    let before = minor_faults();
    let out = f();
    (out, minor_faults().zip(before).map(|(after, before)| after - before))
}

/// Bytes of weights a decoding step reads: every projection and the unembedding
/// ([`TransformerConfig::product_weights`]) at the model's weight dtype.
pub fn weight_bytes_per_token(m: &Transformer) -> Result<f64> {
    Ok(m.weight_dtype().size() as f64 * m.config.product_weights()? as f64)
}

/// Resident memory of this process now, in bytes (Linux `VmRSS`: mapped file pages
/// included).
fn rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kb| kb * 1024)
}

/// Bytes of the weight files in `dir` (safetensors shards or a `.bin`).
fn checkpoint_bytes(dir: &std::path::Path) -> Result<u64> {
    let weights = |n: &str| n.ends_with(".safetensors") || n.ends_with(".bin");
    Ok(std::fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .filter(|e| weights(&e.file_name().to_string_lossy()))
        .map(|e| e.metadata().map(|m| m.len()).unwrap_or(0))
        .sum())
}

/// A large model end to end in one process: load, a `seq`-token forward (twice: the first
/// faults the weights in), a cache of every `hook_resid_post`, and `new_tokens` greedy
/// decoding steps after it, each timed once (each takes seconds), with the resident memory
/// after loading and at the end.
fn scale(a: &BenchArgs, device: &Device, options: &LoadOptions) -> Result<serde_json::Value> {
    let dir = a.model.as_deref().ok_or_else(|| UserError("bench scale: --model DIR is required".into()))?;
    let t = Instant::now();
    let loaded = load_model_with(dir, device, options)?;
    let load_s = t.elapsed().as_secs_f64();
    let rss_loaded = rss();
    let m = &loaded.model;
    let prompt = ids(a.seq, m.config.vocab_size, 5);
    // The first forward also faults the mapped weights in (from the page cache, or the disk
    // when the file is not cached); the second is the compute.
    let forward = || {
        let t = Instant::now();
        settle(m.forward(m.ids_tensor(&prompt)));
        t.elapsed().as_secs_f64()
    };
    let first_forward_s = forward();
    let forward_s = forward();
    let t = Instant::now();
    let mut hooks = Hooks::capture(BlockHook::ResidPost.every_layer());
    settle(m.forward_hooked(m.ids_tensor(&prompt), &mut hooks));
    let cached: usize = hooks.cache.values().map(|v| v.dims().iter().product::<usize>() * 4).sum();
    let cache_s = t.elapsed().as_secs_f64();
    drop(hooks);
    // Decoding after the prompt: the prefill, then one token at a time through the cache.
    let mut cache = KvCache::new();
    let last = |logits: Tensor<3>| -> i64 {
        let t = logits.dims()[1];
        let row: Vec<f32> = logits.narrow(1, t - 1, 1).into_data().try_into_vec_as::<f32>().expect("f32 logits");
        row.iter().enumerate().fold((0, f32::MIN), |b, (i, &v)| if v > b.1 { (i, v) } else { b }).0 as i64
    };
    let mut next = last(m.forward_cached(m.ids_tensor(&prompt), &mut cache));
    let mut produced = vec![next];
    let t = Instant::now();
    for _ in 0..a.new_tokens {
        next = last(m.forward_cached(m.ids_tensor(&[next]), &mut cache));
        produced.push(next);
    }
    let decode_s = t.elapsed().as_secs_f64();
    let c = &m.config;
    Ok(json!({
        "times": [forward_s], "tokens": a.seq, "flops": c.forward_flops(1, a.seq)?,
        "load_s": load_s, "first_forward_s": first_forward_s, "cache_s": cache_s, "cached_bytes": cached,
        "decode_s": decode_s, "decode_tokens": a.new_tokens, "weight_bytes_per_token": weight_bytes_per_token(m)?,
        "first_tokens": &produced[..produced.len().min(8)],
        "params": burn::module::Module::num_params(m), "weight_dtype": loaded.info.weight_dtype, "checkpoint_bytes": checkpoint_bytes(dir)?,
        "rss_after_load_bytes": rss_loaded, "peak_rss_bytes": peak_rss(),
    }))
}

fn ids(n: usize, vocab: usize, seed: u64) -> Vec<i64> {
    let mut rng = Rng::new(seed);
    (0..n).map(|_| rng.below(vocab as u64) as i64).collect()
}

pub fn run(a: &BenchArgs, device: Device, options: &LoadOptions) -> Result<()> {
    let load_model = |dir: &std::path::Path, device: &Device| load_model_with(dir, device, options);
    let need_model = || a.model.as_deref().ok_or_else(|| UserError(format!("bench {}: --model DIR is required", a.workload)));
    let out = match a.workload.as_str() {
        "forward" => {
            let m = load_model(need_model()?, &device)?.model;
            let x = Tensor::<2, Int>::from_data(TensorData::new(ids(a.batch * a.seq, m.config.vocab_size, 1), [a.batch, a.seq]), &device);
            let before = burnlens_model::kernels::pool::stats();
            let times = timed(a.reps, || {
                settle(m.forward(x.clone()));
            });
            let pool = burnlens_model::kernels::pool::stats();
            json!({"times": times, "tokens": a.batch * a.seq, "flops": m.config.forward_flops(a.batch, a.seq)?,
                   "pool_late_jobs": pool.late_jobs - before.late_jobs, "pool_revoked_seats": pool.revoked_seats - before.revoked_seats})
        }
        "generate" => {
            let m = load_model(need_model()?, &device)?.model;
            let n_ctx = m.config.n_ctx;
            if a.prompt == 0 || a.prompt + a.new_tokens > n_ctx + 1 {
                let asked = format!("--prompt {} and --new-tokens {}", a.prompt, a.new_tokens);
                return Err(UserError(format!(
                    "bench generate: {asked}: expected a prompt of 1 or more tokens and at most {} tokens in all (the model's n_ctx + 1)",
                    n_ctx + 1
                ))
                .into());
            }
            let prompt = ids(a.prompt, m.config.vocab_size, 2);
            let s = Sampling { max_new_tokens: a.new_tokens, temperature: 0.0, ..Sampling::default() };
            let mut produced = Vec::new();
            let times = timed(a.reps, || produced = generate(&m, &prompt, &s).expect("valid prompt"));
            json!({"times": times, "tokens": a.new_tokens, "first_tokens": &produced[..produced.len().min(8)], "weight_bytes_per_token": weight_bytes_per_token(&m)?})
        }
        "train" => bench_train(a, &device)?,
        "load" => {
            let dir = need_model()?;
            let size = checkpoint_bytes(dir)?;
            let base = peak_rss().unwrap_or(0);
            let t = Instant::now();
            let m = load_model(dir, &device)?.model;
            let secs = t.elapsed().as_secs_f64();
            let _keep = &m;
            json!({"times": [secs], "checkpoint_bytes": size, "peak_rss_bytes": peak_rss(), "rss_before_bytes": base})
        }
        "scale" => scale(a, &device, options)?,
        "attention" => bench_attention(a, &device)?,
        "gemm" => bench_gemm(a, options.dtype)?,
        "select" => bench_select(a, &device)?,
        "matmul" => bench_matmul(a, &device)?,
        "machine" => burnlens_model::kernels::bench::machine(),
        other => {
            return Err(UserError(format!(
                "unknown workload \"{other}\"; expected forward, generate, train, load, scale, attention, gemm, matmul, select or machine"
            ))
            .into());
        }
    };
    let mut out = out;
    out["workload"] = json!(a.workload);
    out["impl"] = json!("burnlens");
    println!("{out}");
    Ok(())
}

/// A training step of [`TrainShape`] `a.train_shape` on random tokens (AdamW, gradients
/// clipped at 1).
/// Untimed training steps before the timed ones, on both sides (`scripts/peer_nanogpt.py`).
const WARM_UP_STEPS: usize = 3;

fn bench_train(a: &BenchArgs, device: &Device) -> Result<serde_json::Value> {
    let (cfg, b, steps_per_rep) = a.train_shape.setup();
    let block = cfg.n_ctx;
    let vocab = cfg.vocab_size;
    let ad = device.clone().autodiff();
    let model = cfg.init(&ad)?;
    let params = burn::module::Module::num_params(&model);
    // Moved into each step and back, as `TrainSession` does: the optimizer then owns the
    // parameters' buffers and updates them in place.
    let mut model = Some(model);
    let t = TrainingSection::default();
    let mut optim = optimizer(&t);
    let mut rng = Rng::new(3);
    let mut step = || {
        let data: Vec<i64> = (0..b * (block + 1)).map(|_| rng.below(vocab as u64) as i64).collect();
        let all = Tensor::<2, Int>::from_data(TensorData::new(data, [b, block + 1]), &ad);
        let (x, y) = (all.clone().narrow(1, 0, block), all.narrow(1, 1, block));
        let m = model.take().expect("the model is back after every step");
        let loss = cross_entropy(m.forward(x), y);
        let _ = loss.clone().into_scalar::<f32>();
        let mut grads = burn::optim::GradientsParams::from_grads(loss.backward(), &m);
        clip_global_norm(&m, &mut grads, 1.0);
        model = Some(optim.step(1e-3, m, grads));
    };
    let steps = a.reps.max(1) * steps_per_rep;
    // The same warm-up as every PyTorch peer (`torch.compile` needs three steps to compile),
    // its page faults reported apart: the heap grows in the first steps (the first allocates
    // every activation and gradient buffer, the second still finds some new pages).
    let warm_up_faults: Vec<Option<u64>> = (0..WARM_UP_STEPS).map(|_| faults_during(&mut step).1).collect();
    let mut faults = Vec::with_capacity(steps);
    let times: Vec<f64> = (0..steps)
        .map(|_| {
            let (secs, n) = faults_during(&mut || {
                let t = Instant::now();
                step();
                t.elapsed().as_secs_f64()
            });
            faults.extend(n.map(|n| n as f64));
            secs
        })
        .collect();
    let mean_faults = (faults.len() == steps).then(|| faults.iter().sum::<f64>() / steps as f64);
    let pool = burnlens_model::kernels::pool::stats();
    // Flops: the forward, then the backward at twice its cost.
    Ok(json!({"times": times, "tokens": b * block, "params": params, "flops": 3.0 * cfg.forward_flops(b, block)?,
           "page_faults_per_step": mean_faults, "page_faults_last_step": faults.last(), "page_faults": faults, "page_faults_warm_up": warm_up_faults, "pool_late_jobs": pool.late_jobs, "pool_revoked_seats": pool.revoked_seats}))
}

/// One GPT-2-small-shaped attention layer on random input.
fn bench_attention(a: &BenchArgs, device: &Device) -> Result<serde_json::Value> {
    // One GPT-2-small-shaped attention layer on random input.
    let cfg = TransformerConfig::gpt2_like(8, a.seq.max(1), 768, 1, 12);
    let m = cfg.init(device)?;
    let x = Tensor::<3>::random([a.batch, a.seq, 768], Distribution::Normal(0.0, 1.0), device);
    let mask = causal_mask(a.seq, device);
    let attn = &m.blocks[0].attn;
    let times = timed(a.reps, || {
        let layer = LayerInput { fused: true, ..LayerInput::new(mask.clone(), 0) };
        settle(attn.forward(AttentionInput { x: x.clone(), qk_input: None, layer }, &mut Hooks::none()));
    });
    let (t, d) = (a.seq as f64, 768.0);
    let flops = a.batch as f64 * (2.0 * t * 4.0 * d * d + 4.0 * d * t * (t + 1.0) / 2.0);
    Ok(json!({"times": times, "tokens": a.batch * a.seq, "flops": flops, "scores_bytes": a.batch * 12 * a.seq * a.seq * 4, "peak_rss_bytes": peak_rss()}))
}

/// `bench select --shape ROWSxWIDTH --k K`: the `k`-th largest of each row of a random
/// matrix on the device, by the route the trainer takes there (on a GPU with Burn's `Cube`
/// backend burnlens's radix kernel) or, with `--route bisection`, the composed-ops
/// bisection; the answer read back once per repetition (a few bytes a row).
fn bench_select(a: &BenchArgs, device: &Device) -> Result<serde_json::Value> {
    use burnlens_lens::dictionary::select;
    let spec = a.shape.as_deref().unwrap_or("4096x24576");
    let dims: Vec<usize> =
        spec.split('x').map(|v| v.parse()).collect::<Result<_, _>>().map_err(|_| UserError(format!("bench select: --shape {spec} is not ROWSxWIDTH")))?;
    let [rows, width] = dims[..] else { return Err(UserError(format!("bench select: --shape {spec} is not ROWSxWIDTH")).into()) };
    if a.k == 0 || a.k > width {
        return Err(UserError(format!("bench select: --k {} is not in 1..={width} (the row width)", a.k)).into());
    }
    let x = Tensor::<2>::random([rows, width], Distribution::Normal(0.0, 1.0), device);
    let route = match a.route.as_str() {
        "chosen" => select::SelectRoute::of(&x, a.k),
        "bisection" => select::SelectRoute::Bisection,
        other => return Err(UserError(format!("bench select: --route {other}: expected chosen or bisection")).into()),
    };
    let times = timed(a.reps, || {
        let t = match route {
            select::SelectRoute::Bisection => select::kth_largest_rows_by_bisection(x.clone(), a.k),
            _ => select::kth_largest_rows(&x, a.k),
        };
        settle(t);
    });
    let route = route.name();
    Ok(
        json!({"times": times, "rows": rows, "width": width, "k": a.k, "route": route, "values_per_s": (rows * width) as f64 / times.iter().cloned().fold(f64::INFINITY, f64::min)}),
    )
}

/// `bench matmul --shape MxKxN`: one product of two random f32 matrices on the device by
/// `burnlens_model::matmul`'s route under the compute dtype in force (on a GPU: the exact
/// kernel, or with `--compute tf32` Burn's), waited for each repetition ([`settle`]).
fn bench_matmul(a: &BenchArgs, device: &Device) -> Result<serde_json::Value> {
    use burnlens_model::matmul::{MatmulRoute, matmul};
    let spec = a.shape.as_deref().unwrap_or("4096x768x24576");
    let bad = || UserError(format!("bench matmul: --shape {spec} is not MxKxN"));
    let dims: Vec<usize> = spec.split('x').map(|v| v.parse()).collect::<Result<_, _>>().map_err(|_| bad())?;
    let [m, k, n] = dims[..] else { return Err(bad().into()) };
    let x = Tensor::<2>::random([m, k], Distribution::Normal(0.0, 1.0), device);
    let w = Tensor::<2>::random([k, n], Distribution::Normal(0.0, 1.0), device);
    let route = MatmulRoute::of(&x, &w).name();
    let times = timed(a.reps, || {
        settle(matmul(x.clone(), w.clone()));
    });
    let flops = 2.0 * (m * k * n) as f64;
    Ok(json!({"times": times, "m": m, "k": k, "n": n, "route": route, "flops": flops}))
}

/// Wait until `t` is computed, reading it back. On a GPU Burn's `into_data` returns at once
/// and fetches the bytes when they are first touched, so a benchmark that dropped them would
/// time the launches alone (the numbers come back far too fast): the device is synchronised.
fn settle<const D: usize>(t: Tensor<D>) {
    let device = t.device();
    let data = t.into_data();
    device.sync().expect("the device ran the benchmark's work");
    drop(data);
}

/// `bench gemm --shape MxKxN[t]`: one product as a model's linear layer takes it (see
/// `burnlens_model::kernels::bench`), with the weight dtype and compute chosen.
fn bench_gemm(a: &BenchArgs, dtype: burnlens_hf::WeightDtype) -> Result<serde_json::Value> {
    use burnlens_hf::WeightDtype;
    use burnlens_model::kernels::{bench::GemmBench, half::Half};
    let spec = a.shape.as_deref().ok_or_else(|| UserError("bench gemm: --shape MxKxN is required".into()))?;
    let half = match dtype {
        WeightDtype::Bf16 => Some(Half::Bf16),
        WeightDtype::F16 => Some(Half::F16),
        WeightDtype::Auto | WeightDtype::F32 => None,
    };
    let bench = GemmBench::parse(spec, half, a.reps).map_err(|e| UserError(format!("bench gemm: {e}")))?;
    Ok(burnlens_model::kernels::bench::gemm(&GemmBench { in_cache: a.in_cache, panels: a.panels, ..bench }))
}

fn causal_mask(t: usize, device: &Device) -> Tensor<4, burn::tensor::Bool> {
    let m: Vec<bool> = (0..t).flat_map(|q| (0..t).map(move |k| k > q)).collect();
    Tensor::from_data(TensorData::new(m, [1, 1, t, t]), device)
}
