//! Training and evaluating SAEs and transcoders, and their dashboards, from Python
//! (`burnlens.train_sae`, `burnlens.evaluate_sae`, `burnlens.dashboards`): the keyword
//! options arrive as one JSON object with the library's own field names, split here into the
//! corpus's (`data::CorpusOptions`, its fields asked of the struct) and the call's own
//! (`features::RunOptions`, `dashboards::DashboardOptions`), so nothing is spelled twice.

use std::ops::ControlFlow;
use std::path::Path;

use burnlens_data::CorpusOptions;
use burnlens_features::{EvalInput, RunOptions, evaluate};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::{NativeModel, NativeSae, NativeTranscoders, to_python};

fn options<T: serde::de::DeserializeOwned>(json: &str, what: &str) -> PyResult<T> {
    serde_json::from_str(json).map_err(|e| PyValueError::new_err(format!("{what}: {e}")))
}

/// One call's keyword options split into the corpus's (the fields [`CorpusOptions`]
/// serialises, asked of the struct itself) and the rest, each read as its struct.
fn corpus_and<T: serde::de::DeserializeOwned>(json: &str, what: &str) -> PyResult<(CorpusOptions, T)> {
    use serde_json::{Map, Value};
    let mut all: Map<String, Value> = options(json, what)?;
    let Value::Object(fields) = serde_json::to_value(CorpusOptions::default()).expect("corpus options serialise") else { unreachable!("a struct") };
    let corpus: Map<String, Value> = fields.keys().filter_map(|k| all.remove_entry(k)).collect();
    fn read<T: serde::de::DeserializeOwned>(m: Map<String, Value>, what: &str) -> PyResult<T> {
        serde_json::from_value(Value::Object(m)).map_err(|e| PyValueError::new_err(format!("{what}: {e}")))
    }
    Ok((read(corpus, what)?, read(all, what)?))
}

/// Train (or resume) the run in `out`; `on_step(reports_json)` after every step, where an
/// exception stops the run after a checkpoint and is raised again. Returns the run's summary
/// as JSON.
#[pyfunction]
#[pyo3(signature = (model, out, options_json, on_step=None))]
pub fn train_sae<'py>(py: Python<'py>, model: &NativeModel, out: &str, options_json: &str, on_step: Option<Py<PyAny>>) -> PyResult<Bound<'py, PyAny>> {
    let (corpus, run): (CorpusOptions, RunOptions) = corpus_and(options_json, "train_sae options")?;
    let cfg =
        run.config(model.any.model.config.d_model, model.any.model.config.n_layers(), corpus.seq_len).map_err(|e| PyValueError::new_err(e.to_string()))?;
    let mut error: Option<PyErr> = None;
    let result = py.detach(|| -> Result<burnlens_features::RunSummary, String> {
        // Made here: a corpus reader stays on the thread that reads it.
        let windows = corpus.windows(model.any.corpus_model(), run.seed, &burnlens_hf::Hub::from_env()).map_err(|e| e.to_string())?;
        let mut step = |reports: &[burnlens_features::StepReport], _: &burnlens_features::Progress| {
            let Some(f) = &on_step else { return ControlFlow::Continue(()) };
            match Python::attach(|py| f.call1(py, (to_python(py, &reports)?,))) {
                Ok(_) => ControlFlow::Continue(()),
                Err(e) => {
                    error = Some(e);
                    ControlFlow::Break(())
                }
            }
        };
        let source = burnlens_features::Source::Model { model: &model.any.model, windows, model_name: Some(model.any.dir.display().to_string()) };
        burnlens_features::train(burnlens_features::Run::alone(Path::new(out), &cfg), source, &mut step).map_err(|e| e.to_string())
    });
    if let Some(e) = error {
        return Err(e);
    }
    let summary = result.map_err(PyValueError::new_err)?;
    to_python(py, &summary)
}

