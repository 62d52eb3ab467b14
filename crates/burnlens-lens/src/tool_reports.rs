//! Reports of the attribution tools, for `burnlens patch`, `attribute`, `lens` and `sae`: a
//! directory with `report.json` (every number, for scripts) and `index.html` (self-contained,
//! opens offline).

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use crate::patching::{NodeKind, PatchingResult};
use crate::report::write;
use crate::residual::{LogitAttribution, LogitLens};
use crate::sae::SaeRun;
use crate::views::{coloured_tokens, esc, heatmap_svg, page, scatter_svg};

fn finish<T: Serialize>(dir: &Path, title: &str, body: &str, data: &T) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    write(dir, "index.html", &page(title, body))?;
    write(dir, "report.json", &serde_json::to_string(data).expect("json"))
}

fn max_abs(v: &[f32]) -> f32 {
    v.iter().fold(1e-9f32, |m, x| m.max(x.abs()))
}

fn layer_labels(n: usize) -> Vec<String> {
    (0..n).map(|l| format!("layer {l}")).collect()
}

/// What `burnlens patch` reports.
#[derive(Debug, Clone, Serialize)]
pub struct PatchingReport {
    pub clean_ids: Vec<i64>,
    pub clean_tokens: Vec<String>,
    pub corrupted_ids: Vec<i64>,
    pub corrupted_tokens: Vec<String>,
    /// `noising` (clean run, corrupted activations patched in; `result.clean_metric` is the
    /// clean run's) or `denoising` (the corrupted run is the base: `result.clean_metric`
    /// is then the corrupted run's metric and `result.corrupted_metric` the clean one's).
    pub direction: String,
    pub n_layers: usize,
    pub n_heads: usize,
    #[serde(flatten)]
    pub result: PatchingResult,
}

impl PatchingReport {
    /// `[layer][index]` values of one node kind, from `values` (one per node).
    pub fn grid(&self, kind: NodeKind, values: &[f64]) -> Vec<Vec<f64>> {
        let nodes = &self.result.nodes;
        if !nodes.iter().any(|n| n.kind == kind) {
            return Vec::new();
        }
        crate::patching::grid(nodes, values, kind, self.n_layers, kind.width(self.n_heads, self.clean_ids.len()))
    }
}

