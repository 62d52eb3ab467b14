//! `burnlens qk`: why one head attends where it does (QK attributions).

use anyhow::Result;

use crate::commands::ids_and_labels;
use crate::{Common, Input, ModelArgs};

/// QK attributions of one head: each (query, key) score it attends with, written as a sum of
/// terms over pairs of parts of the two residual streams (transcoder features, error nodes,
/// tokens, earlier heads' outputs, skip terms, constants; or whole MLP outputs without
/// transcoders), norm scales frozen as attribution
/// graphs freeze them. Prints the strongest keys' top terms and writes every row as JSON.
/// Token ids are used as given; text gets the model's BOS first.
#[derive(clap::Args, Clone)]
pub struct QkArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub input: Input,
    /// Transcoders: a folder with circuit-tracer's config.yaml and layer files, or a Hub
    /// repository org/name[@revision][:folder]. Without, each MLP's output is one part.
    #[arg(long)]
    pub transcoders: Option<String>,
    #[command(flatten)]
    pub qk: burnlens_trace::QkOptions,
    /// The JSON file of rows `{layer, head, query, key, score, pattern, terms, remainder, ...}`.
    #[arg(long)]
    pub out: std::path::PathBuf,
    #[command(flatten)]
    pub common: Common,
}

pub fn run(a: &QkArgs) -> Result<()> {
    let m = crate::commands::load_model_args(&a.model, &a.common)?;
    let (mut ids, _) = ids_and_labels(&m, &a.input, "")?;
    if let (Some(_), Some(bos)) = (&a.input.text, m.bos)
        && ids.first() != Some(&bos)
    {
        ids.insert(0, bos);
    }
    let set = a.transcoders.as_ref().map(|t| crate::progress::transcoders(t, &m.model.device())).transpose()?;
    let t0 = std::time::Instant::now();
    let head = burnlens_trace::qk_attributions(&m.model, set.as_ref(), &ids, &a.qk)?;
    let seconds = t0.elapsed().as_secs_f64();
    let labels = m.labels(&ids);
    let token = |p: usize| format!("{p}:{:?}", labels[p]);
    // Each query's strongest key, its score and its three largest terms.
    let mut last_query = usize::MAX;
    let mut best: Vec<&burnlens_trace::QkRow> = Vec::new();
    for r in &head.rows {
        if r.query != last_query {
            best.push(r);
            last_query = r.query;
        } else if r.pattern > best.last().expect("a row").pattern {
            *best.last_mut().expect("a row") = r;
        }
    }
    println!("L{}.H{}: each query's most attended key (weight, score = feature×feature + with errors + rest), top terms", a.qk.layer, a.qk.head);
    for r in best {
        println!(
            "  {} -> {}  w {:.3}  score {:.4} = {:.4} + {:.4} + {:.4}",
            token(r.query),
            token(r.key),
            r.pattern,
            r.score,
            r.feature_feature,
            r.error,
            r.other
        );
        for t in r.terms.iter().take(3) {
            println!("      {:+.4}  {} · {}", t.contribution, t.query_node, t.key_node);
        }
    }
    let file = std::fs::File::create(&a.out).map_err(|e| anyhow::anyhow!("{}: {e}", a.out.display()))?;
    serde_json::to_writer(std::io::BufWriter::new(file), &head.rows)?;
    println!(
        "{} rows, {} parts of the residual streams (they add up to the model's within {:.1e}); {seconds:.2} s; wrote {}",
        head.rows.len(),
        head.n_parts,
        head.residual_gap,
        a.out.display()
    );
    Ok(())
}
