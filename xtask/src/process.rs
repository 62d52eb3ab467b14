//! Running commands and reading what they print; the repository's and the reference data's folders.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The repository's root.
pub(crate) fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask sits in the workspace").to_path_buf()
}

/// Run `cmd`, echoing it first; an error if it fails.
pub(crate) fn run(cmd: &mut Command) -> Result<()> {
    eprintln!("+ {cmd:?}");
    let status = cmd.status().with_context(|| format!("starting {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed with {status}");
    }
    Ok(())
}

/// Run `cmd` and parse the last line of its output that starts with `{`.
pub(crate) fn run_json(cmd: &mut Command) -> Result<serde_json::Value> {
    let out = cmd.output().with_context(|| format!("starting {cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().rev().find(|l| l.starts_with('{')).context("no JSON line")?;
    Ok(serde_json::from_str(line)?)
}

/// The numbers of the array `key` of a bench report.
pub(crate) fn floats(v: &serde_json::Value, key: &str) -> Result<Vec<f64>> {
    Ok(v[key].as_array().with_context(|| format!("the report has no array {key:?}"))?.iter().filter_map(|x| x.as_f64()).collect())
}

/// The median (the upper one of an even count).
pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() { f64::NAN } else { v[v.len() / 2] }
}

/// The reference data folder: `BURNLENS_DATA`, or `../shared/data` beside the repository.
pub(crate) fn data_dir() -> PathBuf {
    std::env::var("BURNLENS_DATA").map(PathBuf::from).unwrap_or_else(|_| root().join("../shared/data"))
}

/// The peak RSS, in bytes, that `/usr/bin/time -f %M -o FILE` wrote (its last line, in KiB);
/// NaN where there is none.
pub(crate) fn peak_rss(file: &std::path::Path) -> f64 {
    std::fs::read_to_string(file).ok().and_then(|t| t.lines().last().and_then(|l| l.trim().parse::<f64>().ok())).unwrap_or(f64::NAN) * 1024.0
}

/// `/usr/bin/time -f %M -o FILE`, ready for the command it measures: read its peak RSS back
/// with [`peak_rss`].
pub(crate) fn timed_rss(file: &std::path::Path) -> Command {
    let mut cmd = Command::new("/usr/bin/time");
    cmd.args(["-f", "%M", "-o"]).arg(file);
    cmd
}
