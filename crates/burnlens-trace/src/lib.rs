//! Circuit tracing, as `circuit-tracer` does it: transcoders stand in for the MLPs, attention
//! patterns and norm scales are frozen, and the direct effect of every active feature,
//! error term and input token on every other node and on the chosen logits becomes an
//! attribution graph, which is pruned to the nodes and edges that carry most of the
//! influence on the output.
//!
//! ```ignore
//! let set = TranscoderSet::load(Path::new("transcoders/"), &device)?;
//! let graph = attribute(&model, &set, &ids, &AttributeOptions::default())?;
//! let pruned = graph.prune(0.8, 0.98)?;
//! let (replacement, completeness) = graph.scores()?;
//! ```
//!
//! Modules, bottom up: [`transcoder`] (each layer a lens [`Dictionary`](burnlens_lens::Dictionary), hook points), [`circuit_tracer`]
//! (circuit-tracer's files, read and written), [`hub`] (sets by Hub id), [`replacement`] (the frozen forward pass; `writer`, its features laid out by position), [`backward`]
//! (attribution rows), [`attribute`] (targets and the graph; [`attribute_args`], its arguments as users spell them), [`graph`] (pruning, scores,
//! saving; its rows in a [`store`]), [`json`] and [`html`] (the viewer's files), [`intervene`] (feature interventions), [`qk`] (QK attributions:
//! why a head attends where it does), [`head_loadings`] (which heads carry an edge), [`graph_attention`]
//! (both for a pruned graph, `graph --qk`).

pub mod attribute;
pub mod attribute_args;
pub mod backward;
pub mod circuit_tracer;
pub mod error;
mod found;
pub mod graph;
pub mod graph_attention;
pub mod head_loadings;
pub mod html;
pub mod hub;
pub mod intervene;
pub mod json;
pub mod output;
pub mod qk;
pub mod replacement;
pub mod store;
pub mod transcoder;
pub(crate) mod writer;

pub use attribute::{AttributeOptions, LogitTargets, attribute, attribute_on, select_logits};
pub use attribute_args::AttributeArgs;
pub use error::TraceError;
pub use graph::{Graph, Pruned, check_thresholds};
pub use graph_attention::{AttentionOptions, GraphAttention, graph_attention};
pub use head_loadings::{EdgeHeads, HeadLoading, head_loadings, node_position};
pub use intervene::{Intervened, Intervention, feature_intervention};
pub use json::{GraphJson, GraphText, Node};
pub use output::{AttentionOf, GraphFiles, write_graph, write_graph_with};
pub use qk::{QkHead, QkNode, QkOptions, QkRow, QkTerm, qk_attributions};
pub use replacement::{ActiveFeature, Replacement, layer_inputs};
pub use transcoder::{InputHook, OutputHook, TranscoderSet};
