//! A listener consumer: events arrive over a stream (a Mattermost
//! websocket, here a local fake), and each channel is limited with a
//! sliding window through `tollgate_tower::stream`. The excess is dropped
//! and counted, or delayed: the consumer's choice.

use std::collections::BTreeMap;

use futures_util::{Stream, StreamExt, stream};
use tokio::sync::mpsc;
use tollgate_limiter::{Backend, Key, Limiter};
use tollgate_tower::stream::{Excess, RateLimitStreamExt, StreamStats};

/// One event of the listener: a post in a channel of a team.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The team (Mattermost) or workspace.
    pub team: String,
    /// The channel.
    pub channel: String,
    /// The message.
    pub text: String,
}

impl Event {
    /// A post of `text` in `team`/`channel`.
    pub fn new(team: &str, channel: &str, text: impl Into<String>) -> Self {
        Self {
            team: team.to_owned(),
            channel: channel.to_owned(),
            text: text.into(),
        }
    }

    /// The key the limit counts: the channel, within its team.
    pub fn channel_key(&self) -> Option<Key> {
        Some(Key::composite([&self.team, &self.channel]))
    }
}

/// A fake event source: a task that sends `events` down a channel, the way
/// a websocket reader task would, and the stream of what it sends.
pub fn fake_source(events: Vec<Event>) -> impl Stream<Item = Event> + Send + Unpin {
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        for event in events {
            if tx.send(event).await.is_err() {
                break;
            }
        }
    });
    Box::pin(stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|event| (event, rx))
    }))
}

/// The demo's traffic: a bot floods `town-square` with 50 posts while 10
/// ordinary posts go to `dev`.
pub fn storm() -> Vec<Event> {
    let mut events = Vec::new();
    for i in 0..50 {
        events.push(Event::new("acme", "town-square", format!("spam {i}")));
        if i % 5 == 0 {
            events.push(Event::new("acme", "dev", format!("build {i} is green")));
        }
    }
    events
}

/// What the listener handled.
#[derive(Debug, Clone, Default)]
pub struct Handled {
    /// Events handled, per channel.
    pub per_channel: BTreeMap<String, u64>,
    /// Handled events, in order.
    pub events: Vec<Event>,
}

/// Runs the listener over `events`: each channel limited by `limiter`, the
/// excess dropped or delayed per `excess`. Returns what was handled and
/// the stream's counters.
pub async fn run<B: Backend>(
    events: impl Stream<Item = Event> + Send + Unpin,
    limiter: Limiter<B>,
    excess: Excess,
) -> (Handled, StreamStats) {
    let limited = events.rate_limit(limiter, Event::channel_key, excess);
    let stats = limited.stats();
    let mut limited = Box::pin(limited);
    let mut handled = Handled::default();
    while let Some(event) = limited.next().await {
        *handled
            .per_channel
            .entry(event.channel.clone())
            .or_default() += 1;
        handled.events.push(event);
    }
    (handled, stats)
}
