//! Reports: a directory with `index.html` (attention viewer, composition heatmaps, head
//! scores) and `report.json` with every number, for `burnlens analyze` and
//! `burnlens induction`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use burnlens_model::{AttnHook, LayerHook, Transformer};
use serde::Serialize;

use crate::cache::run_with_cache;
use crate::circuits::ov_copying_scores;
use crate::composition::{CompositionScores, composition_scores};
use crate::detect::{Detector, InductionReport, head_scores, induction_experiment};
use crate::views::{AttentionData, attention_viewer, esc, heatmap_svg, line_plot_svg, page};

/// Everything `burnlens analyze` computes for one sequence.
#[derive(Debug, Clone, Serialize)]
pub struct Analysis {
    pub ids: Vec<i64>,
    pub tokens: Vec<String>,
    pub n_layers: usize,
    pub n_heads: usize,
    /// `[layer][head * t * t]` attention patterns.
    pub patterns: Vec<Vec<f32>>,
    /// Detector name -> `[layer][head]` scores on this sequence.
    pub detectors: BTreeMap<String, Vec<Vec<f64>>>,
    /// `[layer][head]` OV copying scores of the full OV circuits.
    pub ov_copying: Vec<Vec<f64>>,
    pub composition: CompositionScores,
    /// `[pos]` log-probability the model gives the token after each position (`null` at the
    /// last).
    pub token_logprobs: Vec<Option<f64>>,
}

/// Analyse `model` on `ids`; `tokens` label the positions.
pub fn analyze(model: &Transformer, ids: &[i64], tokens: Vec<String>) -> Analysis {
    let cache = run_with_cache(model, ids, AttnHook::Pattern.every_layer());
    let n_layers = model.config.n_layers();
    let patterns = (0..n_layers).map(|l| cache.pattern(l)).collect();
    let detectors = Detector::ALL.iter().map(|d| (d.name().to_string(), head_scores(model, &[ids.to_vec()], *d))).collect();
    Analysis {
        ids: ids.to_vec(),
        tokens,
        n_layers,
        n_heads: model.config.n_heads,
        patterns,
        detectors,
        ov_copying: ov_copying_scores(model),
        composition: composition_scores(model),
        token_logprobs: crate::residual::token_logprobs(model, ids),
    }
}

fn head_labels(l: usize, h: usize) -> Vec<String> {
    (0..l).flat_map(|a| (0..h).map(move |b| format!("L{a}H{b}"))).collect()
}

/// `[layer][head]` scores as an HTML table.
fn score_table(title: &str, scores: &[Vec<f64>]) -> String {
    let mut s = format!("<h3>{}</h3><table><tr><th>layer \\ head</th>", esc(title));
    for h in 0..scores.first().map_or(0, Vec::len) {
        let _ = write!(s, "<th>{h}</th>");
    }
    s.push_str("</tr>");
    for (l, row) in scores.iter().enumerate() {
        let _ = write!(s, "<tr><th>{l}</th>");
        for v in row {
            let shade = (255.0 * (1.0 - v.clamp(0.0, 1.0))) as u8;
            let _ = write!(s, "<td style=\"background:rgb({shade},{shade},255)\">{v:.3}</td>");
        }
        s.push_str("</tr>");
    }
    s.push_str("</table>");
    s
}

/// The three composition heatmaps (`[L*H, L*H]`, earlier head as row).
pub fn composition_svgs(c: &CompositionScores) -> Vec<(String, String)> {
    let n = c.n_layers * c.n_heads;
    let labels = head_labels(c.n_layers, c.n_heads);
    let vmax = [&c.q, &c.k, &c.v].iter().flat_map(|v| v.iter()).fold(c.random_baseline as f32 * 2.0, |a, &b| a.max(b));
    [("q", &c.q), ("k", &c.k), ("v", &c.v)]
        .iter()
        .map(|(kind, v)| {
            let title = format!("{}-composition (row: earlier head's OV, column: later head); random baseline {:.3}", kind.to_uppercase(), c.random_baseline);
            (format!("composition_{kind}.svg"), heatmap_svg(&title, v, n, n, &labels, &labels, 0.0, vmax))
        })
        .collect()
}

pub(crate) fn write(dir: &Path, name: &str, text: &str) -> std::io::Result<()> {
    Ok(burnlens_model::files::write_atomic(&dir.join(name), text.as_bytes())?)
}

