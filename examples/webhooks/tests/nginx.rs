//! The nginx outer line of `docs/nginx.md`, run for real: a `nginx` child
//! process (its own prefix, pid and temp paths in a temporary directory,
//! `daemon off`, on free loopback ports) in front of the webhooks example.
//! A storm is cut by nginx before the application sees it; what nginx lets
//! through meets the application's own, finer limit.
//!
//! Under `CI=true` a missing `nginx` fails the test; elsewhere it is
//! skipped, loudly.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::extract::Request;
use axum::middleware::{self, Next};
use axum::routing::post;
use http::StatusCode;
use tollgate_memory::MemoryBackend;
use webhooks::{Reply, Sender, slack_message};

/// The `nginx` binary, if installed (`/usr/sbin` is often not on a user's
/// PATH).
fn nginx_binary() -> Option<String> {
    let found = ["nginx", "/usr/sbin/nginx"].into_iter().find(|bin| {
        Command::new(bin)
            .arg("-v")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    if found.is_none() {
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!(
                "nginx not found, and CI=true: the nginx test must run in CI (apt-get install -y nginx-light)"
            );
        }
        eprintln!(
            "\n*** SKIPPING the nginx test: nginx not found (apt-get install -y nginx-light) ***\n"
        );
    }
    found.map(str::to_owned)
}

/// The first ```nginx block of docs/nginx.md.
fn documented_config() -> String {
    let doc = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/nginx.md");
    let doc = std::fs::read_to_string(&doc).expect("docs/nginx.md");
    let start = doc.find("```nginx\n").expect("an nginx block") + "```nginx\n".len();
    let len = doc[start..].find("```").expect("the block's end");
    doc[start..start + len].to_owned()
}

/// A running nginx, stopped on drop. It runs under a small `sh` guard that
/// stops it when its stdin closes, so it cannot outlive the test binary
/// even if the test is killed.
struct Nginx {
    guard: Child,
    stdin: Option<ChildStdin>,
    _dir: tempfile::TempDir,
}

impl Nginx {
    fn start(bin: &str, server_block: &str, port: u16) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().display().to_string();
        for sub in ["client_body", "proxy", "fastcgi", "uwsgi", "scgi", "logs"] {
            std::fs::create_dir_all(dir.path().join(sub)).unwrap();
        }
        let conf = format!(
            "daemon off;\n\
             master_process off;\n\
             pid {p}/nginx.pid;\n\
             error_log {p}/logs/error.log warn;\n\
             events {{ worker_connections 512; }}\n\
             http {{\n\
             access_log off;\n\
             client_body_temp_path {p}/client_body;\n\
             proxy_temp_path {p}/proxy;\n\
             fastcgi_temp_path {p}/fastcgi;\n\
             uwsgi_temp_path {p}/uwsgi;\n\
             scgi_temp_path {p}/scgi;\n\
             {server_block}\n\
             }}\n"
        );
        let conf_path = dir.path().join("nginx.conf");
        std::fs::write(&conf_path, conf).unwrap();
        // The guard starts nginx, waits for its stdin to close, stops it.
        let script = format!(
            "{bin} -p {p}/ -e {p}/logs/error.log -c {} & pid=$!; cat >/dev/null; kill $pid; wait $pid",
            conf_path.display()
        );
        let mut guard = Command::new("sh")
            .arg("-c")
            .arg(script)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdin = guard.stdin.take();
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = guard.try_wait() {
                let log =
                    std::fs::read_to_string(dir.path().join("logs/error.log")).unwrap_or_default();
                panic!("nginx exited ({status}): {log}");
            }
            assert!(Instant::now() < deadline, "nginx did not start listening");
            std::thread::sleep(Duration::from_millis(20));
        }
        Self {
            guard,
            stdin,
            _dir: dir,
        }
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // Closing the guard's stdin stops nginx; then reap the guard.
        drop(self.stdin.take().map(|mut s| s.flush()));
        let _ = self.guard.wait();
    }
}

