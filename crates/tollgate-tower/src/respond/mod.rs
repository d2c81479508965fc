//! Answers: how an allowed request's response is decorated and how a
//! refusal is told to the caller.
//!
//! A layer hands its [`Respond`] implementation either the inner service's
//! response with the [`Quota`] that let it through, or a [`Refusal`]. Two
//! are built in:
//!
//! * [`Http`]: `429 Too Many Requests` with `Retry-After` (whole seconds,
//!   rounded up, never 0), the IETF `RateLimit-Policy` / `RateLimit` fields
//!   and a problem+json body; `503` with a short `Retry-After` when a
//!   fail-closed limiter's backend failed; `400` for a request without a
//!   key. Allowed responses carry the rate-limit fields too (configurable).
//! * [`Grpc`]: the same refusals as gRPC statuses (`RESOURCE_EXHAUSTED`,
//!   `UNAVAILABLE`, `INVALID_ARGUMENT`) with the retry delay in metadata.
//!
//! For a different body or status, give [`Http::on_refusal`] a closure, or
//! implement [`Respond`].

mod body;
mod grpc;
pub(crate) mod http_responder;

use std::time::Duration;

use bytes::Bytes;
use http::header::Entry;
use http::{HeaderMap, HeaderValue};
use tollgate_limiter::decision::ceil_secs;
use tollgate_limiter::{Decision, Policy};

pub use body::ResponseBody;
pub use grpc::Grpc;
pub use http_responder::Http;

/// The `RateLimit-Policy` header name.
pub const RATELIMIT_POLICY: http::HeaderName = http::HeaderName::from_static("ratelimit-policy");
/// The `RateLimit` header name.
pub const RATELIMIT: http::HeaderName = http::HeaderName::from_static("ratelimit");

/// One limiter's decision on a request, with what is needed to describe
/// it to the client.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Quota<'a> {
    /// The limiter's name: the policy's name in the header fields.
    pub name: &'a str,
    /// The limiter's configured policy: the window when the decision does
    /// not carry the one of the policy in force.
    pub policy: &'a Policy,
    /// The backend's decision.
    pub decision: &'a Decision,
}

impl<'a> Quota<'a> {
    /// Bundles a decision with its limiter's name and policy.
    pub fn new(name: &'a str, policy: &'a Policy, decision: &'a Decision) -> Self {
        Self {
            name,
            policy,
            decision,
        }
    }

    /// Seconds until the quota resets for this client: for a refusal, the
    /// time until the request would pass (so `Retry-After` is never
    /// earlier than the `t` the fields announce), otherwise the time until
    /// the quota is whole again.
    pub fn reset_secs(&self) -> u64 {
        if self.decision.is_denied() {
            self.decision.retry_after_secs()
        } else {
            self.decision.reset_after_secs()
        }
    }

    /// `RateLimit-Policy: "name";q=<limit>;w=<window seconds>`, both from
    /// the policy in force (an override, if one is set), as the decision
    /// reports it. For a [calendar quota](tollgate_limiter::calendar), `w`
    /// is the current window's length (a 23-hour day, a 28-day February)
    /// and `t` the time to its end, the next boundary.
    ///
    /// A [composite](tollgate_limiter::Composite) lists every part, named
    /// `<name>.<index>` (from 0): `"api.0";q=10;w=1, "api.1";q=1000;w=86400`.
    /// The binding part's numbers are the decision's (the policy in force);
    /// the others' are the configured policy's.
    pub fn policy_header(&self) -> HeaderValue {
        match self.plain_policy() {
            // The same few values on every response: remembered per thread
            // (no lock, no shared counter) instead of written each time.
            Some((q, w)) => REMEMBERED.with_borrow_mut(|r| r.own(self.name, q, w).value.clone()),
            None => self.composite_policy_header(),
        }
    }

    /// `q` and `w` of a policy that is not a composite (`None` for one).
    fn plain_policy(&self) -> Option<(u64, u64)> {
        if let Policy::Composite(_) = self.policy {
            return None;
        }
        let window = match self.decision.window() {
            w if w.is_zero() => self.policy.window(),
            w => w,
        };
        Some((self.decision.limit(), ceil_secs(window).max(1)))
    }

