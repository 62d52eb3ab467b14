//! Activation patching and its linear estimate, attribution patching.
//!
//! A *node* is a piece of one activation: a head's `hook_z` (all positions), one position of
//! the residual stream entering a layer, or a layer's MLP output. Patching a node runs the
//! clean sequence with that piece replaced by its value on the corrupted sequence and reads
//! the metric's change. Attribution patching estimates every change at once from one clean
//! forward/backward and one corrupted forward: `(corrupted − clean) · ∂metric/∂activation`
//! summed over the node.

use std::collections::BTreeMap;

use burn::tensor::{Tensor, TensorData};
use burnlens_model::{Activation, AttnHook, BlockHook, Forward, HookPoint, Hooks, Stop, Transformer};
use serde::Serialize;

use crate::cache::run_with_cache;
use crate::grad::{Metric, MetricError, hook_gradients};

/// What kind of piece a node is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeKind {
    /// `blocks.{layer}.attn.hook_z[:, :, head]`.
    Head,
    /// `blocks.{layer}.hook_resid_pre[:, pos]`.
    ResidPre,
    /// `blocks.{layer}.hook_mlp_out`.
    Mlp,
}

impl NodeKind {
    pub const ALL: [NodeKind; 3] = [NodeKind::Head, NodeKind::ResidPre, NodeKind::Mlp];

    /// Parse `head`, `resid_pre` or `mlp` (or `heads`, `resid`, `pos`, `mlps`).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "head" | "heads" => Some(NodeKind::Head),
            "resid_pre" | "resid" | "pos" => Some(NodeKind::ResidPre),
            "mlp" | "mlps" => Some(NodeKind::Mlp),
            _ => None,
        }
    }

    /// [`parse`](Self::parse) with the one-line error every front end shows.
    pub fn from_name(s: &str) -> Result<Self, String> {
        Self::parse(s).ok_or_else(|| format!("unknown node kind {s:?}; expected head, resid_pre or mlp"))
    }

    /// The kind's name (`head`, `resid_pre`, `mlp`), as [`parse`](Self::parse) reads it and
    /// the reports write it.
    pub fn name(self) -> &'static str {
        match self {
            NodeKind::Head => "head",
            NodeKind::ResidPre => "resid_pre",
            NodeKind::Mlp => "mlp",
        }
    }

    /// How many nodes of this kind one layer has: its heads, the sequence's `len`
    /// positions, or one MLP.
    pub fn width(self, n_heads: usize, len: usize) -> usize {
        match self {
            NodeKind::Head => n_heads,
            NodeKind::ResidPre => len,
            NodeKind::Mlp => 1,
        }
    }

    /// The hook point a node of this kind lives in.
    pub fn hook(self, layer: usize) -> HookPoint {
        match self {
            NodeKind::Head => HookPoint::Attn(layer, AttnHook::Z),
            NodeKind::ResidPre => HookPoint::Block(layer, BlockHook::ResidPre),
            NodeKind::Mlp => HookPoint::Block(layer, BlockHook::MlpOut),
        }
    }
}

/// One patchable piece.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Node {
    pub kind: NodeKind,
    pub layer: usize,
    /// The head (`Head`) or position (`ResidPre`); 0 for `Mlp`.
    pub index: usize,
}

impl Node {
    /// `L1H3`, `L0P5` or `L2MLP`.
    pub fn label(&self) -> String {
        match self.kind {
            NodeKind::Head => format!("L{}H{}", self.layer, self.index),
            NodeKind::ResidPre => format!("L{}P{}", self.layer, self.index),
            NodeKind::Mlp => format!("L{}MLP", self.layer),
        }
    }

    /// A `[1, ..]` 0/1 mask over the node's activation (shape `dims`) selecting the node.
    fn mask(&self, dims: &[usize], device: &burn::tensor::Device) -> Activation {
        match (self.kind, dims) {
            (NodeKind::Head, &[_, _, h, _]) => {
                let m: Vec<f32> = (0..h).map(|i| f32::from(u8::from(i == self.index))).collect();
                Activation::Rank4(Tensor::from_data(TensorData::new(m, [1, 1, h, 1]), device))
            }
            (NodeKind::ResidPre, &[_, t, _]) => {
                let m: Vec<f32> = (0..t).map(|i| f32::from(u8::from(i == self.index))).collect();
                Activation::Rank3(Tensor::from_data(TensorData::new(m, [1, t, 1]), device))
            }
            (NodeKind::Mlp, &[_, _, _]) => Activation::Rank3(Tensor::ones([1, 1, 1], device)),
            _ => panic!("node {} does not fit an activation of shape {dims:?}", self.label()),
        }
    }
}

