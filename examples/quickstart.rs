//! The main job: train a small GPT-2 on synthetic repeated tokens (no download needed), then
//! sample from it and check its Hugging Face export.
//!
//! ```text
//! cargo run --example quickstart [-- --set training.steps=100 ...]
//! ```
//!
//! Every training sequence is a random segment of 24 tokens repeated, so the model learns to
//! copy from 24 positions back. After training, greedy decoding of `r + r[..8]` should
//! continue with `r[8..]`.

use std::path::PathBuf;

use burn::tensor::Device;
use burnlens::hf::load_model;
use burnlens::model::stop::{install_interrupt_handler, stop_requested};
use burnlens::model::{Rng, Sampling, generate};
use burnlens::train::{RunConfig, Silent, TrainOptions, TrainSession, load_run};

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(2);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs();
    let mut sets = vec![format!("output.dir=runs/quickstart-{stamp}")];
    let args: Vec<String> = std::env::args().skip(1).collect();
    for pair in args.chunks(2) {
        match pair {
            [flag, value] if flag == "--set" => sets.push(value.clone()),
            _ => return Err(format!("unexpected arguments {pair:?}; usage: quickstart [--set KEY=VALUE ...]").into()),
        }
    }
    let cfg = RunConfig::load(&PathBuf::from("configs/quickstart.toml"), &sets)?;
    install_interrupt_handler();
    println!("training {} steps into {}", cfg.training.steps, cfg.output.dir.display());
    // The training loop, one small step at a time (`burnlens::train::train` is this loop with
    // an observer for progress).
    let mut session = TrainSession::open(&cfg, &TrainOptions::default(), &mut Silent)?;
    while !session.is_done() {
        if stop_requested() {
            return Err(session.interrupt()?.into());
        }
        let m = session.step()?;
        if m.step % cfg.training.log_interval.max(1) == 0 {
            println!("step {:>4}/{}: loss {:.3} ({:.0} tokens/s)", m.step, m.total, m.loss, m.tokens_per_s);
        }
        if session.evaluation_due() {
            println!("step {:>4}: validation loss {:.3}", m.step, session.evaluate()?);
        }
        if session.checkpoint_due() {
            session.checkpoint()?;
        }
    }
    let summary = session.finish(&mut Silent)?;
    println!(
        "done in {:.0}s ({:.0} tokens/s): train loss {:.3}, validation loss {:.3}",
        summary.seconds,
        summary.tokens_per_s,
        summary.final_train_loss,
        summary.final_val_loss.unwrap_or(f64::NAN)
    );

    // Sample: a fresh random segment, repeated in part; the model should finish the copy.
    let device = Device::flex();
    let run = load_run(&summary.run_dir, &device)?;
    let vocab = run.model.config.vocab_size as u64;
    let mut rng = Rng::new(2024);
    let r: Vec<i64> = (0..24).map(|_| rng.below(vocab) as i64).collect();
    let prompt: Vec<i64> = r.iter().chain(&r[..8]).copied().collect();
    let sampling = Sampling { max_new_tokens: 16, temperature: 0.0, ..Sampling::default() };
    let out = generate(&run.model, &prompt, &sampling)?;
    let copied = out.iter().zip(&r[8..]).filter(|(a, b)| a == b).count();
    println!("prompt (r + r[..8]): {prompt:?}");
    println!("greedy continuation: {out:?}");
    println!("copied {copied} of 16 tokens of r[8..] correctly");

    // The export loads back with the same logits.
    if let Some(hf) = &summary.exported {
        let again = load_model(hf, &device)?.model;
        let ids = run.model.ids_tensor(&prompt);
        let a = run.model.forward(ids.clone());
        let b = again.forward(ids);
        let diff: f32 = (a - b).abs().max().into_scalar();
        println!("Hugging Face export in {}: re-imported logits differ by {diff:.2e}", hf.display());
    }
    Ok(())
}