    fn composite_policy_header(&self) -> HeaderValue {
        let Policy::Composite(c) = self.policy else {
            unreachable!("called for a composite policy only")
        };
        let binding = self.decision.part();
        let mut buf = Vec::with_capacity(c.len() * (self.name.len() + 32));
        for (i, part) in c.policies().enumerate() {
            let (q, window) = if i == binding && !self.decision.window().is_zero() {
                (self.decision.limit(), self.decision.window())
            } else {
                (part.limit(), part.window())
            };
            if i > 0 {
                buf.extend_from_slice(b", ");
            }
            write_field(
                &mut buf,
                &part_name(self.name, i),
                (b'q', q),
                (b'w', ceil_secs(window).max(1)),
            );
        }
        to_header(buf)
    }

    /// The name of the policy the decision is about, as the header fields
    /// spell it: the limiter's name, or for a composite its binding part's,
    /// `<name>.<index>` (what a refusal's `violated-policies` lists).
    pub fn policy_name(&self) -> std::borrow::Cow<'a, str> {
        match self.policy {
            Policy::Composite(_) => part_name(self.name, self.decision.part()).into(),
            _ => self.name.into(),
        }
    }

    /// `RateLimit: "name";r=<remaining>;t=<seconds to reset>`; for a
    /// composite, of the binding part, `"<name>.<index>"`.
    pub fn header(&self) -> HeaderValue {
        self.header_after(None, None)
            .unwrap_or_else(|| HeaderValue::from_static("\"\""))
    }

    /// [`header`](Self::header)'s item after `line` and `", "` (the line
    /// an inner layer wrote), or alone; `None` when `line` holds bytes a
    /// checked value refuses. `own` is this policy's remembered item, if
    /// it has one: its name is written already, escaped.
    fn header_after(&self, line: Option<&[u8]>, own: Option<&Own>) -> Option<HeaderValue> {
        let (r, t) = ((b'r', self.decision.remaining()), (b't', self.reset_secs()));
        match own {
            Some(own) => write_item(line, own.escaped_name(), r, t),
            None => item(line, &self.policy_name(), r, t),
        }
    }
}

/// Adds `quota`'s items to the `RateLimit-Policy` and `RateLimit` fields.
///
/// Both fields are structured-field Lists (RFC 9651): a layer under
/// another one has already written a line of each, and this layer's item
/// joins that line (`"key";r=1;t=30, "ip";r=2;t=20`) instead of adding a
/// second line, which would mean the same list. One line each keeps the
/// response ~30 bytes shorter per stacked layer, and the header map
/// without a chain of extra values.
pub(crate) fn add_quota_headers(headers: &mut HeaderMap, quota: &Quota<'_>) {
    match quota.plain_policy() {
        // The same few policies on every response: their items, and the
        // lines they join, are remembered per thread (no lock, no shared
        // counter) instead of written each time.
        Some((q, w)) => {
            REMEMBERED
                .with_borrow_mut(|r| add_fields(headers, quota, Some(r.own(quota.name, q, w))));
        }
        None => add_fields(headers, quota, None),
    }
}

/// [`add_quota_headers`], with the policy's remembered item if it has one
/// (`None` for a composite).
fn add_fields(headers: &mut HeaderMap, quota: &Quota<'_>, mut own: Option<&mut Own>) {
    let own_policy = |own: Option<&Own>| match own {
        Some(own) => own.value.clone(),
        None => quota.composite_policy_header(),
    };
    match headers.entry(RATELIMIT_POLICY) {
        Entry::Vacant(e) => {
            e.insert(own_policy(own.as_deref()));
        }
        Entry::Occupied(mut e) => {
            if let Some(last) = e.iter_mut().last() {
                let line = match own.as_deref_mut() {
                    Some(own) => own.joined(last),
                    None => joined(last.as_bytes(), quota.composite_policy_header().as_bytes()),
                };
                // A line a checked value refuses (only a value made with
                // `http`'s unsafe unchecked constructor can hold one;
                // hyper's parser refuses them too) is kept as it is, never
                // replaced: the item goes on a line of its own.
                match line {
                    Some(v) => *last = v,
                    None => e.append(own_policy(own.as_deref())),
                }
            }
        }
    }
    match headers.entry(RATELIMIT) {
        Entry::Vacant(e) => {
            e.insert(
                quota
                    .header_after(None, own.as_deref())
                    .unwrap_or_else(|| HeaderValue::from_static("\"\"")),
            );
        }
        Entry::Occupied(mut e) => {
            let Some(last) = e.iter_mut().last() else {
                return;
            };
            // As for the policy field: a line a checked value refuses
            // keeps its own line.
            match quota.header_after(Some(last.as_bytes()), own.as_deref()) {
                Some(v) => *last = v,
                None => e.append(quota.header()),
            }
        }
    }
}