/// Write the patching report into `dir`.
pub fn write_patching(dir: &Path, r: &PatchingReport, title: &str) -> std::io::Result<()> {
    let res = &r.result;
    let mut body = String::new();
    let denoise = r.direction == "denoising";
    let (clean, corrupted) = if denoise { (res.corrupted_metric, res.clean_metric) } else { (res.clean_metric, res.corrupted_metric) };
    let _ = write!(
        body,
        "<p>Metric: <b>{}</b>. Clean {clean:.4}, corrupted {corrupted:.4}. {} \
         Attribution patching estimates the same change as (source − base) · ∂metric/∂activation from one backward pass on the base run.</p>",
        esc(&res.metric.describe()),
        if denoise {
            "Denoising: each node is patched from the clean run into the corrupted run (the base)."
        } else {
            "Noising: each node is patched from the corrupted run into the clean run (the base)."
        }
    );
    if let Some(c) = res.correlation {
        let by: Vec<String> = res.correlation_by_kind.iter().map(|(k, v)| format!("{k} {v:.3}")).collect();
        let _ = write!(
            body,
            "<p class=\"bl-correlation\">Correlation of attribution with activation patching: <b>{c:.3}</b> over {} nodes ({}).</p>",
            res.nodes.len(),
            by.join(", ")
        );
    }
    // Each clean token coloured by what patching its position of the residual stream
    // entering layer 0 does (the real effect when it was measured, else the estimate).
    let per_position = res.patched.as_ref().map(|p| ("activation patching", p)).unwrap_or(("attribution patching", &res.attribution));
    let grid = r.grid(NodeKind::ResidPre, per_position.1);
    match grid.first() {
        Some(row) => {
            let v: Vec<Option<f64>> = row.iter().map(|&x| Some(x)).collect();
            body.push_str(&coloured_tokens(
                &format!("clean sequence: effect on the metric of patching each position entering layer 0 ({})", per_position.0),
                &r.clean_tokens,
                &v,
                true,
            ));
        }
        None => body.push_str(&coloured_tokens("clean sequence", &r.clean_tokens, &vec![None; r.clean_tokens.len()], false)),
    }
    let diff: Vec<Option<f64>> = r.clean_ids.iter().zip(&r.corrupted_ids).map(|(a, b)| Some(f64::from(u8::from(a != b)))).collect();
    body.push_str(&coloured_tokens("corrupted sequence (red: differs from clean)", &r.corrupted_tokens, &diff, true));
    let mut series: Vec<(&str, &[f64])> = vec![("attribution", &res.attribution)];
    if let Some(p) = &res.patched {
        series.push(("activation patching", p));
    }
    for kind in NodeKind::ALL {
        let cols: Vec<String> = match kind {
            NodeKind::Head => (0..r.n_heads).map(|h| format!("head {h}")).collect(),
            NodeKind::ResidPre => r.clean_tokens.iter().enumerate().map(|(i, t)| format!("{i} {t:?}")).collect(),
            NodeKind::Mlp => vec!["mlp".into()],
        };
        for (name, values) in &series {
            let g = r.grid(kind, values);
            if g.is_empty() {
                continue;
            }
            let flat: Vec<f32> = g.iter().flatten().map(|&x| x as f32).collect();
            let m = max_abs(&flat);
            let what = match kind {
                NodeKind::Head => "per head (hook_z)",
                NodeKind::ResidPre => "per position of the residual stream entering each layer",
                NodeKind::Mlp => "per MLP output",
            };
            body.push_str(&heatmap_svg(&format!("{name}: {what}"), &flat, r.n_layers, cols.len(), &layer_labels(r.n_layers), &cols, -m, m));
        }
    }
    if let Some(p) = &res.patched {
        let pts: Vec<(f64, f64)> = p.iter().zip(&res.attribution).map(|(a, b)| (*a, *b)).collect();
        body.push_str(&scatter_svg(
            "attribution patching vs activation patching",
            "activation patching (exact change)",
            "attribution patching (estimate)",
            &pts,
            &res.labels,
        ));
    }
    finish(dir, title, &body, r)
}

/// What `burnlens attribute` reports: direct logit attribution at every position, and the
/// position looked at.
#[derive(Debug, Clone, Serialize)]
pub struct AttributionReport {
    pub ids: Vec<i64>,
    pub tokens: Vec<String>,
    pub target: String,
    pub position: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    #[serde(flatten)]
    pub dla: LogitAttribution,
}

