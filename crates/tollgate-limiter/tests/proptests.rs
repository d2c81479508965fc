//! Invariants of the reference model, checked on random traces. These do
//! not compare the model with itself: they state what each strategy
//! promises, independently of how it is computed.

use std::time::Duration;

use proptest::prelude::*;
use tollgate_limiter::model::{ProgressiveDelayState, SlidingWindowState, TokenBucketState};
use tollgate_limiter::{ProgressiveDelay, SlidingWindow, TokenBucket};

const START: u64 = 1_767_225_600_000_000;

fn steps() -> impl Strategy<Value = Vec<(u64, u64)>> {
    // (microseconds to wait, cost)
    proptest::collection::vec((0u64..3_000_000, 1u64..6), 1..200)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Over any interval, a token bucket admits at most its capacity plus
    /// what refilled meanwhile; and a refusal's retry-after is exact.
    #[test]
    fn token_bucket_never_exceeds_burst_plus_refill(
        cap in 1u64..20, refill in 1u64..10, period_ms in 1u64..5_000, steps in steps(),
    ) {
        let p = TokenBucket::new(cap, refill, Duration::from_millis(period_ms)).unwrap();
        let t = p.interval_micros();
        let mut s = TokenBucketState::default();
        let mut now = START;
        let mut admitted: Vec<(u64, u64)> = Vec::new();
        for (wait, cost) in steps {
            now += wait;
            let cost = cost.min(cap);
            let d = s.acquire(now, &p, cost);
            prop_assert!(d.remaining() <= cap);
            if d.is_allowed() {
                admitted.push((now, cost));
            } else {
                // Exact: a copy of the state passes at retry_after, not 1µs before.
                let r = d.retry_after().as_micros() as u64;
                prop_assert!(r > 0);
                let mut probe = s.clone();
                prop_assert!(probe.acquire(now + r - 1, &p, cost).is_denied());
                prop_assert!(probe.acquire(now + r, &p, cost).is_allowed());
            }
        }
        for (i, &(t0, _)) in admitted.iter().enumerate() {
            let mut sum = 0;
            for &(t1, c) in &admitted[i..] {
                sum += c;
                prop_assert!(sum <= cap + (t1 - t0) / t, "{sum} admitted in {}µs", t1 - t0);
            }
        }
    }

    /// In every window-long interval, a sliding window admits at most its
    /// limit; a refusal's retry-after is exact.
    #[test]
    fn sliding_window_never_exceeds_limit(
        limit in 1u64..12, window_ms in 1u64..5_000, steps in steps(),
    ) {
        let p = SlidingWindow::new(limit, Duration::from_millis(window_ms)).unwrap();
        let w = p.window_micros();
        let mut s = SlidingWindowState::default();
        let mut now = START;
        let mut admitted: Vec<(u64, u64)> = Vec::new();
        for (wait, cost) in steps {
            now += wait / 4;
            let cost = cost.min(limit);
            let d = s.acquire(now, &p, cost);
            if d.is_allowed() {
                admitted.push((now, cost));
                let in_window: u64 = admitted.iter().filter(|(ts, _)| ts + w > now).map(|(_, c)| c).sum();
                prop_assert!(in_window <= limit);
                prop_assert_eq!(d.remaining(), limit - in_window);
            } else {
                let r = d.retry_after().as_micros() as u64;
                prop_assert!(r > 0 && r <= w);
                let mut probe = s.clone();
                prop_assert!(probe.acquire(now + r - 1, &p, cost).is_denied());
                prop_assert!(probe.acquire(now + r, &p, cost).is_allowed());
            }
        }
    }

    /// A progressive delay never blocks longer than its cap, never for good,
    /// and never within the free attempts.
    #[test]
    fn progressive_delay_is_bounded(
        free in 0u64..5, base_ms in 1u64..1_000, factor in 1u64..4, cap_mult in 1u64..50,
        steps in steps(),
    ) {
        let base = Duration::from_millis(base_ms);
        let p = ProgressiveDelay::new(free, base, factor, base * cap_mult as u32, Duration::from_secs(3600)).unwrap();
        let mut s = ProgressiveDelayState::default();
        let mut now = START;
        let mut failures = 0;
        for (wait, n) in steps {
            now += wait;
            let n = n.min(2);
            let d = s.acquire(now, &p, n);
            failures += n;
            prop_assert!(d.retry_after() <= p.max_delay());
            if failures <= free {
                prop_assert!(d.is_allowed());
            }
            let later = now + d.retry_after().as_micros() as u64;
            prop_assert!(s.clone().peek(later, &p).is_allowed());
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    /// A calendar quota admits at most its limit per calendar window of its
    /// zone, whatever the steps; a refusal's retry-after lands exactly on
    /// the next boundary, where the count starts from zero; a cost that
    /// fits the limit always passes at the start of a window.
    #[test]
    fn calendar_never_exceeds_its_limit_per_window(
        limit in 1u64..20,
        period in prop_oneof![
            Just(tollgate_limiter::Period::Day),
            Just(tollgate_limiter::Period::Week),
            Just(tollgate_limiter::Period::Month),
        ],
        zone in proptest::sample::select(vec![
            "UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kathmandu",
        ]),
        start_days in 0u64..800,
        steps in proptest::collection::vec(
            (prop_oneof![0u64..600_000_000, 0u64..4 * 86_400_000_000], 1u64..8),
            1..150,
        ),
    ) {
        use tollgate_limiter::Calendar;
        use tollgate_limiter::model::CalendarState;
        let p = Calendar::new(limit, period, zone).unwrap();
        let mut s = CalendarState::default();
        let mut now = START + start_days * 86_400_000_000;
        let mut used: std::collections::HashMap<(u64, u64), u64> = Default::default();
        for (wait, cost) in steps {
            now += wait;
            let window = p.window_at(now);
            prop_assert!(window.0 <= now && now < window.1);
            let d = s.acquire(now, &p, cost);
            prop_assert_eq!(d.window().as_micros() as u64, window.1 - window.0);
            if d.is_impossible() {
                prop_assert!(cost > limit);
                continue;
            }
            if d.is_allowed() {
                let u = used.entry(window).or_default();
                *u += cost;
                prop_assert!(*u <= limit, "{} admitted in {:?}", u, window);
                prop_assert_eq!(d.remaining(), limit - *u);
                prop_assert_eq!(d.reset_after().as_micros() as u64, window.1 - now);
            } else {
                let r = d.retry_after().as_micros() as u64;
                prop_assert_eq!(now + r, window.1, "the next boundary");
                let mut probe = s;
                prop_assert!(probe.acquire(now + r - 1, &p, cost).is_denied());
                prop_assert!(probe.acquire(now + r, &p, cost).is_allowed());
            }
        }
    }
}
