//! One checkpoint format for every long run (training a model, training SAEs and transcoders,
//! dashboards): a directory per checkpoint, written whole into a temporary directory, each
//! file synced, renamed into place, and `LATEST` replaced atomically after that, so a crash at
//! any moment (SIGKILL included) leaves the previous complete checkpoint loadable; the two
//! newest are kept.
//!
//! ```text
//! RUN_DIR/checkpoints/step-000500/state.json   the run's state, a typed struct as JSON
//! RUN_DIR/checkpoints/step-000500/...          the run's tensors, in files it names
//! RUN_DIR/checkpoints/LATEST                   the name of the newest complete checkpoint
//! ```

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::files::{FileError, write_atomic};

/// Every checkpoint's state file.
pub const STATE: &str = "state.json";
const LATEST: &str = "LATEST";
/// How many complete checkpoints a run keeps.
const KEEP: usize = 2;

/// A run directory's checkpoints.
#[derive(Debug, Clone)]
pub struct Checkpoints {
    root: PathBuf,
}

fn io_at(path: &Path) -> impl FnOnce(std::io::Error) -> FileError + '_ {
    move |source| FileError { path: path.to_path_buf(), source }
}

fn invalid(path: &Path, msg: String) -> FileError {
    FileError { path: path.to_path_buf(), source: std::io::Error::new(std::io::ErrorKind::InvalidData, msg) }
}

impl Checkpoints {
    /// The checkpoints of the run in `run_dir` (`run_dir/checkpoints`).
    pub fn of_run(run_dir: &Path) -> Self {
        Checkpoints { root: run_dir.join("checkpoints") }
    }

    /// `run_dir/checkpoints`.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `run_dir/checkpoints/LATEST`, which exists once a checkpoint is complete.
    pub fn latest_file(&self) -> PathBuf {
        self.root.join(LATEST)
    }

    /// Where the checkpoint of `step` is (or will be).
    pub fn dir(&self, step: u64) -> PathBuf {
        self.root.join(format!("step-{step:06}"))
    }

    /// The newest complete checkpoint, if any: the one `LATEST` names, or, where a crash
    /// came between replacing a checkpoint of the same step and renaming its successor into
    /// place, the newest complete one there is. A `LATEST` with no complete checkpoint at all
    /// is an error naming it.
    pub fn latest(&self) -> Result<Option<PathBuf>, FileError> {
        let latest = self.latest_file();
        match std::fs::read_to_string(&latest) {
            Ok(name) => {
                let dir = self.root.join(name.trim());
                if dir.join(STATE).is_file() {
                    return Ok(Some(dir));
                }
                let newest = self.steps()?.into_iter().rev().find(|d| d.join(STATE).is_file());
                newest.map(Some).ok_or_else(|| invalid(&latest, format!("names {}, which is not a complete checkpoint, and there is none", dir.display())))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_at(&latest)(e)),
        }
    }

    /// The `step-*` directories, oldest first.
    fn steps(&self) -> Result<Vec<PathBuf>, FileError> {
        let mut steps: Vec<PathBuf> = std::fs::read_dir(&self.root)
            .map_err(io_at(&self.root))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("step-")))
            .collect();
        steps.sort();
        Ok(steps)
    }

    /// Write the checkpoint of `step`: `state` as [`STATE`], then `files` writes the run's
    /// own files into the (temporary) directory it is given. Returns the checkpoint's
    /// directory once it and `LATEST` are in place.
    pub fn save<S: Serialize, E: From<FileError>>(&self, step: u64, state: &S, files: impl FnOnce(&Path) -> Result<(), E>) -> Result<PathBuf, E> {
        let dir = self.dir(step);
        let name = dir.file_name().expect("a step directory").to_string_lossy().to_string();
        let tmp = self.root.join(format!(".tmp-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).map_err(io_at(&tmp))?;
        let written = write_atomic(&tmp.join(STATE), serde_json::to_string_pretty(state).expect("a checkpoint's state serialises").as_bytes())
            .map_err(E::from)
            .and_then(|_| files(&tmp))
            .and_then(|_| Ok(sync_files(&tmp)?));
        if let Err(e) = written {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(e);
        }
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::rename(&tmp, &dir).map_err(io_at(&dir))?;
        write_atomic(&self.latest_file(), name.as_bytes())?;
        self.prune(&dir)?;
        Ok(dir)
    }

    /// Remove all but the [`KEEP`] newest checkpoints (never `current`).
    fn prune(&self, current: &Path) -> Result<(), FileError> {
        let old = self.steps()?;
        let keep = old.len().saturating_sub(KEEP);
        for p in old[..keep].iter().filter(|p| *p != current) {
            let _ = std::fs::remove_dir_all(p);
        }
        Ok(())
    }

    /// Remove every checkpoint (a run that finished and needs none).
    pub fn remove(&self) -> Result<(), FileError> {
        match std::fs::remove_dir_all(&self.root) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io_at(&self.root)(e)),
            _ => Ok(()),
        }
    }
}

