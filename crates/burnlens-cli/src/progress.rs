//! Progress on the terminal: downloads for `--model ORG/NAME` (a bar on a terminal, plain
//! lines elsewhere) and a training run's steps ([`TrainProgress`], the CLI's observer of a
//! training session).

use std::io::{IsTerminal, Write};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Result;
use burnlens_hf::hub::{Hub, HubId, Progress, resolve_folder, resolve_model};
use burnlens_train::{Observer, StepMetrics};
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

/// A training run's progress: a line redrawn in place on a terminal, plain lines every
/// `training.log_interval` steps otherwise; nothing but errors with `--quiet`.
pub struct TrainProgress {
    quiet: bool,
    tty: bool,
    first: usize,
    total: usize,
    log_interval: usize,
    began: Instant,
    download: Reporter,
}

impl TrainProgress {
    pub fn new(quiet: bool) -> Self {
        TrainProgress { quiet, tty: std::io::stdout().is_terminal(), first: 0, total: 0, log_interval: 1, began: Instant::now(), download: Reporter::new() }
    }
}

impl Observer for TrainProgress {
    fn started(&mut self, first_step: usize, total: usize, log_interval: usize) {
        self.download.finish();
        (self.first, self.total, self.log_interval, self.began) = (first_step, total, log_interval, Instant::now());
    }

    fn note(&mut self, message: &str) {
        if !self.quiet {
            eprintln!("note: {message}");
        }
    }

    fn download(&mut self, progress: Progress) {
        if !self.quiet {
            self.download.report(progress);
        }
    }

    fn step(&mut self, m: &StepMetrics) -> ControlFlow<()> {
        if self.quiet || (!self.tty && !m.step.is_multiple_of(self.log_interval) && m.step != self.total) {
            return ControlFlow::Continue(());
        }
        let per_step = self.began.elapsed().as_secs_f64() / (m.step - self.first).max(1) as f64;
        let eta = per_step * self.total.saturating_sub(m.step) as f64;
        let width = 24;
        let filled = m.step * width / self.total.max(1);
        let text = format!(
            "step {:>6}/{} [{}{}] loss {:.4}  {:>8.0} tok/s  ETA {}",
            m.step,
            self.total,
            "#".repeat(filled),
            ".".repeat(width - filled),
            m.loss,
            m.tokens_per_s,
            duration(eta)
        );
        if self.tty {
            print!("\r{text}");
            let _ = std::io::stdout().flush();
        } else {
            println!("{text}");
        }
        ControlFlow::Continue(())
    }

    fn evaluated(&mut self, step: usize, val_loss: f64) {
        if self.quiet {
            return;
        }
        if self.tty {
            println!();
        }
        println!("step {step:>6}: validation loss {val_loss:.4}");
    }

    fn finished(&mut self) {
        if self.tty && !self.quiet {
            println!();
        }
    }
}

fn duration(s: f64) -> String {
    let s = s.max(0.0) as u64;
    if s >= 3600 { format!("{}h{:02}m", s / 3600, s % 3600 / 60) } else { format!("{}m{:02}s", s / 60, s % 60) }
}