/// A composite part's name in the header fields.
fn part_name(name: &str, index: usize) -> String {
    format!("{name}.{index}")
}

/// Policies, and lines each policy joined, remembered per thread.
const POLICY_CACHE: usize = 16;

/// A policy's `RateLimit-Policy` item, as a thread remembers it.
struct Own {
    /// The limiter's name, `q` and `w`.
    key: (Box<str>, u64, u64),
    /// `"name";q=<q>;w=<w>`.
    value: HeaderValue,
    /// Where the name's closing quote is in `value`.
    name_end: usize,
    /// (A line an inner layer wrote, that line with this item joined.)
    joined: Vec<(HeaderValue, HeaderValue)>,
}

impl Own {
    /// The name as `value` writes it between its quotes (escaped).
    fn escaped_name(&self) -> &[u8] {
        &self.value.as_bytes()[1..self.name_end]
    }

    /// `line, "name";q=<q>;w=<w>`; `None` when `line` holds bytes a
    /// checked value refuses (see [`add_fields`]).
    fn joined(&mut self, line: &HeaderValue) -> Option<HeaderValue> {
        if let Some((_, v)) = self.joined.iter().find(|(l, _)| l == line) {
            return Some(v.clone());
        }
        let v = joined(line.as_bytes(), self.value.as_bytes())?;
        remember(&mut self.joined, (line.clone(), v.clone()));
        Some(v)
    }
}

/// The `RateLimit-Policy` items a thread has made.
struct Remembered {
    policies: Vec<Own>,
}

thread_local! {
    static REMEMBERED: std::cell::RefCell<Remembered> = const {
        std::cell::RefCell::new(Remembered {
            policies: Vec::new(),
        })
    };
}

impl Remembered {
    /// The item `"name";q=<q>;w=<w>`, remembered.
    fn own(&mut self, name: &str, q: u64, w: u64) -> &mut Own {
        let found = self.policies.iter().position(
            |Own {
                 key: (n, cq, cw), ..
             }| **n == *name && *cq == q && *cw == w,
        );
        let i = match found {
            Some(i) => i,
            None => {
                let value = item(None, name, (b'q', q), (b'w', w))
                    .unwrap_or_else(|| HeaderValue::from_static("\"\""));
                // The closing quote is the last one: the parameters after
                // it are digits.
                let name_end = value
                    .as_bytes()
                    .iter()
                    .rposition(|&c| c == b'"')
                    .unwrap_or(1)
                    .max(1);
                let own = Own {
                    key: (name.into(), q, w),
                    value,
                    name_end,
                    joined: Vec::new(),
                };
                remember(&mut self.policies, own);
                self.policies.len() - 1
            }
        };
        &mut self.policies[i]
    }
}

/// Adds `entry` to a per-thread cache, in place of the oldest when the
/// cache holds [`POLICY_CACHE`] entries.
fn remember<T>(cache: &mut Vec<T>, entry: T) {
    if cache.len() == POLICY_CACHE {
        cache.remove(0);
    }
    cache.push(entry);
}

/// `line, item`, in one allocation of exactly its length; `None` when
/// `line` holds bytes a checked value refuses.
fn joined(line: &[u8], item: &[u8]) -> Option<HeaderValue> {
    let mut v = Vec::with_capacity(line.len() + 2 + item.len());
    v.extend_from_slice(line);
    v.extend_from_slice(b", ");
    v.extend_from_slice(item);
    HeaderValue::from_maybe_shared(Bytes::from(v)).ok()
}

