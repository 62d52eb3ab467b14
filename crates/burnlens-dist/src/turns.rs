//! The order of a job's collectives: every rank must start them in the same order, so a
//! collective takes a ticket where the program asks for it (in program order, on the thread
//! that asks) and runs when its turn comes, whichever thread then runs it. A collective
//! started in the background ([`crate::Ranks::in_background`]) takes its ticket before
//! returning, so the ones asked for after it wait for it.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};

/// Tickets and the one being served.
#[derive(Default)]
pub(crate) struct Turns {
    next: AtomicU64,
    serving: Mutex<u64>,
    turned: Condvar,
}

thread_local! {
    /// Whether this thread is inside a turn (the collectives of a background operation share
    /// its one turn).
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

/// A turn held; the next ticket's turn comes when it is dropped.
pub(crate) struct Turn<'a> {
    turns: Option<&'a Turns>,
}

impl Turns {
    /// The next ticket, in the order the program asks.
    pub(crate) fn ticket(&self) -> u64 {
        self.next.fetch_add(1, Ordering::SeqCst)
    }

    /// Wait for `ticket`'s turn; this thread is inside it until the turn is dropped.
    pub(crate) fn wait(&self, ticket: u64) -> Turn<'_> {
        let mut serving = self.serving.lock().unwrap_or_else(|e| e.into_inner());
        while *serving != ticket {
            serving = self.turned.wait(serving).unwrap_or_else(|e| e.into_inner());
        }
        INSIDE.with(|i| i.set(true));
        Turn { turns: Some(self) }
    }

    /// A turn for a collective asked for now: a new ticket's, or none when this thread is
    /// already inside one.
    pub(crate) fn enter(&self) -> Turn<'_> {
        if INSIDE.with(|i| i.get()) { Turn { turns: None } } else { self.wait(self.ticket()) }
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        if let Some(t) = self.turns {
            INSIDE.with(|i| i.set(false));
            *t.serving.lock().unwrap_or_else(|e| e.into_inner()) += 1;
            t.turned.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn turns_come_in_ticket_order_whatever_thread_waits() {
        let turns = Arc::new(Turns::default());
        let log = Arc::new(Mutex::new(Vec::new()));
        // Tickets 0..8 taken here, waited for on threads started in reverse order.
        let tickets: Vec<u64> = (0..8).map(|_| turns.ticket()).collect();
        let handles: Vec<_> = tickets
            .into_iter()
            .rev()
            .map(|t| {
                let (turns, log) = (turns.clone(), log.clone());
                std::thread::spawn(move || {
                    let _turn = turns.wait(t);
                    // Inside a turn, a nested collective takes no ticket of its own.
                    let nested = turns.enter();
                    assert!(nested.turns.is_none());
                    log.lock().unwrap().push(t);
                })
            })
            .collect();
        handles.into_iter().for_each(|h| h.join().unwrap());
        assert_eq!(*log.lock().unwrap(), (0..8).collect::<Vec<u64>>());
        // And the next one asked for on this thread comes after them.
        let t = turns.enter();
        assert!(t.turns.is_some());
    }
}
