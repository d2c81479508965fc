//! The compact, versioned encoding of a [`Policy`] stored in Redis (runtime
//! overrides) and passed to the scripts (the configured policy).
//!
//! Version 1 is a `:`-separated list of decimal integers after a version
//! and a strategy letter:
//!
//! | strategy | encoding |
//! |---|---|
//! | token bucket | `1:t:<capacity>:<refill>:<period_us>:<interval_us>` |
//! | sliding window | `1:w:<limit>:<window_us>:<penalise 0\|1>` |
//! | progressive delay | `1:p:<free>:<base_us>:<factor>:<max_us>:<forget_us>` |
//! | calendar quota | `1:q:<limit>:<d\|w\|m>:<IANA zone>` |
//! | composite | `1:c\|<part>\|<part>…`, each part a token bucket, sliding window or calendar encoding without its `1:` |
//! | concurrency | `1:n:<max_in_flight>:<lease_us>` |
//!
//! What a script is sent (`ARGV[2]`, [`script_arg`]) is the same, except a
//! token bucket's, in version 2:
//! `2:t:<capacity>:<interval_us>:<refill>:<period_us>`. The token bucket's
//! own script is sent neither: it takes the two numbers it computes with,
//! the interval and tau ([`bucket_args`]), as its first two arguments, so
//! that a check sends nothing else, as a hand-written GCRA script is sent
//! (reading them out of an encoding cost the server ~1,500 of a decision's
//! ~41,000 instructions, `scripts/script-cost.sh`).
//! Stored overrides stay version 1, which every release's scripts and
//! [`decode`] read, so workers of two releases share them during a rolling
//! upgrade; [`decode`] reads both versions.
//!
//! The token bucket carries its interval (rounded up by the core) so the
//! script never divides; the other fields let [`decode`] rebuild the exact
//! policy. Every number the scripts compute with must stay below 2^53, the
//! range of exact integers in a Lua double: [`encode`] refuses the rest, and
//! keeps capacities and limits strictly below 2^53, so that a cost above
//! 2^53 (sent to the scripts as 2^53) is always answered as impossible.
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//! use tollgate_limiter::{Policy, TokenBucket};
//! use tollgate_redis::encoding::{decode, encode};
//!
//! let p = Policy::from(TokenBucket::new(10, 1, Duration::from_secs(1))?);
//! let enc = encode(&p)?;
//! assert_eq!(enc, "1:t:10:1:1000000:1000000");
//! assert_eq!(decode(&enc)?, p);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::time::Duration;

use tollgate_limiter::{
    Calendar, Composite, Concurrency, Period, Policy, PolicyError, ProgressiveDelay, SlidingWindow,
    TokenBucket, Zone,
};

/// The largest integer a Lua number holds exactly.
pub const MAX_EXACT: u64 = 1 << 53;