/// `"name";a=1;b=2`, after `line` and `", "` if there is a line (see
/// [`write_item`]); `None` when `line` holds bytes a checked value refuses.
fn item(line: Option<&[u8]>, name: &str, a: (u8, u64), b: (u8, u64)) -> Option<HeaderValue> {
    if !is_plain(name) {
        // A name to escape (rare): written as a composite's fields are.
        let mut buf = Vec::new();
        if let Some(line) = line {
            buf.extend_from_slice(line);
            buf.extend_from_slice(b", ");
        }
        write_field(&mut buf, name, a, b);
        return HeaderValue::from_bytes(&buf).ok();
    }
    write_item(line, name.as_bytes(), a, b)
}

/// `"name";a=1;b=2` with `name` written as it is (plain or escaped
/// already), after `line` and `", "` if there is a line, without the
/// formatting machinery (this runs on every response) into one allocation
/// of exactly its length, which becomes the value's bytes (no buffer
/// copied, no second allocation); `None` when `line` holds bytes a checked
/// value refuses (the item's own are printable ASCII).
fn write_item(line: Option<&[u8]>, name: &[u8], a: (u8, u64), b: (u8, u64)) -> Option<HeaderValue> {
    let (mut a_digits, mut b_digits) = (itoa::Buffer::new(), itoa::Buffer::new());
    let a_digits = a_digits.format(a.1).as_bytes();
    let b_digits = b_digits.format(b.1).as_bytes();
    let (line, sep): (&[u8], &[u8]) = match line {
        Some(line) => (line, b", "),
        None => (b"", b""),
    };
    let len = line.len() + sep.len() + name.len() + 2 + 3 + a_digits.len() + 3 + b_digits.len();
    let mut v = Vec::with_capacity(len);
    v.extend_from_slice(line);
    v.extend_from_slice(sep);
    v.push(b'"');
    v.extend_from_slice(name);
    v.extend_from_slice(&[b'"', b';', a.0, b'=']);
    v.extend_from_slice(a_digits);
    v.extend_from_slice(&[b';', b.0, b'=']);
    v.extend_from_slice(b_digits);
    debug_assert_eq!(v.len(), len);
    HeaderValue::from_maybe_shared(Bytes::from(v)).ok()
}
fn write_field(buf: &mut Vec<u8>, name: &str, a: (u8, u64), b: (u8, u64)) {
    // Room for the quoted name and two 20-digit parameters: one capacity
    // check, not one per byte pushed.
    buf.reserve(name.len() + 2 + 2 * 23);
    sf_string(buf, name);
    for (param, value) in [a, b] {
        buf.extend_from_slice(&[b';', param, b'=']);
        push_u64(buf, value);
    }
}

fn to_header(buf: Vec<u8>) -> HeaderValue {
    // Only printable ASCII was written.
    HeaderValue::from_maybe_shared(Bytes::from(buf))
        .unwrap_or_else(|_| HeaderValue::from_static("\"\""))
}

/// `v` in decimal (itoa, already in the tree through http and hyper: two
/// digits per division, no formatter).
fn push_u64(buf: &mut Vec<u8>, v: u64) {
    buf.extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
}

/// Whether `s` is a structured-field string's content as it is: printable
/// ASCII without quotes or backslashes (a limiter's name, as a rule).
fn is_plain(s: &str) -> bool {
    s.bytes()
        .all(|c| matches!(c, b' '..=b'~') && c != b'"' && c != b'\\')
}

/// A structured-field string: printable ASCII only, quotes and backslashes
/// escaped; anything else becomes `_`.
fn sf_string(buf: &mut Vec<u8>, s: &str) {
    buf.push(b'"');
    // A limiter's name is plain ASCII: copied whole.
    if is_plain(s) {
        buf.extend_from_slice(s.as_bytes());
        buf.push(b'"');
        return;
    }
    for c in s.chars() {
        match c {
            '"' | '\\' => buf.extend_from_slice(&[b'\\', c as u8]),
            ' '..='~' => buf.push(c as u8),
            _ => buf.push(b'_'),
        }
    }
    buf.push(b'"');
}

