//! `burnlens analyze`: the interpretability report of one sequence.

use anyhow::Result;

use crate::commands::{ids_and_labels, load_model_args, report_err};
use crate::{Common, Input, ModelArgs};

/// Write an interpretability report: per-token log-probabilities, attention viewer, head
/// detectors, OV copying and composition scores (index.html and report.json).
#[derive(clap::Args, Clone)]
pub struct AnalyzeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub input: Input,
    #[arg(long)]
    pub out: std::path::PathBuf,
    #[command(flatten)]
    pub common: Common,
}

pub fn run(a: &AnalyzeArgs) -> Result<()> {
    let (args, input, out, common) = (&a.model, &a.input, a.out.as_path(), &a.common);
    let m = load_model_args(args, common)?;
    let (ids, labels) = ids_and_labels(&m, input, "")?;
    let a = burnlens_lens::report::analyze(&m.model, &ids, labels);
    burnlens_lens::report::write_analysis(out, &a, &format!("burnlens analysis of {}", m.dir.display())).map_err(report_err(out))?;
    println!("wrote {} and {}", out.join("index.html").display(), out.join("report.json").display());
    let top = |name: &str| {
        let s = &a.detectors[name];
        let (mut best, mut at) = (f64::MIN, (0, 0));
        for (l, row) in s.iter().enumerate() {
            for (h, &v) in row.iter().enumerate() {
                if v > best {
                    best = v;
                    at = (l, h);
                }
            }
        }
        format!("{name}: L{}H{} ({best:.3})", at.0, at.1)
    };
    println!("strongest heads: {}, {}, {}", top("previous_token"), top("duplicate_token"), top("induction"));
    Ok(())
}