/// Write the direct logit attribution report into `dir`.
pub fn write_attribution(dir: &Path, r: &AttributionReport, title: &str) -> std::io::Result<()> {
    let d = &r.dla;
    let p = r.position;
    let mut body = String::new();
    let sum: f64 = d.contributions.iter().map(|c| c[p]).sum::<f64>() + d.bias[p];
    let _ = write!(
        body,
        "<p>Direct logit attribution of <b>{}</b> at position {p} ({}): the model's value is {:.4}; the components below plus the bias term {:.4} sum to {sum:.4} \
         (largest gap over all positions {:.2e}). The final norm's scale is frozen at its value on this sequence.</p>",
        esc(&r.target),
        esc(&format!("{:?}", r.tokens[p])),
        d.logits[p],
        d.bias[p],
        d.max_error
    );
    if let (Some(c), None) = (d.final_softcap, d.wrong) {
        let _ = write!(
            body,
            "<p>This model soft-caps its logits (it outputs {c} tanh(logit / {c})). The cap is not linear, so the values above and below are the logits <b>before</b> the cap, \
             which the components sum to; the model's capped value at position {p} is {:.4}.</p>",
            c * (d.logits[p] / c).tanh()
        );
    } else if d.final_softcap.is_some() {
        body.push_str("<p>This model soft-caps its logits (c tanh(logit / c)); the cap is not linear, so the values here are differences of logits <b>before</b> the cap, which the components sum to.</p>");
    }
    let values: Vec<Option<f64>> = d.logits.iter().map(|&x| Some(x)).collect();
    body.push_str(&coloured_tokens(&format!("{} at every position", r.target), &r.tokens, &values, true));
    // Heads at the chosen position.
    let mut heads = vec![0f32; r.n_layers * r.n_heads];
    for (label, c) in d.labels.iter().zip(&d.contributions) {
        if let Some((l, h)) =
            label.strip_prefix('L').and_then(|s| s.split_once('H')).and_then(|(l, h)| Some((l.parse::<usize>().ok()?, h.parse::<usize>().ok()?)))
        {
            heads[l * r.n_heads + h] = c[p] as f32;
        }
    }
    let m = max_abs(&heads);
    body.push_str(&heatmap_svg(
        &format!("direct contribution of each head at position {p}"),
        &heads,
        r.n_layers,
        r.n_heads,
        &layer_labels(r.n_layers),
        &(0..r.n_heads).map(|h| format!("head {h}")).collect::<Vec<_>>(),
        -m,
        m,
    ));
    // Every component at every position.
    let flat: Vec<f32> = d.contributions.iter().flatten().map(|&x| x as f32).collect();
    let m = max_abs(&flat);
    let cols: Vec<String> = r.tokens.iter().enumerate().map(|(i, t)| format!("{i} {t:?}")).collect();
    body.push_str(&heatmap_svg(
        "direct contribution of every component (rows) at every position (columns)",
        &flat,
        d.labels.len(),
        cols.len(),
        &d.labels,
        &cols,
        -m,
        m,
    ));
    let mut order: Vec<usize> = (0..d.labels.len()).collect();
    order.sort_by(|&a, &b| d.contributions[b][p].abs().total_cmp(&d.contributions[a][p].abs()));
    body.push_str("<h3>Components at the position, largest first</h3><table><tr><th>component</th><th>contribution</th></tr>");
    for i in order {
        let _ = write!(body, "<tr><td>{}</td><td>{:.4}</td></tr>", esc(&d.labels[i]), d.contributions[i][p]);
    }
    let _ = write!(body, "<tr><td>bias</td><td>{:.4}</td></tr></table>", d.bias[p]);
    finish(dir, title, &body, r)
}

/// What `burnlens lens` reports.
#[derive(Debug, Clone, Serialize)]
pub struct LensReport {
    pub ids: Vec<i64>,
    pub tokens: Vec<String>,
    /// `[layer][pos][k]` the top tokens as text.
    pub top_tokens: Vec<Vec<Vec<String>>>,
    #[serde(flatten)]
    pub lens: LogitLens,
}

/// Write the logit lens report into `dir`.
pub fn write_lens(dir: &Path, r: &LensReport, title: &str) -> std::io::Result<()> {
    let l = &r.lens;
    let (n, t) = (l.layers.len(), r.tokens.len());
    let mut body = String::new();
    body.push_str("<p>Each layer's residual stream read through the final norm and the unembedding. A cell shows the most probable next token; its colour, the log-probability of the target (the given token, or the actual next token).</p>");
    let flat: Vec<f32> = l.target_logprob.iter().flatten().map(|v| v.map_or(f32::NAN, |x| x as f32)).collect();
    let lo = flat.iter().copied().filter(|v| v.is_finite()).fold(0.0f32, f32::min);
    let cols: Vec<String> = r.tokens.iter().enumerate().map(|(i, tok)| format!("{i} {tok:?}")).collect();
    body.push_str(&heatmap_svg(
        "log-probability of the target",
        &flat.iter().map(|v| if v.is_finite() { *v } else { lo }).collect::<Vec<_>>(),
        n,
        t,
        &l.layers,
        &cols,
        lo,
        0.0,
    ));
    body.push_str("<h3>Most probable token per layer and position</h3><table class=\"bl-lens\"><tr><th>layer \\ position</th>");
    for (i, tok) in r.tokens.iter().enumerate() {
        let _ = write!(body, "<th>{i}<br>{}</th>", esc(&format!("{tok:?}")));
    }
    body.push_str("</tr>");
    for (li, name) in l.layers.iter().enumerate() {
        let _ = write!(body, "<tr><th>{}</th>", esc(name));
        for p in 0..t {
            let (tok, prob) = (&r.top_tokens[li][p][0], l.top[li][p][0].1);
            let tip: Vec<String> = r.top_tokens[li][p].iter().zip(&l.top[li][p]).map(|(s, (_, q))| format!("{s:?} {q:.3}")).collect();
            let shade = (255.0 * (1.0 - prob.clamp(0.0, 1.0))) as u8;
            let _ = write!(body, "<td title=\"{}\" style=\"background:rgb({shade},{shade},255)\">{}</td>", esc(&tip.join("\n")), esc(&format!("{tok:?}")));
        }
        body.push_str("</tr>");
    }
    body.push_str("</table>");
    let last: Vec<Option<f64>> = l.target_logprob[n - 1].clone();
    body.push_str(&coloured_tokens("log-probability of each next token (final layer), at the position predicting it", &r.tokens, &last, false));
    finish(dir, title, &body, r)
}