/// Every node of the given kinds in `model` for sequences of `len` tokens (MLP nodes only
/// where the model has MLPs).
pub fn nodes(model: &Transformer, len: usize, kinds: &[NodeKind]) -> Vec<Node> {
    let c = &model.config;
    let mut out = Vec::new();
    for &kind in kinds {
        for layer in 0..c.n_layers() {
            let n = match kind {
                NodeKind::Head => c.n_heads,
                NodeKind::ResidPre => len,
                NodeKind::Mlp if c.d_mlp.is_some() => 1,
                NodeKind::Mlp => 0,
            };
            out.extend((0..n).map(|index| Node { kind, layer, index }));
        }
    }
    out
}

/// One kind's values laid out as `[layer][index]` (TransformerLens's patching grids: heads
/// `[layers, heads]`, positions `[layers, pos]`, MLPs `[layers, 1]`), from `values` (one per
/// node of `nodes`); zero where a layer has no such node.
pub fn grid(nodes: &[Node], values: &[f64], kind: NodeKind, n_layers: usize, width: usize) -> Vec<Vec<f64>> {
    let mut g = vec![vec![0.0; width]; n_layers];
    for (n, v) in nodes.iter().zip(values) {
        if n.kind == kind {
            g[n.layer][n.index] = *v;
        }
    }
    g
}

/// Both estimates of every node's effect, and how well they agree.
#[derive(Debug, Clone, Serialize)]
pub struct PatchingResult {
    pub metric: Metric,
    pub clean_metric: f64,
    pub corrupted_metric: f64,
    pub nodes: Vec<Node>,
    pub labels: Vec<String>,
    /// `(corrupted − clean) · gradient` per node.
    pub attribution: Vec<f64>,
    /// `metric(clean with the node patched from corrupted) − metric(clean)` per node, if run.
    pub patched: Option<Vec<f64>>,
    /// Pearson correlation of `attribution` and `patched` over all nodes, and per kind.
    pub correlation: Option<f64>,
    pub correlation_by_kind: BTreeMap<String, f64>,
}

fn check_lengths(clean: &[i64], corrupted: &[i64]) -> Result<(), MetricError> {
    if clean.len() != corrupted.len() {
        return Err(MetricError::Lengths { clean: clean.len(), corrupted: corrupted.len() });
    }
    Ok(())
}

fn hook_filter(nodes: &[Node]) -> impl Fn(HookPoint) -> bool + use<> {
    let points: Vec<HookPoint> = nodes.iter().map(|n| n.kind.hook(n.layer)).collect();
    move |p| points.contains(&p)
}

/// Attribution patching: the first-order estimate of each node's patching effect, from one
/// clean forward/backward and one corrupted forward.
pub fn attribution_patching(model: &Transformer, clean: &[i64], corrupted: &[i64], metric: &Metric, nodes: &[Node]) -> Result<(f64, Vec<f64>), MetricError> {
    check_lengths(clean, corrupted)?;
    let filter = hook_filter(nodes);
    let g = hook_gradients(model, clean, &filter, metric)?;
    let corr = run_with_cache(model, corrupted, &filter).activations;
    // The clean activations from the same kind of pass as the corrupted ones: the gradient
    // pass multiplies by weights being tracked (not packed), whose sums may differ in the
    // last bits (on AVX2, by 3e-6 in an attribution), so identical inputs would not give
    // exactly zero.
    let clean_acts = if clean == corrupted { corr.clone() } else { run_with_cache(model, clean, &filter).activations };
    let device = model.device();
    // Per hook: (corrupted − clean) · gradient, elementwise, computed once.
    let mut products: BTreeMap<HookPoint, Activation> = BTreeMap::new();
    for name in g.gradients.keys() {
        let p = match (&g.gradients[name], &clean_acts[name], &corr[name]) {
            (Activation::Rank3(gr), Activation::Rank3(a), Activation::Rank3(c)) => Activation::Rank3((c.clone() - a.clone()) * gr.clone()),
            (Activation::Rank4(gr), Activation::Rank4(a), Activation::Rank4(c)) => Activation::Rank4((c.clone() - a.clone()) * gr.clone()),
            _ => unreachable!("one hook, one rank"),
        };
        products.insert(*name, p);
    }
    let scores = nodes
        .iter()
        .map(|n| {
            let p = &products[&n.kind.hook(n.layer)];
            let s = match (p, n.mask(&p.dims(), &device)) {
                (Activation::Rank3(p), Activation::Rank3(m)) => (p.clone() * m).sum(),
                (Activation::Rank4(p), Activation::Rank4(m)) => (p.clone() * m).sum(),
                _ => unreachable!("mask has the activation's rank"),
            };
            s.into_scalar::<f32>() as f64
        })
        .collect();
    Ok((g.metric, scores))
}

