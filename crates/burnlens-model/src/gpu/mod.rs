//! burnlens's own GPU kernels, written in CubeCL (they compile for every CubeCL runtime
//! Burn's `Cube` backend runs: wgpu — Mesa's lavapipe included, which runs them on the CPU
//! for tests — and CUDA), plugged into Burn through a backend extension for `Cube`: each
//! implemented for the unfused `CubeBackend`, and with the `fusion` feature lowered by Burn's
//! extension macro to an opaque operation of `Fusion<CubeBackend>`'s lazy stream (the
//! autodiff backward passes call the extensions again, so they run fused or not alike).
//!
//! Each public function here answers `None` where its kernel does not apply (a build without
//! `wgpu` or `cuda`, a tensor on another backend, a shape past the kernel's limits), and the
//! caller keeps its composed-ops path for those.
//!
//! | kernel | does | module |
//! |---|---|---|
//! | radix selection | the `k`-th largest value of each row (TopK, BatchTopK and the auxiliary loss's choice), four passes and no read-back | `radix_select` |
//! | sparse decode | `acts · W_dec` from each row's listed non-zeros (TopK's `k`; or a mask's, for the auxiliary loss), and under autodiff the activations' gradient on their support and the decoder's from the non-zeros | `sparse_decode` |
//! | sparse-transpose product | `Sᵀ · D` for a mostly-zero `S`, walking each column of `S` once: the decoder's and encoder's gradients in a TopK step | `sparse_t_product` |
//! | product with a sparse gradient | `a · b` exactly, its backward reading only the output gradient's non-zeros (the encoder's product in a TopK step) | `sparse_grad_product` |
//! | row listing | each row's non-zero values (the sparse decode's listing alone): BatchTopK's candidates over ranks, a graph's active features | `row_values` |
//! | dashboard bin counts | a batch's per-feature histogram bins (by each bin's least member), quantile-interval counts and centre zeros for the dashboards' second pass, a unit per feature column, one launch | `bin_counts` |
//! | support gradient | the sparse decode's backward for the activations, on their support, from the rows' lists made again (every tensor a backward keeps is its backend's own, fused or not) | `sparse_decode` |
//! | exact f32 product | `a · b` in f32 arithmetic on cubek's unit-level kernel (never TF32), forward and autodiff backward: every product [`crate::matmul`] routes here by default | `exact_matmul` |
//! | row norm | LayerNorm or RMSNorm of each row in one launch (nine composed launches), and under autodiff its backward in four (`row_norm_grad`: row statistics, the input's gradient, the weight's partial sums) | `row_norm`, `row_norm_grad` |
//! | row softmax | softmax of each row in one launch (five composed), and attention's pattern from the raw scores with the scale and causal mask applied as it reads them (seven composed); its autodiff backward in one more | `row_softmax` |
//! | decode attention | a few new queries' attention over the cache in one launch (five written out): scores, a running softmax over tiles of keys and the values' sum, keys and values read in the cache's buffers, grouped heads without copies; long caches with few queries split into ranges of keys and combined by a second launch; inference only | `decode_attention` |
//! | prompt attention | a prompt's causal attention in one launch (five written out), in f32: cubek's flash attention on its unit routine, named (Burn's own attention autotunes over the TF32 tensor-core routine too); inference only | `flash_attention` |
//! | Adam step | a parameter's Adam or AdamW step (moments and value) in one launch (thirteen to fifteen composed), the gradient scaled by a clipping factor on the device | `adam_step` |
//! | gated activation | `x σ(αx + βx³)` (tanh GELUs, `quick_gelu`, SiLU) in one launch (up to twelve composed), and its autodiff backward in one more | `gated_activation` |
//!
//! `cube_reduce` holds the sums and maxima over a cube that the row kernels share, `grid` the
//! launch grid's limit every kernel keeps to, `adam_rule` the arithmetic an Adam step names,
//! `switch` which of the one-launch kernels run (`BURNLENS_GPU_ROW_KERNELS`; these two built
//! with or without a GPU).

