use http::header::{AUTHORIZATION, HeaderName};
use tollgate_limiter::{Key, KeyHasher};

use super::KeyExtractor;

/// The longest credential accepted by default: 8 KiB, the longest header
/// line nginx and most proxies pass by default, so a large JWT fits while
/// a client still cannot make the server hash megabytes per request.
pub const DEFAULT_MAX_CREDENTIAL_LEN: usize = 8 * 1024;

/// The API key of a request, from a header or an `Authorization: Bearer`
/// token, hashed with [`KeyHasher::secret`] (HMAC under your secret) so the
/// backend never holds it in clear and a reader of the backend cannot
/// confirm a guessed key.
///
/// A value that is empty, longer than [`max_len`](Self::max_len) (default
/// [8 KiB](DEFAULT_MAX_CREDENTIAL_LEN)), not visible ASCII, or (for
/// `Authorization`) not a bearer token is no credential. Nor is a bearer
/// token that holds a space, a tab or a comma (`Bearer real junk`; RFC
/// 6750's tokens have none): it reads as several credentials, and a
/// service that takes its first word would authenticate one key while the
/// limiter counted another, fresh on every request. (A header's value is
/// the credential whole.) An invalid header
/// does not hide a valid source behind it: with
/// [`or_bearer`](Self::or_bearer), a bad `X-Api-Key` falls through to the
/// bearer token, so a client cannot turn its own request keyless by
/// adding a junk header. Every line of each source read is looked at, and
/// a request carrying two *different* valid credentials (an `X-Api-Key`
/// and a bearer token, or two lines of either) has no key: the service
/// authenticates with one of them in an order of its own, so keying either
/// would let a client send a fresh made-up credential beside its real one
/// and never be counted. With no valid credential, or two, there is no key
/// and the layer's [`MissingKey`](crate::MissingKey) policy decides
/// (`Reject`, the default, answers 400; with `Allow` on a fail-open
/// limiter such a request passes uncounted, as a request without a key
/// does).
///
/// # Examples
///
/// ```
/// use http::HeaderName;
/// use tollgate_limiter::KeyHasher;
/// use tollgate_tower::extract::{ApiKey, KeyExtractor};
///
/// // In a service: `KeyHasher::from_env()?` (TOLLGATE_KEY_SECRET).
/// let hasher = KeyHasher::new("the fleet's secret, 16+ bytes")?;
/// let extractor = ApiKey::header(HeaderName::from_static("x-api-key"), hasher.clone()).or_bearer();
/// let req = http::Request::builder()
///     .header("authorization", "Bearer sk_live_123")
///     .body(())?;
/// assert_eq!(extractor.extract(&req), Some(hasher.secret("sk_live_123")));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct ApiKey {
    header: Option<HeaderName>,
    bearer: bool,
    max_len: usize,
    hasher: KeyHasher,
}

impl ApiKey {
    /// The key is the value of `header`, hashed by `hasher`.
    pub fn header(header: HeaderName, hasher: KeyHasher) -> Self {
        Self {
            header: Some(header),
            bearer: false,
            max_len: DEFAULT_MAX_CREDENTIAL_LEN,
            hasher,
        }
    }

    /// The key is the token of `Authorization: Bearer <token>`, hashed by
    /// `hasher`.
    pub fn bearer(hasher: KeyHasher) -> Self {
        Self {
            header: None,
            bearer: true,
            max_len: DEFAULT_MAX_CREDENTIAL_LEN,
            hasher,
        }
    }

    /// Also accepts a bearer token (when the header is absent or invalid,
    /// or holds the same credential).
    pub fn or_bearer(mut self) -> Self {
        self.bearer = true;
        self
    }

    /// The longest credential accepted, in bytes (default
    /// [`DEFAULT_MAX_CREDENTIAL_LEN`], 8 KiB). A longer one is no
    /// credential. Raise it for larger tokens; the cost of a long one is
    /// one hash per request, and the server's own header limit still
    /// applies.
    pub fn max_len(mut self, bytes: usize) -> Self {
        self.max_len = bytes;
        self
    }

