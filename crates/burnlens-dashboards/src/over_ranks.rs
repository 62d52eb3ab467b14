//! The two passes over the ranks of an MPI job: every rank reads every window, but scans
//! only its share of the batches (batch i, of `batch_windows` windows, on rank i mod N); at
//! the end of each pass the ranks' states are gathered and merged in rank order, so every
//! rank holds the same state, that of one pass over all the windows: extremes, counts,
//! histograms and top groups exactly, quantile samples in distribution.

use burnlens_dist::Ranks;

use crate::error::DashboardError;
use crate::first_pass::FirstPass;
use crate::scan::Scan;
use crate::second_pass::SecondPass;

/// Whether this rank scans the batch that starts at window `first_window`.
pub fn scans_batch(ranks: &Ranks, first_window: u64, batch_windows: usize) -> bool {
    ranks.size() == 1 || (first_window / batch_windows.max(1) as u64) % ranks.size() as u64 == ranks.rank() as u64
}

/// Ends pass `pass` (1 or 2) over the ranks: `scan` becomes every rank's merged.
pub fn merge_pass(ranks: &Ranks, scan: &mut Scan, pass: usize) -> Result<(), DashboardError> {
    if ranks.size() == 1 {
        return Ok(());
    }
    let mut bytes = Vec::new();
    let written = match pass {
        1 => ciborium::into_writer(&(&scan.first, scan.positions[0]), &mut bytes),
        _ => ciborium::into_writer(&(&scan.second, scan.positions[1]), &mut bytes),
    };
    written.map_err(|e| DashboardError::Input(format!("the dashboards' state of pass {pass}: {e}")))?;
    let parts = ranks.all_gather_bytes(&bytes, &format!("gathering the dashboards' pass {pass}"))?;
    for (rank, part) in parts.iter().enumerate() {
        if pass == 1 {
            let (first, positions): (Vec<FirstPass>, u64) = ciborium::from_reader(part.as_slice()).map_err(|e| unreadable(pass, rank, e))?;
            if rank == 0 {
                (scan.first, scan.positions[0]) = (first, positions);
            } else {
                scan.merge_first(&first, positions);
            }
        } else {
            let (second, positions): (Vec<SecondPass>, u64) = ciborium::from_reader(part.as_slice()).map_err(|e| unreadable(pass, rank, e))?;
            if rank == 0 {
                (scan.second, scan.positions[1]) = (second, positions);
            } else {
                scan.merge_second(&second, positions);
            }
        }
    }
    Ok(())
}

fn unreadable(pass: usize, rank: usize, e: impl std::fmt::Display) -> DashboardError {
    DashboardError::Input(format!("the dashboards' state of pass {pass} from rank {rank}: {e}"))
}