/// Whether Burn's operation fusion wraps the `Cube` backends in this build (the `fusion`
/// feature): chains of element-wise operations run as one kernel, and burnlens's kernels
/// below as opaque operations of the fused stream.
pub const FUSED: bool = cfg!(feature = "fusion");

mod adam_rule;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod adam_step;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod bin_counts;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod cube_reduce;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod decode_attention;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod exact_matmul;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod flash_attention;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod gated_activation;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod grid;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod radix_select;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod row_norm;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod row_norm_grad;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod row_softmax;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod row_values;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod sparse_decode;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod sparse_grad_product;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod sparse_t_product;
mod switch;

pub use adam_rule::AdamRule;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
use burn::tensor::DType;
use burn::tensor::{Bool, Device, Tensor};
pub use switch::OneLaunch;

/// `x σ(αx + βx³)` element-wise in one launch on the tensor's GPU ([`gated_activation`]'s
/// kernel); `None` where it does not run (see [`gated_activation_runs`]).
pub fn gated_activation<const D: usize>(x: Tensor<D>, alpha: f32, beta: f32) -> Option<Tensor<D>> {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        gated_activation::gated_activation(x, alpha, beta)
    }
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    {
        let _ = (x, alpha, beta);
        None
    }
}

/// Whether [`gated_activation`] runs on `x`: f32 on a `Cube` device (tracked or not).
pub fn gated_activation_runs<const D: usize>(x: &Tensor<D>) -> bool {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        OneLaunch::Activation.runs() && gated_activation::applies(x)
    }
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    {
        let _ = x;
        false
    }
}

/// LayerNorm (where `bias`) or RMSNorm of `x: [.., d]` over its last dimension in one launch on
/// the tensor's GPU ([`row_norm`]'s kernel, with its backward under autodiff); `None` where it
/// does not run: not a `Cube` device, not all f32, or tracked only in part.
pub fn row_norm<const D: usize>(x: Tensor<D>, weight: Tensor<1>, bias: Option<Tensor<1>>, eps: f64) -> Option<Tensor<D>> {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        row_norm::row_norm(x, weight, bias, eps)
    }
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    {
        let _ = (x, weight, bias, eps);
        None
    }
}

/// Whether [`row_norm`] runs on `x` with these parameters (weight, and bias for a LayerNorm).
pub fn row_norm_runs<const D: usize>(x: &Tensor<D>, params: &[&Tensor<1>]) -> bool {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        OneLaunch::Norm.runs() && row_norm::applies(x, params)
    }
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    {
        let _ = (x, params);
        false
    }
}

/// Softmax of `x` over its last dimension in one launch on the tensor's GPU
/// ([`row_softmax`]'s kernel); `None` where it does not run (see [`softmax_runs`]).
pub fn softmax<const D: usize>(x: Tensor<D>) -> Option<Tensor<D>> {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        row_softmax::softmax(x)
    }
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    {
        let _ = x;
        None
    }
}

/// Attention's pattern from the raw scores `q kᵀ` (`[batch, heads, queries, keys]`, f32 on a
/// `Cube` device, tracked or not) in one launch: the softmax of `scale ·` each row over the
/// keys its query sees — the query at position `q_offset +` its index sees the keys up to
/// its own, and only the last `window` of them where `window > 0` — and 0 for the others;
/// under autodiff its backward in one more. `None` where it does not run (and where
/// `BURNLENS_GPU_ROW_KERNELS` leaves it out: [`OneLaunch::Pattern`]).
pub fn attention_pattern(scores: Tensor<4>, scale: f32, q_offset: usize, window: usize) -> Option<Tensor<4>> {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        if !OneLaunch::Pattern.runs() {
            return None;
        }
        row_softmax::attention_pattern(scores, scale, q_offset, window)
    }
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    {
        let _ = (scores, scale, q_offset, window);
        None
    }
}

