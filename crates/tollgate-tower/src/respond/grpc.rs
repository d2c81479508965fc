use http::header::CONTENT_TYPE;
use http::{HeaderName, HeaderValue};

use super::add_quota_headers;
use super::http_responder::{allowed_response, shadowed_response};
use super::{Quota, Refusal, Respond, ResponseBody};

const RESOURCE_EXHAUSTED: u8 = 8;
const UNAVAILABLE: u8 = 14;
const INVALID_ARGUMENT: u8 = 3;

/// The gRPC responder, for tonic servers and any gRPC-over-HTTP/2 service.
///
/// A refusal is a trailers-only gRPC response, which every gRPC client
/// reads as a status:
///
/// | outcome | status | metadata |
/// |---|---|---|
/// | limit reached | `RESOURCE_EXHAUSTED` | `retry-after` (s), `grpc-retry-pushback-ms`, `ratelimit-policy`, `ratelimit`, `grpc-status-details-bin` |
/// | fail-closed backend failure | `UNAVAILABLE` | `retry-after`, `grpc-retry-pushback-ms`, `grpc-status-details-bin` |
/// | no key, refused | `INVALID_ARGUMENT` | |
///
/// `grpc-status-details-bin` holds a `google.rpc.Status` whose details
/// carry a `google.rpc.RetryInfo`, so clients using the rich error model
/// (`tonic-types`) read the delay as `RetryInfo::retry_delay`;
/// `grpc-retry-pushback-ms` is what gRPC's built-in retry policy honours.
///
/// Allowed responses carry the `ratelimit-policy` and `ratelimit` metadata
/// unless turned off.
#[derive(Debug, Clone)]
#[must_use]
pub struct Grpc {
    headers_on_allowed: bool,
}

impl Default for Grpc {
    fn default() -> Self {
        Self::new()
    }
}

impl Grpc {
    /// Rate-limit metadata on allowed responses too.
    pub fn new() -> Self {
        Self {
            headers_on_allowed: true,
        }
    }

    /// Whether allowed responses carry the rate-limit metadata (default
    /// yes).
    pub fn headers_on_allowed(mut self, yes: bool) -> Self {
        self.headers_on_allowed = yes;
        self
    }
}

impl<B> Respond<http::Response<B>> for Grpc {
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
        let (code, message) = match refusal {
            Refusal::Limited(_) => (RESOURCE_EXHAUSTED, "rate limit exceeded"),
            Refusal::Unavailable { .. } => (UNAVAILABLE, "rate limiter unavailable"),
            Refusal::MissingKey { .. } => (INVALID_ARGUMENT, "no rate-limit key"),
            Refusal::TooCostly { .. } => (INVALID_ARGUMENT, "cost above the rate limit"),
        };
        let mut res = http::Response::new(ResponseBody::empty());
        let h = res.headers_mut();
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        h.insert("grpc-status", HeaderValue::from(u16::from(code)));
        h.insert("grpc-message", HeaderValue::from_static(message));
        if let Some(secs) = refusal.retry_after_secs() {
            h.insert(http::header::RETRY_AFTER, HeaderValue::from(secs));
            h.insert(
                HeaderName::from_static("grpc-retry-pushback-ms"),
                HeaderValue::from(secs.saturating_mul(1000)),
            );
            let details = status_details(code, message, secs);
            if let Ok(v) = HeaderValue::try_from(base64(&details)) {
                h.insert(HeaderName::from_static("grpc-status-details-bin"), v);
            }
        }
        if let Refusal::Limited(q) = refusal {
            add_quota_headers(h, q);
        }
        res
    }
}

/// `google.rpc.Status { code, message, details: [Any(RetryInfo { retry_delay })] }`,
/// protobuf-encoded by hand: four small messages do not justify a codegen
/// dependency.
fn status_details(code: u8, message: &str, retry_secs: u64) -> Vec<u8> {
    let mut duration = Vec::new();
    field_varint(&mut duration, 1, retry_secs);
    let mut retry_info = Vec::new();
    field_bytes(&mut retry_info, 1, &duration);
    let mut any = Vec::new();
    field_bytes(&mut any, 1, b"type.googleapis.com/google.rpc.RetryInfo");
    field_bytes(&mut any, 2, &retry_info);
    let mut status = Vec::new();
    field_varint(&mut status, 1, u64::from(code));
    field_bytes(&mut status, 2, message.as_bytes());
    field_bytes(&mut status, 3, &any);
    status
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn field_varint(out: &mut Vec<u8>, field: u64, v: u64) {
    varint(out, field << 3);
    varint(out, v);
}

fn field_bytes(out: &mut Vec<u8>, field: u64, bytes: &[u8]) {
    varint(out, (field << 3) | 2);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// Standard base64 without padding, as gRPC binary metadata is sent.
fn base64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..=chunk.len() {
            out.push(A[(n >> (18 - 6 * i)) as usize & 63] as char);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_known_vectors() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg");
        assert_eq!(base64(b"fo"), "Zm8");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
    }

    #[test]
    fn status_details_encode_retry_info() {
        let d = status_details(8, "x", 300);
        // code 8, message "x"
        assert_eq!(&d[..5], &[0x08, 8, 0x12, 1, b'x']);
        // the Any's type url, then RetryInfo { Duration { seconds: 300 } }
        assert!(d.windows(20).any(|w| w == b"google.rpc.RetryInfo"));
        assert!(d.ends_with(&[0x12, 5, 0x0a, 3, 0x08, 0xac, 0x02]));
    }
}
