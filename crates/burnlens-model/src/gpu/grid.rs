//! The launch grid's limit, one for every kernel here.

/// The most cubes a launch's grid holds along one dimension on every backend here (wgpu's
/// limit along each, CUDA's along y and z): a kernel here whose shape needs more declines, and
/// its caller takes the composed route, or loops its cubes over the rows past it.
pub(super) const GRID_LIMIT: usize = 65_535;
