//! A login route protected by `tollgate_tower::login`: a sliding window per
//! client IP and a progressive delay per account that counts failed logins
//! only, over the memory backend, or Redis when `REDIS_URL` is set.
//!
//! The limits come from `limits.toml` (built in) and `TOLLGATE_*`
//! environment variables.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use tollgate_limiter::{Backend, Config, ConfigError, KeyHasher};
use tollgate_tower::extract::{ClientIp, IpNet};
use tollgate_tower::login::LoginLayer;

/// The built-in limits.
pub const LIMITS: &str = include_str!("../limits.toml");

/// The demo account.
pub const EMAIL: &str = "alice@example.com";
/// Its password.
pub const PASSWORD: &str = "correct horse battery staple";

/// The configuration: the built-in limits, overridden by `TOLLGATE_*`
/// variables; where Redis is comes from the `[redis]` section
/// (`TOLLGATE_REDIS__URL`, `TOLLGATE_REDIS__RESPONSE_TIMEOUT`, ...), with
/// `REDIS_URL`, when set, as its URL.
pub fn limits() -> Result<Config, ConfigError> {
    let config = Config::builder().toml_str(LIMITS).env();
    match std::env::var("REDIS_URL") {
        Ok(url) => config.redis_url(url),
        Err(_) => config,
    }
    .load()
}

/// A toy user store. A real one keeps a slow, salted hash (argon2, scrypt);
/// what matters here is that an unknown email costs the same work and
/// gets the same answer as a wrong password.
#[derive(Debug)]
pub struct Users {
    hashes: HashMap<String, [u8; 32]>,
}

impl Users {
    /// The demo store: one account, [`EMAIL`] / [`PASSWORD`].
    pub fn demo() -> Self {
        let mut hashes = HashMap::new();
        hashes.insert(EMAIL.to_owned(), hash(EMAIL, PASSWORD));
        Self { hashes }
    }

    /// Whether `password` is `email`'s.
    pub fn verify(&self, email: &str, password: &str) -> bool {
        let email = email.trim().to_lowercase();
        let given = hash(&email, password);
        // Unknown accounts are compared with a dummy: the same work.
        let stored = self.hashes.get(&email).copied().unwrap_or([0xff; 32]);
        // Constant-time comparison.
        given
            .iter()
            .zip(stored)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
            && self.hashes.contains_key(&email)
    }
}

fn hash(email: &str, password: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(email.as_bytes());
    h.update([0]);
    h.update(password.as_bytes());
    h.finalize().into()
}

#[derive(Deserialize)]
struct Credentials {
    email: String,
    password: String,
}

async fn login(State(users): State<Arc<Users>>, Json(c): Json<Credentials>) -> Response {
    if users.verify(&c.email, &c.password) {
        Json(serde_json::json!({ "ok": true })).into_response()
    } else {
        // One answer for "no such account" and "wrong password".
        (
            StatusCode::UNAUTHORIZED,
            Json(serde_json::json!({ "error": "invalid email or password" })),
        )
            .into_response()
    }
}

/// The app: `POST /login` (JSON `{"email", "password"}`) behind the login
/// protection, and `GET /` unprotected.
///
/// The client IP is the peer address, or the `X-Forwarded-For` entry
/// written by a proxy on `trusted_proxies` (nginx on the same host:
/// `127.0.0.1/32`). Trust only your proxies' addresses: anyone else could
/// choose their own IP. IPv6 clients are counted per /64 (`ClientIp`'s
/// default).
///
/// Emails are hashed with `hasher` (HMAC under the service's secret, see
/// [`KeyHasher::from_env`]): Redis never holds an address, and a reader of
/// Redis cannot confirm a guessed one.
pub fn app<B: Backend + Clone>(
    config: &Config,
    backend: B,
    trusted_proxies: Vec<IpNet>,
    hasher: KeyHasher,
) -> Result<Router, ConfigError> {
    let per_ip = config.limiter("login_ip")?.build(backend.clone());
    let per_account = config.limiter("login_account")?.build(backend);
    let client_ip = ClientIp::new().trust_proxies(trusted_proxies);
    Ok(Router::new()
        .route(
            "/login",
            post(login).layer(LoginLayer::new(per_ip, per_account, client_ip, hasher)),
        )
        .route("/", get(|| async { "POST /login\n" }))
        .with_state(Arc::new(Users::demo())))
}

/// Serves `router` on `listener`, with the peer addresses the per-IP
/// limit needs.
pub async fn serve(listener: tokio::net::TcpListener, router: Router) -> std::io::Result<()> {
    axum::serve(
        listener,
        router.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await
}

/// One answer to a login attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The status.
    pub status: StatusCode,
    /// The limiter that refused (from the problem+json body), if any.
    pub refused_by: Option<String>,
    /// `Retry-After`, in seconds.
    pub retry_after: Option<u64>,
    /// The body.
    pub body: String,
}

/// A login client that says which client it stands for with
/// `X-Forwarded-For`, as a proxy on loopback would.
#[derive(Debug, Clone)]
pub struct LoginClient {
    addr: SocketAddr,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl LoginClient {
    /// A client of the app at `addr`.
    pub fn new(addr: SocketAddr) -> Self {
        Self {
            addr,
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    /// One login attempt from `ip`.
    pub async fn attempt(
        &self,
        ip: &str,
        email: &str,
        password: &str,
    ) -> Result<Reply, Box<dyn std::error::Error + Send + Sync>> {
        let body = serde_json::json!({ "email": email, "password": password }).to_string();
        let req = Request::post(format!("http://{}/login", self.addr))
            .header("content-type", "application/json")
            .header("x-forwarded-for", ip)
            .body(Full::from(body))?;
        let res = self.client.request(req).await?;
        let status = res.status();
        let retry_after = res
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()?.parse().ok());
        let body =
            String::from_utf8_lossy(&res.into_body().collect().await?.to_bytes()).into_owned();
        Ok(Reply {
            status,
            refused_by: refused_by(&body),
            retry_after,
            body,
        })
    }
}

/// The limiter named in a problem+json refusal.
pub fn refused_by(body: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(body).ok()?;
    v.get("violated-policies")?
        .get(0)?
        .as_str()
        .map(str::to_owned)
}

/// What [`demo`] saw.
#[derive(Debug, Clone)]
pub struct DemoRun {
    /// The attacker's replies, in order.
    pub attacker: Vec<Reply>,
    /// The real user's replies: refused while the account is delayed, then
    /// let in.
    pub user: Vec<Reply>,
}

/// The demo: an attacker at 203.0.113.66 runs through a password list
/// against [`EMAIL`]; the real user, at 198.51.100.7, finds the account
/// delayed, waits the `Retry-After` it is told, and gets in.
pub async fn demo(
    addr: SocketAddr,
    guesses: usize,
) -> Result<DemoRun, Box<dyn std::error::Error + Send + Sync>> {
    let client = LoginClient::new(addr);
    let mut attacker = Vec::with_capacity(guesses);
    for i in 0..guesses {
        let guess = format!("password{i}");
        attacker.push(client.attempt("203.0.113.66", EMAIL, &guess).await?);
    }
    let mut user = Vec::new();
    loop {
        let reply = client.attempt("198.51.100.7", EMAIL, PASSWORD).await?;
        let wait = reply.retry_after;
        let done = reply.status == StatusCode::OK || user.len() >= 5;
        user.push(reply);
        match wait {
            Some(secs) if !done => tokio::time::sleep(std::time::Duration::from_secs(secs)).await,
            _ => break,
        }
    }
    Ok(DemoRun { attacker, user })
}
