//! A held [concurrency](crate::Concurrency) slot, given back when dropped.

use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use crate::backend::Backend;
use crate::decision::Decision;
use crate::error::Error;
use crate::key::Key;
use crate::limiter::Limiter;

/// A concurrency slot held for one request, from
/// [`Limiter::hold`](crate::Limiter::hold).
///
/// The slot is given back by [`release`](Self::release), or, when the
/// permit is dropped without it (the request ended, its future was dropped,
/// a handler panicked and the stack unwound), by a release spawned on the
/// current tokio runtime. That release is best effort: with no runtime (a
/// drop outside one), a runtime shutting down (its tasks are dropped
/// unpolled), or a backend that fails twice (a failed one is sent again, a
/// decision's time later), it is lost, and the slot's **lease** frees it
/// when it expires. Size the lease for that: a lost release costs
/// the key one slot for at most one lease.
///
/// A request that outlives its lease should [`renew`](Self::renew) it.
#[must_use = "dropping a permit gives its slot back at once"]
pub struct Permit<B: Backend> {
    limiter: Limiter<B>,
    key: Key,
    id: u64,
    armed: bool,
    /// Made before its hold was answered, and not answered yet (see
    /// [`Limiter::hold`](crate::Limiter::hold)).
    in_flight: bool,
    /// [`renew`](Self::renew)s sent and not answered (on their way, given
    /// up, or failed): one may still land, after the release.
    renewing: AtomicU32,
    /// The lease of the policy in force, as the hold's answer said (a
    /// key's override may differ from the configured policy).
    lease: Duration,
}

impl<B: Backend> Permit<B> {
    /// The permit of a hold about to be sent: dropped before the hold is
    /// answered, it withdraws the slot; if the hold reaches the backend
    /// after that, the backend refuses it (see `give_back`).
    pub(crate) fn in_flight(limiter: Limiter<B>, key: Key, id: u64) -> Self {
        Self {
            limiter,
            key,
            id,
            armed: true,
            in_flight: true,
            renewing: AtomicU32::new(0),
            lease: Duration::ZERO,
        }
    }

    /// The hold was answered: the slot is taken, for `lease`.
    pub(crate) fn landed(mut self, lease: Duration) -> Self {
        self.in_flight = false;
        self.lease = lease;
        self
    }

    /// The slot's id (unique at random: 64 bits drawn per request).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The key the slot is held for.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// Drops the permit without giving anything back (for a slot that
    /// was never taken).
    pub(crate) fn disarm(mut self) {
        self.armed = false;
    }

    /// Renews the slot's lease from now. If the lease had expired and
    /// another request took the slot meanwhile, the renewal is refused (a
    /// denied decision) and this request holds nothing any more.
    pub async fn renew(&self) -> Result<Decision, Error> {
        // Cleared only on an answer: a renewal given up or failed may land
        // after this permit's release, and take the slot again: the slot
        // is then withdrawn, not released (see `give_back`).
        self.renewing.fetch_add(1, Ordering::Relaxed);
        let answer = self
            .limiter
            .slot_op(&self.key, crate::Op::Hold(self.id))
            .await;
        if answer.is_ok() {
            self.renewing.fetch_sub(1, Ordering::Relaxed);
        }
        answer
    }

    /// Gives the slot back now, waiting for the backend. On an error the
    /// permit is dropped armed: it gives the slot back again as a dropped
    /// permit does, and the lease frees the slot if that fails too.
    /// Dropped before the backend answered (its caller gave up), the
    /// permit gives the slot back as a dropped permit does.
    pub async fn release(mut self) -> Result<Decision, Error> {
        let op = self.give_back();
        let answer = self.limiter.slot_op(&self.key, op).await;
        // Disarmed only now, and only on an answer: a release dropped
        // while it waits (for a pooled connection, an override read, the
        // reply) or one that failed (a broken connection, replaced since)
        // may not have reached the backend, and the slot would stay taken
        // for a lease.
        self.armed = answer.is_err();
        answer
    }

    /// How this permit gives its slot back: [`Op::Release`](crate::Op::Release)
    /// when every hold of its id was answered; else
    /// [`Op::Withdraw`](crate::Op::Withdraw), which also refuses a hold of
    /// the id that lands later (one given up, or re-sent by a cluster
    /// client after its answer was lost), for one lease.
    fn give_back(&mut self) -> crate::Op {
        match self.in_flight || *self.renewing.get_mut() > 0 {
            true => crate::Op::Withdraw(self.id),
            false => crate::Op::Release(self.id),
        }
    }

