//! The benchmark drivers, one a file: each runs burnlens and its peers in the same run on
//! this machine and prints (and writes under `target/bench`) the table with the ratios.

pub(crate) mod bf16;
pub(crate) mod dashboards;
pub(crate) mod model;
pub(crate) mod mpi;
pub(crate) mod python;
pub(crate) mod sae;
pub(crate) mod scale;
pub(crate) mod trace;
pub(crate) mod train;
