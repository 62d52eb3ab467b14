//! bf16 products on AMX tiles (Sapphire Rapids and later Xeons): `tdpbf16ps` multiplies a
//! 16 × 32 bf16 tile by a 32 × 16 one into a 16 × 16 f32 tile, 16,384 products an
//! instruction, where `vdpbf16ps` makes 32.
//!
//! The operands are already laid out for it by the AVX512_BF16 path ([`super::bf16_gemm`]):
//! a weight column's `k` values are contiguous ([`Cols`]), so sixteen columns at their stride
//! are an `A` tile (16 rows of 16 pairs); a panel of activations holds each pair's 64 rows
//! contiguously ([`RowPanels`]), which is the `B` tile's pair-interleaved (VNNI) layout, 16
//! rows of the product a tile. The `C` tile (sixteen weight columns × sixteen rows) is stored
//! straight into the task's column-major tile. A block is 32 columns × 32 rows: four `C` tiles
//! (`tmm0`–`tmm3`), two `A` (`tmm4`, `tmm5`), two `B` (`tmm6`, `tmm7`), one `ldtilecfg` for
//! all (every tile 16 rows of 64 bytes) per task.
//!
//! Linux grants the tile data state per process on request (`arch_prctl(ARCH_REQ_XCOMP_PERM,
//! XFEATURE_XTILEDATA)`); [`available`] asks once and says whether the CPU (CPUID AMX-TILE and
//! AMX-BF16) and the kernel allow it, and whether `BURNLENS_AMX=0` or `BURNLENS_ISA=baseline`
//! forbids it. The instructions are written with `asm!` (their intrinsics are unstable); the
//! compiler never allocates tile registers, so they keep their contents between the `asm!`
//! blocks of one call.

use super::bf16_pack::{Cols, PANEL_ROWS, RowPanels};

/// Weight columns a block covers (two `A` tiles).
pub const BLOCK_COLS: usize = 32;
/// Pairs of `k` a tile step covers (an `A` tile's 64 bytes).
pub const STEP_PAIRS: usize = 16;

/// Whether bf16 products run on AMX tiles here (see the module's note); asked once.
pub fn available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        let allowed = !super::simd::baseline() && !matches!(std::env::var("BURNLENS_AMX").as_deref().map(str::trim), Ok("0"));
        allowed && super::simd::has_avx512_bf16() && cpu_has_amx_bf16() && request_tile_data()
    })
}

#[cfg(target_arch = "x86_64")]
fn cpu_has_amx_bf16() -> bool {
    let edx = std::arch::x86_64::__cpuid_count(7, 0).edx;
    edx & (1 << 22) != 0 && edx & (1 << 24) != 0
}

#[cfg(not(target_arch = "x86_64"))]
fn cpu_has_amx_bf16() -> bool {
    false
}

/// `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`: whether Linux lets this process use
/// the tile data registers.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn request_tile_data() -> bool {
    const SYS_ARCH_PRCTL: i64 = 158;
    const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
    const XFEATURE_XTILEDATA: i64 = 18;
    let ret: i64;
    // SAFETY: the arch_prctl system call with two integer arguments; it only changes which
    // extended states this process may use.
    unsafe {
        std::arch::asm!(
            "syscall",
            inlateout("rax") SYS_ARCH_PRCTL => ret,
            in("rdi") ARCH_REQ_XCOMP_PERM,
            in("rsi") XFEATURE_XTILEDATA,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack)
        );
    }
    ret == 0
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn request_tile_data() -> bool {
    false
}

/// The tile configuration every block uses: palette 1, tiles 0–7 of 16 rows × 64 bytes.
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

const CONFIG: TileConfig = {
    let mut c = [0u8; 64];
    c[0] = 1;
    let mut t = 0;
    while t < 8 {
        c[16 + 2 * t] = 64;
        c[48 + t] = 16;
        t += 1;
    }
    TileConfig(c)
};

/// The tile registers configured for this thread, released when dropped.
pub struct Tiles(());

