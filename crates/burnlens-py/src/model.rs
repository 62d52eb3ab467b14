//! The model class: loading, forward passes with hooks and caches, generation, the lens tools.

use super::*;

/// A model loaded from a directory, a run or a Hub id.
#[pyclass(frozen, module = "burnlens._native")]
pub(crate) struct NativeModel {
    /// The model, its tokenizer, BOS, family and directory.
    pub(crate) any: burnlens_train::AnyModel,
    pub(crate) names: Vec<String>,
}

impl NativeModel {
    fn device(&self) -> Device {
        self.any.model.device()
    }

    fn ids(&self, tokens: &[i64], batch: usize, pos: usize) -> Result<Tensor<2, Int>, Fail> {
        if batch == 0 || pos == 0 {
            return Err(Fail::Value("tokens: expected a non-empty [batch, pos] array".into()));
        }
        for row in tokens.chunks(pos) {
            self.any.model.check_ids(row).map_err(value)?;
        }
        Ok(Tensor::from_data(TensorData::new(tokens.to_vec(), [batch, pos]), &self.device()))
    }

    fn check_names(&self, names: &[String]) -> Result<(), Fail> {
        burnlens_lens::names::check_names(names, &self.names).map_err(Fail::Key)
    }
}

/// `tokens` as a flat `i64` slice with its `[batch, pos]` shape.
/// A next-token loss needs a next token.
fn check_loss_length(loss: bool, pos: usize) -> Result<(), Fail> {
    match loss && pos < 2 {
        true => Err(Fail::Value(format!("return_type \"loss\" needs at least two tokens per sequence, found {pos}"))),
        false => Ok(()),
    }
}

/// The mean next-token loss over the real tokens, on the host.
fn next_token_loss_value(logits: Tensor<3>, ids: Tensor<2, Int>, real: Option<&[Vec<bool>]>) -> f64 {
    burnlens_model::next_token_loss_of_real(logits, ids, real).into_scalar::<f32>() as f64
}

fn tokens_of(tokens: &PyReadonlyArray2<'_, i64>) -> Result<(Vec<i64>, usize, usize), Fail> {
    let shape = tokens.shape();
    let flat: Vec<i64> = tokens.as_array().iter().copied().collect();
    Ok((flat, shape[0], shape[1]))
}

/// The device of `backend` (else `BURNLENS_BACKEND`, else flex).
pub(crate) fn device_for(backend: Option<&str>) -> Result<Device, Fail> {
    let name = burnlens_model::backend::resolve_name(&[backend]);
    burnlens_model::backend::device(&name, None).map_err(value)
}

/// Resolve a model spec (directory, run directory, or Hub id) to a local directory.
fn resolve(spec: &str) -> Result<PathBuf, Fail> {
    burnlens_hf::resolve_model(spec, &mut |_| {}).map_err(|e| load_fail(format!("{spec}: {e}"), e.missing()))
}

#[pymethods]
impl NativeModel {
    /// Load `spec` (a `save_pretrained` directory, a burnlens run directory, or a Hub id
    /// `org/name[@revision]`) on `backend` (`flex` by default), the weight matrices in
    /// `dtype` (`auto`: as stored; `f32`, `bf16`, `f16`). `compute_dtype` (`f32`, `bf16`, `tf32`), when
    /// given, sets the arithmetic of every later product in this process (see
    /// [`crate::set_compute_dtype`]).
    #[staticmethod]
    #[pyo3(signature = (spec, backend=None, dtype=None, compute_dtype=None))]
    fn load(py: Python<'_>, spec: &str, backend: Option<&str>, dtype: Option<&str>, compute_dtype: Option<&str>) -> PyResult<Self> {
        if let Some(c) = compute_dtype {
            crate::set_compute_dtype(c)?;
        }
        let spec = spec.to_string();
        let backend = backend.map(str::to_string);
        let options = burnlens_hf::LoadOptions::dtype(dtype.unwrap_or("auto").parse().map_err(PyValueError::new_err)?);
        Ok(py.detach(move || -> Result<Self, Fail> {
            let device = device_for(backend.as_deref())?;
            let dir = resolve(&spec)?;
            let any = burnlens_train::load_any(&dir, &device, &options).map_err(|e| load_fail(e.to_string(), e.missing()))?;
            let names = hook_names(&any.model.config);
            Ok(Self { any, names })
        })?)
    }

