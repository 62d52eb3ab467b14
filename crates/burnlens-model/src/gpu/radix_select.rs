//! The `k`-th largest value of each row of a `[rows, width]` f32 matrix on a GPU: a radix
//! selection over the values' order-preserving 32-bit keys ([`f32::total_cmp`]'s order:
//! negative values with every bit flipped, the others with the sign bit set), eight bits a
//! round, most significant first.
//!
//! A round is two launches. `radix_count`: each cube of 256 units reads its slice of a row
//! (a few thousand values) and counts, in a 256-bin histogram in shared memory, the digit of
//! every value whose higher bits equal the answer's bits fixed so far; it adds its bins to
//! the row's histogram in global memory. `radix_choose`: one unit per row walks the row's
//! bins from the top, finds the bin holding the `k`-th largest of the values still in the
//! running, fixes those eight bits of the answer, takes the counts above it off `k` and
//! clears the bins for the next round. After four rounds the answer's key is the `k`-th
//! largest key exactly (ties, −∞ and −0.0 included), and `radix_value` turns it back into
//! an f32. Nothing is read back; each launch reads the row once (the bisection this
//! replaces on the GPU read it 32–64 times and read a boolean back every 32 steps).
//!
//! A row spans as many cubes as it needs (`PER_CUBE` values each), so a TopK batch
//! (`[4096, 24576]`: six cubes a row) and BatchTopK's one row of the whole batch
//! (`[1, 100M]`: 24,415 cubes) both fill the device.

use burn::backend::{Backend, DispatchDevice, backend_extension, tensor::FloatTensor};
use burn::tensor::{DType, Tensor};
use burn_cubecl::CubeBackend;
use burn_cubecl::ops::numeric::empty_device_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::grid::GRID_LIMIT;

/// Units per cube; also the histogram's bins (one bin per unit to clear and flush).
const UNITS: u32 = 256;
/// Values one cube counts per round (a multiple of [`UNITS`]).
const PER_CUBE: u32 = 4096;

/// The extension that carries a dispatch tensor to the `Cube` backend's kernel.
#[backend_extension(Cube, Fusion: cfg(feature = "fusion"))]
pub trait RadixSelect: Backend {
    /// Per row, the `k`-th largest value, `[rows, 1]`.
    #[fusion(dtype = x, shape = burn::tensor::Shape::new([x[0], 1]))]
    fn radix_kth_largest_rows(x: FloatTensor<Self>, k: usize) -> FloatTensor<Self>;
}

impl RadixSelect for CubeBackend {
    fn radix_kth_largest_rows(x: CubeTensor, k: usize) -> CubeTensor {
        launch(burn_cubecl::kernel::into_contiguous(x), k as u32)
    }
}

/// See [`super::kth_largest_rows_runs`]: a plain f32 tensor on a `Cube` device, `1 ≤ k ≤`
/// its width, and a grid within the launch limits.
pub fn applies(x: &Tensor<2>, k: usize) -> bool {
    let [rows, width] = x.dims();
    let on_cube = matches!(x.device().inner().as_dispatch(), DispatchDevice::Cube(_));
    let fits = (1..=GRID_LIMIT).contains(&rows) && width.div_ceil(PER_CUBE as usize) <= GRID_LIMIT && width < u32::MAX as usize;
    on_cube && fits && !x.is_autodiff() && x.dtype() == DType::F32 && k >= 1 && k <= width
}

/// See [`super::kth_largest_rows`].
pub fn kth_largest_rows(x: &Tensor<2>, k: usize) -> Option<Tensor<2>> {
    if !applies(x, k) {
        return None;
    }
    Some(Tensor::from_dispatch(<burn::backend::Dispatch as RadixSelect>::radix_kth_largest_rows(x.clone().into_dispatch(), k)))
}

