//! A dashboard run: the corpus read twice (the same windows each time), `batch_windows` at a
//! time, with progress; then the logit effects; then the dashboards. A corpus that runs out
//! before the tokens asked for ends the first pass there, and the run says so. With a
//! checkpoint path, the state is saved every `checkpoint_every` seconds and when the caller
//! asks to stop, and a run started again with the same inputs resumes from it (the corpus
//! seeks to where the pass stood: the windows before are neither cut nor run again).

use std::ops::ControlFlow;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use burn::tensor::Tensor;
use burnlens_data::{WindowIter, WindowPosition};
use burnlens_model::checkpoints::Checkpoints;

use crate::checkpoint::{Checkpoint, RunKey};
use crate::config::DashboardConfig;
use crate::dashboard::FeatureDashboard;
use crate::device_batch::{DeviceBatch, ScanPlace, SecondTargets, read_back};
use crate::error::DashboardError;
use crate::logits::logit_effects;
use crate::over_ranks::{merge_pass, scans_batch};
use crate::scan::Scan;
use crate::source::FeatureSource;
use crate::spill::Spill;
use burnlens_dist::Ranks;

/// How much to read and how.
pub struct RunSpec {
    pub cfg: DashboardConfig,
    /// Tokens to read (whole windows: rounded up to a window).
    pub tokens: u64,
    /// Windows per model pass.
    pub batch_windows: usize,
    /// Where the first pass may keep the encoders' inputs for the second, and the most bytes
    /// it may write there ([`crate::spill`]).
    pub spill: Option<(PathBuf, u64)>,
    /// The processes sharing the passes ([`crate::over_ranks`]); rank 0 gets the dashboards.
    pub ranks: Ranks,
    /// Where the passes read each batch; by the model's device when `None` (a GPU's batches
    /// stay on it: [`crate::device_batch`]).
    pub place: Option<ScanPlace>,
}

/// Where a resumable run keeps its state.
pub struct Resume {
    /// The run folder (its checkpoints in `checkpoints/`).
    pub out: PathBuf,
    /// What was asked for; a checkpoint of another run is refused.
    pub key: RunKey,
    pub every: Duration,
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
    /// Where a resumed run started: (pass, windows read in it).
    pub resumed: Option<(usize, u64)>,
    /// The caller asked to stop: the state is saved and `dashboards` is empty.
    pub stopped: bool,
}

