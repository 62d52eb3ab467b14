//! What a benchmark ran on: `lscpu`, and burnlens's own GEMM and memory bandwidth on it.

use std::path::Path;
use std::process::Command;

use anyhow::Result;

use crate::process::run_json;

/// `lscpu` as fields, and the widest vector ISA its flags name.
pub(crate) struct Lscpu(String);

impl Lscpu {
    fn read() -> Self {
        Lscpu(Command::new("lscpu").output().map(|o| String::from_utf8_lossy(&o.stdout).to_string()).unwrap_or_default())
    }

    fn field(&self, name: &str) -> String {
        self.0.lines().find(|l| l.starts_with(name)).and_then(|l| l.split_once(':')).map(|(_, v)| v.trim().to_string()).unwrap_or_else(|| "?".into())
    }

    fn simd(&self) -> &'static str {
        let flags = self.field("Flags");
        let has = |f: &str| flags.split_whitespace().any(|x| x == f);
        if has("avx512f") {
            "AVX-512"
        } else if has("avx2") {
            "AVX2"
        } else {
            "SSE"
        }
    }
}

/// `Machine: VENDOR MODEL (family, model; N CPUs; ISA)` from `lscpu`, for every report.
pub(crate) fn cpu_line() -> String {
    let l = Lscpu::read();
    format!(
        "Machine: {} {} (family {}, model {}; {} CPUs; {})",
        l.field("Vendor ID"),
        l.field("Model name"),
        l.field("CPU family"),
        l.field("Model:"),
        l.field("CPU(s)"),
        l.simd()
    )
}

/// The machine a bench ran on: `lscpu`, burnlens's GEMM rate on a large square product,
/// and the copy bandwidth.
pub(crate) struct Machine {
    pub(crate) text: String,
    pub(crate) gemm_gflops: f64,
    pub(crate) copy_gbps: f64,
    /// Read bandwidth from huge pages, where packed and converted weights live.
    pub(crate) read_gbps: f64,
    /// From the ordinary heap's 4 KB pages (a memory-mapped checkpoint's pages are those).
    pub(crate) read_gbps_heap: f64,
}

pub(crate) fn machine_report(bin: &Path) -> Result<Machine> {
    let lscpu = Lscpu::read();
    let field = |name: &str| lscpu.field(name);
    let simd = lscpu.simd();
    let mhz = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| c.lines().find(|l| l.starts_with("cpu MHz")).and_then(|l| l.split(':').nth(1)).and_then(|v| v.trim().parse::<f64>().ok()))
        .unwrap_or(f64::NAN);
    let cpus: f64 = field("CPU(s)").parse().unwrap_or(f64::NAN);
    // Two FMA pipes per core of the vector width (fp32 lanes x 2 flops x 2 pipes).
    let per_cycle = match simd {
        "AVX-512" => 64.0,
        "AVX2" => 32.0,
        _ => 16.0,
    };
    let peak = cpus * mhz / 1e3 * per_cycle;
    let m = run_json(Command::new(bin).args(["bench", "machine"]))?;
    let gemm = m["gemm_gflops"].as_f64().unwrap_or(f64::NAN);
    let text = format!(
        "Machine: {} {} ({} CPUs, {} thread(s) per core, {simd}, {:.0} MHz); theoretical fp32 peak {peak:.0} GFLOP/s \
         (assuming two FMA pipes of full width per core). Measured by burnlens on this run: GEMM 1536³ {gemm:.0} GFLOP/s \
         with {} threads ({:.0} on one), read bandwidth {:.1} GB/s on huge pages (where packed and converted weights live; {:.1} on the ordinary heap), copy bandwidth {:.1} GB/s (bytes read + written); kernels compiled for {}; `--compute bf16` takes the {} path ({}); prefill with bf16 weights reads {}; decoding with half weights asks ahead for {}. \
         The clock in /proc/cpuinfo is the nominal one: a measured GEMM rate above the theoretical peak means the cores run faster.",
        field("Vendor ID"),
        field("Model name"),
        field("CPU(s)"),
        field("Thread(s) per core"),
        mhz,
        m["threads"],
        m["gemm_gflops_one_thread"].as_f64().unwrap_or(f64::NAN),
        m["read_gbps"].as_f64().unwrap_or(f64::NAN),
        m["read_gbps_heap"].as_f64().unwrap_or(f64::NAN),
        m["copy_gbps"].as_f64().unwrap_or(f64::NAN),
        m["isa"].as_str().unwrap_or("?"),
        m["bf16_path"].as_str().unwrap_or("?"),
        m["bf16_why"].as_str().unwrap_or("?"),
        m["half_prefill"].as_str().unwrap_or("?"),
        m["half_decode_prefetch"].as_str().unwrap_or("?"),
    );
    let g = |k: &str| m[k].as_f64().unwrap_or(f64::NAN);
    Ok(Machine { text, gemm_gflops: gemm, copy_gbps: g("copy_gbps"), read_gbps: g("read_gbps"), read_gbps_heap: g("read_gbps_heap") })
}
