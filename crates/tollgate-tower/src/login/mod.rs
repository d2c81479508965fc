//! Login protection: a sliding window per client IP on the login route and
//! a progressive delay per account that counts failed logins only.
//!
//! [`LoginLayer`] puts three layers in front of a login handler:
//!
//! 1. a [`RateLimitLayer`](crate::RateLimitLayer) per [client IP](crate::extract::ClientIp),
//!    counting every attempt (a sliding window, e.g. 20 per 15 minutes):
//!    one address cannot try many accounts;
//! 2. a [`BufferBodyLayer`](crate::BufferBodyLayer) that reads the bounded
//!    body (16 KiB, arriving within 10 s: a larger body is `413`, a slower
//!    one `408`, neither reaches the handler) and finds the email (JSON or
//!    form field, trimmed, lower-cased, hashed with a keyed hash: the
//!    backend never holds an address, and a reader of it cannot confirm a
//!    guessed one). A body that gives the field twice, or comes with a
//!    `Content-Encoding` (decompress outside the layer), names no account
//!    (see [`Email`](crate::buffer_body::Email)), and a request without
//!    an account is refused `400`;
//! 3. a `RateLimitLayer` per account, over a
//!    [`ProgressiveDelay`](tollgate_limiter::ProgressiveDelay) limiter,
//!    that takes each attempt *up front*: before the handler runs, the
//!    attempt is recorded as a failure, atomically in the shared counter
//!    (a [reservation](tollgate_limiter::strategy::reservation)); a
//!    delayed account is answered `429` without reaching the handler and
//!    without recording anything. The response then *settles* the
//!    attempt: a failure (401/403) keeps it, a success (2xx) clears the
//!    account, anything else (`400`, `5xx`, a redirect, the handler's
//!    `Err`) refunds it. See [`FailedLogins`].
//!
//! Or let the handler say, where the status does not tell (a form login
//! that redirects either way): build the layer with
//! [`count_by_status(false)`](LoginLayer::count_by_status) and put a
//! [`LoginOutcome`] in the response's extensions (with axum,
//! `(Extension(LoginOutcome::Failed), Redirect::to("/login"))`). The
//! attempt is still taken up front; a response that says nothing keeps
//! its failure. Outcomes known only in a later request (a second factor)
//! are reported with [`LoginAttempts`].
//!
//! What makes it safe:
//!
//! * **The same answer whether the account exists or not.** The delay is
//!   kept per email, existing or not, and it is decided before the handler
//!   runs, so a delayed unknown address and a delayed real one both get the
//!   same `429` with the same `Retry-After`. The handler must do its part:
//!   one `401` body for "no such user" and "wrong password", and the same
//!   work (hash a dummy password) for both.
//! * **An account's counter is not told to whoever names it.** An answered
//!   login carries the per-IP `RateLimit` fields (the caller's own quota)
//!   but not the account's: anyone may send any email, and the fields
//!   would tell them how many free attempts the account has left and when
//!   its failures are forgotten (its owner's recent failed logins, or
//!   another guesser's). A delayed account's `429` says when to retry, as
//!   it must.
//! * **One account, one key.** The email is trimmed and lower-cased
//!   before it is hashed, so `Alice@Example.com ` is `alice@example.com`.
//!   An address written in a form some application would fold into
//!   another (an invisible character, a decomposed accent, a fullwidth
//!   letter, dotless `ı`, `ß`: see [`Email`](crate::buffer_body::Email))
//!   is no account and is refused `400`: counting it apart would give a
//!   guesser a fresh counter, folding it would let the owner of one
//!   account clear another's delay with their own successful logins. The
//!   handler must compare addresses the same way: case-insensitively
//!   (an application where `Bob@x` and `bob@x` can be two accounts lets
//!   each clear the other's delay), and not more loosely (a subaddress,
//!   `bob+tag@x`, is another address here, as are the accented and
//!   unaccented forms that an accent-insensitive collation, such as
//!   MySQL's default `utf8mb4_0900_ai_ci`, takes for one: compare emails
//!   in a binary or case-insensitive-only collation, or put the same
//!   folding in a [`BodyExtractor`](crate::buffer_body::BodyExtractor) of
//!   your own).
//! * **A delay, never a lock-out.** Failures beyond the free attempts block
//!   the account for `base_delay * factor^n`, capped at `max_delay`, and are
//!   forgotten `forget_after` the last one. The real user gets in once the
//!   delay is over; their success clears the count.
//! * **Fail-closed.** Build both limiters fail-closed (the default): if the
//!   counter is down, logins are answered `503` rather than left open to
//!   brute force.
//! * **Attempts in flight together see each other.** Each attempt's
//!   failure is recorded before the handler runs, so a guesser with many
//!   connections (many IPs) gains nothing by sending them at once: while
//!   the account is free (at first, and each time a delay ends), the free
//!   attempts and the one that starts the delay reach the handler, and
//!   every later one is refused `429` until the delay ends. A refused
//!   attempt records nothing, so knocking on a delayed account does not
//!   lengthen its delay (nor can an attacker lengthen a victim's).
//!
//! How an attempt is settled, exactly:
//!
//! * **kept** (`401`/`403`): the failure recorded up front stays;
//! * **cleared** (`2xx`): the account is reset, as a success always did;
//! * **refunded** (anything else, and an `Err` from the handler): the
//!   failure is taken back, in the account's same life only (after a
//!   reset or once forgotten, a refund gives nothing back) and never below
//!   what other attempts recorded. A delay the refunded failure started
//!   is left to run: restoring the block before it could shorten one that
//!   another failure set, and a short delay is the safe side;
//! * **dropped** (the client goes away while the handler runs, and the
//!   request's future is dropped): the failure is **kept**: one failure,
//!   never more. Refunding it would let a guesser drop each connection
//!   before the answer to get its guess back. A client gone before the
//!   account's attempt was taken (while its body arrives, or while the
//!   per-IP limiter decides) leaves nothing.
//!
//! The keep, clear and refund run as a task of their own once the response
//! is known, so they happen even if the client goes away meanwhile; the
//! response waits for them, so the client's next attempt sees them.
//!
//! With [`count_by_status(false)`](LoginLayer::count_by_status), the same
//! holds: the attempt is taken up front, and the handler's
//! [`LoginOutcome`] settles it as a status would (`Failed`, or nothing
//! said: kept; `Succeeded`: cleared; `NoAttempt`: refunded). Behind the
//! layer, say outcomes that way, not with [`LoginAttempts::failed`], which
//! would record a second failure for the attempt.
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//! use http::{Request, Response, StatusCode};
//! use http_body_util::Full;
//! use bytes::Bytes;
//! use tollgate_limiter::{KeyHasher, Limiter, ProgressiveDelay, SlidingWindow};
//! use tollgate_memory::MemoryBackend;
//! use tollgate_tower::extract::{ClientIp, PeerAddr};
//! use tollgate_tower::login::LoginLayer;
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let backend = MemoryBackend::new();
//! let per_ip = Limiter::new("login_ip", SlidingWindow::new(20, Duration::from_secs(900))?, backend.clone());
//! let per_account = Limiter::new(
//!     "login_account",
//!     ProgressiveDelay::new(3, Duration::from_secs(1), 2, Duration::from_secs(900), Duration::from_secs(3600))?,
//!     backend,
//! );
//!
//! // In a service: `KeyHasher::from_env()?` (TOLLGATE_KEY_SECRET).
//! let hasher = KeyHasher::new("the fleet's secret, 16+ bytes")?;
//!
//! let login = ServiceBuilder::new()
//!     .layer(LoginLayer::new(per_ip, per_account, ClientIp::new(), hasher))
//!     .service(service_fn(|req: Request<Full<Bytes>>| async move {
//!         // A real handler checks the password against a slow hash.
//!         let _body = req.into_body();
//!         let mut res = Response::new(Full::<Bytes>::from("invalid email or password"));
//!         *res.status_mut() = StatusCode::UNAUTHORIZED;
//!         Ok::<_, std::convert::Infallible>(res)
//!     }));
//!
//! let attempt = || {
//!     let mut req = Request::post("/login")
//!         .header("content-type", "application/json")
//!         .body(Full::from(r#"{"email":"alice@example.com","password":"guess"}"#))
//!         .unwrap();
//!     req.extensions_mut().insert(PeerAddr("192.0.2.7:4000".parse().unwrap()));
//!     req
//! };
//! let mut statuses = Vec::new();
//! for _ in 0..6 {
//!     statuses.push(login.clone().oneshot(attempt()).await?.status());
//! }
//! // Three free failures, the fourth starts a delay, then 429 until it ends.
//! assert_eq!(statuses, [401, 401, 401, 401, 429, 429]);
//! # Ok(())
//! # }
//! ```

mod attempts;
mod classify;
mod layer;

pub use attempts::LoginAttempts;
pub use classify::{FailedLogins, LoginOutcome};
pub use layer::{DEFAULT_BODY_LIMIT, Login, LoginLayer};
