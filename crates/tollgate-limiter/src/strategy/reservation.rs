//! Reserve, then settle: for costs known only afterwards (LLM tokens).
//!
//! A caller *reserves* an estimate (a prompt plus `max_tokens`): the
//! estimate is taken atomically, exactly like an
//! [`Op::Acquire`](crate::model::Op::Acquire) of that cost, and the backend
//! hands back a [`Receipt`] saying where the units sit in the key's state.
//! Once the real cost is known, [`Op::Settle`](crate::model::Op::Settle)
//! gives back the difference, or charges the excess.
//!
//! Token buckets, sliding windows, calendar quotas and composites of them
//! (each part is settled on its own) support it, and so do progressive
//! delays, whose units are failures: a login attempt is taken as a failure
//! up front and settled by its outcome (see below).
//!
//! # The rules
//!
//! **A refund never gives more than was taken, and never gives back what
//! time has already given back.**
//!
//! * *Token bucket*: the reservation's units sit just below the bucket's
//!   theoretical arrival time right after the charge; of the unused units,
//!   only those that have not dripped back yet are returned: the refund is
//!   at most `unused × interval`, and at most `top − now`, `top` being
//!   where the units' top is now. A refund of a reservation *below* them
//!   (made earlier), settled in between, moved them down by its amount; a
//!   refund of one *above* them did not. So the state counts how far the
//!   refunds of its life moved the arrival time back
//!   ([`TokenBucketState::refunded`]), a mark's [`Mark::at`] is the
//!   arrival time after the charge plus that count, and the state
//!   remembers the latest refunds of reservations that may still sit above
//!   another one ([`TokenBucketState::recent`], at most
//!   [`MAX_RECENT_REFUNDS`]): `top = at − refunded + (the remembered
//!   refunds of reservations above it)`. Reservations settled in any order
//!   at one instant thus leave exactly what their actual costs would. A
//!   refund stops being remembered once the units it was taken from are
//!   past (nothing below them can refund any more) or, past
//!   [`MAX_RECENT_REFUNDS`], the oldest reservation's first: it then
//!   counts as one below, so a reservation with more refunds above it
//!   than that gets less back, never more. The bucket never holds more
//!   than a full one; a reservation settled after its units have refilled
//!   refunds nothing, nor does a second settle of the same receipt once
//!   the first gave everything back. A life whose refunds would pass
//!   [`MAX_REFUNDED`] (71 years of tokens) is renewed instead: what is
//!   outstanding then refunds nothing.
//!
//!   Without the count (releases before this rule), the refund was
//!   `min(unused × interval, at − now)`, which the property test
//!   `interleaved_reservations_never_give_more_than_their_actual_costs`
//!   showed gives too much: capacity 11, one token every `t`; reserve 2
//!   (uses 1) at `s`, reserve 7 (uses 0), settle the first, wait `2t`,
//!   take 1, settle the second: 11 tokens were then free where charging
//!   only the actual costs leaves 10. Counting every refund since, above
//!   or below, gave too little when reservations were settled from the
//!   top down (`tests/cost.rs`). Both are tests now, on the model and, in
//!   the conformance suite's `overlapping_reservations_refund_what_is_out`,
//!   on every backend.
//!
//!   An unused unit gives back the time it was charged: the mark carries
//!   the interval of the charge ([`Mark::per`]). Counted at the interval
//!   in force when settled, a refund after an override slowed the refill
//!   gave back more: capacity 10 refilled at 1 a second, reserve 10, halve
//!   the rate, settle 5, and 10 tokens were free where charging 5 outright
//!   leaves 7 (the conformance check
//!   `a_settle_under_a_slower_refill_refunds_only_the_unused`).
//! * *Sliding window*: the units are taken out of the log entry recorded at
//!   the reservation's instant ([`Mark::at`], as the backend saw it, after
//!   clamping), at most that entry's cost. Once the entry has left the
//!   window, nothing is refunded: a window that has rolled already gave the
//!   units back.
//! * *Calendar quota*: the reservation's [`Mark::born`] is the start of the
//!   window its units were counted in, [`Mark::at`] when that window's
//!   count began (its first charge since the window opened or the key was
//!   reset). The refund takes `min(unused, count)` off the count, only
//!   while that window is still the current one and its count the same
//!   (both fields match the key's state). A window that has rolled (the
//!   day, week or month is over) started the next one from zero: it gave
//!   everything back already, so a settle after the boundary refunds
//!   nothing, and the new window owes the old one nothing.
//! * *Progressive delay*: a reservation is an attempt, its units
//!   failures recorded *before* the outcome is known, so that attempts in
//!   flight together see each other: the one that brings the count past
//!   the free attempts starts the delay, and every later one is refused
//!   until it ends (checking, then charging after the response, let every
//!   attempt in flight while the key was free through). A key blocked at
//!   the reservation's instant refuses it and records nothing, as a peek
//!   would: knocking does not lengthen a delay. [`Mark::born`] is when the
//!   key's current life began (its first failure since it was fresh),
//!   [`Mark::at`] the failure's instant. Settling with `actual < units`
//!   refunds `units − actual` failures, in the same life only, never
//!   below zero; the block and the last failure's instant stay (a delay
//!   the refunded failure started runs its course: restoring the earlier
//!   block could shorten one that another failure set). An excess is
//!   recorded as failures at the settle's instant. An unsettled
//!   reservation keeps its failure: a client that drops the connection
//!   mid-attempt is counted one failure, so dropping on purpose earns no
//!   refund. (See [`ProgressiveDelayState::settle`].)
//! * **One life.** Each key's state names its current life
//!   ([`Mark::born`]): the first charge on a fresh key (an empty log; for a
//!   calendar quota, its window and when its count began, [`Mark::at`]); a
//!   token bucket's life (begun by a charge of a full bucket) is named by
//!   its first reservation, so that a life no reservation touches stores
//!   nothing but its arrival time. A refund applies only to the life its reservation was
//!   made in: after a reset, an expiry, or (composites) an override that
//!   changed a part's strategy, the state is another life and nothing is refunded,
//!   so a refund never mints budget the reset already gave back. (Two lives
//!   born in the same microsecond cannot be told apart: a reservation, a
//!   reset and a new charge of the same key within one microsecond of the
//!   server's clock.)
//!
//! **The excess is charged, even into overdraft, bounded.** A call that
//! cost more than its estimate spent the units already: settling charges
//! the excess unconditionally, at the settle's instant, so the key pays it
//! back before its next request passes. One settle charges at most the
//! policy's limit (a bucket's capacity, a window's limit, a calendar
//! quota's limit) more, and a bucket's debt never exceeds two full refills:
//! a wrong usage figure cannot lock a key out for more than that. A
//! calendar quota counts the excess in the current window (the one holding
//! the settle's instant, whichever the reservation was made in), even
//! beyond its limit: the key is then refused until that window ends, never
//! longer. A window's total and a calendar quota's count never exceed
//! [`MAX_COUNT`](crate::policy::MAX_COUNT) (2^53 − 1): an excess beyond
//! it is not counted (a key that holds it is refused anyway), so that the
//! Redis scripts count it exactly.
//!
//! **Settled once.** A settle carries its receipt's [`Receipt::id`] (drawn
//! at random by [`Limiter::reserve`](crate::Limiter::reserve)), and the
//! key remembers it for [`SETTLED_FOR`] (15 minutes) beside its state, not
//! in it: through a reset, an expiry or a new life; at most the latest
//! [`SETTLED_MAX`] (1 024) at once, so that a client whose reservations
//! are all refunded, and who can settle as fast as it asks, cannot grow
//! the record beyond that. A settle of an id the
//! key remembers is a replay (a call the Redis Cluster client re-sent
//! after its connection dropped): it refunds and charges nothing, answers
//! as a peek of one unit. A settle at the estimate (`actual` = its units)
//! changes nothing, replayed or not, and is not remembered: a login
//! attempt settled as the failure it was reserved as leaves nothing. Marks cannot
//! serve: every reservation of a calendar window has the same one, as have
//! a window's reservations made in the same microsecond. A receipt with
//! id 0 (one a caller built, or a backend answered, without one) is
//! settled every time; an application cannot settle one twice anyway:
//! [`Reservation::settle`](crate::Reservation::settle) consumes it.
//!
//! **An unsettled reservation is a plain charge.** Dropped, forgotten, or
//! its worker crashed: the estimate stays charged, and comes back the way
//! every charge does (the bucket refills, the entry leaves the window, the
//! calendar window ends).
//! Nothing is held forever, nothing runs in the background, and the safe
//! side (the whole estimate counted) is the default.
//!
//! # What a strategy provides
//!
//! Two functions in its module, and their twins in its Lua script:
//!
//! * `mark()`: where the last charge sits, as a [`Mark`] (`born`: the
//!   identity of the state the units were taken from; `at`: where in it),
//!   appended to the reply of a reserve (`'r<n>'`);
//! * `settle(now, policy, mark, units, actual)`: the refund or the excess,
//!   answering a peek of one unit (`'s<units>:<actual>:<marks>'`).
//!
//! [`State`](crate::model::State) dispatches to them, composites pass each
//! part its own mark ([`Receipt::part`]), and the conformance suite replays
//! reserves and settles against the model. The calendar quota shows how
//! little a strategy adds: its mark and settle in
//! [its module](crate::calendar::CalendarState::settle), their twin in
//! `common_calendar.lua` (shared by `calendar.lua` and `composite.lua`);
//! not the `Op`, not the [`Receipt`], not the `Limiter` or the layers.
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//! use tollgate_limiter::{model::{Op, Slot}, Policy, TokenBucket};
//!
//! let policy = Policy::from(TokenBucket::new(1_000, 1, Duration::from_secs(1))?);
//! let mut key = Slot::fresh(&policy);
//! let now = 1_000_000;
//! // Reserve the prompt plus max_tokens.
//! let (decision, receipt) = key.reserve(now, &policy, 800);
//! assert_eq!(decision.remaining(), 200);
//! // The model used 300 tokens: 500 come back.
//! let after = key.apply(now, &policy, Op::Settle { receipt, actual: 300 });
//! assert_eq!(after.remaining(), 700);
//! # Ok::<(), tollgate_limiter::PolicyError>(())
//! ```

