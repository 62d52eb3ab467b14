//! The hand-written dense pass against the autodiff pass.

use super::{DenseInput, gradients};
use crate::architecture::{Architecture, JumpReluSettings};
use crate::params::Shape;
use crate::pass_check::{Case, Pass, check, dead_every};

const DENSE: Pass = &|p, arch, (x, target, coefficient, dead)| gradients(p, arch, DenseInput { x, target, coefficient, dead });

const SAE: Shape = Shape::sae(8, 40);
const SKIP: Shape = Shape { d_in: 8, d_sae: 40, d_out: 6, transcoder: true, skip: true };

#[test]
fn standard_gradients_equal_the_autodiff_pass() {
    let arch = Architecture::Standard { l1_coefficient: 0.3, l1_warm_up_steps: 0 };
    check(Case { arch, shape: SAE, dead: vec![false; 40], coefficient: 0.3 }, 5, DENSE);
    check(Case { arch, shape: SKIP, dead: dead_every(40, 3), coefficient: 0.7 }, 6, DENSE);
}

#[test]
fn jumprelu_gradients_equal_the_autodiff_pass() {
    // A wide bandwidth so that many pre-activations fall in the estimator's window.
    let j = JumpReluSettings { bandwidth: 0.5, ..JumpReluSettings::default() };
    check(Case { arch: Architecture::JumpRelu(j), shape: SAE, dead: vec![false; 40], coefficient: 0.4 }, 7, DENSE);
    check(Case { arch: Architecture::JumpRelu(j), shape: SKIP, dead: dead_every(40, 4), coefficient: 0.2 }, 8, DENSE);
    let with_pre_act = JumpReluSettings { pre_act_loss_coefficient: Some(0.5), ..j };
    check(Case { arch: Architecture::JumpRelu(with_pre_act), shape: SAE, dead: vec![false; 40], coefficient: 0.4 }, 9, DENSE);
}
