//! The feature dashboards' second-pass counts of one batch in one launch: for each feature
//! (a column of `acts: [rows, n]`), its positive activations per histogram bin (bin `b` from
//! the least threshold at or below the value, the thresholds being each bin's least member,
//! so the bins are the host's `torch.histc` arithmetic exactly), its positives in each
//! quantile interval (both ends inclusive) over all rows and over the rows an example may be
//! centred on, and the centre's zeros.
//!
//! `bin_counts`: a unit per column walks every row in order and adds to its own column of
//! the output, so nothing is shared between units (no atomics) and the counts are exact
//! (f32 holds every count up to 2²⁴ rows). A warp reads 32 adjacent columns of a row at a
//! time. The composed-ops path it replaces made one `[rows, n]` comparison and reduction per
//! threshold and boundary, about 70 launches a batch.

use burn::backend::{Backend, DispatchDevice, backend_extension, tensor::FloatTensor};
use burn::tensor::{DType, Tensor};
use burn_cubecl::CubeBackend;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::zeros_client;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

/// Units per cube.
const UNITS: u32 = 256;

/// The extension that carries dispatch tensors to the `Cube` backend's kernel.
#[backend_extension(Cube, Fusion: cfg(feature = "fusion"))]
pub trait BinCounts: Backend {
    /// `[bins + 2 · intervals + 1, n]` counts; `centre` is `[seq_len, first, end]` of the
    /// positions an example may be centred on.
    #[fusion(dtype = acts, shape = burn::tensor::Shape::new([thresholds[0] + 2 * (bounds[0] - 1) + 1, acts[1]]))]
    fn bl_bin_counts(
        acts: FloatTensor<Self>,
        thresholds: FloatTensor<Self>,
        top: FloatTensor<Self>,
        bounds: FloatTensor<Self>,
        centre: [usize; 3],
    ) -> FloatTensor<Self>;
}

impl BinCounts for CubeBackend {
    fn bl_bin_counts(acts: CubeTensor, thresholds: CubeTensor, top: CubeTensor, bounds: CubeTensor, centre: [usize; 3]) -> CubeTensor {
        launch([acts, thresholds, top, bounds].map(into_contiguous), centre)
    }
}

/// Whether the kernel takes these operands: f32 on a `Cube` device, `[rows, n]`,
/// `[bins, n]`, `[1, n]` and `[intervals + 1, n]`, rows within f32's exact counts.
pub fn applies(acts: &Tensor<2>, thresholds: &Tensor<2>, top: &Tensor<2>, bounds: &Tensor<2>) -> bool {
    let [rows, n] = acts.dims();
    let on_cube = matches!(acts.device().inner().as_dispatch(), DispatchDevice::Cube(_));
    let shapes = thresholds.dims()[1] == n && top.dims() == [1, n] && bounds.dims()[1] == n && bounds.dims()[0] >= 2 && thresholds.dims()[0] >= 1;
    let sizes = rows < 1 << 24 && rows * n < u32::MAX as usize && n.div_ceil(UNITS as usize) <= 65_535;
    let all_f32 = [acts, thresholds, top, bounds].iter().all(|t| t.dtype() == DType::F32 && !t.is_autodiff());
    on_cube && shapes && sizes && all_f32
}

/// See [`super::bin_counts`]; the caller checked [`applies`].
pub fn bin_counts(acts: &Tensor<2>, thresholds: &Tensor<2>, top: &Tensor<2>, bounds: &Tensor<2>, centre: [usize; 3]) -> Tensor<2> {
    let t = |x: &Tensor<2>| x.clone().into_dispatch();
    Tensor::from_dispatch(<burn::backend::Dispatch as BinCounts>::bl_bin_counts(t(acts), t(thresholds), t(top), t(bounds), centre))
}

fn launch([acts, thresholds, top, bounds]: [CubeTensor; 4], [seq_len, first, end]: [usize; 3]) -> CubeTensor {
    let (rows, n) = (acts.meta.shape()[0], acts.meta.shape()[1]);
    let (bins, intervals) = (thresholds.meta.shape()[0], bounds.meta.shape()[0] - 1);
    let out_rows = bins + 2 * intervals + 1;
    let client = acts.client.clone();
    let out = zeros_client(client.clone(), acts.device.clone(), [out_rows, n].into(), DType::F32);
    bin_counts_kernel::launch(
        &client,
        CubeCount::Static(n.div_ceil(UNITS as usize) as u32, 1, 1),
        CubeDim::new_1d(UNITS),
        unsafe { BufferArg::from_raw_parts(acts.handle.clone(), rows * n) },
        unsafe { BufferArg::from_raw_parts(thresholds.handle.clone(), bins * n) },
        unsafe { BufferArg::from_raw_parts(top.handle.clone(), n) },
        unsafe { BufferArg::from_raw_parts(bounds.handle.clone(), (intervals + 1) * n) },
        unsafe { BufferArg::from_raw_parts(out.handle.clone(), out_rows * n) },
        rows as u32,
        n as u32,
        seq_len as u32,
        first as u32,
        end as u32,
        bins as u32,
        intervals as u32,
    );
    out
}

/// Column `ABSOLUTE_POS_X`: every row in order, its counts added to its own output column.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn bin_counts_kernel(
    acts: &[f32],
    thresholds: &[f32],
    top: &[f32],
    bounds: &[f32],
    out: &mut [f32],
    rows: u32,
    n: u32,
    seq_len: u32,
    first: u32,
    end: u32,
    bins: u32,
    intervals: u32,
) {
    let col = ABSOLUTE_POS_X;
    if col < n {
        let c = col as usize;
        let nn = n as usize;
        let lo = thresholds[c];
        let hi = top[c];
        let zeros_at = (bins + 2u32 * intervals) as usize * nn + c;
        for r in 0..rows {
            let a = acts[r as usize * nn + c];
            let p = r % seq_len;
            let centre = p >= first && p < end;
            if a > 0.0f32 {
                if a >= lo && a <= hi {
                    // The thresholds rise: the last one at or below `a` is its bin.
                    let mut bin = 0u32;
                    for b in 1..bins {
                        if thresholds[b as usize * nn + c] <= a {
                            bin = b;
                        }
                    }
                    out[bin as usize * nn + c] += 1.0f32;
                }
                for i in 0..intervals {
                    if a >= bounds[i as usize * nn + c] && a <= bounds[(i + 1u32) as usize * nn + c] {
                        let at = (bins + 2u32 * i) as usize * nn + c;
                        out[at] += 1.0f32;
                        if centre {
                            out[at + nn] += 1.0f32;
                        }
                    }
                }
            } else if a == 0.0f32 && centre {
                out[zeros_at] += 1.0f32;
            }
        }
    }
}
