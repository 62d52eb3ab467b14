//! Runs the Python API's pytest suite (`crates/burnlens-py/tests/python/`) against the
//! extension module this build produced: the module is copied beside the Python package into
//! a temporary directory that becomes `PYTHONPATH`. The interpreter is `BURNLENS_PYTHON`, else
//! the repository's `.venv/bin/python` (which `cargo xtask test` makes, with numpy and
//! pytest). Without an interpreter that has numpy and pytest the test fails under `CI` and
//! says what is missing otherwise too.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The `cdylib` cargo built for this test, beside the test executable.
fn extension() -> PathBuf {
    let deps = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
    for dir in [deps.clone(), deps.parent().unwrap().to_path_buf()] {
        for name in ["libburnlens_native.so", "libburnlens_native.dylib", "burnlens_native.dll"] {
            if dir.join(name).is_file() {
                return dir.join(name);
            }
        }
    }
    panic!("the burnlens_native extension was not built beside {}", deps.display());
}

fn python() -> PathBuf {
    std::env::var_os("BURNLENS_PYTHON").map(PathBuf::from).unwrap_or_else(|| root().join(".venv/bin/python"))
}

#[test]
fn python_api_pytest_suite() {
    let py = python();
    let usable = Command::new(&py).args(["-c", "import numpy, pytest"]).status().map(|s| s.success()).unwrap_or(false);
    assert!(usable, "{} with numpy and pytest is needed for the Python tests: run `cargo xtask test` (it makes .venv), or set BURNLENS_PYTHON", py.display());
    let tmp = tempfile_dir();
    let pkg = tmp.join("burnlens");
    std::fs::create_dir_all(&pkg).unwrap();
    let src = root().join("crates/burnlens-py/python/burnlens");
    for entry in std::fs::read_dir(&src).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_file() {
            std::fs::copy(entry.path(), pkg.join(entry.file_name())).unwrap();
        }
    }
    std::fs::copy(extension(), pkg.join("_native.abi3.so")).unwrap();
    let status = Command::new(&py)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .arg(root().join("crates/burnlens-py/tests/python"))
        .env("PYTHONPATH", &tmp)
        .env("BURNLENS_ROOT", root())
        .status()
        .unwrap();
    let _ = std::fs::remove_dir_all(&tmp);
    assert!(status.success(), "the Python tests failed (output above)");
}

fn tempfile_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("burnlens-py-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