impl Tiles {
    /// Configure the tiles (only after [`available`] said yes).
    pub fn configure() -> Tiles {
        debug_assert!(available());
        // SAFETY: AMX is available and permitted (the caller checked); the configuration is a
        // valid palette-1 layout.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            std::arch::asm!("ldtilecfg [{0}]", in(reg) &CONFIG as *const TileConfig, options(nostack, readonly));
        }
        Tiles(())
    }

    /// `out[c][r] (+)= Σ_p w_c[p] · a[p][r]` for the 32 weight columns from `w` (stride `ldw`
    /// values) and the 32 rows of a panel from row `row0` (0 or 32), over `steps × 16` pairs
    /// from the pointers given; `out`'s column `c` at `out + c · ldo` (32 rows contiguous).
    ///
    /// # Safety
    /// Each of the 32 columns must be readable for `steps × 32` values from `w + c · ldw`; the
    /// panel for `steps × 16` pairs of 64 words from `a`; `out` for 32 columns of 32 floats at
    /// stride `ldo`. Only between [`Tiles::configure`] and the drop on this thread.
    #[cfg(target_arch = "x86_64")]
    pub unsafe fn block(&self, steps: usize, a: *const u32, row0: usize, w: *const u16, ldw: usize, out: *mut f32, ldo: usize, add: bool) {
        use std::arch::asm;
        let (c_stride, a_stride, b_stride) = (ldo * 4, ldw * 2, PANEL_ROWS * 4);
        let c = [out, out.wrapping_add(16), out.wrapping_add(16 * ldo), out.wrapping_add(16 * ldo + 16)];
        unsafe {
            if add {
                asm!(
                    "tileloadd tmm0, [{c0} + {s}*1]",
                    "tileloadd tmm1, [{c1} + {s}*1]",
                    "tileloadd tmm2, [{c2} + {s}*1]",
                    "tileloadd tmm3, [{c3} + {s}*1]",
                    c0 = in(reg) c[0], c1 = in(reg) c[1], c2 = in(reg) c[2], c3 = in(reg) c[3], s = in(reg) c_stride,
                    options(nostack, readonly)
                );
            } else {
                asm!("tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm3", options(nostack, nomem));
            }
            let (mut w0, mut w1) = (w, w.wrapping_add(16 * ldw));
            let mut b = a.wrapping_add(row0);
            for _ in 0..steps {
                asm!(
                    "tileloadd tmm4, [{w0} + {sa}*1]",
                    "tileloadd tmm5, [{w1} + {sa}*1]",
                    "tileloadd tmm6, [{b0} + {sb}*1]",
                    "tileloadd tmm7, [{b1} + {sb}*1]",
                    "tdpbf16ps tmm0, tmm4, tmm6",
                    "tdpbf16ps tmm1, tmm4, tmm7",
                    "tdpbf16ps tmm2, tmm5, tmm6",
                    "tdpbf16ps tmm3, tmm5, tmm7",
                    w0 = in(reg) w0, w1 = in(reg) w1, b0 = in(reg) b, b1 = in(reg) b.wrapping_add(16),
                    sa = in(reg) a_stride, sb = in(reg) b_stride,
                    options(nostack, readonly)
                );
                w0 = w0.wrapping_add(2 * STEP_PAIRS);
                w1 = w1.wrapping_add(2 * STEP_PAIRS);
                b = b.wrapping_add(STEP_PAIRS * PANEL_ROWS);
            }
            asm!(
                "tilestored [{c0} + {s}*1], tmm0",
                "tilestored [{c1} + {s}*1], tmm1",
                "tilestored [{c2} + {s}*1], tmm2",
                "tilestored [{c3} + {s}*1], tmm3",
                c0 = in(reg) c[0], c1 = in(reg) c[1], c2 = in(reg) c[2], c3 = in(reg) c[3], s = in(reg) c_stride,
                options(nostack)
            );
        }
    }
}

impl Drop for Tiles {
    fn drop(&mut self) {
        // SAFETY: releases this thread's tile state (configured in `configure`).
        #[cfg(target_arch = "x86_64")]
        unsafe {
            std::arch::asm!("tilerelease", options(nostack, nomem));
        }
    }
}

/// The part of a task's depth block the tiles take: for columns `c..c + 32` of `w` and every
/// panel of `panels`, whole steps of 16 pairs from `p0`; the pairs left (fewer than 16) are
/// for the AVX512_BF16 kernel. `out` is the task's tile (`tile_rows` per column, panel `i` at
/// row `i · 64`). Returns how many of the `kc` pairs it summed.
///
/// # Safety
/// As for [`Tiles::block`], for every panel in `panels` and `kc` pairs from `p0`.
#[cfg(target_arch = "x86_64")]
pub unsafe fn depth_block(
    tiles: &Tiles,
    a: &RowPanels,
    panels: std::ops::Range<usize>,
    w: &Cols,
    c: usize,
    p0: usize,
    kc: usize,
    out: *mut f32,
    tile_rows: usize,
    add: bool,
) -> usize {
    let steps = kc / STEP_PAIRS;
    if steps == 0 {
        return 0;
    }
    for (i, panel) in panels.enumerate() {
        for row0 in [0, 32] {
            let o = out.wrapping_add(i * PANEL_ROWS + row0);
            unsafe { tiles.block(steps, a.at(panel, p0), row0, w.at(c, p0), w.ld, o, tile_rows, add) };
        }
    }
    steps * STEP_PAIRS
}
