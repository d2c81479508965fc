//! Calendar quotas on a real server: the script picks the window by its
//! own clock among the bounds the client computed, asks for bounds it
//! lacks, and the key expires at the end of its window.

use std::time::Duration;

use redis::AsyncCommands;
use tollgate_limiter::{
    Calendar, Clock, Key, Limiter, MockClock, Period, Policy, Strategy, SystemClock, Timestamp,
};
use tollgate_redis::{Durability, RedisBackend, scripts};
use tollgate_testkit::conformance::{patient, unique_name};
use tollgate_testkit::redis_server::{RedisServer, Server};

const H: u64 = 3_600_000_000;

fn url(server: Server) -> String {
    RedisServer::shared_url_on(server).unwrap_or_else(|| panic!("these tests need {server}"))
}

async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// µs since the epoch of a civil time in Berlin.
fn berlin(y: i16, m: i8, d: i8, h: i8) -> Timestamp {
    let zdt = jiff::civil::date(y, m, d)
        .at(h, 0, 0, 0)
        .to_zoned_datetime(
            tollgate_limiter::Zone::get("Europe/Berlin")
                .unwrap()
                .time_zone()
                .clone(),
        )
        .unwrap();
    u64::try_from(zdt.timestamp().as_microsecond()).unwrap()
}

/// Runs lua/calendar.lua by hand: `now` is the script's clock, `bounds`
/// what the client sent.
async fn eval(
    r: &mut redis::aio::MultiplexedConnection,
    state: &str,
    now: Timestamp,
    policy: &str,
    bounds: &str,
) -> Vec<redis::Value> {
    redis::Script::new(scripts::source(Strategy::Calendar))
        .key(state)
        .key(format!("{state}:override"))
        .arg("1")
        .arg(policy)
        .arg(now)
        .arg(0)
        .arg(bounds)
        .invoke_async(r)
        .await
        .unwrap()
}

/// A limiter of one a day in UTC whose key `k` has an override of two a
/// month in Berlin, on a mock clock at 2026-02-10 12:00 in Berlin.
async fn berlin_month_override(url: &str, prefix: &str) -> (Limiter<RedisBackend>, Key, MockClock) {
    let clock = MockClock::starting_at(berlin(2026, 2, 10, 12));
    let b = RedisBackend::builder(url)
        .prefix(unique_name(prefix))
        .caller_time(clock.clone())
        .min_ttl(Duration::from_secs(600))
        .durability(Durability::Skip)
        .build()
        .await
        .unwrap();
    let l = patient("plan", Calendar::new(1, Period::Day, "UTC").unwrap(), b);
    let k = Key::new("k");
    let month = Policy::from(Calendar::new(2, Period::Month, "Europe/Berlin").unwrap());
    l.set_override(Some(&k), Some(month)).await.unwrap();
    (l, k, clock)
}

/// Rewrites `k`'s stored override (Berlin's month) as an operator would
/// by hand with redis-cli: `edit` of what is stored.
async fn rewrite_override(
    url: &str,
    l: &Limiter<RedisBackend>,
    k: &Key,
    edit: impl FnOnce(&str) -> String,
) {
    let key = format!("{}:override", l.backend().state_key(l.name(), k));
    let mut r = raw(url).await;
    let stored: String = r.get(&key).await.unwrap();
    assert!(stored.ends_with(":m:Europe/Berlin"), "{stored}");
    let () = r.set(&key, edit(&stored)).await.unwrap();
}

fn ints(v: &[redis::Value]) -> Vec<i64> {
    v.iter()
        .map(|x| match x {
            redis::Value::Int(n) => *n,
            other => panic!("{other:?}"),
        })
        .collect()
}

fn arg(c: &Calendar, around: Timestamp) -> String {
    let [a, b, c2, d] = c.bounds(around);
    format!("{},{a},{b},{c2},{d}", c.spec())
}

