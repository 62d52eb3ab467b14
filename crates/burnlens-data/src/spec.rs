//! Which dataset: a local path (a file or a folder of shards) or a Hub dataset id
//! `org/name[@revision][:split]`, fetched into the Hugging Face cache's dataset layout
//! (`datasets--org--name`) with the hash checks models get, or read offline from there.

use std::path::{Path, PathBuf};

use burnlens_hf::hub::{Hub, HubId, Progress};

use crate::error::{DataError, Result};
use crate::shards::{in_split, is_data_file, shard_files};

/// A dataset as the user names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DatasetSpec {
    /// A `.txt`, `.jsonl` or `.parquet` file, or a folder of them.
    Local(PathBuf),
    /// A Hub dataset repository, and the split whose files are read (all when `None`).
    Hub { id: HubId, split: Option<String> },
}

impl DatasetSpec {
    /// A path that exists is local; otherwise `org/name[@revision][:split]` is a Hub id.
    pub fn parse(s: &str) -> Result<Self> {
        if Path::new(s).exists() {
            return Ok(DatasetSpec::Local(PathBuf::from(s)));
        }
        let (id, split) = match s.rsplit_once(':') {
            Some((id, split)) if !split.is_empty() && !split.contains('/') => (id, Some(split.to_string())),
            _ => (s, None),
        };
        match HubId::parse(id) {
            Some(id) if id.repo.contains('/') => Ok(DatasetSpec::Hub { id: id.dataset(), split }),
            _ => Err(DataError::Spec { spec: s.into(), msg: "no such file or folder, and not a Hub dataset id (expected org/name[@revision][:split])".into() }),
        }
    }

    /// The data files to read, in order, downloading a Hub dataset's (those of its split)
    /// through `hub` (usually [`Hub::from_env`]) into its cache unless they are there or
    /// the hub is offline.
    pub fn files(&self, hub: &Hub, progress: &mut dyn FnMut(Progress)) -> Result<Vec<PathBuf>> {
        match self {
            DatasetSpec::Local(path) => shard_files(path, None),
            DatasetSpec::Hub { id, split } => {
                let hub_err = |e: burnlens_hf::HfError| DataError::Spec { spec: self.to_string(), msg: e.to_string() };
                let listed = hub.list_files(id).map_err(hub_err)?;
                let wanted: Vec<String> = listed.into_iter().filter(|f| is_data_file(Path::new(f)) && in_split(f, split.as_deref())).collect();
                if wanted.is_empty() {
                    return Err(DataError::Spec { spec: self.to_string(), msg: "has no .txt, .jsonl or .parquet files for that split".into() });
                }
                let snap = hub.fetch_files(id, &wanted, progress).map_err(hub_err)?;
                shard_files(&snap, split.as_deref())
            }
        }
    }
}

impl std::fmt::Display for DatasetSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DatasetSpec::Local(p) => write!(f, "{}", p.display()),
            DatasetSpec::Hub { id, split: Some(s) } => write!(f, "{id}:{s}"),
            DatasetSpec::Hub { id, split: None } => write!(f, "{id}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_ids_with_revision_and_split() {
        let DatasetSpec::Hub { id, split } = DatasetSpec::parse("NeelNanda/pile-10k@abc:train").unwrap() else { panic!() };
        assert_eq!((id.repo.as_str(), id.revision.as_str(), split.as_deref()), ("NeelNanda/pile-10k", "abc", Some("train")));
        assert_eq!(id.cache_name(), "datasets--NeelNanda--pile-10k");
        assert!(DatasetSpec::parse("no-such-file.txt").is_err());
    }
}