/// A policy that cannot be encoded, or a stored value that is not a policy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EncodingError {
    /// A field is too large for the scripts' exact arithmetic.
    #[error("{0} is above 2^53, beyond the exact integers of the Redis scripts")]
    OutOfRange(&'static str),
    /// A strategy this version of the encoding does not know.
    #[error("no encoding for strategy {0}")]
    UnknownStrategy(&'static str),
    /// The stored value is not a version-1 encoding.
    #[error("malformed policy encoding {0:?}")]
    Malformed(String),
    /// The stored fields do not make a valid policy.
    #[error("invalid stored policy")]
    Invalid(#[source] PolicyError),
    /// A key's stored override that the script read and refused (the
    /// script decodes a key's override itself): the script's message.
    #[error("a stored override the script refused: {0}")]
    Refused(String),
}

fn exact(field: &'static str, v: u64) -> Result<u64, EncodingError> {
    if v > MAX_EXACT {
        return Err(EncodingError::OutOfRange(field));
    }
    Ok(v)
}

/// A capacity or limit: strictly below 2^53, so that any larger cost (sent
/// as 2^53, see `op_arg`) is above it and answered as impossible; and a
/// progressive delay's free attempts, below the failure count at which
/// the script saturates (2^53, see `lua/progressive_delay.lua`).
fn bound(field: &'static str, v: u64) -> Result<u64, EncodingError> {
    if v >= MAX_EXACT {
        return Err(EncodingError::OutOfRange(field));
    }
    Ok(v)
}

fn us(d: Duration) -> u64 {
    tollgate_limiter::time::micros(d)
}

/// Encodes a policy (version 1).
pub fn encode(policy: &Policy) -> Result<String, EncodingError> {
    Ok(match policy {
        Policy::TokenBucket(p) => {
            let [capacity, refill, period, interval] = bucket_fields(p)?;
            format!("1:t:{capacity}:{refill}:{period}:{interval}")
        }
        Policy::SlidingWindow(p) => format!(
            "1:w:{}:{}:{}",
            bound("limit", p.limit())?,
            exact("window", p.window_micros())?,
            u8::from(p.penalises_refused()),
        ),
        // The factor may be any size: a product beyond the cap is capped
        // either way, exact or not.
        Policy::ProgressiveDelay(p) => format!(
            "1:p:{}:{}:{}:{}:{}",
            bound("free_attempts", p.free_attempts())?,
            exact("base_delay", p.base_delay_micros())?,
            p.factor(),
            exact("max_delay", p.max_delay_micros())?,
            exact("forget_after", p.forget_after_micros())?,
        ),
        // The zone's canonical name holds no ':' or '|' (Zone::get checks).
        Policy::Calendar(p) => format!(
            "1:q:{}:{}:{}",
            bound("limit", p.limit())?,
            p.period().letter(),
            p.zone().name(),
        ),
        Policy::Concurrency(p) => format!(
            "1:n:{}:{}",
            p.max_in_flight(),
            exact("lease", p.lease_micros())?
        ),
        Policy::Composite(c) => {
            let mut out = String::from("1:c");
            for part in c.policies() {
                out.push('|');
                // Every part encodes as "1:<letter>:…": keep what follows "1:".
                out.push_str(&encode(&part)?[2..]);
            }
            out
        }
        other => return Err(EncodingError::UnknownStrategy(other.strategy().as_str())),
    })
}

/// What a script is sent for `policy` (`ARGV[2]`): [`encode`]'s version 1,
/// except a token bucket's, in version 2 (see the [module](self) docs).
///
/// ```
/// use std::time::Duration;
/// use tollgate_limiter::{Policy, TokenBucket};
/// use tollgate_redis::encoding::{decode, script_arg};
///
/// let p = Policy::from(TokenBucket::new(10, 1, Duration::from_secs(1))?);
/// let arg = script_arg(&p)?;
/// assert_eq!(arg, "2:t:10:1000000:1:1000000");
/// assert_eq!(decode(&arg)?, p);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn script_arg(policy: &Policy) -> Result<String, EncodingError> {
    match policy {
        Policy::TokenBucket(p) => {
            let [capacity, refill, period, interval] = bucket_fields(p)?;
            Ok(format!("2:t:{capacity}:{interval}:{refill}:{period}"))
        }
        other => encode(other),
    }
}

/// What the token bucket's script is sent for `p` where the other scripts
/// take [`script_arg`]: its first two arguments, the interval and tau
/// (capacity × interval), both in µs (see `lua/token_bucket.lua`). Both
/// are at most 10 years of µs (`TokenBucket::new`), exact in a Lua number.
///
/// ```
/// use std::time::Duration;
/// use tollgate_limiter::TokenBucket;
/// use tollgate_redis::encoding::bucket_args;
///
/// // 10 tokens, one every 100 ms.
/// let p = TokenBucket::new(10, 10, Duration::from_secs(1))?;
/// assert_eq!(bucket_args(&p), [100_000, 1_000_000]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn bucket_args(p: &TokenBucket) -> [u64; 2] {
    let interval = p.interval_micros();
    [interval, p.capacity() * interval]
}

/// A token bucket's fields, checked for the scripts' exact arithmetic:
/// capacity, refill, period and interval (µs), as version 1 orders them.
fn bucket_fields(p: &TokenBucket) -> Result<[u64; 4], EncodingError> {
    Ok([
        bound("capacity", p.capacity())?,
        exact("refill", p.refill())?,
        exact("period", us(p.period()))?,
        exact("interval", p.interval_micros())?,
    ])
}

