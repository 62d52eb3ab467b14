//! The compute dtype: which arithmetic the linear layers' products use, chosen apart from
//! the dtype the weights are stored in.
//!
//! [`Compute::F32`] (the default) is the exact f32 path, on the CPU and on a GPU (where
//! [`crate::matmul`] keeps Burn's TF32 tensor cores out). [`Compute::Bf16`] rounds both
//! operands of a product to bf16 (round-to-nearest-even) and accumulates in f32, as
//! PyTorch's `autocast` and oneDNN's `vdpbf16ps` kernels do; residual stream, norms,
//! softmax, attention, losses, hooks and every returned value stay f32. Decoding's few rows
//! are bound by the weight's bytes, not by arithmetic, and keep the f32 path either way.
//! [`Compute::Tf32`] lets a GPU's tensor cores take f32 products as TF32 (Burn's own
//! products on the device: 10-bit mantissas in, f32 sums, ~1e-3 relative); on the CPU it is
//! f32. On a GPU, `bf16` also means Burn's products (no bf16 product of burnlens's there).
//!
//! The choice is process-wide (like [`super::set_enabled`]): the CLI's `--compute`, Python's
//! `compute_dtype=` and a run config's `training.compute` set it, `BURNLENS_COMPUTE` is read
//! once at first use otherwise.

use std::sync::atomic::{AtomicU8, Ordering};

/// The arithmetic of the linear layers' products.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compute {
    /// f32 operands, f32 arithmetic (exact to the stored weights).
    #[default]
    F32,
    /// bf16 operands (rounded to nearest even), f32 accumulation.
    Bf16,
    /// On a GPU, TF32 tensor cores where the device has them; f32 on the CPU.
    Tf32,
}

impl Compute {
    /// Every name, as the CLI, Python and configs spell them.
    pub const NAMES: [&'static str; 3] = ["f32", "bf16", "tf32"];

    pub fn name(self) -> &'static str {
        match self {
            Compute::F32 => "f32",
            Compute::Bf16 => "bf16",
            Compute::Tf32 => "tf32",
        }
    }
}

impl std::fmt::Display for Compute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Compute {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "f32" | "float32" => Ok(Compute::F32),
            "bf16" | "bfloat16" => Ok(Compute::Bf16),
            "tf32" | "tfloat32" => Ok(Compute::Tf32),
            other => Err(format!("compute dtype {other:?}: expected one of {}", Compute::NAMES.join(", "))),
        }
    }
}

const UNSET: u8 = u8::MAX;
static COMPUTE: AtomicU8 = AtomicU8::new(UNSET);

/// The compute dtype in force ([`set_compute`], else `BURNLENS_COMPUTE`, else f32).
pub fn compute() -> Compute {
    match COMPUTE.load(Ordering::Relaxed) {
        0 => Compute::F32,
        1 => Compute::Bf16,
        2 => Compute::Tf32,
        _ => {
            let from_env = match std::env::var("BURNLENS_COMPUTE") {
                Ok(v) => v.parse().unwrap_or_else(|e| {
                    eprintln!("warning: BURNLENS_COMPUTE: {e}; using f32");
                    Compute::F32
                }),
                Err(_) => Compute::F32,
            };
            let _ = COMPUTE.compare_exchange(UNSET, from_env as u8, Ordering::Relaxed, Ordering::Relaxed);
            compute()
        }
    }
}

/// Choose the compute dtype for every later product in this process; warns once where bf16
/// compute does not run on bf16 instructions (see [`super::bf16_path`]).
pub fn set_compute(c: Compute) {
    COMPUTE.store(c as u8, Ordering::Relaxed);
    if c == Compute::Bf16 {
        super::bf16_path::warn_if_not_native();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_parses_back_and_a_bad_one_names_the_choices() {
        for name in Compute::NAMES {
            assert_eq!(name.parse::<Compute>().unwrap().name(), name);
        }
        let e = "fp8".parse::<Compute>().unwrap_err();
        assert!(e.contains("\"fp8\"") && e.contains("f32, bf16, tf32"), "{e}");
        assert_eq!(serde_json::to_string(&Compute::Bf16).unwrap(), "\"bf16\"");
    }
}
