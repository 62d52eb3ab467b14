//! Freed buffers kept for the next step instead of handed back to the OS.
//!
//! A training step (or a forward pass) allocates the same activation and gradient buffers
//! every time and frees them at the end. glibc's `malloc` serves blocks above its mmap
//! threshold (128 KB at first) with `mmap` and returns them with `munmap`, and trims the top
//! of the heap when more than 128 KB is free there, so each step's buffers are fresh pages: a
//! page fault and a zeroed 4 KB page each time they are first touched. Measured on the
//! nanoGPT CPU training step (2-core AMD EPYC Zen 4, `burnlens bench train`): 7,900 page
//! faults per step with glibc's defaults against 160 with the settings below, and the
//! kernel's page clearing and fault handling were about 10% of the step's samples.
//!
//! [`keep_freed_memory`] raises the mmap threshold to 256 MB (32 MB where glibc refuses more)
//! and the trim threshold to an eighth of the machine's memory, between 512 MB and 2 GB (the
//! most `mallopt` takes): blocks up to 256 MB come from the heap and go back to its free
//! lists, where the next step finds them. The cost is memory: up to that much freed by a step
//! may stay with the process. It runs once: at the start of the CLI and of the Python
//! module (before anything large is allocated), else when the first kernel runs on flex; not on
//! other C libraries, not when `GLIBC_TUNABLES` already sets malloc's thresholds, and not with
//! `BURNLENS_MALLOC=system`.
//!
//! Why 256 MB: GPT-2 small's training step at context 256 allocates logits and their
//! gradients of 51 MB (256 × 50,257 floats) and more of that size; at 32 MB they were mapped
//! fresh every step: 328,000 page faults per step against 28,000 at 256 MB set at start
//! (82,000 when set at the first kernel, after the model was built), and the step 2.3 s
//! against 1.7–1.9 s (same Zen 4 machine, `burnlens bench train --train-shape gpt2`).
//!
//! Why more than 512 MB of trim: Python's `run_with_cache` of GPT-2 small on 4 × 256 tokens
//! hands out about 1 GB of activations per call. With a 512 MB trim threshold the heap's top
//! was given back after every call and faulted in again by the next: 385,000 page faults and
//! 2.6–3.3 s per call while an earlier cache was still held, against none and 1.58–1.65 s with
//! 2 GB (same Zen 4 machine, 24 GB).

/// Apply the settings above, once per process.
pub fn keep_freed_memory() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if std::env::var("BURNLENS_MALLOC").is_ok_and(|v| v == "system") {
            return;
        }
        if std::env::var("GLIBC_TUNABLES").is_ok_and(|v| v.contains("mmap_threshold") || v.contains("trim_threshold")) {
            return;
        }
        apply();
    });
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn apply() {
    // glibc's <malloc.h>: int mallopt(int param, int value).
    unsafe extern "C" {
        fn mallopt(param: i32, value: i32) -> i32;
    }
    const M_TRIM_THRESHOLD: i32 = -1;
    const M_MMAP_THRESHOLD: i32 = -3;
    // SAFETY: mallopt only changes allocator parameters; it takes the arena lock itself.
    unsafe {
        // Older glibc caps the threshold at half its 64 MB arena heaps and returns 0 above.
        if mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD as i32) != 1 {
            mallopt(M_MMAP_THRESHOLD, 32 << 20);
        }
        mallopt(M_TRIM_THRESHOLD, trim_threshold(physical_memory()));
    }
}

/// Freed memory the heap keeps: an eighth of `total` bytes of memory, between 512 MB and the
/// largest value `mallopt` takes (2 GB); 512 MB when the size is unknown.
pub fn trim_threshold(total: Option<u64>) -> i32 {
    total.map_or(512 << 20, |t| (t / 8).clamp(512 << 20, i32::MAX as u64)) as i32
}

/// `MemTotal` of `/proc/meminfo`, in bytes.
#[cfg_attr(not(all(target_os = "linux", target_env = "gnu")), allow(dead_code))]
fn physical_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb: u64 = info.lines().find_map(|l| l.strip_prefix("MemTotal:"))?.trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kb * 1024)
}

/// Blocks up to this size come from the heap and are reused once freed.
pub const MMAP_THRESHOLD: usize = 256 << 20;

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn apply() {}

#[cfg(test)]
mod tests {
    #[test]
    fn the_trim_threshold_is_an_eighth_of_memory_within_its_bounds() {
        assert_eq!(super::trim_threshold(None), 512 << 20);
        assert_eq!(super::trim_threshold(Some(2 << 30)), 512 << 20);
        assert_eq!(super::trim_threshold(Some(8 << 30)), 1 << 30);
        assert_eq!(super::trim_threshold(Some(24 << 30)), i32::MAX);
        if cfg!(target_os = "linux") {
            assert!(super::physical_memory().is_some_and(|m| m > 1 << 20), "MemTotal read from /proc/meminfo");
        }
    }

    /// A freed block above glibc's largest dynamic threshold (32 MB), small enough for a
    /// thread's arena (64 MB heaps: the test runs off the main thread), is reused: touching
    /// it again faults no new pages (without the settings: all 10,240 again).
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn a_freed_40_mb_block_is_reused_without_new_page_faults() {
        super::apply();
        let faults = || {
            let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
            stat.rsplit_once(')').unwrap().1.split_whitespace().nth(7).unwrap().parse::<u64>().unwrap()
        };
        let touch = || {
            let mut v = vec![0u8; 40 << 20];
            for i in (0..v.len()).step_by(4096) {
                v[i] = 1;
            }
            std::hint::black_box(&v);
        };
        touch();
        let before = faults();
        touch();
        let again = faults() - before;
        assert!(again < 1000, "{again} page faults touching a freed 40 MB block again (10,240 pages)");
    }
}
