//! The stop handle: how a request to stop (SIGTERM/SIGINT) reaches code that
//! may take long, in the way mini-redis passes its shutdown signal. The
//! signal route calls [`Stop::request`]; a long step registers a wake-up
//! with [`Stop::on_request`] and ends early (killing what it started)
//! instead of letting the signal wait in a queue.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

type Waker = Box<dyn FnOnce() + Send>;

/// A long step ended early because a stop was requested.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("stopped on request")]
pub struct Stopped;

#[derive(Default)]
struct State {
    /// When the first request came.
    requested: Option<Instant>,
    wakers: Vec<Waker>,
}

/// A cloneable handle: every clone sees the same request.
#[derive(Clone, Default)]
pub struct Stop(Arc<Mutex<State>>);

impl std::fmt::Debug for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stop")
            .field("requested", &self.is_requested())
            .finish()
    }
}

impl Stop {
    /// Returns a handle with no stop requested.
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Requests a stop: wakes every registered waiter once. Later calls do
    /// nothing. Returns true if and only if this call made the request (a
    /// caller tells a repeated request from the first by it).
    pub fn request(&self) -> bool {
        let wakers = {
            let mut s = self.state();
            if s.requested.is_some() {
                return false;
            }
            s.requested = Some(Instant::now());
            std::mem::take(&mut s.wakers)
        };
        for w in wakers {
            w();
        }
        true
    }

    /// Returns true if and only if a stop was requested.
    pub fn is_requested(&self) -> bool {
        self.state().requested.is_some()
    }

    /// Returns when the stop was first requested, if it was (the stop
    /// budget counts from there, not from when the request was handled).
    pub fn requested_at(&self) -> Option<Instant> {
        self.state().requested
    }

    /// Calls `wake` when a stop is requested (at once if it already was).
    /// `wake` must not block: it typically sends on a channel.
    pub fn on_request(&self, wake: impl FnOnce() + Send + 'static) {
        let mut s = self.state();
        if s.requested.is_some() {
            drop(s);
            wake();
        } else {
            s.wakers.push(Box::new(wake));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn waiters_are_woken_once_before_or_after_the_request() {
        let stop = Stop::new();
        let (tx, rx) = mpsc::channel();
        let early = tx.clone();
        stop.on_request(move || early.send("early").unwrap());
        assert!(!stop.is_requested());
        assert_eq!(stop.requested_at(), None);
        assert!(rx.try_recv().is_err());
        stop.clone().request();
        let first = stop.requested_at().unwrap();
        stop.request();
        assert!(stop.is_requested());
        assert_eq!(
            stop.requested_at(),
            Some(first),
            "a later request keeps the first time"
        );
        let late = tx.clone();
        stop.on_request(move || late.send("late").unwrap());
        drop(tx);
        assert_eq!(rx.iter().collect::<Vec<_>>(), vec!["early", "late"]);
    }
}