    /// The architecture under TransformerLens's names, with the family, the weights' dtype
    /// and burnlens's own configuration (`raw`).
    fn config(&self, py: Python<'_>) -> PyResult<NativeConfig> {
        NativeConfig::of(py, self)
    }

    #[getter]
    fn directory(&self) -> String {
        self.any.dir.display().to_string()
    }

    /// The checkpoint's `bos_token_id`, if any.
    #[getter]
    fn bos_token_id(&self) -> Option<i64> {
        self.any.bos
    }

    #[getter]
    fn has_tokenizer(&self) -> bool {
        self.any.tokenizer.is_some()
    }

    /// Every hook point, in the order a forward pass visits them.
    fn hook_names(&self) -> Vec<String> {
        self.names.clone()
    }

    /// `texts` as `[batch, pos]` token ids, each after the BOS if `prepend_bos`, right-padded
    /// to the longest, with the `[batch, pos]` mask of real tokens when any row is padded
    /// (`burnlens_train::AnyModel::encode_batch`, the CLI's encoder).
    #[allow(clippy::type_complexity)]
    fn encode_batch<'py>(
        &self,
        py: Python<'py>,
        texts: Vec<String>,
        prepend_bos: bool,
    ) -> PyResult<(Bound<'py, PyArray2<i64>>, Option<Bound<'py, PyArray2<bool>>>)> {
        let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
        let e = self.any.encode_batch(&texts, prepend_bos).map_err(|e| match e {
            burnlens_train::TokenError::NoTokenizer { .. } => Fail::Value(format!("{e}; pass token ids")),
            e => Fail::Value(e.to_string()),
        })?;
        let shape = [e.batch, e.seq];
        let ids = numpy::ndarray::Array2::from_shape_vec(shape, e.ids).expect("batch x seq ids").into_pyarray(py);
        let mask = e.mask.map(|m| numpy::ndarray::Array2::from_shape_vec(shape, m).expect("batch x seq mask").into_pyarray(py));
        Ok((ids, mask))
    }

    /// The text of `ids`.
    fn decode(&self, ids: Vec<i64>) -> PyResult<String> {
        let tok = self
            .any
            .tokenizer
            .as_ref()
            .ok_or_else(|| Fail::Value(format!("{}: the model has no tokenizer; cannot turn ids into text", self.any.dir.display())))?;
        let ids: Vec<u32> =
            ids.into_iter().map(|i| u32::try_from(i).map_err(|_| Fail::Value(format!("token id {i} is negative")))).collect::<Result<_, _>>()?;
        Ok(tok.decode(&ids))
    }

    /// Run `tokens` `[batch, pos]` (with `attention_mask` `[batch, pos]`, true for real
    /// tokens, when padded). Captures the hook points in `capture`; at each `(name, fn)` of
    /// `hooks` calls `fn(activation, name)` and uses what it returns (an array of the same
    /// shape) unless it returns `None`. Returns the logits `[batch, pos, vocab]` and the
    /// captured activations by name, and with `loss` the mean next-token cross-entropy over
    /// the real tokens (`burnlens_model::next_token_loss_of_real`).
    #[pyo3(signature = (tokens, attention_mask=None, capture=Vec::new(), hooks=Vec::new(), loss=false))]
    #[allow(clippy::type_complexity)]
    fn run<'py>(
        &self,
        py: Python<'py>,
        tokens: PyReadonlyArray2<'py, i64>,
        attention_mask: Option<PyReadonlyArray2<'py, bool>>,
        capture: Vec<String>,
        hooks: Vec<(String, Py<PyAny>)>,
        loss: bool,
    ) -> PyResult<(Bound<'py, PyArrayDyn<f32>>, Bound<'py, PyDict>, Option<f64>)> {
        let (flat, b, t) = tokens_of(&tokens)?;
        check_loss_length(loss, t)?;
        let mask: Option<Vec<Vec<bool>>> = match &attention_mask {
            None => None,
            Some(m) => {
                if m.shape() != [b, t] {
                    return Err(Fail::Value(format!("attention_mask: expected shape [{b}, {t}] like tokens, found {:?}", m.shape())).into());
                }
                Some(m.as_array().rows().into_iter().map(|r| r.to_vec()).collect())
            }
        };
        self.check_names(&capture)?;
        let hook_names: Vec<String> = hooks.iter().map(|(n, _)| n.clone()).collect();
        self.check_names(&hook_names)?;
        let ids = self.ids(&flat, b, t)?;
        let hook_error: Mutex<Option<PyErr>> = Mutex::new(None);
        let (logits, cache, loss) = py.detach(|| {
            let capture_set = points(&capture);
            let mut h = Hooks::capture(move |p| capture_set.contains(&p));
            for (name, f) in &hooks {
                let point = points(std::slice::from_ref(name))[0];
                let hook_error = &hook_error;
                h = h.with_edit(
                    move |p| p == point,
                    move |p, act| {
                        Python::attach(|py| match call_hook(py, f, &p.name(), &act) {
                            Ok(Some(new)) => new,
                            Ok(None) => act,
                            Err(e) => {
                                hook_error.lock().unwrap().get_or_insert(e);
                                act
                            }
                        })
                    },
                );
            }
            let logits = match &mask {
                None => self.any.model.forward_hooked(ids.clone(), &mut h),
                Some(m) => self.any.model.forward_with(Forward::new(ids.clone()).hooks(&mut h).padding(m)),
            };
            let cache: BTreeMap<String, (Vec<f32>, Vec<usize>)> = h.take_cache().into_iter().map(|(k, v)| (k.name(), activation_into_host(v))).collect();
            drop(h);
            let loss = loss.then(|| next_token_loss_value(logits.clone(), ids, mask.as_deref()));
            (host(logits), cache, loss)
        });
        if let Some(e) = hook_error.into_inner().unwrap() {
            return Err(e);
        }
        let out = PyDict::new(py);
        for (k, (v, d)) in cache {
            out.set_item(k, array(py, v, &d)?)?;
        }
        Ok((array(py, logits.0, &logits.1)?, out, loss))
    }

    /// Logits `[batch, pos, vocab]` of `tokens` with SAEs spliced in at their hook points
    /// (each SAE's reconstruction replaces the activation it reads).
    #[pyo3(signature = (tokens, saes, loss=false))]
    fn run_with_saes<'py>(
        &self,
        py: Python<'py>,
        tokens: PyReadonlyArray2<'py, i64>,
        saes: Vec<PyRef<'py, NativeSae>>,
        loss: bool,
    ) -> PyResult<(Bound<'py, PyArrayDyn<f32>>, Option<f64>)> {
        let (flat, b, t) = tokens_of(&tokens)?;
        check_loss_length(loss, t)?;
        for s in &saes {
            s.sae.check_model(&self.any.model).map_err(value)?;
        }
        let ids = self.ids(&flat, b, t)?;
        let saes: Vec<&Sae> = saes.iter().map(|s| &s.sae).collect();
        let (logits, loss) = py.detach(|| {
            let mut h = Hooks::none();
            for s in &saes {
                h = burnlens_lens::sae::splice(h, s);
            }
            let logits = self.any.model.forward_hooked(ids.clone(), &mut h);
            let loss = loss.then(|| next_token_loss_value(logits.clone(), ids, None));
            (host(logits), loss)
        });
        Ok((array(py, logits.0, &logits.1)?, loss))
    }

    /// The final norm recomputed on `x` `[..., d_model]` (the model's own `ln_final`).
    fn apply_ln_final<'py>(&self, py: Python<'py>, x: PyReadonlyArrayDyn<'py, f32>) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
        let dims = x.shape().to_vec();
        let values: Vec<f32> = x.as_array().iter().copied().collect();
        let out = py.detach(|| self.final_norm(values, &dims))?;
        array(py, out, &dims)
    }

    /// The weights with TransformerLens's names and shapes: `W_E [vocab, d]`, `W_pos`,
    /// `W_U [d, vocab]`, `b_U`, and per layer stacked `W_Q, W_K, W_V [L, H, d, d_head]`,
    /// `W_O [L, H, d_head, d]`, `b_Q, b_K, b_V [L, H, d_head]`, `b_O [L, d]`,
    /// `W_in, W_gate [L, d, d_mlp]`, `W_out [L, d_mlp, d]`, `b_in [L, d_mlp]`, `b_out [L, d]`.
    fn weights<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let out = py.detach(|| burnlens_lens::circuits::transformer_lens_weights(&self.any.model));
        let dict = PyDict::new(py);
        for (k, (v, d)) in out {
            dict.set_item(k, array(py, v, &d)?)?;
        }
        Ok(dict)
    }

    /// Continue `prompt` by up to `max_new_tokens` tokens (greedy at temperature 0); the new
    /// tokens only.
    #[pyo3(signature = (prompt, max_new_tokens=32, temperature=0.0, top_k=None, top_p=None, seed=0, stop_token=None))]
    #[allow(clippy::too_many_arguments)]
    fn generate(
        &self,
        py: Python<'_>,
        prompt: Vec<i64>,
        max_new_tokens: usize,
        temperature: f64,
        top_k: Option<usize>,
        top_p: Option<f64>,
        seed: u64,
        stop_token: Option<i64>,
    ) -> PyResult<Vec<i64>> {
        let s = Sampling { max_new_tokens, temperature, top_k, top_p, seed, stop_token, use_cache: true };
        Ok(py.detach(|| generate(&self.any.model, &prompt, &s)).map_err(value)?)
    }

    /// The metric's value on `tokens` (one sequence) and its gradient at each hook point of
    /// `names`. `metric`: `loss[:FROM]`, `logprob:TOKEN[@POS]`, `logit-diff:RIGHT,WRONG[@POS]`.
    fn hook_gradients<'py>(
        &self,
        py: Python<'py>,
        tokens: Vec<i64>,
        names: Vec<String>,
        metric: &str,
    ) -> PyResult<(f64, Bound<'py, PyDict>, Bound<'py, PyDict>)> {
        self.check_names(&names)?;
        let metric = self.metric(metric)?;
        self.any.model.check_ids(&tokens).map_err(value)?;
        let (value_, grads, acts) = py
            .detach(|| {
                let wanted = points(&names);
                let g = burnlens_lens::hook_gradients(&self.any.model, &tokens, &|p| wanted.contains(&p), &metric)?;
                let grads: BTreeMap<String, (Vec<f32>, Vec<usize>)> = g.gradients.iter().map(|(k, v)| (k.name(), activation_host(v))).collect();
                let acts: BTreeMap<String, (Vec<f32>, Vec<usize>)> = g.activations.iter().map(|(k, v)| (k.name(), activation_host(v))).collect();
                Ok::<_, burnlens_lens::MetricError>((g.metric, grads, acts))
            })
            .map_err(value)?;
        let (g, a) = (PyDict::new(py), PyDict::new(py));
        for (k, (v, d)) in grads {
            g.set_item(k, array(py, v, &d)?)?;
        }
        for (k, (v, d)) in acts {
            a.set_item(k, array(py, v, &d)?)?;
        }
        Ok((value_, g, a))
    }

    /// The metric on `tokens` (one sequence).
    fn metric_value(&self, py: Python<'_>, tokens: Vec<i64>, metric: &str) -> PyResult<f64> {
        let metric = self.metric(metric)?;
        self.any.model.check_ids(&tokens).map_err(value)?;
        metric.check(tokens.len(), self.any.model.config.vocab_size).map_err(value)?;
        Ok(py.detach(|| metric.value(&self.any.model, &tokens, &mut Hooks::none())))
    }

    /// The model with its weights processed as TransformerLens's `from_pretrained` does
    /// (steps the architecture does not allow are dropped and named in the second value).
    fn processed(&self, py: Python<'_>) -> PyResult<(Self, Vec<String>)> {
        let (opts, dropped) = burnlens_lens::ProcessOptions::all().allowed_for(&self.any.model.config);
        let model = py.detach(|| burnlens_lens::process_weights(&self.any.model, opts)).map_err(value)?;
        let names = hook_names(&model.config);
        Ok((Self { any: burnlens_train::AnyModel { model, ..self.any.clone() }, names }, dropped))
    }
}

