//! Messenger consumers of tollgate:
//!
//! * **inbound webhooks** ([`app`]): Slack- and Telegram-style payload
//!   endpoints, each call limited by a sliding window per client IP, per
//!   source (Slack workspace, Telegram bot) and per channel, one minute,
//!   fail-closed;
//! * **a listener** ([`listener`]): events that arrive over a stream (a
//!   Mattermost websocket has no webhook), limited per channel with
//!   `tollgate_tower::stream`.
//!
//! Counters live in memory, or in Redis when `REDIS_URL` is set. The limits
//! come from `limits.toml` (built in) and `TOLLGATE_*` variables.

pub mod listener;

use std::net::SocketAddr;

use axum::body::Body;
use axum::extract::{Path, Request};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use bytes::Bytes;
use http::StatusCode;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use tollgate_limiter::{Backend, Config, ConfigError, Key};
use tollgate_tower::RateLimitLayer;
use tollgate_tower::extract::{ClientIp, IpNet};

/// The built-in limits.
pub const LIMITS: &str = include_str!("../limits.toml");

/// The largest payload read: 64 KiB.
pub const BODY_LIMIT: usize = 64 * 1024;

/// The limits: the built-in ones, overridden by `TOLLGATE_*` variables.
pub fn limits() -> Result<Config, ConfigError> {
    Config::builder().toml_str(LIMITS).env().load()
}

/// Who sent a webhook call: a Slack workspace or a Telegram bot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source(pub Key);

/// The channel of a webhook call, within its source (a call without one
/// counts under the source's `-` channel).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Channel(pub Key);

