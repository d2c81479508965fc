use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, StatusCode};

use super::{Quota, RATELIMIT, Refusal, Respond, ResponseBody, add_quota_headers};

/// The problem type of a quota refusal, from the rate-limit headers draft.
pub(crate) const QUOTA_EXCEEDED: &str =
    "https://iana.org/assignments/http-problem-types#quota-exceeded";

type Hook = dyn Fn(&Refusal<'_>) -> http::Response<Bytes> + Send + Sync;

/// The HTTP responder (the default).
///
/// | outcome | status | headers | body |
/// |---|---|---|---|
/// | limit reached | 429 | `Retry-After`, `RateLimit-Policy`, `RateLimit` | problem+json, type `quota-exceeded` |
/// | fail-closed backend failure | 503 | short `Retry-After` | problem+json |
/// | no key, refused | 400 | | problem+json |
/// | allowed | inner's | `RateLimit-Policy`, `RateLimit` (unless turned off) | inner's |
///
/// Stacked layers (per IP, per key) each add their own policy to the
/// lists: one `RateLimit-Policy` and one `RateLimit` line, the inner
/// layer's item first.
///
/// # Examples
///
/// A plain-text refusal instead of problem+json; the rate-limit headers are
/// still added when the hook leaves them out:
///
/// ```
/// use bytes::Bytes;
/// use tollgate_tower::respond::{Http, Refusal};
///
/// let responder = Http::new().on_refusal(|refusal: &Refusal<'_>| {
///     let status = match refusal {
///         Refusal::Limited(_) => http::StatusCode::TOO_MANY_REQUESTS,
///         _ => http::StatusCode::SERVICE_UNAVAILABLE,
///     };
///     let mut res = http::Response::new(Bytes::from_static(b"slow down\n"));
///     *res.status_mut() = status;
///     res
/// });
/// ```
#[derive(Clone)]
#[must_use]
pub struct Http {
    headers_on_allowed: bool,
    hook: Option<Arc<Hook>>,
}

impl Default for Http {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for Http {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Http")
            .field("headers_on_allowed", &self.headers_on_allowed)
            .field("hook", &self.hook.is_some())
            .finish()
    }
}

impl Http {
    /// Problem+json refusals; rate-limit fields on allowed responses.
    pub fn new() -> Self {
        Self {
            headers_on_allowed: true,
            hook: None,
        }
    }

    /// Whether allowed responses carry the rate-limit fields (default yes).
    pub fn headers_on_allowed(mut self, yes: bool) -> Self {
        self.headers_on_allowed = yes;
        self
    }

    /// Builds refusals with `hook`. `Retry-After` and the rate-limit fields
    /// are added to its response unless it set them itself.
    pub fn on_refusal<F>(mut self, hook: F) -> Self
    where
        F: Fn(&Refusal<'_>) -> http::Response<Bytes> + Send + Sync + 'static,
    {
        self.hook = Some(Arc::new(hook));
        self
    }
}

/// An allowed response, with the quota's fields when `with_fields` (the
/// HTTP and gRPC responders answer allowed requests alike).
pub(crate) fn allowed_response<B>(
    response: http::Response<B>,
    with_fields: bool,
    quota: Option<&Quota<'_>>,
) -> http::Response<ResponseBody<B>> {
    let mut res = response.map(ResponseBody::inner);
    if let (true, Some(q)) = (with_fields, quota) {
        add_quota_headers(res.headers_mut(), q);
    }
    res
}

/// A response shadow mode let through: no rate-limit fields, the refusal
/// enforcement would have made in its extensions (HTTP and gRPC alike).
pub(crate) fn shadowed_response<B>(
    response: http::Response<B>,
    shadow: &super::ShadowRefusal,
) -> http::Response<ResponseBody<B>> {
    let mut res = allowed_response(response, false, None);
    res.extensions_mut().insert(shadow.clone());
    res
}

/// A problem+json body (RFC 9457).
pub(crate) fn problem(
    status: StatusCode,
    kind: &str,
    detail: &str,
    limiter: Option<&str>,
) -> Bytes {
    let mut v = serde_json::json!({
        "type": kind,
        "title": status.canonical_reason().unwrap_or(""),
        "status": status.as_u16(),
        "detail": detail,
    });
    if let Some(name) = limiter {
        v["violated-policies"] = serde_json::json!([name]);
    }
    Bytes::from(v.to_string())
}

/// The default refusal, as status and problem+json body.
pub(crate) fn default_refusal(refusal: &Refusal<'_>) -> http::Response<Bytes> {
    let (status, body) = match refusal {
        Refusal::Limited(q) => (
            StatusCode::TOO_MANY_REQUESTS,
            problem(
                StatusCode::TOO_MANY_REQUESTS,
                QUOTA_EXCEEDED,
                &format!(
                    "Quota exceeded; retry in {} s.",
                    q.decision.retry_after_secs()
                ),
                Some(&q.policy_name()),
            ),
        ),
        Refusal::Unavailable { .. } => (
            StatusCode::SERVICE_UNAVAILABLE,
            problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "about:blank",
                "The rate limiter is unavailable; retry shortly.",
                None,
            ),
        ),
        Refusal::TooCostly { limiter } => (
            StatusCode::PAYLOAD_TOO_LARGE,
            problem(
                StatusCode::PAYLOAD_TOO_LARGE,
                "about:blank",
                "The request costs more than the limit can ever grant.",
                Some(limiter),
            ),
        ),
        Refusal::MissingKey { .. } => (
            StatusCode::BAD_REQUEST,
            problem(
                StatusCode::BAD_REQUEST,
                "about:blank",
                "The request does not say who it is from (no rate-limit key).",
                None,
            ),
        ),
    };
    let mut res = http::Response::new(body);
    *res.status_mut() = status;
    res.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    res
}

impl<B> Respond<http::Response<B>> for Http {
    type Response = http::Response<ResponseBody<B>>;

    fn allowed(&self, response: http::Response<B>, quota: Option<&Quota<'_>>) -> Self::Response {
        allowed_response(response, self.headers_on_allowed, quota)
    }

    fn shadowed(
        &self,
        response: http::Response<B>,
        shadow: &super::ShadowRefusal,
    ) -> Self::Response {
        shadowed_response(response, shadow)
    }

    fn refused(&self, refusal: &Refusal<'_>) -> Self::Response {
        let res = match &self.hook {
            Some(hook) => hook(refusal),
            None => default_refusal(refusal),
        };
        let mut res = res.map(ResponseBody::full);
        let headers = res.headers_mut();
        if let (Some(secs), false) = (
            refusal.retry_after_secs(),
            headers.contains_key(RETRY_AFTER),
        ) {
            headers.insert(RETRY_AFTER, HeaderValue::from(secs));
        }
        if let (Refusal::Limited(q), false) = (refusal, headers.contains_key(RATELIMIT)) {
            add_quota_headers(headers, q);
        }
        res
    }
}
