//! The lens tools on a model: patching grids, the logit lens, direct logit attribution and
//! TransformerLens's residual-stream stacks, returned as dicts of numpy arrays built here.

use super::*;

/// `values` (float64) of shape `dims` as a numpy array.
fn array64<'py>(py: Python<'py>, values: Vec<f64>, dims: &[usize]) -> PyResult<Bound<'py, PyArrayDyn<f64>>> {
    values.into_pyarray(py).reshape(dims.to_vec())
}

/// A layer argument as TransformerLens takes it: `None` (after the last layer), a layer, or
/// counted from the end (`-1` is after the last layer).
fn layer_index(layer: Option<i64>, n_layers: usize) -> Result<usize, Fail> {
    let n = n_layers as i64;
    match layer {
        None => Ok(n_layers),
        Some(l) if (0..=n).contains(&l) => Ok(l as usize),
        Some(l) if (-n - 1..0).contains(&l) => Ok((n + 1 + l) as usize),
        Some(l) => Err(Fail::Value(format!("layer {l}: expected 0..={n} or -{}..=-1 for a model of {n} layers", n + 1))),
    }
}

/// Activation patching (`attribution=False`) or attribution patching of every node of
/// `kinds` (`head`, `resid_pre`, `mlp`, or their aliases) from `corrupted` into `clean`:
/// `clean_metric` and per kind the metric's change, `head` `[layers, heads]`, `resid_pre`
/// `[layers, pos]`, `mlp` `[layers]`.
#[pyfunction]
#[pyo3(signature = (model, clean, corrupted, metric, kinds, attribution=false))]
pub(crate) fn patching<'py>(
    py: Python<'py>,
    model: &NativeModel,
    clean: Vec<i64>,
    corrupted: Vec<i64>,
    metric: &str,
    kinds: Vec<String>,
    attribution: bool,
) -> PyResult<Bound<'py, PyDict>> {
    use burnlens_lens::NodeKind;
    let metric = model.metric(metric)?;
    let m = &model.any.model;
    m.check_ids(&clean).map_err(value)?;
    m.check_ids(&corrupted).map_err(value)?;
    let kinds: Vec<NodeKind> = kinds.iter().map(|k| NodeKind::from_name(k).map_err(Fail::Value)).collect::<Result<_, _>>()?;
    let nodes = burnlens_lens::patching::nodes(m, clean.len(), &kinds);
    let (base, effects) = py
        .detach(|| {
            if attribution {
                burnlens_lens::attribution_patching(m, &clean, &corrupted, &metric, &nodes)
            } else {
                burnlens_lens::activation_patching(m, &clean, &corrupted, &metric, &nodes)
            }
        })
        .map_err(value)?;
    let out = PyDict::new(py);
    out.set_item("clean_metric", base)?;
    let layers = m.config.n_layers();
    for kind in kinds {
        let width = kind.width(m.config.n_heads, clean.len());
        let grid = burnlens_lens::patching::grid(&nodes, &effects, kind, layers, width);
        let dims = if kind == NodeKind::Mlp { vec![layers] } else { vec![layers, width] };
        out.set_item(kind.name(), array64(py, grid.concat(), &dims)?)?;
    }
    Ok(out)
}

/// The logit lens on one sequence: `layers`, `top` `[layer][pos][k]` of `(token,
/// probability)`, `targets`, and the target's `target_logprob` and `target_rank`
/// `[layer][pos]`.
#[pyfunction]
#[pyo3(signature = (model, tokens, k=5, target=None))]
pub(crate) fn logit_lens<'py>(py: Python<'py>, model: &NativeModel, tokens: Vec<i64>, k: usize, target: Option<i64>) -> PyResult<Bound<'py, PyDict>> {
    model.any.model.check_ids(&tokens).map_err(value)?;
    let lens = py.detach(|| burnlens_lens::logit_lens(&model.any.model, &tokens, k, target));
    let out = PyDict::new(py);
    out.set_item("layers", lens.layers)?;
    out.set_item("top", lens.top)?;
    out.set_item("targets", lens.targets)?;
    out.set_item("target_logprob", lens.target_logprob)?;
    out.set_item("target_rank", lens.target_rank)?;
    Ok(out)
}