    /// Renews the slot's lease in the background, every third of a lease,
    /// until the returned [`KeptPermit`] is dropped, which gives the slot
    /// back as a dropped permit does.
    ///
    /// For a request whose length the client decides (a response it reads
    /// slowly, a stream, a WebSocket): a lease that ran out under it would
    /// free its slot while it still runs, and let one request more in. A
    /// renewal that fails is tried again a third of a lease later; one
    /// refused (the lease had run out and the slot was taken meanwhile)
    /// too, so the request takes a slot again as soon as one is free. The
    /// lease is the policy in force's, as each renewal's
    /// [`window`](Decision::window) says. Outside a tokio runtime nothing
    /// is renewed, and the permit is kept as it is.
    pub fn keep_alive(self) -> KeptPermit<B> {
        let id = self.id;
        let key = self.key.clone();
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return KeptPermit {
                id,
                key,
                kept: Kept::Here { _held: self },
            };
        };
        // The hold's, not the configured policy's: a key's override of a
        // shorter lease would run out before the first renewal. (The
        // configured one if the backend's answer has no window.)
        let lease = match (self.lease, self.limiter.policy()) {
            (lease, _) if !lease.is_zero() => lease,
            (_, crate::Policy::Concurrency(c)) => c.lease(),
            _ => Duration::ZERO,
        };
        let task = rt.spawn(async move {
            // Owned here: the task's end, or its abort, drops it, which
            // gives the slot back.
            let permit = self;
            let mut lease = lease;
            loop {
                tokio::time::sleep((lease / 3).max(MIN_RENEWAL)).await;
                if let Ok(d) = permit.renew().await
                    && !d.window().is_zero()
                {
                    lease = d.window();
                }
            }
        });
        KeptPermit {
            id,
            key,
            kept: Kept::Renewed(task.abort_handle()),
        }
    }
}

/// The shortest time between two renewals of a [`KeptPermit`]: a lease of
/// a few milliseconds (a test's) is renewed no faster.
const MIN_RENEWAL: Duration = Duration::from_millis(1);

/// A [`Permit`] whose lease is renewed in the background, from
/// [`Permit::keep_alive`]; dropped, it gives the slot back.
#[must_use = "dropping a kept permit gives its slot back at once"]
pub struct KeptPermit<B: Backend> {
    id: u64,
    key: Key,
    kept: Kept<B>,
}

enum Kept<B: Backend> {
    /// The renewing task owns the permit: aborted, it drops it.
    Renewed(tokio::task::AbortHandle),
    /// No runtime to renew on: held until dropped.
    Here { _held: Permit<B> },
}

impl<B: Backend> KeptPermit<B> {
    /// The slot's id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The key the slot is held for.
    pub fn key(&self) -> &Key {
        &self.key
    }
}

impl<B: Backend> Drop for KeptPermit<B> {
    fn drop(&mut self) {
        if let Kept::Renewed(task) = &self.kept {
            task.abort();
        }
    }
}

impl<B: Backend> fmt::Debug for KeptPermit<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeptPermit")
            .field("key", &self.key)
            .field("id", &self.id)
            .field("renewed", &matches!(self.kept, Kept::Renewed(_)))
            .finish()
    }
}

impl<B: Backend> Drop for Permit<B> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        // Best effort (see the type's docs): the lease is the backstop.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let limiter = self.limiter.clone();
            let key = self.key.clone();
            // A hold (or renewal) with no answer may still be on its way,
            // queued on one pooled connection while this goes through
            // another, and land after it: withdrawn, it is refused then.
            let op = self.give_back();
            let after = limiter.decision_timeout();
            rt.spawn(async move {
                // Once more, a decision's time later, if it failed (a
                // broken connection, replaced meanwhile).
                if limiter.slot_op(&key, op).await.is_err() {
                    tokio::time::sleep(after).await;
                    let _ = limiter.slot_op(&key, op).await;
                }
            });
        }
    }
}

impl<B: Backend> fmt::Debug for Permit<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("limiter", &self.limiter.name())
            .field("key", &self.key)
            .field("id", &self.id)
            .finish()
    }
}

/// A fresh slot id: 64 bits from the standard library's randomly seeded
/// hasher over a process-wide counter, so ids differ across requests and,
/// but for a 2^-64 chance, across workers.
pub(crate) fn slot_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static SEED: std::sync::LazyLock<std::collections::hash_map::RandomState> =
        std::sync::LazyLock::new(std::collections::hash_map::RandomState::new);
    let mut h = SEED.build_hasher();
    h.write_u64(NEXT.fetch_add(1, Ordering::Relaxed));
    h.write_u32(std::process::id());
    h.finish()
}
