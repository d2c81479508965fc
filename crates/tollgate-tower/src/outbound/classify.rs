use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::num::IntErrorKind;
use std::time::{Duration, SystemTime};

use http::header::{HOST, RETRY_AFTER};
use http::uri::Authority;
use http::{HeaderMap, Request, StatusCode};
use tollgate_limiter::Key;
use tollgate_limiter::aimd::Outcome;

use crate::extract::KeyExtractor;

/// The default scope: the remote's host and port, from the request URI
/// (or, for a relative URI, the `Host` header), lower-cased. A URI's
/// port is left out when it is its scheme's default (`http:` 80, `https:`
/// 443), and so is a trailing dot (of the `Host` header's too), and an IP
/// address is written in its one form (`127.1`, `0x7f000001` and
/// `[::ffff:127.0.0.1]` are `127.0.0.1`, as the resolver reads them): one
/// site has one scope however a link spells it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Host;

impl<B> KeyExtractor<Request<B>> for Host {
    fn extract(&self, req: &Request<B>) -> Option<Key> {
        let authority = match req.uri().authority() {
            Some(a) => {
                let default = match req.uri().scheme_str() {
                    Some("http") => Some(80),
                    Some("https") => Some(443),
                    _ => None,
                };
                site(a, default)
            }
            // Origin form: the same site in the `Host` header (no scheme,
            // so its port is kept), as it is if it does not parse.
            None => {
                let host = req.headers().get(HOST)?.to_str().ok()?.trim();
                match host.parse::<Authority>() {
                    Ok(a) => site(&a, None),
                    Err(_) => host.to_owned(),
                }
            }
        };
        (!authority.is_empty()).then(|| Key::new(authority.to_ascii_lowercase()))
    }
}

/// `host[:port]` of `a`, without a trailing dot, its user info (not part
/// of the site, and it may hold a password) and the `default` port; an IP
/// address in its one form (see [`ip_literal`]).
fn site(a: &Authority, default: Option<u16>) -> String {
    let host = a.host().strip_suffix('.').unwrap_or(a.host());
    let host = match ip_literal(host) {
        Some(IpAddr::V4(ip)) => ip.to_string(),
        Some(IpAddr::V6(ip)) => format!("[{ip}]"),
        None => host.to_owned(),
    };
    match a.port_u16().filter(|&port| Some(port) != default) {
        Some(port) => format!("{host}:{port}"),
        None => host,
    }
}

/// The address `host` names without a lookup, as the resolver reads it:
/// `[<IPv6>]` (an IPv4-mapped one is its IPv4 address), or IPv4 in any
/// form `inet_aton` takes, which `getaddrinfo` tries before DNS: one to
/// four parts, each decimal, octal (`0` first) or hex (`0x`), the last
/// filling the bytes left (`127.1`, `2130706433`, `0x7f.0.0.1`). A link
/// can spell one address all these ways, and each spelling would be a
/// scope with a rate of its own.
fn ip_literal(host: &str) -> Option<IpAddr> {
    if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        let ip: Ipv6Addr = v6.parse().ok()?;
        return Some(IpAddr::V6(ip).to_canonical());
    }
    let mut parts = [0u32; 4];
    let mut n = 0;
    for part in host.split('.') {
        *parts.get_mut(n)? = inet_part(part)?;
        n += 1;
    }
    let (last, leading) = parts[..n].split_last()?;
    // Each leading part is one byte; the last fills the rest.
    let rest_bits = 32 - 8 * leading.len() as u32;
    if leading.iter().any(|&b| b > 0xff) || u64::from(*last) >= 1u64 << rest_bits {
        return None;
    }
    let bytes = leading
        .iter()
        .enumerate()
        .fold(0u32, |v, (i, &b)| v | b << (24 - 8 * i as u32));
    Some(IpAddr::V4(Ipv4Addr::from(bytes | last)))
}

