//! What an MPI launcher tells the processes it starts, read from the environment: Open
//! MPI's `mpirun` sets `OMPI_COMM_WORLD_RANK` / `OMPI_COMM_WORLD_SIZE`, MPICH's Hydra
//! `mpiexec` sets `PMI_RANK` / `PMI_SIZE` (Slurm's `srun` too).

/// This process's place in a launched job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Launch {
    pub rank: usize,
    pub size: usize,
}

/// The launcher's rank and size for this process, if one started it.
pub fn launched() -> Option<Launch> {
    let var = |name: &str| std::env::var(name).ok().and_then(|v| v.trim().parse::<usize>().ok());
    let pair = |rank: &str, size: &str| Some(Launch { rank: var(rank)?, size: var(size)? });
    pair("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE").or_else(|| pair("PMI_RANK", "PMI_SIZE"))
}