/// The state of the checkpoint in `dir`; a state of another shape is an error naming the
/// file and the field.
pub fn read_state<S: DeserializeOwned>(dir: &Path) -> Result<S, FileError> {
    let path = dir.join(STATE);
    let text = std::fs::read_to_string(&path).map_err(io_at(&path))?;
    serde_json::from_str(&text).map_err(|e| invalid(&path, format!("not this run's checkpoint state: {e}")))
}

/// Sync every file of `dir` (not recursive: a checkpoint's files lie flat).
fn sync_files(dir: &Path) -> Result<(), FileError> {
    for e in std::fs::read_dir(dir).map_err(io_at(dir))?.flatten() {
        let p = e.path();
        if p.is_file() {
            std::fs::File::open(&p).and_then(|f| f.sync_all()).map_err(io_at(&p))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, Serialize, serde::Deserialize)]
    struct State {
        step: u64,
        note: String,
    }

    #[test]
    fn checkpoints_are_complete_or_absent_and_two_are_kept() {
        let tmp = std::env::temp_dir().join(format!("burnlens-checkpoints-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        let c = Checkpoints::of_run(&tmp);
        assert_eq!(c.latest().unwrap(), None);
        for step in 1..=3u64 {
            let state = State { step, note: "n".into() };
            let dir = c
                .save(step, &state, |d: &Path| -> Result<(), FileError> {
                    std::fs::write(d.join("weights.bin"), [step as u8]).map_err(io_at(&d.join("weights.bin")))
                })
                .unwrap();
            assert_eq!(c.latest().unwrap(), Some(dir.clone()));
            assert_eq!(read_state::<State>(&dir).unwrap(), state);
            assert_eq!(std::fs::read(dir.join("weights.bin")).unwrap(), vec![step as u8]);
        }
        assert!(!c.dir(1).exists() && c.dir(2).exists() && c.dir(3).exists(), "the two newest are kept");
        // A writer that fails leaves the last complete checkpoint in place.
        let failed = c.save(4, &State { step: 4, note: String::new() }, |d: &Path| Err(invalid(d, "disk full".into())));
        assert!(failed.is_err() && c.latest().unwrap() == Some(c.dir(3)));
        assert_eq!(std::fs::read_dir(c.latest_file().parent().unwrap()).unwrap().count(), 3, "no temporary directory is left");
        let wrong = read_state::<Vec<u8>>(&c.dir(3)).unwrap_err().to_string();
        assert!(wrong.contains("state.json") && wrong.contains("not this run's checkpoint state"), "{wrong}");
        // A crash between removing a checkpoint of the same step and renaming its successor
        // leaves LATEST naming nothing: the newest complete one is taken.
        std::fs::remove_dir_all(c.dir(3)).unwrap();
        assert_eq!(c.latest().unwrap(), Some(c.dir(2)));
        std::fs::remove_dir_all(c.dir(2)).unwrap();
        assert!(c.latest().unwrap_err().to_string().contains("not a complete checkpoint"));
        c.remove().unwrap();
        assert!(c.latest().unwrap().is_none());
        let _ = std::fs::remove_dir_all(&tmp);
    }
}
