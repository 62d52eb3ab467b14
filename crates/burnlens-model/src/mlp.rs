//! The MLP: two layers or gated, with its activation.

use burn::module::Module;
use burn::nn::Linear;
use burn::tensor::Tensor;
use burn::tensor::activation::{relu, sigmoid};

use crate::config::ActivationFn;
use crate::hook_point::{HookPoint, MlpHook};
use crate::hooks::Hooks;
use crate::kernels::{self, linear};

/// Two-layer perceptron `act(x W_in + b_in) W_out + b_out`, or gated
/// `(act(x W_gate) * (x W_in)) W_out` (biases optional).
#[derive(Module, Debug)]
pub struct Mlp {
    /// `W_in`: `[d_model, d_mlp]`
    pub fc_in: Linear,
    /// `W_gate`: `[d_model, d_mlp]`, gated MLPs only.
    pub fc_gate: Option<Linear>,
    /// `W_out`: `[d_mlp, d_model]`
    pub fc_out: Linear,
    #[module(skip)]
    pub activation: ActivationFn,
}

/// Apply a Hugging Face activation function element-wise.
///
/// The tanh GELUs use `0.5 x (1 + tanh(u)) = x σ(2u)`: the same function, computed with one
/// `exp` per element instead of a `tanh`, and `x³` as two multiplications rather than `powf`.
pub fn activate<const D: usize>(act: ActivationFn, x: Tensor<D>) -> Tensor<D> {
    if let Some((alpha, beta)) = kernels::activation::gate_coefficients(act)
        && kernels::is_flex(&x.device())
        && kernels::enabled()
        && x.dtype() == burn::tensor::DType::F32
    {
        return kernels::gated_activation(x, alpha, beta);
    }
    // 2 * sqrt(2 / π)
    const TWO_SQRT_2_OVER_PI: f64 = 1.595_769_121_605_730_7;
    match act {
        ActivationFn::GeluNew => {
            let inner = (x.clone() * x.clone() * 0.044715 + 1.0) * x.clone();
            x * sigmoid(inner * TWO_SQRT_2_OVER_PI)
        }
        ActivationFn::Gelu => burn::tensor::activation::gelu(x),
        ActivationFn::GeluFast => {
            let inner = (x.clone() * x.clone() * 0.044715 + 1.0) * x.clone();
            x * sigmoid(inner * (2.0 * 0.7978845608))
        }
        ActivationFn::Relu => relu(x),
        ActivationFn::QuickGelu => x.clone() * sigmoid(x * 1.702),
        ActivationFn::Silu => x.clone() * sigmoid(x),
    }
}

impl Mlp {
    /// `x: [batch, pos, d_model]` -> `[batch, pos, d_model]`. Hook points (TransformerLens's):
    /// `mlp.hook_pre` is the activation's input (`x W_gate` when gated), `mlp.hook_pre_linear`
    /// the gated MLP's linear branch `x W_in`, `mlp.hook_post` what `W_out` reads.
    pub fn forward(&self, x: Tensor<3>, hooks: &mut Hooks, layer: usize) -> Tensor<3> {
        let project = |l: &Linear, x| linear(x, l.weight.val(), l.bias.as_ref().map(|b| b.val()));
        let post = match &self.fc_gate {
            None => {
                let pre = hooks.at(HookPoint::Mlp(layer, MlpHook::Pre), project(&self.fc_in, x));
                activate(self.activation, pre)
            }
            Some(gate) => {
                let pre = hooks.at(HookPoint::Mlp(layer, MlpHook::Pre), project(gate, x.clone()));
                let pre_linear = hooks.at(HookPoint::Mlp(layer, MlpHook::PreLinear), project(&self.fc_in, x));
                activate(self.activation, pre) * pre_linear
            }
        };
        let post = hooks.at(HookPoint::Mlp(layer, MlpHook::Post), post);
        project(&self.fc_out, post)
    }
}
