//! Transcoder sets, attribution graphs and feature interventions.

use super::*;

/// A transcoder set in circuit-tracer's layout.
#[pyclass(frozen, name = "Transcoders", module = "burnlens._native")]
pub(crate) struct NativeTranscoders {
    pub(crate) set: burnlens_trace::TranscoderSet,
}

#[pymethods]
impl NativeTranscoders {
    /// Load a folder holding circuit-tracer's `config.yaml` and layer files, or a Hub
    /// repository `org/name[@revision][:folder]`.
    #[staticmethod]
    #[pyo3(signature = (path, backend=None))]
    fn load(py: Python<'_>, path: PathBuf, backend: Option<&str>) -> PyResult<Self> {
        let spec = path.to_string_lossy().into_owned();
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

    #[getter]
    fn n_layers(&self) -> usize {
        self.set.n_layers()
    }

    /// Features per layer.
    #[getter]
    fn d_transcoder(&self) -> usize {
        self.set.layers[0].d_sae()
    }

    /// The hook point the transcoders read (`mlp.hook_in` style name).
    #[getter]
    fn feature_input_hook(&self) -> &'static str {
        self.set.input.name()
    }

    /// The hook point the transcoders write.
    #[getter]
    fn feature_output_hook(&self) -> &'static str {
        self.set.output.name()
    }

    /// The Neuronpedia scan name, if the configuration gives one.
    #[getter]
    fn scan(&self) -> Option<String> {
        self.set.scan.clone()
    }

    /// Whether the transcoders have a skip connection (`W_skip`).
    #[getter]
    fn skip_connection(&self) -> bool {
        self.set.has_skip()
    }

    fn __repr__(&self) -> String {
        let s = &self.set;
        format!(
            "Transcoders(n_layers={}, d_transcoder={}, {} -> {}, skip={})",
            s.n_layers(),
            s.layers[0].d_sae(),
            s.input.name(),
            s.output.name(),
            if s.has_skip() { "True" } else { "False" }
        )
    }
}

/// An attribution graph with circuit-tracer's `Graph` fields as numpy arrays. Node order:
/// the selected features, `n_layers * n_pos` error nodes, the token nodes, the logit nodes;
/// rows are targets, columns sources. Only feature and logit rows can hold edges: `rows`
/// holds them (`[n_features + n_logits, n_nodes]`); `adjacency_matrix` is the square matrix.
#[pyclass(frozen, name = "Graph", module = "burnlens._native")]
pub(crate) struct NativeGraph {
    pub(crate) graph: burnlens_trace::Graph,
    /// The model it explains, for the texts of its tokens.
    pub(crate) model: Py<NativeModel>,
    /// The transcoders and options it was built with, for its attention side.
    pub(crate) transcoders: Py<NativeTranscoders>,
    pub(crate) options: burnlens_trace::AttributeOptions,
    /// Whether `save` adds the attention side (`attribute(..., qk=True)`).
    pub(crate) qk: bool,
}

fn ids<'py>(py: Python<'py>, v: &[i64]) -> Bound<'py, PyArray1<i64>> {
    v.to_vec().into_pyarray(py)
}

#[pymethods]
impl NativeGraph {
    #[getter]
    fn input_tokens<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i64>> {
        ids(py, &self.graph.input_tokens)
    }

    /// `[n_active, 3]`: `(layer, pos, feature)` of every active feature.
    #[getter]
    fn active_features<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArrayDyn<i64>>> {
        let g = &self.graph;
        let flat: Vec<i64> = g.active_features.iter().flatten().copied().collect();
        flat.into_pyarray(py).reshape(vec![g.active_features.len(), 3])
    }

    #[getter]
    fn activation_values<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<f32>> {
        self.graph.activation_values.clone().into_pyarray(py)
    }

    /// Indices into `active_features` of the features that are nodes.
    #[getter]
    fn selected_features<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i64>> {
        ids(py, &self.graph.selected_features)
    }

    #[getter]
    fn logit_token_ids<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i64>> {
        ids(py, &self.graph.logit_token_ids)
    }

    #[getter]
    fn logit_probabilities<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<f32>> {
        self.graph.logit_probabilities.clone().into_pyarray(py)
    }

    #[getter]
    fn n_layers(&self) -> usize {
        self.graph.n_layers
    }

    #[getter]
    fn n_nodes(&self) -> usize {
        self.graph.n_nodes()
    }

    fn __repr__(&self) -> String {
        let g = &self.graph;
        format!(
            "Graph({} tokens, {} active features, {} selected, {} logits)",
            g.input_tokens.len(),
            g.active_features.len(),
            g.selected_features.len(),
            g.logit_token_ids.len()
        )
    }

