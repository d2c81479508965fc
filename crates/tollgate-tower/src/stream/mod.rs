//! Limits for events that are not HTTP requests: a [`Stream`] adapter and a
//! typed responder for the generic [`Service`](tower_service::Service)
//! layer.
//!
//! A listener (a Mattermost websocket, a message-queue consumer) has no
//! request to answer with a 429: its events arrive on a stream. Wrap the
//! stream with [`RateLimitStream`] (or [`RateLimitStreamExt::rate_limit`])
//! and every event is checked against a [`Limiter`](tollgate_limiter::Limiter)
//! for the key an [extractor](crate::extract::KeyExtractor) finds in it
//! (its channel, usually). What becomes of an event over the limit is the
//! consumer's choice, [`Excess`]:
//!
//! * [`Excess::Drop`]: the event is dropped and counted (see
//!   [`StreamStats`]); the stream goes on with the next one. Nothing waits,
//!   so a flooded channel does not hold the others back.
//! * [`Excess::Delay`]: the stream waits until the event may pass (its
//!   retry-after), then yields it. Events keep their order, so while one
//!   event waits, the events behind it wait too; split the stream per
//!   channel if that is not wanted.
//!
//! A fail-closed limiter whose backend fails refuses: the event is dropped
//! (counted apart, as [`unavailable`](StreamStats::unavailable)) or, with
//! `Delay`, held and checked again after the short retry delay. A
//! fail-open limiter lets it through. An event whose cost the policy can
//! never grant is dropped (counted as limited), whatever the choice:
//! waiting would not help. An event without a key follows the
//! [`MissingKey`](crate::MissingKey) policy, as in the HTTP layer: with
//! `Reject` (the default) it is dropped and counted; a limiter in
//! [shadow mode](tollgate_limiter::shadow), which refuses nothing, lets it
//! pass (counted as passed) whatever the policy.
//!
//! Limit a stream with a rate (token bucket, sliding window, calendar
//! quota, or a composite of them). A
//! [concurrency](tollgate_limiter::Concurrency) limiter does not fit: the
//! stream never learns when an event's work ends, so each event passed
//! would hold its slot until the slot's lease expires.
//!
//! For a `Service` of events (a handler behind `tower::ServiceBuilder`),
//! use [`RateLimitLayer`](crate::RateLimitLayer) with the [`Typed`]
//! responder: a refusal is then `Ok(Err(Refused))`, a typed value the
//! caller can act on, instead of an HTTP response.
//!
//! # Examples
//!
//! At most two events per channel per minute; the excess is dropped and
//! counted:
//!
//! ```
//! use std::time::Duration;
//! use futures_util::{StreamExt, stream};
//! use tollgate_limiter::{Key, Limiter, SlidingWindow};
//! use tollgate_memory::MemoryBackend;
//! use tollgate_tower::stream::{Excess, RateLimitStreamExt};
//!
//! struct Event { channel: &'static str, text: &'static str }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let per_channel = Limiter::new(
//!     "listener_channel",
//!     SlidingWindow::new(2, Duration::from_secs(60))?,
//!     MemoryBackend::new(),
//! );
//! let events = stream::iter([
//!     Event { channel: "town-square", text: "a" },
//!     Event { channel: "town-square", text: "b" },
//!     Event { channel: "town-square", text: "c" },
//!     Event { channel: "off-topic", text: "d" },
//! ]);
//! let limited = events.rate_limit(per_channel, |e: &Event| Some(Key::new(e.channel)), Excess::Drop);
//! let stats = limited.stats();
//! let passed: Vec<_> = limited.map(|e| e.text).collect().await;
//! assert_eq!(passed, ["a", "b", "d"]);
//! assert_eq!(stats.limited(), 1);
//! # Ok(())
//! # }
//! ```
//!
//! [`Stream`]: futures_core::Stream

mod rate_limit;
mod typed;

pub use rate_limit::{Excess, RateLimitStream, RateLimitStreamExt, StreamStats};
pub use typed::{Refused, Typed};