/// Why a request was refused.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum Refusal<'a> {
    /// The limit is reached.
    Limited(Quota<'a>),
    /// The backend failed and the limiter is fail-closed.
    Unavailable {
        /// The limiter's name.
        limiter: &'a str,
        /// When to try again (short).
        retry_after: Duration,
    },
    /// The request carries no key and the layer refuses such requests.
    MissingKey {
        /// The limiter's name.
        limiter: &'a str,
    },
    /// The request costs more than the policy can ever grant (an LLM call
    /// asking for more tokens than the bucket holds): waiting will not help.
    TooCostly {
        /// The limiter's name.
        limiter: &'a str,
    },
}

impl Refusal<'_> {
    /// The limiter that refused.
    pub fn limiter(&self) -> &str {
        match self {
            Refusal::Limited(q) => q.name,
            Refusal::Unavailable { limiter, .. }
            | Refusal::MissingKey { limiter }
            | Refusal::TooCostly { limiter } => limiter,
        }
    }

    /// Whole seconds to wait, rounded up and never 0; `None` when waiting
    /// will not help (a missing key, a cost above the limit).
    pub fn retry_after_secs(&self) -> Option<u64> {
        match self {
            Refusal::Limited(q) => Some(q.decision.retry_after_secs()),
            Refusal::Unavailable { retry_after, .. } => Some(ceil_secs(*retry_after).max(1)),
            Refusal::MissingKey { .. } | Refusal::TooCostly { .. } => None,
        }
    }
}

/// Turns outcomes into responses.
///
/// `Res` is the inner service's response type; `Response` what the layered
/// service answers (the same type for every outcome).
pub trait Respond<Res> {
    /// The layered service's response.
    type Response;

