//! Download progress for `--model ORG/NAME`: a bar on a terminal, plain lines elsewhere.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use anyhow::Result;
use burnlens_hf::hub::{Hub, HubId, Progress, resolve_folder, resolve_model};
use indicatif::{ProgressBar, ProgressStyle};

/// A local directory as given, or the cached snapshot of a Hub id (downloaded if needed).
pub fn model_dir(spec: &Path) -> Result<PathBuf> {
    let spec_str = spec.to_string_lossy().to_string();
    let mut reporter = Reporter::new();
    let dir = resolve_model(&spec_str, &mut |p| reporter.report(p))?;
    reporter.finish();
    Ok(dir)
}

/// A local directory as given, or a folder of a Hub repository (`org/name[@rev][:folder]`)
/// with only `files` downloaded.
pub fn folder(spec: &Path, files: &[&str]) -> Result<PathBuf> {
    let spec_str = spec.to_string_lossy().to_string();
    let mut reporter = Reporter::new();
    let dir = resolve_folder(&spec_str, files, &mut |p| reporter.report(p))?;
    reporter.finish();
    Ok(dir)
}

/// A transcoder set from a local folder or a Hub repository (`org/name[@rev][:folder]`),
/// with its `hf://` files downloaded.
pub fn transcoders(spec: &str, device: &burn::tensor::Device) -> Result<burnlens_trace::TranscoderSet> {
    let mut reporter = Reporter::new();
    let set = burnlens_trace::TranscoderSet::open(spec, device, &mut |p| reporter.report(p))?;
    reporter.finish();
    Ok(set)
}

/// The cached snapshot of a Hub id, downloading what is missing (never a local directory).
pub fn hub_snapshot(id: &HubId) -> Result<PathBuf> {
    let mut reporter = Reporter::new();
    let dir = Hub::from_env().fetch(id, &mut |p| reporter.report(p))?;
    reporter.finish();
    Ok(dir)
}

struct Reporter {
    terminal: bool,
    bar: Option<ProgressBar>,
    size: u64,
}

impl Reporter {
    fn new() -> Self {
        Reporter { terminal: std::io::stderr().is_terminal(), bar: None, size: 0 }
    }

    fn report(&mut self, p: Progress) {
        match p {
            Progress::Start { file, size, resumed_from } => {
                self.size = size;
                let resumed = if resumed_from > 0 { format!(", resuming at {}", human(resumed_from)) } else { String::new() };
                if self.terminal {
                    let bar = ProgressBar::new(size);
                    bar.set_style(
                        ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
                            .unwrap_or_else(|_| ProgressStyle::default_bar())
                            .progress_chars("=> "),
                    );
                    bar.set_message(format!("{file}{resumed}"));
                    bar.set_position(resumed_from);
                    self.bar = Some(bar);
                } else {
                    eprintln!("downloading {file} ({}{resumed})", human(size));
                }
            }
            Progress::Advance { bytes } => {
                if let Some(bar) = &self.bar {
                    bar.set_position(bytes.min(self.size));
                }
            }
            Progress::Done { file } => match self.bar.take() {
                Some(bar) => bar.finish_and_clear(),
                None if !self.terminal => eprintln!("verified {file}"),
                None => {}
            },
            Progress::Cached { reason } => eprintln!("using the cached model: {reason}"),
        }
    }

    fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

fn human(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{:.2} GB", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{:.1} MB", b as f64 / (1u64 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1} kB", b as f64 / 1024.0),
        b => format!("{b} bytes"),
    }
}
