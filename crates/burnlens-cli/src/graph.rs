//! `burnlens graph`: an attribution graph through transcoders (circuit-tracer's method).

use anyhow::Result;

use crate::commands::{ids_and_labels, load_model_args, parse_token};
use crate::{Common, Input, ModelArgs};

/// An attribution graph (circuit-tracer's method): transcoders stand in for the MLPs,
/// attention patterns and norm scales are frozen, and every direct effect between
/// features, errors, tokens and the top logits is measured. Writes graph.safetensors,
/// graph.json (the schema Neuronpedia's viewer loads) and graph.html. Token ids are
/// attributed as given; text gets the model's BOS first.
#[derive(clap::Args, Clone)]
pub struct GraphArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub input: Input,
    #[command(flatten)]
    pub graph: GraphOptions,
    #[arg(long)]
    pub out: std::path::PathBuf,
    #[command(flatten)]
    pub common: Common,
}

/// What an attribution graph explains and how it is built and pruned (circuit-tracer's
/// arguments and defaults).
#[derive(clap::Args, Clone)]
pub struct GraphOptions {
    /// Transcoders: a folder with circuit-tracer's config.yaml and layer files, or a Hub
    /// repository org/name[@revision][:folder].
    #[arg(long)]
    pub transcoders: String,
    #[command(flatten)]
    pub attribute: burnlens_trace::AttributeArgs,
    /// Explain these next tokens instead (comma-separated ids or one-token texts).
    #[arg(long)]
    pub targets: Option<String>,
    /// Keep the nodes holding this share of the influence on the logits.
    #[arg(long, default_value_t = 0.8)]
    pub node_threshold: f32,
    /// Keep the edges holding this share of it.
    #[arg(long, default_value_t = 0.98)]
    pub edge_threshold: f32,
    /// Feature dashboards of these transcoders (`burnlens dashboards --transcoders --out
    /// DIR`): each feature node carries its top examples and logit effects in graph.json and
    /// graph.html.
    #[arg(long)]
    pub features: Option<std::path::PathBuf>,
    /// Add the attention side (burnlens's extension of graph.json, shown by graph.html):
    /// each kept edge that crosses positions gets the heads that carry it (`heads`, which add
    /// up to its weight with `heads_rest`), and those heads' QK attributions at the edges'
    /// target positions (`qk`, the `qk` command's rows).
    #[arg(long)]
    pub qk: bool,
}

pub fn run(a: &GraphArgs) -> Result<()> {
    let (args, input, g, out, common) = (&a.model, &a.input, &a.graph, a.out.as_path(), &a.common);
    use burnlens_trace::GraphText;
    burnlens_trace::check_thresholds(g.node_threshold, g.edge_threshold)?;
    let m = load_model_args(args, common)?;
    let (mut ids, _) = ids_and_labels(&m, input, "")?;
    if let (Some(_), Some(bos)) = (&input.text, m.bos)
        && ids.first() != Some(&bos)
    {
        ids.insert(0, bos);
    }
    let set = crate::progress::transcoders(&g.transcoders, &m.model.device())?;
    let targets = g.targets.as_ref().map(|list| list.split(',').map(|t| parse_token(&m, "--targets", t)).collect::<Result<Vec<_>>>()).transpose()?;
    let opts = g.attribute.options(targets);
    let t0 = std::time::Instant::now();
    let rm = burnlens_trace::Replacement::new(&m.model, &set, &ids, opts.zero_positions, opts.pattern_budget)?;
    let graph = burnlens_trace::attribute_on(&rm, &opts)?;
    let seconds = t0.elapsed().as_secs_f64();
    let prompt = m.text(&ids);
    let slug = out.file_name().map_or("graph".into(), |n| n.to_string_lossy().into_owned());
    let text = GraphText { slug, prompt, prompt_tokens: m.labels(&ids), logit_tokens: m.labels(&graph.logit_token_ids) };
    let dashboards = g.features.as_deref().map(|dir| burnlens_dashboards::read_config(dir).map(|cfg| (dir, cfg))).transpose()?;
    let (mut with, mut feature_nodes) = (0usize, 0usize);
    let mut failed = None;
    let tok = |t: u32| m.labels(&[t as i64]).remove(0);
    let mut annotate = |n: &mut burnlens_trace::Node| {
        let (Some((dir, cfg)), Some((layer, index))) = (&dashboards, n.transcoder_feature()) else { return };
        feature_nodes += 1;
        match burnlens_dashboards::read_feature(dir, burnlens_dashboards::FeatureKey { layer: Some(layer), index }) {
            Ok(Some(d)) => {
                let (label, dashboard) = burnlens_dashboards::node_fields(&d, cfg, &tok);
                (n.clerp, n.dashboard) = (label, Some(dashboard));
                with += 1;
            }
            Ok(None) => {}
            Err(e) => failed = Some(e),
        }
    };
    // The attention side reads the replacement model the graph was attributed on.
    let attention = |pruned: &burnlens_trace::Pruned| burnlens_trace::graph_attention(&rm, &graph, pruned, &opts, &burnlens_trace::AttentionOptions::default());
    let files = burnlens_trace::write_graph_with(
        out,
        &graph,
        &text,
        g.node_threshold,
        g.edge_threshold,
        &mut annotate,
        g.qk.then_some(&attention as burnlens_trace::AttentionOf),
    )?;
    if let Some(e) = failed {
        return Err(e.into());
    }
    if let Some((dir, _)) = &dashboards {
        println!("{with} of {feature_nodes} feature nodes have dashboards in {}", dir.display());
    }
    println!(
        "{} tokens, {} active features ({} with rows), {} logit targets (p = {:.3}), {} nodes; attributed in {seconds:.2} s",
        ids.len(),
        graph.active_features.len(),
        graph.selected_features.len(),
        graph.logit_token_ids.len(),
        graph.logit_probabilities.iter().sum::<f32>(),
        graph.n_nodes()
    );
    println!(
        "pruned to {} nodes and {} edges; replacement score {:.4}, completeness {:.4}",
        files.kept_nodes, files.kept_edges, files.replacement_score, files.completeness_score
    );
    println!("wrote {}, {} and {}", files.safetensors.display(), files.json.display(), files.html.display());
    Ok(())
}
