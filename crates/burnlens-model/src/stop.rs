//! The stop flag every long run checks between steps (training, SAE training, dashboards,
//! activation caches): set by Ctrl-C / SIGTERM or by [`request_stop`], taken by the loop
//! that then checkpoints and stops. One process-wide flag, in the crate every other uses.

use std::sync::atomic::{AtomicBool, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);

/// Ask a running loop to checkpoint and stop at its next step (what Ctrl-C does).
pub fn request_stop() {
    STOP.store(true, Ordering::SeqCst);
}

/// Whether a stop was asked for since the last call (Ctrl-C, or [`request_stop`]).
pub fn stop_requested() -> bool {
    STOP.swap(false, Ordering::SeqCst)
}

/// Install the Ctrl-C / SIGTERM handler that calls [`request_stop`]. Safe to call twice.
pub fn install_interrupt_handler() {
    let _ = ctrlc::set_handler(request_stop);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_taken_once() {
        request_stop();
        assert!(stop_requested());
        assert!(!stop_requested());
    }
}
