//! Calendar quotas: fixed windows aligned to wall-clock boundaries of a
//! time zone (per day, ISO week or month).
//!
//! A [`Calendar`] admits at most `limit` units of cost per calendar day,
//! week or month of one time zone: "10,000 per calendar month,
//! Europe/Berlin", "1,000 per day, UTC". The count starts from zero at each
//! boundary (local midnight; Monday 00:00 for a week, the 1st at 00:00 for a
//! month), whatever was used before: this is the quota of an API plan or an
//! LLM budget, not a rate.
//!
//! # Windows
//!
//! The window holding an instant is `[start, end)`, where `start` is the
//! first instant of its day, week or month in the zone and `end` the first
//! instant of the next one. Windows follow the zone's rules, so they are
//! not all the same length: a day in Europe/Berlin lasts 23 hours when the
//! clocks go forward (the last Sunday of March) and 25 hours when they go
//! back (the last Sunday of October); February lasts 28 or 29 days. A day
//! whose midnight does not exist (a zone that moves its clocks at 00:00)
//! starts at its first instant. The windows of a zone tile the time line:
//! every instant is in exactly one.
//!
//! Time-zone rules come from the IANA database bundled into the binary (the
//! `jiff` crate with its `tzdb-bundle-always` feature, asked through
//! `TimeZoneDatabase::bundled`), not from the host's `/usr/share/zoneinfo`
//! or `TZDIR`: every worker running one build computes the same
//! windows, whatever its host's tzdata says. A new rule reaches tollgate
//! with a new build.
//!
//! # Decisions
//!
//! * A request of `cost` passes if the units used in the current window
//!   plus `cost` stay within `limit`; a refused request consumes nothing.
//! * A refusal's `retry_after` is the end of the window: the next boundary,
//!   when the count starts from zero again. `reset_after` is the same
//!   instant (zero for a window nothing was charged in).
//! * A decision's [`window`](Decision::window) is the current window's
//!   length (what `RateLimit-Policy`'s `w` announces): 23 hours on the day
//!   the clocks go forward. [`Calendar::window`] is the nominal period (1
//!   day, 7 days, 31 days), for where no instant is known.
//! * A cost above `limit` is impossible: no window can ever grant it.
//! * Like every fixed window, a quota can be spent twice in a short time
//!   around a boundary (all of it at the end of one window, all again at
//!   the start of the next): that is what a calendar quota means. Compose it
//!   with a token bucket or a sliding window (a [composite](crate::composite))
//!   to bound the rate as well.
//!
//! # State and expiry
//!
//! A key stores its window, the units used in it, and when that count
//! began (what a [reservation](crate::strategy::reservation)'s mark names).
//! It expires at the end of that window, exactly: from then on its count is worthless, since the
//! next window starts from zero, and the decision that finds it expired
//! reads the same instant from the same clock that decided the expiry (the
//! Redis server's `TIME`, or the caller's clock in test mode), so no slack
//! is needed.
//!
//! A policy change (an override with another period or zone) moves the
//! window: a window other than the stored one starts from zero. An override
//! that only changes the limit keeps counting in the same window.
//!
//! A clock that steps back across a boundary (a server whose clock was
//! corrected) does not reopen the earlier window once the key counted in
//! the newer one: while `now` is before the stored window's start, the
//! stored window is still the one counted in, as the sliding window clamps
//! `now` to its newest event. (A clock that jumps past a boundary and back
//! before the key counted anything in the new window finds the old
//! window's key expired: that window's last moments start from zero. A
//! slack on the expiry would narrow this, at the price of keys outliving
//! their state; exact expiry is the rule every strategy follows.)
//!
//! # Reservations
//!
//! A reservation's estimate is counted like any charge. Settled while its
//! window is still the current one (and the key was not reset since), the
//! unused units come off the count; settled after the boundary, nothing is
//! refunded: the new window started from zero and owes the old one
//! nothing. An excess is counted in the window of the settle's instant, at
//! most `limit` per settle, even beyond the limit. The rules:
//! [`strategy::reservation`](crate::strategy::reservation).
//!
//! # In the Redis backend
//!
//! The script cannot do time-zone arithmetic, so the client computes the
//! bounds ([`Calendar::bounds`]): the previous, current and next windows
//! around its own clock, four instants. The script decides by the server's
//! `TIME`, picking among them the window that holds it: a window that
//! rolls over between the client computing the bounds and the script
//! running is still counted in the right window, and a client clock off by
//! less than a window changes nothing. Should the server's time fall
//! outside them (a client clock off by more than a window, or an override
//! of another period or zone than the client computed for), the script
//! answers with the server's time and the zones it lacks, and the client
//! computes those bounds around the server's time and asks once more.
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//! use tollgate_limiter::{model::{Op, State}, Calendar, Period, Policy};
//!
//! let policy = Policy::from(Calendar::new(2, Period::Day, "Europe/Berlin")?);
//! // 2026-03-28 at 23:00 in Berlin (22:00 UTC), the evening before the
//! // clocks go forward.
//! let evening = 1_774_735_200_000_000;
//! let mut key = State::fresh(&policy);
//! assert!(key.apply(evening, &policy, Op::Acquire(2)).is_allowed());
//! let refused = key.apply(evening, &policy, Op::Acquire(1));
//! // Retry at midnight, Berlin time: in one hour.
//! assert_eq!(refused.retry_after(), Duration::from_secs(3600));
//! // Sunday 29 March lasts 23 hours in Berlin.
//! let sunday = key.apply(evening + 3_600_000_000, &policy, Op::Acquire(1));
//! assert!(sunday.is_allowed());
//! assert_eq!(sunday.window(), Duration::from_secs(23 * 3600));
//! # Ok::<(), tollgate_limiter::PolicyError>(())
//! ```

