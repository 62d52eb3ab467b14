//! `burnlens._native`: the Rust side of burnlens's Python API. The classes a user holds
//! (`Config`, `SAE`, `Transcoders`, `Graph`) live here with their getters; the lens tools
//! return dicts of numpy arrays built here. The Python package around it
//! (`python/burnlens/__init__.py`) keeps what needs Python itself: `HookedModel` with Python
//! hook functions, the activation cache as a dict, TransformerLens's aliases and sugar.
//! Everything runs with the GIL released and turns burnlens's errors into Python exceptions
//! carrying the CLI's one-line messages (`FileNotFoundError` for a missing path, `KeyError`
//! for an unknown hook name, `ValueError` for the rest).

mod config;
mod features;
mod lens;
mod model;
mod sae;
mod trace;
mod train;

use config::NativeConfig;
use model::{NativeModel, device_for};
use sae::NativeSae;
use trace::{NativeGraph, NativeTranscoders};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use burn::tensor::{Device, Int, Tensor, TensorData};
use burnlens_lens::{Metric, Sae};
use burnlens_model::{Activation, Forward, HookPoint, Hooks, NormSite, Sampling, generate, hook_names};
use numpy::{IntoPyArray, PyArray1, PyArray2, PyArrayDyn, PyArrayMethods, PyReadonlyArray2, PyReadonlyArrayDyn, PyUntypedArrayMethods};
use pyo3::exceptions::{PyFileNotFoundError, PyKeyError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// An error as Python sees it: the message, and which exception class carries it.
enum Fail {
    NotFound(String),
    Key(String),
    Value(String),
}

impl From<Fail> for PyErr {
    fn from(f: Fail) -> PyErr {
        match f {
            Fail::NotFound(m) => PyFileNotFoundError::new_err(m),
            Fail::Key(m) => PyKeyError::new_err(m),
            Fail::Value(m) => PyValueError::new_err(m),
        }
    }
}

/// A loading error: missing files become `FileNotFoundError`.
fn load_fail(msg: String, missing: bool) -> Fail {
    if missing { Fail::NotFound(msg) } else { Fail::Value(msg) }
}

fn value(e: impl std::fmt::Display) -> Fail {
    Fail::Value(e.to_string())
}

/// Whether loading failed because a file or directory is missing.
trait Missing {
    fn missing(&self) -> bool;
}

impl Missing for burnlens_hf::HfError {
    fn missing(&self) -> bool {
        matches!(self, burnlens_hf::HfError::Io { error, .. } if error.kind() == std::io::ErrorKind::NotFound)
    }
}

impl Missing for burnlens_train::TrainError {
    fn missing(&self) -> bool {
        match self {
            burnlens_train::TrainError::Io { error, .. } => error.kind() == std::io::ErrorKind::NotFound,
            burnlens_train::TrainError::Hf(e) => e.missing(),
            _ => false,
        }
    }
}

/// `Vec<f32>` of shape `dims` as a numpy array, without copying the values again.
fn array<'py>(py: Python<'py>, values: Vec<f32>, dims: &[usize]) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
    values.into_pyarray(py).reshape(dims.to_vec())
}

/// `value` (serialisable) as the Python object `json.loads` makes of it.
pub(crate) fn to_python<'py>(py: Python<'py>, value: &impl serde::Serialize) -> PyResult<Bound<'py, PyAny>> {
    let text = serde_json::to_string(value).map_err(|e| PyValueError::new_err(e.to_string()))?;
    py.import("json")?.call_method1("loads", (text,))
}

/// A tensor's values and shape on the host.
fn host<const D: usize>(t: Tensor<D>) -> (Vec<f32>, Vec<usize>) {
    let dims = t.dims().to_vec();
    (t.into_data().try_into_vec_as::<f32>().expect("f32 tensor"), dims)
}

fn activation_host(a: &Activation) -> (Vec<f32>, Vec<usize>) {
    (a.to_vec(), a.dims())
}

