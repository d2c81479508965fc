//! Keys: who a limit is counted for, and the keyed hash that keeps
//! secrets and personal data out of the store.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// The longest key kept as it is; longer ones are hashed.
pub const MAX_KEY_LEN: usize = 128;

/// The IPv6 prefix length clients are grouped by unless told otherwise:
/// one host (a home router, a cloud VM) commonly holds a whole /64, so
/// counting per address would let it rotate addresses for a fresh limit on
/// every request.
pub const DEFAULT_IPV6_PREFIX: u8 = 64;

/// The first character of every hashed key. [`Key::new`] hashes any id
/// that starts with it, so a literal id (`Key::new("#e:…")`) can never
/// equal a hashed email or API key.
pub const HASHED_PREFIX: char = '#';

/// The identity a limit is counted for: an IP address, a hashed API key, a
/// normalised and hashed email, a channel id.
///
/// A key is bounded and safe to embed in a Redis key: parts longer than
/// [`MAX_KEY_LEN`] bytes, or holding braces (which would break the Redis
/// Cluster hash tag) or control characters, or starting with
/// [`HASHED_PREFIX`], are replaced by their SHA-256 (`#h:<hex>`). Secrets
/// and personal data go through a [`KeyHasher`] (a keyed hash) so that the
/// store never holds them in clear and a reader of the store cannot
/// confirm a guess.
///
/// # Examples
///
/// ```
/// use tollgate_limiter::{Key, KeyHasher};
///
/// assert_eq!(Key::new("203.0.113.7").as_str(), "203.0.113.7");
/// let hasher = KeyHasher::new("a secret of 16 bytes or more")?;
/// assert_eq!(hasher.email(" Alice@Example.COM "), hasher.email("alice@example.com"));
/// assert!(!hasher.secret("sk_live_123").as_str().contains("sk_live"));
/// # Ok::<(), tollgate_limiter::key::KeySecretError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(Box<str>);

impl Key {
    /// A key from a public identifier (IP, channel id). Long or unsafe
    /// values, and values starting with [`HASHED_PREFIX`], are hashed.
    pub fn new(id: impl AsRef<str>) -> Self {
        let id = id.as_ref();
        if is_plain(id) && !id.starts_with(HASHED_PREFIX) {
            Self(id.into())
        } else {
            Self::hashed("h", &Sha256::digest(id.as_bytes()))
        }
    }

    /// The key of a client address, as `ClientIp` in `tollgate-tower` and
    /// the `tollgate` CLI both build it (one function, so they cannot
    /// disagree):
    ///
    /// * an IPv4-mapped IPv6 address (`::ffff:203.0.113.7`) is the IPv4
    ///   address, so a dual-stack socket does not give IPv4 clients a
    ///   second key;
    /// * IPv4 is keyed per address (`203.0.113.7`);
    /// * IPv6 is keyed by its first `ipv6_prefix` bits, as a network
    ///   (`2001:db8:1:2::/64`); 128 (or more) keys per address
    ///   (`2001:db8::1`). See [`DEFAULT_IPV6_PREFIX`].
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate_limiter::Key;
    /// use tollgate_limiter::key::DEFAULT_IPV6_PREFIX;
    ///
    /// let ip = |s: &str| s.parse().unwrap();
    /// assert_eq!(Key::ip(ip("::ffff:203.0.113.7"), 64).as_str(), "203.0.113.7");
    /// assert_eq!(Key::ip(ip("2001:db8:1:2:aaaa::1"), DEFAULT_IPV6_PREFIX).as_str(), "2001:db8:1:2::/64");
    /// assert_eq!(Key::ip(ip("2001:db8::1"), 128).as_str(), "2001:db8::1");
    /// ```
    pub fn ip(ip: IpAddr, ipv6_prefix: u8) -> Self {
        match ip.to_canonical() {
            IpAddr::V4(v4) => ipv4_key(v4),
            IpAddr::V6(v6) if ipv6_prefix >= 128 => Self(v6.to_string().into()),
            IpAddr::V6(v6) => {
                let mask = if ipv6_prefix == 0 {
                    0
                } else {
                    u128::MAX << (128 - u32::from(ipv6_prefix))
                };
                let net = Ipv6Addr::from(u128::from(v6) & mask);
                Self(format!("{net}/{ipv6_prefix}").into())
            }
        }
    }

