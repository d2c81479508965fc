use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tollgate_limiter::{Backend, KeyHasher, Limiter, Policy};
use tower_layer::Layer;

use super::classify::FailedLogins;
use crate::buffer_body::{BufferBody, DEFAULT_READ_TIMEOUT, Email, FromBody};
use crate::extract::ClientIp;
use crate::inbound::{LimiterCost, RateLimit, Upfront};
use crate::respond::Http;
use crate::{BufferBodyLayer, RateLimitLayer};

/// The largest login body read by default: 16 KiB.
pub const DEFAULT_BODY_LIMIT: usize = 16 * 1024;

/// The service [`LoginLayer`] makes: per-IP limit, then body buffering,
/// then per-account delay, then the login handler `S`.
pub type Login<S, B> = RateLimit<
    BufferBody<RateLimit<S, Limiter<B>, FromBody, Http, LimiterCost, FailedLogins>, Email>,
    Limiter<B>,
    ClientIp,
    Http,
    LimiterCost,
    Upfront,
>;

/// Login protection in one layer; see the [module docs](super).
///
/// Cheap to clone; clones (and every service made from them) share the
/// two limiters, so they count against the same limits.
#[must_use]
pub struct LoginLayer<B> {
    per_ip: Limiter<B>,
    per_account: Limiter<B>,
    client_ip: ClientIp,
    email: Arc<str>,
    hasher: KeyHasher,
    body_limit: usize,
    body_timeout: Option<Duration>,
    classify: FailedLogins,
}

impl<B: Backend> LoginLayer<B> {
    /// Limits each client (found by `client_ip`, which knows the trusted
    /// proxies) with `per_ip`, and each account with `per_account` (a
    /// [`ProgressiveDelay`](tollgate_limiter::ProgressiveDelay)), the account
    /// being the `email` field of a JSON or form body of at most 16 KiB,
    /// hashed by `hasher` (build it with
    /// [`KeyHasher::from_env`](tollgate_limiter::KeyHasher::from_env), so a
    /// service without its secret does not start), counted by response
    /// status ([`FailedLogins::by_status`]).
    ///
    /// # Panics
    ///
    /// When `per_account` is a progressive delay that forgets the failures
    /// by the end of its longest block (`forget_after` no longer than its
    /// longest delay, as configuration refuses it): each such block would
    /// give a guesser its free attempts back.
    #[track_caller]
    pub fn new(
        per_ip: Limiter<B>,
        per_account: Limiter<B>,
        client_ip: ClientIp,
        hasher: KeyHasher,
    ) -> Self {
        if let Policy::ProgressiveDelay(p) = per_account.policy()
            && p.forgets_by_its_longest_block()
        {
            panic!(
                "LoginLayer: limiter {:?}: forget_after ({:?}) must be longer than the longest \
                 delay ({:?}): a block ending when the failures are forgotten gives a guesser \
                 the free attempts back",
                per_account.name(),
                p.forget_after(),
                Duration::from_micros(p.delay_micros(u64::MAX)),
            );
        }
        Self {
            per_ip,
            per_account,
            client_ip,
            email: Arc::from("email"),
            hasher,
            body_limit: DEFAULT_BODY_LIMIT,
            body_timeout: Some(DEFAULT_READ_TIMEOUT),
            classify: FailedLogins::by_status(),
        }
    }
}

impl<B> LoginLayer<B> {
    /// The body field holding the email (default `email`).
    pub fn email_field(mut self, field: &str) -> Self {
        self.email = Arc::from(field);
        self
    }

    /// The largest body read (default 16 KiB); a larger one is refused
    /// with `413` before the handler (and before the account is known).
    pub fn body_limit(mut self, limit: usize) -> Self {
        self.body_limit = limit;
        self
    }

    /// How long the body may take to arrive (default 10 s,
    /// [`DEFAULT_READ_TIMEOUT`]); a slower one is refused with `408`
    /// before the handler. `None` waits for ever (only behind a proxy with
    /// its own body timeout).
    pub fn body_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.body_timeout = timeout;
        self
    }

    /// Whether failures and successes are read from the response status
    /// (the default) or said by the handler, with a
    /// [`LoginOutcome`](super::LoginOutcome) in the response's extensions
    /// (`false`; see [`FailedLogins::explicit`]). Either way each attempt
    /// is taken up front, before the handler runs.
    pub fn count_by_status(mut self, yes: bool) -> Self {
        self.classify = if yes {
            FailedLogins::by_status()
        } else {
            FailedLogins::explicit()
        };
        self
    }
}

