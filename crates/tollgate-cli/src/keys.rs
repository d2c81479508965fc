//! Keys from the command line, built exactly as the tower layers build them.

use std::io::BufRead;
use std::net::IpAddr;

use tollgate_limiter::key::{DEFAULT_IPV6_PREFIX, NotAnEmail, email_shape};
use tollgate_limiter::{Key, KeyHasher};

use crate::args::{Global, OptionalKey, RequiredKey};
use crate::failure::Failure;

/// A key and how it was given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeySpec {
    /// The key as stored.
    pub(crate) key: Key,
    /// What kind of identity it was made from (`ip`, `email`, ...).
    pub(crate) kind: &'static str,
}

impl KeySpec {
    /// How the key is shown: hashed kinds show only the stored hash.
    pub(crate) fn describe(&self) -> String {
        match self.kind {
            "email" | "api-key" => format!("{} ({}, hashed)", self.key, self.kind),
            kind => format!("{} ({kind})", self.key),
        }
    }
}

/// The raw options, whichever struct they came from.
struct Raw<'a> {
    ip: Option<&'a str>,
    email: Option<&'a str>,
    api_key: Option<&'a str>,
    key: Option<&'a str>,
}

impl RequiredKey {
    /// The key (clap made sure exactly one is given).
    pub(crate) fn resolve(&self, ipv6_prefix: Option<u8>, g: &Global) -> Result<KeySpec, Failure> {
        let raw = Raw {
            ip: self.ip.as_deref(),
            email: self.email.as_deref(),
            api_key: self.api_key.as_deref(),
            key: self.key.as_deref(),
        };
        raw.resolve(ipv6_prefix, || key_hasher(g))?
            .ok_or_else(|| Failure::Input("a key is required".into()))
    }
}

impl OptionalKey {
    /// The key, if one is given.
    pub(crate) fn resolve(
        &self,
        ipv6_prefix: Option<u8>,
        g: &Global,
    ) -> Result<Option<KeySpec>, Failure> {
        Raw {
            ip: self.ip.as_deref(),
            email: self.email.as_deref(),
            api_key: self.api_key.as_deref(),
            key: self.key.as_deref(),
        }
        .resolve(ipv6_prefix, || key_hasher(g))
    }
}

/// The hasher the services use: `--unkeyed-hashes`, the secret in
/// `--key-secret-file`, else `TOLLGATE_KEY_SECRET` (as
/// `KeyHasher::from_env` reads it in the services). Only asked for when an
/// email or API key is given, so `--ip` and `--key` need no secret.
fn key_hasher(g: &Global) -> Result<KeyHasher, Failure> {
    if g.unkeyed_hashes {
        return Ok(KeyHasher::unkeyed());
    }
    let Some(path) = &g.key_secret_file else {
        return KeyHasher::from_env().map_err(|e| {
            Failure::Input(format!(
                "--email and --api-key are hashed with the services' secret: {e} \
                 (or give --key-secret-file FILE)"
            ))
        });
    };
    let bad = |why: String| Failure::Input(format!("--key-secret-file {}: {why}", path.display()));
    let mut secret = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
    // An editor's or `echo`'s trailing newline is not part of the secret.
    if secret.ends_with(b"\n") {
        secret.pop();
        if secret.ends_with(b"\r") {
            secret.pop();
        }
    }
    KeyHasher::new(&secret).map_err(|e| bad(e.to_string()))
}

impl Raw<'_> {
    fn resolve(
        &self,
        ipv6_prefix: Option<u8>,
        hasher: impl FnOnce() -> Result<KeyHasher, Failure>,
    ) -> Result<Option<KeySpec>, Failure> {
        let spec = if let Some(ip) = self.ip {
            KeySpec {
                key: ip_key(&value(ip)?, ipv6_prefix)?,
                kind: "ip",
            }
        } else if let Some(email) = self.email {
            let email = account(&value(email)?)?;
            KeySpec {
                key: hasher()?.email(email),
                kind: "email",
            }
        } else if let Some(secret) = self.api_key {
            let secret = api_key(&value(secret)?)?;
            KeySpec {
                key: hasher()?.secret(secret),
                kind: "api-key",
            }
        } else if let Some(id) = self.key {
            KeySpec {
                key: Key::new(value(id)?),
                kind: "key",
            }
        } else {
            return Ok(None);
        };
        Ok(Some(spec))
    }
}

/// `email` as the services key it: trimmed, and only if their account
/// rule accepts it ([`email_shape`]), so that a typo is an error, never
/// the key of an account no service counts.
fn account(email: &str) -> Result<String, Failure> {
    // The address itself is not echoed: it may have come from standard
    // input to stay out of the terminal.
    let why = match email_shape(email) {
        Ok(email) => return Ok(email.to_owned()),
        Err(NotAnEmail::NoAt) => "not an email address (no '@'): the services key no such account \
             (another identifier is --key)"
            .to_owned(),
        // "longer than 254 bytes", "holds a control character".
        Err(other) => format!("{other}: the services key no such account"),
    };
    Err(Failure::Input(format!("--email: {why}")))
}

/// `secret` as `ApiKey` keys it: the header value or bearer token with its
/// surrounding ASCII whitespace trimmed (a pasted key's trailing space is
/// not part of the key the services count).
fn api_key(secret: &str) -> Result<String, Failure> {
    let secret = secret.trim_ascii();
    if secret.is_empty() {
        return Err(Failure::Input("--api-key: the key is empty".into()));
    }
    Ok(secret.to_owned())
}

