//! Transcoder sets, attribution graphs and feature interventions.

use super::*;

/// A transcoder set in circuit-tracer's layout.
#[pyclass(frozen, module = "burnlens._native")]
pub(crate) struct NativeTranscoders {
    pub(crate) set: burnlens_trace::TranscoderSet,
}

#[pymethods]
impl NativeTranscoders {
    /// Load a folder holding circuit-tracer's `config.yaml` and layer files, or a Hub
    /// repository `org/name[@revision][:folder]`.
    #[staticmethod]
    #[pyo3(signature = (path, backend=None))]
    fn load(py: Python<'_>, path: &str, backend: Option<&str>) -> PyResult<Self> {
        let spec = path.to_string();
        let backend = backend.map(str::to_string);
        Ok(py.detach(move || -> Result<Self, Fail> {
            let device = device_for(backend.as_deref())?;
            let set = burnlens_trace::TranscoderSet::open(&spec, &device, &mut |_| {}).map_err(|e| {
                let missing = match &e {
                    burnlens_trace::TraceError::Hub(h) => h.missing(),
                    burnlens_trace::TraceError::File { .. } => !std::path::Path::new(&spec).exists(),
                    _ => false,
                };
                load_fail(e.to_string(), missing)
            })?;
            Ok(Self { set })
        })?)
    }

    /// `(n_layers, d_transcoder, feature_input_hook, feature_output_hook, scan, has_skip)`.
    fn describe(&self) -> (usize, usize, &'static str, &'static str, Option<String>, bool) {
        let s = &self.set;
        (s.n_layers(), s.layers[0].n_features(), s.input.name(), s.output.name(), s.scan.clone(), s.has_skip())
    }
}

/// An attribution graph (see `burnlens_trace::Graph`).
#[pyclass(frozen, module = "burnlens._native")]
pub(crate) struct NativeGraph {
    pub(crate) graph: burnlens_trace::Graph,
}

#[pymethods]
impl NativeGraph {
    /// `(input_tokens, active_features [n, 3], activation_values, selected_features,
    /// logit_token_ids, logit_probabilities, n_layers)`.
    #[allow(clippy::type_complexity)]
    fn parts<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<(Vec<i64>, Bound<'py, PyArrayDyn<i64>>, Bound<'py, PyArrayDyn<f32>>, Vec<i64>, Vec<i64>, Vec<f32>, usize)> {
        let g = &self.graph;
        let feats: Vec<i64> = g.active_features.iter().flatten().copied().collect();
        let feats = feats.into_pyarray(py).reshape(vec![g.active_features.len(), 3])?;
        Ok((
            g.input_tokens.clone(),
            feats,
            array(py, g.activation_values.clone(), &[g.activation_values.len()])?,
            g.selected_features.clone(),
            g.logit_token_ids.clone(),
            g.logit_probabilities.clone(),
            g.n_layers,
        ))
    }

    /// The stored rows of the adjacency (feature rows, then logit rows) `[k, n_nodes]`.
    fn rows<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
        let n = self.graph.n_nodes();
        array(py, self.graph.rows.to_vec(), &[self.graph.rows.len() / n.max(1), n])
    }

    /// The square adjacency `[n_nodes, n_nodes]`.
    fn dense_adjacency<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
        let n = self.graph.n_nodes();
        let bytes = (n as u64) * (n as u64) * 4;
        if bytes > burnlens_trace::output::DENSE_LIMIT {
            return Err(PyValueError::new_err(format!(
                "the square adjacency of {n} nodes takes {:.1} GB; use graph.rows (its nonzero rows)",
                bytes as f64 / 1e9
            )));
        }
        array(py, self.graph.dense_adjacency(), &[n, n])
    }

    /// `(node_mask, edge_mask [k, n_nodes] over the stored rows, cumulative_scores)`.
    fn prune<'py>(&self, py: Python<'py>, node_threshold: f32, edge_threshold: f32) -> PyResult<(Vec<bool>, Bound<'py, PyArrayDyn<bool>>, Vec<f32>)> {
        let p = py.detach(|| self.graph.prune(node_threshold, edge_threshold)).map_err(value)?;
        let n = self.graph.n_nodes();
        let k = p.edge_mask.len() / n.max(1);
        Ok((p.node_mask, p.edge_mask.into_pyarray(py).reshape(vec![k, n])?, p.cumulative_scores))
    }

    /// `(replacement_score, completeness_score)`.
    fn scores(&self, py: Python<'_>) -> PyResult<(f32, f32)> {
        Ok(py.detach(|| self.graph.scores()).map_err(value)?)
    }

    /// Write graph.safetensors, graph.json and graph.html into `dir`; returns their paths.
    #[pyo3(signature = (dir, slug, prompt, prompt_tokens, logit_tokens, node_threshold, edge_threshold))]
    #[allow(clippy::too_many_arguments)]
    fn save(
        &self,
        py: Python<'_>,
        dir: &str,
        slug: String,
        prompt: String,
        prompt_tokens: Vec<String>,
        logit_tokens: Vec<String>,
        node_threshold: f32,
        edge_threshold: f32,
    ) -> PyResult<Vec<String>> {
        let text = burnlens_trace::GraphText { slug, prompt, prompt_tokens, logit_tokens };
        let files = py.detach(|| burnlens_trace::write_graph(Path::new(dir), &self.graph, &text, node_threshold, edge_threshold)).map_err(value)?;
        Ok([files.safetensors, files.json, files.html].iter().map(|p| p.display().to_string()).collect())
    }
}

