use std::fmt;
use std::sync::Arc;

use http::header::{CONTENT_ENCODING, CONTENT_TYPE};
use http::request::Parts;
use icu_normalizer::ComposingNormalizerBorrowed;
use icu_properties::CodePointSetData;
use icu_properties::props::DefaultIgnorableCodePoint;
use serde::Deserializer as _;
use serde::de::{IgnoredAny, MapAccess, Visitor};
use tollgate_limiter::{Key, KeyHasher};

use crate::extract::KeyExtractor;

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
/// (by `Content-Type`; without one, the body is read both ways), normalised
/// (trimmed, lower-cased) and hashed with [`KeyHasher::email`] (HMAC under
/// your secret: the backend never holds the address, and a reader of the
/// backend cannot confirm a guessed one).
///
/// A value that is not a string, is empty, longer than 254 bytes, has no
/// `@`, or is not written in its one canonical form (it holds an invisible,
/// default-ignorable character, is not in NFKC, or holds a letter such as
/// dotless `ı` or `ß` that an upper-casing comparison folds into another)
/// is no key: an application may take such a spelling for another one's
/// account, and its own counter would then be a fresh one.
///
/// Nor is a body that gives the field more than once (a JSON key or a form
/// field repeated, however it is escaped or encoded; without a
/// `Content-Type`, a field found by both readings): the handler may read
/// another of its values than this extractor would (a form read into a map
/// keeps the last one, a hand-written parser the first), and each request
/// could then name a fresh decoy to the limiter and the victim to the
/// handler. For the same reason the handler must read the body as its
/// `Content-Type` says, as axum's `Json` and `Form` do: a handler that
/// parses a form whatever the type would find a field that a JSON body
/// hides in one of its strings, where this extractor reads the JSON.
///
/// A body sent with a `Content-Encoding` (`gzip`, `br`, anything but
/// `identity`) is no key either: its `Content-Type` names the decoded
/// body, not the bytes that came, which may name another account (a gzip
/// header's comment is no part of the content). Decompress request bodies
/// outside the [`BufferBodyLayer`](crate::BufferBodyLayer), so that it
/// reads what the handler reads.
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

    /// Adds to `found` every value a JSON object gives the field (`None`
    /// for one that is not a string); nothing if `body` is not one.
    fn in_json(&self, body: &[u8], found: &mut Vec<Option<String>>) {
        let mut values = Vec::new();
        let fields = Fields {
            name: &self.field,
            values: &mut values,
        };
        let mut de = serde_json::Deserializer::from_slice(body);
        if de.deserialize_map(fields).is_ok() && de.end().is_ok() {
            found.append(&mut values);
        }
    }

    /// Adds to `found` every value a URL-encoded form gives the field.
    fn in_form(&self, body: &[u8], found: &mut Vec<Option<String>>) {
        let values = form_urlencoded::parse(body)
            .filter(|(k, _)| *k == *self.field)
            .map(|(_, v)| Some(v.into_owned()));
        found.extend(values);
    }
}

/// Whether `email` is written the one way that every usual comparison of
/// addresses agrees on, so that its key (trimmed, lower-cased) is the only
/// key of the account: no default-ignorable code point (zero-width spaces,
/// soft hyphens, joiners, which collations skip), in NFKC (no decomposed
/// accent, fullwidth or other compatibility letter, which a normalising
/// application folds), and no letter that lower-cases apart from its
/// upper case (dotless `ı`, long `ſ`, `ß`, final `ς`, which an
/// upper-casing comparison folds into ASCII or another letter). ASCII
/// always is.
///
/// Refusing, rather than folding them into one key, is safe both ways: a
/// second key for one account would be a fresh counter for a guesser, and
/// one key for two accounts would let the owner of one clear the other's
/// delay with their own successful logins.
fn is_canonical(email: &str) -> bool {
    if email.is_ascii() {
        return true;
    }
    let ignorable = CodePointSetData::new::<DefaultIgnorableCodePoint>();
    let nfkc = ComposingNormalizerBorrowed::new_nfkc();
    !email.chars().any(|c| ignorable.contains(c))
        && nfkc.is_normalized(email)
        && nfkc.normalize(&email.to_uppercase().to_lowercase())
            == nfkc.normalize(&email.to_lowercase())
}

/// Reads a JSON object, keeping every value of one field: a key given
/// twice is two values (`serde_json::Value` would keep the last).
struct Fields<'a> {
    name: &'a str,
    values: &'a mut Vec<Option<String>>,
}

impl<'de> Visitor<'de> for Fields<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<String>()? {
            if key == self.name {
                let value: serde_json::Value = map.next_value()?;
                self.values.push(value.as_str().map(str::to_owned));
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }
}