/// What `burnlens sae` reports.
#[derive(Debug, Clone, Serialize)]
pub struct SaeReport {
    pub ids: Vec<i64>,
    pub tokens: Vec<String>,
    pub sae: crate::sae::SaeConfig,
    #[serde(flatten)]
    pub run: SaeRun,
}

/// Write the SAE report into `dir`.
pub fn write_sae(dir: &Path, r: &SaeReport, title: &str) -> std::io::Result<()> {
    let s = &r.run;
    let mut body = String::new();
    let _ = write!(
        body,
        "<p>SAE on <code>{}</code> ({:?}, d_in {}, d_sae {}).</p><table><tr><th>mean L0</th><th>MSE</th><th>explained variance</th><th>loss</th><th>loss with SAE</th><th>loss, zero-ablated</th><th>loss recovered</th></tr>\
         <tr><td>{:.2}</td><td>{:.4}</td><td>{:.4}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr></table>",
        esc(&s.hook_name),
        r.sae.architecture,
        r.sae.d_in,
        r.sae.d_sae,
        s.mean_l0,
        s.mse,
        s.explained_variance,
        s.loss_clean.map_or("n/a".into(), |v| format!("{v:.4}")),
        s.loss_with_sae.map_or("n/a".into(), |v| format!("{v:.4}")),
        s.loss_zero_ablated.map_or("n/a".into(), |v| format!("{v:.4}")),
        s.loss_recovered.map_or("n/a".into(), |v| format!("{v:.3}")),
    );
    body.push_str(&coloured_tokens(
        "loss increase at each position with the SAE spliced in (red: the reconstruction costs loss here)",
        &r.tokens,
        &s.loss_increase,
        true,
    ));
    let l0: Vec<Option<f64>> = s.l0.iter().map(|&x| Some(x as f64)).collect();
    body.push_str(&coloured_tokens("active features (L0) at each position", &r.tokens, &l0, false));
    if let Some((f, acts)) = &s.strongest_feature {
        let v: Vec<Option<f64>> = acts.iter().map(|&x| Some(x)).collect();
        body.push_str(&coloured_tokens(&format!("activation of feature {f}, the strongest on this sequence"), &r.tokens, &v, false));
    }
    body.push_str("<h3>Strongest features per position</h3><table><tr><th>position</th><th>token</th><th>L0</th><th>features (activation)</th></tr>");
    for (p, top) in s.top_features.iter().enumerate() {
        let f: Vec<String> = top.iter().map(|(i, a)| format!("{i} ({a:.3})")).collect();
        let _ = write!(
            body,
            "<tr><td>{p}</td><td>{}</td><td>{}</td><td style=\"text-align:left\">{}</td></tr>",
            esc(&format!("{:?}", r.tokens[p])),
            s.l0[p],
            f.join(", ")
        );
    }
    body.push_str("</table>");
    finish(dir, title, &body, r)
}
