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
//! 5. Ask the induction head why it attends where it does (QK attributions): each score on
//!    the second copy, split exactly into terms over pairs of parts of the query's and the
//!    key's residual streams (tokens, layer-0 heads' outputs, constants), averaged by kind
//!    into `RUN/qk/induction-qk.svg` — one bright cell, "the current token" at the query
//!    times "the previous token", the previous-token head's output, at the key.

use std::path::PathBuf;

use burn::tensor::Device;
use burnlens::lens::detect::induction_circuit;
use burnlens::lens::report::{analyze, induction_report, write_analysis};
use burnlens::model::stop::install_interrupt_handler;
use burnlens::trace::{QkNode, QkOptions, QkRow, qk_attributions};
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

    // 5. Why the induction head attends: each second-copy query's most attended key, every term.
    let qk = qk_attributions(model, None, seq, &QkOptions { top_keys: Some(1), top_terms: usize::MAX, zero_positions: 0, ..QkOptions::new(il, ih) })?;
    let second: Vec<&QkRow> = qk.rows.iter().filter(|r| r.query >= len).collect();
    let story = second
        .iter()
        .filter(|r| r.terms[0].query_node == QkNode::Embedding { pos: r.query } && r.terms[0].key_node == QkNode::Attention { layer: pl, head: ph, pos: r.key })
        .count();
    let kinds = part_kinds(model.config.n_heads);
    let mean = mean_by_kind(&second, &kinds);
    let svg = summary.run_dir.join("qk/induction-qk.svg");
    std::fs::create_dir_all(svg.parent().expect("a folder"))?;
    std::fs::write(&svg, heatmap_svg(&kinds, &mean, &format!("L{il}H{ih}: mean QK term by part, {} second-copy queries", second.len())))?;
    let r0 = second[0];
    println!(
        "5. QK attributions of L{il}H{ih}: query {} attends to key {} (weight {:.2}), score {:.2}, largest terms:",
        r0.query, r0.key, r0.pattern, r0.score
    );
    for t in r0.terms.iter().take(3) {
        println!("      {:+.2}  {} · {}", t.contribution, t.query_node, t.key_node);
    }
    println!("   the largest term is token @query × L{pl}H{ph} @key for {story} of {} second-copy queries; {}", second.len(), svg.display());

    let checks = [
        ("second copy far more predictable (> 2 nats)", gain > 2.0),
        ("a layer-1 induction head scores > 0.4", il == 1 && is > 0.4),
        ("a layer-0 previous-token head scores > 0.4", pl == 0 && ps > 0.4),
        ("K-composition > 1.5x the random baseline", c.k_composition > 1.5 * c.random_baseline),
        ("QK: token × previous-token head is the largest term for 80% of queries", story * 10 >= second.len() * 8),
    ];
    for (what, ok) in &checks {
        println!("   [{}] {what}", if *ok { "ok" } else { "FAILED" });
    }
    Ok(checks.iter().all(|(_, ok)| *ok))
}

/// The kinds of parts of a stream in a model without MLPs: the token, each layer-0 head's
/// output, the constants (layer 1's heads read nothing else).
fn part_kinds(n_heads: usize) -> Vec<String> {
    let mut kinds = vec!["token".to_string()];
    kinds.extend((0..n_heads).map(|h| format!("L0H{h}")));
    kinds.push("biases".into());
    kinds
}

fn kind_of(node: QkNode) -> String {
    match node {
        QkNode::Embedding { .. } => "token".into(),
        QkNode::Attention { layer, head, .. } => format!("L{layer}H{head}"),
        _ => "biases".into(),
    }
}

/// The mean term of each (query kind, key kind) over `rows`, `[kinds², row-major]`.
fn mean_by_kind(rows: &[&QkRow], kinds: &[String]) -> Vec<f32> {
    let n = kinds.len();
    let mut sum = vec![0f32; n * n];
    for r in rows {
        for t in &r.terms {
            let (i, j) = (kinds.iter().position(|k| *k == kind_of(t.query_node)), kinds.iter().position(|k| *k == kind_of(t.key_node)));
            if let (Some(i), Some(j)) = (i, j) {
                sum[i * n + j] += t.contribution / rows.len() as f32;
            }
        }
    }
    sum
}

/// A heatmap of `values [kinds², row-major]`: rows the query's parts, columns the key's;
/// red positive, blue negative.
fn heatmap_svg(kinds: &[String], values: &[f32], title: &str) -> String {
    let (n, cell, left, top) = (kinds.len(), 56.0, 90.0, 70.0);
    let max = values.iter().fold(1e-9f32, |m, v| m.max(v.abs()));
    let size = left + cell * n as f32 + 20.0;
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{size}\" height=\"{}\" font-family=\"sans-serif\" font-size=\"12\">\n<text x=\"10\" y=\"20\" font-size=\"14\">{title}</text>\n<text x=\"{left}\" y=\"42\">key's parts →</text><text x=\"10\" y=\"62\">query's parts ↓</text>\n",
        top + cell * n as f32 + 10.0
    );
    for (i, k) in kinds.iter().enumerate() {
        let c = i as f32 * cell;
        svg += &format!("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{k}</text>\n", left + c + cell / 2.0, top - 6.0);
        svg += &format!("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{k}</text>\n", left - 6.0, top + c + cell / 2.0 + 4.0);
    }
    for i in 0..n {
        for j in 0..n {
            let v = values[i * n + j];
            let a = (v.abs() / max).sqrt();
            let (r, g, b) = if v >= 0.0 { (255.0, 255.0 * (1.0 - a), 255.0 * (1.0 - a)) } else { (255.0 * (1.0 - a), 255.0 * (1.0 - a), 255.0) };
            let (x, y) = (left + j as f32 * cell, top + i as f32 * cell);
            svg += &format!("<rect x=\"{x}\" y=\"{y}\" width=\"{cell}\" height=\"{cell}\" fill=\"rgb({r:.0},{g:.0},{b:.0})\" stroke=\"#ccc\"/>\n");
            svg += &format!("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{v:+.2}</text>\n", x + cell / 2.0, y + cell / 2.0 + 4.0);
        }
    }
    svg + "</svg>\n"
}