/// The four rounds and the conversion back, on `x` (contiguous f32).
fn launch(x: CubeTensor, k: u32) -> CubeTensor {
    let (rows, width) = (x.meta.shape()[0], x.meta.shape()[1]);
    let client = x.client.clone();
    let state = |v: u32, n: usize| client.create_from_slice(u32::as_bytes(&vec![v; n]));
    let (prefix, left, hist) = (state(0, rows), state(k, rows), state(0, rows * UNITS as usize));
    let cubes = width.div_ceil(PER_CUBE as usize) as u32;
    let row_units = (rows as u32).div_ceil(UNITS);
    for round in 0..4u32 {
        let shift = 24 - 8 * round;
        // The bits above this round's digit: none in the first round.
        let high = if round == 0 { 0 } else { u32::MAX << (shift + 8) };
        radix_count::launch(
            &client,
            CubeCount::Static(cubes, rows as u32, 1),
            CubeDim::new_1d(UNITS),
            unsafe { BufferArg::from_raw_parts(x.handle.clone(), rows * width) },
            unsafe { BufferArg::from_raw_parts(prefix.clone(), rows) },
            unsafe { BufferArg::from_raw_parts(hist.clone(), rows * UNITS as usize) },
            width as u32,
            high,
            shift,
            PER_CUBE / UNITS,
        );
        radix_choose::launch(
            &client,
            CubeCount::Static(row_units, 1, 1),
            CubeDim::new_1d(UNITS),
            unsafe { BufferArg::from_raw_parts(hist.clone(), rows * UNITS as usize) },
            unsafe { BufferArg::from_raw_parts(prefix.clone(), rows) },
            unsafe { BufferArg::from_raw_parts(left.clone(), rows) },
            rows as u32,
            shift,
        );
    }
    let out = empty_device_dtype(client.clone(), x.device.clone(), [rows, 1].into(), DType::F32);
    radix_value::launch(
        &client,
        CubeCount::Static(row_units, 1, 1),
        CubeDim::new_1d(UNITS),
        unsafe { BufferArg::from_raw_parts(prefix, rows) },
        unsafe { BufferArg::from_raw_parts(out.handle.clone(), rows) },
        rows as u32,
    );
    out
}

/// `v`'s key: unsigned order equals [`f32::total_cmp`]'s.
#[cube]
fn order_key(v: f32) -> u32 {
    let bits = u32::reinterpret(v);
    let mut key = bits | 0x8000_0000u32;
    if bits >= 0x8000_0000u32 {
        key = bits ^ 0xFFFF_FFFFu32;
    }
    key
}

/// One round's counts: cube `(c, r)` counts row `r`'s values `c·PER_CUBE ..` (`steps`
/// strides of its 256 units) whose bits under `high` equal the answer's so far, by their
/// digit `(key >> shift) & 255`.
#[cube(launch)]
fn radix_count(x: &[f32], prefix: &[u32], hist: &[Atomic<u32>], width: u32, high: u32, shift: u32, #[comptime] steps: u32) {
    let row = CUBE_POS_Y;
    let local = Shared::<[Atomic<u32>]>::new_slice(256usize);
    local[UNIT_POS as usize].store(0u32);
    sync_cube();
    let want = prefix[row as usize] & high;
    let start = CUBE_POS_X * steps * 256u32;
    let base = row as usize * width as usize;
    for step in 0..steps {
        let i = start + step * 256u32 + UNIT_POS;
        if i < width {
            let key = order_key(x[base + i as usize]);
            if (key & high) == want {
                local[((key >> shift) & 255u32) as usize].fetch_add(1u32);
            }
        }
    }
    sync_cube();
    let count = local[UNIT_POS as usize].load();
    if count > 0u32 {
        hist[(row * 256u32 + UNIT_POS) as usize].fetch_add(count);
    }
}

/// One round's choice, a unit per row: the highest digit whose bin, with the bins above
/// it, reaches the `k` still sought; its bits join the answer and the bins above leave `k`.
#[cube(launch)]
fn radix_choose(hist: &mut [u32], prefix: &mut [u32], left: &mut [u32], rows: u32, shift: u32) {
    let row = ABSOLUTE_POS_X;
    if row < rows {
        let mut k = left[row as usize];
        let mut digit = 0u32;
        let mut found = false;
        for j in 0..256u32 {
            let d = 255u32 - j;
            let at = (row * 256u32 + d) as usize;
            let count = hist[at];
            hist[at] = 0u32;
            if !found {
                if k <= count {
                    digit = d;
                    found = true;
                } else {
                    k -= count;
                }
            }
        }
        prefix[row as usize] |= digit << shift;
        left[row as usize] = k;
    }
}

/// The answer's key back to its f32.
#[cube(launch)]
fn radix_value(prefix: &[u32], out: &mut [f32], rows: u32) {
    let row = ABSOLUTE_POS_X;
    if row < rows {
        let key = prefix[row as usize];
        let mut bits = key ^ 0xFFFF_FFFFu32;
        if key >= 0x8000_0000u32 {
            bits = key ^ 0x8000_0000u32;
        }
        out[row as usize] = f32::reinterpret(bits);
    }
}
