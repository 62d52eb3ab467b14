//! Debian's packages the tests need on a fresh machine: chromium and chromedriver, MPICH and
//! what the `mpi` crate builds with; `apt-get` as root or through passwordless sudo.

use std::path::Path;
use std::process::Command;

use anyhow::Result;

/// Debian's chromium and chromedriver, installed if missing (as root, or with passwordless
/// sudo). Where neither works the browser tests will say what is missing.
pub(crate) fn ensure_browser() -> Result<()> {
    let present = || Path::new("/usr/bin/chromium").exists() && Path::new("/usr/bin/chromedriver").exists();
    if present() || std::env::var_os("BURNLENS_SKIP_BROWSER").is_some() {
        return Ok(());
    }
    eprintln!("installing chromium and chromium-driver (Debian packages) for the browser tests");
    if !(apt_install(&["chromium", "chromium-driver"]) && present()) {
        eprintln!(
            "warning: could not install chromium and chromium-driver (needs root or passwordless sudo); \
             the browser tests will fail: install them, or set BURNLENS_SKIP_BROWSER=1 to skip those tests"
        );
    }
    Ok(())
}

/// Debian's packages for the `mpi` feature and its multi-process tests: MPICH (its
/// `mpiexec` runs as root and puts more ranks than cores on loopback without the flags Open
/// MPI needs for both), its headers for the `mpi` crate's C shim, and libclang and
/// pkg-config for its bindgen build script; iproute2 for the two-host test's network
/// namespaces. Whether the `mpi` feature can be built.
pub(crate) fn ensure_mpi() -> bool {
    let present = || {
        let ok = |cmd: &mut Command| cmd.output().map(|o| o.status.success()).unwrap_or(false);
        let libclang = std::fs::read_dir("/usr/lib")
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with("llvm-") && e.path().join("lib/libclang.so").exists());
        ok(Command::new("pkg-config").args(["--exists", "mpich"]))
            && ok(Command::new("mpiexec.mpich").arg("--version"))
            && libclang
            && ok(Command::new("ip").arg("-V"))
    };
    if present() {
        return true;
    }
    eprintln!("installing mpich, libmpich-dev, libclang-dev, pkg-config and iproute2 (Debian packages) for the MPI tests");
    if apt_install(&["mpich", "libmpich-dev", "libclang-dev", "pkg-config", "iproute2"]) && present() {
        return true;
    }
    eprintln!(
        "warning: could not install MPICH, its headers and libclang (needs root or passwordless sudo); \
         testing without the `mpi` feature: the MPI tests will fail"
    );
    false
}

/// `apt-get install` as root or through passwordless sudo; whether it succeeded.
pub(crate) fn apt_install(packages: &[&str]) -> bool {
    let is_root = Command::new("id").arg("-u").output().map(|o| o.stdout.trim_ascii() == b"0").unwrap_or(false);
    let apt = |args: &[&str]| -> bool {
        let mut cmd = if is_root {
            Command::new("apt-get")
        } else {
            let mut c = Command::new("sudo");
            c.args(["-n", "apt-get"]);
            c
        };
        cmd.args(args).env("DEBIAN_FRONTEND", "noninteractive").status().map(|s| s.success()).unwrap_or(false)
    };
    apt(&["update", "-qq"]) && apt(&["install", "-y", "-qq"].iter().chain(packages).copied().collect::<Vec<_>>())
}
