//! A run's state on disk, so that an interrupted run (Ctrl-C, or SIGKILL between two saves)
//! resumes: which pass it is in and how many windows that pass has read, and what was asked
//! for ([`RunKey`]: model, encoder, corpus, settings, typed), so that a different run is
//! never resumed from it, in `state.json`; the passes' per-feature state (top groups,
//! counters, histograms, reservoirs and their random states) in `scan.cbor`. In the format
//! of every long run ([`burnlens_model::checkpoints`]: `OUT/checkpoints/step-N/`, N the
//! windows read in both passes, written whole and renamed, `LATEST` after it); removed when
//! the run completes.

use std::path::{Path, PathBuf};

use burnlens_model::checkpoints::{Checkpoints, read_state};
use serde::{Deserialize, Serialize};

use burnlens_data::{CorpusOptions, WindowPosition};

use crate::config::DashboardConfig;
use crate::error::DashboardError;
use crate::scan::Scan;

/// What a run was asked for: a checkpoint resumes only the run that made it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunKey {
    /// Where the model and the encoder came from.
    pub model: String,
    pub encoder: String,
    pub corpus: CorpusOptions,
    pub seed: u64,
    pub tokens: u64,
    pub features: Option<String>,
    pub batch: usize,
    pub config: DashboardConfig,
}

impl RunKey {
    /// The fields whose values differ from `other`'s.
    fn differences(&self, other: &RunKey) -> Vec<&'static str> {
        let same = [
            ("model", self.model == other.model),
            ("encoder", self.encoder == other.encoder),
            ("corpus", self.corpus == other.corpus),
            ("seed", self.seed == other.seed),
            ("tokens", self.tokens == other.tokens),
            ("features", self.features == other.features),
            ("batch", self.batch == other.batch),
            ("settings", self.config == other.config),
        ];
        same.iter().filter(|(_, s)| !s).map(|(n, _)| *n).collect()
    }
}

/// Where a run stands besides its per-feature state: `state.json`.
#[derive(Serialize, Deserialize)]
struct State {
    key: Option<RunKey>,
    pass: usize,
    done: u64,
    total: u64,
    ran_out: bool,
    seq_len: usize,
    seconds: [f64; 2],
    position: WindowPosition,
}

const SCAN: &str = "scan.cbor";

pub struct Checkpoint {
    /// What the run was asked for (`None` for a run that is not resumable).
    pub key: Option<RunKey>,
    /// 1 or 2.
    pub pass: usize,
    /// Windows the current pass has read.
    pub done: u64,
    /// Windows the first pass read in all (known once it ended).
    pub total: u64,
    pub ran_out: bool,
    pub seq_len: usize,
    /// Seconds each pass ran before.
    pub seconds: [f64; 2],
    /// Where the corpus stood after the current pass's `done` windows (a resumed pass seeks
    /// there).
    pub position: WindowPosition,
    pub scan: Scan,
}

impl Checkpoint {
    /// Save into the run folder `out`'s checkpoints; returns the checkpoint's directory.
    pub fn save(&self, out: &Path) -> Result<PathBuf, DashboardError> {
        let state = State {
            key: self.key.clone(),
            pass: self.pass,
            done: self.done,
            total: self.total,
            ran_out: self.ran_out,
            seq_len: self.seq_len,
            seconds: self.seconds,
            position: self.position,
        };
        let read = if self.pass == 1 { self.done } else { self.total + self.done };
        Checkpoints::of_run(out).save(read, &state, |dir| -> Result<(), DashboardError> {
            Ok(burnlens_model::files::write_atomic_with(&dir.join(SCAN), |tmp| {
                let f = std::io::BufWriter::new(std::fs::File::create(tmp)?);
                ciborium::into_writer(&self.scan, f).map_err(std::io::Error::other)
            })?)
        })
    }

    /// The latest checkpoint of the run folder `out` if there is one; one made for another
    /// run is an error.
    pub fn load(out: &Path, key: &RunKey) -> Result<Option<Checkpoint>, DashboardError> {
        let older = out.join("checkpoint.cbor");
        if older.is_file() {
            return Err(DashboardError::Input(format!(
                "{}: a checkpoint of an older burnlens, which this one does not resume; remove it to start again",
                older.display()
            )));
        }
        let Some(dir) = Checkpoints::of_run(out).latest()? else { return Ok(None) };
        let s: State = read_state(&dir)?;
        let differ = s.key.as_ref().map_or(vec!["everything"], |k| k.differences(key));
        if !differ.is_empty() {
            return Err(DashboardError::Input(format!(
                "{}: a checkpoint of another run (its {} differ); remove it or choose another output folder",
                dir.display(),
                differ.join(", ")
            )));
        }
        let path = dir.join(SCAN);
        let f = std::io::BufReader::new(std::fs::File::open(&path).map_err(|e| DashboardError::io(&path, e))?);
        let scan: Scan = ciborium::from_reader(f)
            .map_err(|e| DashboardError::Input(format!("{}: not a dashboards checkpoint ({e}); remove it to start again", path.display())))?;
        Ok(Some(Checkpoint {
            key: s.key,
            pass: s.pass,
            done: s.done,
            total: s.total,
            ran_out: s.ran_out,
            seq_len: s.seq_len,
            seconds: s.seconds,
            position: s.position,
            scan,
        }))
    }
}
