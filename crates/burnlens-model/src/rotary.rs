//! Rotary position embeddings: the angles of positions, and their rotation of queries and keys.

use burn::tensor::{Device, Tensor, TensorData};

use crate::config::{RopeScaling, Rotary};

/// `cos θ` and `sin θ` for every new token's position, `[batch, pos, dims / 2]` each,
/// computed once per forward pass and shared by every layer.
#[derive(Debug, Clone)]
pub struct RotaryAngles {
    pub cos: Tensor<3>,
    pub sin: Tensor<3>,
    /// Whether pairs are interleaved (GPT-J) rather than halves.
    pub interleaved: bool,
}

impl Rotary {
    /// The inverse frequencies `base^(-2i / dims)`, scaled as `scaling` says, computed in
    /// f32 the way Hugging Face computes them (so angles agree bit for bit at long positions).
    pub fn inv_freq(&self) -> Vec<f32> {
        let half = self.dims / 2;
        let base = self.base as f32;
        let mut inv: Vec<f32> = (0..half).map(|i| 1.0 / base.powf((2 * i) as f32 / self.dims as f32)).collect();
        match self.scaling {
            None => {}
            Some(RopeScaling::Linear { factor }) => inv.iter_mut().for_each(|f| *f /= factor as f32),
            Some(RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position }) => {
                let (factor, low, high, old) = (factor as f32, low_freq_factor as f32, high_freq_factor as f32, original_max_position as f32);
                let (low_wavelen, high_wavelen) = (old / low, old / high);
                for f in inv.iter_mut() {
                    let wavelen = 2.0 * std::f32::consts::PI / *f;
                    *f = if wavelen < high_wavelen {
                        *f
                    } else if wavelen > low_wavelen {
                        *f / factor
                    } else {
                        let smooth = (old / wavelen - low) / (high - low);
                        (1.0 - smooth) * *f / factor + smooth * *f
                    };
                }
            }
        }
        inv
    }

    /// Angles for `positions[b][p]`.
    pub fn angles(&self, positions: &[Vec<usize>], device: &Device) -> RotaryAngles {
        let inv = self.inv_freq();
        let (b, t, half) = (positions.len(), positions.first().map_or(0, Vec::len), inv.len());
        let mut cos = Vec::with_capacity(b * t * half);
        let mut sin = Vec::with_capacity(b * t * half);
        for row in positions {
            for &p in row {
                for &f in &inv {
                    // The angle as an f32 product (as HF forms it), its cos/sin rounded once.
                    let theta = (p as f32 * f) as f64;
                    cos.push(theta.cos() as f32);
                    sin.push(theta.sin() as f32);
                }
            }
        }
        RotaryAngles {
            cos: Tensor::from_data(TensorData::new(cos, [b, t, half]), device),
            sin: Tensor::from_data(TensorData::new(sin, [b, t, half]), device),
            interleaved: self.interleaved,
        }
    }
}

/// Rotate the first `2 * half` dimensions of every head of `x: [batch, pos, heads, d_head]`
/// (rotate-half form, or GPT-J's interleaved pairs); the rest pass through.
pub fn apply_rotary(x: Tensor<4>, angles: &RotaryAngles) -> Tensor<4> {
    let [b, t, h, dh] = x.dims();
    let half = angles.cos.dims()[2];
    let cos = angles.cos.clone().reshape([b, t, 1, half]);
    let sin = angles.sin.clone().reshape([b, t, 1, half]);
    let rotated = if angles.interleaved {
        // Pairs (x[2i], x[2i + 1]) rotate by θ_i.
        let pairs: Tensor<5> = x.clone().narrow(3, 0, 2 * half).reshape([b, t, h, half, 2]);
        let even: Tensor<4> = pairs.clone().narrow(4, 0, 1).reshape([b, t, h, half]);
        let odd: Tensor<4> = pairs.narrow(4, 1, 1).reshape([b, t, h, half]);
        let r_even = even.clone() * cos.clone() - odd.clone() * sin.clone();
        let r_odd = odd * cos + even * sin;
        Tensor::stack::<5>(vec![r_even, r_odd], 4).reshape([b, t, h, 2 * half])
    } else {
        let x1 = x.clone().narrow(3, 0, half);
        let x2 = x.clone().narrow(3, half, half);
        let r1 = x1.clone() * cos.clone() - x2.clone() * sin.clone();
        let r2 = x2 * cos + x1 * sin;
        Tensor::cat(vec![r1, r2], 3)
    };
    if 2 * half == dh { rotated } else { Tensor::cat(vec![rotated, x.narrow(3, 2 * half, dh - 2 * half)], 3) }
}
