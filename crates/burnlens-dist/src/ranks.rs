//! [`Ranks`]: this process's place in the job and the collectives over all of them.

use std::fmt;
use std::ops::Range;
#[cfg(feature = "mpi")]
use std::sync::Arc;
use std::time::Duration;

use crate::error::DistError;
use crate::launcher::launched;
#[cfg(feature = "mpi")]
use crate::mpi_group::MpiGroup;

/// How long a collective may wait for the other ranks before the job is ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeout(pub Duration);

impl Timeout {
    /// The environment variable that sets it, in seconds.
    pub const ENV: &'static str = "BURNLENS_RANK_TIMEOUT";
    /// Without the variable: longer than any step, evaluation or checkpoint of the models
    /// burnlens trains on a CPU, short enough that a lost rank does not hold hosts for long.
    pub const DEFAULT: Duration = Duration::from_secs(300);

    /// [`Timeout::ENV`] if set to a positive number of seconds, else [`Timeout::DEFAULT`].
    pub fn from_env() -> Result<Self, String> {
        match std::env::var(Self::ENV) {
            Err(_) => Ok(Timeout(Self::DEFAULT)),
            Ok(v) => match v.trim().parse::<f64>() {
                Ok(s) if s > 0.0 && s.is_finite() => Ok(Timeout(Duration::from_secs_f64(s))),
                _ => Err(format!("{}={v:?}: expected a positive number of seconds", Self::ENV)),
            },
        }
    }
}

/// The processes of one job: rank `rank()` of `size()`. Cloning shares the group; the
/// group ends (`MPI_Finalize`) when the last clone is dropped.
#[derive(Clone)]
pub struct Ranks {
    #[cfg(feature = "mpi")]
    group: Option<Arc<MpiGroup>>,
    timeout: Duration,
}

impl Default for Ranks {
    fn default() -> Self {
        Ranks::single()
    }
}

impl fmt::Debug for Ranks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Ranks(rank {} of {})", self.rank(), self.size())
    }
}

impl Ranks {
    /// This process alone.
    pub fn single() -> Self {
        Ranks {
            #[cfg(feature = "mpi")]
            group: None,
            timeout: Timeout::DEFAULT,
        }
    }

    /// The job an MPI launcher started this process in (MPI initialised here), or this
    /// process alone when no launcher started it. An error when a launcher started several
    /// ranks and this build has no MPI, or [`Timeout::ENV`] is malformed.
    pub fn from_launcher() -> Result<Self, DistError> {
        let Some(launch) = launched() else { return Ok(Ranks::single()) };
        let timeout = Timeout::from_env().map_err(DistError::Setting)?.0;
        #[cfg(feature = "mpi")]
        {
            let group = MpiGroup::init(launch)?;
            Ok(Ranks { group: Some(Arc::new(group)), timeout })
        }
        #[cfg(not(feature = "mpi"))]
        {
            let _ = timeout;
            if launch.size > 1 { Err(DistError::NoMpi { rank: launch.rank, size: launch.size }) } else { Ok(Ranks::single()) }
        }
    }

    /// This process's rank, 0 to `size() - 1`.
    pub fn rank(&self) -> usize {
        #[cfg(feature = "mpi")]
        if let Some(g) = &self.group {
            return g.rank;
        }
        0
    }

    /// How many ranks the job has.
    pub fn size(&self) -> usize {
        #[cfg(feature = "mpi")]
        if let Some(g) = &self.group {
            return g.size;
        }
        1
    }

    /// Whether this rank writes the job's files (rank 0).
    pub fn is_writer(&self) -> bool {
        self.rank() == 0
    }

    /// The rows of a `rows`-row batch this rank takes ([`crate::shard`]).
    pub fn rows(&self, rows: usize) -> Range<usize> {
        crate::shard(rows, self.rank(), self.size())
    }

    /// The collectives' time limit.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Element-wise sum over ranks, in place, in buckets of [`BUCKET`] elements.
    pub fn sum_f32(&self, buf: &mut [f32], what: &str) -> Result<(), DistError> {
        #[cfg(feature = "mpi")]
        if let Some(g) = self.group.as_ref().filter(|g| g.size > 1) {
            for chunk in buf.chunks_mut(BUCKET) {
                g.ring_sum(chunk, what, self.timeout)?;
            }
        }
        let _ = (buf, what);
        Ok(())
    }

    /// Rank 0's `buf` on every rank, in buckets of [`BUCKET`] elements.
    pub fn broadcast_f32(&self, buf: &mut [f32], what: &str) -> Result<(), DistError> {
        #[cfg(feature = "mpi")]
        if let Some(g) = self.group.as_ref().filter(|g| g.size > 1) {
            for chunk in buf.chunks_mut(BUCKET) {
                g.broadcast(chunk, what, self.timeout)?;
            }
        }
        let _ = (buf, what);
        Ok(())
    }

    /// Element-wise sum over ranks of a few f64 values (losses, counts), in place.
    pub fn sum_f64(&self, buf: &mut [f64], what: &str) -> Result<(), DistError> {
        #[cfg(feature = "mpi")]
        if let Some(g) = self.group.as_ref().filter(|g| g.size > 1) {
            return g.sum(buf, what, self.timeout);
        }
        let _ = (buf, what);
        Ok(())
    }

    /// Whether any rank says yes (a stop asked for on one rank stops all at the same step).
    pub fn any(&self, yes: bool, what: &str) -> Result<bool, DistError> {
        let mut v = [f64::from(u8::from(yes))];
        self.sum_f64(&mut v, what)?;
        Ok(v[0] > 0.0)
    }

