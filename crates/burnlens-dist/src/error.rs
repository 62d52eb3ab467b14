use thiserror::Error;

/// What can go wrong between ranks; every message names the rank it is about.
#[derive(Debug, Error)]
pub enum DistError {
    /// Started by a launcher as one of several ranks by a build that cannot talk to them.
    #[error(
        "started as rank {rank} of {size} by an MPI launcher, but this burnlens was built without the `mpi` feature (build it with `cargo build --release --features mpi`)"
    )]
    NoMpi { rank: usize, size: usize },
    /// A setting in the environment is malformed.
    #[error("{0}")]
    Setting(String),
    /// MPI could not be initialised.
    #[error("MPI could not be initialised (rank {rank} of {size} according to the launcher's environment)")]
    Init { rank: usize, size: usize },
    /// A collective got no answer in time; `silent` are the ranks that did not answer a
    /// direct probe afterwards (dead, killed or hung).
    #[error("rank {rank} of {size}: {what} did not complete within {seconds} s; {}; ending the job", silent_ranks(silent))]
    Unanswered { rank: usize, size: usize, what: String, seconds: u64, silent: Vec<usize> },
    /// Another rank failed before the collective work began, with this message.
    #[error("rank {peer} of {size}: {msg}")]
    Peer { peer: usize, size: usize, msg: String },
    /// Ranks that should hold equal values do not.
    #[error("rank {peer} of {size}: {what} differs from rank 0's")]
    Diverged { peer: usize, size: usize, what: String },
}

fn silent_ranks(silent: &[usize]) -> String {
    match silent {
        [] => "every rank answered a probe afterwards (one is too slow: raise BURNLENS_RANK_TIMEOUT)".into(),
        [one] => format!("rank {one} does not answer (died, was killed or hangs)"),
        many => format!("ranks {} do not answer (died, were killed or hang)", many.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(", ")),
    }
}
