//! Micro-benchmarks of the kernels, for `burnlens bench gemm` and `bench machine`: one
//! product through the path a model's linear layer takes (an f32 weight packed once, bf16
//! compute, a half weight read as stored or from decoding panels) and what the machine can
//! do (GEMM peak, memory bandwidth). They live inside the kernels' boundary, so the CLI
//! names a shape and reads JSON, and needs none of the kernels' internals.

use serde_json::{Value, json};

use super::bf16_gemm;
use super::bf16_pack::ColsBuf;
use super::gemm::{MatRef, matmul};
use super::half::{Half, HalfRef, matmul_half};
use super::half_panels::HalfPanels;
use super::half_panels_prefill::matmul_from_panels;
use super::pages::PageBuf;
use super::{packed, pool, simd};

/// One product to time: `[m, k] · [k, n]`, the weight read through its transpose with
/// `transposed` (a Hugging Face `[out, in]` weight), stored in `half` precision if given.
#[derive(Debug, Clone)]
pub struct GemmBench {
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub transposed: bool,
    pub half: Option<Half>,
    pub reps: usize,
    /// Half weights: the same copy every time (else enough copies to read from memory).
    pub in_cache: bool,
    /// Half weights: from the decoding panels instead of as stored.
    pub panels: bool,
    /// The shape as asked for, reported back.
    pub spec: String,
}

impl GemmBench {
    /// `MxKxN`, optionally ending in `t` (the weight read transposed).
    pub fn parse(spec: &str, half: Option<Half>, reps: usize) -> Result<Self, String> {
        let (dims, transposed) = match spec.strip_suffix('t') {
            Some(d) => (d, true),
            None => (spec, false),
        };
        let bad = || format!("--shape {spec:?}: expected MxKxN (e.g. 128x768x2304), optionally ending in t");
        let v: Vec<usize> = dims.split('x').map(|d| d.parse().map_err(|_| bad())).collect::<Result<_, _>>()?;
        let [m, k, n] = v[..] else { return Err(bad()) };
        Ok(GemmBench { m, k, n, transposed, half, reps, in_cache: false, panels: false, spec: spec.to_string() })
    }
}

/// Time the product as a forward pass runs it: a half weight through [`matmul_half`] (or its
/// panels), bf16 compute through the bf16 kernel, else the f32 weight packed once (before
/// timing) as `linear` keeps it, beside `gemm` repacking both operands every call.
pub fn gemm(a: &GemmBench) -> Value {
    let [m, k, n] = [a.m, a.k, a.n];
    let (x, w) = (operand(m * k, 97), operand(k * n, 89));
    let mut c = vec![0.0f32; m * n];
    let b = if a.transposed { MatRef::row_major(&w, n, k).t() } else { MatRef::row_major(&w, k, n) };
    if let Some(kind) = a.half {
        return gemm_half(a, kind, &x);
    }
    if super::compute() == super::Compute::Bf16 {
        return gemm_bf16(a, &x, b);
    }
    let before = pool::stats();
    let packed = packed::Packed::new(b);
    let warm = std::time::Duration::from_millis(300);
    let times = match &packed {
        Some(p) => timed_warm(a.reps, warm, || packed::matmul_packed(&mut c, n, MatRef::row_major(&x, m, k), p, false)),
        None => timed_warm(a.reps, warm, || matmul(&mut c, n, MatRef::row_major(&x, m, k), b, false)),
    };
    // One `gemm::gemm` call per block, packing both operands every time.
    let unpacked = timed_warm(a.reps, warm, || matmul(&mut c, n, MatRef::row_major(&x, m, k), b, false));
    let pool = pool::stats();
    json!({"times": times, "times_repacking": unpacked, "packed": packed.is_some(), "flops": 2.0 * (m * k * n) as f64, "shape": a.spec,
           "pool_late_jobs": pool.late_jobs - before.late_jobs, "pool_revoked_seats": pool.revoked_seats - before.revoked_seats})
}

/// [`timed`] after repeating `f` for at least `warm` first: a product of a millisecond timed
/// right after the process starts measures the machine waking its second core (on the
/// 2-vCPU machines we measure on, the first 100–200 ms of a process often run at one core's
/// speed), not the product. The PyTorch peer warms up the same way.
pub fn timed_warm(reps: usize, warm: std::time::Duration, mut f: impl FnMut()) -> Vec<f64> {
    let t = std::time::Instant::now();
    while t.elapsed() < warm {
        f();
    }
    timed(reps, f)
}