    /// The credential in clear, as the request carries it (for a policy
    /// resolver that looks the key's role up, and for the service's own
    /// authentication, which then uses the credential that was counted):
    /// the one valid value found in the header's lines and, if enabled, the
    /// bearer tokens; `None` without one, or with two different ones.
    pub fn credential<'r, B>(&self, req: &'r http::Request<B>) -> Option<&'r str> {
        let headers = req.headers();
        let mut found = None;
        // The first valid credential, and whether every other one is the
        // same: two different ones are none (see the type's docs). Loops,
        // not an iterator chain: read on every request, sometimes twice
        // (a policy resolver and the extractor), and the chain's adapters
        // cost ~100 instructions a read more (callgrind, the API-key
        // example). `trim_ascii`, not `trim`: a value `to_str` accepts is
        // visible ASCII and tabs, whose only whitespace (space, tab) both
        // trim alike, without `trim`'s decoding of UTF-8 characters.
        // The first one found is not compared with itself.
        let mut same = |c: &'r str| match found {
            None => {
                found = Some(c);
                true
            }
            Some(first) => first == c,
        };
        if let Some(name) = &self.header {
            for v in headers.get_all(name) {
                if let Some(c) = v.to_str().ok().and_then(|v| self.valid(v.trim_ascii()))
                    && !same(c)
                {
                    return None;
                }
            }
        }
        if self.bearer {
            // Every `Authorization` line with a valid bearer token: a junk
            // or other-scheme line before it hides nothing.
            for v in headers.get_all(AUTHORIZATION) {
                if let Some(c) = v.to_str().ok().and_then(|v| self.bearer_token(v))
                    && !same(c)
                {
                    return None;
                }
            }
        }
        found
    }

    /// The valid token of an `Authorization: Bearer <token>` line.
    fn bearer_token<'s>(&self, line: &'s str) -> Option<&'s str> {
        // `line` is what `to_str` accepts: see `credential` on `trim_ascii`.
        let (scheme, token) = line.trim_ascii().split_once(' ')?;
        // One word (RFC 6750's b64token has no space, tab or comma):
        // several read as several credentials, see the type's docs.
        let token = token.trim_ascii();
        let one_word = !token.bytes().any(|b| matches!(b, b' ' | b'\t' | b','));
        if scheme.eq_ignore_ascii_case("bearer") && one_word {
            self.valid(token)
        } else {
            None
        }
    }

    fn valid<'s>(&self, s: &'s str) -> Option<&'s str> {
        (!s.is_empty() && s.len() <= self.max_len).then_some(s)
    }
}

impl<B> KeyExtractor<http::Request<B>> for ApiKey {
    fn extract(&self, req: &http::Request<B>) -> Option<Key> {
        self.credential(req).map(|c| self.hasher.secret(c))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hasher() -> KeyHasher {
        KeyHasher::new("a test secret, 16 bytes or more").unwrap()
    }

    fn secret(s: &str) -> Key {
        hasher().secret(s)
    }

    fn req(name: &str, value: &[u8]) -> http::Request<()> {
        with(&[(name, value)])
    }

    #[test]
    fn header_then_bearer() {
        let x = ApiKey::header(HeaderName::from_static("x-api-key"), hasher()).or_bearer();
        assert_eq!(x.extract(&req("x-api-key", b" abc ")), Some(secret("abc")));
        // Tabs are trimmed as spaces are (the only whitespace a value holds).
        assert_eq!(
            x.extract(&req("x-api-key", b"\t abc\t")),
            Some(secret("abc"))
        );
        assert_eq!(
            x.extract(&req("authorization", b"\tBearer tok \t")),
            Some(secret("tok"))
        );
        assert_eq!(
            x.extract(&req("authorization", b"bearer  tok")),
            Some(secret("tok"))
        );
        assert_eq!(x.extract(&req("authorization", b"Basic dXNlcjpw")), None);
        assert_eq!(x.extract(&http::Request::new(())), None);
        let only_header = ApiKey::header(HeaderName::from_static("x-api-key"), hasher());
        assert_eq!(
            only_header.extract(&req("authorization", b"Bearer tok")),
            None
        );
    }

    #[test]
    fn malformed_values_are_missing_not_panics() {
        let x = ApiKey::bearer(hasher());
        assert_eq!(x.extract(&req("authorization", b"Bearer \xff\xfe")), None);
        assert_eq!(x.extract(&req("authorization", b"Bearer")), None);
        assert_eq!(x.extract(&req("authorization", b"Bearer ")), None);
        let long = format!("Bearer {}", "a".repeat(DEFAULT_MAX_CREDENTIAL_LEN + 1));
        assert_eq!(x.extract(&req("authorization", long.as_bytes())), None);
    }

    fn with(headers: &[(&str, &[u8])]) -> http::Request<()> {
        let mut r = http::Request::new(());
        for (k, v) in headers {
            r.headers_mut().append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                http::HeaderValue::from_bytes(v).unwrap(),
            );
        }
        r
    }