/// Attention of `q: [batch, heads, queries, d_head]` over `k`, `v: [batch, kv_heads, keys,
/// d_head]` (any strides: the KV cache's views) in one launch on their GPU, as `z: [batch,
/// queries, heads, d_head]`: the softmax of `scale · q·k` over the keys each query sees (the
/// query at position `q_offset +` its index sees the keys up to its own, only the last
/// `window` where `window > 0`) weighting the values ([`decode_attention`]'s kernel). `None`
/// where it does not run: see [`decode_attention_on`], and past its shapes (heads wider
/// than 256, key heads not dividing the query heads).
pub fn decode_attention(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, scale: f32, q_offset: usize, window: usize) -> Option<Tensor<4>> {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        if !OneLaunch::Decode.runs() {
            return None;
        }
        decode_attention::decode_attention(q, k, v, scale, q_offset, window)
    }
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    {
        let _ = (q, k, v, scale, q_offset, window);
        None
    }
}

/// How many times [`decode_attention`]'s kernel ran in this process.
pub fn decode_attention_calls() -> usize {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        decode_attention::calls()
    }
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    {
        0
    }
}

/// A prompt's causal attention `softmax(q kᵀ / √d_head) v` of `q`, `k`, `v: [batch, heads,
/// pos, d_head]` (keys and values repeated for every query head) on their GPU in one launch,
/// in f32 arithmetic ([`flash_attention`]'s kernel: cubek's flash attention on its unit
/// routine), as `z: [batch, pos, heads, d_head]` (the output projection's rows); `mask`
/// (`[batch or 1, 1, pos, pos]`, true where a key is hidden: a local window's, padding's) hides more. `None` where it does not run: not asked
/// ([`OneLaunch::Flash`]), a tracked or non-f32 tensor, another device, a head width not a
/// multiple of 8 up to 256, a `scale` other than `1/√d_head`.
pub fn flash_attention(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, scale: f32, mask: Option<Tensor<4, Bool>>) -> Option<Tensor<4>> {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        if !OneLaunch::Flash.runs() {
            return None;
        }
        flash_attention::flash_attention_causal(q, k, v, scale, mask)
    }
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    {
        let _ = (q, k, v, scale, mask);
        None
    }
}

/// Whether [`flash_attention`] may take a prompt's attention on `device`: a `Cube` device
/// without autodiff, the kernel not left out ([`OneLaunch::Flash`]).
pub fn flash_attention_on(device: &Device) -> bool {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        OneLaunch::Flash.runs() && !device.is_autodiff() && exact_matmul::on_cube(device)
    }
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    {
        let _ = device;
        false
    }
}

/// [`flash_attention`]'s calls in this process: `(ran, declined by cubek)` (declined: Burn's
/// composed attention took the call).
pub fn flash_attention_calls() -> (usize, usize) {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        (flash_attention::calls(), flash_attention::declined())
    }
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    {
        (0, 0)
    }
}

/// How many of [`decode_attention`]'s calls in this process split the keys into ranges (long
/// caches, few queries: two launches).
pub fn decode_attention_split_calls() -> usize {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        decode_attention::split_calls()
    }
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    {
        0
    }
}

/// Whether [`decode_attention`] may take `queries` new queries on `device`: a `Cube` device
/// without autodiff, at most a few queries (decoding), the kernel not left out
/// ([`OneLaunch::Decode`], `BURNLENS_GPU_ROW_KERNELS`).
pub fn decode_attention_on(device: &Device, queries: usize) -> bool {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        OneLaunch::Decode.runs() && !device.is_autodiff() && exact_matmul::on_cube(device) && queries <= decode_attention::MAX_QUERIES
    }
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    {
        let _ = (device, queries);
        false
    }
}

/// One Adam step of the parameter `p` with moments `m`, `v` and gradient `g` (times `clip`,
/// a one-element tensor on the device, where given) by `rule`, in one launch on their GPU
/// ([`adam_step`]'s kernel): the new `(p, m, v)`. `None` where it does not run (plain f32 on a
/// `Cube` device, one shape; not where `BURNLENS_GPU_ROW_KERNELS` leaves it out:
/// [`OneLaunch::Adam`]).
pub fn adam_step<const D: usize>(
    p: Tensor<D>,
    m: Tensor<D>,
    v: Tensor<D>,
    g: Tensor<D>,
    clip: Option<Tensor<1>>,
    rule: AdamRule,
) -> Option<(Tensor<D>, Tensor<D>, Tensor<D>)> {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        if !OneLaunch::Adam.runs() {
            return None;
        }
        adam_step::adam_step(p, m, v, g, clip, rule)
    }
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    {
        let _ = (p, m, v, g, clip, rule);
        None
    }
}

