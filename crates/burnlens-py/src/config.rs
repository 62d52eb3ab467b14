//! `model.cfg`: the architecture under TransformerLens's names
//! ([`burnlens_lens::TlConfig`]), the family, the weights' dtype and burnlens's own
//! configuration (`raw`).

use super::*;

/// A loaded model's configuration; every field is read-only.
#[pyclass(frozen, name = "Config", module = "burnlens._native")]
pub(crate) struct NativeConfig {
    values: Py<PyDict>,
}

impl NativeConfig {
    pub(crate) fn of(py: Python<'_>, model: &NativeModel) -> PyResult<Self> {
        let values = to_python(py, &burnlens_lens::TlConfig::of(&model.any.model.config))?.cast_into::<PyDict>()?;
        values.set_item("n_kv_heads", values.get_item("n_key_value_heads")?)?;
        values.set_item("family", model.any.family.map(|f| f.to_string()))?;
        values.set_item("dtype", burnlens_hf::checkpoint::dtype_name(model.any.model.weight_dtype()))?;
        values.set_item("raw", to_python(py, &model.any.model.config)?)?;
        Ok(Self { values: values.unbind() })
    }
}

#[pymethods]
impl NativeConfig {
    fn __getattr__<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
        self.values.bind(py).get_item(name)?.ok_or_else(|| pyo3::exceptions::PyAttributeError::new_err(format!("Config has no field \"{name}\"")))
    }

    fn __dir__(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        self.values.bind(py).keys().extract()
    }

    /// Every field as a dict (a copy).
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.values.bind(py).copy()
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let v = self.values.bind(py);
        let field =
            |k: &str| -> PyResult<String> { Ok(format!("{k}={}", v.get_item(k)?.map_or(Ok("None".to_string()), |x| x.repr().map(|r| r.to_string()))?)) };
        let fields = ["family", "n_layers", "n_heads", "d_model", "d_head", "d_mlp", "d_vocab", "n_key_value_heads", "dtype"];
        Ok(format!("Config({})", fields.iter().map(|k| field(k)).collect::<PyResult<Vec<_>>>()?.join(", ")))
    }
}