/// SAELens's `run_evals` metrics of `sae` over `batches` batches of `batch_size` windows of
/// the corpus, as JSON `{"metrics": ..., "feature_metrics": ...}`.
#[pyfunction]
#[pyo3(signature = (model, sae, corpus_json, batches=10, batch_size=8, seed=0))]
pub fn evaluate_sae<'py>(
    py: Python<'py>,
    model: &NativeModel,
    sae: &NativeSae,
    corpus_json: &str,
    batches: usize,
    batch_size: usize,
    seed: u64,
) -> PyResult<Bound<'py, PyAny>> {
    let corpus: CorpusOptions = options(corpus_json, "evaluate_sae options")?;
    let err = |e: &dyn std::fmt::Display| PyValueError::new_err(e.to_string());
    let mut windows = corpus.windows(model.any.corpus_model(), seed, &burnlens_hf::Hub::from_env()).map_err(|e| err(&e))?;
    let batches = corpus.batches(&mut windows, batches, batch_size).map_err(|e| err(&e))?;
    let ignore: Vec<u32> = model.any.bos.map(|b| b as u32).into_iter().collect();
    let (metrics, features) =
        py.detach(|| evaluate(&EvalInput { model: &model.any.model, sae: &sae.sae, batches: &batches, ignore_tokens: &ignore })).map_err(|e| err(&e))?;
    to_python(py, &serde_json::json!({ "metrics": metrics, "feature_metrics": features }))
}

/// Feature dashboards of `sae` or `transcoders` over the corpus, written into `out`
/// (resumed from its checkpoint if there is one); `on_progress(pass, tokens, of,
/// tokens_per_s, seconds_left)` after every batch, where an exception stops the job after a
/// checkpoint and is raised again. Returns the summary as JSON.
#[pyfunction]
#[pyo3(signature = (model, out, options_json, sae=None, transcoders=None, on_progress=None))]
pub fn dashboards<'py>(
    py: Python<'py>,
    model: &NativeModel,
    out: &str,
    options_json: &str,
    sae: Option<&NativeSae>,
    transcoders: Option<&NativeTranscoders>,
    on_progress: Option<Py<PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    use burnlens_dashboards::{Explained, Job};
    let (corpus, opts): (CorpusOptions, burnlens_dashboards::DashboardOptions) = corpus_and(options_json, "dashboards options")?;
    let err = |e: &dyn std::fmt::Display| PyValueError::new_err(e.to_string());
    let explained = match (sae, transcoders) {
        (Some(s), None) => Explained::Sae { sae: &s.sae, id: s.sae.cfg.hook_name.clone() },
        (None, Some(t)) => Explained::Transcoders { set: t.set.clone(), id: t.set.scan.clone().unwrap_or_default() },
        _ => return Err(PyValueError::new_err("dashboards: give one of sae= and transcoders=")),
    };
    let m = &model.any;
    let job = Job::new(
        burnlens_dashboards::JobModel { model: &m.model, for_model: m.corpus_model(), id: m.dir.display().to_string() },
        explained,
        corpus,
        opts,
        out.into(),
    )
    .map_err(|e| err(&e))?;
    let mut error: Option<PyErr> = None;
    let summary = py.detach(|| {
        let mut control = |p: &burnlens_dashboards::Progress| {
            let Some(f) = &on_progress else { return ControlFlow::Continue(()) };
            let progress = serde_json::json!({"pass": p.pass, "tokens": p.tokens, "of": p.of, "tokens_per_s": p.tokens_per_s, "seconds_left": p.seconds_left});
            match Python::attach(|py| f.call1(py, (to_python(py, &progress)?,))) {
                Ok(_) => ControlFlow::Continue(()),
                Err(e) => {
                    error = Some(e);
                    ControlFlow::Break(())
                }
            }
        };
        burnlens_dashboards::make(&job, &mut control)
    });
    if let Some(e) = error {
        return Err(e);
    }
    let summary = summary.map_err(|e| err(&e))?;
    to_python(py, &summary)
}
