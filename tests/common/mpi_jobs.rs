//! Jobs of the `burnlens` binary over MPI ranks on loopback (MPICH's `mpiexec`): starting
//! them, finding their rank processes, waiting for them to end.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

use super::missing_prerequisite;

/// MPICH's launcher, the one the `mpi` build links against; `None` (a failure under CI)
/// when it or the feature is missing.
pub fn mpiexec() -> Option<PathBuf> {
    if !cfg!(feature = "mpi") {
        missing_prerequisite("burnlens built without the `mpi` feature (cargo xtask test builds it)");
        return None;
    }
    for name in ["mpiexec.mpich", "mpiexec"] {
        if let Ok(out) = Command::new(name).arg("--version").output()
            && out.status.success()
        {
            return Some(PathBuf::from(name));
        }
    }
    missing_prerequisite("MPICH's mpiexec (Debian: mpich; cargo xtask test installs it)");
    None
}

/// `burnlens ARGS` on `ranks` ranks (one plain process for 1).
pub fn launch(mpiexec: &Path, ranks: usize, args: &[String]) -> Command {
    let bin = env!("CARGO_BIN_EXE_burnlens");
    let mut cmd = if ranks == 1 {
        Command::new(bin)
    } else {
        let mut c = Command::new(mpiexec);
        c.args(["-n", &ranks.to_string(), bin]);
        c
    };
    cmd.args(args).env_remove("BURNLENS_BACKEND").env("RAYON_NUM_THREADS", "1");
    cmd
}

pub fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("start the job");
    assert!(out.status.success(), "{cmd:?} failed: {}\n{}", String::from_utf8_lossy(&out.stderr), String::from_utf8_lossy(&out.stdout));
    out
}

/// The rank processes of the job whose command line holds `needle`, indexed by rank (the
/// launcher's `PMI_RANK`).
pub fn rank_pids(needle: &str) -> Vec<u32> {
    let mut ranked: Vec<(usize, u32)> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let read = |what: &str| String::from_utf8_lossy(&std::fs::read(format!("/proc/{pid}/{what}")).unwrap_or_default()).into_owned();
            let cmdline = read("cmdline").replace('\0', " ");
            if !(cmdline.starts_with(env!("CARGO_BIN_EXE_burnlens")) && cmdline.contains(needle)) {
                return None;
            }
            let rank = read("environ").split('\0').find_map(|v| v.strip_prefix("PMI_RANK=")?.parse().ok())?;
            Some((rank, pid))
        })
        .collect();
    ranked.sort();
    ranked.into_iter().map(|(_, pid)| pid).collect()
}

/// Wait for the job to end, at most `limit`; what it printed.
pub fn wait_ended(child: Child, limit: Duration) -> Output {
    let start = Instant::now();
    let pid = child.id();
    let waiter = std::thread::spawn(move || child.wait_with_output().unwrap());
    while !waiter.is_finished() {
        if start.elapsed() > limit {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("the job did not end within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    waiter.join().unwrap()
}

/// Whether no rank process of the run is left, within 5 s: a rank the launcher kills (a
/// stopped one too) is torn down by the kernel after the launcher itself has exited, and
/// until then it is still listed (seen once in CI: the stopped rank listed as the job ended).
pub fn ranks_gone(needle: &str) -> bool {
    let start = Instant::now();
    while !rank_pids(needle).is_empty() {
        if start.elapsed() > Duration::from_secs(5) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    true
}
