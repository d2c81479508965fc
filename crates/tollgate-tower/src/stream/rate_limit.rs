use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use futures_core::Stream;
use pin_project_lite::pin_project;
use tollgate_limiter::{Backend, FailMode, Key, Limiter, Mode as LimiterMode, Verdict};

use crate::extract::KeyExtractor;
use crate::inbound::{Cost, LimiterCost, MissingKey};
use crate::telemetry;

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Events one poll drops at most before it yields (tokio's own budget per
/// task turn).
const DROPS_PER_POLL: usize = 128;

/// What becomes of an event over the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Excess {
    /// Drop it and count it (see [`StreamStats`]).
    Drop,
    /// Hold the stream until it may pass, then yield it.
    Delay,
}

#[derive(Debug, Default)]
struct Counters {
    passed: AtomicU64,
    limited: AtomicU64,
    unavailable: AtomicU64,
    missing_key: AtomicU64,
    delayed: AtomicU64,
}

/// What a [`RateLimitStream`] did, readable while the stream runs.
///
/// Cheap to clone; clones read the same counters.
#[derive(Debug, Clone, Default)]
pub struct StreamStats {
    counters: Arc<Counters>,
}

impl StreamStats {
    /// Events yielded.
    pub fn passed(&self) -> u64 {
        self.counters.passed.load(Ordering::Relaxed)
    }

    /// Events dropped because their key was over the limit.
    pub fn limited(&self) -> u64 {
        self.counters.limited.load(Ordering::Relaxed)
    }

    /// Events dropped because a fail-closed limiter's backend failed.
    pub fn unavailable(&self) -> u64 {
        self.counters.unavailable.load(Ordering::Relaxed)
    }

    /// Events dropped because they had no key.
    pub fn missing_key(&self) -> u64 {
        self.counters.missing_key.load(Ordering::Relaxed)
    }

    /// Events dropped, for any reason.
    pub fn dropped(&self) -> u64 {
        self.limited() + self.unavailable() + self.missing_key()
    }

    /// Times an event was held back ([`Excess::Delay`]): once per wait, so
    /// an event that waits twice counts twice.
    pub fn delayed(&self) -> u64 {
        self.counters.delayed.load(Ordering::Relaxed)
    }

    fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

pin_project! {
    /// A stream of events limited per key. Made by
    /// [`RateLimitStreamExt::rate_limit`] or [`RateLimitStream::new`]; see
    /// the [module docs](super).
    ///
    /// Each event is checked once it is pulled from the inner stream; the
    /// next one is not pulled before the check is answered (and, with
    /// [`Excess::Delay`], before the wait is over), so events keep their
    /// order and the limiter sees them one at a time. A poll drops at most
    /// 128 events before it yields (woken to go on), so a flood refused at
    /// once, from a source that is always ready, does not hold its task.
    #[must_use = "streams do nothing unless polled"]
    pub struct RateLimitStream<St, B, K, C = LimiterCost>
    where
        St: Stream,
    {
        #[pin]
        stream: St,
        limiter: Limiter<B>,
        extractor: K,
        cost: C,
        excess: Excess,
        missing: MissingKey,
        stats: StreamStats,
        // The event being decided, with its key and cost.
        current: Option<(St::Item, Key, u64)>,
        check: Option<BoxFuture<Verdict>>,
        sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    }
}

impl<St: Stream, B: Backend, K> RateLimitStream<St, B, K> {
    /// Limits `stream`'s events with `limiter`, keyed by `extractor`, each
    /// event costing the limiter's [cost](Limiter::cost); the excess goes
    /// by `excess`; events without a key are dropped.
    pub fn new(stream: St, limiter: Limiter<B>, extractor: K, excess: Excess) -> Self {
        Self {
            stream,
            limiter,
            extractor,
            cost: LimiterCost,
            excess,
            missing: MissingKey::Reject,
            stats: StreamStats::default(),
            current: None,
            check: None,
            sleep: None,
        }
    }
}

impl<St: Stream, B, K, C> RateLimitStream<St, B, K, C> {
    /// The cost of each event: a fixed `u64` or a closure
    /// `Fn(&Item) -> u64` (see [`Cost`]).
    pub fn cost<C2>(self, cost: C2) -> RateLimitStream<St, B, K, C2> {
        RateLimitStream {
            stream: self.stream,
            limiter: self.limiter,
            extractor: self.extractor,
            cost,
            excess: self.excess,
            missing: self.missing,
            stats: self.stats,
            current: self.current,
            check: self.check,
            sleep: self.sleep,
        }
    }