use crate::strategy::composite::MAX_PARTS;
#[cfg(doc)]
use crate::strategy::progressive_delay::ProgressiveDelayState;
#[cfg(doc)]
use crate::strategy::token_bucket::{MAX_RECENT_REFUNDS, MAX_REFUNDED, TokenBucketState};
use crate::time::Timestamp;

/// Where a reservation's units sit in one policy's state (one part of a
/// composite).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Mark {
    /// The state's current life (see the [module docs](self)): when it
    /// began, or for a token bucket when its first reservation was made.
    pub born: Timestamp,
    /// Token bucket: the theoretical arrival time right after the charge,
    /// plus how far the refunds of this life had moved it back then
    /// ([`TokenBucketState::refunded`]).
    /// Sliding window: the timestamp of the log entry holding the units.
    /// Calendar quota: when the count holding the units began (`born`
    /// being the start of its window).
    pub at: Timestamp,
    /// Token bucket: the refill interval (µs) the units were charged at,
    /// which a refund counts in (an override may have slowed the refill
    /// since). 0 for the other strategies, and for a receipt made before
    /// this field: a refund then counts at the interval in force.
    pub per: u64,
}

/// What a reservation took: its units, and where they sit (one [`Mark`]
/// per part; the first for a single policy).
///
/// A refused reservation took nothing: its receipt is [`Receipt::NONE`].
///
/// This is the backends' vocabulary, plain data: an application holds a
/// [`Reservation`](crate::Reservation), which settles once and never hands
/// its receipt out. The fields are not checked against anything a
/// backend stored: code that builds or alters a receipt and settles it
/// through the [`Backend`](crate::Backend) trait can refund what was never
/// taken (up to a full bucket or window per settle). Never take one from a
/// client.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Receipt {
    /// The units taken (0 when nothing was).
    pub units: u64,
    /// Per part, where the units sit; `None` where the backend did not say
    /// (nothing of that part can be refunded).
    pub marks: [Option<Mark>; MAX_PARTS],
    /// Which settle this is, for the key to refuse its replay (see
    /// the [module docs](self), "Settled once"); 0: none, every settle applies.
    /// Backends answer 0; [`Limiter::reserve`](crate::Limiter::reserve)
    /// draws one at random (64 bits) for the reservation it holds.
    pub id: u64,
}