impl NativeModel {
    /// The final norm recomputed on `values` of shape `[..., d_model]`.
    pub(crate) fn final_norm(&self, values: Vec<f32>, dims: &[usize]) -> Result<Vec<f32>, Fail> {
        let d = self.any.model.config.d_model;
        if dims.last() != Some(&d) {
            return Err(Fail::Value(format!("apply_ln_final: expected [..., {d}], found {dims:?}")));
        }
        let rows = values.len() / d;
        let x = Tensor::<3>::from_data(TensorData::new(values, [1, rows, d]), &self.device());
        Ok(host(self.any.model.ln_final.forward(x, &mut Hooks::none(), NormSite::Final)).0)
    }

    pub(crate) fn metric(&self, spec: &str) -> Result<Metric, Fail> {
        Metric::parse(spec, |t: &str| self.any.single_token(t).map_err(|e| e.to_string())).map_err(|e| match e {
            burnlens_lens::MetricParseError::Syntax(why) => Fail::Value(format!("metric \"{spec}\": {why}; expected {}", Metric::GRAMMAR)),
            burnlens_lens::MetricParseError::Token(why) => Fail::Value(format!("metric \"{spec}\": {why}")),
        })
    }
}

/// Call a Python hook `f(activation, name)`; its result replaces the activation unless it is
/// `None`.
/// The hook points of names already checked against the model (`check_names`).
fn points(names: &[String]) -> Vec<HookPoint> {
    names.iter().map(|n| HookPoint::parse(n).unwrap_or_else(|| panic!("`{n}` was checked as a hook name"))).collect()
}

