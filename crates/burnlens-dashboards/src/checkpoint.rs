//! A run's state on disk, so that an interrupted run (Ctrl-C, or SIGKILL between two saves)
//! resumes: the passes' per-feature state (top groups, counters, histograms, reservoirs and
//! their random states), which pass it is in and how many windows that pass has read, and
//! what was asked for ([`RunKey`]: model, encoder, corpus, settings, typed), so that a
//! different run is never resumed from it. CBOR, written atomically; removed when the run
//! completes.

use std::path::Path;

use serde::{Deserialize, Serialize};

use burnlens_data::CorpusOptions;

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

#[derive(Serialize, Deserialize)]
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
    pub scan: Scan,
}

impl Checkpoint {
    pub fn save(&self, path: &Path) -> Result<(), DashboardError> {
        Ok(burnlens_model::files::write_atomic_with(path, |tmp| {
            let f = std::io::BufWriter::new(std::fs::File::create(tmp)?);
            ciborium::into_writer(self, f).map_err(std::io::Error::other)
        })?)
    }

    /// The checkpoint at `path` if there is one; one made for another run is an error.
    pub fn load(path: &Path, key: &RunKey) -> Result<Option<Checkpoint>, DashboardError> {
        if !path.is_file() {
            return Ok(None);
        }
        let f = std::io::BufReader::new(std::fs::File::open(path).map_err(|e| DashboardError::io(path, e))?);
        let c: Checkpoint = ciborium::from_reader(f)
            .map_err(|e| DashboardError::Input(format!("{}: not a dashboards checkpoint ({e}); remove it to start again", path.display())))?;
        let differ = c.key.as_ref().map_or(vec!["everything"], |k| k.differences(key));
        if !differ.is_empty() {
            return Err(DashboardError::Input(format!(
                "{}: a checkpoint of another run (its {} differ); remove it or choose another output folder",
                path.display(),
                differ.join(", ")
            )));
        }
        Ok(Some(c))
    }
}
