//! Restart backoff: exponential, capped, with jitter, reset after a stable run.

use std::time::Duration;

use rand::Rng;

/// Exponential backoff with "equal jitter" (half fixed, half random).
#[derive(Debug, Clone)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    stable: Duration,
    failures: u32,
}

impl Backoff {
    /// Creates a backoff starting at `min`, doubling up to `max`, forgotten
    /// after a run of at least `stable`.
    pub fn new(min: Duration, max: Duration, stable: Duration) -> Self {
        Self {
            min,
            max: max.max(min),
            stable,
            failures: 0,
        }
    }

    /// Forgets earlier failures: the next delay is the minimum again (a
    /// worker whose head changed is not crash-looping against the new one).
    pub fn reset(&mut self) {
        self.failures = 0;
    }

    /// Returns how many consecutive short runs have been seen.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// Records a run that lasted `ran` and returns the delay before the next
    /// start, drawing the jitter from `rng`.
    pub fn next_delay(&mut self, ran: Duration, rng: &mut impl Rng) -> Duration {
        if ran >= self.stable {
            self.failures = 0;
        }
        let exp = self.failures.min(30);
        self.failures = self.failures.saturating_add(1);
        let base = self.min.saturating_mul(1u32 << exp.min(20)).min(self.max);
        let half = base / 2;
        let jitter = rng.random_range(0.0..=1.0);
        half + half.mul_f64(jitter)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    #[test]
    fn backoff_doubles_is_capped_and_resets_after_stable_run() {
        let mut rng = StdRng::seed_from_u64(7);
        let mut b = Backoff::new(
            Duration::from_secs(1),
            Duration::from_secs(8),
            Duration::from_secs(60),
        );
        let short = Duration::from_millis(100);
        let d: Vec<_> = (0..6).map(|_| b.next_delay(short, &mut rng)).collect();
        let caps = [1.0, 2.0, 4.0, 8.0, 8.0, 8.0];
        for (d, cap) in d.iter().zip(caps) {
            let s = d.as_secs_f64();
            assert!(
                s >= cap / 2.0 - 1e-9 && s <= cap + 1e-9,
                "{s} not in [{}, {cap}]",
                cap / 2.0
            );
        }
        let after = b
            .next_delay(Duration::from_secs(61), &mut rng)
            .as_secs_f64();
        assert!((0.5..=1.0).contains(&after), "backoff not reset: {after}");
        assert_eq!(b.failures(), 1);
    }

    #[test]
    fn jitter_spreads_delays() {
        let mut rng = StdRng::seed_from_u64(1);
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..20 {
            let mut b = Backoff::new(
                Duration::from_secs(4),
                Duration::from_secs(4),
                Duration::from_secs(60),
            );
            seen.insert(b.next_delay(Duration::ZERO, &mut rng).as_millis());
        }
        assert!(seen.len() > 10, "jitter too narrow: {seen:?}");
    }
}
