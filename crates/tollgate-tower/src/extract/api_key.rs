use http::header::{AUTHORIZATION, HeaderName};
use tollgate_limiter::Key;

use super::KeyExtractor;

/// The longest credential accepted; longer values are treated as missing
/// rather than hashed, so a client cannot make every request a new key
/// by sending megabytes of header.
const MAX_LEN: usize = 4096;

/// The API key of a request, from a header or an `Authorization: Bearer`
/// token, hashed with [`Key::secret`] so the backend never holds it in
/// clear.
///
/// An empty, over-long (more than 4 KiB) or non-ASCII value counts as
/// missing.
///
/// # Examples
///
/// ```
/// use http::HeaderName;
/// use tollgate_limiter::Key;
/// use tollgate_tower::extract::{ApiKey, KeyExtractor};
///
/// let extractor = ApiKey::header(HeaderName::from_static("x-api-key")).or_bearer();
/// let req = http::Request::builder()
///     .header("authorization", "Bearer sk_live_123")
///     .body(())?;
/// assert_eq!(extractor.extract(&req), Some(Key::secret("sk_live_123")));
/// # Ok::<(), http::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct ApiKey {
    header: Option<HeaderName>,
    bearer: bool,
}

impl ApiKey {
    /// The key is the value of `header`.
    pub fn header(header: HeaderName) -> Self {
        Self {
            header: Some(header),
            bearer: false,
        }
    }

    /// The key is the token of `Authorization: Bearer <token>`.
    pub fn bearer() -> Self {
        Self {
            header: None,
            bearer: true,
        }
    }

    /// Also accepts a bearer token when the header is absent.
    pub fn or_bearer(mut self) -> Self {
        self.bearer = true;
        self
    }

    /// The credential in clear, as the request carries it (for a policy
    /// resolver that looks the key's role up).
    pub fn credential<'r, B>(&self, req: &'r http::Request<B>) -> Option<&'r str> {
        let headers = req.headers();
        if let Some(v) = self.header.as_ref().and_then(|name| headers.get(name)) {
            return valid(v.to_str().ok()?.trim());
        }
        if self.bearer {
            let v = headers.get(AUTHORIZATION)?.to_str().ok()?;
            let (scheme, token) = v.trim().split_once(' ')?;
            if scheme.eq_ignore_ascii_case("bearer") {
                return valid(token.trim());
            }
        }
        None
    }
}

fn valid(s: &str) -> Option<&str> {
    (!s.is_empty() && s.len() <= MAX_LEN).then_some(s)
}

impl<B> KeyExtractor<http::Request<B>> for ApiKey {
    fn extract(&self, req: &http::Request<B>) -> Option<Key> {
        self.credential(req).map(Key::secret)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(name: &str, value: &[u8]) -> http::Request<()> {
        let mut r = http::Request::new(());
        r.headers_mut().insert(
            HeaderName::from_bytes(name.as_bytes()).unwrap(),
            http::HeaderValue::from_bytes(value).unwrap(),
        );
        r
    }

    #[test]
    fn header_then_bearer() {
        let x = ApiKey::header(HeaderName::from_static("x-api-key")).or_bearer();
        assert_eq!(
            x.extract(&req("x-api-key", b" abc ")),
            Some(Key::secret("abc"))
        );
        assert_eq!(
            x.extract(&req("authorization", b"bearer  tok")),
            Some(Key::secret("tok"))
        );
        assert_eq!(x.extract(&req("authorization", b"Basic dXNlcjpw")), None);
        assert_eq!(x.extract(&http::Request::new(())), None);
        let only_header = ApiKey::header(HeaderName::from_static("x-api-key"));
        assert_eq!(
            only_header.extract(&req("authorization", b"Bearer tok")),
            None
        );
    }

    #[test]
    fn malformed_values_are_missing_not_panics() {
        let x = ApiKey::bearer();
        assert_eq!(x.extract(&req("authorization", b"Bearer \xff\xfe")), None);
        assert_eq!(x.extract(&req("authorization", b"Bearer")), None);
        assert_eq!(x.extract(&req("authorization", b"Bearer ")), None);
        let long = format!("Bearer {}", "a".repeat(MAX_LEN + 1));
        assert_eq!(x.extract(&req("authorization", long.as_bytes())), None);
    }
}
