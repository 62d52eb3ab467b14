//! A run's state on disk, so that an interrupted run (Ctrl-C, or SIGKILL between two saves)
//! resumes: the passes' per-feature state (top groups, counters, histograms, reservoirs and
//! their random states), which pass it is in and how many windows that pass has read, and a
//! fingerprint of what was asked for (model, encoder, corpus, settings), so that a different
//! run is never resumed from it. CBOR, written atomically; removed when the run completes.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::DashboardError;
use crate::scan::Scan;

#[derive(Serialize, Deserialize)]
pub struct Checkpoint {
    pub fingerprint: String,
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
    pub fn load(path: &Path, fingerprint: &str) -> Result<Option<Checkpoint>, DashboardError> {
        if !path.is_file() {
            return Ok(None);
        }
        let f = std::io::BufReader::new(std::fs::File::open(path).map_err(|e| DashboardError::io(path, e))?);
        let c: Checkpoint = ciborium::from_reader(f)
            .map_err(|e| DashboardError::Input(format!("{}: not a dashboards checkpoint ({e}); remove it to start again", path.display())))?;
        if c.fingerprint != fingerprint {
            return Err(DashboardError::Input(format!(
                "{}: a checkpoint of another run ({}); remove it or choose another output folder",
                path.display(),
                c.fingerprint
            )));
        }
        Ok(Some(c))
    }
}