pub fn timed(reps: usize, mut f: impl FnMut()) -> Vec<f64> {
    f(); // warm-up
    (0..reps)
        .map(|_| {
            let t = std::time::Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .collect()
}

/// `bench gemm --compute bf16`: the product in bf16 arithmetic, the weight rounded once into
/// the layout `linear` keeps (before timing: panels of its columns on AMX tiles, else
/// columns), the activations rounded and packed in every product, as in a forward pass.
fn gemm_bf16(a: &GemmBench, x: &[f32], b: MatRef) -> Value {
    let [m, k, n] = [a.m, a.k, a.n];
    let mut c = vec![0.0f32; m * n];
    let warm = std::time::Duration::from_millis(300);
    let path = super::bf16_path::path();
    // The layout `linear` keeps for a constant weight on this path.
    let panels = path == super::bf16_path::Bf16Path::Amx;
    let times = if panels {
        let w = bf16_gemm::RowPanels::pack(b.t());
        timed_warm(a.reps, warm, || bf16_gemm::matmul_bf16_panels(&mut c, n, MatRef::row_major(x, m, k), &w, false))
    } else {
        let cols = ColsBuf::from_f32(b);
        timed_warm(a.reps, warm, || bf16_gemm::matmul_bf16(&mut c, n, MatRef::row_major(x, m, k), cols.view(), false))
    };
    // This runs the kernel whatever the path; a product in a model takes `path`.
    json!({"times": times, "compute": "bf16", "native": bf16_gemm::instructions(), "amx": super::bf16_amx::available(), "path": path.name(), "why": path.reason(),
           "weight_layout": if panels { "panels" } else { "columns" },
           "flops": 2.0 * (m * k * n) as f64, "shape": a.spec})
}

/// `bench gemm --dtype bf16|f16`: the product with a half weight (read in place, widened
/// by the kernel), as a half-precision checkpoint's linear layers run it, each time on a
/// weight that is not in the cache (`--in-cache`: always the same one).
fn gemm_half(a: &GemmBench, kind: Half, x: &[f32]) -> Value {
    let ([m, k, n], transposed) = ([a.m, a.k, a.n], a.transposed);
    let bits: Vec<u16> = operand(k * n, 89)
        .iter()
        .map(|&v| match kind {
            Half::Bf16 => burn::tensor::bf16::from_f32(v).to_bits(),
            Half::F16 => burn::tensor::f16::from_f32(v).to_bits(),
        })
        .collect();
    // Copies of the weight used in turn, 256 MB in all, so that each product reads its
    // weight from memory as a decoding step does (one copy would stay in the L3 cache).
    let copies = if a.in_cache { 1 } else { ((256usize << 20) / (2 * k * n).max(1)).clamp(1, 64) };
    // On huge pages, as the half weights converted at load and the panels are.
    let bits: Vec<PageBuf<u16>> = (0..copies).map(|_| PageBuf::copy_of(&bits)).collect();
    fn view(data: &[u16], kind: Half, [k, n]: [usize; 2], transposed: bool) -> HalfRef<'_> {
        if transposed {
            HalfRef { data, kind, offset: 0, rows: n, cols: k, rs: k as isize, cs: 1 }.t()
        } else {
            HalfRef { data, kind, offset: 0, rows: k, cols: n, rs: n as isize, cs: 1 }
        }
    }
    let mut c = vec![0.0f32; m * n];
    let mut turn = 0;
    let warm = std::time::Duration::from_millis(300);
    let times = if a.panels {
        let panels: Vec<HalfPanels> = bits.iter().map(|b| HalfPanels::new(view(b, kind, [k, n], transposed))).collect();
        drop(bits);
        timed_warm(a.reps, warm, || {
            turn = (turn + 1) % copies;
            matmul_from_panels(&mut c, n, MatRef::row_major(x, m, k), &panels[turn], false)
        })
    } else {
        timed_warm(a.reps, warm, || {
            turn = (turn + 1) % copies;
            matmul_half(&mut c, n, MatRef::row_major(x, m, k), view(&bits[turn], kind, [k, n], transposed), false)
        })
    };
    json!({"times": times, "flops": 2.0 * (m * k * n) as f64, "weight_bytes": 2 * k * n, "shape": a.spec, "dtype": format!("{kind:?}"),
           "weight_from": if copies == 1 { "cache" } else { "memory" }, "layout": if a.panels { "decoding panels" } else { "as stored" }})
}

/// A GEMM operand of `len` values in [-0.5, 0.5), periodic in `period` (a prime, so rows
/// and columns do not line up).
fn operand(len: usize, period: usize) -> Vec<f32> {
    (0..len).map(|i| ((i % period) as f32 - (period / 2) as f32) / period as f32).collect()
}

/// What this machine can do: a large square GEMM with all threads and with one (the
/// reachable compute peak), and a large copy with all threads (the reachable memory
/// bandwidth, which bounds decoding).
pub fn machine() -> Value {
    let n = 1536;
    let (a, b) = (operand(n * n, 97), operand(n * n, 89));
    let mut c = vec![0.0f32; n * n];
    let flops = 2.0 * (n * n * n) as f64;
    // After 0.3 s of the same product, as `bench gemm` times its products: with one call of
    // warm-up, a Zen 5 machine's report said 217 GFLOP/s where the same run's GEMM table
    // measured 440 for this product (BENCHMARKS.md, thirty-first).
    let warm = std::time::Duration::from_millis(300);
    let gemm_all = median(timed_warm(5, warm, || matmul(&mut c, n, MatRef::row_major(&a, n, n), MatRef::row_major(&b, n, n), false)));
    let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().expect("a one-thread pool");
    let gemm_one = one.install(|| median(timed_warm(3, warm, || matmul(&mut c, n, MatRef::row_major(&a, n, n), MatRef::row_major(&b, n, n), false))));
    // Copy bandwidth: read + write 256 MB, counted as bytes moved (read and written).
    let len = 64 << 20;
    let src = vec![1.0f32; len];
    let mut dst = vec![0.0f32; len];
    let copy = median(timed(5, || {
        use rayon::prelude::*;
        dst.par_chunks_mut(1 << 16).zip(src.par_chunks(1 << 16)).for_each(|(d, s)| d.copy_from_slice(s));
    }));
    // Read bandwidth: what decoding does with the weights, from where they live (packed and
    // converted weights on huge pages, `kernels::pages`), and from the ordinary heap.
    let read_from = |v: &[f32]| {
        median(timed(5, || {
            std::hint::black_box(simd::parallel_sum(v));
        }))
    };
    let read_heap = read_from(&src);
    let read = read_from(&PageBuf::copy_of(&src));
    json!({
        "read_gbps": (len * 4) as f64 / read / 1e9,
        "read_gbps_heap": (len * 4) as f64 / read_heap / 1e9,
        "times": [gemm_all],
        "threads": rayon::current_num_threads(),
        "isa": simd::isa(),
        "bf16_path": super::bf16_path::path().name(),
        "bf16_why": super::bf16_path::path().reason(),
        "half_prefill": super::linear::HalfPrefill::here(Half::Bf16).describe(),
        "half_decode_prefetch": format!(
            "{} from the panels, {} from the stored layouts",
            super::prefetch::Ahead::panels().describe(),
            super::prefetch::Ahead::stored().describe()
        ),
        "gemm_gflops": flops / gemm_all / 1e9,
        "gemm_gflops_one_thread": flops / gemm_one / 1e9,
        "copy_gbps": 2.0 * (len * 4) as f64 / copy / 1e9,
    })
}

pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_parse_and_each_path_reports_its_product() {
        let b = GemmBench::parse("8x16x24t", None, 2).unwrap();
        assert_eq!(([b.m, b.k, b.n], b.transposed), ([8, 16, 24], true));
        assert!(GemmBench::parse("8x16", None, 2).unwrap_err().contains("expected MxKxN"));
        assert!(GemmBench::parse("8xAx2", None, 2).is_err());
        for half in [None, Some(Half::Bf16)] {
            let out = gemm(&GemmBench { in_cache: true, ..GemmBench::parse("8x16x24", half, 2).unwrap() });
            assert_eq!(out["times"].as_array().map(Vec::len), Some(2), "{out}");
            assert_eq!(out["flops"].as_f64(), Some(2.0 * (8 * 16 * 24) as f64));
            assert_eq!(out["shape"], "8x16x24");
        }
    }
}