/// The `rate` (per second) and `burst` the documented block gives `zone`.
fn documented_rate_and_burst(block: &str, zone: &str) -> (f64, u64) {
    let rate = block
        .split(&format!("zone={zone}:10m rate="))
        .nth(1)
        .and_then(|r| r.split("r/s").next())
        .and_then(|r| r.parse().ok())
        .expect("rate");
    let burst = block
        .split(&format!("limit_req zone={zone} burst="))
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|r| r.parse().ok())
        .expect("burst");
    (rate, burst)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_cuts_the_storm_before_the_app_sees_it() {
    let Some(bin) = nginx_binary() else { return };

    // The app, counting every request that reaches it.
    let reached = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&reached);
    let config = webhooks::limits().unwrap();
    let router = webhooks::app(
        &config,
        MemoryBackend::new(),
        vec!["127.0.0.1/32".parse().unwrap()],
    )
    .unwrap()
    // A stand-in for the login route, for the documented /login zone.
    .route("/login", post(|| async { StatusCode::UNAUTHORIZED }))
    .layer(middleware::from_fn(move |req: Request, next: Next| {
        counter.fetch_add(1, Ordering::SeqCst);
        next.run(req)
    }));
    let app_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let app_addr = app_listener.local_addr().unwrap();
    tokio::spawn(webhooks::serve(app_listener, router));

    // nginx, with the documented block pointed at it.
    let block = documented_config();
    let (rate, burst) = documented_rate_and_burst(&block, "per_ip");
    let (login_rate, login_burst) = documented_rate_and_burst(&block, "login_ip");
    let port = tollgate_testkit::redis_server::unused_port();
    let block = block
        .replace("server 127.0.0.1:3000;", &format!("server {app_addr};"))
        .replace(
            "listen 127.0.0.1:8080;",
            &format!("listen 127.0.0.1:{port};"),
        );
    assert!(block.contains(&app_addr.to_string()) && block.contains(&port.to_string()));
    let nginx = Nginx::start(&bin, &block, port);

    // The storm: 300 calls for one Slack channel, 16 at a time.
    const CALLS: usize = 300;
    let sender = Sender::new(SocketAddr::from(([127, 0, 0, 1], port)));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for worker in 0..16 {
        let sender = sender.clone();
        tasks.spawn(async move {
            let mut replies = Vec::new();
            for i in (worker..CALLS).step_by(16) {
                let msg = slack_message("T0STORM", "C0STORM", &format!("storm {i}"));
                replies.push(sender.post("/slack/events", None, &msg).await.unwrap());
            }
            replies
        });
    }
    let mut replies: Vec<Reply> = Vec::with_capacity(CALLS);
    while let Some(r) = tasks.join_next().await {
        replies.extend(r.unwrap());
    }
    let elapsed = started.elapsed();
    let reached_by_storm = reached.load(Ordering::SeqCst);

    // A password-guessing run on /login meets the stricter login zone.
    const LOGINS: usize = 60;
    let started = Instant::now();
    let mut logins = Vec::with_capacity(LOGINS);
    for _ in 0..LOGINS {
        let attempt = serde_json::json!({ "email": "a@example.com", "password": "guess" });
        logins.push(sender.post("/login", None, &attempt).await.unwrap());
    }
    let login_elapsed = started.elapsed();
    drop(nginx);

    let by_nginx = |r: &Reply| {
        r.status == StatusCode::TOO_MANY_REQUESTS
            && r.content_type
                .as_deref()
                .is_some_and(|c| c.starts_with("text/html"))
    };
    let refused_by_nginx = replies.iter().filter(|r| by_nginx(r)).count() as u64;
    let passed_nginx = CALLS as u64 - refused_by_nginx;
    let reached_by_logins = reached.load(Ordering::SeqCst) - reached_by_storm;
    let reached = reached_by_storm;
    let by_app = replies
        .iter()
        // The channel's limit; on a very slow run, the source's too.
        .filter(|r| r.refused_by.is_some())
        .count() as u64;
    let ok = replies
        .iter()
        .filter(|r| r.status == StatusCode::OK)
        .count() as u64;
    eprintln!(
        "{CALLS} calls in {elapsed:?}: nginx refused {refused_by_nginx}, the app saw {reached} \
         (200: {ok}, refused by the app: {by_app})"
    );

    // nginx cut the storm, and nothing it refused reached the app.
    assert!(refused_by_nginx > 0, "nginx refused nothing");
    assert_eq!(reached, passed_nginx);
    // No more got through than the bucket allows.
    let allowed = burst + 1 + (rate * elapsed.as_secs_f64()).ceil() as u64 + 1;
    assert!(reached <= allowed, "{reached} > {allowed}");
    // Behind nginx, the app's own channel limit (30 a minute) still holds.
    assert_eq!(ok, reached.min(30));
    assert_eq!(by_app, reached.saturating_sub(30));
    assert_eq!(ok + by_app + refused_by_nginx, CALLS as u64);

    let login_refused = logins.iter().filter(|r| by_nginx(r)).count() as u64;
    eprintln!(
        "{LOGINS} logins in {login_elapsed:?}: nginx refused {login_refused}, the app saw {reached_by_logins}"
    );
    assert!(login_refused > 0, "nginx refused no login");
    assert_eq!(reached_by_logins, LOGINS as u64 - login_refused);
    let allowed = login_burst + 1 + (login_rate * login_elapsed.as_secs_f64()).ceil() as u64 + 1;
    assert!(
        reached_by_logins <= allowed,
        "{reached_by_logins} > {allowed}"
    );
    assert!(
        logins
            .iter()
            .filter(|r| !by_nginx(r))
            .all(|r| r.status == StatusCode::UNAUTHORIZED)
    );
}