use std::collections::HashMap;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::str::FromStr;
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use jiff::civil::Date;
use jiff::tz::{TimeZone, TimeZoneDatabase};

use crate::decision::Decision;
use crate::policy::{MAX_COUNT, PolicyError};
use crate::strategy::reservation::Mark;
use crate::time::Timestamp;

const DAY_US: u64 = 86_400_000_000;

/// The calendar unit a [`Calendar`] quota counts over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Period {
    /// A calendar day, from local midnight to the next.
    Day,
    /// An ISO week, from Monday 00:00 to the next Monday 00:00.
    Week,
    /// A calendar month, from the 1st at 00:00 to the next month's 1st.
    Month,
}

impl Period {
    /// The name used in configuration: `day`, `week` or `month`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Day => "day",
            Self::Week => "week",
            Self::Month => "month",
        }
    }

    /// The letter of the Redis encoding: `d`, `w` or `m`.
    pub fn letter(&self) -> char {
        match self {
            Self::Day => 'd',
            Self::Week => 'w',
            Self::Month => 'm',
        }
    }

    /// The period of an encoding letter.
    pub fn from_letter(c: char) -> Option<Self> {
        match c {
            'd' => Some(Self::Day),
            'w' => Some(Self::Week),
            'm' => Some(Self::Month),
            _ => None,
        }
    }

    /// The nominal length: 1, 7 or 31 days (the longest month, so that a
    /// client spreading a quota over it never overspends). Actual windows
    /// differ by a daylight-saving hour, and months are shorter.
    pub fn nominal(&self) -> Duration {
        let days = match self {
            Self::Day => 1,
            Self::Week => 7,
            Self::Month => 31,
        };
        Duration::from_secs(days * 86_400)
    }

    /// The first day of the period holding `d`.
    fn first(&self, d: Date) -> Option<Date> {
        match self {
            Self::Day => Some(d),
            Self::Week => {
                let back = i64::from(d.weekday().to_monday_zero_offset());
                d.checked_sub(jiff::Span::new().days(back)).ok()
            }
            Self::Month => Some(d.first_of_month()),
        }
    }

    /// The first day of the period after the one starting on `first`.
    fn next(&self, first: Date) -> Option<Date> {
        match self {
            Self::Day => first.tomorrow().ok(),
            Self::Week => first.checked_add(jiff::Span::new().days(7)).ok(),
            Self::Month => first.last_of_month().tomorrow().ok(),
        }
    }

    /// The first day of the period before the one starting on `first`.
    fn prev(&self, first: Date) -> Option<Date> {
        self.first(first.yesterday().ok()?)
    }
}

