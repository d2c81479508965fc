//! The load tool's baseline script, `lua/minimal_gcra.lua`, is a correct
//! token bucket against a real redis-server: exact capacity, refill at the
//! emission interval, a refusal that writes nothing, and an expiry at the
//! moment the bucket is full again. Otherwise the `gcra` peer would be a
//! baseline that cheats.

use std::thread::sleep;
use std::time::Duration;

use redis::{Commands, Connection, Script};
use tollgate_testkit::redis_server::RedisServer;

const SCRIPT: &str = include_str!("../lua/minimal_gcra.lua");

/// One decision: `(1, remaining)` admitted, `(0, retry_after_us)` refused,
/// read from the script's one integer (remaining, or minus the retry-after).
fn decide(con: &mut Connection, key: &str, interval_us: u64, capacity: u64) -> (i64, i64) {
    let reply: i64 = Script::new(SCRIPT)
        .key(key)
        .arg(interval_us)
        .arg(capacity * interval_us)
        .invoke(con)
        .expect("the script runs");
    if reply >= 0 { (1, reply) } else { (0, -reply) }
}

fn connect() -> Option<(RedisServer, Connection)> {
    let server = RedisServer::start()?;
    let con = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    Some((server, con))
}

#[test]
fn admits_exactly_the_capacity_then_refuses_without_writing() {
    let Some((_server, mut con)) = connect() else {
        return;
    };
    // 5 tokens, one back an hour: no refill during the test.
    let hour = 3_600_000_000;
    for i in 0..5 {
        assert_eq!(decide(&mut con, "k", hour, 5), (1, 4 - i), "decision {i}");
    }
    let before: String = con.get("k").unwrap();
    let (verdict, retry_after) = decide(&mut con, "k", hour, 5);
    assert_eq!(verdict, 0);
    // The next token is about an hour away.
    assert!(
        (hour as i64 - 5_000_000..=hour as i64).contains(&retry_after),
        "{retry_after}"
    );
    let after: String = con.get("k").unwrap();
    assert_eq!(before, after, "a refusal writes nothing");
    // Another key is untouched.
    assert_eq!(decide(&mut con, "other", hour, 5), (1, 4));
}

#[test]
fn refills_one_token_per_interval() {
    let Some((_server, mut con)) = connect() else {
        return;
    };
    // 2 tokens, one back every 300 ms.
    let interval = 300_000;
    assert_eq!(decide(&mut con, "k", interval, 2).0, 1);
    assert_eq!(decide(&mut con, "k", interval, 2).0, 1);
    assert_eq!(decide(&mut con, "k", interval, 2).0, 0);
    sleep(Duration::from_millis(350));
    // One token back, not two.
    assert_eq!(decide(&mut con, "k", interval, 2).0, 1);
    assert_eq!(decide(&mut con, "k", interval, 2).0, 0);
}

#[test]
fn expires_when_the_bucket_is_full_again() {
    let Some((_server, mut con)) = connect() else {
        return;
    };
    let interval = 100_000; // 100 ms
    decide(&mut con, "k", interval, 3);
    decide(&mut con, "k", interval, 3);
    // Two tokens taken: full again in 200 ms, and not later.
    let ttl: i64 = con.pttl("k").unwrap();
    assert!((150..=200).contains(&ttl), "PTTL {ttl}");
    let tat: u64 = con.get::<_, String>("k").unwrap().parse().unwrap();
    assert!(
        tat > 1_600_000_000_000_000,
        "the TAT is written in µs: {tat}"
    );
    sleep(Duration::from_millis(250));
    let exists: bool = con.exists("k").unwrap();
    assert!(!exists, "the key outlived its state");
    // A fresh key again: the whole capacity.
    assert_eq!(decide(&mut con, "k", interval, 3), (1, 2));
}