/// Direct logit attribution of `logit[right]` (minus `logit[wrong]`) at every position:
/// `labels`, `contributions` `[component, pos]`, `bias` `[pos]`, `logits` `[pos]`,
/// `max_error`, `final_softcap`, `right`, `wrong`.
#[pyfunction]
#[pyo3(signature = (model, tokens, right, wrong=None))]
pub(crate) fn logit_attribution<'py>(py: Python<'py>, model: &NativeModel, tokens: Vec<i64>, right: i64, wrong: Option<i64>) -> PyResult<Bound<'py, PyDict>> {
    let m = &model.any.model;
    m.check_ids(&tokens).map_err(value)?;
    let targets: Vec<i64> = std::iter::once(right).chain(wrong).collect();
    model.any.check_vocabulary(&targets).map_err(value)?;
    let dla = py.detach(|| burnlens_lens::direct_logit_attribution(m, &tokens, right, wrong));
    let (n, t) = (dla.contributions.len(), tokens.len());
    let out = PyDict::new(py);
    out.set_item("right", dla.right)?;
    out.set_item("wrong", dla.wrong)?;
    out.set_item("labels", dla.labels)?;
    out.set_item("contributions", array64(py, dla.contributions.concat(), &[n, t])?)?;
    out.set_item("bias", array64(py, dla.bias, &[t])?)?;
    out.set_item("logits", array64(py, dla.logits, &[t])?)?;
    out.set_item("max_error", dla.max_error)?;
    out.set_item("final_softcap", dla.final_softcap)?;
    Ok(out)
}

/// TransformerLens's residual decompositions of each sequence of `tokens` `[batch, pos]`:
/// `kind` is `decompose` (embeddings, each attention and MLP output), `heads` (each head's
/// result) or `components` (embeddings, heads, biases, MLPs), of the layers before `layer`.
/// Returns labels and `[n, batch, pos, d_model]`.
#[pyfunction]
#[pyo3(signature = (model, tokens, kind, layer=None))]
pub(crate) fn residual<'py>(
    py: Python<'py>,
    model: &NativeModel,
    tokens: PyReadonlyArray2<'py, i64>,
    kind: &str,
    layer: Option<i64>,
) -> PyResult<(Vec<String>, Bound<'py, PyArrayDyn<f32>>)> {
    let m = &model.any.model;
    let layer = layer_index(layer, m.config.n_layers())?;
    let rows: Vec<Vec<i64>> = tokens.as_array().rows().into_iter().map(|r| r.to_vec()).collect();
    for row in &rows {
        m.check_ids(row).map_err(value)?;
    }
    let one = |ids: &[i64]| match kind {
        "decompose" => Ok(burnlens_lens::decompose_resid(m, ids, Some(layer))),
        "heads" => Ok(burnlens_lens::stack_head_results(m, ids, Some(layer))),
        "components" => Ok(burnlens_lens::residual_components(m, ids).0),
        other => Err(Fail::Value(format!("residual kind \"{other}\": expected decompose, heads or components"))),
    };
    let (labels, stack) = py.detach(|| -> Result<_, Fail> {
        let parts = rows.iter().map(|r| one(r)).collect::<Result<Vec<_>, _>>()?;
        let labels = parts.first().map(|c| c.labels.clone()).unwrap_or_default();
        // [n, pos, d] per sequence → [n, batch, pos, d].
        let stacks: Vec<Tensor<4>> = parts.into_iter().map(|c| c.stack.unsqueeze_dim(1)).collect();
        Ok((labels, host(Tensor::cat(stacks, 1))))
    })?;
    Ok((labels, array(py, stack.0, &stack.1)?))
}

/// TransformerLens's `accumulated_resid` from a cache's arrays `acts` (by hook name): the
/// residual stream entering each layer up to `layer` (and after the last), with `incl_mid`
/// the streams between attention and MLP, with `apply_ln` through the final norm
/// recomputed. Returns labels and `[n, batch, pos, d_model]`.
#[pyfunction]
#[pyo3(signature = (model, acts, layer=None, incl_mid=false, apply_ln=false))]
pub(crate) fn accumulated_resid<'py>(
    py: Python<'py>,
    model: &NativeModel,
    acts: &Bound<'py, PyDict>,
    layer: Option<i64>,
    incl_mid: bool,
    apply_ln: bool,
) -> PyResult<(Vec<String>, Bound<'py, PyArrayDyn<f32>>)> {
    let n = model.any.model.config.n_layers();
    let points = burnlens_lens::accumulated_points(n, layer_index(layer, n)?, incl_mid);
    let (mut labels, mut values, mut dims) = (Vec::new(), Vec::new(), Vec::new());
    for (label, point) in points {
        let name = point.name();
        let a = acts.get_item(&name)?.ok_or_else(|| Fail::Key(format!("\"{name}\" is not in this cache (filtered out by names_filter)")))?;
        let a: PyReadonlyArrayDyn<f32> = a.extract()?;
        if !dims.is_empty() && dims[1..] != *a.shape() {
            return Err(Fail::Value(format!("{name}: shape {:?}, expected {:?}", a.shape(), &dims[1..])).into());
        }
        if dims.is_empty() {
            dims = std::iter::once(0).chain(a.shape().iter().copied()).collect();
        }
        values.extend(a.as_array().iter().copied());
        labels.push(label);
        dims[0] += 1;
    }
    if apply_ln {
        values = py.detach(|| model.final_norm(values, &dims))?;
    }
    Ok((labels, array(py, values, &dims)?))
}