tollgate_testkit::on_every_server! {
    /// The client computed its bounds a millisecond before Berlin midnight;
    /// the script runs after it: it counts in the new day (the 23-hour day
    /// of the spring change), not in the one the client saw. Bounds that
    /// hold no window for the script's clock make it ask for them.
    #[tokio::test]
    async fn the_script_picks_the_window_by_its_own_clock(server: Server) {
        let url = url(server);
        let mut r = raw(&url).await;
        let state = format!("{}:cal:{{k}}", unique_name("calscript"));
        let day = Calendar::new(1, Period::Day, "Europe/Berlin").unwrap();
        let midnight = berlin(2026, 3, 29, 0);
        let sent = arg(&day, midnight - 1_000);
        let policy = "1:q:1:d:Europe/Berlin";

        let reply = ints(&eval(&mut r, &state, midnight + 5, policy, &sent).await);
        // Allowed, limit 1, 0 left, no wait, resets at the day's end, and
        // the day lasts 23 hours.
        assert_eq!(reply, [1, 1, 0, 0, 23 * H as i64 - 5, 23 * H as i64]);
        let start: String = r.hget(&state, "a").await.unwrap();
        assert_eq!(start, midnight.to_string());
        // The key expires at the end of its window (23 h after midnight,
        // rounded up to a millisecond), not a moment later.
        let pttl: i64 = r.pttl(&state).await.unwrap();
        assert!(pttl > 82_799_000 && pttl <= 82_800_000, "pttl {pttl}");
        let reply = ints(&eval(&mut r, &state, midnight + 7, policy, &sent).await);
        assert_eq!(reply[..4], [0, 1, 0, 23 * H as i64 - 7]);

        // A client three days behind: no window of its bounds holds the
        // script's time, which it answers with the spec it needs.
        let stale = arg(&day, midnight - 72 * H);
        let reply = eval(&mut r, &state, midnight + 9, policy, &stale).await;
        assert_eq!(
            reply,
            [
                redis::Value::Int(-2),
                redis::Value::BulkString((midnight + 9).to_string().into_bytes()),
                redis::Value::BulkString(b"d:Europe/Berlin".to_vec()),
            ]
        );
        // No bounds for the policy's spec at all: the same answer.
        let other = arg(&Calendar::new(1, Period::Day, "UTC").unwrap(), midnight);
        let reply = eval(&mut r, &state, midnight + 9, policy, &other).await;
        assert_eq!(reply[0], redis::Value::Int(-2));
    }
}

tollgate_testkit::on_every_server! {
    /// Server-time mode: the backend computes bounds on its own clock and
    /// the key lives until the end of the UTC day, its TTL the time to
    /// midnight.
    #[tokio::test]
    async fn server_time_counts_until_midnight(server: Server) {
        let url = url(server);
        let b = RedisBackend::builder(&url)
            .prefix(unique_name("calst"))
            .durability(Durability::Skip)
            .build()
            .await
            .unwrap();
        let day = Calendar::new(2, Period::Day, "UTC").unwrap();
        let l = patient("daily", day, b.clone());
        let k = Key::new("k");
        let before = SystemClock.now();
        let d = l.try_acquire(&k, 2).await.unwrap();
        let after = SystemClock.now();
        assert!(d.is_allowed());
        if day.window_at(before) != day.window_at(after) {
            // Midnight passed during the call: which day counted is not
            // known here (the model comparisons cover the boundary).
            return;
        }
        let (_, end) = day.window_at(after);
        let reset = u64::try_from(d.reset_after().as_micros()).unwrap();
        // The server's clock is this machine's: between the two readings.
        assert!(end - after <= reset && reset <= end - before, "{d:?}");
        let d = l.try_acquire(&k, 1).await.unwrap();
        assert!(d.is_denied());
        assert!(d.retry_after() <= Duration::from_micros(end - before));
        let pttl: i64 = raw(&url).await.pttl(b.state_key("daily", &k)).await.unwrap();
        let pttl = u64::try_from(pttl).unwrap();
        assert!(pttl <= (end - before).div_ceil(1000) && pttl + 60_000 >= (end - after) / 1000);
    }
}

tollgate_testkit::on_every_server! {
    /// An override of another zone and period than the configured one: the
    /// script asks for its bounds and the client sends them on a second
    /// call; the decision is the override's.
    #[tokio::test]
    async fn an_override_of_another_zone_is_obeyed(server: Server) {
        let (l, k, clock) = berlin_month_override(&url(server), "calovr").await;
        let d = l.try_acquire(&k, 2).await.unwrap();
        assert!(d.is_allowed());
        assert_eq!(d.window(), Duration::from_secs(28 * 86_400));
        assert_eq!(d.reset_after(), Duration::from_micros(berlin(2026, 3, 1, 0) - clock.now()));
        assert!(l.try_acquire(&k, 1).await.unwrap().is_denied());
    }
}

