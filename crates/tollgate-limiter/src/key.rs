//! Keys: who a limit is counted for.

use std::fmt;

use sha2::{Digest, Sha256};

/// The longest key kept as it is; longer ones are hashed.
pub const MAX_KEY_LEN: usize = 128;

/// The identity a limit is counted for: an IP address, a hashed API key, a
/// normalised and hashed email, a channel id.
///
/// A key is bounded and safe to embed in a Redis key: parts longer than
/// [`MAX_KEY_LEN`] bytes, or holding braces (which would break the Redis
/// Cluster hash tag) or control characters, are replaced by their SHA-256.
/// Secrets and personal data go through [`Key::secret`] / [`Key::email`] so
/// that the storage never holds them in clear.
///
/// # Examples
///
/// ```
/// use tollgate_limiter::Key;
///
/// assert_eq!(Key::new("203.0.113.7").as_str(), "203.0.113.7");
/// assert_eq!(Key::email(" Alice@Example.COM "), Key::email("alice@example.com"));
/// assert!(!Key::secret("sk_live_123").as_str().contains("sk_live"));
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(Box<str>);

impl Key {
    /// A key from a public identifier (IP, channel id). Long or unsafe
    /// values are hashed.
    pub fn new(id: impl AsRef<str>) -> Self {
        let id = id.as_ref();
        let safe = id.len() <= MAX_KEY_LEN
            && !id.is_empty()
            && !id.chars().any(|c| c == '{' || c == '}' || c.is_control());
        if safe {
            Self(id.into())
        } else {
            Self::hashed("h", id.as_bytes())
        }
    }

    /// A key from a secret (an API key, a token): stored only as a hash.
    pub fn secret(secret: impl AsRef<[u8]>) -> Self {
        Self::hashed("s", secret.as_ref())
    }

    /// A key from an email address: trimmed, lower-cased, then hashed, so
    /// `Alice@Example.com ` and `alice@example.com` count together and Redis
    /// never holds the address.
    pub fn email(email: impl AsRef<str>) -> Self {
        let normalised = email.as_ref().trim().to_lowercase();
        Self::hashed("e", normalised.as_bytes())
    }

    /// A key made of several parts (e.g. a workspace and a channel), joined
    /// with `:`; each part is bounded like [`Key::new`].
    pub fn composite<I, S>(parts: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let joined = parts
            .into_iter()
            .map(|p| Self::new(p).0)
            .collect::<Vec<_>>()
            .join(":");
        Self::new(joined)
    }

    fn hashed(kind: &str, bytes: &[u8]) -> Self {
        let digest = Sha256::digest(bytes);
        let mut s = String::with_capacity(2 + 32);
        s.push_str(kind);
        s.push(':');
        // 128 bits of the digest are plenty to keep keys apart.
        // Hex by table: `format!` per byte cost more than the hash itself.
        const HEX: &[u8; 16] = b"0123456789abcdef";
        for b in &digest[..16] {
            s.push(char::from(HEX[usize::from(b >> 4)]));
            s.push(char::from(HEX[usize::from(b & 15)]));
        }
        Self(s.into())
    }

    /// The key as stored.
    pub fn as_str(&self) -> &str {
        &self.0
    }
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

impl From<std::net::IpAddr> for Key {
    fn from(ip: std::net::IpAddr) -> Self {
        Self::new(ip.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_and_unsafe_keys_are_hashed() {
        let long = "x".repeat(MAX_KEY_LEN + 1);
        let k = Key::new(&long);
        assert!(k.as_str().starts_with("h:"));
        assert_eq!(k.as_str().len(), 34);
        assert!(Key::new("a{b}").as_str().starts_with("h:"));
        assert!(Key::new("").as_str().starts_with("h:"));
        assert!(Key::new("a\nb").as_str().starts_with("h:"));
        assert_eq!(
            Key::new("x".repeat(MAX_KEY_LEN)).as_str().len(),
            MAX_KEY_LEN
        );
    }

    #[test]
    fn hashing_is_stable_and_kind_separated() {
        assert_eq!(Key::secret("abc"), Key::secret("abc"));
        assert_ne!(Key::secret("abc"), Key::email("abc"));
        assert_ne!(Key::secret("abc"), Key::secret("abd"));
    }

    #[test]
    fn composite_joins_bounded_parts() {
        assert_eq!(Key::composite(["T01", "C02"]).as_str(), "T01:C02");
        let k = Key::composite(["T01", "{evil}"]);
        assert!(k.as_str().starts_with("T01:h:"));
    }
}
