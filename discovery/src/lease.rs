//! Liveness by observation (R-WRK-5), after client-go's leader election:
//! the head is alive while the record's bytes have changed within the TTL,
//! measured on this machine's monotonic clock. Wall-clock fields in the
//! record are never compared for liveness, so skew between machines does
//! not matter. The clock is passed in, so tests inject it.

use std::time::{Duration, Instant};

#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    Nothing,
    Missing,
    Bytes(Vec<u8>),
}

/// Tracks the last observed bytes of the record and when they changed.
#[derive(Debug, Clone)]
pub struct Lease {
    seen: Seen,
    /// When the bytes last changed (a real change, not the first look).
    changed_at: Option<Instant>,
    /// When the current bytes were first seen (change or first look).
    since: Instant,
}

impl Lease {
    /// Creates a tracker that has seen nothing yet.
    pub fn new(now: Instant) -> Self {
        Self {
            seen: Seen::Nothing,
            changed_at: None,
            since: now,
        }
    }

    /// Records the bytes read at `now`; returns true if and only if they
    /// differ from the last observation (a first look is not a change:
    /// a leftover file from a dead head must not look alive).
    pub fn observe(&mut self, raw: &[u8], now: Instant) -> bool {
        match &self.seen {
            Seen::Bytes(b) if b.as_slice() == raw => false,
            Seen::Nothing => {
                self.seen = Seen::Bytes(raw.to_vec());
                self.since = now;
                false
            }
            _ => {
                self.seen = Seen::Bytes(raw.to_vec());
                self.changed_at = Some(now);
                self.since = now;
                true
            }
        }
    }

    /// Records that the file was missing at `now`.
    pub fn observe_missing(&mut self, now: Instant) {
        if self.seen != Seen::Missing {
            self.seen = Seen::Missing;
            self.since = now;
        }
    }

    /// Returns true if and only if the bytes changed less than `ttl` ago.
    pub fn is_fresh(&self, ttl: Duration, now: Instant) -> bool {
        self.changed_at
            .is_some_and(|t| now.saturating_duration_since(t) < ttl)
    }

    /// Returns how long the current observation has stood unchanged.
    pub fn unchanged_for(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.since)
    }

    /// Returns when the bytes last changed, if ever.
    pub fn changed_at(&self) -> Option<Instant> {
        self.changed_at
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::rfc3339;
    use crate::record::tests::sample;
    use std::time::SystemTime;

    const TTL: Duration = Duration::from_secs(60);

    /// A head publishing every 10 s with its wall clock `skew` away from ours.
    fn bytes_at(seq: u64, skew_s: i64) -> Vec<u8> {
        let base = SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_000_000);
        let t = if skew_s >= 0 {
            base + Duration::from_secs(skew_s as u64 + seq * 10)
        } else {
            base - Duration::from_secs((-skew_s) as u64) + Duration::from_secs(seq * 10)
        };
        let mut r = sample();
        r.seq = seq;
        r.updated_at = rfc3339(t);
        r.expires_at = rfc3339(t + TTL);
        r.to_bytes()
    }

    #[test]
    fn first_look_is_not_fresh_until_a_change_is_seen() {
        let t0 = Instant::now();
        let mut l = Lease::new(t0);
        assert!(!l.observe(&bytes_at(1, 0), t0));
        assert!(!l.is_fresh(TTL, t0));
        assert!(l.observe(&bytes_at(2, 0), t0 + Duration::from_secs(10)));
        assert!(l.is_fresh(TTL, t0 + Duration::from_secs(10)));
    }

    #[test]
    fn a_record_that_stops_changing_expires_after_ttl_of_local_time() {
        let t0 = Instant::now();
        let mut l = Lease::new(t0);
        l.observe(&bytes_at(1, 0), t0);
        l.observe(&bytes_at(2, 0), t0 + Duration::from_secs(10));
        let same = bytes_at(2, 0);
        assert!(!l.observe(&same, t0 + Duration::from_secs(40)));
        assert!(l.is_fresh(TTL, t0 + Duration::from_secs(69)));
        assert!(!l.is_fresh(TTL, t0 + Duration::from_secs(70)));
        assert_eq!(
            l.unchanged_for(t0 + Duration::from_secs(70)),
            Duration::from_secs(60)
        );
    }

    #[test]
    fn head_clock_ten_minutes_ahead_or_behind_does_not_matter() {
        for skew in [600, -600, 0] {
            let t0 = Instant::now();
            let mut l = Lease::new(t0);
            for i in 0..10u64 {
                let now = t0 + Duration::from_secs(i * 10);
                l.observe(&bytes_at(i, skew), now);
                if i > 0 {
                    assert!(l.is_fresh(TTL, now), "skew {skew}: refresh {i} not fresh");
                }
            }
            // The head stops: 60 s of our time later it is gone, whatever
            // its clock said in expires_at.
            let last = t0 + Duration::from_secs(90);
            assert!(l.is_fresh(TTL, last + Duration::from_secs(59)));
            assert!(
                !l.is_fresh(TTL, last + Duration::from_secs(60)),
                "skew {skew}"
            );
        }
    }

    #[test]
    fn missing_then_present_counts_as_a_change() {
        let t0 = Instant::now();
        let mut l = Lease::new(t0);
        l.observe_missing(t0);
        assert!(l.observe(&bytes_at(1, 0), t0 + Duration::from_secs(1)));
        assert!(l.is_fresh(TTL, t0 + Duration::from_secs(2)));
    }
}