fn call_hook(py: Python<'_>, f: &Py<PyAny>, name: &str, act: &Activation) -> PyResult<Option<Activation>> {
    let (v, dims) = activation_host(act);
    let arr = array(py, v, &dims)?;
    let out = f.call1(py, (arr, name))?;
    if out.is_none(py) {
        return Ok(None);
    }
    let out = out.bind(py);
    let arr: PyReadonlyArrayDyn<f32> = out.extract().map_err(|_| {
        PyValueError::new_err(format!(
            "hook at {name}: expected a float32 numpy array (or None), got {}",
            out.get_type().name().map(|n| n.to_string()).unwrap_or_default()
        ))
    })?;
    if arr.shape() != dims.as_slice() {
        return Err(PyValueError::new_err(format!(
            "hook at {name}: returned shape {:?}, expected {:?} (a hook must keep the activation's shape)",
            arr.shape(),
            dims
        )));
    }
    let values: Vec<f32> = arr.as_array().iter().copied().collect();
    let device = match act {
        Activation::Rank3(t) => t.device(),
        Activation::Rank4(t) => t.device(),
    };
    Ok(Some(match act {
        Activation::Rank3(_) => Activation::Rank3(Tensor::from_data(TensorData::new(values, [dims[0], dims[1], dims[2]]), &device)),
        Activation::Rank4(_) => Activation::Rank4(Tensor::from_data(TensorData::new(values, [dims[0], dims[1], dims[2], dims[3]]), &device)),
    }))
}