    /// The stored rows of the adjacency (feature rows, then logit rows) `[k, n_nodes]`.
    #[getter]
    fn rows<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
        let n = self.graph.n_nodes();
        array(py, self.graph.rows.to_vec(), &[self.graph.rows.len() / n.max(1), n])
    }

    /// The square adjacency `[n_nodes, n_nodes]`.
    #[getter]
    fn adjacency_matrix<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
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

    /// circuit-tracer's `prune_graph`: `node_mask [n_nodes]`, `edge_mask` over `rows`
    /// (`[n_features + n_logits, n_nodes]`) and `cumulative_scores [n_nodes]`.
    #[pyo3(signature = (node_threshold=0.8, edge_threshold=0.98))]
    fn prune<'py>(&self, py: Python<'py>, node_threshold: f32, edge_threshold: f32) -> PyResult<Bound<'py, PyDict>> {
        let p = py.detach(|| self.graph.prune(node_threshold, edge_threshold)).map_err(value)?;
        let n = self.graph.n_nodes();
        let k = p.edge_mask.len() / n.max(1);
        let out = PyDict::new(py);
        out.set_item("node_mask", p.node_mask.into_pyarray(py))?;
        out.set_item("edge_mask", p.edge_mask.into_pyarray(py).reshape(vec![k, n])?)?;
        out.set_item("cumulative_scores", p.cumulative_scores.into_pyarray(py))?;
        Ok(out)
    }

    /// `(replacement_score, completeness_score)`.
    fn scores(&self, py: Python<'_>) -> PyResult<(f32, f32)> {
        Ok(py.detach(|| self.graph.scores()).map_err(value)?)
    }

    /// Write graph.safetensors, graph.json (Neuronpedia's schema) and graph.html into the
    /// folder `path` (the graph's `slug` defaults to the folder's name); returns their paths.
    /// A graph made with `qk=True` adds its attention side (`attention`) to both.
    #[pyo3(signature = (path, node_threshold=0.8, edge_threshold=0.98, slug=None))]
    fn save(&self, py: Python<'_>, path: std::path::PathBuf, node_threshold: f32, edge_threshold: f32, slug: Option<String>) -> PyResult<Vec<String>> {
        let any = &self.model.get().any;
        let g = &self.graph;
        let slug = slug.unwrap_or_else(|| path.file_name().map_or("graph".into(), |n| n.to_string_lossy().into_owned()));
        let text = burnlens_trace::GraphText {
            slug,
            prompt: any.text(&g.input_tokens),
            prompt_tokens: any.labels(&g.input_tokens),
            logit_tokens: any.labels(&g.logit_token_ids),
        };
        let files = py
            .detach(|| {
                let attention = |pruned: &burnlens_trace::Pruned| self.attention_of(pruned);
                let attention = self.qk.then_some(&attention as burnlens_trace::AttentionOf);
                burnlens_trace::write_graph_with(&path, g, &text, node_threshold, edge_threshold, &mut |_| {}, attention)
            })
            .map_err(value)?;
        Ok([files.safetensors, files.json, files.html].iter().map(|p| p.display().to_string()).collect())
    }

    /// The attention side of the graph pruned at these thresholds, as `graph --qk` writes it:
    /// `{"loadings": [...], "qk": [...]}`. `loadings`: for each kept edge that crosses
    /// positions (`target`, `source`: node indices), its `weight`, its largest `heads`
    /// (`layer`, `head`, `weight`), the other heads' sum `rest` and the paths through several
    /// heads `multi_hop` (they add up to `weight`); `qk`: those heads' QK attribution rows
    /// (as `qk` returns them) at the edges' target positions.
    #[pyo3(signature = (node_threshold=0.8, edge_threshold=0.98))]
    fn attention<'py>(&self, py: Python<'py>, node_threshold: f32, edge_threshold: f32) -> PyResult<Bound<'py, PyAny>> {
        let found =
            py.detach(|| -> Result<_, burnlens_trace::TraceError> { self.attention_of(&self.graph.prune(node_threshold, edge_threshold)?) }).map_err(value)?;
        crate::to_python(py, &found)
    }
}

impl NativeGraph {
    fn attention_of(&self, pruned: &burnlens_trace::Pruned) -> Result<burnlens_trace::GraphAttention, burnlens_trace::TraceError> {
        let (model, set) = (&self.model.get().any.model, &self.transcoders.get().set);
        let rm = burnlens_trace::Replacement::new(model, set, &self.graph.input_tokens, self.options.zero_positions, self.options.pattern_budget)?;
        burnlens_trace::graph_attention(&rm, &self.graph, pruned, &self.options, &burnlens_trace::AttentionOptions::default())
    }
}

/// circuit-tracer's `attribute` on token ids `tokens` (attributed as given); `options` are
/// [`burnlens_trace::AttributeArgs`] as JSON (Python's keyword arguments), `targets` the next
/// tokens to explain instead of the most probable ones; `qk`: the graph's `save` adds its
/// attention side.
#[pyfunction]
#[pyo3(signature = (model, transcoders, tokens, targets, options, qk=false))]
pub(crate) fn attribute(
    py: Python<'_>,
    model: Py<NativeModel>,
    transcoders: Py<NativeTranscoders>,
    tokens: Vec<i64>,
    targets: Option<Vec<i64>>,
    options: &str,
    qk: bool,
) -> PyResult<NativeGraph> {
    let args: burnlens_trace::AttributeArgs = serde_json::from_str(options).map_err(|e| PyValueError::new_err(format!("attribute options: {e}")))?;
    let opts = args.options(targets);
    let graph = py.detach(|| burnlens_trace::attribute(&model.get().any.model, &transcoders.get().set, &tokens, &opts)).map_err(value)?;
    Ok(NativeGraph { graph, model, transcoders, options: opts, qk })
}

/// QK attributions of one head on token ids `tokens` (used as given); `options` are
/// [`burnlens_trace::QkOptions`] as JSON (`layer`, `head` and Python's keyword arguments).
/// Returns the rows as the `qk` command writes them, as Python lists and dicts.
#[pyfunction]
#[pyo3(signature = (model, transcoders, tokens, options))]
pub(crate) fn qk<'py>(
    py: Python<'py>,
    model: &NativeModel,
    transcoders: Option<&NativeTranscoders>,
    tokens: Vec<i64>,
    options: &str,
) -> PyResult<Bound<'py, PyAny>> {
    let opts: burnlens_trace::QkOptions = serde_json::from_str(options).map_err(|e| PyValueError::new_err(format!("qk options: {e}")))?;
    let head = py.detach(|| burnlens_trace::qk_attributions(&model.any.model, transcoders.map(|t| &t.set), &tokens, &opts)).map_err(value)?;
    crate::to_python(py, &head.rows)
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