tollgate_testkit::on_every_server! {
    /// A per-key override written by hand (redis-cli) that spells its zone
    /// otherwise than the canonical name: the script asks for the bounds
    /// of `m:europe/berlin`, and the client answers under that spelling.
    /// It answered under the canonical one, which the script never found:
    /// every decision on the key failed ("the policy in force kept
    /// changing").
    #[tokio::test]
    async fn a_hand_written_override_in_another_spelling_is_obeyed(server: Server) {
        let url = url(server);
        let (l, k, clock) = berlin_month_override(&url, "calspell").await;
        // The operator's hand: the same policy, the zone in lower case.
        rewrite_override(&url, &l, &k, |stored| stored.replace("Europe/Berlin", "europe/berlin")).await;
        let d = l.try_acquire(&k, 2).await.unwrap();
        assert!(d.is_allowed(), "{d:?}");
        assert_eq!(d.reset_after(), Duration::from_micros(berlin(2026, 3, 1, 0) - clock.now()));
        assert!(l.try_acquire(&k, 1).await.unwrap().is_denied());
    }
}

tollgate_testkit::on_every_server! {
    /// A hand-written override whose zone ends in a space: the client reads
    /// the zone (trimmed), but bounds sent under a spec holding a space are
    /// split apart by the script (ARGV[5] is space-separated), which never
    /// finds them. The decision fails naming the spec, at once, rather than
    /// after four round trips as "the policy in force kept changing".
    #[tokio::test]
    async fn a_hand_written_zone_with_a_space_is_refused_naming_it(server: Server) {
        let url = url(server);
        let (l, k, _) = berlin_month_override(&url, "calspace").await;
        rewrite_override(&url, &l, &k, |stored| format!("{stored} ")).await;
        let e = format!("{:?}", l.try_acquire(&k, 1).await.unwrap_err());
        assert!(e.contains("m:Europe/Berlin "), "{e}");
    }
}

tollgate_testkit::on_every_server! {
    /// Server-time mode: a reservation on a calendar quota (alone, and as a
    /// part of a composite) is marked with its window's start; the settle
    /// refunds, and the settled key keeps its TTL: the end of the window.
    #[tokio::test]
    async fn a_settled_calendar_key_lives_until_its_window_ends(server: Server) {
        let url = url(server);
        let b = RedisBackend::builder(&url)
            .prefix(unique_name("calrs"))
            .durability(Durability::Skip)
            .build()
            .await
            .unwrap();
        let day = Calendar::new(1_000, Period::Day, "UTC").unwrap();
        let composite = tollgate_limiter::Composite::new([
            Policy::from(tollgate_limiter::TokenBucket::per_second(1_000, 1_000).unwrap()),
            Policy::from(day),
        ])
        .unwrap();
        for (name, policy, part) in [("plain", Policy::from(day), 0), ("both", composite.into(), 1)] {
            let l = patient(name, policy, b.clone());
            let k = Key::new("k");
            let before = SystemClock.now();
            let (v, r) = l.reserve(&k, 800).await;
            assert!(v.is_allowed(), "{name}");
            let mark = r.mark(part).expect("a calendar part is marked");
            let after = SystemClock.now();
            let (start, end) = day.window_at(after);
            assert_eq!(mark.born, start, "{name}");
            assert!(before <= mark.at && mark.at <= after, "{name}: {mark:?}");
            let d = r.settle(300).await.unwrap().unwrap();
            // (The bucket holds at least as much: it refills meanwhile.)
            assert_eq!(d.remaining(), 700, "{name}");
            let pttl: i64 = raw(&url).await.pttl(b.state_key(name, &k)).await.unwrap();
            let pttl = u64::try_from(pttl).unwrap();
            let now = SystemClock.now();
            assert!(
                pttl <= (end - before).div_ceil(1000) && pttl + 60_000 >= (end - now) / 1000,
                "{name}: {pttl} ms"
            );
        }
    }
}
