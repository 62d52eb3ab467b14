//! `burnlens patch`: activation patching beside attribution patching.

use anyhow::Result;

use crate::commands::{ids_and_labels, load_model_args, parse_metric, report_err};
use crate::{Common, Input, ModelArgs, UserError};

/// Activation patching of heads, residual positions and MLPs from a corrupted run into
/// the clean one, beside attribution patching (its gradient estimate), with their
/// correlation (report.json and index.html).
#[derive(clap::Args, Clone)]
pub struct PatchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub input: Input,
    /// The corrupted sequence as text (same number of tokens as the clean one).
    #[arg(long, conflicts_with = "corrupted_ids")]
    pub corrupted_text: Option<String>,
    /// The corrupted sequence as token ids.
    #[arg(long)]
    pub corrupted_ids: Option<String>,
    /// `loss[:FROM]` (mean next-token loss from position FROM), `logprob:TOKEN[@POS]` or
    /// `logit-diff:RIGHT,WRONG[@POS]`; tokens are ids or text of one token; POS defaults
    /// to the last position.
    #[arg(long, default_value = "loss")]
    pub metric: String,
    /// Node kinds, comma-separated: head, resid_pre, mlp.
    #[arg(long, default_value = "head,resid_pre,mlp")]
    pub nodes: String,
    /// Only attribution patching (one forward/backward), no per-node forward passes.
    #[arg(long)]
    pub no_exact: bool,
    /// Denoising: run the corrupted sequence and patch in the clean activations (the
    /// gradient is then taken on the corrupted run), instead of the default noising
    /// (clean run, corrupted activations patched in). The linear estimate is poor where
    /// the base run's metric is saturated, so the direction matters.
    #[arg(long)]
    pub denoise: bool,
    #[arg(long)]
    pub out: std::path::PathBuf,
    #[command(flatten)]
    pub common: Common,
}

pub fn run(a: &PatchArgs) -> Result<()> {
    let corrupted = Input { text: a.corrupted_text.clone(), ids: a.corrupted_ids.clone() };
    let (args, clean, corrupted, metric, nodes, exact, denoise, out, common) =
        (&a.model, &a.input, &corrupted, a.metric.as_str(), a.nodes.as_str(), !a.no_exact, a.denoise, a.out.as_path(), &a.common);
    let m = load_model_args(args, common)?;
    let (clean_ids, clean_tokens) = ids_and_labels(&m, clean, "")?;
    let (corrupted_ids, corrupted_tokens) = ids_and_labels(&m, corrupted, "corrupted-")?;
    if clean_ids.len() != corrupted_ids.len() {
        return Err(UserError(format!(
            "the clean sequence has {} tokens and the corrupted one {}; patching needs equal lengths (clean {:?}, corrupted {:?})",
            clean_ids.len(),
            corrupted_ids.len(),
            clean_tokens,
            corrupted_tokens
        ))
        .into());
    }
    let metric = parse_metric(&m, metric, clean_ids.len())?;
    let kinds = nodes
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| burnlens_lens::NodeKind::from_name(s).map_err(|e| UserError(format!("--nodes: {e}"))))
        .collect::<Result<Vec<_>, _>>()?;
    // Denoising is noising with the roles swapped: the corrupted run is the base.
    let (base, source) = if denoise { (&corrupted_ids, &clean_ids) } else { (&clean_ids, &corrupted_ids) };
    let result = burnlens_lens::compare_patching(&m.model, base, source, &metric, &kinds, exact)?;
    let c = &m.model.config;
    let direction = if denoise { "denoising" } else { "noising" }.to_string();
    let report = burnlens_lens::tool_reports::PatchingReport {
        clean_ids,
        clean_tokens,
        corrupted_ids,
        corrupted_tokens,
        direction,
        n_layers: c.n_layers(),
        n_heads: c.n_heads,
        result,
    };
    burnlens_lens::tool_reports::write_patching(out, &report, &format!("burnlens patching on {}", m.dir.display())).map_err(report_err(out))?;
    let r = &report.result;
    let (c_m, x_m) = if denoise { (r.corrupted_metric, r.clean_metric) } else { (r.clean_metric, r.corrupted_metric) };
    println!("metric {}: clean {c_m:.4}, corrupted {x_m:.4} ({})", metric.describe(), report.direction);
    let shown = |values: &[f64]| {
        let mut order: Vec<usize> = (0..values.len()).collect();
        order.sort_by(|&a, &b| values[b].abs().total_cmp(&values[a].abs()));
        order.iter().take(5).map(|&i| format!("{} {:+.4}", r.labels[i], values[i])).collect::<Vec<_>>().join(", ")
    };
    println!("largest attribution-patching estimates: {}", shown(&r.attribution));
    if let Some(p) = &r.patched {
        println!("largest activation-patching effects:    {}", shown(p));
    }
    if let Some(cor) = r.correlation {
        let by: Vec<String> = r.correlation_by_kind.iter().map(|(k, v)| format!("{k} {v:.3}")).collect();
        println!("correlation of the two over {} nodes: {cor:.3} ({})", r.nodes.len(), by.join(", "));
    }
    println!("wrote {}", out.join("index.html").display());
    Ok(())
}