    /// What to do with an event that has no key (default: drop it).
    pub fn on_missing_key(mut self, missing: MissingKey) -> Self {
        self.missing = missing;
        self
    }

    /// The stream's counters: keep a handle before consuming the stream.
    pub fn stats(&self) -> StreamStats {
        self.stats.clone()
    }

    /// The inner stream.
    pub fn get_ref(&self) -> &St {
        &self.stream
    }

    /// The inner stream, unwrapped (an event being decided is lost).
    pub fn into_inner(self) -> St {
        self.stream
    }
}

impl<St, B, K, C> Stream for RateLimitStream<St, B, K, C>
where
    St: Stream,
    B: Backend,
    K: KeyExtractor<St::Item>,
    C: Cost<St::Item>,
{
    type Item = St::Item;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let mut this = self.project();
        let counters = &this.stats.counters;
        let mut pulled = 0;
        loop {
            if let Some(sleep) = this.sleep.as_mut() {
                ready!(sleep.as_mut().poll(cx));
                *this.sleep = None;
                if let Some((_, key, cost)) = this.current.as_ref() {
                    *this.check = Some(check(this.limiter.clone(), key.clone(), *cost));
                }
            }
            if let Some(fut) = this.check.as_mut() {
                let verdict = ready!(fut.as_mut().poll(cx));
                *this.check = None;
                let name = this.limiter.name();
                let wait = match &verdict {
                    Verdict::Decided(d) if d.is_allowed() => None,
                    Verdict::FailedOpen(e) => {
                        telemetry::backend_failed(name, false, e);
                        None
                    }
                    // Shadow mode: counted and logged by the limiter.
                    Verdict::Shadowed(_) => None,
                    Verdict::Decided(d) => {
                        if let Some((_, key, _)) = this.current.as_ref() {
                            telemetry::denied(name, key, d);
                        }
                        Some((d.retry_after(), &counters.limited))
                    }
                    // A cost the policy can never grant: waiting would
                    // not help, so it is dropped whatever the choice.
                    Verdict::FailedClosed(e, _) if !e.is_unavailable() => {
                        tracing::debug!(limiter = name, error = %e, "event refused: impossible cost");
                        StreamStats::bump(&counters.limited);
                        *this.current = None;
                        continue;
                    }
                    Verdict::FailedClosed(e, retry_after) => {
                        telemetry::backend_failed(name, true, e);
                        Some((*retry_after, &counters.unavailable))
                    }
                };
                match wait {
                    None => {
                        StreamStats::bump(&counters.passed);
                        let (item, _, _) = this.current.take().expect("checked an event");
                        return Poll::Ready(Some(item));
                    }
                    Some((retry_after, dropped)) => match this.excess {
                        Excess::Drop => {
                            StreamStats::bump(dropped);
                            *this.current = None;
                        }
                        Excess::Delay => {
                            StreamStats::bump(&counters.delayed);
                            // A zero wait would spin on the backend.
                            let wait = retry_after.max(Duration::from_millis(1));
                            *this.sleep = Some(Box::pin(tokio::time::sleep(wait)));
                        }
                    },
                }
                continue;
            }
            // Every event pulled before in this poll was dropped (one that
            // passes or waits ends the poll): a flood of them, refused at
            // once from a source that is always ready, must not hold the
            // task. Give it back, woken to go on.
            if pulled == DROPS_PER_POLL {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            pulled += 1;
            let Some(item) = ready!(this.stream.as_mut().poll_next(cx)) else {
                return Poll::Ready(None);
            };
            let key = match this.extractor.extract(&item) {
                Some(key) => key,
                None => match &*this.missing {
                    MissingKey::Fallback(key) => key.clone(),
                    MissingKey::Allow if this.limiter.fail_mode() == FailMode::Open => {
                        telemetry::missing_key(this.limiter.name(), true);
                        StreamStats::bump(&counters.passed);
                        return Poll::Ready(Some(item));
                    }
                    // Shadow mode never refuses (as in `RateLimit`).
                    _ if this.limiter.mode() == LimiterMode::Shadow => {
                        telemetry::missing_key(this.limiter.name(), true);
                        StreamStats::bump(&counters.passed);
                        return Poll::Ready(Some(item));
                    }
                    // Reject, or Allow on a fail-closed limiter (see
                    // `MissingKey::Allow`): waiting would not give it a key.
                    _ => {
                        telemetry::missing_key(this.limiter.name(), false);
                        StreamStats::bump(&counters.missing_key);
                        continue;
                    }
                },
            };
            let cost = this.cost.cost(&item, this.limiter.cost());
            *this.check = Some(check(this.limiter.clone(), key.clone(), cost));
            *this.current = Some((item, key, cost));
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        // Any event may be dropped.
        let pending = usize::from(self.current.is_some());
        let (_, upper) = self.stream.size_hint();
        (0, upper.and_then(|u| u.checked_add(pending)))
    }
}

fn check<B: Backend>(limiter: Limiter<B>, key: Key, cost: u64) -> BoxFuture<Verdict> {
    Box::pin(async move { limiter.check_cost(&key, cost).await })
}

impl<St, B, K, C> fmt::Debug for RateLimitStream<St, B, K, C>
where
    St: Stream + fmt::Debug,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitStream")
            .field("stream", &self.stream)
            .field("limiter", &self.limiter)
            .field("extractor", &std::any::type_name::<K>())
            .field("excess", &self.excess)
            .field("missing", &self.missing)
            .field("stats", &self.stats)
            .finish()
    }
}

