//! A dashboard run: the corpus read twice (the same windows each time), `batch_windows` at a
//! time, with progress; then the logit effects; then the dashboards. A corpus that runs out
//! before the tokens asked for ends the first pass there, and the run says so.

use std::time::Instant;

use burnlens_data::WindowIter;

use crate::config::DashboardConfig;
use crate::dashboard::FeatureDashboard;
use crate::error::DashboardError;
use crate::logits::logit_effects;
use crate::scan::Scan;
use crate::source::FeatureSource;

/// How much to read and how.
pub struct RunSpec {
    pub cfg: DashboardConfig,
    /// Tokens to read (whole windows: rounded up to a window).
    pub tokens: u64,
    /// Windows per model pass.
    pub batch_windows: usize,
}

/// Where a run stands.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    /// 1 or 2.
    pub pass: usize,
    pub tokens: u64,
    pub of: u64,
    pub tokens_per_s: f64,
    pub seconds_left: f64,
}

pub struct Outcome {
    pub dashboards: Vec<FeatureDashboard>,
    /// Tokens each pass read.
    pub tokens: u64,
    /// The corpus ended before the tokens asked for.
    pub ran_out: bool,
    /// Seconds in the two passes and in the logit effects.
    pub seconds: [f64; 3],
    /// Bytes of per-feature state ([`Scan::state_bytes`]).
    pub state_bytes: usize,
}

/// Runs both passes; `windows()` must give the same windows each time it is called.
pub fn run<'w>(
    source: &FeatureSource,
    spec: &RunSpec,
    windows: &mut dyn FnMut() -> Result<WindowIter<'w>, DashboardError>,
    on_progress: &mut dyn FnMut(&Progress),
) -> Result<Outcome, DashboardError> {
    let mut it = windows()?;
    let Some(first) = it.next().transpose()? else { return Err(DashboardError::Input("the corpus has no windows".into())) };
    let seq_len = first.len();
    let want_windows = spec.tokens.div_ceil(seq_len as u64).max(1);
    let mut scan = Scan::new(spec.cfg.clone(), source.features.clone(), seq_len);
    let started = Instant::now();
    let mut pending = Some(first);
    let mut read = 0u64;
    let mut ran_out = false;
    // Pass 1.
    while read < want_windows {
        let take = (spec.batch_windows as u64).min(want_windows - read) as usize;
        let mut batch: Vec<Vec<u32>> = pending.take().into_iter().collect();
        while batch.len() < take {
            match it.next().transpose()? {
                Some(w) => batch.push(w),
                None => break,
            }
        }
        if batch.is_empty() {
            ran_out = true;
            break;
        }
        let n = batch.len() as u64;
        let mut b = source.batch(&batch, read)?;
        b.mask(&spec.cfg);
        scan.first(&b);
        read += n;
        report(on_progress, 1, read * seq_len as u64, want_windows * seq_len as u64, started);
        if (n as usize) < take {
            ran_out = true;
            break;
        }
    }
    let pass1 = started.elapsed().as_secs_f64();
    // Pass 2: the same windows again.
    scan.start_second();
    let total = read;
    let mut it = windows()?;
    let mut done = 0u64;
    let second_started = Instant::now();
    while done < total {
        let take = (spec.batch_windows as u64).min(total - done) as usize;
        let batch: Vec<Vec<u32>> = it.by_ref().take(take).collect::<Result<_, _>>()?;
        if batch.len() < take {
            return Err(DashboardError::Input(format!("the corpus gave {} windows on the second pass, {total} on the first", done + batch.len() as u64)));
        }
        let mut b = source.batch(&batch, done)?;
        b.mask(&spec.cfg);
        scan.second(&b);
        done += take as u64;
        report(on_progress, 2, (total + done) * seq_len as u64, 2 * total * seq_len as u64, started);
    }
    let pass2 = second_started.elapsed().as_secs_f64();
    let logits_started = Instant::now();
    let dirs = source.resid_directions()?;
    let effects = logit_effects(dirs, source.model.w_u().0, spec.cfg.logit_rows, spec.cfg.n_bins, 256);
    let position: std::collections::HashMap<usize, usize> = source.features.iter().enumerate().map(|(i, &f)| (f, i)).collect();
    let mut dashboards = scan.finish(&mut |f| effects[position[&f]].clone());
    for d in &mut dashboards {
        let key = source.encoder.key(d.feature);
        (d.layer, d.feature) = (key.layer, key.index);
    }
    Ok(Outcome {
        dashboards,
        tokens: total * seq_len as u64,
        ran_out,
        seconds: [pass1, pass2, logits_started.elapsed().as_secs_f64()],
        state_bytes: scan.state_bytes(),
    })
}

fn report(on_progress: &mut dyn FnMut(&Progress), pass: usize, tokens: u64, of: u64, started: Instant) {
    let s = started.elapsed().as_secs_f64().max(1e-9);
    let rate = tokens as f64 / s;
    on_progress(&Progress { pass, tokens, of, tokens_per_s: rate, seconds_left: (of - tokens.min(of)) as f64 / rate });
}
