//! The nodes a query's or a key's residual stream is written as: the attribution graph's
//! nodes at that position (features, errors, the token), what earlier attention heads wrote
//! there, the transcoders' skip terms, and the constants.

use serde::Serialize;

/// One part of the residual stream at position `pos`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum QkNode {
    /// An active transcoder feature of layer `layer` (a CLT feature: what its decoders into
    /// the layers below the head write), times its activation.
    Feature { layer: usize, feature: usize, pos: usize },
    /// What layer `layer`'s transcoder misses of its MLP's output (all of it at positions the
    /// graph gives no features, such as BOS).
    Error { layer: usize, pos: usize },
    /// The token's embedding.
    Embedding { pos: usize },
    /// What head `head` of layer `layer` wrote at `pos` (moved there from the positions it
    /// attended to; the graph's edges through that head trace it further).
    Attention { layer: usize, head: usize, pos: usize },
    /// Layer `layer`'s transcoder's skip term.
    Skip { layer: usize, pos: usize },
    /// Layer `layer`'s whole MLP output, where no transcoders replace the MLPs.
    Mlp { layer: usize, pos: usize },
    /// Every constant: position embeddings, the transcoders' `b_dec`, the attention output
    /// biases, and the norm and projection biases of the query (key) itself.
    Bias { pos: usize },
}

impl QkNode {
    pub fn pos(self) -> usize {
        match self {
            QkNode::Feature { pos, .. }
            | QkNode::Error { pos, .. }
            | QkNode::Embedding { pos }
            | QkNode::Attention { pos, .. }
            | QkNode::Skip { pos, .. }
            | QkNode::Mlp { pos, .. }
            | QkNode::Bias { pos } => pos,
        }
    }
}

impl std::fmt::Display for QkNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            QkNode::Feature { layer, feature, pos } => write!(f, "L{layer} feature {feature} @{pos}"),
            QkNode::Error { layer, pos } => write!(f, "L{layer} error @{pos}"),
            QkNode::Embedding { pos } => write!(f, "token @{pos}"),
            QkNode::Attention { layer, head, pos } => write!(f, "L{layer}.H{head} output @{pos}"),
            QkNode::Skip { layer, pos } => write!(f, "L{layer} skip @{pos}"),
            QkNode::Mlp { layer, pos } => write!(f, "L{layer} MLP @{pos}"),
            QkNode::Bias { pos } => write!(f, "biases @{pos}"),
        }
    }
}
