//! One job over several processes: the ranks an MPI launcher (`mpirun -n N`) started, the
//! collectives data-parallel work needs (sum, all-gather, agreement), each guarded by a
//! watchdog so that a rank that died or hangs ends the job with an error naming it instead
//! of a hang, and the rows of a batch each rank takes. Collectives keep the order the program
//! asks for them in, whichever thread runs them, so that some can run in the background.
//!
//! Without the `mpi` feature (the default build), or when not started by a launcher, a
//! [`Ranks`] is the one process and every collective is the identity.

mod error;
mod launcher;
#[cfg(feature = "mpi")]
mod mpi_group;
mod ranks;
mod shard;
#[cfg(feature = "mpi")]
mod turns;

pub use error::DistError;
pub use launcher::{Launch, launched};
pub use ranks::{BUCKET, Pending, Ranks, Timeout};
pub use shard::shard;