    /// The inner service's response to an allowed request. `quota` is
    /// `None` when no decision was made (a fail-open limiter whose backend
    /// failed, or a request without a key that the layer lets pass).
    fn allowed(&self, response: Res, quota: Option<&Quota<'_>>) -> Self::Response;

    /// The answer to a refused request.
    fn refused(&self, refusal: &Refusal<'_>) -> Self::Response;

    /// The inner service's response to a request that a limiter in
    /// [shadow mode](tollgate_limiter::shadow) would have refused and let
    /// through. The default answers as [`allowed`](Self::allowed) without
    /// a quota; the built-in responders also attach `shadow` to the
    /// response's extensions (see [`ShadowRefusal`]).
    fn shadowed(&self, response: Res, shadow: &ShadowRefusal) -> Self::Response {
        let _ = shadow;
        self.allowed(response, None)
    }
}

/// What enforcement would have answered a request that a limiter in
/// [shadow mode](tollgate_limiter::shadow) let through.
///
/// The built-in responders ([`Http`], [`Grpc`]) put it in the response's
/// extensions, and add **no** header: the client sees what it would see
/// without the limiter (no `RateLimit` fields that would make a
/// well-behaved client slow down), while an outer layer (access log,
/// tracing) can read what would have happened. The limiter's metrics count
/// it as `outcome="shadow"` and its log says so, throttled.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShadowRefusal {
    /// The limiter's name.
    pub limiter: String,
    /// The `Retry-After` enforcement would have sent.
    pub retry_after: Duration,
    /// The refusal by the limit, or `None` when enforcement would have
    /// refused for another reason (a cost the policy can never grant, a
    /// fail-closed backend failure).
    pub decision: Option<Decision>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_limiter::TokenBucket;

    #[test]
    fn header_fields_follow_the_draft_syntax() {
        let policy = Policy::from(TokenBucket::new(100, 100, Duration::from_secs(60)).unwrap());
        let allowed = Decision::allowed(100, 50, Duration::from_millis(29_001));
        let q = Quota::new("api", &policy, &allowed);
        assert_eq!(q.policy_header(), "\"api\";q=100;w=60");
        assert_eq!(q.header(), "\"api\";r=50;t=30");

        let denied = Decision::denied(100, 0, Duration::from_millis(1), Duration::from_secs(60));
        let q = Quota::new("a\"b\\c\u{e9}", &policy, &denied);
        assert_eq!(q.header(), "\"a\\\"b\\\\c_\";r=0;t=1");
    }

    #[test]
    fn stacked_items_join_one_line_per_field() {
        let policy = Policy::from(TokenBucket::new(100, 100, Duration::from_secs(60)).unwrap());
        let d = Decision::allowed(100, 50, Duration::from_millis(29_001));
        // Twice: the second joined policy line comes from the cache.
        for _ in 0..2 {
            let mut headers = HeaderMap::new();
            add_quota_headers(&mut headers, &Quota::new("key", &policy, &d));
            add_quota_headers(&mut headers, &Quota::new("ip", &policy, &d));
            let lines = |name| headers.get_all(name).iter().cloned().collect::<Vec<_>>();
            assert_eq!(
                lines(RATELIMIT_POLICY),
                ["\"key\";q=100;w=60, \"ip\";q=100;w=60"]
            );
            assert_eq!(lines(RATELIMIT), ["\"key\";r=50;t=30, \"ip\";r=50;t=30"]);
        }
        // A name to escape, alone and joined: the RateLimit item takes the
        // escaped name its remembered policy item wrote.
        for _ in 0..2 {
            let mut headers = HeaderMap::new();
            add_quota_headers(&mut headers, &Quota::new("a\"b\\c\u{e9}", &policy, &d));
            assert_eq!(headers[RATELIMIT_POLICY], "\"a\\\"b\\\\c_\";q=100;w=60");
            assert_eq!(headers[RATELIMIT], "\"a\\\"b\\\\c_\";r=50;t=30");
            add_quota_headers(&mut headers, &Quota::new("\\", &policy, &d));
            assert_eq!(
                headers[RATELIMIT],
                "\"a\\\"b\\\\c_\";r=50;t=30, \"\\\\\";r=50;t=30"
            );
        }
        // A line of another policy is joined, not mistaken for a cached one.
        let mut headers = HeaderMap::new();
        headers.insert(RATELIMIT_POLICY, HeaderValue::from_static("\"up\";q=1;w=1"));
        add_quota_headers(&mut headers, &Quota::new("ip", &policy, &d));
        assert_eq!(
            headers[RATELIMIT_POLICY],
            "\"up\";q=1;w=1, \"ip\";q=100;w=60"
        );
    }

    proptest::proptest! {
        /// An item written into its own value, after a line or alone, has
        /// the bytes `write_field` writes (the composite's and the escaped
        /// name's path, unchanged since the fields were first written).
        #[test]
        fn an_item_has_the_bytes_write_field_writes(
            name in "[ -~]{0,12}|\\PC{0,6}",
            line in proptest::option::of("[ -~]{0,40}"),
            a in proptest::num::u64::ANY,
            b in 0u64..100_000,
        ) {
            let mut expected = Vec::new();
            if let Some(line) = &line {
                expected.extend_from_slice(line.as_bytes());
                expected.extend_from_slice(b", ");
            }
            write_field(&mut expected, &name, (b'r', a), (b't', b));
            let v = item(line.as_deref().map(str::as_bytes), &name, (b'r', a), (b't', b))
                .expect("printable ASCII");
            proptest::prop_assert_eq!(v.as_bytes(), &expected[..]);
        }

        #[test]
        fn numbers_are_written_as_display_writes_them(v in proptest::num::u64::ANY, small in 0u64..1000) {
            for v in [v, small] {
                let mut buf = Vec::new();
                push_u64(&mut buf, v);
                proptest::prop_assert_eq!(String::from_utf8(buf).unwrap(), v.to_string());
            }
        }
    }

    #[test]
    fn a_composite_lists_every_part_and_names_the_binding_one() {
        use tollgate_limiter::model::{Op, State};
        use tollgate_limiter::{Composite, SlidingWindow};
        let policy = Policy::from(
            Composite::new([
                Policy::from(TokenBucket::new(10, 10, Duration::from_secs(1)).unwrap()),
                Policy::from(SlidingWindow::new(2, Duration::from_secs(86_400)).unwrap()),
            ])
            .unwrap(),
        );
        let mut s = State::fresh(&policy);
        s.apply(0, &policy, Op::Acquire(2));
        let d = s.apply(0, &policy, Op::Acquire(1));
        let q = Quota::new("api", &policy, &d);
        assert_eq!(
            q.policy_header(),
            "\"api.0\";q=10;w=1, \"api.1\";q=2;w=86400"
        );
        assert_eq!(q.header(), "\"api.1\";r=0;t=86400");
    }
}