/// Write `index.html`, `report.json` and the SVG figures of `a` into `dir`.
pub fn write_analysis(dir: &Path, a: &Analysis, title: &str) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut body = String::new();
    let _ = write!(body, "<p>{} tokens, {} layers × {} heads. All numbers are in <code>report.json</code>.</p>", a.ids.len(), a.n_layers, a.n_heads);
    body.push_str("<h2>Tokens</h2><p>Each token coloured by the log-probability the model gave it, from the position before (hover for the value; blue = unlikely, red = likely).</p>");
    let shifted: Vec<Option<f64>> = (0..a.tokens.len()).map(|p| if p == 0 { None } else { a.token_logprobs[p - 1] }).collect();
    body.push_str(&crate::views::coloured_tokens("log p(token | tokens before it)", &a.tokens, &shifted, false));
    body.push_str("<h2>Attention patterns</h2><p>Hover a cell for its value; click a head to enlarge it with token labels.</p>");
    body.push_str(&attention_viewer(&AttentionData { tokens: &a.tokens, patterns: &a.patterns, n_heads: a.n_heads }));
    body.push_str("<h2>Head detectors</h2><p>Share of attention on the detector's pattern (TransformerLens \"mul\" measure).</p>");
    for (name, scores) in &a.detectors {
        body.push_str(&score_table(name, scores));
    }
    body.push_str("<h2>OV copying scores</h2><p>Σ Re(λ) / Σ |λ| over eigenvalues of W_E W_V W_O W_U: +1 copies tokens, −1 suppresses them.</p>");
    body.push_str(&score_table("OV copying", &a.ov_copying));
    let _ = write!(
        body,
        "<h2>Composition scores</h2><p>‖W_A W_B‖ / (‖W_A‖‖W_B‖). Random baseline measured {:.4} (1/√d_model = {:.4}).</p>",
        a.composition.random_baseline, a.composition.inverse_sqrt_d_model
    );
    for (name, svg) in composition_svgs(&a.composition) {
        write(dir, &name, &svg)?;
        body.push_str(&svg);
    }
    write(dir, "index.html", &page(title, &body))?;
    write(dir, "report.json", &serde_json::to_string(a).expect("json"))
}

/// Run the induction experiment and write its report into `dir`.
pub fn write_induction(dir: &Path, model: &Transformer, r: &InductionReport, title: &str) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let (l, h) = (model.config.n_layers(), model.config.n_heads);
    let off = usize::from(r.bos.is_some());
    let plot = line_plot_svg(
        "log-probability of each token of [BOS] + r + r (mean over the batch)",
        "predicted position",
        "log p",
        &[("log p", &r.logprobs)],
        &[(off + r.seq_len) as f64 - 1.5],
    );
    write(dir, "logprobs.svg", &plot)?;
    let flat: Vec<f32> = r.induction_scores.iter().flatten().map(|&x| x as f32).collect();
    let heat = heatmap_svg(
        "induction score (attention at offset -(len(r)-1))",
        &flat,
        l,
        h,
        &(0..l).map(|x| format!("layer {x}")).collect::<Vec<_>>(),
        &(0..h).map(|x| format!("head {x}")).collect::<Vec<_>>(),
        0.0,
        1.0,
    );
    write(dir, "induction_scores.svg", &heat)?;
    let first = &r.tokens[0];
    let cache = run_with_cache(model, first, AttnHook::Pattern.every_layer());
    let patterns: Vec<Vec<f32>> = (0..l).map(|x| cache.pattern(x)).collect();
    let labels: Vec<String> = first.iter().map(|t| t.to_string()).collect();
    let mut body = String::new();
    let _ = write!(
        body,
        "<p>{} sequences of {} random tokens, each repeated once{}. Mean log-probability: first half {:.3}, second half {:.3}.</p>",
        r.tokens.len(),
        r.seq_len,
        r.bos.map_or(String::new(), |b| format!(" after BOS {b}")),
        r.mean_logprob_first_half,
        r.mean_logprob_second_half
    );
    body.push_str(&plot);
    body.push_str(&heat);
    body.push_str(&score_table("induction scores", &r.induction_scores));
    body.push_str("<h2>Attention on the first sequence</h2>");
    body.push_str(&attention_viewer(&AttentionData { tokens: &labels, patterns: &patterns, n_heads: h }));
    write(dir, "index.html", &page(title, &body))?;
    write(dir, "report.json", &serde_json::to_string(r).expect("json"))
}

/// [`induction_experiment`] and [`write_induction`] together.
pub fn induction_report(dir: &Path, model: &Transformer, seq_len: usize, batch: usize, seed: u64, bos: Option<i64>) -> std::io::Result<InductionReport> {
    let r = induction_experiment(model, seq_len, batch, seed, bos);
    write_induction(dir, model, &r, "burnlens induction experiment")?;
    Ok(r)
}
