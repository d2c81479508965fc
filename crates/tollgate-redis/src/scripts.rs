//! The Lua scripts, one per strategy, each prefixed with the shared helpers
//! of `lua/common.lua`, then those of the `lua/common_*.lua` it calls (a
//! script builds every helper it holds on every call, ~450 instructions
//! each); the token bucket's acquire path comes before `common.lua`, so it
//! runs without building those helpers (see `lua/token_bucket.lua`).

use std::sync::LazyLock;

use redis::Script;
use tollgate_limiter::Strategy;

/// `lua/common.lua`, then the files named, in order.
macro_rules! code {
    ($($file:literal),+) => {
        concat!(
            include_str!("../lua/common.lua"),
            $(include_str!(concat!("../lua/", $file))),+
        )
    };
}

/// The token-bucket script's source.
pub(crate) const TOKEN_BUCKET_CODE: &str = concat!(
    include_str!("../lua/token_bucket.lua"),
    code!("common_bucket.lua", "token_bucket_ops.lua")
);
/// The sliding-window script's source.
pub(crate) const SLIDING_WINDOW_CODE: &str = code!("common_window.lua", "sliding_window.lua");
/// The progressive-delay script's source.
pub(crate) const PROGRESSIVE_DELAY_CODE: &str = code!("progressive_delay.lua");
/// The composite script's source.
pub(crate) const COMPOSITE_CODE: &str = code!(
    "common_window.lua",
    "common_bucket.lua",
    "common_calendar.lua",
    "composite.lua"
);
/// The calendar script's source.
pub(crate) const CALENDAR_CODE: &str = code!("common_calendar.lua", "calendar.lua");
/// The concurrency script's source.
pub(crate) const CONCURRENCY_CODE: &str = code!("concurrency.lua");

/// The compare-and-set of an override's source (one `GET`, one `SET`: no
/// shared helpers).
pub(crate) const REPLACE_OVERRIDE_CODE: &str = include_str!("../lua/replace_override.lua");

static TOKEN_BUCKET: LazyLock<Script> = LazyLock::new(|| Script::new(TOKEN_BUCKET_CODE));
static SLIDING_WINDOW: LazyLock<Script> = LazyLock::new(|| Script::new(SLIDING_WINDOW_CODE));
static PROGRESSIVE_DELAY: LazyLock<Script> = LazyLock::new(|| Script::new(PROGRESSIVE_DELAY_CODE));
static COMPOSITE: LazyLock<Script> = LazyLock::new(|| Script::new(COMPOSITE_CODE));
static CALENDAR: LazyLock<Script> = LazyLock::new(|| Script::new(CALENDAR_CODE));
static CONCURRENCY: LazyLock<Script> = LazyLock::new(|| Script::new(CONCURRENCY_CODE));
/// [`REPLACE_OVERRIDE_CODE`] as a script.
pub(crate) static REPLACE_OVERRIDE: LazyLock<Script> =
    LazyLock::new(|| Script::new(REPLACE_OVERRIDE_CODE));

/// The script deciding for `strategy`.
pub(crate) fn for_strategy(strategy: Strategy) -> &'static Script {
    match strategy {
        Strategy::TokenBucket => &TOKEN_BUCKET,
        Strategy::SlidingWindow => &SLIDING_WINDOW,
        Strategy::ProgressiveDelay => &PROGRESSIVE_DELAY,
        Strategy::Composite => &COMPOSITE,
        Strategy::Calendar => &CALENDAR,
        Strategy::Concurrency => &CONCURRENCY,
    }
}

/// The source of the script deciding for `strategy` (what the load tool
/// sends through a bare client).
pub fn source(strategy: Strategy) -> &'static str {
    match strategy {
        Strategy::TokenBucket => TOKEN_BUCKET_CODE,
        Strategy::SlidingWindow => SLIDING_WINDOW_CODE,
        Strategy::ProgressiveDelay => PROGRESSIVE_DELAY_CODE,
        Strategy::Composite => COMPOSITE_CODE,
        Strategy::Calendar => CALENDAR_CODE,
        Strategy::Concurrency => CONCURRENCY_CODE,
    }
}

/// The strategy a script letter names.
pub(crate) fn strategy_of(letter: &str) -> Option<Strategy> {
    match letter {
        "t" => Some(Strategy::TokenBucket),
        "w" => Some(Strategy::SlidingWindow),
        "p" => Some(Strategy::ProgressiveDelay),
        "c" => Some(Strategy::Composite),
        "q" => Some(Strategy::Calendar),
        "n" => Some(Strategy::Concurrency),
        _ => None,
    }
}

/// Every script's source, to preload.
pub(crate) const ALL: [&str; 7] = [
    TOKEN_BUCKET_CODE,
    SLIDING_WINDOW_CODE,
    PROGRESSIVE_DELAY_CODE,
    COMPOSITE_CODE,
    CALENDAR_CODE,
    CONCURRENCY_CODE,
    REPLACE_OVERRIDE_CODE,
];
