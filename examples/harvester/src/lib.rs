//! The Harvester: a crawler that finds a source's hidden rate limit.
//!
//! [`Source`] is a fake remote on `127.0.0.1`: it serves pages at a hidden
//! rate (a token bucket) and answers `429 Too Many Requests` with
//! `Retry-After: 1` above it; its limit may rise during a run. [`crawl`]
//! fetches pages from it with several concurrent tasks through a hyper
//! client wrapped in tollgate's [`AdaptiveLayer`], which waits for a token
//! before each request and feeds each response back to an
//! [`AimdLimiter`]: the rate climbs while pages come back and is cut when
//! the source refuses, so it settles just under the hidden limit.
//!
//! The limiter's settings are data: [`config`] reads `harvester.toml`.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper::server::conn::http1;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tollgate_limiter::aimd::{AimdConfig, AimdLimiter};
use tollgate_limiter::{Backend, ConfigError, Key};
use tollgate_tower::outbound::AdaptiveLayer;
use tower::{Layer, ServiceExt};

/// The Harvester's adaptive-limit settings, from `harvester.toml`.
pub fn config() -> Result<AimdConfig, ConfigError> {
    AimdConfig::from_toml(include_str!("../harvester.toml"))
}

/// How many requests the source lets through back to back: a little slack
/// for scheduling jitter on the loopback.
const SOURCE_BURST: f64 = 2.0;

/// The source's hidden limit over time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Schedule {
    /// Requests per second from the start.
    pub rate: f64,
    /// When, after the start, the limit changes, and to what.
    pub change: Option<(Duration, f64)>,
}

impl Schedule {
    /// The limit `elapsed` after the start.
    pub fn limit_at(&self, elapsed: Duration) -> f64 {
        match self.change {
            Some((at, rate)) if elapsed >= at => rate,
            _ => self.rate,
        }
    }
}

/// A fake remote source on a loopback port, enforcing a hidden rate.
///
/// Stops serving when dropped.
#[derive(Debug)]
pub struct Source {
    addr: SocketAddr,
    shared: Arc<SourceState>,
    server: JoinHandle<()>,
}

#[derive(Debug)]
struct SourceState {
    schedule: Schedule,
    start: Instant,
    /// The token bucket's theoretical arrival time (GCRA).
    tat: Mutex<Option<Instant>>,
    served: AtomicU64,
    refused: AtomicU64,
}

impl SourceState {
    fn limit(&self) -> f64 {
        self.schedule.limit_at(self.start.elapsed())
    }

    fn answer(&self) -> Response<Full<Bytes>> {
        let now = Instant::now();
        let interval = Duration::from_secs_f64(1.0 / self.limit());
        let tau = interval.mul_f64(SOURCE_BURST);
        let mut tat = self.tat.lock().unwrap_or_else(|e| e.into_inner());
        let t = tat.map_or(now, |t| t.max(now));
        if t + interval - now <= tau {
            *tat = Some(t + interval);
            self.served.fetch_add(1, Ordering::Relaxed);
            Response::new(Full::from("<html>a page</html>"))
        } else {
            self.refused.fetch_add(1, Ordering::Relaxed);
            let mut response = Response::new(Full::from("slow down"));
            *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
            response.headers_mut().insert(
                http::header::RETRY_AFTER,
                http::HeaderValue::from_static("1"),
            );
            response
        }
    }
}

