//! The all-reduce's bandwidth on this job's ranks (`mpiexec -n N ... allreduce`), beside one
//! core's memory bandwidth, as `cargo xtask bench-mpi` reports them. Rank 0 prints one JSON
//! line per buffer size: the algorithm bandwidth (bytes / time) and the bus bandwidth (NCCL's
//! convention for a ring all-reduce: algorithm bandwidth × 2(N−1)/N).

use std::time::Instant;

use burnlens_dist::Ranks;

fn main() {
    let ranks = Ranks::from_launcher().expect("the job's ranks");
    let n = ranks.size();
    for mib in [1usize, 4, 16, 64, 256, 512] {
        let len = mib << 18; // f32 values
        let mut buf = vec![1.0f32; len];
        ranks.sum_f32(&mut buf, "warm-up").unwrap();
        let reps = (1024 / mib).clamp(3, 50);
        let start = Instant::now();
        for _ in 0..reps {
            ranks.sum_f32(&mut buf, "timed all-reduce").unwrap();
        }
        let s = start.elapsed().as_secs_f64() / reps as f64;
        let bytes = (len * 4) as f64;
        let alg = bytes / s / 1e9;
        if ranks.is_writer() {
            println!(
                "{{\"kind\": \"allreduce\", \"ranks\": {n}, \"mib\": {mib}, \"seconds\": {s:.6}, \"alg_gb_s\": {alg:.3}, \"bus_gb_s\": {:.3}}}",
                alg * 2.0 * (n as f64 - 1.0) / n as f64
            );
        }
    }
    if ranks.is_writer() {
        // One core copying 512 MiB: the bound a shared-memory transport's copies face.
        let src = vec![1.0f32; 128 << 20];
        let mut dst = vec![0.0f32; 128 << 20];
        let start = Instant::now();
        for _ in 0..5 {
            dst.copy_from_slice(&src);
            std::hint::black_box(&mut dst);
        }
        let s = start.elapsed().as_secs_f64() / 5.0;
        // A copy reads and writes each byte.
        println!("{{\"kind\": \"memcpy\", \"gb_s\": {:.3}}}", 2.0 * (src.len() * 4) as f64 / s / 1e9);
    }
}