impl Receipt {
    /// Nothing taken.
    pub const NONE: Receipt = Receipt {
        units: 0,
        marks: [None; MAX_PARTS],
        id: 0,
    };

    /// `units` taken, with no marks: settling may charge an excess but
    /// refunds nothing (what a backend that does not implement
    /// reservations answers).
    pub fn unmarked(units: u64) -> Self {
        Self {
            units,
            ..Self::NONE
        }
    }

    /// The receipt of part `index` alone, as a single policy sees it.
    #[must_use]
    pub fn part(&self, index: usize) -> Self {
        let mut marks = [None; MAX_PARTS];
        marks[0] = self.marks.get(index).copied().flatten();
        Self {
            units: self.units,
            marks,
            id: self.id,
        }
    }
}

/// How long a key remembers a settle's [`Receipt::id`], in microseconds
/// (15 minutes): a replay within that refunds and charges nothing (see
/// the [module docs](self), "Settled once"). The Redis Cluster client's
/// re-sends of one call span at most about 11 minutes (16 retries, each
/// after at most `10 ms × 2^n`, and at least 1.28 s).
pub const SETTLED_FOR: u64 = 900_000_000;

/// The most settles a key remembers at once (see [`Settled`]): the
/// latest are kept. A key whose every reservation is refunded (a layer
/// that ignores its successes, a call that used nothing) settles as fast
/// as its client asks, so the record is bounded by this, not by the
/// requests of 15 minutes. A re-send follows its call within the cluster
/// client's back-off, so an id forgotten this way is one that more than
/// this many settles of the same key have followed since.
pub const SETTLED_MAX: usize = 1024;

