//! [`Reservation`]: an estimate taken by [`Limiter::reserve`], settled with
//! the real cost.

use std::fmt;

use crate::backend::Backend;
use crate::decision::Decision;
use crate::error::Error;
use crate::key::Key;
use crate::limiter::Limiter;
use crate::model::{Mark, Receipt};

/// An estimate taken by [`Limiter::reserve`]; [`settle`](Self::settle) it
/// with the real cost once known.
///
/// Dropping it without settling does nothing at all (no task, no call):
/// the whole estimate stays charged and comes back the way every charge
/// does, as the bucket refills or the window slides. A crashed worker
/// therefore leaks nothing for longer than the policy's own span, and
/// errs on the safe side. See
/// [`strategy::reservation`](crate::strategy::reservation) for the rules.
///
/// An *empty* reservation holds nothing: the reservation was refused, or
/// passed under fail-open while the backend could not answer. Settling it
/// does nothing.
///
/// It settles once: neither `Clone` nor `Copy`, consumed by
/// [`settle`](Self::settle) and [`refund`](Self::refund).
///
/// ```compile_fail
/// # use tollgate_limiter::{Backend, Reservation};
/// async fn twice<B: Backend>(r: Reservation<B>) {
///     let again = r.clone();
///     let _ = r.settle(1).await;
///     let _ = again.settle(1).await;
/// }
/// ```
#[must_use = "settle it with the real cost; dropped, it keeps the whole estimate charged"]
pub struct Reservation<B> {
    held: Option<Held<B>>,
}

struct Held<B> {
    limiter: Limiter<B>,
    key: Key,
    receipt: Receipt,
}

impl<B> Reservation<B> {
    pub(crate) fn empty() -> Self {
        Self { held: None }
    }

    pub(crate) fn held(limiter: Limiter<B>, key: Key, receipt: Receipt) -> Self {
        Self {
            held: Some(Held {
                limiter,
                key,
                receipt,
            }),
        }
    }

    /// The units held (0 for an empty reservation).
    pub fn units(&self) -> u64 {
        self.held.as_ref().map_or(0, |h| h.receipt.units)
    }

    /// Whether it holds nothing (refused, or passed under fail-open without
    /// the backend).
    pub fn is_empty(&self) -> bool {
        self.held.is_none()
    }

    /// Where the units of part `part` (0 for a single policy) sit, as the
    /// backend reported (`None` when empty or unmarked). The receipt
    /// itself is not handed out: settled through the backend as well, it
    /// would refund twice where the key no longer remembers it.
    pub fn mark(&self, part: usize) -> Option<Mark> {
        self.held
            .as_ref()
            .and_then(|h| h.receipt.marks.get(part).copied().flatten())
    }
}

impl<B: Backend> Reservation<B> {
    /// Settles the reservation with the real cost, `actual` (at least the
    /// limiter's [minimum cost](crate::LimiterBuilder::min_cost): a call
    /// reporting no usage still counts): the unused units still held are
    /// refunded, or the excess is charged (even into overdraft, bounded:
    /// see [`strategy::reservation`](crate::strategy::reservation)). One
    /// backend round trip, under the limiter's timeout and breaker.
    ///
    /// Answers the key's figures afterwards (as a peek of one unit would);
    /// `Ok(None)` for an empty reservation, which settles nothing. On
    /// `Err` (the backend failed or timed out, whatever the fail mode: no
    /// request waits on this answer) nothing is known to be refunded: the
    /// estimate stays charged, the safe side, and an excess is not charged.
    /// Once polled, the settle is made even if this future is dropped
    /// before it answers (on a tokio runtime, it runs as a task of its
    /// own): an excess is charged whether or not the caller waits for it.
    /// Settling twice is not possible: this consumes the reservation; and
    /// the key refuses a replay of this settle (a call re-sent by the
    /// Redis Cluster client) for 15 minutes (see
    /// [`strategy::reservation`](crate::strategy::reservation), "Settled
    /// once").
    pub async fn settle(self, actual: u64) -> Result<Option<Decision>, Error> {
        match self.held {
            None => Ok(None),
            Some(h) => {
                // Every admitted call costs at least the minimum, as with
                // check_cost.
                let actual = actual.max(h.limiter.min_cost());
                h.settle(actual).await.map(Some)
            }
        }
    }

    /// Gives the whole reservation back (settles it with a real cost of 0,
    /// below the [minimum cost](crate::LimiterBuilder::min_cost)): the
    /// request was not to be counted at all. For a progressive delay, a
    /// login attempt reserved as a failure that turned out to be no failed
    /// login (the handler answered `5xx` or `400`): the failure is taken
    /// back within the key's life it was recorded in; the delay it may
    /// have started is left to run (see
    /// [`ProgressiveDelayState::settle`](crate::model::ProgressiveDelayState::settle)).
    /// Otherwise as [`settle`](Self::settle).
    pub async fn refund(self) -> Result<Option<Decision>, Error> {
        match self.held {
            None => Ok(None),
            Some(h) => h.settle(0).await.map(Some),
        }
    }
}

impl<B: Backend> Held<B> {
    /// Settles the receipt at `actual`: on a tokio runtime, in a task of
    /// its own that this future waits for, so that a caller that gives up
    /// meanwhile (a client gone, a timeout or a `select!` around the
    /// handler) does not cut it short. A settle is the one moment an
    /// excess is charged; dropped before it reached the backend, the call
    /// would have cost its estimate only, whatever it really spent.
    async fn settle(self, actual: u64) -> Result<Decision, Error> {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return self.run(actual).await;
        };
        match runtime.spawn(self.run(actual)).await {
            Ok(answer) => answer,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // The runtime is shutting down: nothing is known to be settled.
            Err(e) => Err(Error::Backend(Box::new(e))),
        }
    }

    async fn run(self, actual: u64) -> Result<Decision, Error> {
        self.limiter
            .settle_receipt(&self.key, self.receipt, actual)
            .await
    }
}

/// An empty reservation, for a caller that refuses a request before
/// asking the limiter: it holds nothing, and settling it does nothing.
impl<B> Default for Reservation<B> {
    fn default() -> Self {
        Self::empty()
    }
}

impl<B> fmt::Debug for Reservation<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.held {
            None => f.write_str("Reservation(empty)"),
            Some(h) => f
                .debug_struct("Reservation")
                .field("limiter", &h.limiter)
                .field("key", &h.key)
                .field("receipt", &h.receipt)
                .finish(),
        }
    }
}