impl fmt::Display for Period {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Period {
    type Err = PolicyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "day" | "daily" => Ok(Self::Day),
            "week" | "weekly" => Ok(Self::Week),
            "month" | "monthly" => Ok(Self::Month),
            _ => Err(PolicyError::new(
                "period",
                format!("unknown calendar period {s:?}; expected day, week or month"),
            )),
        }
    }
}

/// An IANA time zone, interned: a cheap `Copy` handle, compared by name.
///
/// Each distinct zone is loaded from the bundled database once and kept
/// for the life of the process (there are a few hundred zones, and only
/// valid names are interned), so a [`Policy`](crate::Policy) holding one
/// stays `Copy`.
#[derive(Clone, Copy)]
pub struct Zone(&'static Interned);

struct Interned {
    name: Box<str>,
    tz: TimeZone,
}

static ZONES: LazyLock<Mutex<HashMap<String, &'static Interned>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// The database bundled into the binary, asked explicitly: even if another
/// crate of the build turned on jiff's system-database features, zones come
/// from here, never from the host.
static BUNDLED: LazyLock<TimeZoneDatabase> = LazyLock::new(TimeZoneDatabase::bundled);

impl Zone {
    /// The zone named `name` in the IANA database (`"Europe/Berlin"`,
    /// `"UTC"`; case-insensitive, kept in its canonical spelling). The
    /// error's field is `time_zone`.
    pub fn get(name: &str) -> Result<Self, PolicyError> {
        let invalid = |why: String| PolicyError::new("time_zone", why);
        let name = name.trim();
        // Remembered case-folded: one entry per zone name the database
        // knows, however a caller (or whoever writes an override key in
        // Redis) spells it, so the map cannot be grown at will.
        let folded = name.to_ascii_lowercase();
        if let Some(z) = crate::lock(&ZONES).get(&folded) {
            return Ok(Self(z));
        }
        let tz = BUNDLED.get(name).map_err(|_| {
            invalid(format!(
                "unknown time zone {name:?} (an IANA name such as \"Europe/Berlin\" or \"UTC\")"
            ))
        })?;
        let canonical = tz.iana_name().unwrap_or(name).to_owned();
        // The name travels in the Redis encoding, between ':' and '|'.
        if canonical.is_empty()
            || !canonical
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"/_+-".contains(&b))
        {
            return Err(invalid(format!("unsupported time zone name {name:?}")));
        }
        let mut zones = crate::lock(&ZONES);
        let z = *zones
            .entry(canonical.to_ascii_lowercase())
            .or_insert_with(|| {
                Box::leak(Box::new(Interned {
                    name: canonical.into_boxed_str(),
                    tz,
                }))
            });
        zones.insert(folded, z);
        Ok(Self(z))
    }

    /// UTC.
    pub fn utc() -> Self {
        Self::get("UTC").expect("UTC is in every time zone database")
    }

    /// The canonical IANA name.
    pub fn name(&self) -> &'static str {
        &self.0.name
    }

    /// The zone's rules, as [`jiff`] (re-exported) reads them.
    pub fn time_zone(&self) -> &'static TimeZone {
        &self.0.tz
    }

    /// `ts` (µs since the epoch) as this zone's wall clock, in RFC 9557
    /// form: `2026-03-01T00:00:00+01:00[Europe/Berlin]`.
    pub fn civil(&self, ts: Timestamp) -> String {
        i64::try_from(ts)
            .ok()
            .and_then(|us| jiff::Timestamp::from_microsecond(us).ok())
            .map_or_else(
                || format!("@{ts}µs"),
                |t| t.to_zoned_datetime(self.0.tz.clone()).to_string(),
            )
    }

    /// The first instant of `d` in this zone (µs since the epoch).
    fn start_of(&self, d: Date) -> Option<Timestamp> {
        let zdt = d.to_zoned_datetime(self.0.tz.clone()).ok()?;
        u64::try_from(zdt.timestamp().as_microsecond()).ok()
    }

    /// The civil date of `now` in this zone.
    fn date_of(&self, now: Timestamp) -> Option<Date> {
        let ts = jiff::Timestamp::from_microsecond(i64::try_from(now).ok()?).ok()?;
        Some(ts.to_zoned_datetime(self.0.tz.clone()).date())
    }
}

