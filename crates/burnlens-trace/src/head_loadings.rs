//! Head loadings: which attention heads carry an edge of the attribution graph.
//!
//! An edge from a source at position `k` to a target at position `q ≠ k` is the sum of the
//! direct-effect paths between them in the frozen replacement model, each of which changes
//! position through attention. A head's loading is its one-hop path: from the source along
//! its own position with attention cut (residual stream, frozen norms, skip connections) to
//! the head's layer, through the head's value–output circuit with its attention weight
//! `A[q, k]`, then along the target's position with attention cut to the target. Paths
//! through two or more heads are the edge's `multi_hop` part, so that the loadings of all
//! heads plus `multi_hop` add up to the edge weight exactly. An edge whose source and target
//! have one attention layer between them has no multi-hop part. Cheap: per target, one
//! pass down its own position meets each layer's heads, and each head's part goes down
//! with attention cut, read only against the edge's sources.

use burn::tensor::{Int, Tensor, TensorData};
use burnlens_model::matmul::matmul;
use serde::Serialize;

use crate::TraceError;
use crate::attribute::logit_directions;
use crate::backward::{At, Targets, norm_back};
use crate::graph::{Graph, Pruned};
use crate::replacement::Replacement;

/// One head's share of an edge.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct HeadLoading {
    pub layer: usize,
    pub head: usize,
    pub weight: f32,
}

/// The heads that carry one edge that crosses positions (graph node indices): the largest
/// loadings first, the sum of the other heads' (`rest`), and the paths through several
/// heads (`multi_hop`): `Σ heads + rest + multi_hop = weight`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EdgeHeads {
    pub target: usize,
    pub source: usize,
    pub weight: f32,
    pub heads: Vec<HeadLoading>,
    pub rest: f32,
    pub multi_hop: f32,
}

/// A source of an edge as the loadings read it: a feature (active index), an error
/// `(layer, pos)` or a token (pos).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Source {
    Feature(usize),
    Error { layer: usize, pos: usize },
    Token(usize),
}

impl Source {
    fn pos(self, rm: &Replacement) -> usize {
        match self {
            Source::Feature(i) => rm.active[i].pos,
            Source::Error { pos, .. } | Source::Token(pos) => pos,
        }
    }
}

