//! Head loadings: which attention heads carry an edge of the attribution graph.
//!
//! An edge from a source at position `k` to a target at position `q ≠ k` is the sum of the
//! direct-effect paths between them in the frozen replacement model, and every such path
//! changes position through at least one attention head. Grouping the paths by the *last*
//! head they pass (the one that writes into the target's position; after it a path stays
//! there, through the residual stream, the norms and the skip connections) splits the edge
//! exactly: the loadings of all heads add up to the edge weight. One backward pass per
//! target: the gradient along the target's position with attention cut meets each layer's
//! heads, and what each head passes back continues through the whole frozen model (later
//! heads included) to the sources.

use burn::tensor::Tensor;
use serde::Serialize;

use crate::TraceError;
use crate::attribute::{AttributeOptions, logit_directions};
use crate::backward::{Targets, norm_back, scatter};
use crate::graph::{Graph, Pruned};
use crate::replacement::Replacement;
use crate::transcoder::TranscoderSet;

/// One head's share of an edge.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct HeadLoading {
    pub layer: usize,
    pub head: usize,
    pub weight: f32,
}

/// The heads that carry one edge that crosses positions (graph node indices): the largest
/// loadings first, and the sum of the others, so that `Σ heads + rest = weight`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EdgeHeads {
    pub target: usize,
    pub source: usize,
    pub weight: f32,
    pub heads: Vec<HeadLoading>,
    pub rest: f32,
}

impl Replacement<'_> {
    /// Layer `l`'s attention backwards head by head: from the gradient `g_mid [1, p, d]` at
    /// its `hook_resid_mid` to each head's part of the gradient at its `hook_resid_pre`,
    /// `[heads, p, d]` (through the frozen pattern and norms).
    fn heads_back(&self, l: usize, g_mid: Tensor<3>) -> Tensor<3> {
        let block = &self.model.blocks[l];
        let [_, p, d] = g_mid.dims();
        let g_o = match block.norm_after_attention(l) {
            Some((n, site)) => norm_back(n, self.scale(site), g_mid, true),
            None => g_mid,
        };
        let layer = &self.layers[l];
        let a = self.pattern(l, p);
        let h = a.dims()[0];
        let dh = layer.w_o.dims()[0] / h;
        let gz = g_o.reshape([p, d]).matmul(layer.w_o.clone().transpose()).reshape([p, h, dh]).swap_dims(0, 1);
        let w_v = layer.w_v.clone().reshape([d, h, dh]).permute([1, 2, 0]);
        let g_x = a.swap_dims(1, 2).matmul(gz).matmul(w_v);
        match block.norm_before_attention(l) {
            Some((n, site)) => norm_back(n, self.scale(site), g_x, true),
            None => g_x,
        }
    }

    /// The head rows of one target (`t` holds one): row `i`, over the columns of
    /// [`rows_into`](Self::rows_into), holds each source's share of its edge through paths
    /// whose last head is `heads[i]`; returns the rows (`row` floats each) and `heads`.
    pub(crate) fn head_rows(&self, t: &Targets, row: usize) -> (Vec<f32>, Vec<(usize, usize)>) {
        let (n_layers, lt, q) = (self.n_layers(), t.layers[0], t.positions[0]);
        let p = q + 1;
        let top = lt.min(n_layers - 1);
        let n_rows: usize = (0..=top).map(|l| self.model.blocks[l].attn.n_heads).sum();
        let mut rows = vec![0f32; n_rows * row];
        let mut heads: Vec<(usize, usize)> = Vec::with_capacity(n_rows);
        let injected = self.injected(t, &[0], p);
        // Along the target's position with attention cut: the gradient at `hook_resid_post`,
        // or (a feature target) the injection at its layer's input hook.
        let (mut along, mut inject) =
            if lt == n_layers { (Some(norm_back(&self.model.ln_final, &self.ln_final_scale, injected, true)), None) } else { (None, Some(injected)) };
        // What the heads passed back so far, one row each, at the current `hook_resid_post`.
        let mut full: Option<Tensor<3>> = None;
        for l in (0..=top).rev() {
            if let Some(g) = full.take() {
                let order: Vec<usize> = (0..heads.len()).collect();
                let g_mid = match self.mlp_back(l, &g, &order, &mut rows, row) {
                    Some(g_in) => g + self.input_hook_to_mid(l, g_in),
                    None => g,
                };
                full = Some(self.attention_block_back(l, g_mid));
            }
            let g_in = match (along.as_ref().and_then(|g| self.skip_back(l, g)), inject.take()) {
                (Some(a), Some(b)) => Some(a + b),
                (a, b) => a.or(b),
            };
            let g_mid = match (along.take(), g_in) {
                (Some(g), Some(g_in)) => g + self.input_hook_to_mid(l, g_in),
                (Some(g), None) => g,
                (None, Some(g_in)) => self.input_hook_to_mid(l, g_in),
                (None, None) => unreachable!("the target injects at its layer or above"),
            };
            let from_heads = self.heads_back(l, g_mid.clone());
            heads.extend((0..from_heads.dims()[0]).map(|h| (l, h)));
            full = Some(match full {
                Some(f) => Tensor::cat(vec![f, from_heads], 0),
                None => from_heads,
            });
            along = Some(g_mid);
        }
        let g = full.expect("layer 0's heads joined");
        let tok = (g * self.tokens.clone().narrow(0, 0, p).unsqueeze::<3>()).sum_dim(2);
        let order: Vec<usize> = (0..heads.len()).collect();
        scatter(&mut rows, row, self.active.len() + n_layers * self.n_pos(), &order, p, tok);
        (rows, heads)
    }
}