/// circuit-tracer's `attribute` on token ids `tokens` (attributed as given).
#[pyfunction]
#[pyo3(signature = (model, transcoders, tokens, max_n_logits=10, desired_logit_prob=0.95, targets=None, batch_size=512, max_feature_nodes=None, update_interval=4, zero_positions=1, pattern_memory_gb=4.0, rows_memory_gb=8.0))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn attribute(
    py: Python<'_>,
    model: &NativeModel,
    transcoders: &NativeTranscoders,
    tokens: Vec<i64>,
    max_n_logits: usize,
    desired_logit_prob: f32,
    targets: Option<Vec<i64>>,
    batch_size: usize,
    max_feature_nodes: Option<usize>,
    update_interval: usize,
    zero_positions: usize,
    pattern_memory_gb: f64,
    rows_memory_gb: f64,
) -> PyResult<NativeGraph> {
    use burnlens_trace::{AttributeOptions, LogitTargets};
    let targets = match targets {
        Some(t) => LogitTargets::Tokens(t),
        None => LogitTargets::Salient { max_n_logits, desired_prob: desired_logit_prob },
    };
    let (pattern_budget, row_budget) = ((pattern_memory_gb.max(0.0) * 1e9) as u64, (rows_memory_gb.max(0.0) * 1e9) as u64);
    let opts = AttributeOptions { targets, batch_size, max_feature_nodes, update_interval, zero_positions, pattern_budget, row_budget };
    let graph = py.detach(|| burnlens_trace::attribute(&model.any.model, &transcoders.set, &tokens, &opts)).map_err(value)?;
    Ok(NativeGraph { graph })
}

/// circuit-tracer's `feature_intervention`: `(logits [pos, vocab], activations [layer, pos,
/// features])` with each `(layer, pos, feature, value)` set.
#[pyfunction]
#[pyo3(signature = (model, transcoders, tokens, interventions, freeze_attention=true, zero_positions=1))]
#[allow(clippy::type_complexity)]
pub(crate) fn feature_intervention<'py>(
    py: Python<'py>,
    model: &NativeModel,
    transcoders: &NativeTranscoders,
    tokens: Vec<i64>,
    interventions: Vec<(usize, usize, usize, f32)>,
    freeze_attention: bool,
    zero_positions: usize,
) -> PyResult<(Bound<'py, PyArrayDyn<f32>>, Bound<'py, PyArrayDyn<f32>>)> {
    let ivs: Vec<burnlens_trace::Intervention> =
        interventions.iter().map(|&(layer, pos, feature, value)| burnlens_trace::Intervention { layer, pos, feature, value }).collect();
    let out = py
        .detach(|| burnlens_trace::feature_intervention(&model.any.model, &transcoders.set, &tokens, &ivs, freeze_attention, zero_positions))
        .map_err(value)?;
    let (p, l) = (tokens.len(), out.activations.len());
    let vocab = out.logits.len() / p.max(1);
    let f = out.activations.first().map_or(0, |a| a.len() / p.max(1));
    Ok((array(py, out.logits, &[p, vocab])?, array(py, out.activations.concat(), &[l, p, f])?))
}