/// Whether [`softmax`] runs on `x`: f32 on a `Cube` device (tracked or not).
pub fn softmax_runs<const D: usize>(x: &Tensor<D>) -> bool {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        OneLaunch::Softmax.runs() && row_softmax::applies(x)
    }
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    {
        let _ = x;
        false
    }
}

/// The `k`-th largest value of each row of `x` (`1 ≤ k ≤` its width), `[rows, 1]`, in
/// [`f32::total_cmp`]'s order, computed on the tensor's GPU by burnlens's radix-selection
/// kernel; `None` where that kernel does not run (see the module's note). `x` must not be
/// tracked by autodiff.
pub fn kth_largest_rows(x: &Tensor<2>, k: usize) -> Option<Tensor<2>> {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        radix_select::kth_largest_rows(x, k)
    }
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    {
        let _ = (x, k);
        None
    }
}

/// Each row's non-zero values of `x` (`[rows, width]`, plain f32), up to `cap` a row, listed
/// on the tensor's GPU in a fixed order (the kernel's units', not the columns'): `[rows, cap]`,
/// a row's entries past its number of non-zeros unspecified (count them first). `None` where the kernel does not run (as
/// [`kth_largest_rows`], or past `65,535` rows).
pub fn row_values(x: &Tensor<2>, cap: usize) -> Option<Tensor<2>> {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        row_values::row_values(x, cap)
    }
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    {
        let _ = (x, cap);
        None
    }
}

/// Each row's non-zero values of `x` read back, and only they: counted on the device (one
/// `[rows]` read), then listed there by [`row_values`] at the largest count. The order within
/// a row is the kernel's, the same for any two tensors with the same non-zeros. `None` where
/// the kernel does not run.
pub fn row_nonzeros(x: &Tensor<2>) -> Option<Vec<Vec<f32>>> {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        if !row_values::applies(x, 1) {
            return None;
        }
        let counts: Vec<i64> = x.clone().not_equal_elem(0.0).int().sum_dim(1).into_data().convert::<i64>().try_into_vec::<i64>().ok()?;
        let cap = counts.iter().copied().max().unwrap_or(0).max(1) as usize;
        let v: Vec<f32> = row_values::row_values(x, cap)?.into_data().try_into_vec_as::<f32>().ok()?;
        Some(counts.iter().enumerate().map(|(r, &c)| v[r * cap..r * cap + c as usize].to_vec()).collect())
    }
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    {
        let _ = x;
        None
    }
}

/// Whether [`kth_largest_rows`] runs its kernel for `x` and `k` (rather than answer `None`).
pub fn kth_largest_rows_runs(x: &Tensor<2>, k: usize) -> bool {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        radix_select::applies(x, k)
    }
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    {
        let _ = (x, k);
        false
    }
}

/// `a · b` over the last two dimensions in exact f32 arithmetic on the tensors' GPU (tracked
/// by autodiff or not; see `exact_matmul`), or `None` where that route does not run: a build
/// without `wgpu`/`cuda`, another backend, a dtype other than f32, a rank outside 2..=4, or
/// leading dimensions that would broadcast.
pub fn exact_matmul<const D: usize>(a: Tensor<D>, b: Tensor<D>) -> Option<Tensor<D>> {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        exact_matmul::applies(&a, &b).then(|| exact_matmul::exact_matmul(a, b))
    }
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    {
        let _ = (a, b);
        None
    }
}

/// Whether [`exact_matmul`] runs its kernel for `a` and `b`.
pub fn exact_matmul_runs<const D: usize>(a: &Tensor<D>, b: &Tensor<D>) -> bool {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        exact_matmul::applies(a, b)
    }
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    {
        let _ = (a, b);
        false
    }
}

/// Whether `device` is one [`exact_matmul`] runs on (a `Cube` GPU, under autodiff or not).
pub fn exact_matmul_on(device: &Device) -> bool {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        exact_matmul::on_cube(device)
    }
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    {
        let _ = device;
        false
    }
}