impl PartialEq for Zone {
    fn eq(&self, other: &Self) -> bool {
        self.0.name == other.0.name
    }
}

impl Eq for Zone {}

impl Hash for Zone {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.name.hash(state);
    }
}

impl fmt::Debug for Zone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Zone({:?})", self.name())
    }
}

impl fmt::Display for Zone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A calendar quota: at most `limit` units of cost per calendar `period`
/// of time zone `zone` (see the [module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Calendar {
    limit: u64,
    period: Period,
    zone: Zone,
}

impl Calendar {
    /// At most `limit` units per `period` in the IANA time zone named
    /// `time_zone`. Errors name the field: `limit` or `time_zone`.
    pub fn new(limit: u64, period: Period, time_zone: &str) -> Result<Self, PolicyError> {
        Self::in_zone(limit, period, Zone::get(time_zone)?)
    }

    /// At most `limit` units per `period` in `zone` (`limit` from 1 to
    /// [`MAX_COUNT`]).
    pub fn in_zone(limit: u64, period: Period, zone: Zone) -> Result<Self, PolicyError> {
        if limit == 0 {
            return Err(PolicyError::new("limit", "must be at least 1"));
        }
        let limit = crate::policy::count("limit", limit)?;
        Ok(Self {
            limit,
            period,
            zone,
        })
    }

    /// The most cost admitted in one window.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The calendar period.
    pub fn period(&self) -> Period {
        self.period
    }

    /// The time zone whose wall clock the windows follow.
    pub fn zone(&self) -> Zone {
        self.zone
    }

    /// The nominal window ([`Period::nominal`]).
    pub fn window(&self) -> Duration {
        self.period.nominal()
    }

    /// What the Redis scripts match bounds by: `<period letter>:<zone>`.
    pub fn spec(&self) -> String {
        format!("{}:{}", self.period.letter(), self.zone.name())
    }

    /// The window `[start, end)` holding `now` (µs since the epoch).
    ///
    /// Instants the time-zone database cannot place (beyond the year 9999)
    /// fall back to UTC days, so the answer is always a window holding
    /// `now`.
    pub fn window_at(&self, now: Timestamp) -> (Timestamp, Timestamp) {
        // Windows tile the time line, so a recent window of the same zone
        // and period that holds `now` is the answer: most decisions skip
        // the time-zone arithmetic (about half a microsecond).
        let id = (std::ptr::from_ref(self.zone.0) as usize, self.period);
        let hit = RECENT.with_borrow(|recent| {
            recent
                .iter()
                .flatten()
                .find(|&&(z, p, s, e)| (z, p) == id && s <= now && now < e)
                .map(|&(_, _, s, e)| (s, e))
        });
        if let Some(w) = hit {
            return w;
        }
        match self.try_window_at(now) {
            Some((s, e)) => {
                RECENT.with_borrow_mut(|recent| {
                    recent.rotate_right(1);
                    recent[0] = Some((id.0, id.1, s, e));
                });
                (s, e)
            }
            None => {
                let start = now - now % DAY_US;
                (start, start.saturating_add(DAY_US))
            }
        }
    }

    fn try_window_at(&self, now: Timestamp) -> Option<(Timestamp, Timestamp)> {
        let p = self.period;
        let mut first = p.first(self.zone.date_of(now)?)?;
        // The civil date is a first guess: a zone stepping back across
        // midnight repeats the previous date's last hour after the new
        // date began. Step to the period whose bounds hold `now`, so the
        // windows tile the time line whatever the rules.
        for _ in 0..4 {
            let start = self.zone.start_of(first)?;
            let next = p.next(first)?;
            let end = self.zone.start_of(next)?;
            if now < start {
                first = p.prev(first)?;
            } else if now >= end {
                first = next;
            } else {
                return Some((start, end));
            }
        }
        None
    }

    /// The bounds the Redis script picks the window from: the previous
    /// window's start, the current window's start and end (the next one's
    /// start), and the next window's end, around `now`.
    pub fn bounds(&self, now: Timestamp) -> [Timestamp; 4] {
        let (start, end) = self.window_at(now);
        let prev = self.window_at(start.saturating_sub(1)).0.min(start);
        let next_end = self.window_at(end).1.max(end);
        [prev, start, end, next_end]
    }
}

