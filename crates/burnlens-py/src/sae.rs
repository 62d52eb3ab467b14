//! The SAE class.

use super::*;

/// A sparse autoencoder (SAELens's layout, Gemma Scope's `params.npz`, or burnlens's).
#[pyclass(frozen, name = "SAE", module = "burnlens._native")]
pub(crate) struct NativeSae {
    pub(crate) sae: Sae,
}

#[pymethods]
impl NativeSae {
    /// Load an SAE from a directory (SAELens's layout or Gemma Scope's `params.npz`) or a
    /// Hub folder `org/name[@rev]:folder`.
    #[staticmethod]
    #[pyo3(signature = (spec, backend=None))]
    fn load(py: Python<'_>, spec: PathBuf, backend: Option<&str>) -> PyResult<Self> {
        let spec = spec.to_string_lossy().into_owned();
        let backend = backend.map(str::to_string);
        Ok(py.detach(move || -> Result<Self, Fail> {
            let device = device_for(backend.as_deref())?;
            let dir = burnlens_hf::resolve_folder(&spec, burnlens_lens::sae::folder_files(&spec), &mut |_| {})
                .map_err(|e| load_fail(format!("{spec}: {e}"), e.missing()))?;
            let sae = Sae::load(&dir, &device).map_err(|e| load_fail(e.to_string(), !Path::new(&dir).exists()))?;
            Ok(Self { sae })
        })?)
    }

    /// The SAE's configuration: SAELens's `cfg.json` fields, as a dict.
    #[getter]
    fn cfg<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        py.import("json")?.call_method1("loads", (self.sae.cfg.to_json().to_string(),))
    }

    /// The hook point the SAE reads.
    #[getter]
    fn hook_name(&self) -> String {
        self.sae.cfg.hook_name.clone()
    }

    #[getter]
    fn d_in(&self) -> usize {
        self.sae.cfg.d_in
    }

    #[getter]
    fn d_sae(&self) -> usize {
        self.sae.cfg.d_sae
    }

    /// Feature activations `[..., d_sae]` of `x` `[..., d_in]`.
    fn encode<'py>(&self, py: Python<'py>, x: PyReadonlyArrayDyn<'py, f32>) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
        let (t, mut dims) = self.input(&x, self.sae.cfg.d_in, "x")?;
        let out = py.detach(|| host(self.sae.encode(t)));
        *dims.last_mut().expect("checked rank") = self.sae.cfg.d_sae;
        array(py, out.0, &dims)
    }

    /// Reconstruction `[..., d_in]` from feature activations `feature_acts` `[..., d_sae]`.
    fn decode<'py>(&self, py: Python<'py>, feature_acts: PyReadonlyArrayDyn<'py, f32>) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
        let (t, mut dims) = self.input(&feature_acts, self.sae.cfg.d_sae, "feature_acts")?;
        let out = py.detach(|| self.sae.decode(t).map(host)).map_err(value)?;
        *dims.last_mut().expect("checked rank") = self.sae.cfg.d_in;
        array(py, out.0, &dims)
    }

    fn __repr__(&self) -> String {
        let c = &self.sae.cfg;
        format!("SAE(hook_name='{}', d_in={}, d_sae={})", c.hook_name, c.d_in, c.d_sae)
    }
}

impl NativeSae {
    /// `x` `[..., width]` as `[n, width]`, and its shape.
    fn input(&self, x: &PyReadonlyArrayDyn<'_, f32>, width: usize, what: &str) -> Result<(Tensor<2>, Vec<usize>), Fail> {
        let shape = x.shape().to_vec();
        if shape.last() != Some(&width) {
            return Err(Fail::Value(format!("{what}: expected [..., {width}], found {shape:?}")));
        }
        let values: Vec<f32> = x.as_array().iter().copied().collect();
        let n = values.len() / width;
        Ok((Tensor::from_data(TensorData::new(values, [n, width]), &self.sae.dict.w_enc.device()), shape))
    }
}