/// One part of an `inet_aton` address: decimal, octal (`0` first) or hex
/// (`0x`), within 32 bits.
fn inet_part(part: &str) -> Option<u32> {
    let (digits, radix) = match part.strip_prefix("0x").or_else(|| part.strip_prefix("0X")) {
        Some(hex) => (hex, 16),
        None if part.len() > 1 && part.starts_with('0') => (&part[1..], 8),
        None => (part, 10),
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    u32::from_str_radix(digits, radix).ok()
}

/// The default reading of a response: `429 Too Many Requests` and `503
/// Service Unavailable` are refusals (with their `Retry-After`), another
/// `5xx` says nothing about the rate, anything else is a success (a `404`
/// was served all the same).
///
/// ```
/// use std::time::Duration;
/// use http::{HeaderMap, HeaderValue, StatusCode};
/// use tollgate_limiter::aimd::Outcome;
/// use tollgate_tower::outbound::classify;
///
/// let mut headers = HeaderMap::new();
/// headers.insert("retry-after", HeaderValue::from_static("2"));
/// assert_eq!(
///     classify(StatusCode::TOO_MANY_REQUESTS, &headers),
///     Outcome::Refused { retry_after: Some(Duration::from_secs(2)) },
/// );
/// assert_eq!(classify(StatusCode::NOT_FOUND, &headers), Outcome::Success);
/// assert_eq!(classify(StatusCode::BAD_GATEWAY, &headers), Outcome::Failed);
/// ```
pub fn classify(status: StatusCode, headers: &HeaderMap) -> Outcome {
    match status {
        StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE => Outcome::Refused {
            retry_after: retry_after(headers),
        },
        s if s.is_server_error() => Outcome::Failed,
        _ => Outcome::Success,
    }
}

/// The `Retry-After` of a response: delay-seconds, or an HTTP-date turned
/// into a delay from now (zero if it has passed), in any of the three
/// forms RFC 9110 has recipients read: IMF-fixdate
/// (`Sun, 06 Nov 1994 08:49:37 GMT`), and the obsolete RFC 850
/// (`Sunday, 06-Nov-94 08:49:37 GMT`) and asctime
/// (`Sun Nov  6 08:49:37 1994`) forms; a date whose weekday is not its
/// day's is unreadable.
/// Delay-seconds too many for a `u64` read as [`Duration::MAX`] (the
/// limiter caps a hold at its `max_hold`). `None` when absent or
/// unreadable.
pub fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    match value.parse::<u64>() {
        Ok(secs) => return Some(Duration::from_secs(secs)),
        // All digits, more than any wait: the longest wait, not none.
        Err(e) if *e.kind() == IntErrorKind::PosOverflow => return Some(Duration::MAX),
        Err(_) => {}
    }
    // Years 1970 to 9999 only: a hostile remote's larger one is no date,
    // never an overflow.
    let at = httpdate::parse_http_date(value).ok()?;
    Some(
        at.duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    /// A date in the obsolete forms of RFC 9110 (5.6.7), made from
    /// its IMF-fixdate: RFC 850 and asctime.
    fn obsolete_forms(imf: &str) -> [String; 2] {
        let f: Vec<&str> = imf.split([' ', ',']).filter(|p| !p.is_empty()).collect();
        let (wday, day, mon, year, time) = (f[0], f[1], f[2], f[3], f[4]);
        let long = [
            "Monday",
            "Tuesday",
            "Wednesday",
            "Thursday",
            "Friday",
            "Saturday",
            "Sunday",
        ]
        .into_iter()
        .find(|l| l.starts_with(wday))
        .unwrap();
        let rfc850 = format!("{long}, {day}-{mon}-{} {time} GMT", &year[2..]);
        let asctime = format!(
            "{wday} {mon} {:>2} {time} {year}",
            day.trim_start_matches('0')
        );
        [rfc850, asctime]
    }

    #[test]
    fn each_http_date_form_is_read() {
        let imf = "Sun, 06 Nov 1994 08:49:37 GMT";
        let [rfc850, asctime] = obsolete_forms(imf);
        assert_eq!(rfc850, "Sunday, 06-Nov-94 08:49:37 GMT");
        assert_eq!(asctime, "Sun Nov  6 08:49:37 1994");
        // Passed: no wait, in every form.
        for date in [imf, &rfc850, &asctime] {
            let mut h = HeaderMap::new();
            h.insert(RETRY_AFTER, HeaderValue::from_str(date).unwrap());
            assert_eq!(retry_after(&h), Some(Duration::ZERO), "{date}");
        }
        // An hour ahead, in every form, is about an hour away.
        let later = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(3600));
        let [rfc850, asctime] = obsolete_forms(&later);
        for date in [&later, &rfc850, &asctime] {
            let mut h = HeaderMap::new();
            h.insert(RETRY_AFTER, HeaderValue::from_str(date).unwrap());
            let wait = retry_after(&h).unwrap_or_else(|| panic!("{date} unread"));
            assert!(
                wait > Duration::from_secs(3590) && wait <= Duration::from_secs(3600),
                "{date}: {wait:?}"
            );
        }
        for bad in [
            "Sun, 06 Nov 1994 08:49:37",
            "Sun, 06 Foo 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 25:49:37 GMT",
            // The weekday is not the date's.
            "Mon, 06 Nov 1994 08:49:37 GMT",
        ] {
            let mut h = HeaderMap::new();
            h.insert(RETRY_AFTER, HeaderValue::from_static(bad));
            assert_eq!(retry_after(&h), None, "{bad}");
        }
    }

    #[test]
    fn retry_after_reads_seconds_and_dates() {
        let mut h = HeaderMap::new();
        assert_eq!(retry_after(&h), None);
        h.insert(RETRY_AFTER, HeaderValue::from_static(" 120 "));
        assert_eq!(retry_after(&h), Some(Duration::from_secs(120)));
        h.insert(
            RETRY_AFTER,
            HeaderValue::from_static("Sun, 06 Nov 1994 08:49:37 GMT"),
        );
        assert_eq!(retry_after(&h), Some(Duration::ZERO));
        h.insert(RETRY_AFTER, HeaderValue::from_static("soon"));
        assert_eq!(retry_after(&h), None);
    }

    /// A remote controls its `Retry-After`: a date far in the future (a
    /// hostile or broken server) must be read as no date, or a very long
    /// one, never panic the caller's request future.
    #[test]
    fn absurd_http_dates_never_panic() {
        for year in [
            "300000000000",
            "9223372036854775807",
            "1000000000000000",
            "99999999999",
        ] {
            let date = format!("Sun, 06 Nov {year} 08:49:37 GMT");
            let mut h = HeaderMap::new();
            h.insert(RETRY_AFTER, HeaderValue::from_str(&date).unwrap());
            let got = std::panic::catch_unwind(|| retry_after(&h));
            assert!(got.is_ok(), "{date} panicked");
            // No HTTP-date (its year has four digits): unreadable.
            assert_eq!(got.unwrap(), None, "{date}");
        }
    }

    /// A remote that asks for more seconds than a `u64` holds (a hostile
    /// or broken server) asked for the longest wait there is: read as no
    /// `Retry-After`, its scope would not be held at all.
    #[test]
    fn an_overlong_delay_is_the_longest_wait() {
        let mut h = HeaderMap::new();
        h.insert(
            RETRY_AFTER,
            HeaderValue::from_static("184467440737095516160000"),
        );
        assert_eq!(retry_after(&h), Some(Duration::MAX));
        assert_eq!(
            classify(StatusCode::TOO_MANY_REQUESTS, &h),
            Outcome::Refused {
                retry_after: Some(Duration::MAX)
            }
        );
        // A negative one is no delay-seconds (nor a date).
        h.insert(RETRY_AFTER, HeaderValue::from_static("-5"));
        assert_eq!(retry_after(&h), None);
    }

    #[test]
    fn host_scope_is_host_and_port_without_user_info() {
        let req = Request::get("http://user:pw@Example.ORG:8080/a")
            .body(())
            .unwrap();
        assert_eq!(Host.extract(&req), Some(Key::new("example.org:8080")));
        let req = Request::get("https://example.org/a").body(()).unwrap();
        assert_eq!(Host.extract(&req), Some(Key::new("example.org")));
        let req = Request::get("/a")
            .header(HOST, "Example.org")
            .body(())
            .unwrap();
        assert_eq!(Host.extract(&req), Some(Key::new("example.org")));
        let req = Request::get("/a").body(()).unwrap();
        assert_eq!(Host.extract(&req), None);
    }

    /// A request in origin form (a relative URI, the site in its `Host`
    /// header, as a client on hyper's connection API sends it) is scoped
    /// like one with the site in its URI: a trailing dot, or a letter's
    /// case, does not make it another site with a rate of its own.
    #[test]
    fn the_host_header_names_the_site_as_a_uri_does() {
        let scope = |host: &str| {
            let req = Request::get("/a").header(HOST, host).body(()).unwrap();
            Host.extract(&req)
        };
        for host in ["example.org", "Example.ORG.", " example.org. "] {
            assert_eq!(scope(host), Some(Key::new("example.org")), "{host:?}");
        }
        for (host, key) in [
            ("example.org.:8080", "example.org:8080"),
            ("[2001:DB8::1]:8080", "[2001:db8::1]:8080"),
        ] {
            assert_eq!(scope(host), Some(Key::new(key)), "{host:?}");
        }
    }

    /// Spelled with its scheme's default port or a trailing dot, a site is
    /// still the one site: a second scope would give it a second rate (a
    /// page linking `https://site:443/` beside `https://site/` would have
    /// the crawler send the site twice what it adapted to).
    #[test]
    fn a_default_port_or_a_trailing_dot_is_the_same_site() {
        let scope = |uri: &str| Host.extract(&Request::get(uri).body(()).unwrap());
        for uri in [
            "https://example.org/",
            "https://example.org:443/a",
            "https://Example.ORG./",
            "http://example.org.:80/",
        ] {
            assert_eq!(scope(uri), Some(Key::new("example.org")), "{uri}");
        }
        // Another port is another site.
        for (uri, key) in [
            ("https://example.org:8443/", "example.org:8443"),
            ("http://example.org:443/", "example.org:443"),
        ] {
            assert_eq!(scope(uri), Some(Key::new(key)), "{uri}");
        }
    }

    /// An IP address is one site however a link spells it. The resolver
    /// behind `getaddrinfo` (glibc's and musl's `inet_aton`) reads
    /// `127.1`, `2130706433`, `0x7f.0.0.1` and `0177.0.0.1` as 127.0.0.1,
    /// and an IPv6 address has many spellings: each was a scope with a
    /// rate of its own, so a page linking one address several ways had
    /// the crawler send it that many times the rate it adapted to.
    #[test]
    fn an_ip_address_is_one_site_however_it_is_spelled() {
        let scope = |uri: &str| Host.extract(&Request::get(uri).body(()).unwrap());
        for uri in [
            "http://127.0.0.1/",
            "http://127.1/",
            "http://127.0.1:80/",
            "http://2130706433/",
            "http://0x7f.0.0.1/",
            "http://0X7F000001/",
            "http://0177.0.0.1/",
            "http://[::ffff:127.0.0.1]/",
        ] {
            assert_eq!(scope(uri), Some(Key::new("127.0.0.1")), "{uri}");
        }
        for uri in [
            "https://[2001:db8::1]:8443/",
            "https://[2001:0DB8:0:0::1]:8443/",
            "https://[2001:db8:0:0:0:0:0:1]:8443/",
        ] {
            assert_eq!(scope(uri), Some(Key::new("[2001:db8::1]:8443")), "{uri}");
        }
        let by_host = Request::get("/a").header(HOST, "0x7f.1:8080").body(());
        assert_eq!(
            Host.extract(&by_host.unwrap()),
            Some(Key::new("127.0.0.1:8080"))
        );
        // What the resolver does not read as an address is a name, kept.
        for host in [
            "127.0.0.256",
            "08.1",
            "1.2.3.4.5",
            "0x",
            "1..2",
            "example.1",
        ] {
            let uri = format!("http://{host}/");
            assert_eq!(scope(&uri), Some(Key::new(host)), "{uri}");
        }
    }
}
