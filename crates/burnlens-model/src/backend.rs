//! Choosing a backend by name at run time. Which backends exist is decided by cargo
//! features at build time; asking for one that was left out says how to rebuild.

use burn::tensor::Device;

/// Backends burnlens knows, in the order `burnlens backends` lists them.
pub const BACKENDS: &[&str] = &["flex", "ndarray", "wgpu", "tch", "cuda"];

/// The backend used when neither a config, a flag nor `BURNLENS_BACKEND` names one.
pub const DEFAULT_BACKEND: &str = "flex";

/// Whether this binary was built with backend `name`.
pub fn is_compiled(name: &str) -> bool {
    match name {
        "flex" => true,
        "ndarray" => cfg!(feature = "ndarray"),
        "wgpu" => cfg!(feature = "wgpu"),
        "tch" => cfg!(feature = "tch"),
        "cuda" => cfg!(feature = "cuda"),
        _ => false,
    }
}

/// Errors choosing a backend.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("unknown backend \"{0}\"; expected one of {list}", list = BACKENDS.join(", "))]
    Unknown(String),
    #[error("backend \"{name}\" is not compiled into this binary; rebuild with: cargo build --release --features {name}")]
    NotCompiled { name: String },
    #[error("backend \"{name}\" cannot run here: {why}")]
    Unusable { name: String, why: String },
}

/// Whether the NVIDIA driver's library loads here. cubecl-cuda loads it on a worker thread
/// at the first operation and panics there without it (the caller then saw only
/// `RecvError`), so the device is refused up front with the reason.
#[cfg(feature = "cuda")]
fn cuda_driver() -> Result<(), String> {
    // SAFETY: dlopen with a NUL-terminated name; the handle is closed at once.
    let handle = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) };
    if handle.is_null() {
        return Err("no NVIDIA driver (libcuda.so.1 does not load): the cuda backend needs an NVIDIA GPU and its driver".into());
    }
    // SAFETY: a handle dlopen returned, closed once.
    unsafe { libc::dlclose(handle) };
    Ok(())
}

/// The device of backend `name` (`flex`, `ndarray`, `wgpu`, `tch`, `cuda`); `index` picks
/// among several GPUs (`tch` uses index `None` for its CPU device).
pub fn device(name: &str, index: Option<usize>) -> Result<Device, BackendError> {
    let name = name.trim().to_ascii_lowercase();
    if !BACKENDS.contains(&name.as_str()) {
        return Err(BackendError::Unknown(name));
    }
    if !is_compiled(&name) {
        return Err(BackendError::NotCompiled { name });
    }
    let _ = index;
    #[cfg(feature = "cuda")]
    if name == "cuda" {
        cuda_driver().map_err(|why| BackendError::Unusable { name: name.clone(), why })?;
    }
    #[allow(deprecated)]
    let device = match name.as_str() {
        "flex" => Device::flex(),
        #[cfg(feature = "ndarray")]
        "ndarray" => Device::ndarray(),
        #[cfg(feature = "wgpu")]
        "wgpu" => match index {
            Some(i) => Device::wgpu(burn::tensor::DeviceKind::DiscreteGpu(i)),
            None => Device::wgpu(Default::default()),
        },
        #[cfg(feature = "tch")]
        "tch" => match index {
            Some(i) => Device::libtorch_cuda(i),
            None => Device::libtorch(),
        },
        #[cfg(feature = "cuda")]
        "cuda" => Device::cuda(index.unwrap_or(0)),
        _ => unreachable!("checked by is_compiled"),
    };
    Ok(device)
}

/// Whether `device` computes on this machine's CPU (flex, ndarray, LibTorch's CPU device; an
/// autodiff device answers for the one it wraps): where the hand-written passes over host
/// slices are the fast path. A GPU's tensors stay on the GPU instead.
pub fn is_host(device: &Device) -> bool {
    #[allow(unreachable_patterns)]
    match device.clone().inner().as_dispatch() {
        burn::backend::DispatchDevice::Flex(_) => true,
        #[cfg(feature = "ndarray")]
        burn::backend::DispatchDevice::NdArray(_) => true,
        #[cfg(feature = "tch")]
        burn::backend::DispatchDevice::LibTorch(d) => matches!(d, burn::backend::libtorch::LibTorchDevice::Cpu),
        _ => false,
    }
}

/// The backend named by the first of `choices` that is set, else `BURNLENS_BACKEND`, else
/// [`DEFAULT_BACKEND`].
pub fn resolve_name(choices: &[Option<&str>]) -> String {
    choices
        .iter()
        .flatten()
        .map(|s| s.to_string())
        .next()
        .or_else(|| std::env::var("BURNLENS_BACKEND").ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| DEFAULT_BACKEND.to_string())
}

/// What one backend of this binary can do here.
#[derive(Debug, Clone)]
pub struct BackendReport {
    pub name: &'static str,
    pub compiled: bool,
    /// `Ok(description)` if a small computation ran on it, `Err(why)` otherwise.
    pub probe: Result<String, String>,
}

/// Try every backend: compiled in or not, and whether a 2x2 matmul runs on its default
/// device (GPU backends fail here without a driver or device).
pub fn probe_all() -> Vec<BackendReport> {
    BACKENDS
        .iter()
        .map(|&name| {
            if !is_compiled(name) {
                return BackendReport { name, compiled: false, probe: Err(format!("not compiled in (cargo build --release --features {name})")) };
            }
            let previous = std::panic::take_hook();
            std::panic::set_hook(Box::new(|_| {}));
            let result = std::panic::catch_unwind(|| {
                let device = device(name, None).map_err(|e| match e {
                    BackendError::Unusable { why, .. } => why,
                    other => other.to_string(),
                })?;
                let a = burn::tensor::Tensor::<2>::from_floats([[1.0, 2.0], [3.0, 4.0]], &device);
                let v: Vec<f32> = crate::matmul::matmul(a.clone(), a).into_data().try_into_vec_as::<f32>().map_err(|e| format!("{e:?}"))?;
                if v != [7.0, 10.0, 15.0, 22.0] {
                    return Err(format!("wrong result {v:?}"));
                }
                Ok(format!("{device:?}"))
            });
            std::panic::set_hook(previous);
            let probe = match result {
                Ok(r) => r,
                Err(payload) => Err(payload
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "failed".into())
                    .lines()
                    .next()
                    .unwrap_or("failed")
                    .to_string()),
            };
            BackendReport { name, compiled: true, probe }
        })
        .collect()
}