impl<B> Clone for LoginLayer<B> {
    fn clone(&self) -> Self {
        Self {
            per_ip: self.per_ip.clone(),
            per_account: self.per_account.clone(),
            client_ip: self.client_ip.clone(),
            email: Arc::clone(&self.email),
            hasher: self.hasher.clone(),
            body_limit: self.body_limit,
            body_timeout: self.body_timeout,
            classify: self.classify,
        }
    }
}

impl<B> fmt::Debug for LoginLayer<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoginLayer")
            .field("per_ip", &self.per_ip)
            .field("per_account", &self.per_account)
            .field("client_ip", &self.client_ip)
            .field("email", &self.email)
            .field("hasher", &self.hasher)
            .field("body_limit", &self.body_limit)
            .field("body_timeout", &self.body_timeout)
            .field("classify", &self.classify)
            .finish()
    }
}

impl<S, B: Backend> Layer<S> for LoginLayer<B> {
    type Service = Login<S, B>;

    fn layer(&self, inner: S) -> Self::Service {
        // No account fields on an answered login: the account's counter
        // is not the caller's quota (see the module docs).
        let per_account = RateLimitLayer::new(self.per_account.clone(), FromBody)
            .responder(Http::new().headers_on_allowed(false))
            .classify(self.classify)
            .layer(inner);
        let buffered = BufferBodyLayer::new(
            self.body_limit,
            Email::field(Arc::clone(&self.email), self.hasher.clone()),
        )
        .read_timeout(self.body_timeout)
        .layer(per_account);
        RateLimitLayer::new(self.per_ip.clone(), self.client_ip.clone()).layer(buffered)
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::time::Duration;

    use bytes::Bytes;
    use http::{Request, Response, StatusCode};
    use http_body_util::Full;
    use tollgate_limiter::{MockClock, ProgressiveDelay, SlidingWindow};
    use tollgate_memory::MemoryBackend;
    use tower::{ServiceExt, service_fn};

    use super::*;
    use crate::extract::PeerAddr;
    use crate::login::LoginOutcome;

    type Backend = MemoryBackend<MockClock>;

    fn hasher() -> KeyHasher {
        KeyHasher::new("a test secret, 16 bytes or more").unwrap()
    }

    fn limiters(clock: &MockClock) -> (Limiter<Backend>, Limiter<Backend>) {
        limiters_on(MemoryBackend::with_clock(clock.clone()))
    }

    /// A per-account delay that forgets the failures by the end of its
    /// longest block gives a guesser the free attempts back after each
    /// one: refused in code as configuration refuses it (1 free attempt,
    /// at most 60 s, forgotten after 60 s: a guess a minute, for ever).
    #[test]
    #[should_panic(expected = "forget_after (60s) must be longer than the longest delay (60s)")]
    fn a_delay_forgotten_by_its_longest_block_is_refused() {
        let backend = MemoryBackend::with_clock(MockClock::new());
        let (ip, _) = limiters_on(backend.clone());
        let minute = Duration::from_secs(60);
        let policy = ProgressiveDelay::new(1, Duration::from_secs(10), 2, minute, minute).unwrap();
        let account = Limiter::new("login_account", policy, backend);
        let _ = LoginLayer::new(ip, account, ClientIp::new(), hasher());
    }

    fn limiters_on(backend: Backend) -> (Limiter<Backend>, Limiter<Backend>) {
        let ip = Limiter::new(
            "login_ip",
            SlidingWindow::new(100, Duration::from_secs(900)).unwrap(),
            backend.clone(),
        );
        let account = Limiter::new(
            "login_account",
            ProgressiveDelay::new(
                1,
                Duration::from_secs(10),
                2,
                Duration::from_secs(60),
                Duration::from_secs(3600),
            )
            .unwrap(),
            backend,
        );
        (ip, account)
    }

    fn form(field: &str, email: &str, password: &str) -> Request<Full<Bytes>> {
        let mut req = Request::post("/login")
            .header("content-type", "application/x-www-form-urlencoded")
            .body(Full::from(format!("{field}={email}&password={password}")))
            .unwrap();
        req.extensions_mut()
            .insert(PeerAddr("192.0.2.1:1000".parse().unwrap()));
        req
    }

    /// A handler that accepts password `right`; `explicit`, it answers
    /// 303 either way (a form login) and says the outcome with a
    /// [`LoginOutcome`]: `Failed`, `Succeeded`, `NoAttempt` for password
    /// `csrf` (no password checked), and nothing for password `unsaid`.
    async fn handler(
        req: Request<Full<Bytes>>,
        explicit: bool,
    ) -> Result<Response<Full<Bytes>>, Infallible> {
        use http_body_util::BodyExt;
        let body = req.into_body().collect().await.unwrap().to_bytes();
        let fields: Vec<(String, String)> = form_urlencoded::parse(&body).into_owned().collect();
        let get = |k: &str| fields.iter().find(|f| f.0 == k).map(|f| f.1.clone());
        let password = get("password");
        let ok = password.as_deref() == Some("right");
        let mut res = Response::new(Full::default());
        *res.status_mut() = match (explicit, ok) {
            (false, true) => StatusCode::OK,
            (false, false) => StatusCode::UNAUTHORIZED,
            (true, _) => {
                let said = match password.as_deref() {
                    Some("right") => Some(LoginOutcome::Succeeded),
                    Some("csrf") => Some(LoginOutcome::NoAttempt),
                    Some("unsaid") => None,
                    _ => Some(LoginOutcome::Failed),
                };
                if let Some(said) = said {
                    res.extensions_mut().insert(said);
                }
                StatusCode::SEE_OTHER
            }
        };
        Ok(res)
    }

    #[tokio::test]
    async fn explicit_outcomes_with_a_custom_field() {
        let clock = MockClock::new();
        let (ip, account) = limiters(&clock);
        let layer = LoginLayer::new(ip, account, ClientIp::new(), hasher())
            .email_field("login")
            .count_by_status(false);
        let svc = layer.layer(service_fn(move |req| handler(req, true)));
        let status = |req| {
            let svc = svc.clone();
            async move { svc.oneshot(req).await.unwrap().status() }
        };
        // Two failures said by the handler: the second starts a delay.
        assert_eq!(status(form("login", "a%40x.io", "no")).await, 303);
        assert_eq!(status(form("login", "a%40x.io", "no")).await, 303);
        assert_eq!(status(form("login", "A%40X.io", "right")).await, 429);
        clock.advance(Duration::from_secs(10));
        // The success is said and clears the account.
        assert_eq!(status(form("login", "a%40x.io", "right")).await, 303);
        // Attempts that checked no password give their failure back.
        for _ in 0..3 {
            assert_eq!(status(form("login", "a%40x.io", "csrf")).await, 303);
        }
        // An attempt that says nothing keeps its failure: it is the free
        // one, and the next failure starts the delay.
        assert_eq!(status(form("login", "a%40x.io", "unsaid")).await, 303);
        assert_eq!(status(form("login", "a%40x.io", "no")).await, 303);
        assert_eq!(status(form("login", "a%40x.io", "right")).await, 429);
        // The default field is not read any more.
        assert_eq!(status(form("email", "b%40x.io", "no")).await, 400);
    }

    /// An axum form login that redirects either way says its outcome
    /// beside the redirect, as the docs show: `(Extension(..), Redirect)`.
    #[tokio::test]
    async fn an_axum_handler_says_the_outcome_beside_its_redirect() {
        use axum::response::{IntoResponse, Redirect};
        use axum::routing::post;
        use axum::{Extension, Form, Router};

        #[derive(serde::Deserialize)]
        struct Login {
            password: String,
        }
        async fn login(Form(form): Form<Login>) -> axum::response::Response {
            let outcome = match form.password.as_str() {
                "right" => LoginOutcome::Succeeded,
                _ => LoginOutcome::Failed,
            };
            (Extension(outcome), Redirect::to("/")).into_response()
        }

        let clock = MockClock::new();
        let (ip, account) = limiters(&clock);
        let layer = LoginLayer::new(ip, account, ClientIp::new(), hasher()).count_by_status(false);
        let app = Router::new().route("/login", post(login).layer(layer));
        let status = |password: &str| {
            let mut req = Request::post("/login")
                .header("content-type", "application/x-www-form-urlencoded")
                .body(axum::body::Body::from(format!(
                    "email=f%40x.io&password={password}"
                )))
                .unwrap();
            req.extensions_mut()
                .insert(PeerAddr("192.0.2.1:1000".parse().unwrap()));
            let app = app.clone();
            async move { app.oneshot(req).await.unwrap().status() }
        };
        // One free failure, the second starts the delay.
        assert_eq!(status("no").await, 303);
        assert_eq!(status("no").await, 303);
        assert_eq!(status("right").await, 429);
        clock.advance(Duration::from_secs(10));
        // The success clears the account: one free failure again.
        assert_eq!(status("right").await, 303);
        assert_eq!(status("no").await, 303);
        assert_eq!(status("no").await, 303);
        assert_eq!(status("no").await, 429);
    }

    /// Bodies that name the victim to the handler and someone else to the
    /// limiter: a field given twice (a handler reading the form into a map
    /// keeps the last value), and a JSON body without a `Content-Type`
    /// whose string holds a form field (a handler reading the form
    /// whatever the `Content-Type`). Every other spelling names a fresh
    /// decoy; at most the free attempts and one more may reach the handler.
    #[tokio::test]
    async fn the_limiter_counts_the_account_the_handler_logs_into() {
        use std::collections::HashMap;
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};

        use http_body_util::BodyExt;

        let clock = MockClock::new();
        let (ip, account) = limiters(&clock);
        let svc = LoginLayer::new(ip, account, ClientIp::new(), hasher());
        let guesses = Arc::new(AtomicUsize::new(0));
        let seen = Arc::clone(&guesses);
        let svc = svc.layer(service_fn(move |req: Request<Full<Bytes>>| {
            let seen = Arc::clone(&seen);
            async move {
                let body = req.into_body().collect().await.unwrap().to_bytes();
                let fields: HashMap<String, String> =
                    form_urlencoded::parse(&body).into_owned().collect();
                if fields.get("email").map(String::as_str) == Some("victim@x.io") {
                    seen.fetch_add(1, Ordering::SeqCst);
                }
                let mut res = Response::new(Full::<Bytes>::default());
                *res.status_mut() = StatusCode::UNAUTHORIZED;
                Ok::<_, Infallible>(res)
            }
        }));
        let attempt = |body: String, form: bool| {
            let svc = svc.clone();
            let mut req = Request::post("/login").body(Full::from(body)).unwrap();
            if form {
                req.headers_mut().insert(
                    "content-type",
                    http::HeaderValue::from_static("application/x-www-form-urlencoded"),
                );
            }
            req.extensions_mut()
                .insert(PeerAddr("192.0.2.1:1000".parse().unwrap()));
            async move { svc.oneshot(req).await.unwrap().status() }
        };
        for i in 0..10 {
            let twice = format!("email=decoy{i}%40x.io&email=victim%40x.io&password=guess{i}");
            let status = attempt(twice, true).await;
            assert_ne!(status, StatusCode::OK);
            let smuggled = format!(
                r#"{{"email":"decoy{i}@x.io","pad":"&email=victim%40x.io&password=guess{i}&"}}"#
            );
            let status = attempt(smuggled, false).await;
            assert_ne!(status, StatusCode::OK);
        }
        let guesses = guesses.load(Ordering::SeqCst);
        assert!(
            guesses <= 2,
            "{guesses} guesses at one account reached the handler"
        );
    }

