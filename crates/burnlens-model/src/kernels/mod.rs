//! burnlens's own CPU kernels for its hot paths, plugged into Burn through backend
//! extensions.
//!
//! Each kernel is one module with a stated contract (shapes, what it fuses, tolerance against
//! the reference) and three parts: a plain-Rust kernel on `&[f32]`, an implementation for
//! Burn's `Flex` backend (inference) and for `Autodiff<Flex>` (training, with a hand-written
//! backward step), and a public function on [`burn::tensor::Tensor`] that takes the kernel on
//! flex with f32 tensors and Burn's composed ops (`*_reference`) everywhere else. The
//! composed ops are the reference the kernels are tested against; every other backend keeps
//! running them unchanged.
//!
//! | kernel | fuses | module |
//! |---|---|---|
//! | linear | `x W + b` with batch × positions folded into one GEMM over the weight packed once ([`packed`]), per-shape threading, a two-thread matrix-vector path for decoding; bf16/f16 weights widened a block at a time ([`half`]), read for decoding from panels kept beside them ([`half_panels`], [`kept`]), and for prefill on AVX2 from those panels ([`half_panels_prefill`]), on Intel's AVX-512 from a copy widened to f32 ([`half_widened`]); backward `dx = dy Wᵀ`, `dW = xᵀ dy`, `db = Σ dy`; on AVX2 CPUs without AVX-512, the products whose `x` has contiguous rows, and the packed weights' products, through burnlens's own six-by-sixteen tiles (`avx2_gemm.rs`, `avx2_tile.rs`) | [`linear`] |
//! | attention | causal / local-window softmax(q kᵀ · scale) v, tiled over queries (and, past 512 keys, over keys with an online softmax), no `[head, query, key]` tensor (forward or backward); grouped keys/values; keys and values packed once per head in the forward | [`attention`] |
//! | LayerNorm, RMSNorm | mean, variance, normalise, affine in one pass; one-pass backward | [`layer_norm`] |
//! | sigmoid-gated activations | tanh GELU, `gelu_fast`, `quick_gelu`, SiLU as `x σ(αx + βx³)`, forward and backward | [`activation`] |
//! | AdamW | a parameter's two moments and its update in one pass, in place where the optimizer owns the buffers (no fresh tensor per operation) | [`adamw`] |
//! | softmax–cross-entropy | log-sum-exp and the target's logit per row, mean; backward `softmax - onehot` | [`cross_entropy`] |
//! | clipping | `Σ x²` of a gradient in one read, nothing allocated (the global norm), and the gradient scaled in place | [`sum_squares`] |
//! | embedding | the lookup, and a backward that writes its `[vocab, d]` gradient once into its own buffer (flex's zeroes and then copies one) | [`embedding`] |
//! | bf16 products | `linear`'s products under `--compute bf16` ([`compute`]): both operands rounded to bf16 (nearest even, [`bf16_round`]), `k` in adjacent pairs ([`bf16_pack`]: activations in panels of 64 rows, the weight a column at a time — a bf16 checkpoint's read in place), a `vdpbf16ps` micro-kernel of 64 × 6 outputs with f32 sums on AVX512_BF16, the f32 path (or, asked for, an emulation) elsewhere | [`bf16_gemm`] |
//! | softmax | the explicit attention path's pattern: max, exponentials and normalisation per row in one pass; backward `y (dy - Σ dy y)` | [`softmax`] |
//!
//! `BURNLENS_KERNELS=0` (or [`set_enabled`]) turns every kernel off, so that the reference
//! path can be timed or compared in the same build. The first kernel to run also tells
//! glibc's allocator to keep freed buffers for the next step ([`memory`]). Packed weights, half
//! weights converted at load and AdamW's moments live on huge pages where the OS gives them
//! ([`pages`]). Outputs that a kernel writes whole are allocated without zeroing
//! (`unfilled.rs`; [`poison_unfilled`] fills them with NaN for tests).
//!
//! The boundary: the op functions below (each picks its kernel or Burn's composed ops
//! itself), [`runs_on`] for callers choosing between a kernel and a backend's own fused op,
//! [`dot`] (the vectorised dot product, for host loops elsewhere), and the modules another
//! crate or the kernel tests reach are public; the rest (packing
//! layouts, rounding rules, SIMD helpers, the flex plumbing) are the kernels' own.

pub mod activation;
pub mod adamw;
pub mod attention;
mod attention_backward;
#[cfg(target_arch = "x86_64")]
mod avx2_gemm;
#[cfg(target_arch = "x86_64")]
mod avx2_tile;
pub mod bench;
mod bf16_amx;
pub mod bf16_gemm;
mod bf16_pack;
pub mod bf16_path;
mod bf16_round;
pub mod compute;
pub mod cross_entropy;
pub mod embedding;
mod exp;
mod flex;
pub mod gemm;
pub mod half;
mod half_blocked;
mod half_format;
pub mod half_panels;
pub mod half_panels_prefill;
mod half_stream;
pub mod half_widened;
mod kept;
pub mod layer_norm;
pub mod linear;
mod lines;
mod mat_ref;
pub mod memory;
pub mod packed;
pub mod pages;
mod panel_fill;
pub mod pool;
pub mod prefetch;
mod simd;
pub mod softmax;
pub mod sum_squares;
mod transpose16;
mod unfilled;

pub use activation::{gated_activation, gated_activation_reference};
pub use attention::{AttentionMask, attention, attention_reference};
pub use compute::{Compute, compute, set_compute};
pub use cross_entropy::{cross_entropy, cross_entropy_reference};
pub use embedding::embedding;
pub use flex::{Op, calls, enabled, is_flex, runs_on, set_enabled};
pub use layer_norm::{layer_norm, layer_norm_reference, rms_norm, rms_norm_reference};
pub use linear::{linear, linear_reference};
pub use simd::dot_here as dot;
pub use softmax::{softmax, softmax_reference};
pub use sum_squares::{scale, sum_squares, sum_squares_reference};
pub use unfilled::poison_unfilled;
