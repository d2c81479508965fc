//! Adaptive (AIMD) limits for outbound requests: a rate that the remote
//! side sets.
//!
//! A crawler does not know how fast a source lets it go; the source tells
//! it, by refusing (`429`, `503`) when it goes too fast. An [`AimdLimiter`]
//! keeps one token bucket per *scope* (an account, a site) whose rate rises
//! additively while requests succeed and is cut multiplicatively when the
//! source refuses, within `[min_rate, max_rate]`:
//!
//! * [`acquire`](AimdLimiter::acquire) waits (asynchronously, on a tokio
//!   runtime) until the scope has a token;
//! * [`feedback`](AimdLimiter::feedback) reports what the source answered:
//!   [`Outcome::Success`] ramps the rate up by `increase` (at most once per
//!   reaction window), [`Outcome::Refused`] cuts it by the `decrease` factor
//!   (at most once per reaction window: in-flight requests that fail
//!   together are one signal) and, with a `Retry-After`, holds the scope
//!   until then; [`Outcome::Failed`] (a network error, a 500) says nothing
//!   about the rate and changes nothing.
//!
//! # Shared state
//!
//! Every decision that must hold across workers lives in the shared
//! [`Backend`], under the limiter's name `<name>` and four auxiliary
//! limiter names derived from it, all keyed by the scope:
//!
//! | limiter name   | strategy          | role |
//! |----------------|-------------------|------|
//! | `<name>`       | token bucket      | the scope's bucket. Its policy is the initial rate; the adapted rate is a per-key [runtime override](Backend::set_override), so every worker spends tokens from one bucket at one rate. |
//! | `<name>-cut`   | token bucket, capacity 1, one token per reaction window | the cut gate: a refusal cuts the rate only if it takes the token. The refusals of one burst find the gate empty and count as one signal, whichever worker sees them. |
//! | `<name>-grow`  | same              | the growth gate: one additive step per reaction window for the whole fleet, and none while the cut gate is empty (a cut in the last window). |
//! | `<name>-hold`  | progressive delay | the remote's `Retry-After`: a refusal records one failure blocking the key until then; every [`acquire`](AimdLimiter::acquire) first looks at it (a peek, [`Op::PEEK`]: it records nothing). |
//! | `<name>-seen`  | progressive delay that never blocks, forgotten after `idle_expiry` | when the scope was last used: a scope found fresh after `idle_expiry` forgets its adapted rate and starts again from `initial_rate`. |
//!
//! Gates and holds are atomic backend decisions, so "one cut per window"
//! and "hold until Retry-After" hold across any number of workers. The rate
//! itself is an override changed by compare-and-set
//! ([`Backend::replace_override`]): a step up is written only over the
//! rate it read, so a cut written meanwhile by another worker stands; a
//! cut is written over the rate in force (read again when a step landed
//! between its read and its write), so a refusal never ends with a higher
//! rate. Growth is also vetoed for a window after a cut, and a worker's
//! own cut under way vetoes its growth at once. Every key expires by itself
//! (a full bucket, an open gate, a lapsed hold), the override included:
//! it is written with a TTL of `idle_expiry`, renewed by every cut and
//! every step up (a step at `max_rate` rewrites it too), so it outlives
//! its scope's last feedback by `idle_expiry` at most, the horizon after
//! which an idle scope starts again from `initial_rate` anyway. A scope in
//! use whose requests bring no signal for that long ([`Outcome::Failed`]
//! only) returns to `initial_rate` too. An idle scope that comes back
//! clears the override at once (as does [`forget`](AimdLimiter::forget)).
//!
//! A worker asks the backend two questions per [`acquire`](AimdLimiter::acquire)
//! (the hold, then the bucket), and refreshes its view of the rate (the
//! `seen` touch and an override read) at most once per reaction window per
//! scope. A stored rate these settings would not have written (settings
//! changed since: out of `[min_rate, max_rate]`, another `burst`) is
//! written back within them by that refresh: the bucket spends at the
//! stored rate.
//!
//! # Failure
//!
//! An adaptive limit is a rate optimisation: it fails open. Every backend
//! call runs under a timeout and a circuit breaker (the same guard as a
//! [`Limiter`](crate::Limiter)'s: a call dropped mid-way cannot leave the
//! breaker stuck); when the backend fails,
//! the worker keeps going alone at the last rate it knew, with an
//! in-process token bucket per scope. It still honours `Retry-After` and
//! cuts its own rate on refusals, but does not ramp up until it can
//! coordinate again (N uncoordinated workers ramping would overshoot N
//! times). A cut is written only from the shared rate just read, before
//! the cut gate is taken: when that read fails, the cut is the worker's
//! own (its last known rate may be far above the shared one, and written,
//! would raise it), and the gate stays open for a worker that can read.
//! Note that
//! N workers each running at the shared rate offer the source N times
//! that rate until its refusals cut them down.
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//! use tollgate_limiter::Key;
//! use tollgate_limiter::aimd::{AimdConfig, AimdLimiter, Outcome};
//! use tollgate_memory::MemoryBackend;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let config = AimdConfig::from_toml(
//!     r#"
//!     initial_rate = "10/s"
//!     min_rate = "1/min"
//!     max_rate = "50/s"
//!     increase = "1/s"
//!     decrease = 0.5
//!     reaction_window = "1s"
//!     "#,
//! )?;
//! let harvester = AimdLimiter::new("harvester", config, MemoryBackend::new())?;
//! let site = Key::new("example.org");
//!
//! harvester.acquire(&site).await?;
//! // ... send the request; the source answered 429, Retry-After: 1
//! harvester
//!     .feedback(&site, Outcome::Refused { retry_after: Some(Duration::from_secs(1)) })
//!     .await;
//! assert_eq!(harvester.rate(&site), 5.0);
//! # Ok(())
//! # }
//! ```

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use figment::Figment;
use figment::providers::{Format, Toml};
use serde::{Deserialize, Serialize};
use tokio::runtime;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::backend::{Backend, Request, Scope};
use crate::breaker::BreakerConfig;
use crate::config::{ConfigError, parse_rate};
use crate::decision::Decision;
use crate::error::Error;
use crate::guard::Guard;
use crate::key::Key;
use crate::limiter::DEFAULT_TIMEOUT;
use crate::metrics::{AimdMeter, Call, Change, Local as LocalHit, Outcome as Counted};
use crate::model::Op;
use crate::policy::{MAX_SPAN_MICROS, Policy, ProgressiveDelay, TokenBucket};
use crate::time::micros;

/// Rates are stored as whole milli-requests per [`RATE_PERIOD`]-long
/// period: exact to 0.001 request per second, in integers that a Lua script
/// handles exactly.
const RATE_SCALE: f64 = 1000.0;
const RATE_PERIOD: Duration = Duration::from_secs(1000);
/// The slowest and fastest rates a token bucket of that scale can express.
const MIN_RATE: f64 = 1.0 / RATE_SCALE;
const MAX_RATE: f64 = 1_000_000.0;
/// The `seen` key's free attempts: never reached, and exact in Lua.
const SEEN_FREE: u64 = 1 << 50;
/// The shortest hold: a `Retry-After: 0` still pauses the scope briefly.
const MIN_HOLD: Duration = Duration::from_millis(1);
/// How many times a cut reads the shared rate again when a write came
/// between its read and its own.
const CUT_ATTEMPTS: usize = 4;

