//! The answer to "may this request pass?".

use std::time::Duration;

/// A limiter's verdict on one request, with the numbers a caller needs to
/// tell its client (HTTP headers, gRPC metadata, a back-off).
///
/// A refusal is a value, not an error: [`Err`](crate::Error) is kept for
/// infrastructure failures.
///
/// Durations are kept in whole nanoseconds, up to about 584 years (longer
/// ones saturate there): 48 bytes, where two `Duration`s made it 64, and
/// every verdict moves one. Aligned to 16 bytes, so that a decision, and
/// the verdict around it, is moved in three aligned 16-byte pieces
/// that each read back what one earlier move wrote (a load straddling two
/// stores cannot be forwarded from them, and waits); where a decision has
/// just been written field by field, it is read the same way (see
/// `copied`).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
#[repr(align(16))]
pub struct Decision {
    limit: u64,
    remaining: u64,
    retry_after_ns: u64,
    reset_after_ns: u64,
    /// In whole microseconds, as backends compute it (keeps a `Decision`,
    /// and the `Denied` that carries one, small).
    window_us: u64,
    kind: Kind,
    /// The binding part of a composite policy (0 otherwise); at most 255.
    part: u32,
}

/// What a [`Decision`] says, in a field of its own whose unused values
/// hold the tag of every enum around a decision (`Verdict`,
/// `Option<Result<Decision, _>>`, `Poll`): those keep the decision at
/// their start, in the same 48 bytes, so one is turned into the other
/// without a copy or a copy that straddles the stores just made.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[repr(u32)]
enum Kind {
    Denied,
    Allowed,
    /// Denied: the cost can never fit.
    Impossible,
}

impl Decision {
    /// A copy read field by field, as a backend that has just computed a
    /// decision wrote it. A whole copy is three 16-byte loads, each
    /// straddling two of those 8-byte stores: a load cannot be forwarded
    /// from two stores, so each waited for them to reach the cache (perf:
    /// ~12 % of a check on the memory backend). `black_box` keeps the
    /// compiler from merging the reads back into 16-byte ones; a hint
    /// only, nothing depends on it but the speed. Measured: 406 → 356
    /// instructions a check on one key refusing, 408 → 344 admitting
    /// (callgrind, `decide_loop`), and 32.4 → 30.5 / 34.7 → 30.5 ns.
    #[inline(always)]
    pub(crate) fn copied(&self) -> Self {
        use std::hint::black_box;
        Self {
            limit: black_box(self.limit),
            remaining: black_box(self.remaining),
            retry_after_ns: black_box(self.retry_after_ns),
            reset_after_ns: black_box(self.reset_after_ns),
            window_us: black_box(self.window_us),
            kind: self.kind,
            part: self.part,
        }
    }

    /// A decision that let the request through.
    #[inline]
    pub fn allowed(limit: u64, remaining: u64, reset_after: Duration) -> Self {
        Self {
            limit,
            remaining,
            retry_after_ns: 0,
            reset_after_ns: nanos(reset_after),
            window_us: 0,
            kind: Kind::Allowed,
            part: 0,
        }
    }

    /// A decision that refused the request.
    #[inline]
    pub fn denied(
        limit: u64,
        remaining: u64,
        retry_after: Duration,
        reset_after: Duration,
    ) -> Self {
        Self {
            limit,
            remaining,
            retry_after_ns: nanos(retry_after),
            reset_after_ns: nanos(reset_after),
            window_us: 0,
            kind: Kind::Denied,
            part: 0,
        }
    }

    /// Builds a decision from microsecond figures, as backends compute them.
    #[inline]
    pub fn from_micros(
        allowed: bool,
        limit: u64,
        remaining: u64,
        retry_after_us: u64,
        reset_after_us: u64,
    ) -> Self {
        Self {
            limit,
            remaining,
            retry_after_ns: retry_after_us.saturating_mul(1_000),
            reset_after_ns: reset_after_us.saturating_mul(1_000),
            window_us: 0,
            kind: match allowed {
                true => Kind::Allowed,
                false => Kind::Denied,
            },
            part: 0,
        }
    }

    /// A refusal of a cost the policy in force can never grant, whatever
    /// the wait (a cost above the capacity or the window's limit). No
    /// retry-after helps, so it is zero; the limiter turns this into its
    /// impossible-cost error (HTTP 413), never a 429 with a Retry-After
    /// that cannot be met.
    #[inline]
    pub fn impossible(limit: u64, remaining: u64, reset_after_us: u64) -> Self {
        Self {
            kind: Kind::Impossible,
            ..Self::from_micros(false, limit, remaining, 0, reset_after_us)
        }
    }

    /// The same decision, stating the window of the policy that made it
    /// (kept in whole microseconds).
    #[inline]
    #[must_use]
    pub fn with_window(mut self, window: Duration) -> Self {
        self.window_us = crate::time::micros(window);
        self
    }