    /// An invalid `X-Api-Key` (empty, non-ASCII, over-long) must not hide
    /// the valid bearer token behind it.
    #[test]
    fn an_invalid_header_falls_through_to_the_bearer_token() {
        let x = ApiKey::header(HeaderName::from_static("x-api-key"), hasher()).or_bearer();
        let long = "k".repeat(DEFAULT_MAX_CREDENTIAL_LEN + 1);
        for bad in [&b""[..], b"   ", b"\xff\xfe", long.as_bytes()] {
            let r = with(&[("x-api-key", bad), ("authorization", b"Bearer tok")]);
            assert_eq!(x.extract(&r), Some(secret("tok")), "{bad:?}");
        }
        // A valid header beside a different token is ambiguous (see
        // `two_different_credentials_are_no_key`).
        let r = with(&[("x-api-key", b"hdr"), ("authorization", b"Bearer tok")]);
        assert_eq!(x.extract(&r), None);
        // A junk Authorization line before the bearer one hides nothing.
        let r = with(&[
            ("authorization", b"Basic x"),
            ("authorization", b"Bearer tok"),
        ]);
        assert_eq!(x.extract(&r), Some(secret("tok")));
    }

    /// Two different credentials in one request are no key: the service
    /// authenticates with one of them, in an order of its own, so keying
    /// either would let a client send a fresh junk credential beside its
    /// real one on every request and never be counted.
    #[test]
    fn two_different_credentials_are_no_key() {
        let x = ApiKey::header(HeaderName::from_static("x-api-key"), hasher()).or_bearer();
        for headers in [
            &[
                ("x-api-key", &b"junk1"[..]),
                ("authorization", b"Bearer real"),
            ][..],
            &[("x-api-key", b"junk1"), ("x-api-key", b"real")],
            &[
                ("authorization", b"Bearer junk1"),
                ("authorization", b"Bearer real"),
            ],
        ] {
            let shown: Vec<_> = headers
                .iter()
                .map(|(k, v)| (*k, String::from_utf8_lossy(v)))
                .collect();
            assert_eq!(x.extract(&with(headers)), None, "{shown:?}");
            assert_eq!(x.credential(&with(headers)), None, "{shown:?}");
        }
        let only_bearer = ApiKey::bearer(hasher());
        let r = with(&[
            ("authorization", b"Bearer junk1"),
            ("authorization", b"Bearer real"),
        ]);
        assert_eq!(only_bearer.extract(&r), None);
        // The same credential twice is one credential.
        let r = with(&[("x-api-key", b"real"), ("authorization", b"Bearer real")]);
        assert_eq!(x.extract(&r), Some(secret("real")));
        // A source not read is not a second credential.
        let only_header = ApiKey::header(HeaderName::from_static("x-api-key"), hasher());
        let r = with(&[("x-api-key", b"real"), ("authorization", b"Bearer junk1")]);
        assert_eq!(only_header.extract(&r), Some(secret("real")));
    }

    /// A bearer token that reads as several credentials (`Bearer real
    /// junk1`) is no credential: a service that takes its first word
    /// (`Bearer` and the next word, as `split_whitespace().nth(1)` reads
    /// it) authenticates the real key, while the limiter, keying the whole
    /// value, would count each request under a fresh key.
    #[test]
    fn a_bearer_token_of_several_words_is_no_credential() {
        let x = ApiKey::header(HeaderName::from_static("x-api-key"), hasher()).or_bearer();
        for value in [
            &b"Bearer real junk1"[..],
            b"Bearer real\tjunk1",
            b"Bearer real,junk1",
        ] {
            let shown = String::from_utf8_lossy(value);
            assert_eq!(x.extract(&req("authorization", value)), None, "{shown}");
        }
        // Beside a valid header, such a token hides nothing.
        let r = with(&[
            ("x-api-key", b"real"),
            ("authorization", b"Bearer real junk1"),
        ]);
        assert_eq!(x.extract(&r), Some(secret("real")));
    }