    #[tokio::test]
    async fn by_status_ignores_other_answers_and_bounds_the_body() {
        let clock = MockClock::new();
        let (ip, account) = limiters(&clock);
        let layer = LoginLayer::new(ip, account, ClientIp::new(), hasher()).body_limit(64);
        let svc = layer.layer(service_fn(|req: Request<Full<Bytes>>| async move {
            // A broken backend: 500 must not count as a failed login.
            if req.headers().contains_key("x-break") {
                let mut res = Response::new(Full::<Bytes>::default());
                *res.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
                return Ok(res);
            }
            handler(req, false).await
        }));
        let status = |req| {
            let svc = svc.clone();
            async move { svc.oneshot(req).await.unwrap().status() }
        };
        for _ in 0..3 {
            let mut req = form("email", "c%40x.io", "no");
            req.headers_mut()
                .insert("x-break", http::HeaderValue::from_static("1"));
            assert_eq!(status(req).await, 500);
        }
        // Still free: one failure is allowed, the second starts the delay.
        assert_eq!(status(form("email", "c%40x.io", "no")).await, 401);
        assert_eq!(status(form("email", "c%40x.io", "no")).await, 401);
        assert_eq!(status(form("email", "c%40x.io", "right")).await, 429);
        // An oversized body never reaches the handler nor the account.
        let long = "x".repeat(100);
        assert_eq!(status(form("email", "c%40x.io", &long)).await, 413);
    }