    /// A key made of several parts (e.g. a workspace and a channel), joined
    /// with `:`; each part is bounded like [`Key::new`], and a part holding
    /// `:` is hashed (`#p:<hash>`), so that no two lists of parts make one
    /// key (`["a:b", "c"]` is not `["a", "b:c"]`).
    pub fn composite<I, S>(parts: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let joined = parts
            .into_iter()
            .map(|p| match p.as_ref() {
                p if p.contains(':') => Self::hashed("p", &Sha256::digest(p.as_bytes())).0,
                p => Self::new(p).0,
            })
            .collect::<Vec<_>>()
            .join(":");
        // Each part is already a key: only the length can still be unsafe.
        // Parts split back one way: a kept part holds no `:` and does not
        // start with `#`, a hashed one is `#h:` or `#p:` and its digest.
        // (A joined key starting with `#` starts with such a part, so it
        // cannot be taken for a secret's hash; hashed whole, it holds a
        // `:`, which a part hashed alone as `#h:` never did.)
        if is_plain(&joined) {
            Self(joined.into())
        } else {
            Self::hashed("h", &Sha256::digest(joined.as_bytes()))
        }
    }

    /// `#<kind>:` and the first 128 bits of `digest` in hex (plenty to
    /// keep keys apart).
    fn hashed(kind: &str, digest: &[u8]) -> Self {
        let mut s = String::with_capacity(2 + kind.len() + 32);
        s.push(HASHED_PREFIX);
        s.push_str(kind);
        s.push(':');
        // Hex by table, into bytes pushed at once: `format!` per byte cost
        // more than the hash itself, and a push per char ~490 instructions
        // a key (callgrind, the API-key example).
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut hex = [0u8; 32];
        for (pair, b) in hex.chunks_exact_mut(2).zip(&digest[..16]) {
            pair[0] = HEX[usize::from(b >> 4)];
            pair[1] = HEX[usize::from(b & 15)];
        }
        // Only ASCII hex digits were written.
        s.push_str(std::str::from_utf8(&hex).unwrap_or_default());
        Self(s.into())
    }

    /// The key as stored.
    #[inline]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Short, non-empty, and free of what would break a Redis key.
fn is_plain(id: &str) -> bool {
    id.len() <= MAX_KEY_LEN
        && !id.is_empty()
        && !id.chars().any(|c| c == '{' || c == '}' || c.is_control())
}

/// The longest email address a service keys (RFC 5321's path limit).
pub const MAX_EMAIL_LEN: usize = 254;

/// Why a value is no email address a service keys ([`email_shape`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NotAnEmail {
    /// It has no `@` (or is empty).
    #[error("no '@'")]
    NoAt,
    /// It is longer than [`MAX_EMAIL_LEN`] bytes.
    #[error("longer than 254 bytes")]
    TooLong,
    /// It holds a control character.
    #[error("holds a control character")]
    Control,
}

/// `email` trimmed, if it has the shape of an address the services key
/// (an `@`, at most [`MAX_EMAIL_LEN`] bytes, no control character): the one
/// rule of `tollgate-tower`'s `Email` and `LoginAttempts` (which also
/// require the address's canonical Unicode form) and of the `tollgate`
/// CLI, so that a value one of them refuses is never counted under
/// another's key.
///
/// ```
/// use tollgate_limiter::key::{email_shape, NotAnEmail};
///
/// assert_eq!(email_shape(" bob@example.com "), Ok("bob@example.com"));
/// assert_eq!(email_shape("bob.example.com"), Err(NotAnEmail::NoAt));
/// ```
pub fn email_shape(email: &str) -> Result<&str, NotAnEmail> {
    let email = email.trim();
    if !email.contains('@') {
        Err(NotAnEmail::NoAt)
    } else if email.len() > MAX_EMAIL_LEN {
        Err(NotAnEmail::TooLong)
    } else if email.chars().any(char::is_control) {
        Err(NotAnEmail::Control)
    } else {
        Ok(email)
    }
}

