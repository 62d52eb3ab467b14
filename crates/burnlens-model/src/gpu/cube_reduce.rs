//! Sums and maxima over one cube's units (32 to 256): a tree in shared memory, every unit
//! getting the answer. What the row kernels ([`super::row_norm`], [`super::row_softmax`])
//! reduce a row with.

use cubecl::prelude::*;

/// The units of a cube that takes rows of `d` values: `d` rounded up to a power of two (the
/// tree halves it), from 32 (a warp) to 256, so a short row (a decoded token's attention
/// scores, a small model's norms) does not wait on idle units at every step of the tree.
pub(super) fn row_units(d: usize) -> u32 {
    d.next_power_of_two().clamp(32, 256) as u32
}

/// The sum of every unit's `v` over the cube (every unit gets it).
#[cube]
pub(super) fn cube_sum(v: f32, shared: &mut Shared<[f32]>) -> f32 {
    cube_fold(v, shared, false)
}

/// The largest of every unit's `v` over the cube (every unit gets it).
#[cube]
pub(super) fn cube_max(v: f32, shared: &mut Shared<[f32]>) -> f32 {
    cube_fold(v, shared, true)
}

/// The sum (or where `max` the largest) of every unit's `v`: a tree over the cube's units (a
/// power of two), `shared` holding one value each.
#[cube]
fn cube_fold(v: f32, shared: &mut Shared<[f32]>, #[comptime] max: bool) -> f32 {
    shared[UNIT_POS as usize] = v;
    sync_cube();
    let mut half = CUBE_DIM_X / 2u32;
    while half > 0u32 {
        if UNIT_POS < half {
            let mine = shared[UNIT_POS as usize];
            let other = shared[(UNIT_POS + half) as usize];
            let mut folded = mine + other;
            if max {
                folded = f32::max(mine, other);
            }
            shared[UNIT_POS as usize] = folded;
        }
        sync_cube();
        half /= 2u32;
    }
    let folded = shared[0usize];
    // Every unit reads the answer before the next reduction overwrites it.
    sync_cube();
    folded
}