/// An activation's values and shape, moved out of the tensor where nothing else holds it.
fn activation_into_host(a: Activation) -> (Vec<f32>, Vec<usize>) {
    match a {
        Activation::Rank3(t) => host(t),
        Activation::Rank4(t) => host(t),
    }
}

/// The compiled backends and whether a small computation runs on each here.
/// TransformerLens's `utils.get_act_name` (burnlens_model::act_name).
#[pyfunction]
#[pyo3(signature = (name, layer=None, sub=None))]
fn get_act_name(name: &str, layer: Option<usize>, sub: Option<&str>) -> PyResult<String> {
    burnlens_model::act_name(name, layer, sub).map_err(pyo3::exceptions::PyKeyError::new_err)
}

/// The arithmetic of the products for every later call in this process: `f32` (exact),
/// `bf16` (operands rounded to bf16, sums in f32) or `tf32` (a GPU's tensor cores; f32 on
/// the CPU); activations, hooks and results stay float32 either way.
#[pyfunction]
pub(crate) fn set_compute_dtype(name: &str) -> PyResult<()> {
    burnlens_model::kernels::set_compute(name.parse().map_err(pyo3::exceptions::PyValueError::new_err)?);
    Ok(())
}

/// The compute dtype in force (`f32` or `bf16`).
#[pyfunction]
fn compute_dtype() -> &'static str {
    burnlens_model::kernels::compute().name()
}

/// The layer of a hook point (`blocks.3.attn.hook_z` -> 3; `hook_embed` -> None), from the
/// library's parse of the name.
#[pyfunction]
fn hook_layer(name: &str) -> PyResult<Option<usize>> {
    burnlens_model::HookPoint::parse(name).map(|h| h.layer()).ok_or_else(|| pyo3::exceptions::PyKeyError::new_err(format!("{name:?} is not a hook point name")))
}

#[pyfunction]
fn backends() -> Vec<String> {
    burnlens_model::backend::BACKENDS.iter().filter(|b| burnlens_model::backend::is_compiled(b)).map(|b| b.to_string()).collect()
}

#[pymodule]
#[pyo3(name = "_native")]
fn native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    burnlens_model::kernels::memory::keep_freed_memory();
    m.add_class::<NativeModel>()?;
    m.add_class::<NativeSae>()?;
    m.add_class::<NativeTranscoders>()?;
    m.add_class::<NativeGraph>()?;
    m.add_class::<NativeConfig>()?;
    m.add_function(wrap_pyfunction!(lens::patching, m)?)?;
    m.add_function(wrap_pyfunction!(lens::logit_lens, m)?)?;
    m.add_function(wrap_pyfunction!(lens::logit_attribution, m)?)?;
    m.add_function(wrap_pyfunction!(lens::residual, m)?)?;
    m.add_function(wrap_pyfunction!(lens::accumulated_resid, m)?)?;
    m.add_function(wrap_pyfunction!(trace::attribute, m)?)?;
    m.add_function(wrap_pyfunction!(trace::feature_intervention, m)?)?;
    m.add_function(wrap_pyfunction!(trace::qk, m)?)?;
    m.add_function(wrap_pyfunction!(train::train, m)?)?;
    m.add_function(wrap_pyfunction!(features::train_sae, m)?)?;
    m.add_function(wrap_pyfunction!(features::evaluate_sae, m)?)?;
    m.add_function(wrap_pyfunction!(features::dashboards, m)?)?;
    m.add_function(wrap_pyfunction!(backends, m)?)?;
    m.add_function(wrap_pyfunction!(set_compute_dtype, m)?)?;
    m.add_function(wrap_pyfunction!(hook_layer, m)?)?;
    m.add_function(wrap_pyfunction!(compute_dtype, m)?)?;
    m.add_function(wrap_pyfunction!(get_act_name, m)?)?;
    Ok(())
}
