//! The arithmetic of an Adam step, as the GPU's one-launch step ([`super::adam_step`]) takes
//! it: which formula, and its coefficients.

/// The arithmetic of one Adam step ([`super::adam_step`]), its coefficients rounded to f32 as Burn
/// rounds a scalar multiplying a tensor.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum AdamRule {
    /// torch's `optim.Adam` (SAELens's): `m' = m + (g - m)(1 - β1)`, `v' = v β2 + g g (1 -
    /// β2)`, `p' = p - m' / (√v' / √c2 + ε) · step_size` with `step_size = lr / c1`.
    Torch { one_minus_beta1: f32, beta2: f32, one_minus_beta2: f32, correction2_sqrt: f32, epsilon: f32, step_size: f32 },
    /// Burn's `AdamW` (nanoGPT's trainer): `m' = m β1 + g (1 - β1)`, `v' = v β2 + g g (1 -
    /// β2)`, `p' = p keep - (m' / c1) / (√(v' / c2) + ε) · lr` with `keep = 1 - lr · decay`.
    BurnW { beta1: f32, one_minus_beta1: f32, beta2: f32, one_minus_beta2: f32, correction1: f32, correction2: f32, epsilon: f32, lr: f32, keep: f32 },
}