/// A scope's rate as read from the backend.
#[derive(Debug)]
struct StoredRate {
    /// The override as stored (`None`: none): what a write made from this
    /// read must still find ([`Backend::replace_override`]).
    raw: Option<Policy>,
    /// Its rate, within `[min_rate, max_rate]`.
    rate: f64,
    /// Whether the stored bucket is the one these settings write for the
    /// rate (not so when written under others: a rate out of bounds,
    /// another burst).
    own: bool,
}

/// Settings of an [`AimdLimiter`].
///
/// Deserializes (with [`serde`]) from a table whose durations are human
/// (`"1s"`, `"6h"`, parsed by [`humantime`]) and whose rates read `"10/s"`,
/// `"600/min"` or a number of requests per second; every field is optional
/// and unknown fields are refused:
///
/// ```toml
/// initial_rate = "1/s"       # a new scope's rate
/// min_rate = "1/min"         # never slower
/// max_rate = "100/s"         # never faster
/// increase = "1/s"           # added per reaction window of success (≥ 0.001/s)
/// decrease = 0.75            # factor applied by a cut, in (0, 1)
/// reaction_window = "1s"     # one cut, one step up at most per window
/// burst = 1                  # the bucket's capacity
/// max_hold = "15m"           # longest Retry-After honoured
/// idle_expiry = "6h"         # an idle scope forgets its rate after this
/// timeout = "50ms"           # per backend call
/// breaker_threshold = 5      # consecutive failures that open the breaker
/// breaker_backoff = "500ms"
/// breaker_max_backoff = "1s"
/// ```
///
/// The reaction window should exceed the source's response time, so that
/// the refusals of one burst of in-flight requests land in one window.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(try_from = "RawAimdConfig")]
pub struct AimdConfig {
    /// The rate of a new (or long idle) scope, in requests per second.
    pub initial_rate: f64,
    /// The lowest rate a cut can reach, in requests per second (at least
    /// 0.001).
    pub min_rate: f64,
    /// The highest rate growth can reach, in requests per second.
    pub max_rate: f64,
    /// Requests per second added to the rate per reaction window in which
    /// requests succeed (at least 0.001, the precision rates are stored
    /// to: a finer step would never move the rate).
    pub increase: f64,
    /// The factor a cut multiplies the rate by, strictly between 0 and 1.
    pub decrease: f64,
    /// At most one cut and one step up per window, across every worker.
    pub reaction_window: Duration,
    /// The bucket's capacity: how many requests may leave back to back.
    pub burst: u64,
    /// The longest `Retry-After` honoured; longer ones are capped.
    pub max_hold: Duration,
    /// A scope unused this long forgets its adapted rate; also the TTL of
    /// the rate stored in the backend, renewed by every cut and step up.
    /// Longer, by more than `reaction_window`, than the longest wait a
    /// scope in use is given (`max_hold`, and one request's interval at
    /// `min_rate`): a scope waiting for the remote is not idle.
    pub idle_expiry: Duration,
    /// How long one backend call may take before it counts as a failure.
    pub timeout: Duration,
    /// Circuit-breaker settings for the backend.
    pub breaker: BreakerConfig,
}

impl Default for AimdConfig {
    fn default() -> Self {
        Self {
            initial_rate: 1.0,
            min_rate: 1.0 / 60.0,
            max_rate: 100.0,
            increase: 1.0,
            decrease: 0.75,
            reaction_window: Duration::from_secs(1),
            burst: 1,
            max_hold: Duration::from_secs(15 * 60),
            idle_expiry: Duration::from_secs(6 * 3600),
            timeout: DEFAULT_TIMEOUT,
            breaker: BreakerConfig::default(),
        }
    }
}

impl AimdConfig {
    /// Reads a configuration from a TOML table (see the type's docs) and
    /// validates it.
    ///
    /// To keep it in a larger file, deserialize the type from that file's
    /// table with any serde format; validation runs as part of it.
    pub fn from_toml(toml: &str) -> Result<Self, ConfigError> {
        Figment::from(crate::config::Keys::file(Toml::string(toml)))
            .extract()
            .map_err(|e| ConfigError::Parse(crate::config::ParseError::new(e)))
    }

    /// Checks that every value can be enforced; the error names the field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_at("aimd")
    }

    fn validate_at(&self, path: &str) -> Result<(), ConfigError> {
        let bad = |field: &'static str, reason: String| ConfigError::Invalid {
            path: path.to_owned(),
            field,
            reason,
        };
        let rate = |field: &'static str, r: f64| {
            if r.is_finite() && (MIN_RATE..=MAX_RATE).contains(&r) {
                Ok(())
            } else {
                Err(bad(
                    field,
                    format!("{r} requests/s is outside [{MIN_RATE}, {MAX_RATE}]"),
                ))
            }
        };
        if let Some((field, reason)) = self.breaker.misread() {
            return Err(bad(field, reason));
        }
        rate("min_rate", self.min_rate)?;
        rate("max_rate", self.max_rate)?;
        rate("initial_rate", self.initial_rate)?;
        if self.max_rate < self.min_rate {
            return Err(bad("max_rate", "must be at least min_rate".into()));
        }
        if !(self.min_rate..=self.max_rate).contains(&self.initial_rate) {
            return Err(bad(
                "initial_rate",
                "must be within [min_rate, max_rate]".into(),
            ));
        }
        // Rates are stored to MIN_RATE: a finer step rounds back to the
        // rate it started from, and the scope never grows again.
        rate("increase", self.increase)?;
        if !(self.decrease > 0.0 && self.decrease < 1.0) {
            return Err(bad(
                "decrease",
                format!("{} is not strictly between 0 and 1", self.decrease),
            ));
        }
        let span = |field: &'static str, d: Duration| {
            let us = micros(d);
            if us == 0 || us > MAX_SPAN_MICROS {
                Err(bad(field, "must be between 1µs and 10 years".into()))
            } else {
                Ok(())
            }
        };
        // The windows and holds become policies, which count in µs: a
        // finer span was truncated, as configuration refuses for limiters.
        let policy_span = |field: &'static str, d: Duration| {
            span(field, d)?;
            crate::config::whole_micros(d)
                .map(drop)
                .map_err(|e| bad(field, e))
        };
        policy_span("reaction_window", self.reaction_window)?;
        policy_span("max_hold", self.max_hold)?;
        policy_span("idle_expiry", self.idle_expiry)?;
        span("timeout", self.timeout)?;
        // A scope waiting for the remote is in use, not idle: its last
        // use (and the backend's record of it, refreshed at most once a
        // reaction window) must not expire during the longest wait it
        // can be given, or it comes back at `initial_rate`, its hold
        // forgotten. The longest waits are a hold, and one request's
        // interval at `min_rate`.
        let window = self.reaction_window;
        let longest = |wait: Duration| wait.saturating_add(window);
        if self.idle_expiry <= longest(self.max_hold) {
            return Err(bad(
                "idle_expiry",
                format!(
                    "must be longer than max_hold + reaction_window ({}): a scope held \
                     that long would be found idle after its hold, and start again from \
                     initial_rate (and a worker would forget the hold it keeps alone \
                     while the backend is down)",
                    humantime::format_duration(longest(self.max_hold))
                ),
            ));
        }
        let slowest = Duration::from_secs_f64(1.0 / self.min_rate);
        if self.idle_expiry <= longest(slowest) {
            return Err(bad(
                "idle_expiry",
                format!(
                    "must be longer than one request's interval at min_rate + \
                     reaction_window ({}): a scope at min_rate would be found idle \
                     between its requests, and start again from initial_rate",
                    humantime::format_duration(longest(slowest))
                ),
            ));
        }
        if self.burst == 0 {
            return Err(bad("burst", "must be at least 1".into()));
        }
        // The slowest bucket must be expressible (a full refill within the
        // policy's span limit).
        stored_bucket(self, self.min_rate).map_err(|e| bad("burst", e.reason))?;
        Ok(())
    }
}