/// Adds [`rate_limit`](Self::rate_limit) to every [`Stream`].
pub trait RateLimitStreamExt: Stream + Sized {
    /// Limits this stream's events with `limiter`, keyed by `extractor`
    /// (a closure `Fn(&Item) -> Option<Key>`); the excess goes by
    /// `excess`. See [`RateLimitStream`].
    fn rate_limit<B: Backend, K>(
        self,
        limiter: Limiter<B>,
        extractor: K,
        excess: Excess,
    ) -> RateLimitStream<Self, B, K> {
        RateLimitStream::new(self, limiter, extractor, excess)
    }
}

impl<St: Stream> RateLimitStreamExt for St {}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::{StreamExt, stream};
    use tollgate_limiter::{MockClock, SlidingWindow, TokenBucket};
    use tollgate_memory::MemoryBackend;

    fn channel(e: &(&'static str, u32)) -> Option<Key> {
        Some(Key::new(e.0))
    }

    fn window(limit: u64, backend: MemoryBackend<MockClock>) -> Limiter<MemoryBackend<MockClock>> {
        Limiter::new(
            "channel",
            SlidingWindow::new(limit, Duration::from_secs(60)).unwrap(),
            backend,
        )
    }

    #[tokio::test]
    async fn drop_counts_and_keeps_other_keys_flowing() {
        let backend = MemoryBackend::with_clock(MockClock::new());
        let events = stream::iter([("a", 1), ("a", 2), ("a", 3), ("b", 4), ("a", 5), ("b", 6)]);
        let limited = events.rate_limit(window(2, backend), channel, Excess::Drop);
        let stats = limited.stats();
        let out: Vec<u32> = limited.map(|e| e.1).collect().await;
        assert_eq!(out, [1, 2, 4, 6]);
        assert_eq!(
            (stats.passed(), stats.limited(), stats.dropped()),
            (4, 2, 2)
        );
        assert_eq!(stats.delayed(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn delay_waits_for_the_retry_after_and_keeps_order() {
        // One token, one back per second. The memory backend reads its
        // own clock: a task moves the mock clock along with tokio's paused
        // time, so a delayed event is re-checked once its retry-after has
        // passed on both.
        let clock = MockClock::new();
        let backend = MemoryBackend::with_clock(clock.clone());
        let limiter = Limiter::new("bucket", TokenBucket::per_second(1, 1).unwrap(), backend);
        let ticker = clock.clone();
        let start = tokio::time::Instant::now();
        let events = stream::iter([("a", 1), ("a", 2), ("a", 3)]);
        let limited = events.rate_limit(limiter, channel, Excess::Delay);
        let stats = limited.stats();
        let mut limited = Box::pin(limited);
        let mut out = Vec::new();
        // Advance the mock clock as tokio's paused time advances.
        let mock = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                ticker.advance(Duration::from_millis(100));
            }
        });
        while let Some(e) = limited.next().await {
            out.push((e.1, start.elapsed().as_millis()));
        }
        mock.abort();
        let order: Vec<u32> = out.iter().map(|e| e.0).collect();
        assert_eq!(order, [1, 2, 3]);
        // The second and third events waited about a second each.
        assert!(out[1].1 >= 900 && out[2].1 >= 1900, "{out:?}");
        assert_eq!((stats.passed(), stats.dropped()), (3, 0));
        assert!(stats.delayed() >= 2);
    }

    #[tokio::test(start_paused = true)]
    async fn fail_closed_drops_or_holds_and_fail_open_passes() {
        let backend = MemoryBackend::with_clock(MockClock::new());
        backend.set_failing(true);
        let events = || stream::iter([("a", 1), ("b", 2)]);

        let closed = events().rate_limit(window(10, backend.clone()), channel, Excess::Drop);
        let stats = closed.stats();
        assert_eq!(closed.count().await, 0);
        assert_eq!((stats.unavailable(), stats.limited()), (2, 0));

        let open = Limiter::builder(
            "open",
            SlidingWindow::new(10, Duration::from_secs(60)).unwrap(),
            backend.clone(),
        )
        .fail_mode(FailMode::Open)
        .build();
        assert_eq!(
            events()
                .rate_limit(open, channel, Excess::Drop)
                .count()
                .await,
            2
        );

        // Delay holds the event until the backend is back.
        let held = events().rate_limit(window(10, backend.clone()), channel, Excess::Delay);
        let stats = held.stats();
        let mut held = Box::pin(held);
        let healer = backend.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(5)).await;
            healer.set_failing(false);
        });
        // The breaker may hold a little longer than the backend stayed
        // down; the events arrive, in order, once it lets a probe through.
        let first = tokio::time::timeout(Duration::from_secs(600), held.next()).await;
        assert_eq!(first.unwrap().map(|e| e.1), Some(1));
        assert_eq!(held.next().await.map(|e| e.1), Some(2));
        assert!(stats.delayed() >= 1);
        assert_eq!(stats.dropped(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn an_impossible_cost_is_dropped_even_with_delay() {
        let backend = MemoryBackend::with_clock(MockClock::new());
        let events = stream::iter([("a", 1), ("a", 50), ("a", 2)]);
        let limited = events
            .rate_limit(window(10, backend), channel, Excess::Delay)
            .cost(|e: &(&str, u32)| u64::from(e.1));
        let stats = limited.stats();
        let out: Vec<u32> = limited.map(|e| e.1).collect().await;
        assert_eq!(out, [1, 2]);
        assert_eq!((stats.limited(), stats.delayed()), (1, 0));
    }

    #[tokio::test]
    async fn missing_keys_and_cost() {
        let backend = MemoryBackend::with_clock(MockClock::new());
        let events = || stream::iter([("", 1), ("a", 5), ("a", 5), ("", 1)]);
        let key = |e: &(&str, u32)| (!e.0.is_empty()).then(|| Key::new(e.0));

        let limited = events().rate_limit(window(8, backend.clone()), key, Excess::Drop);
        let stats = limited.stats();
        // Cost 1 each: both keyed events pass, the keyless ones are dropped.
        assert_eq!(limited.count().await, 2);
        assert_eq!(stats.missing_key(), 2);

        let weighted = events()
            .rate_limit(window(8, backend.clone()), key, Excess::Drop)
            .cost(|e: &(&str, u32)| u64::from(e.1))
            .on_missing_key(MissingKey::Fallback(Key::new("keyless")));
        let stats = weighted.stats();
        // "a" already spent 2 of 8: one more 5 fits, the next does not;
        // the keyless events share the fallback key.
        assert_eq!(weighted.count().await, 3);
        assert_eq!((stats.limited(), stats.missing_key()), (1, 0));
    }

    /// A stream dropped while an event is being decided (a slow backend),
    /// or while a delayed event waits, leaves nothing behind: the limiter
    /// decides the next stream's events at once, and the dropped decision
    /// charged nothing (the memory backend decides after its injected
    /// delay, so a check dropped during it never decided).
    #[tokio::test(start_paused = true)]
    async fn a_stream_dropped_mid_decision_or_mid_wait_leaves_nothing_behind() {
        let backend = MemoryBackend::with_clock(MockClock::new());
        let limiter = window(2, backend.clone());
        // Every backend call takes 20 ms (within the 50 ms timeout).
        backend.set_delay(Duration::from_millis(20));
        let mut deciding =
            Box::pin(stream::iter([("a", 1)]).rate_limit(limiter.clone(), channel, Excess::Drop));
        let next = tokio::time::timeout(Duration::from_millis(10), deciding.next()).await;
        assert!(next.is_err(), "decided {next:?}");
        drop(deciding);
        tokio::time::sleep(Duration::from_millis(100)).await;
        backend.clear_faults();

        // "b" spends its two units; its third event waits out the window.
        let mut waiting = Box::pin(stream::iter([("b", 2), ("b", 3), ("b", 4)]).rate_limit(
            limiter.clone(),
            channel,
            Excess::Delay,
        ));
        assert_eq!(waiting.next().await.map(|e| e.1), Some(2));
        assert_eq!(waiting.next().await.map(|e| e.1), Some(3));
        let next = tokio::time::timeout(Duration::from_secs(1), waiting.next()).await;
        assert!(next.is_err(), "yielded {next:?}");
        drop(waiting);

        let fresh =
            stream::iter([("a", 5), ("a", 6), ("a", 7)]).rate_limit(limiter, channel, Excess::Drop);
        let stats = fresh.stats();
        let out: Vec<u32> = fresh.map(|e| e.1).collect().await;
        assert_eq!(out, [5, 6]);
        assert_eq!((stats.limited(), stats.unavailable()), (1, 0));
    }

    /// A flood of events that are all dropped (over the limit, here
    /// refused locally by the memory backend, or without a key) from a
    /// source that is always ready (an in-memory batch, a futures channel:
    /// nothing that spends tokio's budget) must not hold its task: a poll
    /// drops a bounded number of events, then yields, so the task's other
    /// work (a shutdown signal beside the stream in a `select!`) is seen.
    #[tokio::test]
    async fn a_flood_of_dropped_events_yields_between_polls() {
        use std::sync::atomic::AtomicUsize;

        const FLOOD: usize = 100_000;
        let backend = MemoryBackend::with_clock(MockClock::new());
        let pulled = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&pulled);
        let events = stream::iter(0..FLOOD).map(move |i| {
            counted.fetch_add(1, Ordering::Relaxed);
            // Every third event has no key; the others are one channel's.
            (if i % 3 == 0 { "" } else { "a" }, i as u32)
        });
        let key = |e: &(&str, u32)| (!e.0.is_empty()).then(|| Key::new(e.0));
        let limited = events.rate_limit(window(1, backend), key, Excess::Drop);
        let stats = limited.stats();
        let mut limited = Box::pin(limited);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        // The first keyed event passes.
        assert!(matches!(
            limited.as_mut().poll_next(&mut cx),
            Poll::Ready(Some(("a", 1)))
        ));
        // Then every event is dropped: the poll gives the task back.
        assert!(limited.as_mut().poll_next(&mut cx).is_pending());
        let pulled_in_one_poll = pulled.load(Ordering::Relaxed);
        assert!(
            pulled_in_one_poll < FLOOD,
            "one poll pulled all {pulled_in_one_poll} events"
        );
        // And the stream still goes through all of them.
        assert_eq!(limited.count().await, 0);
        assert_eq!(stats.dropped(), (FLOOD - 1) as u64);
    }

    /// Shadow mode never refuses: an event without a key passes a limiter
    /// in shadow mode whatever the `MissingKey` policy, as a request
    /// without a key passes the HTTP layer. (A listener rolled out behind
    /// a shadow limiter lost every keyless event.)
    #[tokio::test]
    async fn shadow_mode_lets_an_event_without_a_key_pass() {
        let shadow = Limiter::builder(
            "shadow",
            SlidingWindow::new(10, Duration::from_secs(60)).unwrap(),
            MemoryBackend::with_clock(MockClock::new()),
        )
        .mode(tollgate_limiter::Mode::Shadow)
        .build();
        let key = |e: &(&str, u32)| (!e.0.is_empty()).then(|| Key::new(e.0));
        let limited =
            stream::iter([("", 1), ("a", 2), ("", 3)]).rate_limit(shadow, key, Excess::Drop);
        let stats = limited.stats();
        let out: Vec<u32> = limited.map(|e| e.1).collect().await;
        assert_eq!(out, [1, 2, 3]);
        assert_eq!((stats.passed(), stats.dropped()), (3, 0));
    }

    /// `MissingKey::Allow` lets keyless events through a fail-open limiter
    /// only: on a fail-closed one (the default) they are dropped, as with
    /// `Reject`, so an event without a key never escapes a security limit.
    #[tokio::test]
    async fn allow_passes_keyless_events_only_when_failing_open() {
        let backend = MemoryBackend::with_clock(MockClock::new());
        let events = || stream::iter([("", 1), ("a", 2), ("", 3)]);
        let key = |e: &(&str, u32)| (!e.0.is_empty()).then(|| Key::new(e.0));

        let closed = events()
            .rate_limit(window(10, backend.clone()), key, Excess::Drop)
            .on_missing_key(MissingKey::Allow);
        let stats = closed.stats();
        let out: Vec<u32> = closed.map(|e| e.1).collect().await;
        assert_eq!(out, [2]);
        assert_eq!(stats.missing_key(), 2);

        let open = Limiter::builder(
            "open",
            SlidingWindow::new(10, Duration::from_secs(60)).unwrap(),
            backend,
        )
        .fail_mode(FailMode::Open)
        .build();
        let open = events()
            .rate_limit(open, key, Excess::Drop)
            .on_missing_key(MissingKey::Allow);
        let stats = open.stats();
        let out: Vec<u32> = open.map(|e| e.1).collect().await;
        assert_eq!(out, [1, 2, 3]);
        assert_eq!((stats.missing_key(), stats.passed()), (0, 3));
    }
}