/// Reads the bounded payload once and records its [`Source`] and
/// [`Channel`] for the limiters inside.
async fn route_keys(req: Request, next: Next) -> Response {
    let (mut parts, body) = req.into_parts();
    let bytes = match axum::body::to_bytes(body, BODY_LIMIT).await {
        Ok(bytes) => bytes,
        Err(_) => return StatusCode::PAYLOAD_TOO_LARGE.into_response(),
    };
    let payload: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let path = parts.uri.path();
    let keys = if path == "/slack/events" {
        slack_keys(&payload)
    } else {
        path.strip_prefix("/telegram/")
            .map(|bot| telegram_keys(bot, &payload))
    };
    if let Some((source, channel)) = keys {
        parts.extensions.insert(Source(Key::composite(&source)));
        let mut channel_parts = source;
        channel_parts.push(channel.unwrap_or_else(|| "-".to_owned()));
        parts
            .extensions
            .insert(Channel(Key::composite(&channel_parts)));
    }
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

/// `team_id`, and the event's channel.
fn slack_keys(payload: &Value) -> Option<(Vec<String>, Option<String>)> {
    let team = payload.get("team_id")?.as_str()?;
    let channel = payload
        .pointer("/event/channel")
        .and_then(Value::as_str)
        .map(str::to_owned);
    Some((vec!["slack".into(), team.into()], channel))
}

/// The bot (from the path), and the chat of whatever the update carries.
fn telegram_keys(bot: &str, payload: &Value) -> (Vec<String>, Option<String>) {
    let chat = [
        "message",
        "edited_message",
        "channel_post",
        "callback_query/message",
    ]
    .iter()
    .find_map(|field| payload.pointer(&format!("/{field}/chat/id")))
    .map(|id| match id {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    });
    (vec!["telegram".into(), bot.into()], chat)
}

async fn slack_events(Json(payload): Json<Value>) -> Response {
    // Slack checks a new endpoint with a challenge to echo.
    if payload.get("type").and_then(Value::as_str) == Some("url_verification") {
        let challenge = payload.get("challenge").cloned().unwrap_or(Value::Null);
        return Json(serde_json::json!({ "challenge": challenge })).into_response();
    }
    StatusCode::OK.into_response()
}

async fn telegram_update(Path(_bot): Path<String>, Json(_update): Json<Value>) -> Response {
    StatusCode::OK.into_response()
}

/// The webhook endpoints: `POST /slack/events` (Events API payloads) and
/// `POST /telegram/{bot}` (updates), each call limited per client IP, then
/// per source, then per channel. A call without a source (a Slack payload
/// with no `team_id`) is refused with `400`.
///
/// The client IP is the peer address, or the `X-Forwarded-For` entry
/// written by a proxy on `trusted_proxies`.
pub fn app<B: Backend + Clone>(
    config: &Config,
    backend: B,
    trusted_proxies: Vec<IpNet>,
) -> Result<Router, ConfigError> {
    let per_ip = config.limiter("hooks_ip")?.build(backend.clone());
    let per_source = config.limiter("hooks_source")?.build(backend.clone());
    let per_channel = config.limiter("hooks_channel")?.build(backend);

    let source = |req: &Request| req.extensions().get::<Source>().map(|s| s.0.clone());
    let channel = |req: &Request| req.extensions().get::<Channel>().map(|c| c.0.clone());
    // Layers added last run first: IP, then the payload, source, channel.
    Ok(Router::new()
        .route("/slack/events", post(slack_events))
        .route("/telegram/{bot}", post(telegram_update))
        .layer(RateLimitLayer::new(per_channel, channel))
        .layer(RateLimitLayer::new(per_source, source))
        .layer(middleware::from_fn(route_keys))
        .layer(RateLimitLayer::new(
            per_ip,
            ClientIp::new().trust_proxies(trusted_proxies),
        )))
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

/// A Slack Events API payload: a message in `channel` of workspace `team`.
pub fn slack_message(team: &str, channel: &str, text: &str) -> Value {
    serde_json::json!({
        "type": "event_callback",
        "team_id": team,
        "event": { "type": "message", "channel": channel, "text": text },
    })
}

/// A Telegram update: a message in chat `chat`.
pub fn telegram_message(update_id: u64, chat: i64, text: &str) -> Value {
    serde_json::json!({
        "update_id": update_id,
        "message": { "message_id": update_id, "chat": { "id": chat, "type": "group" }, "text": text },
    })
}

/// One answer to a webhook call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The status.
    pub status: StatusCode,
    /// The limiter that refused (from the problem+json body), if any.
    pub refused_by: Option<String>,
    /// The `Content-Type` (the app refuses with problem+json, nginx with
    /// its HTML page).
    pub content_type: Option<String>,
}

/// A webhook sender that says which client it stands for with
/// `X-Forwarded-For`, as a proxy on loopback would.
#[derive(Debug, Clone)]
pub struct Sender {
    base: String,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Sender {
    /// A sender to the app (or proxy) at `addr`.
    pub fn new(addr: SocketAddr) -> Self {
        Self {
            base: format!("http://{addr}"),
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    /// POSTs `payload` to `path`, from `ip` when given.
    pub async fn post(
        &self,
        path: &str,
        ip: Option<&str>,
        payload: &Value,
    ) -> Result<Reply, Box<dyn std::error::Error + Send + Sync>> {
        let mut req = http::Request::post(format!("{}{path}", self.base))
            .header("content-type", "application/json");
        if let Some(ip) = ip {
            req = req.header("x-forwarded-for", ip);
        }
        let res = self
            .client
            .request(req.body(Full::from(payload.to_string()))?)
            .await?;
        let status = res.status();
        let content_type = res
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = res.into_body().collect().await?.to_bytes();
        Ok(Reply {
            status,
            refused_by: refused_by(&body),
            content_type,
        })
    }
}

/// The limiter named in a problem+json refusal.
pub fn refused_by(body: &[u8]) -> Option<String> {
    let v: Value = serde_json::from_slice(body).ok()?;
    v.get("violated-policies")?
        .get(0)?
        .as_str()
        .map(str::to_owned)
}