    /// [`with_window`](Self::with_window) from whole microseconds.
    #[inline]
    pub(crate) fn with_window_micros(mut self, window_us: u64) -> Self {
        self.window_us = window_us;
        self
    }

    /// The same decision, made by part `index` of a composite policy.
    #[must_use]
    pub fn with_part(mut self, index: usize) -> Self {
        self.part = u32::from(u8::try_from(index).unwrap_or(u8::MAX));
        self
    }

    /// Which part of a [composite](crate::Composite) policy this decision
    /// is (the binding one: see [`crate::composite`]); 0 for a single
    /// policy.
    pub fn part(&self) -> usize {
        self.part as usize
    }

    /// Whether the request was refused because its cost can never fit
    /// the policy in force (see [`impossible`](Self::impossible)).
    #[inline]
    pub fn is_impossible(&self) -> bool {
        self.kind == Kind::Impossible
    }

    /// The span the limit of the policy in force (an override, if one was
    /// set) is expressed over: the time to refill the whole bucket, the
    /// window, the forget-after period, or the current calendar window
    /// (from its start to the next boundary); what `RateLimit-Policy`'s `w`
    /// announces. Zero when the decision was not made by a backend (a
    /// hand-built decision).
    pub fn window(&self) -> Duration {
        Duration::from_micros(self.window_us)
    }

    /// Whether the request may pass.
    #[inline]
    pub fn is_allowed(&self) -> bool {
        self.kind == Kind::Allowed
    }

    /// Whether the request was refused.
    #[inline]
    pub fn is_denied(&self) -> bool {
        !self.is_allowed()
    }

    /// The policy's headline number (capacity, window limit, free attempts).
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Units of cost still available right after this decision.
    pub fn remaining(&self) -> u64 {
        self.remaining
    }

    /// How long to wait before the same request would pass (zero when
    /// allowed).
    pub fn retry_after(&self) -> Duration {
        Duration::from_nanos(self.retry_after_ns)
    }

    /// [`retry_after`](Self::retry_after) in whole seconds, rounded up, and
    /// never 0 for a refusal: a client told "retry in 0 s" retries at once.
    pub fn retry_after_secs(&self) -> u64 {
        if self.is_allowed() {
            return 0;
        }
        ceil_secs(self.retry_after()).max(1)
    }

    /// How long until the key's state equals a fresh key's (bucket full,
    /// window empty, failures forgotten).
    pub fn reset_after(&self) -> Duration {
        Duration::from_nanos(self.reset_after_ns)
    }

    /// [`reset_after`](Self::reset_after) in whole seconds, rounded up.
    pub fn reset_after_secs(&self) -> u64 {
        ceil_secs(self.reset_after())
    }
}

impl std::fmt::Debug for Decision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // As a derive over `Duration` fields printed it.
        f.debug_struct("Decision")
            .field("allowed", &self.is_allowed())
            .field("limit", &self.limit)
            .field("remaining", &self.remaining)
            .field("retry_after", &self.retry_after())
            .field("reset_after", &self.reset_after())
            .field("window_us", &self.window_us)
            .field("impossible", &self.is_impossible())
            .field("part", &self.part())
            .finish()
    }
}

/// `d` in whole nanoseconds, saturating.
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Whole seconds, rounded up.
pub fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_rounds_up_and_is_never_zero() {
        let d = Decision::denied(1, 0, Duration::from_millis(1), Duration::ZERO);
        assert_eq!(d.retry_after_secs(), 1);
        let d = Decision::denied(1, 0, Duration::from_millis(1001), Duration::ZERO);
        assert_eq!(d.retry_after_secs(), 2);
        let d = Decision::denied(1, 0, Duration::ZERO, Duration::ZERO);
        assert_eq!(d.retry_after_secs(), 1);
        let a = Decision::allowed(1, 0, Duration::from_millis(1500));
        assert_eq!(a.retry_after_secs(), 0);
        assert_eq!(a.reset_after_secs(), 2);
    }

    #[test]
    fn durations_keep_their_nanoseconds_and_a_decision_stays_small() {
        let d = Decision::denied(1, 0, Duration::new(3, 7), Duration::new(5, 999_999_999));
        assert_eq!(d.retry_after(), Duration::new(3, 7));
        assert_eq!(d.reset_after(), Duration::new(5, 999_999_999));
        let far = Decision::denied(1, 0, Duration::MAX, Duration::MAX);
        assert_eq!(far.retry_after(), Duration::from_nanos(u64::MAX));
        let us = Decision::from_micros(false, 1, 0, 1_500_000, 2);
        assert_eq!(us.retry_after(), Duration::from_micros(1_500_000));
        assert_eq!(us.reset_after(), Duration::from_micros(2));
        assert_eq!(std::mem::size_of::<Decision>(), 48);
    }
}