    /// A header's value is the credential whole: `ApiKey::header` on
    /// `Authorization` itself keys `Token abc` (another scheme than
    /// bearer) as it always did. Only a bearer token is one word.
    #[test]
    fn a_header_value_is_keyed_whole() {
        let x = ApiKey::header(AUTHORIZATION, hasher());
        for value in ["Token abc", "Basic dXNlcjpw"] {
            let r = req("authorization", value.as_bytes());
            assert_eq!(x.extract(&r), Some(secret(value)), "{value}");
        }
    }

    /// Real JWTs run past 4 KiB: the default takes 8 KiB, and the bound is
    /// configurable either way.
    #[test]
    fn the_length_bound_is_configurable() {
        let jwt = "j".repeat(6 * 1024);
        let r = with(&[("authorization", format!("Bearer {jwt}").as_bytes())]);
        assert_eq!(ApiKey::bearer(hasher()).extract(&r), Some(secret(&jwt)));
        assert_eq!(ApiKey::bearer(hasher()).max_len(4096).extract(&r), None);
        let big = "j".repeat(20 * 1024);
        let r = with(&[("authorization", format!("Bearer {big}").as_bytes())]);
        assert_eq!(ApiKey::bearer(hasher()).extract(&r), None);
        assert_eq!(
            ApiKey::bearer(hasher()).max_len(32 * 1024).extract(&r),
            Some(secret(&big))
        );
    }

    use proptest::strategy::Strategy as _;

    proptest::proptest! {
        /// Whatever bytes the two headers hold, nothing panics, a key is
        /// always the hash of a bounded, non-empty value the request
        /// carries, and a valid bearer token is hidden only by a second,
        /// different valid credential (never by an invalid header).
        #[test]
        fn any_header_bytes(
            api in proptest::prop_oneof![
                proptest::collection::vec(proptest::num::u8::ANY, 0..64),
                "[ -~]{0,8}".prop_map(String::into_bytes),
                proptest::strategy::Just(b"t0ken".to_vec()),
            ],
            auth in proptest::prop_oneof![
                proptest::collection::vec(proptest::num::u8::ANY, 0..64),
                "(Bearer|bearer|Basic) [ -~]{0,8}".prop_map(String::into_bytes),
                proptest::strategy::Just(b"Bearer t0ken".to_vec()),
            ],
            max_len in 0usize..80,
        ) {
            let x = ApiKey::header(HeaderName::from_static("x-api-key"), hasher())
                .or_bearer()
                .max_len(max_len);
            let mut r = http::Request::new(());
            if let Ok(v) = http::HeaderValue::from_bytes(&api) {
                r.headers_mut().insert("x-api-key", v);
            }
            let token = "t0ken";
            r.headers_mut().append(
                AUTHORIZATION,
                http::HeaderValue::from_str(&format!("Bearer {token}")).unwrap(),
            );
            if let Ok(v) = http::HeaderValue::from_bytes(&auth) {
                r.headers_mut().append(AUTHORIZATION, v);
            }
            let cred = x.credential(&r);
            if let Some(c) = cred {
                proptest::prop_assert!(!c.is_empty() && c.len() <= max_len);
            }
            proptest::prop_assert_eq!(x.extract(&r), cred.map(secret));
            let alone = |name: HeaderName, bytes: &[u8]| {
                let mut r = http::Request::new(());
                r.headers_mut().insert(name, http::HeaderValue::from_bytes(bytes).ok()?);
                x.credential(&r).map(str::to_owned)
            };
            // The valid credentials each extra line carries on its own.
            let others: Vec<String> = alone(HeaderName::from_static("x-api-key"), &api)
                .into_iter()
                .chain(alone(AUTHORIZATION, &auth))
                .collect();
            let token_valid = max_len >= token.len();
            match cred {
                // The one credential every valid source agrees on.
                Some(c) => {
                    for o in &others {
                        proptest::prop_assert_eq!(o.as_str(), c);
                    }
                    if token_valid {
                        proptest::prop_assert_eq!(c, token);
                    }
                }
                // Only a second, different credential hides a valid token.
                None if token_valid => {
                    proptest::prop_assert!(others.iter().any(|o| o != token), "{:?}", others);
                }
                None => {}
            }
        }
    }
}
