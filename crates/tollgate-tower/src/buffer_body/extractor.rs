use std::sync::Arc;

use http::header::CONTENT_TYPE;
use http::request::Parts;
use tollgate_limiter::{Key, KeyHasher};

use crate::extract::KeyExtractor;

/// The longest address accepted (RFC 5321 path limit).
const MAX_EMAIL_LEN: usize = 254;

/// Finds a key in a buffered request body.
///
/// Implemented for every closure `Fn(&Parts, &[u8]) -> Option<Key>`.
pub trait BodyExtractor {
    /// The key in `body`, if any.
    fn extract(&self, parts: &Parts, body: &[u8]) -> Option<Key>;
}

impl<F> BodyExtractor for F
where
    F: Fn(&Parts, &[u8]) -> Option<Key>,
{
    fn extract(&self, parts: &Parts, body: &[u8]) -> Option<Key> {
        self(parts, body)
    }
}

/// An email address from a field of a JSON object or a URL-encoded form
/// (by `Content-Type`; without one, JSON then form is tried), normalised
/// (trimmed, lower-cased) and hashed with [`KeyHasher::email`] (HMAC under
/// your secret: the backend never holds the address, and a reader of the
/// backend cannot confirm a guessed one).
///
/// A value that is not a string, is empty, longer than 254 bytes, or has
/// no `@` is no key.
#[derive(Debug, Clone)]
pub struct Email {
    field: Arc<str>,
    hasher: KeyHasher,
}

impl Email {
    /// The email in field `field`, hashed by `hasher`.
    pub fn field(field: impl Into<Arc<str>>, hasher: KeyHasher) -> Self {
        Self {
            field: field.into(),
            hasher,
        }
    }

    fn in_json(&self, body: &[u8]) -> Option<String> {
        let v: serde_json::Value = serde_json::from_slice(body).ok()?;
        v.get(&*self.field)?.as_str().map(str::to_owned)
    }

    fn in_form(&self, body: &[u8]) -> Option<String> {
        form_urlencoded::parse(body)
            .find(|(k, _)| *k == *self.field)
            .map(|(_, v)| v.into_owned())
    }
}

impl BodyExtractor for Email {
    fn extract(&self, parts: &Parts, body: &[u8]) -> Option<Key> {
        let ct = parts
            .headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| {
                v.split(';')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_ascii_lowercase()
            });
        let email = match ct.as_deref() {
            Some("application/json") => self.in_json(body),
            Some(ct) if ct.ends_with("+json") => self.in_json(body),
            Some("application/x-www-form-urlencoded") => self.in_form(body),
            Some(_) => None,
            None => self.in_json(body).or_else(|| self.in_form(body)),
        }?;
        let email = email.trim();
        let ok = !email.is_empty()
            && email.len() <= MAX_EMAIL_LEN
            && email.contains('@')
            && !email.chars().any(char::is_control);
        ok.then(|| self.hasher.email(email))
    }
}

/// The key [`BufferBodyLayer`](crate::BufferBodyLayer) found in the body,
/// as a request extension.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BodyKey(pub Key);

/// The [`BodyKey`] of a request, as a key extractor.
#[derive(Debug, Clone, Copy, Default)]
pub struct FromBody;

impl<B> KeyExtractor<http::Request<B>> for FromBody {
    fn extract(&self, req: &http::Request<B>) -> Option<Key> {
        req.extensions().get::<BodyKey>().map(|k| k.0.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hasher() -> KeyHasher {
        KeyHasher::new("a test secret, 16 bytes or more").unwrap()
    }

    fn parts(ct: Option<&str>) -> Parts {
        let mut b = http::Request::builder();
        if let Some(ct) = ct {
            b = b.header(CONTENT_TYPE, ct);
        }
        b.body(()).unwrap().into_parts().0
    }

    #[test]
    fn json_and_form_normalised() {
        let e = Email::field("email", hasher());
        let want = Some(hasher().email("alice@example.com"));
        let json = br#"{"email":" Alice@Example.com ","password":"x"}"#;
        assert_eq!(
            e.extract(&parts(Some("application/json; charset=utf-8")), json),
            want
        );
        assert_eq!(
            e.extract(&parts(Some("application/vnd.api+json")), json),
            want
        );
        let form = b"password=x&email=ALICE%40example.com";
        assert_eq!(
            e.extract(&parts(Some("application/x-www-form-urlencoded")), form),
            want
        );
        assert_eq!(e.extract(&parts(None), json), want);
        assert_eq!(e.extract(&parts(None), form), want);
    }

    #[test]
    fn malformed_bodies_have_no_key() {
        let e = Email::field("email", hasher());
        let ct = parts(Some("application/json"));
        for body in [
            &b""[..],
            b"{",
            b"[1,2]",
            br#"{"email":42}"#,
            br#"{"email":"not-an-email"}"#,
            br#"{"email":"  "}"#,
            br#"{"mail":"a@b"}"#,
            b"\xff\xfe\x00",
        ] {
            assert_eq!(e.extract(&ct, body), None, "{body:?}");
        }
        let long = format!(r#"{{"email":"{}@example.com"}}"#, "a".repeat(300));
        assert_eq!(e.extract(&ct, long.as_bytes()), None);
        assert_eq!(
            e.extract(&parts(Some("text/plain")), br#"{"email":"a@b"}"#),
            None
        );
    }

    proptest::proptest! {
        /// Whatever the body and its `Content-Type`, extraction never
        /// panics, and a key is always a keyed hash (never the raw bytes
        /// the client sent).
        #[test]
        fn any_body_and_content_type(
            body in proptest::collection::vec(proptest::num::u8::ANY, 0..300),
            ct in proptest::option::of(proptest::string::string_regex(
                "(application/json|application/x-www-form-urlencoded|text/plain|[ -~]{0,30})(; charset=[a-z0-9-]{0,8})?"
            ).unwrap()),
        ) {
            let e = Email::field("email", hasher());
            let parts = match ct.as_deref().map(http::HeaderValue::from_str) {
                Some(Ok(v)) => {
                    let mut p = parts(None);
                    p.headers.insert(CONTENT_TYPE, v);
                    p
                }
                _ => parts(None),
            };
            if let Some(k) = e.extract(&parts, &body) {
                proptest::prop_assert!(k.as_str().starts_with("#e:"), "{k:?}");
            }
        }

        /// Any string in the JSON field: a key exactly when it is a
        /// plausible address, the same key for the same address however
        /// it is cased or padded.
        #[test]
        fn any_email_value(v in "\\PC{0,40}|[ ]{0,2}[a-zA-Z0-9.]{1,10}@[a-zA-Z0-9.]{1,10}[ ]{0,2}") {
            let e = Email::field("email", hasher());
            let body = serde_json::json!({ "email": v }).to_string();
            let got = e.extract(&parts(Some("application/json")), body.as_bytes());
            let t = v.trim();
            let valid = !t.is_empty() && t.len() <= MAX_EMAIL_LEN && t.contains('@')
                && !t.chars().any(char::is_control);
            proptest::prop_assert_eq!(got.is_some(), valid, "{:?}", v);
            if valid {
                proptest::prop_assert_eq!(got, Some(hasher().email(t)));
            }
        }
    }
}
