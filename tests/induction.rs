//! The classic result on a short run of `configs/induction-2l.toml`: an induction circuit
//! (layer-0 previous-token head, layer-1 induction head reading it through K-composition)
//! forms, and the second copy of a repeated random sequence becomes predictable.

use burn::tensor::Device;
use burnlens::lens::detect::{induction_circuit, induction_experiment};
use burnlens::train::{RunConfig, TrainOptions, load_run, train};

#[test]
fn a_short_run_of_induction_2l_forms_an_induction_circuit() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg_path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/induction-2l.toml");
    let sets = vec![format!("output.dir={}", tmp.path().join("run").display()), "training.steps=450".into(), "training.eval_interval=1000".into()];
    let cfg = RunConfig::load(&cfg_path, &sets).unwrap();
    let opts = TrainOptions { quiet: true, ..TrainOptions::default() };
    let summary = train(&cfg, &opts).unwrap();
    let model = load_run(&summary.run_dir, &Device::flex()).unwrap().model;

    let report = induction_experiment(&model, 20, 8, 7, None);
    let (first, second) = (report.mean_logprob_first_half, report.mean_logprob_second_half);
    // Uniform guessing over 64 tokens is -4.16; the second copy must be far better.
    assert!(first < -3.5, "the first copy of r is random, so it cannot be predicted: {first}");
    assert!(second > first + 2.0, "second copy {second} must be far above the first {first}");

    let c = induction_circuit(&model, &report).unwrap();
    eprintln!("first {first:.3} second {second:.3} {c:?}");
    let (pl, ph, ps) = c.previous_token;
    let (il, ih, is) = c.induction;
    assert_eq!(il, 1);
    assert!(is > 0.4, "best layer-1 induction score L1H{ih} = {is}");
    assert_eq!(pl, 0);
    assert!(ps > 0.4, "best layer-0 previous-token score L0H{ph} = {ps}");
    assert!(c.k_composition > 1.5 * c.random_baseline, "K-composition L0H{ph} -> L1H{ih} = {} vs baseline {}", c.k_composition, c.random_baseline);
    // Induction reads the previous token through keys, not queries.
    assert!(c.k_composition > c.q_composition, "K {} should beat Q {}", c.k_composition, c.q_composition);
}
