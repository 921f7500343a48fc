//! Liveness by observation (R-WRK-5), after client-go's leader election:
//! the head is alive while the record's bytes have changed within the TTL,
//! measured on this machine's monotonic clock. Wall-clock fields in the
//! record are never compared for liveness, so skew between machines does
//! not matter. The clock is passed in, so tests inject it.

use std::time::{Duration, Instant};

/// Tracks the last observed bytes of the record and when they changed.
///
/// A file that goes missing and comes back with the same bytes did not
/// change (an NFS flap, or a dead head's record reappearing): only new bytes
/// are a refresh. A missing file does not reset how long the record has
/// stood unchanged.
#[derive(Debug, Clone)]
pub struct Lease {
    /// The last bytes seen, if any.
    last: Option<Vec<u8>>,
    /// The last look found no file.
    missing: bool,
    /// When the bytes last changed (a real change, not the first look).
    changed_at: Option<Instant>,
    /// When the current bytes were first seen (change or first look), or
    /// when this tracker started if it has seen no bytes yet.
    since: Instant,
}

impl Lease {
    /// Creates a tracker that has seen nothing yet.
    pub fn new(now: Instant) -> Self {
        Self {
            last: None,
            missing: false,
            changed_at: None,
            since: now,
        }
    }

    /// Records the bytes read at `now`; returns true if and only if they
    /// differ from the last bytes seen (a first look is not a change: a
    /// leftover file from a dead head must not look alive; a file that
    /// appears after having been missing from the first look is).
    pub fn observe(&mut self, raw: &[u8], now: Instant) -> bool {
        let was_missing = std::mem::replace(&mut self.missing, false);
        match &self.last {
            Some(b) if b.as_slice() == raw => false,
            None if !was_missing => {
                self.last = Some(raw.to_vec());
                self.since = now;
                false
            }
            _ => {
                self.last = Some(raw.to_vec());
                self.changed_at = Some(now);
                self.since = now;
                true
            }
        }
    }

    /// Records that the file was missing at `now`.
    pub fn observe_missing(&mut self, _now: Instant) {
        self.missing = true;
    }

    /// Returns true if and only if the last look found no file.
    pub fn is_missing(&self) -> bool {
        self.missing
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
    fn missing_then_the_same_bytes_again_is_not_a_change() {
        let t0 = Instant::now();
        let mut l = Lease::new(t0);
        l.observe(&bytes_at(1, 0), t0);
        l.observe(&bytes_at(2, 0), t0 + Duration::from_secs(10));
        l.observe_missing(t0 + Duration::from_secs(20));
        assert!(l.is_missing());
        // The dead head's last record comes back: not a refresh.
        assert!(!l.observe(&bytes_at(2, 0), t0 + Duration::from_secs(30)));
        assert!(!l.is_missing());
        assert!(!l.is_fresh(TTL, t0 + Duration::from_secs(70)));
        assert_eq!(
            l.unchanged_for(t0 + Duration::from_secs(70)),
            Duration::from_secs(60)
        );
        // New bytes are.
        assert!(l.observe(&bytes_at(3, 0), t0 + Duration::from_secs(71)));
    }

    #[test]
    fn a_missing_file_does_not_reset_how_long_the_record_stood_unchanged() {
        let t0 = Instant::now();
        let mut l = Lease::new(t0);
        l.observe(&bytes_at(1, 0), t0);
        l.observe_missing(t0 + Duration::from_secs(50));
        assert_eq!(
            l.unchanged_for(t0 + Duration::from_secs(60)),
            Duration::from_secs(60)
        );
    }

    #[test]
    fn missing_from_the_first_look_then_present_counts_as_a_change() {
        let t0 = Instant::now();
        let mut l = Lease::new(t0);
        l.observe_missing(t0);
        assert!(l.observe(&bytes_at(1, 0), t0 + Duration::from_secs(1)));
        assert!(l.is_fresh(TTL, t0 + Duration::from_secs(2)));
    }
}
