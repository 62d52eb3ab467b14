//! `burnlens lens`: the logit lens.

use anyhow::Result;

use crate::commands::{ids_and_labels, load_model_args, parse_token, report_err};
use crate::{Common, Input, ModelArgs};

/// The logit lens: every layer's residual stream read through the final norm and the
/// unembedding (report.json and index.html).
#[derive(clap::Args, Clone)]
pub struct LensArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub input: Input,
    /// A token to follow through the layers (default: each position's next token).
    #[arg(long)]
    pub target: Option<String>,
    /// How many top tokens to keep per layer and position.
    #[arg(long, default_value_t = 5)]
    pub top: usize,
    #[arg(long)]
    pub out: std::path::PathBuf,
    #[command(flatten)]
    pub common: Common,
}

pub fn run(a: &LensArgs) -> Result<()> {
    let (args, input, target, top, out, common) = (&a.model, &a.input, a.target.as_deref(), a.top, a.out.as_path(), &a.common);
    let m = load_model_args(args, common)?;
    let (ids, tokens) = ids_and_labels(&m, input, "")?;
    let target = target.map(|t| parse_token(&m, "--target", t)).transpose()?;
    let l = burnlens_lens::logit_lens(&m.model, &ids, top.max(1), target);
    let top_tokens: Vec<Vec<Vec<String>>> =
        l.top.iter().map(|layer| layer.iter().map(|pos| pos.iter().map(|(id, _)| m.labels(&[*id])[0].clone()).collect()).collect()).collect();
    let report = burnlens_lens::tool_reports::LensReport { ids, tokens, top_tokens, lens: l };
    burnlens_lens::tool_reports::write_lens(out, &report, &format!("burnlens logit lens on {}", m.dir.display())).map_err(report_err(out))?;
    let p = report.ids.len() - 1;
    println!("logit lens at the last position ({:?}):", report.tokens[p]);
    for (li, name) in report.lens.layers.iter().enumerate() {
        let lp = report.lens.target_logprob[li][p].map_or(String::new(), |v| format!(", target log p {v:.3}"));
        println!("  {name:<14} top {:?} ({:.3}){lp}", report.top_tokens[li][p][0], report.lens.top[li][p][0].1);
    }
    println!("wrote {}", out.join("index.html").display());
    Ok(())
}
