//! The layer, the Redis backend and the operations CLI together, as a
//! service and its operator use them: one configuration file, a real
//! redis-server, HTTP requests through `RateLimitLayer`, and the `tollgate`
//! binary inspecting, overriding and resetting what the layer counted.

use std::convert::Infallible;
use std::path::PathBuf;
use std::process::{Command, Output};

use http::{Request, Response, StatusCode};
use tollgate_limiter::{Config, Key, Limiter};
use tollgate_redis::{Durability, RedisBackend};
use tollgate_testkit::conformance::unique_name;
use tollgate_testkit::redis_server::RedisServer;
use tollgate_tower::RateLimitLayer;
use tower::{Layer, ServiceExt, service_fn};

const BIN: &str = env!("CARGO_BIN_EXE_tollgate-under-test");

/// A configuration file, removed on drop.
struct ConfigFile(PathBuf);

impl Drop for ConfigFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn config_file(prefix: &str) -> ConfigFile {
    let path = std::env::temp_dir().join(format!("{prefix}.toml"));
    // A patient per-decision timeout: the test is about what the layer and
    // the CLI count, not latency, and the default 50 ms can pass on a loaded
    // machine before Redis answers.
    std::fs::write(
        &path,
        format!(
            "[defaults]\nprefix = \"{prefix}\"\ntimeout = \"5s\"\n\
             [limiters.api]\nstrategy = \"token_bucket\"\ncapacity = 3\nrefill = \"1/h\"\n"
        ),
    )
    .unwrap();
    ConfigFile(path)
}

/// Runs the CLI with only `REDIS_URL` and a key secret in its environment.
fn cli(config: &ConfigFile, url: &str, args: &[&str]) -> (i32, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = Command::new(BIN)
        .arg("-c")
        .arg(&config.0)
        .args(args)
        .env_clear()
        .env("REDIS_URL", url)
        .env("TOLLGATE_KEY_SECRET", "an integration-test secret")
        .output()
        .expect("run the CLI");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&stdout),
        String::from_utf8_lossy(&stderr)
    );
    (status.code().unwrap_or(-1), text)
}

/// A line of `inspect`'s output.
fn field(out: &str, name: &str) -> String {
    out.lines()
        .find_map(|l| l.strip_prefix(name).filter(|v| v.starts_with(' ')))
        .map(|v| v.trim().to_owned())
        .unwrap_or_else(|| panic!("no {name:?} line in:\n{out}"))
}

async fn send(
    limiter: &Limiter<RedisBackend>,
    key: &str,
) -> Response<tollgate_tower::ResponseBody<String>> {
    let svc = RateLimitLayer::new(limiter.clone(), |req: &Request<String>| {
        Some(Key::new(req.headers().get("x-key")?.to_str().ok()?))
    })
    .layer(service_fn(|_: Request<String>| async {
        Ok::<_, Infallible>(Response::new(String::from("ok")))
    }));
    let req = Request::builder()
        .header("x-key", key)
        .body(String::new())
        .unwrap();
    svc.oneshot(req).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_inspects_overrides_and_resets_what_the_layer_counted() {
    let url = RedisServer::shared_url().expect("these tests need redis-server");
    let prefix = unique_name("it-layer-cli");
    let config = config_file(&prefix);
    let loaded = Config::builder().file(&config.0).load().unwrap();
    // What the service read of the limiter's overrides is kept this long.
    let cache_ttl = std::time::Duration::from_millis(200);
    let backend = RedisBackend::builder(&url)
        .prefix(loaded.prefix())
        .override_cache_ttl(cache_ttl)
        .durability(Durability::Skip)
        .build()
        .await
        .unwrap();
    let api = loaded.limiter("api").unwrap().build(backend);

    // The layer admits the bucket's 3, then answers 429.
    for _ in 0..3 {
        assert_eq!(send(&api, "alice").await.status(), StatusCode::OK);
    }
    let refused = send(&api, "alice").await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(refused.headers().contains_key("retry-after"));

    // The operator sees the same count, for that key only.
    let (code, out) = cli(&config, &url, &["inspect", "api", "--key", "alice"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(field(&out, "remaining"), "0", "{out}");
    let (code, out) = cli(&config, &url, &["inspect", "api", "--key", "bob"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(field(&out, "remaining"), "3", "{out}");

    // A reset unblocks the key at once, for the service too.
    let (code, out) = cli(&config, &url, &["reset", "api", "--key", "alice"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(send(&api, "alice").await.status(), StatusCode::OK);

    // A per-key override from the CLI, a bucket of 5 for bob: the
    // limiter's first, so in force on the service once its cache of the
    // limiter's overrides expires (override_cache_ttl); later per-key
    // changes on its next request.
    let (code, out) = cli(
        &config,
        &url,
        &["override", "set", "api", "--key", "bob", "--capacity", "5"],
    );
    assert_eq!(code, 0, "{out}");
    tokio::time::sleep(cache_ttl + std::time::Duration::from_millis(50)).await;
    let mut served = 0;
    for _ in 0..8 {
        served += usize::from(send(&api, "bob").await.status() == StatusCode::OK);
    }
    assert_eq!(served, 5);
    let (code, out) = cli(&config, &url, &["override", "clear", "api", "--key", "bob"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        send(&api, "bob").await.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "a clear applies on the next request: bob is back to 3, all used"
    );
}
