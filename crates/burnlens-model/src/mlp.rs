//! The MLP: two layers or gated, with its activation.

use burn::module::Module;
use burn::nn::Linear;
use burn::tensor::Tensor;
use burn::tensor::activation::relu;

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

/// Apply a Hugging Face activation function element-wise: the sigmoid-gated ones (the tanh
/// GELUs, `quick_gelu`, SiLU) through [`kernels::gated_activation`], which picks the fused
/// kernel or the composed ops itself; the exact GELU and ReLU as Burn's ops.
pub fn activate<const D: usize>(act: ActivationFn, x: Tensor<D>) -> Tensor<D> {
    if let Some((alpha, beta)) = kernels::activation::gate_coefficients(act) {
        return kernels::gated_activation(x, alpha, beta);
    }
    match act {
        ActivationFn::Gelu => burn::tensor::activation::gelu(x),
        ActivationFn::Relu => relu(x),
        gated => unreachable!("{gated:?} has gate coefficients"),
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