/// [`AimdConfig`] as written: every field optional.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAimdConfig {
    initial_rate: Option<RawRate>,
    min_rate: Option<RawRate>,
    max_rate: Option<RawRate>,
    increase: Option<RawRate>,
    decrease: Option<f64>,
    reaction_window: Option<String>,
    burst: Option<u64>,
    max_hold: Option<String>,
    idle_expiry: Option<String>,
    timeout: Option<String>,
    breaker_threshold: Option<u32>,
    breaker_backoff: Option<String>,
    breaker_max_backoff: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
enum RawRate {
    PerSecond(f64),
    Text(String),
}

impl TryFrom<RawAimdConfig> for AimdConfig {
    type Error = ConfigError;

    fn try_from(raw: RawAimdConfig) -> Result<Self, ConfigError> {
        raw.into_config("aimd")
    }
}

impl RawAimdConfig {
    /// The configuration, validated; errors name `path` and the field.
    pub(crate) fn into_config(self, path: &str) -> Result<AimdConfig, ConfigError> {
        let raw = self;
        let bad = |field: &'static str, reason: String| ConfigError::Invalid {
            path: path.to_owned(),
            field,
            reason,
        };
        let rate = |field: &'static str, r: Option<RawRate>, default: f64| match r {
            None => Ok(default),
            Some(RawRate::PerSecond(r)) => Ok(r),
            Some(RawRate::Text(s)) => {
                let (n, per) = parse_rate(&s).map_err(|e| bad(field, e))?;
                if per.is_zero() {
                    return Err(bad(field, format!("zero period in {s:?}")));
                }
                Ok(n as f64 / per.as_secs_f64())
            }
        };
        let dur = |field: &'static str, d: Option<String>, default: Duration| match d {
            None => Ok(default),
            Some(s) => humantime::parse_duration(s.trim())
                .map_err(|e| bad(field, format!("{e} in {s:?} (e.g. \"1s\", \"6h\")"))),
        };
        let d = AimdConfig::default();
        let config = AimdConfig {
            initial_rate: rate("initial_rate", raw.initial_rate, d.initial_rate)?,
            min_rate: rate("min_rate", raw.min_rate, d.min_rate)?,
            max_rate: rate("max_rate", raw.max_rate, d.max_rate)?,
            increase: rate("increase", raw.increase, d.increase)?,
            decrease: raw.decrease.unwrap_or(d.decrease),
            reaction_window: dur("reaction_window", raw.reaction_window, d.reaction_window)?,
            burst: raw.burst.unwrap_or(d.burst),
            max_hold: dur("max_hold", raw.max_hold, d.max_hold)?,
            idle_expiry: dur("idle_expiry", raw.idle_expiry, d.idle_expiry)?,
            timeout: dur("timeout", raw.timeout, d.timeout)?,
            breaker: {
                let backoff = dur("breaker_backoff", raw.breaker_backoff, d.breaker.backoff)?;
                BreakerConfig {
                    threshold: raw.breaker_threshold.unwrap_or(d.breaker.threshold),
                    backoff,
                    // Not given: the default, or the first back-off if
                    // that is longer.
                    max_backoff: dur(
                        "breaker_max_backoff",
                        raw.breaker_max_backoff,
                        d.breaker.max_backoff.max(backoff),
                    )?,
                }
            },
        };
        config.validate_at(path)?;
        Ok(config)
    }
}

/// The bucket `config` stores for `rate`: to the nearest step of the
/// stored precision, within `[min_rate, max_rate]` (the nearest step
/// falls out of them when a bound lies between two steps: `max_rate`
/// 0.0015/s would be stored as 0.002/s); where no step lies between the
/// bounds, the step below `max_rate`, never faster than the ceiling.
fn stored_bucket(config: &AimdConfig, rate: f64) -> Result<TokenBucket, crate::PolicyError> {
    // A bound that is a step, give or take the float error of scaling it
    // (0.3 * 1000 is 300.00000000000006).
    const SLACK: f64 = 1e-6;
    let hi = (config.max_rate * RATE_SCALE + SLACK).floor().max(1.0);
    let lo = (config.min_rate * RATE_SCALE - SLACK).ceil().min(hi);
    let milli = (rate * RATE_SCALE).round().clamp(lo, hi);
    TokenBucket::new(config.burst, milli as u64, RATE_PERIOD)
}

/// The rate a token bucket refills at, in requests per second.
fn rate_of(tb: &TokenBucket) -> f64 {
    tb.refill() as f64 / tb.period().as_secs_f64()
}

/// What the remote source answered to a request sent under an
/// [`AimdLimiter`]'s token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The source served the request: the rate may grow.
    Success,
    /// The source refused for rate (`429`, `503`): the rate is cut, and
    /// with a `Retry-After` the scope is held until then.
    Refused {
        /// How long the source asked to wait, if it said.
        retry_after: Option<Duration>,
    },
    /// Anything else (a network error, another status): no signal about
    /// the rate.
    Failed,
}

/// Why [`AimdLimiter::acquire`] gave no token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AcquireError {
    /// Called outside a tokio runtime: waiting for a token needs tokio's
    /// timers.
    #[error(
        "AimdLimiter::acquire was called outside a tokio runtime: waiting for a token needs \
         tokio's timers"
    )]
    NoRuntime,
}

/// A token granted by [`AimdLimiter::acquire`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Grant {
    rate: f64,
    local: bool,
}

impl Grant {
    /// The scope's rate as this worker knew it when granting, in requests
    /// per second.
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// Whether the token came from the worker's in-process fallback
    /// bucket because the backend failed.
    pub fn is_local(&self) -> bool {
        self.local
    }
}

/// An adaptive token bucket per scope, shared across workers through a
/// [`Backend`]; see the [module docs](self) for the algorithm and the
/// storage layout.
///
/// Cheap to clone; clones share their breaker and their per-scope view of
/// the rate. Two limiters built on one backend (two workers, or two
/// processes over one Redis) share every decision but keep their own
/// fallback state.
pub struct AimdLimiter<B> {
    inner: Arc<Inner<B>>,
}

struct Inner<B> {
    names: Names,
    config: AimdConfig,
    /// The scope bucket's configured policy: the initial rate.
    base: Policy,
    /// Capacity 1, one token per reaction window.
    gate: Policy,
    /// Any progressive delay: a peek at a hold reads its deadline.
    hold_probe: Policy,
    seen: Policy,
    backend: B,
    guard: Guard,
    meter: AimdMeter,
    scopes: Mutex<Scopes>,
}

