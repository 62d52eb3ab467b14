//! Which arithmetic `--compute bf16` products take on this machine, and why: never slower
//! than f32 for asking to be faster.
//!
//! The rule, from measurements (BENCHMARKS.md): AMX tiles where the CPU has them and Linux
//! grants them ([`Bf16Path::Amx`]); the AVX512_BF16 vector kernel on AMD (Zen 4 measured
//! 1.6–2.2x f32, [`Bf16Path::Vector`]); f32 on an Intel CPU with AVX512_BF16 but no usable
//! AMX, where `vdpbf16ps` retires no more products a cycle than the two FMA ports do and the
//! rounding and packing are pure cost (a Xeon, family 6 model 207, with AMX hidden by its
//! hypervisor, measured 0.67x f32 on an 8B forward and, again on 2026-12-02, 0.48–0.52x the
//! f32 product on GPT-2's shapes: [`Bf16Path::F32Slower`]); f32 without the instructions
//! ([`Bf16Path::F32NoInstructions`]). `BURNLENS_BF16=native` takes the vector kernel wherever
//! the instructions exist; `BURNLENS_BF16=emulate` (or [`set_emulated`]) asks for bf16's
//! results where the products would run in f32: the vector kernel where the instructions
//! exist, else the portable emulation ([`Bf16Path::Emulated`]) that the model-level tests run
//! on every machine.

use std::sync::atomic::{AtomicU8, Ordering::Relaxed};

use super::simd::intel;
use super::{bf16_amx, bf16_gemm};

/// How `--compute bf16` products run here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bf16Path {
    /// AMX tiles (`tdpbf16ps`), with the vector kernel for the edges.
    Amx,
    /// The AVX512_BF16 vector kernel (`vdpbf16ps`).
    Vector,
    /// f32 arithmetic: an Intel CPU without usable AMX, where the vector kernel is slower.
    F32Slower,
    /// f32 arithmetic: no AVX512_BF16 here (or `BURNLENS_ISA=baseline`).
    F32NoInstructions,
    /// bf16's rounding emulated in f32 arithmetic (`BURNLENS_BF16=emulate`, no instructions).
    Emulated,
}

impl Bf16Path {
    pub fn name(self) -> &'static str {
        match self {
            Bf16Path::Amx => "amx",
            Bf16Path::Vector => "avx512_bf16",
            Bf16Path::F32Slower | Bf16Path::F32NoInstructions => "f32",
            Bf16Path::Emulated => "emulated",
        }
    }

    /// Why this path, in words (for reports and the warning).
    pub fn reason(self) -> &'static str {
        match self {
            Bf16Path::Amx => "the CPU has AMX tiles (AMX-BF16) and Linux grants them",
            Bf16Path::Vector => "the CPU has AVX512_BF16 and is not an Intel core without AMX",
            Bf16Path::F32Slower => {
                "this Intel CPU has AVX512_BF16 but no usable AMX: vdpbf16ps is slower than f32 here (0.48-0.67x measured); BURNLENS_BF16=native forces it"
            }
            Bf16Path::F32NoInstructions => "this CPU has no AVX512_BF16 (or BURNLENS_ISA=baseline): bf16 would be no faster than f32",
            Bf16Path::Emulated => "BURNLENS_BF16=emulate on a CPU without bf16 instructions: bf16's results in f32 arithmetic, slower than f32",
        }
    }

    /// Whether the products are bf16 arithmetic (native or emulated).
    pub fn is_bf16(self) -> bool {
        !matches!(self, Bf16Path::F32Slower | Bf16Path::F32NoInstructions)
    }
}

/// The path on this machine (see the module's note).
pub fn path() -> Bf16Path {
    if !bf16_gemm::instructions() {
        return if emulated() { Bf16Path::Emulated } else { Bf16Path::F32NoInstructions };
    }
    if bf16_amx::available() {
        Bf16Path::Amx
    } else if intel() && !emulated() && requested() != Some("native") {
        Bf16Path::F32Slower
    } else {
        Bf16Path::Vector
    }
}

/// Whether `--compute bf16` runs bf16 arithmetic here.
pub fn runs_bf16() -> bool {
    path().is_bf16()
}

/// Whether bf16 products run on bf16 instructions here (tiles or the vector kernel).
pub fn native() -> bool {
    matches!(path(), Bf16Path::Amx | Bf16Path::Vector)
}

/// `BURNLENS_BF16`, trimmed.
fn requested() -> Option<&'static str> {
    static VALUE: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    VALUE.get_or_init(|| std::env::var("BURNLENS_BF16").ok().map(|v| v.trim().to_string())).as_deref()
}

const UNSET: u8 = u8::MAX;
static EMULATED: AtomicU8 = AtomicU8::new(UNSET);

/// Whether bf16's results were asked for where the products would run in f32
/// ([`set_emulated`], else `BURNLENS_BF16=emulate`).
pub fn emulated() -> bool {
    match EMULATED.load(Relaxed) {
        UNSET => {
            let on = requested() == Some("emulate");
            let _ = EMULATED.compare_exchange(UNSET, on as u8, Relaxed, Relaxed);
            emulated()
        }
        v => v == 1,
    }
}

/// Ask for bf16's results where the products would run in f32 (tests of the portable path).
pub fn set_emulated(on: bool) {
    EMULATED.store(on as u8, Relaxed);
}

/// The warning bf16 compute gives, once per process, where its products do not run on bf16
/// instructions.
pub(crate) fn warn_if_not_native() {
    static WARNED: std::sync::Once = std::sync::Once::new();
    let p = path();
    if !matches!(p, Bf16Path::Amx | Bf16Path::Vector) {
        WARNED.call_once(|| eprintln!("warning: bf16 compute runs {} products: {}", p.name(), p.reason()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_path_follows_the_rule_on_this_machine() {
        let p = path();
        eprintln!("bf16 compute here: {} ({})", p.name(), p.reason());
        match (bf16_gemm::instructions(), bf16_amx::available()) {
            (false, _) => assert!(matches!(p, Bf16Path::F32NoInstructions | Bf16Path::Emulated)),
            (true, true) => assert_eq!(p, Bf16Path::Amx),
            (true, false) if intel() && !emulated() && requested() != Some("native") => assert_eq!(p, Bf16Path::F32Slower),
            (true, false) => assert_eq!(p, Bf16Path::Vector),
        }
        assert_eq!(runs_bf16(), p.is_bf16());
        assert!(!p.reason().is_empty());
    }
}