    /// An account's counter is not the caller's quota: anyone may name
    /// any email, so a login answered (a 401, a 2xx) must not tell how
    /// many free attempts the account has left, or when its failures are
    /// forgotten. One guess at a victim's address would otherwise read the
    /// victim's own recent failed logins (or another guesser's) in the
    /// `RateLimit` fields. The per-IP fields, the caller's own, stay.
    #[tokio::test]
    async fn an_answered_login_does_not_tell_the_accounts_counter() {
        let clock = MockClock::new();
        let (ip, account) = limiters(&clock);
        let layer = LoginLayer::new(ip, account, ClientIp::new(), hasher());
        let svc = layer.layer(service_fn(move |req| handler(req, false)));
        for password in ["no", "right"] {
            let res = svc
                .clone()
                .oneshot(form("email", "v%40x.io", password))
                .await
                .unwrap();
            assert_ne!(res.status(), StatusCode::TOO_MANY_REQUESTS);
            for name in ["ratelimit", "ratelimit-policy"] {
                let fields: Vec<_> = res.headers().get_all(name).iter().collect();
                let shown = format!("{fields:?}");
                assert!(!shown.contains("login_account"), "{name}: {shown}");
                assert!(shown.contains("login_ip"), "{name}: {shown}");
            }
        }
    }