/// The settles a key remembers (see [`Slot::settled`](crate::model::Slot::settled)),
/// each for [`SETTLED_FOR`] after the first, at most [`SETTLED_MAX`] of
/// them (the earliest to be forgotten go first, the smallest id first
/// among those forgotten in the same microsecond: a Redis sorted set's
/// order, its members the ids in 20 digits): found in constant time, and
/// forgotten in order. One pointer while none is (most keys never settle).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settled(Option<Box<Remembered>>);

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Remembered {
    /// When each id is forgotten.
    until: std::collections::HashMap<u64, Timestamp>,
    /// The same, in the order forgotten (as a sorted set scores them).
    order: std::collections::BTreeSet<(Timestamp, u64)>,
    /// The latest `until` (a clock stepping back may remember one out of
    /// order).
    latest: Timestamp,
}

impl Settled {
    /// Whether the settle `id` at `now` is a replay of one remembered;
    /// if not, it is remembered until `now +` [`SETTLED_FOR`]. Those
    /// past are forgotten first, and the earliest beyond [`SETTLED_MAX`]
    /// after. `id` 0 is never one.
    pub fn replayed(&mut self, id: u64, now: Timestamp) -> bool {
        if id == 0 {
            return false;
        }
        let r = self.0.get_or_insert_default();
        while let Some(&(until, old)) = r.order.first() {
            if until > now {
                break;
            }
            r.order.pop_first();
            r.until.remove(&old);
        }
        // Every id left is remembered past now.
        if r.until.contains_key(&id) {
            return true;
        }
        let until = now + SETTLED_FOR;
        r.until.insert(id, until);
        r.order.insert((until, id));
        r.latest = r.latest.max(until);
        if r.order.len() > SETTLED_MAX
            && let Some((_, old)) = r.order.pop_first()
        {
            r.until.remove(&old);
        }
        false
    }

    /// Whether a settle is remembered at `now` (the key must be kept).
    pub fn is_live(&self, now: Timestamp) -> bool {
        self.0.as_ref().is_some_and(|r| r.latest > now)
    }

    /// Whether none is remembered, nor was since the last was forgotten.
    pub fn is_empty(&self) -> bool {
        self.0.as_ref().is_none_or(|r| r.order.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How many ids `s` holds.
    fn held(s: &Settled) -> usize {
        s.0.as_ref().map_or(0, |r| r.until.len().max(r.order.len()))
    }

    /// A client whose every reservation is refunded (a layer that ignores
    /// its successes, an LLM call that used nothing) settles as fast as it
    /// asks: the key's record must stay bounded by a constant, not grow
    /// with the requests made in 15 minutes (each a Redis key of its own
    /// on a `noeviction` server).
    #[test]
    fn a_key_remembers_a_bounded_number_of_settles() {
        let mut s = Settled::default();
        let n = 5_000u64;
        for id in 1..=n {
            assert!(!s.replayed(id, id));
        }
        assert_eq!(held(&s), SETTLED_MAX, "ids held");
        // The latest are the ones kept: a re-send follows its call.
        assert!(s.replayed(n, n + 1));
        assert!(s.replayed(n - 1000, n + 1));
    }
}
