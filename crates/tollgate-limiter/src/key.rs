//! Keys: who a limit is counted for.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use sha2::{Digest, Sha256};

/// The longest key kept as it is; longer ones are hashed.
pub const MAX_KEY_LEN: usize = 128;

/// The IPv6 prefix length clients are grouped by unless told otherwise:
/// one host (a home router, a cloud VM) commonly holds a whole /64, so
/// counting per address would let it rotate addresses for a fresh limit on
/// every request.
pub const DEFAULT_IPV6_PREFIX: u8 = 64;

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

/// One address, ungrouped: [`Key::ip`] with a /128 for IPv6.
impl From<IpAddr> for Key {
    fn from(ip: IpAddr) -> Self {
        Self::ip(ip, 128)
    }
}

/// `a.b.c.d` without the formatting machinery (every request keyed by an
/// IPv4 client takes this path).
fn ipv4_key(ip: Ipv4Addr) -> Key {
    let mut buf = [0u8; 15];
    let mut len = 0;
    for (i, octet) in ip.octets().into_iter().enumerate() {
        if i > 0 {
            buf[len] = b'.';
            len += 1;
        }
        let digits = [octet / 100, octet / 10 % 10, octet % 10];
        let skip = if octet >= 100 {
            0
        } else if octet >= 10 {
            1
        } else {
            2
        };
        for d in &digits[skip..] {
            buf[len] = b'0' + d;
            len += 1;
        }
    }
    // Only ASCII digits and dots were written.
    Key(std::str::from_utf8(&buf[..len]).unwrap_or_default().into())
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
        /// Every address and prefix gives a bounded key that `Key::new`
        /// keeps as it is, and no panic.
        #[test]
        fn ip_keys_never_panic(bits: u128, v4: u32, len: u8) {
            for ip in [IpAddr::V6(Ipv6Addr::from(bits)), IpAddr::V4(Ipv4Addr::from(v4))] {
                let k = Key::ip(ip, len);
                proptest::prop_assert_eq!(Key::new(k.as_str()), k);
            }
        }
    }

    #[test]
    fn composite_joins_bounded_parts() {
        assert_eq!(Key::composite(["T01", "C02"]).as_str(), "T01:C02");
        let k = Key::composite(["T01", "{evil}"]);
        assert!(k.as_str().starts_with("T01:h:"));
    }
}