/// Runs both passes; `windows()` must give the same windows each time it is called.
/// `control` hears each batch's progress and may stop the run (saving its checkpoint).
pub fn run<'w>(
    source: &FeatureSource,
    spec: &RunSpec,
    resume: Option<&Resume>,
    windows: &mut dyn FnMut() -> Result<WindowIter<'w>, DashboardError>,
    control: &mut dyn FnMut(&Progress) -> ControlFlow<()>,
) -> Result<Outcome, DashboardError> {
    let mut it = windows()?;
    let Some(first) = it.next().transpose()? else { return Err(DashboardError::Input("the corpus has no windows".into())) };
    let seq_len = first.len();
    let want = spec.tokens.div_ceil(seq_len as u64).max(1);
    let saved = match resume {
        Some(r) => Checkpoint::load(&r.out, &r.key)?,
        None => None,
    };
    let resumed = saved.as_ref().map(|c| (c.pass, c.done));
    let mut st = saved.unwrap_or_else(|| Checkpoint {
        key: resume.map(|r| r.key.clone()),
        pass: 1,
        done: 0,
        total: 0,
        ran_out: false,
        seq_len,
        seconds: [0.0; 2],
        position: WindowPosition::default(),
        scan: Scan::new(spec.cfg.clone(), source.features.clone(), seq_len),
    });
    let mut pending = Some(first);
    let mut saver = Saver { resume, last: Instant::now() };
    let widths = source.input_widths();
    let bytes = want * seq_len as u64 * widths.iter().sum::<usize>() as u64 * 4;
    let mut spill = open_spill(spec, resumed.is_none(), bytes)?;
    while st.pass <= 2 {
        if st.pass == 2 && pending.is_none() && st.done == 0 {
            it = windows()?;
        }
        // A resumed pass seeks to where it stood (the windows before are not cut again).
        if st.done > 0 {
            pending = None;
            it = windows()?;
            it.seek(&st.position)?;
        }
        let target = if st.pass == 1 { want } else { st.total };
        let mut io = Io { pending: &mut pending, it: &mut it, spill: spill.as_mut(), widths: &widths };
        if read_pass(source, spec, &mut st, target, &mut io, &mut saver, control)?.is_break() {
            return Ok(Outcome { dashboards: Vec::new(), tokens: 0, ran_out: false, seconds: [0.0; 3], state_bytes: 0, resumed, stopped: true });
        }
        merge_pass(&spec.ranks, &mut st.scan, st.pass)?;
        if st.pass == 1 {
            st.total = st.done;
            st.scan.start_second();
            if let Some(s) = spill.as_mut() {
                s.rewind()?;
            }
        }
        st.pass += 1;
        st.done = 0;
    }
    let logits_started = Instant::now();
    // Every rank holds the merged state; rank 0 makes the dashboards.
    let dashboards = if spec.ranks.is_writer() { finish(source, spec, &st)? } else { Vec::new() };
    if let Some(r) = resume {
        Checkpoints::of_run(&r.out).remove()?;
    }
    Ok(Outcome {
        dashboards,
        tokens: st.total * seq_len as u64,
        ran_out: st.ran_out,
        seconds: [st.seconds[0], st.seconds[1], logits_started.elapsed().as_secs_f64()],
        state_bytes: st.scan.state_bytes(),
        resumed,
        stopped: false,
    })
}

/// The spill file, when the run starts afresh and `bytes` fit its budget (else none, and a
/// stale one removed).
fn open_spill(spec: &RunSpec, fresh: bool, bytes: u64) -> Result<Option<Spill>, DashboardError> {
    Ok(match &spec.spill {
        Some((path, budget)) if fresh && bytes <= *budget => Some(Spill::create(path)?),
        Some((path, _)) => {
            let _ = std::fs::remove_file(path);
            None
        }
        None => None,
    })
}

/// Saves the checkpoint every so often, and when the run stops.
struct Saver<'r> {
    resume: Option<&'r Resume>,
    last: Instant,
}

impl Saver<'_> {
    fn tick(&mut self, st: &Checkpoint, stop: bool) -> Result<(), DashboardError> {
        if let Some(r) = self.resume
            && (stop || self.last.elapsed() >= r.every)
        {
            st.save(&r.out)?;
            self.last = Instant::now();
        }
        Ok(())
    }
}

/// Where a pass's windows and encoder inputs come from.
struct Io<'a, 'w> {
    /// A window read ahead (the first, read to learn the window length).
    pending: &'a mut Option<Vec<u32>>,
    it: &'a mut WindowIter<'w>,
    /// Pass 1 writes the inputs here, pass 2 reads them back.
    spill: Option<&'a mut Spill>,
    widths: &'a [usize],
}