/// The limiter names adaptive limiter `name` keeps its state under (see
/// the [module docs](self)): the scope's bucket, the cut and growth gates,
/// the hold and the last use.
pub(crate) fn state_names(name: &str) -> [String; 5] {
    let with = |suffix: &str| format!("{name}{suffix}");
    [
        with(""),
        with("-cut"),
        with("-grow"),
        with("-hold"),
        with("-seen"),
    ]
}

struct Names {
    rate: String,
    cut: String,
    grow: String,
    hold: String,
    seen: String,
}

/// What one worker knows about one scope.
#[derive(Debug)]
struct Local {
    /// The last rate seen or set in the backend (or set locally while it
    /// fails).
    rate: f64,
    synced: Option<Instant>,
    hold_until: Option<Instant>,
    grow_after: Option<Instant>,
    cut_after: Option<Instant>,
    /// The fallback bucket's theoretical arrival time (GCRA).
    tat: Option<Instant>,
    used: Instant,
    /// The queue of this worker's waiters of the scope, while its pacer
    /// (see [`AimdLimiter::pace`]) runs, with the pacer's number and the
    /// runtime it runs on.
    pacer: Option<(u64, runtime::Id, mpsc::UnboundedSender<Waiter>)>,
}

/// Where a request of a scope waits: what [`AimdLimiter::queued`] finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Queue {
    /// No waiter queued: asked at once.
    Empty,
    /// Waiters queued to a pacer of the request's runtime: behind them.
    Here,
    /// Waiters queued to a pacer of another runtime, which need not run
    /// while this request waits (a current-thread runtime left alone by
    /// its thread): on its own.
    Elsewhere,
}

/// A request waiting in a scope's queue for its token.
#[derive(Debug)]
struct Waiter {
    reply: oneshot::Sender<Grant>,
    /// Not asked for before then (it was refused until then already).
    not_before: Option<Instant>,
}

/// Numbers pacers, so that one that stops clears its own queue only.
static PACERS: AtomicU64 = AtomicU64::new(0);

/// Marks a scope's refresh as due again when dropped armed: its caller
/// gave up before the refresh was made.
struct RefreshDue<'a, B: Backend> {
    limiter: &'a AimdLimiter<B>,
    scope: &'a Key,
    armed: bool,
}

impl<B: Backend> Drop for RefreshDue<'_, B> {
    fn drop(&mut self) {
        if self.armed {
            let mut scopes = self.limiter.scopes();
            if let Some(l) = scopes.map.get_mut(self.scope) {
                l.synced = None;
            }
        }
    }
}

impl Local {
    fn fresh(rate: f64, now: Instant) -> Self {
        Self {
            rate,
            synced: None,
            hold_until: None,
            grow_after: None,
            cut_after: None,
            tat: None,
            used: now,
            pacer: None,
        }
    }
}

struct Scopes {
    map: HashMap<Key, Local>,
    sweep_at: usize,
}

const MIN_SWEEP: usize = 1024;

impl<B> Clone for AimdLimiter<B> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<B> fmt::Debug for AimdLimiter<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AimdLimiter")
            .field("name", &self.inner.names.rate)
            .field("config", &self.inner.config)
            .field("backend", &std::any::type_name::<B>())
            .finish()
    }
}

fn after(deadline: Option<Instant>, now: Instant) -> bool {
    deadline.is_some_and(|d| d > now)
}

