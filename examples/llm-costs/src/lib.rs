//! An LLM gateway with two separate limits, each from the consumers table:
//!
//! * **API keys**: a token bucket per key, with one ceiling per role
//!   (`api_standard`, `api_admin`), chosen per request by the tower
//!   layer's policy resolver; fail-open.
//! * **LLM calls**: a token bucket per key counted in model tokens
//!   (`llm_tokens`), by the handler through the [`Limiter`] itself (an
//!   internal consumer); fail-closed. A call's cost is known only once the
//!   model answers, so the handler *reserves* the most it can cost (its
//!   prompt plus `max_tokens`) before calling the model, and *settles* with
//!   the usage the model reports: the unused tokens come back at once (see
//!   [`Limiter::reserve`]).
//!
//! A key can have API calls left and no tokens, or the other way round:
//! cheap endpoints keep working when the inference budget is spent.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{FromRequest, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use http::{HeaderName, HeaderValue, Request, StatusCode, header};
use serde::Deserialize;
use tollgate_limiter::{Backend, Config, ConfigError, Error, KeyHasher, Limiter};
use tollgate_tower::RateLimitLayer;
use tollgate_tower::extract::{ApiKey, KeyExtractor};

/// The built-in limits.
pub const LIMITS: &str = include_str!("../limits.toml");

/// The limits: the built-in ones, overridden by `TOLLGATE_*` variables.
pub fn limits() -> Result<Config, ConfigError> {
    Config::builder().toml_str(LIMITS).env().load()
}

/// The key's role. A real gateway looks it up; here keys starting with
/// `admin_` are admins.
pub fn role_of(key: &str) -> &'static str {
    if key.starts_with("admin_") {
        "admin"
    } else {
        "standard"
    }
}

/// The cost of a completion in model tokens: the prompt (about four
/// characters a token) plus the most the model may answer.
pub fn cost(prompt: &str, max_tokens: u64) -> u64 {
    (prompt.chars().count() as u64).div_ceil(4) + max_tokens
}

/// The most a fake model's answer takes, in tokens.
pub const ANSWER_TOKENS: u64 = 250;

/// What the (fake) model reports having used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// Tokens of the prompt.
    pub prompt_tokens: u64,
    /// Tokens of the answer (at most `max_tokens`).
    pub completion_tokens: u64,
}

impl Usage {
    /// Both.
    pub fn total(&self) -> u64 {
        self.prompt_tokens + self.completion_tokens
    }
}

/// A fake model: answers [`ANSWER_TOKENS`] tokens at most, and reports its
/// usage as a real API does.
pub async fn fake_model(prompt: &str, max_tokens: u64) -> (String, Usage) {
    let usage = Usage {
        prompt_tokens: cost(prompt, 0),
        completion_tokens: max_tokens.min(ANSWER_TOKENS),
    };
    ("(a fake model's answer)".to_owned(), usage)
}

/// A completion request.
#[derive(Debug, Deserialize)]
pub struct Completion {
    /// The prompt.
    pub prompt: String,
    /// The most tokens the answer may take.
    pub max_tokens: u64,
}

struct Gateway<B> {
    tokens: Limiter<B>,
    /// The API layer's extractor: the token budget is counted under the
    /// key the API limit counts (one credential, trimmed, hashed), never
    /// under a spelling of its own (a key with blanks around it would be
    /// a second budget for a gateway that authenticates the trimmed key).
    api_key: ApiKey,
}

fn problem(status: StatusCode, limiter: Option<&str>, detail: &str) -> Response {
    let mut body = serde_json::json!({
        "type": "about:blank",
        "title": status.canonical_reason(),
        "status": status.as_u16(),
        "detail": detail,
    });
    if let Some(name) = limiter {
        body["type"] = "https://iana.org/assignments/http-problem-types#quota-exceeded".into();
        body["violated-policies"] = serde_json::json!([name]);
    }
    let mut res = (status, body.to_string()).into_response();
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    res
}

async fn complete<B: Backend>(State(gw): State<Arc<Gateway<B>>>, req: Request<Body>) -> Response {
    // The API layer already refused requests without a key.
    let Some(key) = gw.api_key.extract(&req) else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    let c = match Json::<Completion>::from_request(req, &()).await {
        Ok(Json(c)) => c,
        Err(rejected) => return rejected.into_response(),
    };
    let tokens = cost(&c.prompt, c.max_tokens);
    // The most this call can cost is taken now, atomically: concurrent
    // calls of one key cannot overspend the budget between them.
    let (verdict, reservation) = gw.tokens.reserve(&key, tokens).await;
    match verdict.into_result() {
        Ok(_) => {
            let (completion, usage) = fake_model(&c.prompt, c.max_tokens).await;
            // The unused tokens come back. Should this fail (the counter
            // is down), the whole estimate stays charged: the safe side.
            // A handler that returns early or panics before this line
            // leaves the estimate charged too; it drips back as usual.
            let after = reservation.settle(usage.total()).await;
            if let Err(e) = &after {
                tracing::warn!(error = %e, "llm_tokens: settle failed; the estimate stays charged");
            }
            Json(serde_json::json!({
                "completion": completion,
                "usage": {
                    "prompt_tokens": usage.prompt_tokens,
                    "completion_tokens": usage.completion_tokens,
                    "reserved_tokens": tokens,
                    "charged_tokens": usage.total(),
                    "tokens_left": after.ok().flatten().map(|d| d.remaining()),
                },
            }))
            .into_response()
        }
        // More than the whole budget: waiting will not help.
        Err(denied) if matches!(denied.error, Some(Error::Policy(_))) => problem(
            StatusCode::BAD_REQUEST,
            None,
            &format!("A call of {tokens} tokens exceeds the token budget."),
        ),
        Err(denied) => {
            let secs =
                denied.retry_after.as_secs() + u64::from(denied.retry_after.subsec_nanos() > 0);
            let (status, limiter) = match denied.decision {
                Some(_) => (StatusCode::TOO_MANY_REQUESTS, Some("llm_tokens")),
                // The counter is down and inference is fail-closed.
                None => (StatusCode::SERVICE_UNAVAILABLE, None),
            };
            let mut res = problem(status, limiter, "The token budget is spent; retry later.");
            res.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
            res
        }
    }
}

/// The gateway: `POST /v1/complete` (JSON `{"prompt", "max_tokens"}`) and
/// `GET /v1/models`, both under the per-role API limit (key in
/// `x-api-key`); completions also under the token budget.
///
/// API keys are hashed with `hasher` (HMAC under the service's secret), the
/// same for both limits.
pub fn app<B: Backend + Clone>(
    config: &Config,
    backend: B,
    hasher: KeyHasher,
) -> Result<Router, ConfigError> {
    let standard = config.limiter("api_standard")?.build(backend.clone());
    let admin = config.limiter("api_admin")?.build(backend.clone());
    let tokens = config.limiter("llm_tokens")?.build(backend);

    let api_key = ApiKey::header(HeaderName::from_static("x-api-key"), hasher);
    let keys = api_key.clone();
    let per_role = RateLimitLayer::per_request(
        move |req: &Request<Body>| match keys.credential(req).map_or("standard", role_of) {
            "admin" => admin.clone(),
            _ => standard.clone(),
        },
        api_key.clone(),
    );
    Ok(Router::new()
        .route("/v1/complete", post(complete::<B>))
        .route("/v1/models", get(|| async { r#"{"models":["fake-1"]}"# }))
        .with_state(Arc::new(Gateway { tokens, api_key }))
        .layer(per_role))
}