/// The environment variable [`KeyHasher::from_env`] reads.
pub const KEY_SECRET_ENV: &str = "TOLLGATE_KEY_SECRET";

/// The shortest secret [`KeyHasher::new`] accepts, in bytes: a shorter one
/// could be found by trying, and would then confirm guesses again.
pub const MIN_SECRET_LEN: usize = 16;

/// Hashes secrets (API keys, tokens) and personal data (emails) into keys
/// with HMAC-SHA256 under a secret from configuration, so that the store
/// never holds them in clear and a reader of the store (a Redis replica,
/// a backup, `MONITOR`) cannot confirm a guessed email or key by hashing
/// it: without the secret, the hashes say nothing.
///
/// Every worker sharing a store must use the same secret, or each counts
/// the same client under its own key. Load it from a secret store into
/// [`KEY_SECRET_ENV`] (`TOLLGATE_KEY_SECRET`) and build with
/// [`from_env`](Self::from_env), which fails at start-up if it is missing
/// or shorter than [`MIN_SECRET_LEN`] bytes. [`unkeyed`](Self::unkeyed) is
/// the explicit opt-out (plain SHA-256: anyone who can read the store can
/// confirm a guess).
///
/// **Rotation.** Changing the secret changes every hashed key: each email
/// and API key starts with a fresh limit (its old counter expires with its
/// TTL; nothing is migrated). Roll it on all workers together; while old
/// and new workers overlap, a client may be counted under both keys, so up
/// to twice its limit passes during the roll-out. Rotate when the secret
/// may have leaked, not on a schedule: a fresh limit for everyone is the
/// cost. The `tollgate` CLI needs the same secret to find these keys.
///
/// Cheap to clone (the keyed state is shared). `Debug` never shows the
/// secret.
///
/// # Examples
///
/// ```
/// use tollgate_limiter::KeyHasher;
///
/// let a = KeyHasher::new("correct horse battery staple")?;
/// let b = KeyHasher::new("correct horse battery staple")?;
/// // Same secret, same key, on every worker.
/// assert_eq!(a.email("bob@example.com"), b.email("Bob@Example.com "));
/// // Another secret, another key.
/// let c = KeyHasher::new("another secret, as long or more")?;
/// assert_ne!(a.email("bob@example.com"), c.email("bob@example.com"));
/// assert!(!format!("{a:?}").contains("horse"));
/// # Ok::<(), tollgate_limiter::key::KeySecretError>(())
/// ```
#[derive(Clone)]
pub struct KeyHasher {
    /// The HMAC already keyed (cloned per hash, so the key schedule is
    /// computed once); `None` for the unkeyed opt-out.
    mac: Option<Arc<Hmac<Sha256>>>,
}

impl KeyHasher {
    /// Hashes with HMAC-SHA256 under `secret` (at least
    /// [`MIN_SECRET_LEN`] bytes, used as given: no trimming).
    pub fn new(secret: impl AsRef<[u8]>) -> Result<Self, KeySecretError> {
        let secret = secret.as_ref();
        if secret.len() < MIN_SECRET_LEN {
            return Err(KeySecretError::TooShort {
                len: secret.len(),
                min: MIN_SECRET_LEN,
            });
        }
        // HMAC takes a key of any length: this cannot fail.
        let mac = <Hmac<Sha256> as Mac>::new_from_slice(secret).map_err(|_| {
            KeySecretError::TooShort {
                len: secret.len(),
                min: MIN_SECRET_LEN,
            }
        })?;
        Ok(Self {
            mac: Some(Arc::new(mac)),
        })
    }

