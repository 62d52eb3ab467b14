//! What can go wrong making dashboards, each a one-line message naming what was wrong.

#[derive(Debug, thiserror::Error)]
pub enum DashboardError {
    #[error("{0}")]
    Input(String),
    #[error(transparent)]
    Pass(#[from] burnlens_lens::hook_pass::PassError),
    #[error(transparent)]
    Sae(#[from] burnlens_lens::sae::SaeError),
    #[error(transparent)]
    Data(#[from] burnlens_data::DataError),
    #[error("{path}: {msg}")]
    Io { path: std::path::PathBuf, msg: String },
    #[error(transparent)]
    Ranks(#[from] burnlens_dist::DistError),
    #[error("interrupted; the state is in {0} and the same command resumes")]
    Interrupted(std::path::PathBuf),
}

impl DashboardError {
    /// Whether the input was at fault (rather than the machine, writing files).
    pub fn is_user_error(&self) -> bool {
        match self {
            DashboardError::Io { .. } | DashboardError::Interrupted(_) => false,
            DashboardError::Ranks(e) => {
                matches!(e, burnlens_dist::DistError::Peer { .. } | burnlens_dist::DistError::NoMpi { .. } | burnlens_dist::DistError::Setting(_))
            }
            _ => true,
        }
    }

    pub fn io(path: &std::path::Path, e: impl std::fmt::Display) -> Self {
        DashboardError::Io { path: path.to_path_buf(), msg: e.to_string() }
    }
}

impl From<burnlens_model::files::FileError> for DashboardError {
    fn from(e: burnlens_model::files::FileError) -> Self {
        DashboardError::io(&e.path, e.source)
    }
}