    /// A handler that fails (`Err`, no response) made no failed login:
    /// the attempt taken up front is refunded, and the account is still
    /// free.
    #[tokio::test(start_paused = true)]
    async fn a_handler_error_refunds_the_attempt() {
        let clock = MockClock::new();
        let (ip, account) = limiters(&clock);
        let svc = LoginLayer::new(ip, account, ClientIp::new(), hasher()).layer(service_fn(
            |req: Request<Full<Bytes>>| async move {
                if req.headers().contains_key("x-break") {
                    return Err(std::io::Error::other("the user store is down"));
                }
                let mut res = Response::new(Full::<Bytes>::default());
                *res.status_mut() = StatusCode::UNAUTHORIZED;
                Ok(res)
            },
        ));
        for _ in 0..3 {
            let mut req = form("email", "e%40x.io", "no");
            req.headers_mut()
                .insert("x-break", http::HeaderValue::from_static("1"));
            assert!(svc.clone().oneshot(req).await.is_err());
            // The refund runs as a task of its own.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // Still free: one failure is allowed, the second starts the delay.
        let status = |req| {
            let svc = svc.clone();
            async move { svc.oneshot(req).await.unwrap().status() }
        };
        assert_eq!(status(form("email", "e%40x.io", "no")).await, 401);
        assert_eq!(status(form("email", "e%40x.io", "no")).await, 401);
        assert_eq!(status(form("email", "e%40x.io", "no")).await, 429);
    }

    /// A login service over `backend` whose handler accepts password
    /// `right`, never answers `hang`, and refuses anything else with 401;
    /// and a function sending it a form body.
    fn hanging_login(
        backend: &Backend,
    ) -> impl Fn(
        axum::body::Body,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = StatusCode> + Send>>
    + Clone {
        use http_body_util::BodyExt;

        let (ip, account) = limiters_on(backend.clone());
        let svc = LoginLayer::new(ip, account, ClientIp::new(), hasher()).layer(service_fn(
            |req: Request<axum::body::Body>| async move {
                let body = req.into_body().collect().await.unwrap().to_bytes();
                let password = form_urlencoded::parse(&body)
                    .find(|(k, _)| k == "password")
                    .map(|(_, v)| v.into_owned());
                let status = match password.as_deref() {
                    Some("right") => StatusCode::OK,
                    Some("hang") => std::future::pending().await,
                    _ => StatusCode::UNAUTHORIZED,
                };
                let mut res = Response::new(Full::<Bytes>::default());
                *res.status_mut() = status;
                Ok::<_, Infallible>(res)
            },
        ));
        move |body| {
            let svc = svc.clone();
            Box::pin(async move {
                let mut req = Request::post("/login")
                    .header("content-type", "application/x-www-form-urlencoded")
                    .body(body)
                    .unwrap();
                req.extensions_mut()
                    .insert(PeerAddr("192.0.2.1:1000".parse().unwrap()));
                svc.oneshot(req).await.unwrap().status()
            })
        }
    }

    /// A client gone (its request future dropped) while its body arrives,
    /// or while a limiter decides, leaves nothing behind: no failure
    /// recorded for the account, no decision or breaker state that only it
    /// could have settled. Gone while the handler runs, its attempt was
    /// taken up front and is kept: one failure, never more (dropping the
    /// connection on purpose earns no refund).
    #[tokio::test(start_paused = true)]
    async fn a_client_gone_mid_body_or_mid_decision_leaves_nothing_mid_handler_one_failure() {
        use axum::body::Body;
        use futures_util::{StreamExt, stream};

        let backend = MemoryBackend::with_clock(MockClock::new());
        let send = hanging_login(&backend);
        let gone = |body: Body, after: Duration| {
            let attempt = send(body);
            async move {
                let answered = tokio::time::timeout(after, attempt).await;
                assert!(answered.is_err(), "answered {answered:?}");
            }
        };
        // The body stops after the email, before the read deadline (10 s).
        let head = stream::iter([Ok::<_, Infallible>(Bytes::from("email=v%40x.io&pass"))]);
        let stalled = Body::from_stream(head.chain(stream::pending()));
        gone(stalled, Duration::from_secs(1)).await;
        // The handler never answers.
        gone(
            Body::from("email=v%40x.io&password=hang"),
            Duration::from_secs(1),
        )
        .await;
        // Every backend call takes 20 ms (within the limiters' 50 ms
        // timeout): gone at 10 ms, while the per-IP limiter decides.
        backend.set_delay(Duration::from_millis(20));
        gone(
            Body::from("email=v%40x.io&password=no"),
            Duration::from_millis(10),
        )
        .await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        backend.clear_faults();
        // The free failure was the hung attempt's: the next one starts
        // the delay.
        let no = || send(Body::from("email=v%40x.io&password=no"));
        assert_eq!(no().await, StatusCode::UNAUTHORIZED);
        assert_eq!(no().await, StatusCode::TOO_MANY_REQUESTS);
    }

    /// The success that clears an account is recorded even if the client
    /// goes away while it is in flight (it runs as a task of its own), so
    /// a real user who closes the tab at the wrong moment is not left with
    /// the delay their earlier failures started.
    #[tokio::test(start_paused = true)]
    async fn a_success_being_recorded_when_the_client_goes_still_clears_the_account() {
        use axum::body::Body;

        let clock = MockClock::new();
        let backend = MemoryBackend::with_clock(clock.clone());
        let send = hanging_login(&backend);
        let attempt =
            |password: &str| send(Body::from(format!("email=v%40x.io&password={password}")));
        assert_eq!(attempt("no").await, StatusCode::UNAUTHORIZED);
        assert_eq!(attempt("no").await, StatusCode::UNAUTHORIZED);
        assert_eq!(attempt("right").await, StatusCode::TOO_MANY_REQUESTS);
        clock.advance(Duration::from_secs(10));
        // 10 ms a backend call: the per-IP charge ends at 10 ms, the
        // account's check at 20 ms, its reset at 30 ms; gone at 25 ms.
        backend.set_delay(Duration::from_millis(10));
        let answered = tokio::time::timeout(Duration::from_millis(25), attempt("right")).await;
        assert!(answered.is_err(), "answered {answered:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
        backend.clear_faults();
        // Cleared: one free failure again (without the reset, this third
        // failure would have started a delay at once).
        assert_eq!(attempt("no").await, StatusCode::UNAUTHORIZED);
        assert_eq!(attempt("no").await, StatusCode::UNAUTHORIZED);
        assert_eq!(attempt("no").await, StatusCode::TOO_MANY_REQUESTS);
    }

    /// Attempts in flight together on one account see each other: each
    /// is taken as a failure up front, so while the account is free (at
    /// first, and each time a delay ends) only the free attempts and the
    /// one that starts the delay reach the handler; the others are
    /// answered `429` at once, recording nothing. (Checking, then charging
    /// by the response, let all of them through each time.)
    #[tokio::test(start_paused = true)]
    async fn attempts_in_flight_together_pass_one_past_the_free_attempts() {
        attempts_in_flight(false).await;
    }

    /// The same when the handler says the outcome (a form login answering
    /// 303 either way): the attempts are taken up front too. (Checking,
    /// then counting the handler's report, let all of them through.)
    #[tokio::test(start_paused = true)]
    async fn explicit_attempts_in_flight_together_pass_one_past_the_free_attempts() {
        attempts_in_flight(true).await;
    }

    async fn attempts_in_flight(explicit: bool) {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};

        use tokio::sync::Semaphore;

        const IN_FLIGHT: usize = 5;
        let clock = MockClock::new();
        let (ip, account) = limiters(&clock);
        let reached = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new(Semaphore::new(0));
        let svc = {
            let (reached, gate) = (Arc::clone(&reached), Arc::clone(&gate));
            LoginLayer::new(ip, account, ClientIp::new(), hasher())
                .count_by_status(!explicit)
                .layer(service_fn(move |_: Request<Full<Bytes>>| {
                    let (reached, gate) = (Arc::clone(&reached), Arc::clone(&gate));
                    async move {
                        reached.fetch_add(1, Ordering::SeqCst);
                        gate.acquire().await.unwrap().forget();
                        let mut res = Response::new(Full::<Bytes>::default());
                        if explicit {
                            *res.status_mut() = StatusCode::SEE_OTHER;
                            res.extensions_mut().insert(LoginOutcome::Failed);
                        } else {
                            *res.status_mut() = StatusCode::UNAUTHORIZED;
                        }
                        Ok::<_, Infallible>(res)
                    }
                }))
        };
        let failed = if explicit { 303 } else { 401 };
        // One free failure: the first round passes it and the one that
        // starts the delay; after the delay, only the one that starts the
        // next.
        let mut before = 0;
        for passing in [2, 1] {
            let attempts: Vec<_> = (0..IN_FLIGHT)
                .map(|_| tokio::spawn(svc.clone().oneshot(form("email", "v%40x.io", "no"))))
                .collect();
            // Every attempt is at the handler or answered; then those at
            // the handler answer.
            loop {
                let at_handler = reached.load(Ordering::SeqCst) - before;
                let answered = attempts.iter().filter(|a| a.is_finished()).count();
                if at_handler + answered == IN_FLIGHT {
                    gate.add_permits(at_handler);
                    break;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            let mut statuses = Vec::new();
            for a in attempts {
                statuses.push(a.await.unwrap().unwrap().status().as_u16());
            }
            statuses.sort_unstable();
            let mut want = vec![failed; passing];
            want.resize(IN_FLIGHT, 429);
            assert_eq!(statuses, want);
            before = reached.load(Ordering::SeqCst);
            let next = svc.clone().oneshot(form("email", "v%40x.io", "no")).await;
            assert_eq!(next.unwrap().status(), StatusCode::TOO_MANY_REQUESTS);
            // The longest delay (60 s) is over.
            clock.advance(Duration::from_secs(60));
        }
        assert_eq!(reached.load(Ordering::SeqCst), 3);
    }
}