    /// The secret from the environment variable [`KEY_SECRET_ENV`]
    /// (`TOLLGATE_KEY_SECRET`): an error if it is unset, empty, not
    /// Unicode or too short, so a service without its secret does not
    /// start.
    pub fn from_env() -> Result<Self, KeySecretError> {
        match std::env::var_os(KEY_SECRET_ENV) {
            None => Err(KeySecretError::Missing),
            Some(v) if v.is_empty() => Err(KeySecretError::Missing),
            Some(v) => Self::new(v.to_str().ok_or(KeySecretError::NotUnicode)?),
        }
    }

    /// The opt-out: plain SHA-256, no secret. The store still never holds
    /// the values in clear, but anyone who can read it can confirm a
    /// guessed email or key by hashing it. Its keys (`#ue:`, `#us:`) are
    /// distinct from keyed ones, so switching either way starts every
    /// hashed key fresh.
    pub fn unkeyed() -> Self {
        Self { mac: None }
    }

    /// Whether a secret is in use.
    pub fn is_keyed(&self) -> bool {
        self.mac.is_some()
    }

    /// The key of a secret (an API key, a token): `#s:<hash>`.
    pub fn secret(&self, secret: impl AsRef<[u8]>) -> Key {
        self.hash("s", secret.as_ref())
    }

    /// The key of an email address, trimmed and lower-cased first so that
    /// `Alice@Example.com ` and `alice@example.com` count together:
    /// `#e:<hash>`.
    pub fn email(&self, email: impl AsRef<str>) -> Key {
        let normalised = email.as_ref().trim().to_lowercase();
        self.hash("e", normalised.as_bytes())
    }

    fn hash(&self, kind: &'static str, bytes: &[u8]) -> Key {
        match &self.mac {
            Some(mac) => {
                let mut mac = Hmac::clone(mac);
                // The kind is hashed too: an email and an API key with the
                // same text are different keys even before the prefix.
                mac.update(kind.as_bytes());
                mac.update(b":");
                mac.update(bytes);
                Key::hashed(kind, &mac.finalize().into_bytes())
            }
            None => {
                let unkeyed = if kind == "s" { "us" } else { "ue" };
                Key::hashed(unkeyed, &Sha256::digest(bytes))
            }
        }
    }
}

impl fmt::Debug for KeyHasher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secret = if self.is_keyed() {
            "<redacted>"
        } else {
            "<none: unkeyed>"
        };
        f.debug_struct("KeyHasher")
            .field("secret", &secret)
            .finish()
    }
}

/// Why a [`KeyHasher`] could not be built. The message never holds the
/// secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeySecretError {
    /// No secret in the environment.
    #[error(
        "no key secret: set {KEY_SECRET_ENV} (at least {MIN_SECRET_LEN} bytes, the same on \
         every worker) to hash emails and API keys, or opt out explicitly with \
         KeyHasher::unkeyed()"
    )]
    Missing,
    /// The secret is too short to resist guessing.
    #[error("the key secret is {len} bytes; at least {min} are needed")]
    TooShort {
        /// Its length.
        len: usize,
        /// The least accepted.
        min: usize,
    },
    /// The environment variable is not valid Unicode.
    #[error("{KEY_SECRET_ENV} is not valid Unicode")]
    NotUnicode,
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({:?})", &*self.0)
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for Key {
    fn from(s: &str) -> Self {
        Self::new(s)
    }
}

impl From<String> for Key {
    fn from(s: String) -> Self {
        Self::new(s)
    }
}

/// One address, ungrouped: [`Key::ip`] with a /128 for IPv6.
impl From<IpAddr> for Key {
    fn from(ip: IpAddr) -> Self {
        Self::ip(ip, 128)
    }
}