/// The current pass, from window `st.done` to `target` (or the corpus's end in pass 1).
fn read_pass(
    source: &FeatureSource,
    spec: &RunSpec,
    st: &mut Checkpoint,
    target: u64,
    io: &mut Io,
    saver: &mut Saver,
    control: &mut dyn FnMut(&Progress) -> ControlFlow<()>,
) -> Result<ControlFlow<()>, DashboardError> {
    let started = Instant::now();
    let mut targets = None;
    let before = st.seconds[st.pass - 1];
    let want = if st.pass == 1 { target } else { st.total };
    while st.done < target {
        let take = (spec.batch_windows as u64).min(target - st.done) as usize;
        let mut batch: Vec<Vec<u32>> = io.pending.take().into_iter().collect();
        while batch.len() < take {
            match io.it.next().transpose()? {
                Some(w) => batch.push(w),
                None => break,
            }
        }
        let n = batch.len() as u64;
        if n > 0 && scans_batch(&spec.ranks, st.done, spec.batch_windows) {
            let inputs = match (st.pass, io.spill.as_deref_mut()) {
                (2, Some(s)) => s.read(batch.len() * st.seq_len, io.widths, &source.model.device())?,
                (_, spill) => {
                    let inputs = source.inputs(&batch)?;
                    if let Some(s) = spill {
                        s.write(&inputs)?;
                    }
                    inputs
                }
            };
            scan_batch(spec, st, source.encode(inputs), &batch, &mut targets)?;
        }
        st.done += n;
        st.position = io.it.cursor();
        if (n as usize) < take {
            if st.pass == 2 {
                return Err(DashboardError::Input(format!("the corpus gave {} windows on the second pass, {} on the first", st.done, st.total)));
            }
            st.ran_out = true;
            break;
        }
        st.seconds[st.pass - 1] = before + started.elapsed().as_secs_f64();
        let stop = control(&progress(st, want, st.seq_len)).is_break();
        // Every rank stops at the same batch, whichever was asked.
        let stop = spec.ranks.any(stop, "agreeing whether to stop")?;
        saver.tick(st, stop)?;
        if stop {
            return Ok(ControlFlow::Break(()));
        }
    }
    st.seconds[st.pass - 1] = before + started.elapsed().as_secs_f64();
    Ok(ControlFlow::Continue(()))
}

/// One batch's activations `acts` (of the windows `batch`) into the current pass: on the
/// device that computed them ([`crate::device_batch`]; the second pass's comparison targets
/// made at its first batch) or read back to the host.
fn scan_batch(spec: &RunSpec, st: &mut Checkpoint, acts: Tensor<2>, batch: &[Vec<u32>], targets: &mut Option<SecondTargets>) -> Result<(), DashboardError> {
    let device = acts.device();
    if spec.place.unwrap_or_else(|| ScanPlace::for_device(&device)) == ScanPlace::Device {
        let b = DeviceBatch::new(acts, batch, st.done, &spec.cfg);
        if st.pass == 1 {
            return st.scan.first_on_device(&b);
        }
        let t = targets.get_or_insert_with(|| st.scan.second_targets(&device));
        return st.scan.second_on_device(&b, t);
    }
    let mut b = read_back(acts, batch, st.done)?;
    b.mask(&spec.cfg);
    if st.pass == 1 {
        st.scan.first(&b)
    } else {
        st.scan.second(&b)
    }
    Ok(())
}

/// The logit effects, then every feature's dashboard.
fn finish(source: &FeatureSource, spec: &RunSpec, st: &Checkpoint) -> Result<Vec<FeatureDashboard>, DashboardError> {
    let dirs = source.resid_directions()?;
    let effects = logit_effects(dirs, source.model.w_u().0, spec.cfg.logit_rows, spec.cfg.n_bins, 256);
    let position: std::collections::HashMap<usize, usize> = source.features.iter().enumerate().map(|(i, &f)| (f, i)).collect();
    let mut dashboards = st.scan.finish(&mut |f| effects[position[&f]].clone());
    for d in &mut dashboards {
        let key = source.encoder.key(d.feature);
        (d.layer, d.feature) = (key.layer, key.index);
    }
    Ok(dashboards)
}

/// Progress over both passes (the second's length is the first's).
fn progress(st: &Checkpoint, want: u64, seq_len: usize) -> Progress {
    let per_pass = if st.pass == 1 { want } else { st.total };
    let done = if st.pass == 1 { st.done } else { st.total + st.done };
    let secs = (st.seconds[0] + st.seconds[1]).max(1e-9);
    let (tokens, of) = (done * seq_len as u64, 2 * per_pass * seq_len as u64);
    let rate = tokens as f64 / secs;
    Progress { pass: st.pass, tokens, of, tokens_per_s: rate, seconds_left: of.saturating_sub(tokens) as f64 / rate }
}
