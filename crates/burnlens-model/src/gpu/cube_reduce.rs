//! Sums and maxima over one cube's 256 units: a tree in shared memory, every unit getting the
//! answer. What the row kernels ([`super::row_norm`], [`super::row_softmax`]) reduce a row with.

use cubecl::prelude::*;

/// Units of the cubes these reductions serve (a power of two: the tree halves it).
pub(super) const UNITS: u32 = 256;

/// The sum of every unit's `v` (every unit gets it).
#[cube]
pub(super) fn cube_sum(v: f32, shared: &mut Shared<[f32]>) -> f32 {
    shared[UNIT_POS as usize] = v;
    sync_cube();
    let mut half = 128u32;
    while half > 0u32 {
        if UNIT_POS < half {
            shared[UNIT_POS as usize] += shared[(UNIT_POS + half) as usize];
        }
        sync_cube();
        half /= 2u32;
    }
    let total = shared[0usize];
    // Every unit reads the answer before the next reduction overwrites it.
    sync_cube();
    total
}

/// The largest of every unit's `v` (every unit gets it).
#[cube]
pub(super) fn cube_max(v: f32, shared: &mut Shared<[f32]>) -> f32 {
    shared[UNIT_POS as usize] = v;
    sync_cube();
    let mut half = 128u32;
    while half > 0u32 {
        if UNIT_POS < half {
            shared[UNIT_POS as usize] = f32::max(shared[UNIT_POS as usize], shared[(UNIT_POS + half) as usize]);
        }
        sync_cube();
        half /= 2u32;
    }
    let top = shared[0usize];
    sync_cube();
    top
}
