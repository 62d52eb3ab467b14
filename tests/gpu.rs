//! The GPU check's suites in one test binary (`scripts/device_check.sh`): parity, attribution,
//! graphs and QK, the GPU kernels, the row kernels, the decoding and prompt attention and the Adam step, SAE training steps and evals, each file
//! included as a module. Built only with `wgpu` (the pack builds `cuda,wgpu`): each of those
//! binaries links all of Burn, CubeCL and cubecl-cuda's LLVM (about 140 MB stripped, 31 MB in
//! xz), and what one call to a lent GPU may carry is 64 MiB, the repository included: this
//! binary and `burnlens` travel in two calls, one each, where seven binaries fitted in none.
#![cfg(feature = "wgpu")]

#[path = "attribution.rs"]
mod attribution;
#[path = "gpu_adam.rs"]
mod gpu_adam;
#[path = "gpu_attention.rs"]
mod gpu_attention;
#[path = "gpu_kernels.rs"]
mod gpu_kernels;
#[path = "gpu_row_kernels.rs"]
mod gpu_row_kernels;
#[path = "parity.rs"]
mod parity;
#[path = "sae_eval.rs"]
mod sae_eval;
#[path = "sae_training.rs"]
mod sae_training;
#[path = "trace.rs"]
mod trace;
