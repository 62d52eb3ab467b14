//! The SAE class.

use super::*;

/// A sparse autoencoder.
#[pyclass(frozen, module = "burnlens._native")]
pub(crate) struct NativeSae {
    pub(crate) sae: Sae,
}

#[pymethods]
impl NativeSae {
    /// Load an SAE from a directory (SAELens's layout or Gemma Scope's `params.npz`) or a
    /// Hub folder `org/name[@rev]:folder`.
    #[staticmethod]
    #[pyo3(signature = (spec, backend=None))]
    fn load(py: Python<'_>, spec: &str, backend: Option<&str>) -> PyResult<Self> {
        let spec = spec.to_string();
        let backend = backend.map(str::to_string);
        Ok(py.detach(move || -> Result<Self, Fail> {
            let device = device_for(backend.as_deref())?;
            let dir = burnlens_hf::resolve_folder(&spec, burnlens_lens::sae::folder_files(&spec), &mut |_| {})
                .map_err(|e| load_fail(format!("{spec}: {e}"), e.missing()))?;
            let sae = Sae::load(&dir, &device).map_err(|e| load_fail(e.to_string(), !Path::new(&dir).exists()))?;
            Ok(Self { sae })
        })?)
    }

    /// The SAE's configuration as JSON (SAELens's `cfg.json` fields).
    fn cfg_json(&self) -> String {
        self.sae.cfg.to_json().to_string()
    }

    /// Feature activations `[n, d_sae]` of `x` `[n, d_in]`.
    fn encode<'py>(&self, py: Python<'py>, x: PyReadonlyArray2<'py, f32>) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
        let t = self.input(&x, self.sae.cfg.d_in, "x")?;
        let out = py.detach(|| host(self.sae.encode(t)));
        array(py, out.0, &out.1)
    }

    /// Reconstruction `[n, d_in]` from feature activations `f` `[n, d_sae]`.
    fn decode<'py>(&self, py: Python<'py>, f: PyReadonlyArray2<'py, f32>) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
        let t = self.input(&f, self.sae.cfg.d_sae, "feature_acts")?;
        let out = py.detach(|| self.sae.decode(t).map(host)).map_err(value)?;
        array(py, out.0, &out.1)
    }
}

impl NativeSae {
    fn input(&self, x: &PyReadonlyArray2<'_, f32>, width: usize, what: &str) -> Result<Tensor<2>, Fail> {
        let shape = x.shape();
        if shape[1] != width {
            return Err(Fail::Value(format!("{what}: expected [n, {width}], found {shape:?}")));
        }
        let values: Vec<f32> = x.as_array().iter().copied().collect();
        Ok(Tensor::from_data(TensorData::new(values, [shape[0], shape[1]]), &self.sae.w_enc.device()))
    }
}
