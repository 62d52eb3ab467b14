//! `burnlens attribute`: direct logit attribution.

use anyhow::Result;

use crate::commands::{ids_and_labels, load_model_args, parse_token, report_err, token_suffix};
use crate::{Common, Input, ModelArgs, UserError};

/// Direct logit attribution: what every head, MLP and embedding writes along a logit (or
/// logit difference), summing to the model's logits (report.json and index.html).
#[derive(clap::Args, Clone)]
pub struct AttributeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub input: Input,
    /// The token whose logit is explained (id or text of one token).
    #[arg(long)]
    pub target: String,
    /// Explain logit[target] − logit[wrong] instead.
    #[arg(long)]
    pub wrong: Option<String>,
    /// The position to show in detail (default: the last).
    #[arg(long)]
    pub pos: Option<usize>,
    #[arg(long)]
    pub out: std::path::PathBuf,
    #[command(flatten)]
    pub common: Common,
}

pub fn run(a: &AttributeArgs) -> Result<()> {
    let (args, input, target, wrong, pos, out, common) = (&a.model, &a.input, a.target.as_str(), a.wrong.as_deref(), a.pos, a.out.as_path(), &a.common);
    let m = load_model_args(args, common)?;
    let (ids, tokens) = ids_and_labels(&m, input, "")?;
    let right = parse_token(&m, "--target", target)?;
    let wrong = wrong.map(|w| parse_token(&m, "--wrong", w)).transpose()?;
    let position = pos.unwrap_or(ids.len() - 1);
    if position >= ids.len() {
        return Err(UserError(format!("--pos {position}: the sequence has {} tokens", ids.len())).into());
    }
    let dla = burnlens_lens::direct_logit_attribution(&m.model, &ids, right, wrong);
    let name = |id: i64| format!("{id}{}", token_suffix(&m, id));
    let target_label = match wrong {
        None => format!("logit[{}]", name(right)),
        Some(w) => format!("logit[{}] - logit[{}]", name(right), name(w)),
    };
    let c = &m.model.config;
    let report =
        burnlens_lens::tool_reports::AttributionReport { ids, tokens, target: target_label.clone(), position, n_layers: c.n_layers(), n_heads: c.n_heads, dla };
    burnlens_lens::tool_reports::write_attribution(out, &report, &format!("burnlens direct logit attribution on {}", m.dir.display()))
        .map_err(report_err(out))?;
    let d = &report.dla;
    let mut order: Vec<usize> = (0..d.labels.len()).collect();
    order.sort_by(|&a, &b| d.contributions[b][position].abs().total_cmp(&d.contributions[a][position].abs()));
    let top: Vec<String> = order.iter().take(6).map(|&i| format!("{} {:+.4}", d.labels[i], d.contributions[i][position])).collect();
    println!("{target_label} at position {position}: {:.4} = components + bias {:.4} (largest gap {:.1e})", d.logits[position], d.bias[position], d.max_error);
    println!("largest components: {}", top.join(", "));
    println!("wrote {}", out.join("index.html").display());
    Ok(())
}