/// Decodes a stored policy, validating it as the constructors do.
pub fn decode(s: &str) -> Result<Policy, EncodingError> {
    let malformed = || EncodingError::Malformed(s.chars().take(64).collect());
    if let Some(parts) = s.strip_prefix("1:c|") {
        let parts = parts
            .split('|')
            .map(|p| match p.as_bytes().first() {
                Some(b't' | b'w' | b'q') => decode(&format!("1:{p}")),
                _ => Err(malformed()),
            })
            .collect::<Result<Vec<_>, _>>()?;
        return Ok(Composite::new(parts)
            .map_err(EncodingError::Invalid)?
            .into());
    }
    if let Some(rest) = s.strip_prefix("1:q:") {
        return match rest.split(':').collect::<Vec<_>>().as_slice() {
            [limit, period, zone] if period.len() == 1 => {
                let limit = limit.parse::<u64>().map_err(|_| malformed())?;
                let period = period
                    .chars()
                    .next()
                    .and_then(Period::from_letter)
                    .ok_or_else(malformed)?;
                let zone = Zone::get(zone).map_err(EncodingError::Invalid)?;
                Ok(Calendar::in_zone(limit, period, zone)
                    .map_err(EncodingError::Invalid)?
                    .into())
            }
            _ => Err(malformed()),
        };
    }
    let mut parts = s.split(':');
    let version = parts.next();
    if version != Some("1") && version != Some("2") {
        return Err(malformed());
    }
    let kind = parts.next().ok_or_else(malformed)?;
    let nums = parts
        .map(|p| p.parse::<u64>().map_err(|_| malformed()))
        .collect::<Result<Vec<u64>, _>>()?;
    let micros = Duration::from_micros;
    // Version 2 is a token bucket's script argument, its fields reordered.
    let nums = match (version, kind, nums.as_slice()) {
        (Some("2"), "t", &[capacity, interval, refill, period]) => {
            vec![capacity, refill, period, interval]
        }
        (Some("2"), ..) => return Err(malformed()),
        _ => nums,
    };
    let policy = match (kind, nums.as_slice()) {
        ("t", &[capacity, refill, period, interval]) => {
            let p = TokenBucket::new(capacity, refill, micros(period))
                .map_err(EncodingError::Invalid)?;
            if p.interval_micros() != interval {
                return Err(malformed());
            }
            Policy::from(p)
        }
        ("w", &[limit, window, penalise @ (0 | 1)]) => Policy::from(
            SlidingWindow::new(limit, micros(window))
                .map_err(EncodingError::Invalid)?
                .penalise_refused(penalise == 1),
        ),
        ("n", &[max, lease]) => {
            Policy::from(Concurrency::new(max, micros(lease)).map_err(EncodingError::Invalid)?)
        }
        ("p", &[free, base, factor, max, forget]) => Policy::from(
            ProgressiveDelay::new(free, micros(base), factor, micros(max), micros(forget))
                .map_err(EncodingError::Invalid)?,
        ),
        _ => return Err(malformed()),
    };
    Ok(policy)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn rejects_garbage_and_unknown_versions() {
        for s in [
            "",
            "3:t:1:1:1:1",
            "2:w:1:1:0",
            "2:t:1:1:1",
            "2:t:1:7:1:1000000",
            "1:x:1",
            "1:t:1:1",
            "1:w:1:1:2",
            "1:w:a:1:0",
            "1:t:1:1:1000000:7",
            "1:c",
            "1:c|",
            "1:c|p:1:1:1:1:1",
            "1:c|1:t:1:1:1:1",
            "1:c|w:1:1:1",
            "1:c|t:1:1:1:1|t:1:1:1:1|t:1:1:1:1|t:1:1:1:1|t:1:1:1:1",
            "1:q:5:d",
            "1:q:5:y:UTC",
            "1:q:x:d:UTC",
            "1:q:5:d:UTC:1",
            "1:c|q:5:d",
        ] {
            assert!(decode(s).is_err(), "{s}");
        }
        assert!(matches!(
            decode("1:w:0:1:0"),
            Err(EncodingError::Invalid(_))
        ));
        assert!(matches!(
            decode("1:q:5:d:Mars/Olympus"),
            Err(EncodingError::Invalid(_))
        ));
    }

    #[test]
    fn calendar_quotas_carry_their_zone() {
        let p = Policy::from(Calendar::new(10_000, Period::Month, "europe/berlin").unwrap());
        assert_eq!(encode(&p).unwrap(), "1:q:10000:m:Europe/Berlin");
        assert_eq!(decode("1:q:10000:m:Europe/Berlin").unwrap(), p);
        let c = Policy::from(
            Composite::new([
                Policy::from(TokenBucket::new(10, 10, Duration::from_secs(1)).unwrap()),
                Policy::from(
                    Calendar::new(7, Period::Week, "America/Argentina/Buenos_Aires").unwrap(),
                ),
            ])
            .unwrap(),
        );
        let enc = encode(&c).unwrap();
        assert_eq!(
            enc,
            "1:c|t:10:10:1000000:100000|q:7:w:America/Argentina/Buenos_Aires"
        );
        assert_eq!(decode(&enc).unwrap(), c);
    }

    #[test]
    fn refuses_numbers_lua_cannot_hold() {
        // No such policy is made (the core's constructors refuse a count
        // above `MAX_COUNT`), nor read back from a stored override. A limit
        // of 2^53 would let a cost above 2^53 (sent as 2^53) fit.
        assert_eq!(tollgate_limiter::policy::MAX_COUNT, MAX_EXACT - 1);
        for limit in [u64::MAX, MAX_EXACT] {
            let e = SlidingWindow::new(limit, Duration::from_secs(1)).unwrap_err();
            assert_eq!(e.field, "limit");
            assert!(matches!(
                decode(&format!("1:w:{limit}:1000000:0")),
                Err(EncodingError::Invalid(_))
            ));
        }
    }

    proptest! {
        #[test]
        fn round_trips(p in tollgate_testkit::conformance::policies()) {
            prop_assert_eq!(decode(&encode(&p).unwrap()).unwrap(), p);
            // The script's argument reads back as the same policy, and
            // differs from the stored form only for a token bucket.
            let arg = script_arg(&p).unwrap();
            prop_assert_eq!(decode(&arg).unwrap(), p);
            prop_assert_eq!(arg == encode(&p).unwrap(), !matches!(p, Policy::TokenBucket(_)));
        }
    }
}
