//! Exact sliding window: its policy and its state (an event log) in the
//! reference model.

use std::collections::VecDeque;
use std::time::Duration;

use crate::decision::Decision;
use crate::policy::{MAX_COUNT, PolicyError, count, span};
use crate::strategy::reservation::Mark;
use crate::time::Timestamp;

/// Exact sliding window: at most `limit` units of cost in any
/// `window`-long interval, counted from a log of events.
///
/// A refused request is not recorded unless
/// [`penalise_refused`](Self::penalise_refused) is set, which makes a flood
/// keep itself locked out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SlidingWindow {
    limit: u64,
    window: Duration,
    window_us: u64,
    penalise_refused: bool,
}

impl SlidingWindow {
    /// At most `limit` units of cost per `window` (`limit` from 1 to
    /// [`MAX_COUNT`]).
    pub fn new(limit: u64, window: Duration) -> Result<Self, PolicyError> {
        if limit == 0 {
            return Err(PolicyError::new("limit", "must be at least 1"));
        }
        let limit = count("limit", limit)?;
        let window_us = span("window", window)?;
        Ok(Self {
            limit,
            window,
            window_us,
            penalise_refused: false,
        })
    }

    /// Records refused requests too, so that a client that keeps hammering
    /// stays refused.
    #[must_use]
    pub fn penalise_refused(mut self, yes: bool) -> Self {
        self.penalise_refused = yes;
        self
    }

    /// The most cost admitted in any window.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The window length.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// [`window`](Self::window) in microseconds.
    pub fn window_micros(&self) -> u64 {
        self.window_us
    }

    /// Whether refused requests are recorded.
    pub fn penalises_refused(&self) -> bool {
        self.penalise_refused
    }
}

/// State of one sliding-window key: the log of admitted (and, if
/// penalised, refused) events, oldest first.
///
/// **Bounded log.** Whenever a decision records an event, the oldest
/// events are dropped while the newer ones alone still hold at least
/// `limit` units (`total - head_cost >= limit`). Events leave the window
/// oldest first, so as long as any kept event is in the window every
/// dropped one is too, and the kept ones alone already refuse every
/// request: the verdict, `remaining` (0) and the exact retry-after
/// (`needed = total + want - limit >= want > 0` is reached inside the kept
/// events) are the same as with the whole log. Without a penalty the log
/// never holds more than `limit` units, so this only ever trims penalised
/// windows under a flood: a key keeps at most `limit` events (each costs at
/// least 1) and a decision's work is bounded by the limit, never by how
/// many requests a client sent.
///
/// The one observable consequence: an override *raising* the limit while a
/// trimmed log is in the window sees only the kept units (at least the old
/// limit), not every refused request of the flood.
///
/// The argument needs the kept events never to lose units before the
/// dropped ones leave the window, which a reservation's refund would do
/// (an excess settled into the window trims it, then a kept reservation
/// is refunded: the kept units alone would no longer refuse while the
/// dropped ones still should). So the state remembers when the newest
/// dropped event leaves the window ([`trimmed_until`](Self::trimmed_until)),
/// and a refund gives nothing back before then (the safe side: the whole
/// estimate stays counted).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlidingWindowState {
    /// `(timestamp, cost)`, timestamps non-decreasing.
    pub events: VecDeque<(Timestamp, u64)>,
    /// Sum of the costs in `events`.
    pub total: u64,
    /// When this life of the key began: the first event recorded in an
    /// empty log (see [reservations](crate::strategy::reservation)).
    pub born: Timestamp,
    /// When the newest event the bounded log dropped leaves the window
    /// (0 when none was dropped): until then, a refund gives nothing back
    /// (see the type's docs).
    pub trimmed_until: Timestamp,
}

/// What a sliding-window decision may write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Record {
    /// An acquire: record the cost if it fits or the window penalises.
    Charge,
    /// Nothing.
    Peek,
    /// Record the units if the window penalises, and answer a peek.
    Penalty,
    /// Record the units (at most `limit`) whatever the policy, and answer
    /// a peek: a settled reservation's excess.
    Overdraw,
}

impl SlidingWindowState {
    /// Takes `cost` units at `now` (a cost of 0 counts as 1).
    ///
    /// `now` is clamped to the newest event, so a clock that steps back
    /// cannot reorder the log.
    pub fn acquire(&mut self, now: Timestamp, p: &SlidingWindow, cost: u64) -> Decision {
        self.decide(now, p, cost, Record::Charge)
    }

    /// Whether `cost` units would be taken at `now`; records nothing
    /// (events that left the window are dropped, which changes no answer).
    pub fn peek(&mut self, now: Timestamp, p: &SlidingWindow, cost: u64) -> Decision {
        self.decide(now, p, cost, Record::Peek)
    }