/// Activation patching: for each node, the metric on `clean` with the node's activation
/// taken from `corrupted`, minus the clean metric. One forward pass per node.
pub fn activation_patching(model: &Transformer, clean: &[i64], corrupted: &[i64], metric: &Metric, nodes: &[Node]) -> Result<(f64, Vec<f64>), MetricError> {
    check_lengths(clean, corrupted)?;
    metric.check(clean.len(), model.config.vocab_size)?;
    let filter = hook_filter(nodes);
    let corr = run_with_cache(model, corrupted, &filter).activations;
    let device = model.device();
    // The baseline takes the same (explicit, hooked) path as the patched runs, so that an
    // unchanged activation gives exactly no effect.
    // Each patched pass starts at the patched block from the clean stream entering it (the
    // same values the full pass computes there), so the blocks before it are not recomputed,
    // and unembeds only the positions the metric reads; the baseline is computed the same way.
    let clean_ids = model.ids_tensor(clean);
    let mut capture = Hooks::capture(|p| matches!(p, HookPoint::Block(_, BlockHook::ResidPre)));
    let stream = model.forward_with(Forward::new(clean_ids.clone()).hooks(&mut capture).stop(Stop::FinalStream));
    let base = metric.eval_stream(model, stream, clean).into_scalar::<f32>() as f64;
    let resid_pre = capture.take_cache();
    let effects = nodes
        .iter()
        .map(|node| {
            let point = node.kind.hook(node.layer);
            let source = corr[&point].clone();
            let mask = node.mask(&source.dims(), &device);
            let mut hooks = Hooks::none().with_edit(
                |p| p == point,
                |_, act| match (act, &source, &mask) {
                    (Activation::Rank3(x), Activation::Rank3(s), Activation::Rank3(m)) => Activation::Rank3(x.clone() + (s.clone() - x) * m.clone()),
                    (Activation::Rank4(x), Activation::Rank4(s), Activation::Rank4(m)) => Activation::Rank4(x.clone() + (s.clone() - x) * m.clone()),
                    _ => unreachable!("one hook, one rank"),
                },
            );
            let start = resid_pre[&HookPoint::Block(node.layer, BlockHook::ResidPre)].rank3().expect("resid_pre is rank 3");
            let stream = model.forward_with(Forward::new(clean_ids.clone()).hooks(&mut hooks).start(node.layer, start).stop(Stop::FinalStream));
            metric.eval_stream(model, stream, clean).into_scalar::<f32>() as f64 - base
        })
        .collect();
    Ok((base, effects))
}

/// Attribution patching, and real activation patching of the same nodes when `exact`, with
/// their correlation.
pub fn compare_patching(
    model: &Transformer,
    clean: &[i64],
    corrupted: &[i64],
    metric: &Metric,
    kinds: &[NodeKind],
    exact: bool,
) -> Result<PatchingResult, MetricError> {
    check_lengths(clean, corrupted)?;
    let nodes = nodes(model, clean.len(), kinds);
    let (clean_metric, attribution) = attribution_patching(model, clean, corrupted, metric, &nodes)?;
    let corrupted_metric = metric.value(model, corrupted, &mut Hooks::none());
    let patched = if exact { Some(activation_patching(model, clean, corrupted, metric, &nodes)?.1) } else { None };
    let (correlation, correlation_by_kind) = match &patched {
        None => (None, BTreeMap::new()),
        Some(p) => {
            let by_kind = kinds
                .iter()
                .filter_map(|k| {
                    let (a, b): (Vec<f64>, Vec<f64>) =
                        nodes.iter().zip(attribution.iter().zip(p)).filter(|(n, _)| n.kind == *k).map(|(_, (a, b))| (*a, *b)).unzip();
                    pearson(&a, &b).map(|r| (format!("{k:?}").to_lowercase(), r))
                })
                .collect();
            (pearson(&attribution, p), by_kind)
        }
    };
    Ok(PatchingResult {
        metric: metric.clone(),
        clean_metric,
        corrupted_metric,
        labels: nodes.iter().map(Node::label).collect(),
        nodes,
        attribution,
        patched,
        correlation,
        correlation_by_kind,
    })
}

/// Pearson correlation; `None` with fewer than three points (two are always ±1) or no
/// variance.
pub fn pearson(a: &[f64], b: &[f64]) -> Option<f64> {
    let n = a.len().min(b.len());
    if n < 3 {
        return None;
    }
    let (ma, mb) = (a[..n].iter().sum::<f64>() / n as f64, b[..n].iter().sum::<f64>() / n as f64);
    let (mut sab, mut saa, mut sbb) = (0.0, 0.0, 0.0);
    for i in 0..n {
        let (x, y) = (a[i] - ma, b[i] - mb);
        sab += x * y;
        saa += x * x;
        sbb += y * y;
    }
    (saa > 0.0 && sbb > 0.0).then(|| sab / (saa * sbb).sqrt())
}