impl Replacement<'_> {
    /// Layer `l`'s heads backwards from a gradient `g_mid [1, p, d]` at its
    /// `hook_resid_mid` that only position `q` holds (the target's, attention cut above):
    /// each head's part of the gradient at its `hook_resid_pre`, at the positions `at`
    /// (`[heads, at.len(), d]`), which is head `h`'s attention weight `A_h[q, k]` times
    /// one vector per head.
    fn heads_at(&self, l: usize, g_mid: Tensor<3>, q: usize, at: &Tensor<1, Int>) -> Tensor<3> {
        let block = &self.model.blocks[l];
        let [_, p, d] = g_mid.dims();
        let g_o = match block.norm_after_attention(l) {
            Some((n, site)) => norm_back(n, &self.scale_at(site, At::First), g_mid, true),
            None => g_mid,
        };
        let layer = &self.layers[l];
        let a = self.pattern(l, p);
        let h = a.dims()[0];
        let dh = layer.w_o.dims()[0] / h;
        let z = matmul(g_o.narrow(1, q, 1).reshape([1, d]), layer.w_o.clone().transpose()).reshape([h, 1, dh]);
        let u = matmul(z, layer.w_v.clone().reshape([d, h, dh]).permute([1, 2, 0]));
        let weights = a.narrow(1, q, 1).select(2, at.clone()).swap_dims(1, 2);
        // Head `h`'s gradient at position `k` is `A_h[q, k] · u_h`, and the frozen norm's
        // backward is its position-free part (gain, centring) then `/ s_k`: so the norm
        // runs on the `[h, 1, d]` vectors and the positions are one product.
        match block.norm_before_attention(l) {
            Some((n, site)) => {
                let unit = Tensor::<3>::ones([1, 1, 1], &u.device());
                weights / self.scale_at(site, At::Only(at)) * norm_back(n, &unit, u, true)
            }
            None => weights * u,
        }
    }

    /// The one-hop loadings of one target (`t` holds one) on `sources`: `[heads, sources]`
    /// row-major, and the heads ((layer, head) in row order). Below a head attention is cut,
    /// so positions do not mix: only the sources' positions are kept.
    pub(crate) fn one_hop(&self, t: &Targets, sources: &[Source]) -> (Vec<f32>, Vec<(usize, usize)>) {
        let (n_layers, lt, q) = (self.n_layers(), t.layers[0], t.positions[0]);
        let p = q + 1;
        let top = lt.min(n_layers - 1);
        let mut positions: Vec<usize> = sources.iter().map(|s| s.pos(self)).collect();
        positions.sort_unstable();
        positions.dedup();
        let idx =
            Tensor::<1, Int>::from_data(TensorData::new(positions.iter().map(|&k| k as i64).collect::<Vec<_>>(), [positions.len()]), &self.model.device());
        let local = |s: &Source| positions.binary_search(&s.pos(self)).expect("a source's position");
        let n_heads: usize = (0..=top).map(|l| self.model.blocks[l].attn.n_heads).sum();
        let width = sources.len();
        let mut out = vec![0f32; n_heads * width];
        let mut heads: Vec<(usize, usize)> = Vec::with_capacity(n_heads);
        let injected = self.injected(t, &[0], p);
        // Along the target's position with attention cut.
        let (mut along, mut inject) =
            if lt == n_layers { (Some(norm_back(&self.model.ln_final, &self.ln_final_scale, injected, true)), None) } else { (None, Some(injected)) };
        // The heads' parts so far, one row each (`[heads, positions, d]` per layer above,
        // small: only the sources' positions), at the current `hook_resid_post`, going down
        // with attention cut. Kept per layer: joining them took a quarter of the loadings' time.
        let mut down: Vec<Tensor<3>> = Vec::new();
        for l in (0..=top).rev() {
            let reads = if down.is_empty() { None } else { self.layer_sources(l, sources, &local) };
            let mut row0 = 0;
            for g in down.iter_mut() {
                let rows = g.dims()[0];
                Self::read_at(&self.output_hook_grad(l, g, At::Only(&idx)), &reads, &mut out[row0 * width..], width);
                if let Some(g_in) = self.skip_back(l, g, At::Only(&idx)) {
                    *g = g.clone() + self.input_hook_to_mid(l, g_in, At::Only(&idx));
                }
                row0 += rows;
            }
            let g_in = match (along.as_ref().and_then(|g| self.skip_back(l, g, At::First)), inject.take()) {
                (Some(a), Some(b)) => Some(a + b),
                (a, b) => a.or(b),
            };
            let g_mid = match (along.take(), g_in) {
                (Some(g), Some(g_in)) => g + self.input_hook_to_mid(l, g_in, At::First),
                (Some(g), None) => g,
                (None, Some(g_in)) => self.input_hook_to_mid(l, g_in, At::First),
                (None, None) => unreachable!("the target injects at its layer or above"),
            };
            let from_heads = self.heads_at(l, g_mid.clone(), q, &idx);
            heads.extend((0..from_heads.dims()[0]).map(|h| (l, h)));
            down.push(from_heads);
            along = Some(g_mid);
        }
        let (mut at, mut vectors) = (Vec::new(), Vec::new());
        for (c, s) in sources.iter().enumerate() {
            if let Source::Token(k) = *s {
                at.push((c, local(s)));
                vectors.push(self.tokens.clone().narrow(0, k, 1));
            }
        }
        let reads = Reads::new(at, vectors, &self.model.device());
        let mut row0 = 0;
        for g in &down {
            Self::read_at(g, &reads, &mut out[row0 * width..], width);
            row0 += g.dims()[0];
        }
        (out, heads)
    }

    /// Add `g [rows, positions, d] · reads.vectors[j]` at `(column, position index) =
    /// reads.at[j]` into `out [rows, width]`.
    fn read_at(g: &Tensor<3>, reads: &Option<Reads>, out: &mut [f32], width: usize) {
        let Some(r) = reads else { return };
        let [b, _, d] = g.dims();
        let n = r.at.len();
        let picked = g.clone().select(1, r.index.clone());
        let vals: Vec<f32> = (picked * r.vectors.clone().reshape([1, n, d])).sum_dim(2).into_data().try_into_vec_as::<f32>().expect("f32");
        for row in 0..b {
            for (j, &(c, _)) in r.at.iter().enumerate() {
                out[row * width + c] += vals[row * n + j];
            }
        }
    }

    /// Layer `l`'s sources (its errors, and the features that write it) as read against the
    /// gradient at its output hook, at the sources' positions (`local` indexes them).
    fn layer_sources(&self, l: usize, sources: &[Source], local: &dyn Fn(&Source) -> usize) -> Option<Reads> {
        let (mut at, mut vectors) = (Vec::new(), Vec::new());
        for (c, s) in sources.iter().enumerate() {
            match *s {
                Source::Error { layer, pos } if layer == l => {
                    at.push((c, local(s)));
                    vectors.push(self.layers[l].errors.clone().narrow(0, pos, 1));
                }
                Source::Feature(i) => {
                    let a = self.active[i];
                    if let Some(w_dec) = l.checked_sub(a.layer).and_then(|k| self.set.layers[a.layer].w_dec.get(k)) {
                        at.push((c, local(s)));
                        vectors.push(w_dec.clone().narrow(0, a.feature, 1) * a.activation);
                    }
                }
                _ => {}
            }
        }
        Reads::new(at, vectors, &self.model.device())
    }
}