impl<B: Backend> AimdLimiter<B> {
    /// An adaptive limiter named `name` (the namespace of its keys in the
    /// backend; by the limiters' rule: without `{`, `}`, `:`, control
    /// characters or white space at either end), checking `config`.
    pub fn new(
        name: impl Into<String>,
        config: AimdConfig,
        backend: B,
    ) -> Result<Self, ConfigError> {
        let name = name.into();
        let path = format!("adaptive.{name}");
        if let Err((field, reason)) = crate::config::check_name(&name) {
            return Err(ConfigError::Invalid {
                path,
                field,
                reason,
            });
        }
        config.validate_at(&path)?;
        let invalid = |field: &'static str, e: crate::PolicyError| ConfigError::Invalid {
            path: path.clone(),
            field,
            reason: e.reason,
        };
        let base =
            stored_bucket(&config, config.initial_rate).map_err(|e| invalid("initial_rate", e))?;
        let gate = TokenBucket::new(1, 1, config.reaction_window)
            .map_err(|e| invalid("reaction_window", e))?;
        let second = Duration::from_secs(1);
        let hold_probe = ProgressiveDelay::new(0, second, 1, second, second)
            .map_err(|e| invalid("max_hold", e))?;
        let seen = ProgressiveDelay::new(SEEN_FREE, second, 1, second, config.idle_expiry)
            .map_err(|e| invalid("idle_expiry", e))?;
        let guard = Guard::new(
            name.clone(),
            config.timeout,
            config.breaker,
            backend.failure_domains(),
        );
        let meter = AimdMeter::new(&name);
        meter.rate(config.initial_rate);
        Ok(Self {
            inner: Arc::new(Inner {
                names: {
                    let [rate, cut, grow, hold, seen] = state_names(&name);
                    Names {
                        rate,
                        cut,
                        grow,
                        hold,
                        seen,
                    }
                },
                base: base.into(),
                gate: gate.into(),
                hold_probe: hold_probe.into(),
                seen: seen.into(),
                guard,
                meter,
                config,
                backend,
                scopes: Mutex::new(Scopes {
                    map: HashMap::new(),
                    sweep_at: MIN_SWEEP,
                }),
            }),
        })
    }

    /// The limiter's name.
    pub fn name(&self) -> &str {
        &self.inner.names.rate
    }

    /// The settings.
    pub fn config(&self) -> &AimdConfig {
        &self.inner.config
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.inner.backend
    }

    /// Waits until `scope` has a token and takes it.
    ///
    /// Waiters of one scope in this worker are served first come, first
    /// served, on a tokio runtime by a task of the worker's that asks the
    /// backend for one waiter at a time: a waiter whose caller stops
    /// polling it (parked in a `select!` whose branch awaits another
    /// request of the scope) holds up no one. (A worker that runs several
    /// runtimes queues the waiters of one runtime only: a request of
    /// another, whose pacer need not run while it waits, asks on its
    /// own.) A failing backend fails no request: the token then comes
    /// from the worker's fallback bucket (see [`Grant::is_local`]).
    ///
    /// # Errors
    ///
    /// [`AcquireError::NoRuntime`] when called outside a tokio runtime,
    /// whether or not the request would have to wait: a wait runs on
    /// tokio's timers (the runtime must have them enabled, as for
    /// [`tokio::time::sleep`]). [`try_acquire`](Self::try_acquire) never
    /// waits; with an in-process backend it answers outside a runtime too.
    pub async fn acquire(&self, scope: &Key) -> Result<Grant, AcquireError> {
        // Refused before any work, not at the first wait: a program
        // driven by another executor learns it on its first request, not
        // once a scope is busy.
        let runtime = runtime::Handle::try_current().map_err(|_| AcquireError::NoRuntime)?;
        Ok(self.acquire_on(scope, &runtime).await)
    }

    /// [`acquire`](Self::acquire) on `runtime`, the caller's.
    async fn acquire_on(&self, scope: &Key, runtime: &runtime::Handle) -> Grant {
        let mut not_before = None;
        match self.queued(scope, runtime.id()) {
            // Nobody queued: asked at once, as most requests find a token.
            Queue::Empty => match self.try_acquire(scope).await {
                Ok(grant) => return grant,
                Err(wait) => not_before = Some(Instant::now() + wait),
            },
            Queue::Here => {}
            Queue::Elsewhere => return self.wait_alone(scope).await,
        }
        let (reply, grant) = oneshot::channel();
        if self
            .enqueue(scope, Waiter { reply, not_before }, runtime)
            .is_err()
        {
            // A pacer of another runtime started meanwhile.
            return self.wait_alone(scope).await;
        }
        match grant.await {
            Ok(grant) => grant,
            // Its pacer is gone (a panic in the backend): on its own.
            Err(_) => self.wait_alone(scope).await,
        }
    }

    /// [`acquire`](Self::acquire) without a queue.
    async fn wait_alone(&self, scope: &Key) -> Grant {
        loop {
            match self.try_acquire(scope).await {
                Ok(grant) => return grant,
                Err(wait) => tokio::time::sleep(wait).await,
            }
        }
    }

    /// Whether waiters of `scope` are queued in this worker, and where,
    /// for a request on the runtime `here`.
    fn queued(&self, scope: &Key, here: runtime::Id) -> Queue {
        let mut scopes = self.scopes();
        let local = self.local(&mut scopes, scope, Instant::now());
        match &local.pacer {
            Some((_, _, queue)) if queue.is_closed() => Queue::Empty,
            Some((_, on, _)) if *on == here => Queue::Here,
            Some(_) => Queue::Elsewhere,
            None => Queue::Empty,
        }
    }

    /// Queues `waiter` for `scope`, starting the scope's pacer on
    /// `runtime` if none runs; gives it back when the pacer that runs is
    /// of another runtime. Under the scopes' lock, where a pacer decides
    /// to stop: no waiter is queued to a pacer that has stopped.
    fn enqueue(
        &self,
        scope: &Key,
        waiter: Waiter,
        runtime: &runtime::Handle,
    ) -> Result<(), Waiter> {
        let mut scopes = self.scopes();
        let local = self.local(&mut scopes, scope, Instant::now());
        let here = runtime.id();
        let waiter = match &local.pacer {
            Some((_, on, queue)) if *on == here => match queue.send(waiter) {
                Ok(()) => return Ok(()),
                Err(mpsc::error::SendError(waiter)) => waiter,
            },
            Some((_, _, queue)) if !queue.is_closed() => return Err(waiter),
            _ => waiter,
        };
        let (queue, waiters) = mpsc::unbounded_channel();
        // The receiver is alive: it is the pacer's, started below.
        let _ = queue.send(waiter);
        let id = PACERS.fetch_add(1, Ordering::Relaxed);
        local.pacer = Some((id, here, queue));
        runtime.spawn(self.clone().pace(scope.clone(), id, waiters));
        Ok(())
    }

    /// Serves the waiters of `scope` in this worker, first come first
    /// served, asking the backend for one of them at a time; stops when
    /// none is left. A task of its own, so that the wait of a waiter
    /// whose caller stops polling it blocks no other: one that gives up
    /// (dropped) is passed over, and a token taken for it goes to the
    /// next waiter.
    async fn pace(self, scope: Key, id: u64, mut waiters: mpsc::UnboundedReceiver<Waiter>) {
        while let Some(Waiter {
            mut reply,
            mut not_before,
        }) = self.next_waiter(&scope, id, &mut waiters)
        {
            let grant = loop {
                if let Some(at) = not_before.take() {
                    tokio::select! {
                        () = tokio::time::sleep_until(at) => {}
                        () = reply.closed() => {}
                    }
                }
                if reply.is_closed() {
                    break None;
                }
                match self.try_acquire(&scope).await {
                    Ok(grant) => break Some(grant),
                    Err(wait) => not_before = Some(Instant::now() + wait),
                }
            };
            let Some(mut grant) = grant else {
                continue;
            };
            // Its waiter gone meanwhile, the fresh token is the next one's.
            while let Err(unsent) = reply.send(grant) {
                grant = unsent;
                match waiters.try_recv() {
                    Ok(next) => reply = next.reply,
                    Err(_) => break,
                }
            }
        }
    }

    /// The next waiter of pacer `id`'s queue, or `None` when it is empty:
    /// the pacer then stops, and leaves the scope without one.
    fn next_waiter(
        &self,
        scope: &Key,
        id: u64,
        waiters: &mut mpsc::UnboundedReceiver<Waiter>,
    ) -> Option<Waiter> {
        if let Ok(waiter) = waiters.try_recv() {
            return Some(waiter);
        }
        // Waiters are queued under this lock: none can come in between.
        let mut scopes = self.scopes();
        if let Ok(waiter) = waiters.try_recv() {
            return Some(waiter);
        }
        if let Some(local) = scopes.map.get_mut(scope)
            && local.pacer.as_ref().is_some_and(|(own, _, _)| *own == id)
        {
            local.pacer = None;
        }
        None
    }

    /// Takes a token for `scope` if one is available now; otherwise says
    /// how long to wait (a hold, or the bucket's next token).
    pub async fn try_acquire(&self, scope: &Key) -> Result<Grant, Duration> {
        let result = self.take(scope).await;
        // A wait is a refusal, whoever imposed it; a token from the
        // fallback bucket passed without the backend.
        let outcome = match &result {
            Ok(grant) if grant.local => Counted::FailedOpen,
            Ok(_) => Counted::Allowed,
            Err(_) => Counted::Refused,
        };
        self.inner.guard.meter().decision(Call::Check, outcome);
        result
    }

    async fn take(&self, scope: &Key) -> Result<Grant, Duration> {
        let now = Instant::now();
        let refresh = {
            let mut scopes = self.scopes();
            let local = self.local(&mut scopes, scope, now);
            if let Some(until) = local.hold_until.filter(|&u| u > now) {
                self.inner.guard.meter().local_hit(LocalHit::Denial);
                return Err(until - now);
            }
            let due = local
                .synced
                .is_none_or(|t| now.duration_since(t) >= self.inner.config.reaction_window);
            if due {
                // Marked before asking, so concurrent callers refresh once.
                local.synced = Some(now);
            }
            due
        };
        if refresh {
            // Given up half-way (its caller dropped), the refresh is due
            // again: the next call makes it, not one a reaction window on.
            let mut due = RefreshDue {
                limiter: self,
                scope,
                armed: true,
            };
            self.refresh(scope).await;
            due.armed = false;
        }
        let names = &self.inner.names;
        match self
            .decide(&names.hold, scope, &self.inner.hold_probe, Op::PEEK)
            .await
        {
            Ok(d) if d.is_denied() => {
                let wait = d.retry_after();
                self.with_local(scope, |l| l.hold_until = Some(Instant::now() + wait));
                return Err(wait);
            }
            Ok(_) => {}
            Err(_) => return self.take_local(scope),
        }
        match self
            .decide(&names.rate, scope, &self.inner.base, Op::Acquire(1))
            .await
        {
            Ok(d) if d.is_allowed() => Ok(Grant {
                rate: self.rate(scope),
                local: false,
            }),
            Ok(d) => Err(d.retry_after()),
            Err(_) => self.take_local(scope),
        }
    }

    /// Reports what the source answered to a request sent under a token
    /// of `scope`.
    ///
    /// Backend failures are absorbed: the worker then adapts its own
    /// fallback rate (see the [module docs](self#failure)).
    ///
    /// On a tokio runtime the report runs as a task of its own, which this
    /// future waits for: a caller that gives up meanwhile (a timeout or a
    /// `select!` around the call) does not cut it short. A report stopped
    /// half-way would be worse than none: this worker marks the reaction
    /// window as cut before asking the backend, and the fleet's cut gate,
    /// once taken, stands for the whole window, so the source's refusal
    /// would cut nothing, on this worker or (the gate taken, the rate not
    /// written) on any.
    pub async fn feedback(&self, scope: &Key, outcome: Outcome) {
        if outcome == Outcome::Failed {
            return;
        }
        // This worker's own hold, at the first poll: a call of the scope
        // about to leave (see `held`) learns it at once, not once the
        // report's task has run.
        if let Outcome::Refused {
            retry_after: Some(wait),
        } = outcome
        {
            self.hold_locally(scope, wait);
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return self.report(scope, outcome).await;
        };
        let (this, scope) = (self.clone(), scope.clone());
        let task = runtime.spawn(async move { this.report(&scope, outcome).await });
        if let Err(e) = task.await
            && e.is_panic()
        {
            std::panic::resume_unwind(e.into_panic());
        }
    }

    /// [`feedback`](Self::feedback)'s work.
    async fn report(&self, scope: &Key, outcome: Outcome) {
        match outcome {
            Outcome::Success => self.grow(scope).await,
            Outcome::Refused { retry_after } => {
                if let Some(wait) = retry_after {
                    self.hold(scope, wait).await;
                }
                self.cut(scope).await;
            }
            Outcome::Failed => {}
        }
    }

    /// The rate of `scope` as this worker last knew it, in requests per
    /// second (the initial rate for a scope it has not used).
    pub fn rate(&self, scope: &Key) -> f64 {
        self.scopes()
            .map
            .get(scope)
            .map_or(self.inner.config.initial_rate, |l| l.rate)
    }

    /// The rate of `scope` stored in the backend, in requests per second.
    pub async fn shared_rate(&self, scope: &Key) -> Result<f64, Error> {
        self.read_rate(scope).await
    }

    /// Forgets everything adapted for `scope`: the next request starts from
    /// the initial rate. Requests of the scope waiting for their tokens in
    /// this worker keep their places, and later ones queue behind them.
    pub async fn forget(&self, scope: &Key) -> Result<(), Error> {
        {
            let mut scopes = self.scopes();
            let queued = scopes.map.get_mut(scope).and_then(|local| {
                let pacer = local.pacer.take()?;
                Some((local, pacer)).filter(|(_, (_, _, queue))| !queue.is_closed())
            });
            match queued {
                // Requests wait in the scope's queue: it stays, served by its
                // pacer in turn, and the requests after this call queue
                // behind them (dropped, a second pacer would serve them
                // beside the first).
                Some((local, pacer)) => {
                    *local = Local::fresh(self.inner.config.initial_rate, Instant::now());
                    local.pacer = Some(pacer);
                }
                None => {
                    scopes.map.remove(scope);
                }
            }
        }
        let scope = Scope::Key(&self.inner.names.rate, scope);
        self.guard(scope, || self.inner.backend.set_override(scope, None))
            .await
    }

    fn scopes(&self) -> MutexGuard<'_, Scopes> {
        // Plain values only: a panic elsewhere cannot leave them broken.
        crate::lock(&self.inner.scopes)
    }

    /// The worker's state for `scope`, fresh if unknown or idle for longer
    /// than `idle_expiry`; sweeps idle scopes as the map grows.
    fn local<'a>(&self, scopes: &'a mut Scopes, scope: &Key, now: Instant) -> &'a mut Local {
        let config = &self.inner.config;
        if scopes.map.len() >= scopes.sweep_at && !scopes.map.contains_key(scope) {
            scopes
                .map
                .retain(|_, l| now.duration_since(l.used) < config.idle_expiry);
            scopes.sweep_at = (scopes.map.len() * 2).max(MIN_SWEEP);
        }
        let local = scopes
            .map
            .entry(scope.clone())
            .or_insert_with(|| Local::fresh(config.initial_rate, now));
        if now.duration_since(local.used) >= config.idle_expiry {
            *local = Local::fresh(config.initial_rate, now);
        }
        local.used = now;
        local
    }

    fn with_local<T>(&self, scope: &Key, f: impl FnOnce(&mut Local) -> T) -> T {
        let mut scopes = self.scopes();
        f(self.local(&mut scopes, scope, Instant::now()))
    }

    /// Takes a token from the worker's own bucket at its last known rate.
    fn take_local(&self, scope: &Key) -> Result<Grant, Duration> {
        let burst = self.inner.config.burst;
        self.with_local(scope, |l| {
            let now = Instant::now();
            let interval = Duration::from_secs_f64(1.0 / l.rate);
            let tau = interval.saturating_mul(u32::try_from(burst).unwrap_or(u32::MAX));
            let tat = l.tat.map_or(now, |t| t.max(now));
            let debt = tat - now;
            if debt + interval <= tau {
                l.tat = Some(tat + interval);
                Ok(Grant {
                    rate: l.rate,
                    local: true,
                })
            } else {
                Err(debt + interval - tau)
            }
        })
    }

    /// Touches the scope's `seen` key and reads its rate; a scope idle for
    /// `idle_expiry` forgets its adapted rate.
    async fn refresh(&self, scope: &Key) {
        let names = &self.inner.names;
        let rate = match self
            .decide(&names.seen, scope, &self.inner.seen, Op::Acquire(1))
            .await
        {
            // One failure recorded on a fresh key: nobody used the scope
            // within idle_expiry (or ever).
            Ok(d) if d.remaining() == SEEN_FREE - 1 => self
                .guard(Scope::Key(&names.rate, scope), || {
                    self.inner
                        .backend
                        .set_override(Scope::Key(&names.rate, scope), None)
                })
                .await
                .ok()
                .map(|()| self.inner.config.initial_rate),
            Ok(_) => match self.read_stored(scope).await {
                Ok(stored) if stored.own => Some(stored.rate),
                // Written under other settings (a `max_rate` lowered, a
                // `burst` changed since): the shared bucket spends at the
                // stored rate, so it is written back within bounds (unless
                // another worker wrote it since: the next refresh looks
                // again).
                Ok(stored) => {
                    let _ = self.replace_rate(scope, &stored, stored.rate).await;
                    Some(stored.rate)
                }
                Err(_) => None,
            },
            Err(_) => None,
        };
        if let Some(rate) = rate {
            self.inner.meter.rate(rate);
            self.with_local(scope, |l| l.rate = rate);
        }
    }

    /// How long `scope` is still held by a `Retry-After`, as this worker
    /// knows it (the refusals reported to it, the holds its requests
    /// found in the backend), without asking the backend; `None` when it
    /// knows of no hold.
    ///
    /// For a call that was granted its token and then waited for
    /// something else (its HTTP client's readiness): a hold begun
    /// meanwhile means the call should wait again rather than go out.
    pub fn held(&self, scope: &Key) -> Option<Duration> {
        let now = Instant::now();
        let scopes = self.scopes();
        let until = scopes.map.get(scope)?.hold_until?;
        (until > now).then(|| until - now)
    }

    /// Holds `scope` for `wait` (capped) in this worker.
    fn hold_locally(&self, scope: &Key, wait: Duration) -> Duration {
        let wait = wait.clamp(MIN_HOLD, self.inner.config.max_hold);
        self.with_local(scope, |l| {
            let until = Instant::now() + wait;
            l.hold_until = Some(l.hold_until.map_or(until, |u| u.max(until)));
        });
        wait
    }

    async fn hold(&self, scope: &Key, wait: Duration) {
        let wait = self.hold_locally(scope, wait);
        // A failure leaves the hold local to this worker: other workers
        // learn it from their own refusals.
        let Ok(policy) = ProgressiveDelay::new(0, wait, 1, wait, wait) else {
            return;
        };
        let _ = self
            .decide(
                &self.inner.names.hold,
                scope,
                &policy.into(),
                Op::Acquire(1),
            )
            .await;
    }

    async fn cut(&self, scope: &Key) {
        let window = self.inner.config.reaction_window;
        let skip = self.with_local(scope, |l| {
            let now = Instant::now();
            if after(l.cut_after, now) {
                return true;
            }
            // Until the gate answers, this worker's other refusals of the
            // same burst need not ask it.
            l.cut_after = Some(now + window);
            false
        });
        if skip {
            return;
        }
        let names = &self.inner.names;
        // Read the stored rate before taking the gate: a cut whose read
        // fails is this worker's own, and leaves the gate to the next
        // refusal of the window, on a worker that can read (taken, the
        // fleet skipped that cut). A look at the gate first keeps the
        // read off the refusals of a window already cut; each worker asks
        // at most once per window (`cut_after` above), and the breaker
        // stops asking a failing backend.
        let stored = match self.ask_cut_gate(scope, Op::PEEK).await {
            Some(true) => self.read_stored(scope).await.ok(),
            Some(false) => return,
            None => None,
        };
        // Cut from the stored rate only: this worker's may be far above
        // it (others cut it since), and written, a cut of it would raise
        // the rate of every worker. Unread, the cut is this worker's own,
        // as when the gate cannot be asked.
        let stored = match stored {
            Some(read) => match self.ask_cut_gate(scope, Op::Acquire(1)).await {
                Some(true) => Some(read),
                // Another refusal of this window took it since the look.
                Some(false) => return,
                None => None,
            },
            None => None,
        };
        let config = &self.inner.config;
        let cut = |from: f64| (from * config.decrease).max(config.min_rate);
        let (current, rate, shared) = match stored {
            Some(stored) => self.cut_shared(scope, stored, cut).await,
            None => {
                let current = self.rate(scope);
                (current, cut(current), false)
            }
        };
        tracing::debug!(limiter = %names.rate, %scope, from = current, to = rate, shared, "aimd cut");
        self.changed(Change::Cut, current, rate);
        self.with_local(scope, |l| l.rate = rate);
    }

    /// Writes the cut of the shared rate `stored` (read before the gate
    /// was taken) as a compare-and-set: a step up written since (another
    /// worker's, which read the rate before this cut) is cut in turn, so
    /// the cut is always from the rate in force, and a step that read the
    /// rate before this cut never writes over it. Answers the rate cut,
    /// the cut rate, and whether the cut was written.
    async fn cut_shared(
        &self,
        scope: &Key,
        mut stored: StoredRate,
        cut: impl Fn(f64) -> f64,
    ) -> (f64, f64, bool) {
        for _ in 0..CUT_ATTEMPTS {
            let rate = cut(stored.rate);
            match self.replace_rate(scope, &stored, rate).await {
                Ok(true) => return (stored.rate, rate, true),
                Ok(false) => {}
                Err(_) => return (stored.rate, rate, false),
            }
            stored = match self.read_stored(scope).await {
                Ok(stored) => stored,
                Err(_) => break,
            };
        }
        // Written over between every read and its write (a step up per
        // reaction window can do that once or twice, not every time), or
        // unreadable: this worker's own cut; a refusal of a later window
        // cuts the fleet.
        (stored.rate, cut(stored.rate), false)
    }

    /// Asks the cut gate (`op`: a look or the take): `Some(true)` when it
    /// is (or was) open, `Some(false)` when another refusal cut within the
    /// window (this worker then waits until the gate reopens), `None` when
    /// the backend cannot answer.
    async fn ask_cut_gate(&self, scope: &Key, op: Op) -> Option<bool> {
        match self
            .decide(&self.inner.names.cut, scope, &self.inner.gate, op)
            .await
        {
            Ok(d) if d.is_denied() => {
                self.with_local(scope, |l| {
                    l.cut_after = Some(Instant::now() + d.retry_after())
                });
                Some(false)
            }
            Ok(_) => Some(true),
            Err(_) => None,
        }
    }

    async fn grow(&self, scope: &Key) {
        let window = self.inner.config.reaction_window;
        let skip = self.with_local(scope, |l| {
            let now = Instant::now();
            // A cut of this worker's under way (or one the gate told of):
            // no step within its window, as the gate vetoes for the fleet.
            if after(l.grow_after, now) || after(l.cut_after, now) {
                return true;
            }
            l.grow_after = Some(now + window);
            false
        });
        if skip {
            return;
        }
        let names = &self.inner.names;
        match self
            .decide(&names.grow, scope, &self.inner.gate, Op::Acquire(1))
            .await
        {
            Ok(d) if d.is_denied() => {
                self.with_local(scope, |l| {
                    l.grow_after = Some(Instant::now() + d.retry_after())
                });
                return;
            }
            Ok(_) => {}
            // Without the backend, keep the last known rate: uncoordinated
            // workers ramping up together would overshoot.
            Err(_) => return,
        }
        // An empty cut gate means a cut in the last window: no step up yet.
        match self
            .decide(&names.cut, scope, &self.inner.gate, Op::PEEK)
            .await
        {
            Ok(d) if d.is_allowed() => {}
            _ => return,
        }
        let Ok(stored) = self.read_stored(scope).await else {
            return;
        };
        let current = stored.rate;
        let rate = (current + self.inner.config.increase).min(self.inner.config.max_rate);
        // A cut of this worker's begun since the look at the gate may
        // have read the rate already: written now, the step would undo it.
        if self.with_local(scope, |l| after(l.cut_after, Instant::now())) {
            return;
        }
        // Only over the rate it read: a cut written since on another
        // worker stands. Written even at max_rate: the write renews the
        // override's TTL.
        if !matches!(self.replace_rate(scope, &stored, rate).await, Ok(true)) {
            return;
        }
        tracing::trace!(limiter = %names.rate, %scope, from = current, to = rate, "aimd step up");
        self.changed(Change::Step, current, rate);
        self.with_local(scope, |l| l.rate = rate);
    }

    /// Reports a cut or step from `from` to `to`: counted only if the rate
    /// moved (a cut at `min_rate`, a step at `max_rate` change nothing).
    fn changed(&self, change: Change, from: f64, to: f64) {
        if to == from {
            self.inner.meter.rate(to);
        } else {
            self.inner.meter.change(change, to);
        }
    }

    async fn read_rate(&self, scope: &Key) -> Result<f64, Error> {
        Ok(self.read_stored(scope).await?.rate)
    }

    /// The scope's stored rate (see [`StoredRate`]).
    async fn read_stored(&self, scope: &Key) -> Result<StoredRate, Error> {
        let scope = Scope::Key(&self.inner.names.rate, scope);
        let config = &self.inner.config;
        let raw = self
            .guard(scope, || self.inner.backend.get_override(scope))
            .await?;
        let (rate, own) = match raw {
            Some(Policy::TokenBucket(tb)) => {
                let rate = rate_of(&tb).clamp(config.min_rate, config.max_rate);
                (rate, stored_bucket(config, rate).is_ok_and(|own| own == tb))
            }
            _ => (config.initial_rate, true),
        };
        Ok(StoredRate { raw, rate, own })
    }

    /// Stores the scope's rate, expiring `idle_expiry` after this write,
    /// if the stored one is still `read` ([`Backend::replace_override`]):
    /// `Ok(false)` when another write came in between, and this one is
    /// not made.
    async fn replace_rate(&self, scope: &Key, read: &StoredRate, rate: f64) -> Result<bool, Error> {
        let policy = Policy::from(stored_bucket(&self.inner.config, rate)?);
        let scope = Scope::Key(&self.inner.names.rate, scope);
        self.guard(scope, || {
            self.inner.backend.replace_override(
                scope,
                read.raw.as_ref(),
                &policy,
                self.inner.config.idle_expiry,
            )
        })
        .await
    }

    async fn decide(
        &self,
        limiter: &str,
        key: &Key,
        policy: &Policy,
        op: Op,
    ) -> Result<Decision, Error> {
        // Under the guard's timeout: the backend may leave a timeout of
        // its own out (`Backend::decide_within`).
        let within = self.inner.guard.timeout();
        self.guard(Scope::Key(limiter, key), || {
            self.inner.backend.decide_within(
                Request {
                    limiter,
                    key,
                    policy,
                    op,
                },
                within,
            )
        })
        .await
    }

    /// Runs one backend call on the data of `scope` through the shared
    /// guard, under the breaker of its failure domain: each call of an
    /// adaptive limiter has its own deadline.
    async fn guard<T, F, Fut>(&self, scope: Scope<'_>, call: F) -> Result<T, Error>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, B::Error>>,
    {
        let guard = &self.inner.guard;
        let domain = self.inner.backend.failure_domain(scope);
        guard.run(domain, &guard.deadline(), call).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bucket of `rate` to the nearest stored step, whatever the bounds.
    fn try_bucket(burst: u64, rate: f64) -> Result<TokenBucket, crate::PolicyError> {
        let refill = ((rate * RATE_SCALE).round() as u64).max(1);
        TokenBucket::new(burst, refill, RATE_PERIOD)
    }

    #[test]
    fn config_reads_rates_and_durations() {
        let c = AimdConfig::from_toml(
            r#"
            initial_rate = "120/min"
            min_rate = 0.5
            max_rate = "50/s"
            increase = "1/s"
            decrease = 0.5
            reaction_window = "500ms"
            idle_expiry = "3h"
            "#,
        )
        .unwrap();
        assert_eq!(c.initial_rate, 2.0);
        assert_eq!(c.min_rate, 0.5);
        assert_eq!(c.max_rate, 50.0);
        assert_eq!(c.reaction_window, Duration::from_millis(500));
        assert_eq!(c.idle_expiry, Duration::from_secs(3 * 3600));
        assert_eq!(c.burst, 1);
    }

    #[test]
    fn bad_config_names_the_field() {
        for (toml, field) in [
            ("decrease = 1.0", "aimd.decrease"),
            ("min_rate = 0", "aimd.min_rate"),
            ("initial_rate = \"1000/s\"", "aimd.initial_rate"),
            (
                "max_rate = \"1/min\"\nmin_rate = \"1/s\"\ninitial_rate = \"1/s\"",
                "aimd.max_rate",
            ),
            ("reaction_window = \"soon\"", "aimd.reaction_window"),
            ("burst = 0", "aimd.burst"),
            ("idle_expiry = \"1s\"", "aimd.idle_expiry"),
            // Shorter than a hold: a worker alone would forget it.
            (
                "max_hold = \"2h\"\nidle_expiry = \"1h\"",
                "aimd.idle_expiry",
            ),
            // No longer than a hold and a reaction window.
            (
                "max_hold = \"1h\"\nidle_expiry = \"1h\"",
                "aimd.idle_expiry",
            ),
            // Shorter than one request's interval at min_rate.
            (
                "min_rate = 0.001\nmax_hold = \"1m\"\nidle_expiry = \"10m\"",
                "aimd.idle_expiry",
            ),
            ("increase = \"fast\"", "aimd.increase"),
        ] {
            let e = AimdConfig::from_toml(toml).unwrap_err().to_string();
            assert!(e.contains(field), "{toml}: {e}");
        }
        let e = AimdConfig::from_toml("rate = 3").unwrap_err().to_string();
        assert!(e.contains("rate"), "{e}");
    }

    /// Rates are stored to 0.001 request/s: an `increase` finer than
    /// that was accepted, and a step up rounded back to the rate it
    /// started from, so after one cut the scope never grew again
    /// (`increase = "1/h"`, 0.00028/s). Refused, naming the field, as a
    /// `min_rate` below the resolution is.
    #[test]
    fn an_increase_finer_than_the_rate_resolution_is_refused() {
        for increase in ["\"1/h\"", "0.0004", "1e-9"] {
            let e = AimdConfig::from_toml(&format!("increase = {increase}"))
                .map(|c| format!("loaded: increase {}", c.increase))
                .unwrap_or_else(|e| e.to_string());
            assert!(
                e.contains("aimd.increase") && e.contains("0.001"),
                "{increase}: {e}"
            );
        }
        // A step of "1/h" from a cut rate left it where it was.
        let cut = 0.75;
        let stepped = rate_of(&try_bucket(1, cut + 1.0 / 3600.0).unwrap());
        assert_eq!(stepped, cut);
        // The resolution itself is a step.
        let c = AimdConfig::from_toml("increase = \"1/1000s\"").unwrap();
        assert_eq!(c.increase, MIN_RATE);
        assert!(rate_of(&try_bucket(1, cut + c.increase).unwrap()) > cut);
        let e = AimdConfig::from_toml("increase = 1e300")
            .unwrap_err()
            .to_string();
        assert!(e.contains("aimd.increase"), "{e}");
    }

    /// A duration finer than a microsecond was accepted
    /// (`reaction_window = "1500ns"`) and counted in whole microseconds,
    /// as a limiter's policy spans are not: refused, naming the field. (A
    /// timeout or back-off is not a policy span, as for limiters.)
    #[test]
    fn durations_finer_than_a_microsecond_are_refused() {
        for field in ["reaction_window", "max_hold", "idle_expiry"] {
            let e = AimdConfig::from_toml(&format!("{field} = \"1500ns\""))
                .map(|c| format!("loaded: {c:?}"))
                .unwrap_or_else(|e| e.to_string());
            assert!(
                e.contains(&format!("aimd.{field}")) && e.contains("microseconds"),
                "{field}: {e}"
            );
        }
        let c = AimdConfig::from_toml("reaction_window = \"1500us\"").unwrap();
        assert_eq!(c.reaction_window, Duration::from_micros(1500));
    }

    #[test]
    fn rates_round_trip_through_a_bucket() {
        for r in [0.001, 1.0 / 60.0, 0.5, 7.25, 1234.5] {
            let tb = try_bucket(1, r).unwrap();
            assert!(
                (rate_of(&tb) - r).abs() <= 0.0005,
                "{r} -> {}",
                rate_of(&tb)
            );
        }
    }
}