/// How many products this process ran on [`exact_matmul`]'s kernel (forward and backward):
/// tests prove a path went through it.
pub fn exact_matmul_calls() -> usize {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        exact_matmul::calls()
    }
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    {
        0
    }
}

/// A sparse dictionary's decode `acts · w` (`acts: [rows, d_sae]`, `w: [d_sae, d]`) on the
/// tensors' GPU from each row's non-zeros, expecting at most `cap` per row (a row with more
/// is read whole); or `None` where the kernels do not run (as [`exact_matmul`]). Under
/// autodiff the gradient of `acts` is computed **on its support only** (zero where `acts` is
/// zero): exact where what made `acts` passes no gradient through its zeros (TopK, BatchTopK,
/// ReLU); the gradient of `w`, `actsᵀ · g`, reads only the non-zeros of `acts` too.
pub fn decode_sparse(acts: Tensor<2>, w: Tensor<2>, cap: usize) -> Option<Tensor<2>> {
    decode_sparse_on(acts.clone(), acts, w, cap)
}

/// [`decode_sparse`] for activations that are zero off the non-zeros of `support` (a mask of
/// their shape, or the activations themselves; never given a gradient), with their gradient
/// on all of that support — zeros of `acts` inside it included: exact for `x ⊙ mask`
/// whatever `x` (the auxiliary loss's kept pre-activations).
pub fn decode_sparse_on(acts: Tensor<2>, support: Tensor<2>, w: Tensor<2>, cap: usize) -> Option<Tensor<2>> {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        let same = support.dims() == acts.dims() && support.dtype() == DType::F32 && exact_matmul::on_cube(&support.device());
        (same && sparse_decode::applies(&acts, &w, cap)).then(|| {
            let support = if support.is_autodiff() { support.inner() } else { support };
            let support = if acts.is_autodiff() { support.autodiff() } else { support };
            sparse_decode::decode_sparse(acts, support, w, cap)
        })
    }
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    {
        let _ = (acts, support, w, cap);
        None
    }
}

/// `a · b` (`[n, k] · [k, m]`) in exact f32 on the tensors' GPU, for a product whose output
/// gradient holds about `cap` non-zeros a row (the encoder's in a TopK step): under autodiff
/// both operands' gradients read only that gradient's non-zeros, exactly for any gradient.
/// `None` where the kernels do not run (as [`exact_matmul`]).
pub fn product_sparse_grad(a: Tensor<2>, b: Tensor<2>, cap: usize) -> Option<Tensor<2>> {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        sparse_grad_product::applies(&a, &b, cap).then(|| sparse_grad_product::product_sparse_grad(a, b, cap))
    }
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    {
        let _ = (a, b, cap);
        None
    }
}

/// The dashboards' second-pass counts of a batch on its GPU, or `None` where the kernel does
/// not run (as [`exact_matmul`]); see [`BinCountInput`].
pub fn bin_counts(input: BinCountInput) -> Option<Tensor<2>> {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        let BinCountInput { acts, thresholds, top, bounds, centre } = input;
        bin_counts::applies(acts, thresholds, top, bounds).then(|| bin_counts::bin_counts(acts, thresholds, top, bounds, centre))
    }
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    {
        let _ = input;
        None
    }
}

/// What [`bin_counts`] counts: `acts` `[rows, n]` (a column per feature), each feature's
/// histogram thresholds `[bins, n]` (each bin's least member, rising), its histogram's upper
/// end `[1, n]`, its quantile boundaries `[intervals + 1, n]`, and `centre` = `[seq_len,
/// first, end]`: the window positions `first..end` an example may be centred on. The answer
/// is `[bins + 2 · intervals + 1, n]`: positives per bin (within `thresholds[0] ..= top`),
/// then per interval the positives in it (both ends inclusive) over all rows and over the
/// centre rows, then the centre's zeros.
pub struct BinCountInput<'a> {
    pub acts: &'a Tensor<2>,
    pub thresholds: &'a Tensor<2>,
    pub top: &'a Tensor<2>,
    pub bounds: &'a Tensor<2>,
    pub centre: [usize; 3],
}
