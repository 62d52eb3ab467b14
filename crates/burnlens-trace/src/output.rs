//! A graph's folder: `graph.safetensors` (the whole graph, circuit-tracer's tensors),
//! `graph.json` (the pruned graph in the viewer's schema) and `graph.html` (a view of it).

use std::path::{Path, PathBuf};

use crate::TraceError;
use crate::graph::{Graph, Pruned};
use crate::graph_attention::GraphAttention;
use crate::json::{GraphText, Node};

/// The largest square `adjacency_matrix` written beside the stored rows (1 GiB).
pub const DENSE_LIMIT: u64 = 1 << 30;

/// What [`write_graph`] wrote and measured.
#[derive(Debug, Clone)]
pub struct GraphFiles {
    pub safetensors: PathBuf,
    pub json: PathBuf,
    pub html: PathBuf,
    /// Nodes and edges of the pruned graph as the JSON holds them.
    pub kept_nodes: usize,
    pub kept_edges: usize,
    pub replacement_score: f32,
    pub completeness_score: f32,
}

/// Prune `graph` at the thresholds and write its three files into `dir` (made if missing);
/// each file is written atomically.
pub fn write_graph(dir: &Path, graph: &Graph, text: &GraphText, node_threshold: f32, edge_threshold: f32) -> Result<GraphFiles, TraceError> {
    write_graph_with(dir, graph, text, node_threshold, edge_threshold, &mut |_| {}, None)
}

/// What the pruned graph's attention side is, from the pruned graph (`graph --qk`).
pub type AttentionOf<'a> = &'a dyn Fn(&Pruned) -> Result<GraphAttention, TraceError>;

/// [`write_graph`], each kept node passed through `annotate` before the JSON and the page
/// are written (to give feature nodes their dashboards and labels), and with `attention`
/// the heads of the links and their QK attributions added.
pub fn write_graph_with(
    dir: &Path,
    graph: &Graph,
    text: &GraphText,
    node_threshold: f32,
    edge_threshold: f32,
    annotate: &mut dyn FnMut(&mut Node),
    attention: Option<AttentionOf>,
) -> Result<GraphFiles, TraceError> {
    let pruned = graph.prune(node_threshold, edge_threshold)?;
    let (replacement_score, completeness_score) = graph.scores()?;
    std::fs::create_dir_all(dir).map_err(|e| TraceError::file(dir, format!("cannot make the output folder: {e}")))?;
    let files = GraphFiles {
        safetensors: dir.join("graph.safetensors"),
        json: dir.join("graph.json"),
        html: dir.join("graph.html"),
        kept_nodes: 0,
        kept_edges: 0,
        replacement_score,
        completeness_score,
    };
    graph.save_safetensors(&files.safetensors, DENSE_LIMIT)?;
    let mut json = graph.to_json(&pruned, text, node_threshold);
    json.nodes.iter_mut().for_each(annotate);
    if let Some(attention) = attention {
        attention(&pruned)?.annotate(&mut json, graph, text);
    }
    burnlens_model::files::write_atomic(&files.json, serde_json::to_string_pretty(&json).expect("json").as_bytes())?;
    burnlens_model::files::write_atomic(&files.html, crate::html::graph_html(&json).as_bytes())?;
    Ok(GraphFiles { kept_nodes: json.nodes.len(), kept_edges: json.links.len(), ..files })
}
