//! Progressive delay: its policy and its state in the reference model.

use std::time::Duration;

use crate::decision::Decision;
use crate::policy::{PolicyError, span};
use crate::time::Timestamp;

/// Progressive delay: failures are recorded; once a key has more than
/// `free_attempts`, each further failure blocks it for
/// `base_delay * factor^(n - free_attempts - 1)`, capped at `max_delay`.
///
/// State is forgotten `forget_after` the last failure (or when the block
/// ends, whichever is later) and cleared by a success. It is a delay, never a
/// permanent lock-out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProgressiveDelay {
    free_attempts: u64,
    base_delay_us: u64,
    factor: u64,
    max_delay_us: u64,
    forget_after_us: u64,
}

impl ProgressiveDelay {
    /// A progressive delay.
    ///
    /// `factor` is a whole number (1 keeps the delay constant, 2 doubles it)
    /// so that Rust and Lua compute exactly the same delays.
    pub fn new(
        free_attempts: u64,
        base_delay: Duration,
        factor: u64,
        max_delay: Duration,
        forget_after: Duration,
    ) -> Result<Self, PolicyError> {
        let base_delay_us = span("base_delay", base_delay)?;
        let max_delay_us = span("max_delay", max_delay)?;
        let forget_after_us = span("forget_after", forget_after)?;
        if factor == 0 {
            return Err(PolicyError::new("factor", "must be at least 1"));
        }
        if max_delay_us < base_delay_us {
            return Err(PolicyError::new("max_delay", "must be at least base_delay"));
        }
        Ok(Self {
            free_attempts,
            base_delay_us,
            factor,
            max_delay_us,
            forget_after_us,
        })
    }

    /// Failures allowed before the first delay.
    pub fn free_attempts(&self) -> u64 {
        self.free_attempts
    }

    /// The first delay.
    pub fn base_delay(&self) -> Duration {
        Duration::from_micros(self.base_delay_us)
    }

    /// The growth factor of successive delays.
    pub fn factor(&self) -> u64 {
        self.factor
    }

    /// The longest delay.
    pub fn max_delay(&self) -> Duration {
        Duration::from_micros(self.max_delay_us)
    }

    /// How long after the last failure the state is forgotten.
    pub fn forget_after(&self) -> Duration {
        Duration::from_micros(self.forget_after_us)
    }

    /// The delay imposed by the `n`-th failure (1-based), in microseconds:
    /// zero within the free attempts.
    pub fn delay_micros(&self, n: u64) -> u64 {
        if n <= self.free_attempts {
            return 0;
        }
        // Multiply step by step with a cap, exactly as the Lua script does,
        // so neither side overflows nor rounds differently. A factor of 1
        // never grows the delay: no step (else one per failure, and the
        // failures are the client's to multiply).
        let mut d = self.base_delay_us;
        let mut k = n - self.free_attempts - 1;
        while k > 0 && d < self.max_delay_us && self.factor > 1 {
            d = d.saturating_mul(self.factor);
            k -= 1;
        }
        d.min(self.max_delay_us)
    }

    /// [`base_delay`](Self::base_delay) in microseconds.
    pub fn base_delay_micros(&self) -> u64 {
        self.base_delay_us
    }

    /// [`max_delay`](Self::max_delay) in microseconds.
    pub fn max_delay_micros(&self) -> u64 {
        self.max_delay_us
    }

    /// [`forget_after`](Self::forget_after) in microseconds.
    pub fn forget_after_micros(&self) -> u64 {
        self.forget_after_us
    }
}

/// State of one progressive-delay key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProgressiveDelayState {
    /// Failures recorded since the key was last fresh.
    pub failures: u64,
    /// The key is blocked before this instant.
    pub blocked_until: Timestamp,
    /// The last recorded failure.
    pub last_failure: Timestamp,
}

impl ProgressiveDelayState {
    /// Records `failures` failures at `now` (0 counts as 1).
    pub fn acquire(&mut self, now: Timestamp, p: &ProgressiveDelay, failures: u64) -> Decision {
        self.decide(now, p, failures.max(1))
    }

    /// Whether the key is blocked at `now`; records nothing (a forgotten
    /// key is made fresh, which changes no answer).
    pub fn peek(&mut self, now: Timestamp, p: &ProgressiveDelay) -> Decision {
        self.decide(now, p, 0)
    }

    fn decide(&mut self, now: Timestamp, p: &ProgressiveDelay, failures: u64) -> Decision {
        if self.failures > 0 && self.expires_at(p) <= now {
            *self = Self::default();
        }
        if failures > 0 {
            self.failures = self.failures.saturating_add(failures);
            self.last_failure = now;
            let delay = p.delay_micros(self.failures);
            if delay > 0 {
                self.blocked_until = self.blocked_until.max(now + delay);
            }
        }
        let allowed = now >= self.blocked_until;
        let retry = self.blocked_until.saturating_sub(now);
        let reset = self.expires_at(p).saturating_sub(now);
        let remaining = p.free_attempts().saturating_sub(self.failures);
        Decision::from_micros(allowed, p.free_attempts(), remaining, retry, reset)
    }

    /// When this state becomes equal to a fresh key's.
    pub fn expires_at(&self, p: &ProgressiveDelay) -> Timestamp {
        if self.failures == 0 {
            return 0;
        }
        (self.last_failure + p.forget_after_micros()).max(self.blocked_until)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With a factor of 1 (a constant delay below its cap) the delay of
    /// the n-th failure must not take n steps: a key's failures grow with
    /// every request an attacker sends (and a failure count of `cost`
    /// arrives in one request), and the memory backend computes this under
    /// its shard's exclusive lock.
    #[test]
    fn a_constant_delay_costs_no_step_per_failure() {
        let p = ProgressiveDelay::new(
            3,
            Duration::from_secs(1),
            1,
            Duration::from_secs(60),
            Duration::from_secs(3600),
        )
        .unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut s = ProgressiveDelayState::default();
            let d = s.acquire(0, &p, u64::MAX / 2);
            let _ = tx.send((p.delay_micros(u64::MAX), d.retry_after()));
        });
        let got = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the delay of a huge failure count is computed at once");
        assert_eq!(got, (1_000_000, Duration::from_secs(1)));
    }
}
