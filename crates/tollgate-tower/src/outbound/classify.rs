use std::num::IntErrorKind;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::header::{HOST, RETRY_AFTER};
use http::{HeaderMap, Request, StatusCode};
use tollgate_limiter::Key;
use tollgate_limiter::aimd::Outcome;

use crate::extract::KeyExtractor;

/// The default scope: the remote's host and port, from the request URI
/// (or, for a relative URI, the `Host` header), lower-cased. A URI's
/// port is left out when it is its scheme's default (`http:` 80, `https:`
/// 443), and so is a trailing dot: one site has one scope however a link
/// spells it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Host;

impl<B> KeyExtractor<Request<B>> for Host {
    fn extract(&self, req: &Request<B>) -> Option<Key> {
        let authority = match req.uri().authority() {
            // Without the user info: it is not part of the site, and may
            // hold a password.
            Some(a) => {
                let host = a.host().strip_suffix('.').unwrap_or(a.host());
                let default = match req.uri().scheme_str() {
                    Some("http") => Some(80),
                    Some("https") => Some(443),
                    _ => None,
                };
                match a.port_u16().filter(|&port| Some(port) != default) {
                    Some(port) => format!("{host}:{port}"),
                    None => host.to_owned(),
                }
            }
            None => req.headers().get(HOST)?.to_str().ok()?.trim().to_owned(),
        };
        (!authority.is_empty()).then(|| Key::new(authority.to_ascii_lowercase()))
    }
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

/// The `Retry-After` of a response: delay-seconds, or an HTTP-date
/// (IMF-fixdate) turned into a delay from now (zero if it has passed).
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
    let at = parse_http_date(value)?;
    Some(
        at.duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO),
    )
}

/// Parses an IMF-fixdate, `Sun, 06 Nov 1994 08:49:37 GMT`, the form
/// RFC 9110 requires senders to use.
fn parse_http_date(s: &str) -> Option<SystemTime> {
    let mut parts = s.split_ascii_whitespace();
    let _weekday = parts.next()?.strip_suffix(',')?;
    let day: u32 = parts.next()?.parse().ok()?;
    let month = match parts.next()? {
        "Jan" => 1,
        "Feb" => 2,
        "Mar" => 3,
        "Apr" => 4,
        "May" => 5,
        "Jun" => 6,
        "Jul" => 7,
        "Aug" => 8,
        "Sep" => 9,
        "Oct" => 10,
        "Nov" => 11,
        "Dec" => 12,
        _ => return None,
    };
    let year: i64 = parts.next()?.parse().ok()?;
    let mut hms = parts.next()?.split(':').map(|p| p.parse::<u64>().ok());
    let (h, m, sec) = (hms.next()??, hms.next()??, hms.next()??);
    if parts.next()? != "GMT" || parts.next().is_some() || hms.next().is_some() {
        return None;
    }
    // IMF-fixdate's year is four digits: a larger one (a hostile remote's
    // `Retry-After`) would overflow the arithmetic below and `SystemTime`.
    if !(1..=31).contains(&day) || h > 23 || m > 59 || sec > 60 || !(1970..=9999).contains(&year) {
        return None;
    }
    // Days from the civil date (H. Hinnant's algorithm).
    let (y, mo) = if month <= 2 {
        (year - 1, month + 9)
    } else {
        (year, month - 3)
    };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * mo + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = u64::try_from(era * 146_097 + doe - 719_468).ok()?;
    UNIX_EPOCH.checked_add(Duration::from_secs(days * 86_400 + h * 3600 + m * 60 + sec))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn http_dates_parse() {
        let t = parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
        assert_eq!(t.duration_since(UNIX_EPOCH).unwrap().as_secs(), 784_111_777);
        let t = parse_http_date("Tue, 29 Feb 2028 00:00:00 GMT").unwrap();
        assert_eq!(
            t.duration_since(UNIX_EPOCH).unwrap().as_secs(),
            1_835_395_200
        );
        for bad in [
            "",
            "Sun, 06 Nov 1994 08:49:37",
            "Sunday, 06-Nov-94 08:49:37 GMT",
            "Sun, 06 Foo 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 25:49:37 GMT",
        ] {
            assert_eq!(parse_http_date(bad), None, "{bad}");
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
        // A date an hour ahead is about an hour away.
        let later = SystemTime::now() + Duration::from_secs(3600);
        let secs = later.duration_since(UNIX_EPOCH).unwrap().as_secs();
        let date = format_http_date(secs);
        h.insert(RETRY_AFTER, HeaderValue::from_str(&date).unwrap());
        let wait = retry_after(&h).unwrap();
        assert!(
            wait > Duration::from_secs(3590) && wait <= Duration::from_secs(3600),
            "{date}: {wait:?}"
        );
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
            // Not an IMF-fixdate (its year has four digits): unreadable.
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

    /// The inverse of the parser, for the test only.
    fn format_http_date(secs: u64) -> String {
        let days = (secs / 86_400) as i64;
        let rem = secs % 86_400;
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z - era * 146_097;
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let d = doy - (153 * mp + 2) / 5 + 1;
        let m = if mp < 10 { mp + 3 } else { mp - 9 };
        let y = yoe + era * 400 + i64::from(m <= 2);
        const MONTHS: [&str; 12] = [
            "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
        ];
        format!(
            "Mon, {d:02} {} {y} {:02}:{:02}:{:02} GMT",
            MONTHS[(m - 1) as usize],
            rem / 3600,
            rem / 60 % 60,
            rem % 60
        )
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
}
