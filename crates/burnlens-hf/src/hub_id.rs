//! A repository on the Hub by id (`org/name[@revision]`), of a model or a dataset.

/// A repository on the Hub and the revision (branch, tag or commit) asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubId {
    /// `org/name`, or a bare `name` for the old top-level models (`gpt2`).
    pub repo: String,
    pub revision: String,
    pub kind: RepoKind,
}

/// Which of the Hub's repository types an id names: its API path, download path and cache
/// folder differ (`models--org--name`, `datasets--org--name`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RepoKind {
    #[default]
    Model,
    Dataset,
}

impl RepoKind {
    /// The plural the API and the cache use (`models`, `datasets`).
    pub(crate) fn plural(self) -> &'static str {
        match self {
            RepoKind::Model => "models",
            RepoKind::Dataset => "datasets",
        }
    }
}

impl HubId {
    /// Parse `org/name@revision` (revision default `main`); `None` if `s` cannot be a Hub id.
    pub fn parse(s: &str) -> Option<Self> {
        let (repo, revision) = match s.split_once('@') {
            Some((r, rev)) if !rev.is_empty() => (r, rev),
            Some(_) => return None,
            None => (s, "main"),
        };
        let ok_part =
            |p: &str| !p.is_empty() && p.len() <= 96 && !p.starts_with(['.', '-']) && p.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
        let parts: Vec<&str> = repo.split('/').collect();
        if parts.len() > 2 || !parts.iter().all(|p| ok_part(p)) || repo.contains("..") {
            return None;
        }
        if revision.contains("..") || !revision.chars().all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c)) {
            return None;
        }
        Some(HubId { repo: repo.to_string(), revision: revision.to_string(), kind: RepoKind::Model })
    }

    /// The same id read as a dataset repository.
    pub fn dataset(self) -> Self {
        HubId { kind: RepoKind::Dataset, ..self }
    }

    /// The cache folder name: `models--org--name` (or `datasets--org--name`).
    pub fn cache_name(&self) -> String {
        format!("{}--{}", self.kind.plural(), self.repo.replace('/', "--"))
    }

    pub(crate) fn is_commit(&self) -> bool {
        self.revision.len() == 40 && self.revision.chars().all(|c| c.is_ascii_hexdigit())
    }
}

impl std::fmt::Display for HubId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.revision == "main" { write!(f, "{}", self.repo) } else { write!(f, "{}@{}", self.repo, self.revision) }
    }
}