/// The value, or one line of standard input for `-`.
fn value(v: &str) -> Result<String, Failure> {
    if v != "-" {
        return Ok(v.to_owned());
    }
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .map_err(|e| Failure::Input(format!("reading the key from standard input: {e}")))?;
    let line = line.trim_end_matches(['\n', '\r']);
    if line.is_empty() {
        return Err(Failure::Input(
            "the key read from standard input is empty".into(),
        ));
    }
    Ok(line.to_owned())
}

/// The key `ClientIp` makes for `ip`, built by the same function
/// ([`Key::ip`]): IPv4 (and IPv4-mapped IPv6) per address, IPv6 by the
/// network of its first `len` bits, `len` being the one written as
/// `addr/len`, else `--ipv6-prefix`, else the layer's default
/// ([`DEFAULT_IPV6_PREFIX`], 64); 128 is one address.
pub(crate) fn ip_key(ip: &str, ipv6_prefix: Option<u8>) -> Result<Key, Failure> {
    let bad = |why: &str| Failure::Input(format!("--ip {ip:?}: {why}"));
    let (addr, len) = match ip.split_once('/') {
        Some((a, l)) => {
            let len: u8 = l
                .parse()
                .ok()
                .filter(|l| *l <= 128)
                .ok_or_else(|| bad("the prefix length must be 0 to 128"))?;
            (a, Some(len))
        }
        None => (ip, None),
    };
    let addr = addr.trim_start_matches('[').trim_end_matches(']');
    let addr: IpAddr = addr
        .parse()
        .map_err(|_| bad("not an IP address (e.g. 203.0.113.7, 2001:db8::1)"))?;
    let len = match (len, ipv6_prefix) {
        (Some(a), Some(b)) if a != b => {
            return Err(bad("the prefix length disagrees with --ipv6-prefix"));
        }
        (a, b) => a.or(b),
    };
    if addr.to_canonical().is_ipv4() && len.is_some() && ip.contains('/') {
        return Err(bad(
            "networks are for IPv6 only (the layers key IPv4 clients by address)",
        ));
    }
    Ok(Key::ip(addr, len.unwrap_or(DEFAULT_IPV6_PREFIX)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(ip: &str, p: Option<u8>) -> String {
        ip_key(ip, p).unwrap().as_str().to_owned()
    }

    #[test]
    fn ips_are_keyed_like_client_ip() {
        assert_eq!(k("203.0.113.7", None), "203.0.113.7");
        // IPv6 is grouped by /64 unless told otherwise, as in ClientIp.
        assert_eq!(k("2001:DB8::0001", None), "2001:db8::/64");
        assert_eq!(k("2001:DB8::0001", Some(128)), "2001:db8::1");
        assert_eq!(k("2001:db8::1/128", None), "2001:db8::1");
        assert_eq!(k("[::1]", Some(128)), "::1");
        assert_eq!(k("2001:db8:1:2:3:4:5:6", Some(64)), "2001:db8:1:2::/64");
        assert_eq!(k("2001:db8:1:2:3:4:5:6/48", None), "2001:db8:1::/48");
        assert_eq!(k("2001:db8::1", Some(0)), "::/0");
        // IPv4-mapped addresses are the IPv4 address, as in ClientIp.
        assert_eq!(k("::ffff:203.0.113.7", None), "203.0.113.7");
        assert_eq!(k("[::ffff:203.0.113.7]", Some(64)), "203.0.113.7");
        // --ipv6-prefix does not touch IPv4, as in ClientIp.
        assert_eq!(k("203.0.113.7", Some(64)), "203.0.113.7");
        assert!(ip_key("203.0.113.0/24", None).is_err());
        assert!(ip_key("::ffff:203.0.113.7/120", None).is_err());
        assert!(ip_key("2001:db8::1/129", None).is_err());
        assert!(ip_key("2001:db8::1/48", Some(64)).is_err());
        assert!(ip_key("not-an-ip", None).is_err());
    }

    /// The CLI and the layer build one key for one client: both go
    /// through `Key::ip`, and this pins the defaults together.
    #[test]
    fn cli_default_matches_client_ip_default() {
        for ip in [
            "::ffff:203.0.113.7",
            "203.0.113.7",
            "2001:db8:1:2:aaaa::1",
            "::1",
        ] {
            let addr: IpAddr = ip.parse().unwrap();
            assert_eq!(
                ip_key(ip, None).unwrap(),
                Key::ip(addr, DEFAULT_IPV6_PREFIX),
                "{ip}"
            );
        }
    }

    #[test]
    fn kinds_hash_like_the_layers() {
        let hasher = || KeyHasher::new("the services' secret");
        let keyed = || hasher().map_err(|e| Failure::Input(e.to_string()));
        let raw = Raw {
            ip: None,
            email: Some(" Alice@Example.COM "),
            api_key: None,
            key: None,
        };
        let spec = raw.resolve(None, keyed).unwrap().unwrap();
        assert_eq!(spec.key, hasher().unwrap().email("alice@example.com"));
        assert!(spec.describe().contains("hashed"));
        let raw = Raw {
            ip: None,
            email: None,
            api_key: Some("sk_live_1"),
            key: None,
        };
        assert_eq!(
            raw.resolve(None, keyed).unwrap().unwrap().key,
            hasher().unwrap().secret("sk_live_1")
        );
        let unkeyed = || Ok(KeyHasher::unkeyed());
        assert_eq!(
            raw.resolve(None, unkeyed).unwrap().unwrap().key,
            KeyHasher::unkeyed().secret("sk_live_1")
        );
        // No secret, no key: an error, never a key the services do not use.
        let missing = || Err(Failure::Input("no secret".into()));
        assert!(raw.resolve(None, missing).is_err());
        // An IP or a plain id needs no secret.
        let raw = Raw {
            ip: None,
            email: None,
            api_key: None,
            key: Some("C042"),
        };
        assert!(raw.resolve(None, missing).is_ok());
    }
}