/// `a.b.c.d` without the formatting machinery (every request keyed by an
/// IPv4 client takes this path).
fn ipv4_key(ip: Ipv4Addr) -> Key {
    // Each octet's digits from a table, 3 bytes written at once (the
    // buffer has room past the end), then the length advanced by the
    // digit count: 94 instructions an address (the UTF-8 check and the
    // allocation aside) where dividing each octet and pushing its digits
    // one by one took 312 (callgrind, scripts/http-instructions.sh), on
    // every request of a per-IP limit.
    let mut buf = [0u8; 20];
    let mut len = 0;
    for (i, octet) in ip.octets().into_iter().enumerate() {
        let [a, b, c, n] = OCTETS[usize::from(octet)];
        buf[len..len + 3].copy_from_slice(&[a, b, c]);
        len += usize::from(n);
        // The dot after the digits, kept except after the last octet.
        if i < 3 {
            buf[len] = b'.';
            len += 1;
        }
    }
    // Only ASCII digits and dots were written.
    Key(std::str::from_utf8(&buf[..len]).unwrap_or_default().into())
}

/// Each octet's decimal digits (up to 3, then padding) and their count.
const OCTETS: [[u8; 4]; 256] = {
    let mut table = [[0u8; 4]; 256];
    let mut i = 0;
    while i < 256 {
        // `i < 256`: the casts are exact.
        let v = i as u8;
        table[i] = if v >= 100 {
            [b'0' + v / 100, b'0' + v / 10 % 10, b'0' + v % 10, 3]
        } else if v >= 10 {
            [b'0' + v / 10, b'0' + v % 10, 0, 2]
        } else {
            [b'0' + v, 0, 0, 1]
        };
        i += 1;
    }
    table
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_and_unsafe_keys_are_hashed() {
        let long = "x".repeat(MAX_KEY_LEN + 1);
        let k = Key::new(&long);
        assert!(k.as_str().starts_with("#h:"));
        assert_eq!(k.as_str().len(), 35);
        assert!(Key::new("a{b}").as_str().starts_with("#h:"));
        assert!(Key::new("").as_str().starts_with("#h:"));
        assert!(Key::new("a\nb").as_str().starts_with("#h:"));
        assert!(Key::new("#general").as_str().starts_with("#h:"));
        assert_eq!(
            Key::new("x".repeat(MAX_KEY_LEN)).as_str().len(),
            MAX_KEY_LEN
        );
    }

    fn hasher(secret: &str) -> KeyHasher {
        KeyHasher::new(secret).unwrap()
    }

    #[test]
    fn hashing_is_stable_and_kind_separated() {
        let h = hasher("0123456789abcdef");
        assert_eq!(h.secret("abc"), h.secret("abc"));
        assert_ne!(h.secret("abc"), h.email("abc"));
        assert_ne!(h.secret("abc"), h.secret("abd"));
        assert!(h.secret("abc").as_str().starts_with("#s:"));
        assert!(h.email("a@b").as_str().starts_with("#e:"));
        assert_eq!(h.email("a@b").as_str().len(), 35);
    }

    /// The stored form of hashed keys, pinned (values from Python's
    /// hashlib and hmac): a change would give every hashed key a fresh
    /// quota at the next deploy.
    #[test]
    fn hashed_keys_keep_their_stored_form() {
        assert_eq!(
            Key::new("a{b}").as_str(),
            "#h:b8a4b706093b9c712e002b1b283c0486"
        );
        let h = hasher("0123456789abcdef0123456789abcdef");
        assert_eq!(
            h.secret("sk_live_1").as_str(),
            "#s:8b978688d6a91b80129603e4fed933e3"
        );
        assert_eq!(
            h.email(" Alice@Example.com").as_str(),
            "#e:9071db8bb34d05e4cd4e739c3839fd72"
        );
    }

    /// Two workers (two hashers) with one secret agree; another secret
    /// gives other keys, and so does the unkeyed opt-out.
    #[test]
    fn same_secret_same_key_other_secret_other_key() {
        let a = hasher("shared secret of the fleet");
        let b = hasher("shared secret of the fleet");
        let c = hasher("shared secret of the fleeT");
        let u = KeyHasher::unkeyed();
        for v in ["alice@example.com", "sk_live_1", ""] {
            assert_eq!(a.email(v), b.email(v));
            assert_eq!(a.secret(v), b.secret(v));
            assert_ne!(a.email(v), c.email(v));
            assert_ne!(a.secret(v), c.secret(v));
            assert_ne!(a.email(v), u.email(v));
            assert_ne!(a.secret(v), u.secret(v));
        }
        // The unkeyed form is plain SHA-256: anyone can recompute it.
        let sha = Sha256::digest(b"alice@example.com");
        let hex: String = sha[..16].iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(u.email("alice@example.com").as_str(), format!("#ue:{hex}"));
        // The keyed one is not that.
        assert!(!a.email("alice@example.com").as_str().contains(&hex));
    }

    /// A literal key can never be taken for a hashed one.
    #[test]
    fn literal_keys_never_collide_with_hashed_ones() {
        let h = hasher("0123456789abcdef");
        for hashed in [
            h.email("alice@example.com"),
            h.secret("sk"),
            KeyHasher::unkeyed().email("alice@example.com"),
            Key::new("x".repeat(500)),
        ] {
            let literal = Key::new(hashed.as_str());
            assert_ne!(literal, hashed);
            assert!(literal.as_str().starts_with("#h:"));
            assert_ne!(Key::composite([hashed.as_str()]), hashed);
        }
        // The old, un-prefixed form is a plain id now.
        assert_eq!(Key::new("e:0123").as_str(), "e:0123");
    }

    /// The secret lives beside the `TOLLGATE_*` configuration variables
    /// without being taken for an unknown field, and `from_env` reads it.
    // figment's `Jail` takes a closure returning its (large) error type.
    #[allow(clippy::result_large_err)]
    #[test]
    fn the_secret_comes_from_the_environment() {
        figment::Jail::expect_with(|jail| {
            jail.clear_env();
            assert_eq!(KeyHasher::from_env().unwrap_err(), KeySecretError::Missing);
            jail.set_env(KEY_SECRET_ENV, "short");
            assert!(matches!(
                KeyHasher::from_env(),
                Err(KeySecretError::TooShort { .. })
            ));
            jail.set_env(KEY_SECRET_ENV, "the fleet's secret, 16+ bytes");
            let h = KeyHasher::from_env().unwrap();
            assert_eq!(
                h.email("a@b"),
                hasher("the fleet's secret, 16+ bytes").email("a@b")
            );
            crate::Config::builder()
                .toml_str(
                    "[limiters.api]\nstrategy = \"token_bucket\"\ncapacity = 1\nrefill = \"1/s\"\n",
                )
                .env()
                .load()
                .map_err(|e| e.to_string())?;
            Ok(())
        });
    }

    #[test]
    fn secrets_are_checked_and_never_shown() {
        assert_eq!(
            KeyHasher::new("short").unwrap_err(),
            KeySecretError::TooShort { len: 5, min: 16 }
        );
        let h = hasher("do not print this secret");
        let shown = format!("{h:?}");
        assert!(!shown.contains("print"), "{shown}");
        assert!(shown.contains("redacted"));
        assert!(h.is_keyed() && !KeyHasher::unkeyed().is_keyed());
        let missing = KeySecretError::Missing.to_string();
        assert!(missing.contains(KEY_SECRET_ENV), "{missing}");
    }

    #[test]
    fn ip_keys() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        for v4 in [
            "0.0.0.0",
            "1.2.3.4",
            "10.20.30.40",
            "100.200.255.9",
            "255.255.255.255",
            "192.0.2.100",
        ] {
            assert_eq!(Key::ip(ip(v4), 64).as_str(), v4);
            assert_eq!(Key::ip(ip(&format!("::ffff:{v4}")), 64).as_str(), v4);
            assert_eq!(Key::from(ip(&format!("::ffff:{v4}"))).as_str(), v4);
        }
        // Every octet, in every position.
        for o in 0..=255u8 {
            for at in 0..4 {
                let mut octets = [7, 42, 199, 0];
                octets[at] = o;
                let v4 = Ipv4Addr::from(octets);
                assert_eq!(Key::ip(IpAddr::V4(v4), 64).as_str(), v4.to_string());
            }
        }
        let v6 = ip("2001:db8:1:2:aaaa::1");
        assert_eq!(Key::ip(v6, 64).as_str(), "2001:db8:1:2::/64");
        assert_eq!(Key::ip(v6, 64), Key::ip(ip("2001:db8:1:2:bbbb::2"), 64));
        assert_eq!(Key::ip(v6, 48).as_str(), "2001:db8:1::/48");
        assert_eq!(Key::ip(v6, 0).as_str(), "::/0");
        assert_eq!(Key::ip(v6, 128).as_str(), "2001:db8:1:2:aaaa::1");
        assert_eq!(Key::ip(v6, 200), Key::ip(v6, 128));
        assert_eq!(Key::from(v6), Key::ip(v6, 128));
    }

    proptest::proptest! {
        /// Any input to any constructor: no panic, a bounded key, and a
        /// literal never equal to a hashed key.
        #[test]
        fn hashing_never_panics(
            v in proptest::prelude::any::<String>(),
            secret in proptest::collection::vec(proptest::num::u8::ANY, 0..40),
        ) {
            let h = KeyHasher::new(&secret).unwrap_or_else(|_| KeyHasher::unkeyed());
            for k in [h.email(&v), h.secret(&v), Key::new(&v), Key::composite([&v, &v])] {
                proptest::prop_assert!(!k.as_str().is_empty() && k.as_str().len() <= MAX_KEY_LEN);
            }
            let hashed = h.email(&v);
            proptest::prop_assert_ne!(&Key::new(&v), &hashed);
            proptest::prop_assert_ne!(Key::new(hashed.as_str()), hashed);
        }

        /// Every address and prefix gives a bounded key that `Key::new`
        /// keeps as it is, and no panic.
        #[test]
        fn ip_keys_never_panic(bits: u128, v4: u32, len: u8) {
            for ip in [IpAddr::V6(Ipv6Addr::from(bits)), IpAddr::V4(Ipv4Addr::from(v4))] {
                let k = Key::ip(ip, len);
                proptest::prop_assert_eq!(Key::new(k.as_str()), k);
            }
        }

        /// An IPv4 key is the address as `Display` writes it.
        #[test]
        fn ipv4_keys_are_the_dotted_address(v4: u32) {
            let ip = Ipv4Addr::from(v4);
            let k = Key::ip(IpAddr::V4(ip), 64);
            proptest::prop_assert_eq!(k.as_str(), ip.to_string());
        }
    }

    /// No two lists of parts make one key: a part holding the separator
    /// moved a boundary (`["a:b", "c"]` and `["a", "b:c"]` were both
    /// `a:b:c`, one counter for two clients, and `["a:b"]` was `["a",
    /// "b"]`), long ones included.
    #[test]
    fn composite_parts_never_run_into_each_other() {
        let long = "x".repeat(100);
        let long_pair = format!("{long}:{long}");
        let lists: [&[&str]; 9] = [
            &["a:b", "c"],
            &["a", "b:c"],
            &["a", "b", "c"],
            &["a:b:c"],
            &["a:b"],
            &["a", "b"],
            &[&long, &long],
            &[&long_pair],
            &["2001:db8::/64", "general"],
        ];
        for (i, a) in lists.iter().enumerate() {
            for b in &lists[i + 1..] {
                assert_ne!(Key::composite(*a), Key::composite(*b), "{a:?} and {b:?}");
            }
        }
        // Parts without the separator keep their form.
        assert_eq!(Key::composite(["a", "b"]).as_str(), "a:b");
    }

    #[test]
    fn composite_joins_bounded_parts() {
        assert_eq!(Key::composite(["T01", "C02"]).as_str(), "T01:C02");
        let k = Key::composite(["T01", "{evil}"]);
        assert!(k.as_str().starts_with("T01:#h:"));
    }
}