/// The position of graph node `node`.
pub fn node_position(graph: &Graph, node: usize) -> usize {
    let (n_f, n_pos, n_layers) = (graph.n_features(), graph.n_pos(), graph.n_layers);
    if node < n_f {
        graph.active_features[graph.selected_features[node] as usize][1] as usize
    } else if node < n_f + n_layers * n_pos {
        (node - n_f) % n_pos
    } else if node < n_f + (n_layers + 1) * n_pos {
        node - n_f - n_layers * n_pos
    } else {
        n_pos - 1
    }
}

/// The head loadings of every edge of `graph` that crosses positions (those `pruned` keeps,
/// or all), at most `top_heads` heads listed each, built from `set` and the model again
/// (one forward pass, `opts.zero_positions` and `opts.pattern_budget` as the graph's).
pub fn head_loadings(
    model: &burnlens_model::Transformer,
    set: &TranscoderSet,
    graph: &Graph,
    pruned: Option<&Pruned>,
    opts: &AttributeOptions,
    top_heads: usize,
) -> Result<Vec<EdgeHeads>, TraceError> {
    let rm = Replacement::new(model, set, &graph.input_tokens, opts.zero_positions, opts.pattern_budget)?;
    let (n, n_f, n_active) = (graph.n_nodes(), graph.n_features(), rm.active.len());
    let width = n_active + (rm.n_layers() + 1) * rm.n_pos();
    // A graph column's column in the head rows.
    let column = |s: usize| if s < n_f { graph.selected_features[s] as usize } else { n_active + (s - n_f) };
    let directions = logit_directions(model, &graph.logit_token_ids);
    let d = rm.d_model();
    let mut out = Vec::new();
    for r in 0..graph.n_features() + graph.n_logits() {
        let target = graph.row_node(r);
        let q = node_position(graph, target);
        let kept = |s: usize| pruned.is_none_or(|p| p.node_mask[target] && p.node_mask[s] && p.edge_mask[r * n + s]);
        let edges: Vec<usize> = (0..n).filter(|&s| graph.row(r)[s] != 0.0 && node_position(graph, s) != q && kept(s)).collect();
        if edges.is_empty() {
            continue;
        }
        let (layer, vector) = if target < n_f {
            let i = graph.selected_features[target] as usize;
            (rm.active[i].layer, rm.encoder_rows(&[i]))
        } else {
            let k = r - n_f;
            (rm.n_layers(), directions[k * d..(k + 1) * d].to_vec())
        };
        let (rows, heads) = rm.head_rows(&Targets { layers: &[layer], positions: &[q], vectors: &vector }, width);
        for s in edges {
            let c = column(s);
            let mut loads: Vec<HeadLoading> =
                heads.iter().enumerate().map(|(i, &(layer, head))| HeadLoading { layer, head, weight: rows[i * width + c] }).collect();
            loads.sort_by(|a, b| b.weight.abs().total_cmp(&a.weight.abs()));
            let rest = loads.iter().skip(top_heads).map(|h| h.weight as f64).sum::<f64>() as f32;
            loads.truncate(top_heads);
            out.push(EdgeHeads { target, source: s, weight: graph.row(r)[s], heads: loads, rest });
        }
    }
    Ok(out)
}
