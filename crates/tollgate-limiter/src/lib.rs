//! The core of [tollgate]: one rate-limiting primitive for a whole platform.
//!
//! This crate holds what every backend and consumer shares, and nothing that
//! talks to Redis or HTTP:
//!
//! * [policies](Policy): [`TokenBucket`], exact [`SlidingWindow`],
//!   [`ProgressiveDelay`], [`Calendar`] quotas (per day, week or month of a
//!   time zone), [`Composite`]s of several, decided at once, and
//!   [`Concurrency`] limits on requests in flight;
//! * the [`Decision`] a limiter answers with (a refusal is a value);
//! * the [`Backend`] trait that the memory and Redis backends implement;
//! * the [`Limiter`]: a named policy over a backend, with a per-decision
//!   timeout, a circuit breaker, a [`FailMode`], runtime overrides and a
//!   [shadow mode](shadow);
//! * [reservations](strategy::reservation) for costs known only afterwards
//!   (LLM tokens): [`Limiter::reserve`] an estimate, then
//!   [`Reservation::settle`] the real cost;
//! * [`Key`]s that are bounded and never hold secrets in clear;
//! * layered [`Config`]uration;
//! * [`Clock`]s, with a [`MockClock`] for tests;
//! * the [reference model](model) every backend must agree with;
//! * [`metrics`] of every decision (feature `metrics`).
//!
//! # Examples
//!
//! The reference model is a plain state machine, usable on its own:
//!
//! ```
//! use std::time::Duration;
//! use tollgate_limiter::{model::{Op, State}, Policy, TokenBucket};
//!
//! let policy = Policy::from(TokenBucket::new(2, 1, Duration::from_secs(1))?);
//! let mut key = State::fresh(&policy);
//! let now = 1_000_000;
//! assert!(key.apply(now, &policy, Op::Acquire(1)).is_allowed());
//! assert!(key.apply(now, &policy, Op::Acquire(1)).is_allowed());
//! let refused = key.apply(now, &policy, Op::Acquire(1));
//! assert!(refused.is_denied());
//! assert_eq!(refused.retry_after(), Duration::from_secs(1));
//! # Ok::<(), tollgate_limiter::PolicyError>(())
//! ```
//!
//! With a backend (here `tollgate-memory`'s), a [`Limiter`] answers
//! [`Verdict`]s; see the `tollgate` facade crate for the full picture.
//!
//! [tollgate]: https://docs.rs/tollgate

// On docs.rs (`--cfg docsrs`, nightly): items behind a feature say which.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod aimd;
pub mod backend;
mod breaker;
pub mod config;
pub mod decision;
mod deny_cache;
pub mod error;
mod guard;
pub mod key;
mod lease;
pub mod limiter;
pub mod metrics;
pub mod model;
mod permit;
pub mod policy;
mod reserve;
pub mod shadow;
mod sharded;
pub mod strategy;
pub use strategy::{calendar, composite, concurrency};
pub mod time;

pub use aimd::{AimdConfig, AimdLimiter};
pub use backend::{Backend, Request, Scope};
pub use breaker::BreakerConfig;
pub use composite::Composite;
pub use config::{Config, ConfigBuilder, ConfigError, LimiterConfig, RedisConfig, parse_rate};
pub use decision::Decision;
pub use error::{BackendError, BoxError, Error, ErrorReason};
pub use key::{Key, KeyHasher};
pub use limiter::{DEFAULT_LOCAL_CAPACITY, Denied, FailMode, Limiter, LimiterBuilder, Verdict};
pub use model::{Op, Receipt};
pub use permit::{KeptPermit, Permit};
pub use policy::{
    Calendar, Concurrency, Period, Policy, PolicyError, ProgressiveDelay, SlidingWindow, Strategy,
    TokenBucket, Zone,
};
pub use reserve::Reservation;
pub use shadow::Mode;
pub use time::{Clock, MockClock, SystemClock, Timestamp};

/// The time-zone crate of [calendar quotas](calendar): a
/// [`Zone`]'s rules are its `TimeZone`
/// ([`Zone::time_zone`]), so its major version
/// (1) is part of this crate's API.
pub use jiff;

/// Locks a mutex whose data stays valid whatever a panicking holder did
/// (plain counters and maps): a poisoned lock is used as it is.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