    /// Every rank's `local` outcome, shared: `Ok` when all succeeded, else the first failed
    /// peer's message (a rank that failed itself reports its own error, not this).
    pub fn agree(&self, local: Result<(), String>) -> Result<(), DistError> {
        #[cfg(feature = "mpi")]
        if let Some(g) = self.group.as_ref().filter(|g| g.size > 1) {
            const LEN: usize = 1024;
            let mut mine = vec![0u8; LEN];
            if let Err(msg) = &local {
                mine[0] = 1;
                let bytes = msg.as_bytes();
                let n = bytes.len().min(LEN - 1);
                mine[1..1 + n].copy_from_slice(&bytes[..n]);
            }
            let all = g.gather(&mine, "sharing whether every rank is ready", self.timeout)?;
            for (peer, m) in all.chunks(LEN).enumerate() {
                if m[0] == 1 && peer != g.rank {
                    let text = String::from_utf8_lossy(&m[1..]).trim_end_matches('\0').to_string();
                    return Err(DistError::Peer { peer, size: g.size, msg: text });
                }
            }
        }
        let _ = local;
        Ok(())
    }

    /// Every rank's `mine` (of any length), in rank order; each rank's part at most 2 GiB.
    pub fn all_gather_bytes(&self, mine: &[u8], what: &str) -> Result<Vec<Vec<u8>>, DistError> {
        #[cfg(feature = "mpi")]
        if let Some(g) = self.group.as_ref().filter(|g| g.size > 1) {
            let lens = g.gather(&(mine.len() as u64).to_le_bytes(), what, self.timeout)?;
            let lens: Vec<usize> = lens.chunks(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")) as usize).collect();
            let longest = lens.iter().copied().max().unwrap_or(0).max(1);
            if longest > i32::MAX as usize {
                return Err(DistError::Peer { peer: g.rank, size: g.size, msg: format!("{what}: {longest} bytes from one rank, more than MPI's 2 GiB") });
            }
            let mut padded = mine.to_vec();
            padded.resize(longest, 0);
            let all = g.gather(&padded, what, self.timeout)?;
            return Ok(all.chunks(longest).zip(lens).map(|(c, n)| c[..n].to_vec()).collect());
        }
        let _ = what;
        Ok(vec![mine.to_vec()])
    }

    /// Every rank's `mine` (of any length) of f32 values, in rank order.
    pub fn all_gather_f32(&self, mine: &[f32], what: &str) -> Result<Vec<Vec<f32>>, DistError> {
        let bytes: Vec<u8> = mine.iter().flat_map(|x| x.to_le_bytes()).collect();
        let all = self.all_gather_bytes(&bytes, what)?;
        Ok(all.iter().map(|b| b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes"))).collect()).collect())
    }

    /// Every rank's `mine` (of any length) of f64 values, in rank order.
    pub fn all_gather_f64(&self, mine: &[f64], what: &str) -> Result<Vec<Vec<f64>>, DistError> {
        let bytes: Vec<u8> = mine.iter().flat_map(|x| x.to_le_bytes()).collect();
        let all = self.all_gather_bytes(&bytes, what)?;
        Ok(all.iter().map(|b| b.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes"))).collect()).collect())
    }

    /// Check that every rank holds the same `digest` of `what` (parameters, say).
    pub fn check_equal(&self, digest: &[u8; 32], what: &str) -> Result<(), DistError> {
        #[cfg(feature = "mpi")]
        if let Some(g) = self.group.as_ref().filter(|g| g.size > 1) {
            let all = g.gather(digest, &format!("comparing {what}"), self.timeout)?;
            if let Some(peer) = all.chunks(32).position(|d| d != &all[..32]) {
                return Err(DistError::Diverged { peer, size: g.size, what: what.to_string() });
            }
        }
        let _ = (digest, what);
        Ok(())
    }

    /// Run `op` (collectives on the ranks it is given) on a thread of its own while this one
    /// goes on; its place in the order of the job's collectives is taken now, so collectives
    /// asked for after this call run after it. [`Pending::wait`] gives its result. Alone,
    /// `op` runs here and now.
    pub fn in_background<T: Send + 'static>(&self, op: impl FnOnce(&Ranks) -> Result<T, DistError> + Send + 'static) -> Pending<T> {
        #[cfg(feature = "mpi")]
        if let Some(g) = self.group.as_ref().filter(|g| g.size > 1) {
            let ticket = g.turns.ticket();
            let ranks = self.clone();
            let group = g.clone();
            return Pending(PendingState::Running(std::thread::spawn(move || {
                let _turn = group.turns.wait(ticket);
                op(&ranks)
            })));
        }
        Pending(PendingState::Done(op(self)))
    }

    /// End the whole job with `code` (`MPI_Abort` on every rank; the process alone exits).
    pub fn abort(&self, code: i32) -> ! {
        #[cfg(feature = "mpi")]
        if let Some(g) = &self.group {
            g.abort(code)
        }
        std::process::exit(code)
    }
}

/// Collectives running in the background ([`Ranks::in_background`]).
pub struct Pending<T>(PendingState<T>);

enum PendingState<T> {
    Done(Result<T, DistError>),
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    Running(std::thread::JoinHandle<Result<T, DistError>>),
}

impl<T> Pending<T> {
    /// Wait for the collectives to end; their result.
    pub fn wait(self) -> Result<T, DistError> {
        match self.0 {
            PendingState::Done(r) => r,
            PendingState::Running(h) => h.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
        }
    }
}

/// Elements per all-reduce: large enough for the network's bandwidth, small enough that
/// the copy each one sends from stays in cache-sized pieces (16 MB).
pub const BUCKET: usize = 1 << 22;