/// Sources read at once: `(column, position index)` each, their vectors `[n, d_model]` and
/// the position indices.
struct Reads {
    at: Vec<(usize, usize)>,
    vectors: Tensor<2>,
    index: Tensor<1, Int>,
}

impl Reads {
    fn new(at: Vec<(usize, usize)>, vectors: Vec<Tensor<2>>, device: &burn::tensor::Device) -> Option<Self> {
        if at.is_empty() {
            return None;
        }
        let idx: Vec<i64> = at.iter().map(|&(_, k)| k as i64).collect();
        let index = Tensor::<1, Int>::from_data(TensorData::new(idx, [at.len()]), device);
        Some(Self { vectors: Tensor::cat(vectors, 0), index, at })
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
/// or all), at most `top_heads` heads listed each, read from `rm`: the replacement model
/// the graph was attributed on (or one built again on its prompt with the same options).
pub fn head_loadings(rm: &Replacement, graph: &Graph, pruned: Option<&Pruned>, top_heads: usize) -> Result<Vec<EdgeHeads>, TraceError> {
    if rm.ids != graph.input_tokens {
        return Err(TraceError::Input(format!(
            "the replacement model was built on another prompt ({} tokens) than the graph's ({} tokens)",
            rm.ids.len(),
            graph.input_tokens.len()
        )));
    }
    let model = rm.model;
    let (n, n_f, n_pos, n_layers) = (graph.n_nodes(), graph.n_features(), graph.n_pos(), graph.n_layers);
    let source = |s: usize| {
        if s < n_f {
            Source::Feature(graph.selected_features[s] as usize)
        } else if s < n_f + n_layers * n_pos {
            Source::Error { layer: (s - n_f) / n_pos, pos: (s - n_f) % n_pos }
        } else {
            Source::Token(s - n_f - n_layers * n_pos)
        }
    };
    // The targets' directions at once: the logits', and the feature targets' encoder rows
    // (read in one selection per layer, not one per target).
    let directions = logit_directions(model, &graph.logit_token_ids);
    let features: Vec<usize> = graph.selected_features.iter().map(|&i| i as usize).collect();
    let encoders = rm.encoder_rows(&features);
    let mut out = Vec::new();
    for r in 0..graph.n_features() + graph.n_logits() {
        let target = graph.row_node(r);
        let q = node_position(graph, target);
        let kept = |s: usize| pruned.is_none_or(|p| p.node_mask[target] && p.node_mask[s] && p.edge_mask[r * n + s]);
        let edges: Vec<usize> = (0..n).filter(|&s| graph.row(r)[s] != 0.0 && node_position(graph, s) != q && kept(s)).collect();
        if edges.is_empty() {
            continue;
        }
        let (layer, vectors) = if target < n_f {
            (rm.active[features[target]].layer, encoders.clone().narrow(0, target, 1))
        } else {
            (rm.n_layers(), directions.clone().narrow(0, r - n_f, 1))
        };
        let sources: Vec<Source> = edges.iter().map(|&s| source(s)).collect();
        let (loads, heads) = rm.one_hop(&Targets { layers: &[layer], positions: &[q], vectors }, &sources);
        for (c, &s) in edges.iter().enumerate() {
            let weight = graph.row(r)[s];
            let mut list: Vec<HeadLoading> =
                heads.iter().enumerate().map(|(i, &(layer, head))| HeadLoading { layer, head, weight: loads[i * edges.len() + c] }).collect();
            let one_hop: f64 = list.iter().map(|h| h.weight as f64).sum();
            list.sort_by(|a, b| b.weight.abs().total_cmp(&a.weight.abs()));
            let rest = list.iter().skip(top_heads).map(|h| h.weight as f64).sum::<f64>() as f32;
            list.truncate(top_heads);
            out.push(EdgeHeads { target, source: s, weight, heads: list, rest, multi_hop: (weight as f64 - one_hop) as f32 });
        }
    }
    Ok(out)
}