impl Source {
    /// Starts serving on a free port of `127.0.0.1`.
    pub async fn start(schedule: Schedule) -> io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(SourceState {
            schedule,
            start: Instant::now(),
            tat: Mutex::new(None),
            served: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        });
        let state = Arc::clone(&shared);
        let server = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let state = Arc::clone(&state);
                let service =
                    hyper::service::service_fn(move |_req: Request<hyper::body::Incoming>| {
                        let response = state.answer();
                        async move { Ok::<_, Infallible>(response) }
                    });
                tokio::spawn(async move {
                    // A client hanging up mid-request is its business.
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Self {
            addr,
            shared,
            server,
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its hidden limit now, in requests per second.
    pub fn limit(&self) -> f64 {
        self.shared.limit()
    }

    /// Pages served so far.
    pub fn served(&self) -> u64 {
        self.shared.served.load(Ordering::Relaxed)
    }

    /// Requests refused (429) so far.
    pub fn refused(&self) -> u64 {
        self.shared.refused.load(Ordering::Relaxed)
    }
}

impl Drop for Source {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// How to crawl.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// How long to crawl.
    pub duration: Duration,
    /// Concurrent fetching tasks (requests in flight at most).
    pub tasks: usize,
    /// How often to sample the rate.
    pub sample_every: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            duration: Duration::from_secs(30),
            tasks: 8,
            sample_every: Duration::from_millis(100),
        }
    }
}

/// The state of a crawl at one instant.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// Seconds since the crawl started.
    pub t: f64,
    /// The Harvester's adapted rate for the source, in requests per second.
    pub rate: f64,
    /// The source's hidden limit, in requests per second.
    pub limit: f64,
    /// Pages served so far.
    pub served: u64,
    /// Requests refused so far.
    pub refused: u64,
}

/// The scope the layer counts `source` under: its host and port.
pub fn scope(source: &Source) -> Key {
    Key::new(source.addr().to_string())
}

/// Crawls `source` for `options.duration` through an [`AdaptiveLayer`]
/// over `limiter`, calling `on_sample` with each sample as it is taken;
/// returns them all.
pub async fn crawl<B: Backend>(
    source: &Source,
    limiter: &AimdLimiter<B>,
    options: &Options,
    mut on_sample: impl FnMut(&Sample),
) -> Vec<Sample> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let service = AdaptiveLayer::new(limiter.clone()).layer(client);
    let start = Instant::now();
    let deadline = start + options.duration;
    let addr = source.addr();
    let tasks: Vec<_> = (0..options.tasks)
        .map(|task| {
            let service = service.clone();
            tokio::spawn(async move {
                for page in 0u64.. {
                    let uri = format!("http://{addr}/page/{task}-{page}");
                    let Ok(req) = Request::get(uri).body(Empty::new()) else {
                        return;
                    };
                    // The layer may hold a request for a Retry-After: stop
                    // waiting at the deadline.
                    match tokio::time::timeout_at(deadline, service.clone().oneshot(req)).await {
                        Ok(Ok(response)) => {
                            let _ = response.into_body().collect().await;
                        }
                        // A failed connection is retried with the next page.
                        Ok(Err(_)) => {}
                        Err(_) => return,
                    }
                }
            })
        })
        .collect();

    let scope = scope(source);
    let mut samples = Vec::new();
    let mut tick = tokio::time::interval(options.sample_every);
    while Instant::now() < deadline {
        tick.tick().await;
        let rate = match limiter.shared_rate(&scope).await {
            Ok(rate) => rate,
            Err(_) => limiter.rate(&scope),
        };
        let sample = Sample {
            t: start.elapsed().as_secs_f64(),
            rate,
            limit: source.limit(),
            served: source.served(),
            refused: source.refused(),
        };
        on_sample(&sample);
        samples.push(sample);
    }
    for task in tasks {
        task.abort();
    }
    samples
}

/// The mean adapted rate of the samples taken in `[from, to)` seconds.
pub fn mean_rate(samples: &[Sample], from: f64, to: f64) -> Option<f64> {
    let rates: Vec<f64> = samples
        .iter()
        .filter(|s| (from..to).contains(&s.t))
        .map(|s| s.rate)
        .collect();
    (!rates.is_empty()).then(|| rates.iter().sum::<f64>() / rates.len() as f64)
}

/// The samples as CSV: `t,rate,limit,served,refused`.
pub fn to_csv(samples: &[Sample]) -> String {
    let mut csv = String::from("t,rate,limit,served,refused\n");
    for s in samples {
        csv.push_str(&format!(
            "{:.3},{:.3},{:.3},{},{}\n",
            s.t, s.rate, s.limit, s.served, s.refused
        ));
    }
    csv
}