/// A recent window: (zone address, period, start, end).
type Recent = Option<(usize, Period, Timestamp, Timestamp)>;

thread_local! {
    /// The last few windows this thread computed (no lock, no sharing).
    static RECENT: std::cell::RefCell<[Recent; 4]> = const { std::cell::RefCell::new([None; 4]) };
}

/// State of one calendar key: the window counted in and the units used.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CalendarState {
    /// The window's first instant; 0 for a fresh key.
    pub start: Timestamp,
    /// The window's end (the next window's first instant).
    pub end: Timestamp,
    /// Units of cost admitted in the window.
    pub used: u64,
    /// When this count began: the first charge counted in the window since
    /// it opened or since the key was reset (see
    /// [reservations](crate::strategy::reservation)); 0 for a fresh key.
    pub born: Timestamp,
}

impl CalendarState {
    /// Takes `cost` units at `now` (a cost of 0 counts as 1).
    pub fn acquire(&mut self, now: Timestamp, p: &Calendar, cost: u64) -> Decision {
        self.decide(now, p, cost, true)
    }

    /// Whether `cost` units would be taken at `now`; changes nothing.
    pub fn peek(&self, now: Timestamp, p: &Calendar, cost: u64) -> Decision {
        let mut copy = *self;
        copy.decide(now, p, cost, false)
    }

    /// The window a decision at `now` counts in, and the units already
    /// counted in it.
    fn current(&self, now: Timestamp, p: &Calendar) -> (Timestamp, Timestamp, u64) {
        // A clock behind the stored window's start (stepped back) keeps
        // counting in that window rather than reopening an earlier one.
        let (start, end) = if self.used > 0 && self.start > now {
            (self.start, self.end)
        } else {
            p.window_at(now)
        };
        let used = if self.used > 0 && self.start == start && self.end == end {
            self.used
        } else {
            0
        };
        (start, end, used)
    }

    /// Counts `units` more in the current window (a new count begins at
    /// `now` if it held none).
    fn charge(&mut self, now: Timestamp, p: &Calendar, units: u64) {
        let (start, end, used) = self.current(now, p);
        let born = if used == 0 { now } else { self.born };
        *self = Self {
            start,
            end,
            // At most MAX_COUNT: an excess beyond it is not counted, so
            // the Redis script's count stays an exact Lua integer.
            used: used.saturating_add(units).min(MAX_COUNT),
            born,
        };
    }

    fn decide(&mut self, now: Timestamp, p: &Calendar, cost: u64, charge: bool) -> Decision {
        let cost = cost.max(1);
        let (start, end, used) = self.current(now, p);
        let limit = p.limit();
        let window = Duration::from_micros(end - start);
        let until_end = end - now;
        let remaining = limit.saturating_sub(used);
        let reset = if used > 0 { until_end } else { 0 };
        if cost > limit {
            return Decision::impossible(limit, remaining, reset).with_window(window);
        }
        if used + cost > limit {
            return Decision::from_micros(false, limit, remaining, until_end, reset)
                .with_window(window);
        }
        if !charge {
            return Decision::from_micros(true, limit, remaining, 0, reset).with_window(window);
        }
        self.charge(now, p, cost);
        Decision::from_micros(true, limit, remaining - cost, 0, until_end).with_window(window)
    }

    /// Where a charge just made sits: `born` is the start of the window
    /// the units were counted in, `at` when that count began (a reset
    /// starts another count in the same window).
    pub fn mark(&self) -> Mark {
        Mark {
            born: self.start,
            at: self.born,
            per: 0,
        }
    }

    /// Settles a reservation of `units` that cost `actual` (see
    /// [reservations](crate::strategy::reservation)): takes the unused
    /// units off the count (at most all of it) while the reservation's
    /// window is still the current one and its count the same; or counts
    /// the excess in the current window (at most `limit`, even beyond
    /// the limit). Answers as a peek of 1 afterwards.
    pub fn settle(
        &mut self,
        now: Timestamp,
        p: &Calendar,
        mark: Option<Mark>,
        units: u64,
        actual: u64,
    ) -> Decision {
        if actual < units {
            let (start, end, used) = self.current(now, p);
            if let Some(m) = mark
                && used > 0
                && start == self.start
                && end == self.end
                && m.born == start
                && m.at == self.born
            {
                self.used = used - (units - actual).min(used);
            }
        } else if actual > units {
            self.charge(now, p, (actual - units).min(p.limit()));
        }
        self.peek(now, p, 1)
    }

