//! The sparse pass against the dense autodiff pass it replaces.

use super::{SparseInput, gradients};
use crate::architecture::{Architecture, TopKSettings};
use crate::host::Scratch;
use crate::params::Shape;
use crate::pass_check::{Case, Pass, check, dead_every};

const SPARSE: Pass =
    &|p, arch, (x, target, _, dead)| gradients(p, arch, SparseInput { x, target, dead, scratch: &Scratch::default(), share: None }).expect("one process");

#[test]
fn topk_gradients_equal_the_dense_pass() {
    for rescale in [false, true] {
        let t = TopKSettings { rescale_acts_by_decoder_norm: rescale, ..TopKSettings::new(4.0) };
        let shape = Shape::sae(8, 40);
        check(Case { arch: Architecture::TopK(t), shape, dead: vec![false; 40], coefficient: 0.0 }, 1, SPARSE);
        check(Case { arch: Architecture::TopK(t), shape, dead: dead_every(40, 3), coefficient: 0.0 }, 2, SPARSE);
    }
}

#[test]
fn batch_topk_gradients_equal_the_dense_pass() {
    for rescale in [false, true] {
        let t = TopKSettings { rescale_acts_by_decoder_norm: rescale, ..TopKSettings::new(3.0) };
        let arch = Architecture::BatchTopK { topk: t, threshold_lr: 0.1 };
        check(Case { arch, shape: Shape::sae(8, 40), dead: dead_every(40, 2), coefficient: 0.0 }, 3, SPARSE);
    }
}

#[test]
fn skip_transcoder_gradients_equal_the_dense_pass() {
    let t = TopKSettings { rescale_acts_by_decoder_norm: false, ..TopKSettings::new(5.0) };
    let shape = Shape { d_in: 8, d_sae: 40, d_out: 6, transcoder: true, skip: true };
    check(Case { arch: Architecture::TopK(t), shape, dead: dead_every(40, 5), coefficient: 0.0 }, 4, SPARSE);
}
