//! Model training from Python, with an `on_step` callback.

use super::*;

/// Python's `on_step`: called with each step's metrics line; an exception it raises stops the
/// run after a checkpoint and is raised again by `train`.
struct OnStep {
    f: Option<Py<PyAny>>,
    error: Option<PyErr>,
}

impl burnlens_train::Observer for OnStep {
    fn step(&mut self, m: &burnlens_train::StepMetrics) -> std::ops::ControlFlow<()> {
        let Some(f) = &self.f else { return std::ops::ControlFlow::Continue(()) };
        match Python::attach(|py| f.call1(py, (to_python(py, &m.to_json())?,))) {
            Ok(_) => std::ops::ControlFlow::Continue(()),
            Err(e) => {
                self.error = Some(e);
                std::ops::ControlFlow::Break(())
            }
        }
    }
}

/// Train as the run config at `config_path` says, with `overrides_json` (a JSON object
/// `{"table.key": value}`, each value set as `--set table.key=value` with the value as TOML);
/// `on_step(metrics_dict_as_json)` after every optimizer step. Returns the run directory.
#[pyfunction]
#[pyo3(signature = (config_path, overrides_json="{}", on_step=None, resume=false))]
pub(crate) fn train(py: Python<'_>, config_path: &str, overrides_json: &str, on_step: Option<Py<PyAny>>, resume: bool) -> PyResult<String> {
    let map: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(overrides_json).map_err(|e| PyValueError::new_err(format!("overrides: expected a dict of settings ({e})")))?;
    let overrides = map.iter().map(|(k, v)| burnlens_train::config::override_from_json(k, v)).collect::<Result<Vec<_>, _>>().map_err(PyValueError::new_err)?;
    let path = PathBuf::from(config_path);
    let cfg = burnlens_train::RunConfig::load(&path, &overrides).map_err(|e| load_fail(e.to_string(), e.missing()))?;
    let opts = burnlens_train::TrainOptions { backend_flag: None, resume, ..Default::default() };
    let mut observer = OnStep { f: on_step, error: None };
    let result = py.detach(|| burnlens_train::train(&cfg, &opts, &mut observer));
    if let Some(e) = observer.error {
        return Err(e);
    }
    let summary = result.map_err(value)?;
    Ok(summary.run_dir.display().to_string())
}
