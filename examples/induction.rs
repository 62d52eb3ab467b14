//! The classic result, reproduced: a two-layer attention-only transformer trained on
//! repeated random tokens forms an induction circuit. This walks through finding it.
//!
//! ```text
//! cargo run --example induction [-- --set training.steps=300 ...]
//! ```
//!
//! 1. Train `configs/induction-2l.toml` (about 80 s on a 2-core CPU).
//! 2. Run the repeated-random-tokens experiment: on `r + r` the second copy of `r` becomes
//!    predictable only through induction, so its log-probability jumps.
//! 3. Find the circuit: a layer-0 previous-token head (attends from each token to the one
//!    before it and copies it) and a layer-1 induction head whose *keys* read that copy
//!    (K-composition), so it attends to the token after an earlier occurrence of the current
//!    one and copies it into the prediction.
//! 4. Write the reports: `RUN/induction/index.html` (log-probabilities per position and
//!    induction scores per head) and `RUN/analysis/index.html` (attention viewer, detector,
//!    OV-copying and composition scores on one repeated sequence).

use std::path::PathBuf;

use burn::tensor::Device;
use burnlens::lens::detect::induction_circuit;
use burnlens::lens::report::{analyze, induction_report, write_analysis};
use burnlens::model::stop::install_interrupt_handler;
use burnlens::train::{RunConfig, Silent, TrainOptions, load_run, train};

fn main() {
    match run() {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    }
}

fn run() -> Result<bool, Box<dyn std::error::Error>> {
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs();
    let mut sets = vec![format!("output.dir=runs/induction-2l-{stamp}")];
    let args: Vec<String> = std::env::args().skip(1).collect();
    for pair in args.chunks(2) {
        match pair {
            [flag, value] if flag == "--set" => sets.push(value.clone()),
            _ => return Err(format!("unexpected arguments {pair:?}; usage: induction [--set KEY=VALUE ...]").into()),
        }
    }
    let cfg = RunConfig::load(&PathBuf::from("configs/induction-2l.toml"), &sets)?;
    install_interrupt_handler();
    println!("1. training {} steps into {}", cfg.training.steps, cfg.output.dir.display());
    let summary = train(&cfg, &TrainOptions::default(), &mut Silent)?;
    println!(
        "   done in {:.0}s: train loss {:.3}, validation loss {:.3}",
        summary.seconds,
        summary.final_train_loss,
        summary.final_val_loss.unwrap_or(f64::NAN)
    );

    let run = load_run(&summary.run_dir, &Device::flex())?;
    let model = &run.model;
    let len = 20;
    let report = induction_report(&summary.run_dir.join("induction"), model, len, 16, 0, None)?;
    let gain = report.mean_logprob_second_half - report.mean_logprob_first_half;
    println!(
        "2. on 16 sequences r + r with |r| = {len}: mean log-probability of the first copy {:.3}, of the second {:.3} (+{gain:.2} nats)",
        report.mean_logprob_first_half, report.mean_logprob_second_half
    );

    let c = induction_circuit(model, &report).ok_or("the model has one layer; induction needs two")?;
    let (pl, ph, ps) = c.previous_token;
    let (il, ih, is) = c.induction;
    println!("3. previous-token head L{pl}H{ph}: score {ps:.3}");
    println!("   induction head L{il}H{ih}: score {is:.3} (attention on the token after the earlier copy)");
    println!(
        "   composition L{pl}H{ph} -> L{il}H{ih}: K {:.3}, Q {:.3}; random baseline {:.3} (K is {:.1}x baseline)",
        c.k_composition,
        c.q_composition,
        c.random_baseline,
        c.k_composition / c.random_baseline
    );

    let seq = &report.tokens[0];
    let labels = seq.iter().map(|t| t.to_string()).collect();
    let analysis = analyze(model, seq, labels);
    let dir = summary.run_dir.join("analysis");
    write_analysis(&dir, &analysis, "induction-2l on one repeated random sequence")?;
    println!("4. reports: {} and {}", summary.run_dir.join("induction/index.html").display(), dir.join("index.html").display());

    let checks = [
        ("second copy far more predictable (> 2 nats)", gain > 2.0),
        ("a layer-1 induction head scores > 0.4", il == 1 && is > 0.4),
        ("a layer-0 previous-token head scores > 0.4", pl == 0 && ps > 0.4),
        ("K-composition > 1.5x the random baseline", c.k_composition > 1.5 * c.random_baseline),
    ];
    for (what, ok) in &checks {
        println!("   [{}] {what}", if *ok { "ok" } else { "FAILED" });
    }
    Ok(checks.iter().all(|(_, ok)| *ok))
}