    /// Records `units` refused units at `now` if the window penalises
    /// refusals (see [`Op::Penalise`](crate::model::Op::Penalise)), then answers a peek of 1.
    pub fn penalise(&mut self, now: Timestamp, p: &SlidingWindow, units: u64) -> Decision {
        self.decide(now, p, units, Record::Penalty)
    }

    fn decide(&mut self, now: Timestamp, p: &SlidingWindow, cost: u64, rec: Record) -> Decision {
        let w = p.window_micros();
        let now = self.events.back().map_or(now, |&(ts, _)| now.max(ts));
        while let Some(&(ts, c)) = self.events.front() {
            if ts + w > now {
                break;
            }
            self.total -= c;
            self.events.pop_front();
        }
        let limit = p.limit();
        let record = |s: &mut Self, cost: u64| {
            // The count saturates at MAX_COUNT (an overdraft or a flood's
            // penalties beyond it are not recorded): every number the
            // Redis script computes then stays an exact Lua integer.
            let cost = cost.min(MAX_COUNT.saturating_sub(s.total));
            if cost == 0 {
                return;
            }
            if s.total == 0 {
                s.born = now;
            }
            match s.events.back_mut() {
                Some((ts, c)) if *ts == now => *c += cost,
                _ => s.events.push_back((now, cost)),
            }
            s.total += cost;
            s.trim(limit, w);
        };
        let want = match rec {
            Record::Penalty => {
                let units = cost.min(limit);
                if units > 0 && p.penalises_refused() {
                    record(self, units);
                }
                1
            }
            Record::Overdraw => {
                let units = cost.min(limit);
                if units > 0 {
                    record(self, units);
                }
                1
            }
            Record::Charge | Record::Peek => cost.max(1),
        };
        let reset = |s: &Self| s.events.back().map_or(0, |&(ts, _)| ts + w - now);
        if want > limit {
            return Decision::impossible(limit, limit.saturating_sub(self.total), reset(self));
        }
        let fits = self.total + want <= limit;
        if rec == Record::Charge && (fits || p.penalises_refused()) {
            record(self, want);
        }
        let retry = if fits {
            0
        } else {
            self.retry_after(now, w, limit, want)
        };
        let remaining = limit.saturating_sub(self.total);
        Decision::from_micros(fits, limit, remaining, retry, reset(self))
    }

    /// Where a charge just made sits: this life, and the newest entry.
    pub fn mark(&self) -> Option<Mark> {
        self.events.back().map(|&(at, _)| Mark {
            born: self.born,
            at,
            per: 0,
        })
    }

    /// Settles a reservation of `units` that cost `actual` (see
    /// [reservations](crate::strategy::reservation)): takes the unused
    /// units out of the entry the reservation recorded, if it is still in
    /// the window and in this life (at most its cost), or records the
    /// excess now (at most `limit`). Answers as a peek of 1 afterwards.
    pub fn settle(
        &mut self,
        now: Timestamp,
        p: &SlidingWindow,
        mark: Option<Mark>,
        units: u64,
        actual: u64,
    ) -> Decision {
        if actual > units {
            return self.decide(now, p, actual - units, Record::Overdraw);
        }
        // Drops the events that left the window first.
        let before = self.decide(now, p, 1, Record::Peek);
        // Not while an event the log dropped is still in the window: the
        // kept ones must keep holding the limit until it leaves.
        let Some(m) =
            mark.filter(|m| actual < units && m.born == self.born && self.trimmed_until <= now)
        else {
            return before;
        };
        let Some(i) = self.events.iter().position(|&(ts, _)| ts == m.at) else {
            return before;
        };
        let refund = (units - actual).min(self.events[i].1);
        self.events[i].1 -= refund;
        self.total -= refund;
        if self.events[i].1 == 0 {
            self.events.remove(i);
        }
        self.decide(now, p, 1, Record::Peek)
    }

    /// Drops the oldest events while the newer ones alone hold at least
    /// `limit` units (see the type's docs for why no answer changes).
    fn trim(&mut self, limit: u64, w: u64) {
        while let Some(&(ts, c)) = self.events.front() {
            if self.total - c < limit {
                break;
            }
            self.total -= c;
            self.events.pop_front();
            self.trimmed_until = self.trimmed_until.max(ts + w);
        }
    }

    /// The exact moment a request of `cost` fits: when the oldest events
    /// that block it leave the window.
    fn retry_after(&self, now: Timestamp, w: u64, limit: u64, cost: u64) -> u64 {
        let needed = (self.total + cost).saturating_sub(limit);
        let mut freed = 0;
        for &(ts, c) in &self.events {
            freed += c;
            if freed >= needed {
                return ts + w - now;
            }
        }
        // Unreachable: a cost above the limit is answered as impossible.
        w
    }

    /// When this state becomes equal to a fresh key's.
    pub fn expires_at(&self, p: &SlidingWindow) -> Timestamp {
        self.events
            .back()
            .map_or(0, |&(ts, _)| ts + p.window_micros())
    }
}