/// Whether `parts` say the body was sent with a content coding (`gzip`,
/// `br`, ...) other than `identity`: its bytes are then not the form or
/// JSON its `Content-Type` names.
fn is_encoded(parts: &Parts) -> bool {
    parts
        .headers
        .get_all(CONTENT_ENCODING)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .map(<[u8]>::trim_ascii)
        .any(|coding| !coding.is_empty() && !coding.eq_ignore_ascii_case(b"identity"))
}

impl BodyExtractor for Email {
    fn extract(&self, parts: &Parts, body: &[u8]) -> Option<Key> {
        // Encoded: see the type's docs.
        if is_encoded(parts) {
            return None;
        }
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
        let mut found = Vec::new();
        match ct.as_deref() {
            Some("application/json") => self.in_json(body, &mut found),
            Some(ct) if ct.ends_with("+json") => self.in_json(body, &mut found),
            Some("application/x-www-form-urlencoded") => self.in_form(body, &mut found),
            Some(_) => {}
            None => {
                self.in_json(body, &mut found);
                self.in_form(body, &mut found);
            }
        }
        // One string, or the body is ambiguous (see the type's docs).
        let [Some(email)] = found.as_slice() else {
            return None;
        };
        account_key(&self.hasher, email)
    }
}

/// The key of the account `email` names, hashed by `hasher`: `None` for a
/// value that is no address in its one canonical form (see [`Email`]).
/// The one rule of [`Email`] and [`LoginAttempts`](crate::login::LoginAttempts).
pub(crate) fn account_key(hasher: &KeyHasher, email: &str) -> Option<Key> {
    let email = tollgate_limiter::key::email_shape(email).ok()?;
    is_canonical(email).then(|| hasher.email(email))
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
    use tollgate_limiter::key::MAX_EMAIL_LEN;

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

    /// A field given twice, or found by both readings of a body without a
    /// `Content-Type`, has two answers: the handler may read the other one
    /// (a form read into a map keeps the last value, a hand-written parser
    /// the first), so an attacker could have a fresh decoy counted while
    /// guessing one account's password. Such a body is no key.
    #[test]
    fn a_field_given_twice_or_two_ways_is_no_key() {
        let e = Email::field("email", hasher());
        let json = parts(Some("application/json"));
        let form = parts(Some("application/x-www-form-urlencoded"));
        for body in [
            &br#"{"email":"decoy@x.io","email":"victim@x.io"}"#[..],
            br#"{"email":"victim@x.io","em\u0061il":"decoy@x.io"}"#,
            br#"{"email":"victim@x.io","email":"victim@x.io"}"#,
            br#"{"email":"victim@x.io","email":42}"#,
        ] {
            assert_eq!(
                e.extract(&json, body),
                None,
                "{}",
                String::from_utf8_lossy(body)
            );
        }
        for body in [
            &b"email=decoy%40x.io&email=victim%40x.io"[..],
            b"email=victim%40x.io&%65mail=decoy%40x.io",
            b"email=&email=victim%40x.io",
        ] {
            assert_eq!(
                e.extract(&form, body),
                None,
                "{}",
                String::from_utf8_lossy(body)
            );
        }
        // No Content-Type: a JSON body whose string holds a form field.
        let both = br#"{"email":"decoy@x.io","pad":"&email=victim%40x.io&"}"#;
        assert_eq!(e.extract(&parts(None), both), None);
        // Escapes and percent-encodings are one spelling, once.
        let want = Some(hasher().email("victim@x.io"));
        assert_eq!(
            e.extract(&json, br#"{"em\u0061il":"Victim\u0040x.io"}"#),
            want
        );
        assert_eq!(e.extract(&form, b"%65mail=victim%40x%2Eio"), want);
        assert_eq!(e.extract(&parts(None), br#"{"email":"victim@x.io"}"#), want);
    }

    /// A body sent with a `Content-Encoding` is not the form or JSON its
    /// `Content-Type` names: that is the decoded body, which a
    /// decompression layer nearer the handler would hand it. Read as it
    /// came, this gzip body's header comment (no part of the content)
    /// names a decoy, while it decodes to `email=victim%40x.io&...`: each
    /// guess at the victim could name a fresh decoy to the limiter.
    #[test]
    fn an_encoded_body_is_no_key() {
        const GZIP: &[u8] = b"\x1f\x8b\x08\x10\x00\x00\x00\x00\x00\xff&email=decoy%40x.io&\x00\
            \x4b\xcd\x4d\xcc\xcc\xb1\x2d\xcb\x4c\x2e\xc9\xcc\x55\x35\x31\xa8\xd0\xcb\xcc\
            \x57\x2b\x48\x2c\x2e\x2e\xcf\x2f\x4a\xb1\x4d\x2f\x4d\x2d\x2e\x06\x00\x2e\xd3\
            \x75\x5c\x22\x00\x00\x00";
        let e = Email::field("email", hasher());
        let encoded = |coding: &'static str| {
            let mut p = parts(Some("application/x-www-form-urlencoded"));
            p.headers.append(
                http::header::CONTENT_ENCODING,
                http::HeaderValue::from_static(coding),
            );
            p
        };
        for coding in ["gzip", "GZIP", "identity, gzip", "br"] {
            assert_eq!(e.extract(&encoded(coding), GZIP), None, "{coding}");
        }
        // `identity` is no coding: the body is read as it came.
        let form = b"email=victim%40x.io&password=guess";
        assert_eq!(
            e.extract(&encoded("identity"), form),
            Some(hasher().email("victim@x.io"))
        );
    }

    /// What a JSON body says of the field `email`, for
    /// [`one_address_is_one_key_or_none`].
    fn json_key(value: &str) -> Option<Key> {
        let body = serde_json::json!({ "email": value }).to_string();
        Email::field("email", hasher()).extract(&parts(Some("application/json")), body.as_bytes())
    }

    /// Spellings an application may take for one address (a Unicode
    /// normalisation, a collation that ignores invisible characters or
    /// compares by upper-casing) give that address's key or none: never a
    /// second key, which would be a fresh counter for the same account.
    #[test]
    fn one_address_is_one_key_or_none() {
        let canon = json_key("kiss@example.com");
        assert!(canon.is_some());
        for same in [" KISS@Example.com\t", "Kiss@EXAMPLE.COM"] {
            assert_eq!(json_key(same), canon, "{same:?}");
        }
        for twin in [
            "\u{212A}iss@example.com",        // KELVIN SIGN
            "\u{FF4B}\u{FF49}ss@example.com", // fullwidth k, i
            "ki\u{17F}s@example.com",         // LATIN SMALL LETTER LONG S
            "k\u{131}ss@example.com",         // LATIN SMALL LETTER DOTLESS I
            "ki\u{200B}ss@example.com",       // ZERO WIDTH SPACE
            "kis\u{AD}s@example.com",         // SOFT HYPHEN
            "kiss\u{FEFF}@example.com",       // ZERO WIDTH NO-BREAK SPACE
            "kiss@example\u{FF0E}com",        // FULLWIDTH FULL STOP
            "\u{1D5F8}iss@example.com",       // MATHEMATICAL SANS-SERIF SMALL K
        ] {
            let key = json_key(twin);
            assert!(key.is_none() || key == canon, "{twin:?}: {key:?}");
        }
        // A non-ASCII address has its own key, in one form only.
        let nfc = json_key("jos\u{E9}@example.com");
        assert!(nfc.is_some());
        assert_eq!(json_key("JOS\u{C9}@example.com"), nfc);
        let nfd = json_key("jose\u{301}@example.com");
        assert!(nfd.is_none() || nfd == nfc, "{nfd:?}");
        // A subaddress is another address (RFC 5233), and at most
        // services another account: it is not folded into its base.
        let tagged = json_key("kiss+tag@example.com");
        assert!(tagged.is_some() && tagged != canon);
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
                && !t.chars().any(char::is_control) && is_canonical(t);
            proptest::prop_assert_eq!(got.is_some(), valid, "{:?}", v);
            if valid {
                proptest::prop_assert_eq!(got, Some(hasher().email(t)));
            }
        }

        /// An ASCII address disguised by any mix of tricks that leave it the
        /// same address to some application (case, padding, invisible
        /// characters, compatibility and look-alike letters that fold to
        /// ASCII) has the address's key or none.
        #[test]
        fn a_disguised_address_has_its_key_or_none(
            local in "[a-z0-9.]{1,12}",
            tricks in proptest::collection::vec((0usize..64, 0usize..8), 0..6),
        ) {
            let plain = format!("{local}@example.com");
            let canon = json_key(&plain);
            proptest::prop_assert!(canon.is_some());
            let mut chars: Vec<char> = plain.chars().collect();
            for (at, trick) in tricks {
                let at = at % chars.len();
                let c = chars[at];
                match trick {
                    0 => chars[at] = c.to_ascii_uppercase(),
                    1 => chars.insert(at, '\u{200B}'),
                    2 => chars.insert(at, '\u{2060}'),
                    3 if c.is_ascii_graphic() => {
                        chars[at] = char::from_u32(u32::from(c) + 0xFEE0).unwrap_or(c);
                    }
                    4 if c == 'i' => chars[at] = '\u{131}',
                    5 if c == 's' => chars[at] = '\u{17F}',
                    6 if c == 'k' => chars[at] = '\u{212A}',
                    7 => chars.insert(at, '\u{34F}'), // COMBINING GRAPHEME JOINER
                    _ => {}
                }
            }
            let disguised: String = chars.into_iter().collect();
            let key = json_key(&disguised);
            proptest::prop_assert!(key.is_none() || key == canon, "{:?}: {:?}", disguised, key);
        }

    }
}
