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
//! [`keep_freed_memory`] raises the mmap threshold to 32 MB (the largest glibc accepts) and the
//! trim threshold to 512 MB: blocks up to 32 MB come from the heap and go back to its free
//! lists, where the next step finds them. The cost is memory: up to 512 MB freed by a step may
//! stay with the process. It runs once, when the first kernel runs on flex; not on other C
//! libraries, not when `GLIBC_TUNABLES` already sets malloc's thresholds, and not with
//! `BURNLENS_MALLOC=system`.

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
        mallopt(M_MMAP_THRESHOLD, 32 << 20);
        mallopt(M_TRIM_THRESHOLD, 512 << 20);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn apply() {}
