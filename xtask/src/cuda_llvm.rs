//! The LLVM the `cuda` feature links, installed without the network access its build script
//! wants. burn's `cuda` backend reaches cubecl-cuda, which always builds cubecl-llvm; its
//! build dependency `tracel-llvm-bundler` downloads an LLVM release from GitHub into
//! `${XDG_DATA_HOME:-~/.local/share}/tracel/tracel-llvm-<version>/` unless that folder
//! already holds the file `.tracel-llvm-installed`, and then runs that folder's
//! `bin/llvm-config`. PyPI's `mlc-llvm-static` and `mlc-llvm-static-extra-targets` (the
//! second adds NVPTX) ship a static LLVM of the same major version with its headers and an
//! `llvm-config`: unpacked into one folder at that path, with the marker, the feature builds
//! offline. Linking it needs zlib and zstd (Debian's `zlib1g-dev`, `libzstd-dev`).

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::packages::apt_install;
use crate::process::run;

/// The bundler's release (`tracel-llvm-bundler`'s version in Cargo.lock), which names the folder.
pub(crate) const BUNDLE: &str = "tracel-llvm-23.1.0-4";
/// The wheels that hold an LLVM 23 with NVPTX.
const WHEELS: [&str; 2] = ["mlc-llvm-static==23.1.1.post0", "mlc-llvm-static-extra-targets==23.1.1.post0"];
/// What the bundler looks for before it downloads.
const MARKER: &str = ".tracel-llvm-installed";

/// Where the bundler looks: `dirs::data_local_dir()` (`$XDG_DATA_HOME` or `~/.local/share`).
pub(crate) fn folder() -> Result<PathBuf> {
    let base = match std::env::var_os("XDG_DATA_HOME").filter(|v| !v.is_empty()) {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME").context("HOME is not set")?).join(".local/share"),
    };
    Ok(base.join("tracel").join(BUNDLE))
}

/// Whether `folder` holds a usable install: the marker, and an `llvm-config` that lists NVPTX.
fn installed(folder: &std::path::Path) -> bool {
    folder.join(MARKER).is_file()
        && Command::new(folder.join("bin/llvm-config"))
            .arg("--targets-built")
            .output()
            .map(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).split_whitespace().any(|t| t == "NVPTX"))
            .unwrap_or(false)
}

/// Install the LLVM (and the system libraries it links) if it is not there; its folder.
pub(crate) fn ensure() -> Result<PathBuf> {
    let dest = folder()?;
    if !installed(&dest) {
        install(&dest)?;
    }
    let libraries = has_lib("zlib") && has_lib("libzstd");
    if !libraries && !apt_install(&["zlib1g-dev", "libzstd-dev", "pkg-config"]) {
        eprintln!("warning: could not install zlib1g-dev and libzstd-dev: `cargo check --features cuda` works, linking a binary will not");
    }
    Ok(dest)
}

fn has_lib(name: &str) -> bool {
    Command::new("pkg-config").args(["--exists", name]).status().map(|s| s.success()).unwrap_or(false)
}

fn install(dest: &std::path::Path) -> Result<()> {
    eprintln!("installing LLVM for the cuda feature from PyPI ({}) into {}", WHEELS.join(", "), dest.display());
    let work = tempdir(dest)?;
    let wheels = work.join("wheels");
    run(Command::new("python3").args(["-m", "pip", "download", "--quiet", "--no-deps", "-d"]).arg(&wheels).args(WHEELS))?;
    let unpacked = work.join("unpacked");
    for wheel in std::fs::read_dir(&wheels)? {
        run(Command::new("python3").args(["-m", "zipfile", "-e"]).arg(wheel?.path()).arg(&unpacked))?;
    }
    // Both wheels unpack into the same tree; the LLVM prefix is its `static` folder.
    let prefix = unpacked.join("mlc_llvm_static/static");
    let config = prefix.join("bin/llvm-config");
    if !config.is_file() {
        bail!("{}: not in the wheels (their layout changed?)", config.display());
    }
    // Zip files keep no execute bit; llvm-config is a Python script.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o755))?;
    let _ = std::fs::remove_dir_all(dest);
    std::fs::rename(&prefix, dest).with_context(|| format!("moving the LLVM to {}", dest.display()))?;
    std::fs::write(dest.join(MARKER), "mlc-llvm-static 23.1.1.post0 with extra targets, installed by `cargo xtask cuda-llvm`\n")?;
    let _ = std::fs::remove_dir_all(&work);
    if !installed(dest) {
        bail!("{}: installed, but its llvm-config does not list NVPTX", dest.display());
    }
    Ok(())
}

/// A fresh folder beside `dest` (same file system, so the final move is a rename).
fn tempdir(dest: &std::path::Path) -> Result<PathBuf> {
    let parent = dest.parent().context("the LLVM folder has a parent")?;
    let work = parent.join(format!(".{BUNDLE}-download-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    Ok(work)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The folder follows the bundler's release in Cargo.lock: a new cubecl that moves to
    /// another bundler fails here instead of downloading at build time.
    #[test]
    fn the_bundle_name_matches_the_locked_bundler() {
        let lock = std::fs::read_to_string(crate::process::root().join("Cargo.lock")).expect("Cargo.lock");
        let version = lock
            .split("[[package]]")
            .find(|p| p.contains("name = \"tracel-llvm-bundler\""))
            .and_then(|p| p.lines().find_map(|l| l.strip_prefix("version = \"")))
            .map(|v| v.trim_end_matches('"').to_string())
            .expect("tracel-llvm-bundler in Cargo.lock");
        assert_eq!(BUNDLE, format!("tracel-llvm-{version}"));
    }
}