    /// When this state becomes equal to a fresh key's: the end of its
    /// window (see the [module docs](self) on expiry).
    pub fn expires_at(&self) -> Timestamp {
        if self.used == 0 { 0 } else { self.end }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: u64 = 3_600_000_000;

    /// Every spelling of a zone finds one entry: the interned map used to
    /// keep one per spelling, which whoever can write an override key
    /// could grow at will (2^13 spellings of "Europe/Berlin" alone).
    #[test]
    fn spellings_of_a_zone_share_one_entry() {
        let spellings = ["eUrOpE/bErLiN", "EUROPE/BERLIN", " europe/berlin "];
        for name in spellings {
            assert_eq!(Zone::get(name).unwrap().name(), "Europe/Berlin");
        }
        let zones = crate::lock(&ZONES);
        assert!(
            zones.keys().all(|k| *k == k.to_ascii_lowercase()),
            "a spelling was kept: {:?}",
            zones.keys().find(|k| **k != k.to_ascii_lowercase())
        );
        assert!(zones.contains_key("europe/berlin"));
    }

    /// µs since the epoch of a civil time in `tz`.
    fn at(tz: &str, y: i16, m: i8, d: i8, h: i8, min: i8) -> Timestamp {
        let zdt = jiff::civil::date(y, m, d)
            .at(h, min, 0, 0)
            .to_zoned_datetime(Zone::get(tz).unwrap().time_zone().clone())
            .unwrap();
        u64::try_from(zdt.timestamp().as_microsecond()).unwrap()
    }

    fn cal(period: Period, tz: &str) -> Calendar {
        Calendar::new(10, period, tz).unwrap()
    }

    #[test]
    fn berlin_days_last_23_and_25_hours_across_daylight_saving() {
        let day = cal(Period::Day, "Europe/Berlin");
        // Clocks go forward on Sunday 29 March 2026 (02:00 -> 03:00).
        let (s, e) = day.window_at(at("Europe/Berlin", 2026, 3, 29, 12, 0));
        assert_eq!(s, at("Europe/Berlin", 2026, 3, 29, 0, 0));
        assert_eq!(e, at("Europe/Berlin", 2026, 3, 30, 0, 0));
        assert_eq!(e - s, 23 * H);
        // And back on Sunday 25 October 2026 (03:00 -> 02:00).
        let (s, e) = day.window_at(at("Europe/Berlin", 2026, 10, 25, 2, 30));
        assert_eq!(e - s, 25 * H);
        assert_eq!(s, at("UTC", 2026, 10, 24, 22, 0));
        // An ordinary day, and the same instant's UTC day.
        let (s, e) = day.window_at(at("Europe/Berlin", 2026, 6, 1, 0, 30));
        assert_eq!((s, e - s), (at("UTC", 2026, 5, 31, 22, 0), 24 * H));
        let (s, _) = cal(Period::Day, "UTC").window_at(at("Europe/Berlin", 2026, 6, 1, 0, 30));
        assert_eq!(s, at("UTC", 2026, 5, 31, 0, 0));
    }

    #[test]
    fn months_follow_the_calendar() {
        let month = cal(Period::Month, "Europe/Berlin");
        let (s, e) = month.window_at(at("Europe/Berlin", 2026, 2, 14, 9, 0));
        assert_eq!(s, at("Europe/Berlin", 2026, 2, 1, 0, 0));
        assert_eq!(e, at("Europe/Berlin", 2026, 3, 1, 0, 0));
        assert_eq!(e - s, 28 * 24 * H);
        // A leap February.
        let (s, e) = month.window_at(at("Europe/Berlin", 2028, 2, 29, 23, 59));
        assert_eq!(e - s, 29 * 24 * H);
        // March 2026 loses the daylight-saving hour.
        let (s, e) = month.window_at(at("Europe/Berlin", 2026, 3, 31, 23, 59));
        assert_eq!(e - s, 31 * 24 * H - H);
        // The last instant of January is in January; midnight starts February.
        let feb = at("Europe/Berlin", 2026, 2, 1, 0, 0);
        assert_eq!(month.window_at(feb - 1).1, feb);
        assert_eq!(month.window_at(feb).0, feb);
        // December rolls into the next year.
        let (_, e) = month.window_at(at("Europe/Berlin", 2026, 12, 31, 23, 0));
        assert_eq!(e, at("Europe/Berlin", 2027, 1, 1, 0, 0));
    }

    #[test]
    fn iso_weeks_start_on_monday() {
        let week = cal(Period::Week, "Europe/Berlin");
        // Thursday 1 January 2026: the week began on Monday 29 December.
        let (s, e) = week.window_at(at("Europe/Berlin", 2026, 1, 1, 12, 0));
        assert_eq!(s, at("Europe/Berlin", 2025, 12, 29, 0, 0));
        assert_eq!(e, at("Europe/Berlin", 2026, 1, 5, 0, 0));
        // Sunday 23:59 is still the old week; Monday 00:00 the new one.
        let monday = at("Europe/Berlin", 2026, 1, 12, 0, 0);
        assert_eq!(week.window_at(monday - 1).1, monday);
        assert_eq!(week.window_at(monday).0, monday);
        // The week of the October change lasts 7 days and 1 hour.
        let (s, e) = week.window_at(at("Europe/Berlin", 2026, 10, 22, 0, 0));
        assert_eq!(e - s, 7 * 24 * H + H);
    }

    #[test]
    fn windows_tile_the_time_line() {
        for tz in [
            "Europe/Berlin",
            "America/Sao_Paulo",
            "Australia/Lord_Howe",
            "UTC",
        ] {
            for period in [Period::Day, Period::Week, Period::Month] {
                let c = cal(period, tz);
                let mut t = at("UTC", 2018, 1, 1, 0, 0);
                let end = at("UTC", 2019, 1, 1, 0, 0);
                while t < end {
                    // Computed, not remembered.
                    let (s, e) = c.try_window_at(t).unwrap();
                    assert!(s <= t && t < e, "{tz} {period}: {t} not in [{s}, {e})");
                    assert_eq!(
                        c.try_window_at(e).unwrap().0,
                        e,
                        "{tz} {period}: windows touch"
                    );
                    assert_eq!(c.try_window_at(e - 1), Some((s, e)));
                    assert_eq!(c.window_at(t + (e - t) / 2), (s, e), "remembered");
                    let b = c.bounds(t);
                    assert!(b[0] < b[1] && b[1] == s && b[2] == e && e < b[3]);
                    t = e;
                }
            }
        }
    }

    #[test]
    fn midnight_in_a_gap_starts_the_day_at_its_first_instant() {
        // Sao Paulo moved its clocks forward at 00:00 until 2019:
        // 4 November 2018 began at 01:00.
        let day = cal(Period::Day, "America/Sao_Paulo");
        let (s, e) = day.window_at(at("America/Sao_Paulo", 2018, 11, 4, 12, 0));
        assert_eq!(s, at("America/Sao_Paulo", 2018, 11, 4, 1, 0));
        assert_eq!(e - s, 23 * H);
    }

    #[test]
    fn a_refusal_waits_for_the_next_boundary() {
        let p = Calendar::new(3, Period::Month, "Europe/Berlin").unwrap();
        let mut s = CalendarState::default();
        let now = at("Europe/Berlin", 2026, 2, 27, 12, 0);
        let d = s.acquire(now, &p, 2);
        assert_eq!((d.is_allowed(), d.remaining()), (true, 1));
        assert_eq!(d.reset_after(), Duration::from_secs(36 * 3600));
        assert_eq!(d.window(), Duration::from_secs(28 * 86_400));
        let d = s.acquire(now, &p, 2);
        assert!(d.is_denied());
        assert_eq!(d.remaining(), 1);
        assert_eq!(d.retry_after(), Duration::from_secs(36 * 3600));
        assert!(s.acquire(now, &p, 1).is_allowed());
        assert!(s.acquire(now, &p, 1).is_denied());
        // One microsecond before March: still refused; at March: fresh.
        let march = at("Europe/Berlin", 2026, 3, 1, 0, 0);
        assert!(s.peek(march - 1, &p, 1).is_denied());
        let d = s.acquire(march, &p, 3);
        assert!(d.is_allowed());
        assert_eq!(d.remaining(), 0);
        assert!(s.acquire(march, &p, 4).is_impossible());
    }

    #[test]
    fn a_clock_stepping_back_keeps_the_newer_window() {
        let p = Calendar::new(1, Period::Day, "UTC").unwrap();
        let mut s = CalendarState::default();
        let midnight = at("UTC", 2026, 5, 2, 0, 0);
        assert!(s.acquire(midnight, &p, 1).is_allowed());
        let d = s.acquire(midnight - 1_000_000, &p, 1);
        assert!(d.is_denied());
        assert_eq!(d.retry_after(), Duration::from_secs(86_401));
    }

    #[test]
    fn a_settle_refunds_in_its_window_and_count_only() {
        let p = Calendar::new(10, Period::Day, "UTC").unwrap();
        let noon = at("UTC", 2026, 5, 2, 12, 0);
        let mut s = CalendarState::default();
        assert!(s.acquire(noon, &p, 2).is_allowed());
        assert!(s.acquire(noon + H, &p, 6).is_allowed());
        let m = s.mark();
        assert_eq!((m.born, m.at), (at("UTC", 2026, 5, 2, 0, 0), noon));
        // A clock stepped back still counts in the stored window.
        let d = s.settle(noon - 13 * H, &p, Some(m), 6, 1);
        assert_eq!(d.remaining(), 7);
        // Never more than the count.
        assert_eq!(s.settle(noon, &p, Some(m), 100, 0).remaining(), 10);
        // Another count in the same window refunds nothing of this one.
        assert!(s.acquire(noon + 2 * H, &p, 4).is_allowed());
        assert_eq!(s.settle(noon + 2 * H, &p, Some(m), 4, 0).remaining(), 6);
        // Without a mark: no refund, but an excess is counted.
        let d = s.settle(noon + 2 * H, &p, None, 1, 30);
        assert_eq!((d.remaining(), s.used), (0, 14));
        // The next day owes nothing, and takes the excess.
        let next = at("UTC", 2026, 5, 3, 0, 0);
        let m = s.mark();
        assert_eq!(s.settle(next, &p, Some(m), 4, 0).remaining(), 10);
        assert_eq!(s.settle(next, &p, Some(m), 4, 7).remaining(), 7);
        assert_eq!(s.expires_at(), at("UTC", 2026, 5, 4, 0, 0));
    }

    #[test]
    fn a_changed_period_starts_afresh_and_a_changed_limit_does_not() {
        let day = Calendar::new(2, Period::Day, "UTC").unwrap();
        let mut s = CalendarState::default();
        let now = at("UTC", 2026, 5, 4, 10, 0); // a Monday
        assert!(s.acquire(now, &day, 2).is_allowed());
        let more = Calendar::new(3, Period::Day, "UTC").unwrap();
        assert_eq!(s.peek(now, &more, 1).remaining(), 1);
        let week = Calendar::new(2, Period::Week, "UTC").unwrap();
        assert_eq!(s.peek(now, &week, 1).remaining(), 2);
    }

    #[test]
    fn zones_are_interned_canonical_and_validated() {
        let a = Zone::get("europe/berlin").unwrap();
        let b = Zone::get("Europe/Berlin").unwrap();
        assert_eq!(a, b);
        assert_eq!(a.name(), "Europe/Berlin");
        assert!(std::ptr::eq(a.0, b.0));
        assert_eq!(Zone::get("Mars/Olympus").unwrap_err().field, "time_zone");
        assert_eq!(Zone::get("").unwrap_err().field, "time_zone");
        assert_eq!(Zone::utc().name(), "UTC");
        assert_eq!(
            a.civil(at("Europe/Berlin", 2026, 3, 1, 0, 0)),
            "2026-03-01T00:00:00+01:00[Europe/Berlin]"
        );
        assert_eq!("fortnight".parse::<Period>().unwrap_err().field, "period");
        assert_eq!("Month".parse::<Period>().unwrap(), Period::Month);
        assert_eq!(
            Calendar::new(0, Period::Day, "UTC").unwrap_err().field,
            "limit"
        );
    }
}
