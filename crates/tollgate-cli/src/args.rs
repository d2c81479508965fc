//! The command line.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

const EXIT_CODES: &str = "\
Exit codes:
  0  success
  1  Redis unreachable, timed out or failing
  2  invalid usage, configuration or override (the message names the limiter and the field)
  3  durability: the Redis server is not durable";

const KEYS_HELP: &str = "\
Keys are given as the raw identity and its kind, and stored exactly as the
tower layers store them: --ip (ClientIp: IPv4 and IPv4-mapped addresses per
address, IPv6 by /64 unless --ipv6-prefix says otherwise), --email (an
address with '@': trimmed, lower-cased, hashed), --api-key (trimmed, hashed),
--key (any other id: a channel, a host, an account). A value of '-' is read from standard input, which keeps
secrets out of the shell history.

--email and --api-key are hashed with the services' key secret (HMAC), read
from TOLLGATE_KEY_SECRET or --key-secret-file, or with --unkeyed-hashes if
the services opted out.";

/// Operate tollgate rate limits: inspect and reset keys, change limits at
/// runtime, check Redis durability, validate configuration.
#[derive(Debug, Parser)]
#[command(name = "tollgate", version, after_help = EXIT_CODES)]
pub(crate) struct Cli {
    #[command(flatten)]
    pub(crate) global: Global,
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// Options every command takes.
#[derive(Debug, Clone, Args)]
pub(crate) struct Global {
    /// A TOML configuration file; repeat to layer files (later ones win).
    /// `TOLLGATE_*` environment variables are layered on top, as at start-up.
    #[arg(short = 'c', long = "config", value_name = "FILE", global = true)]
    pub(crate) config: Vec<PathBuf>,
    /// The Redis server (`redis://[user:password@]host:port[/db]`;
    /// `rediss://` with the `tls` feature), or the master of a Redis
    /// Sentinel setup
    /// (`redis+sentinel://[user:password@]host:port[,host:port...]/<master-name>`;
    /// `rediss+sentinel://` with the `tls` feature);
    /// with --cluster, a comma-separated list of nodes [default: the
    /// configuration's `[redis]` section, else redis://127.0.0.1:6379].
    #[arg(
        long,
        env = "REDIS_URL",
        value_name = "URL",
        value_delimiter = ',',
        hide_env_values = true,
        global = true
    )]
    pub(crate) redis_url: Vec<String>,
    /// The URLs are nodes of a Redis Cluster (needs the `cluster` feature).
    #[arg(long, global = true)]
    pub(crate) cluster: bool,
    /// The configuration, once loaded for a command that reaches Redis.
    #[arg(skip)]
    pub(crate) loaded: Option<tollgate_limiter::Config>,
    /// Whether the URLs came from the configuration's `[redis]` section
    /// (then its other settings apply too).
    #[arg(skip)]
    pub(crate) url_from_config: bool,
    /// The key prefix [default: the configuration's `defaults.prefix`, else
    /// `tollgate`].
    #[arg(long, value_name = "PREFIX", global = true)]
    pub(crate) prefix: Option<String>,
    /// How long to wait for Redis (connecting, then each command), e.g. `5s`,
    /// `500ms`.
    #[arg(long, value_name = "DURATION", default_value = "5s",
          value_parser = wait, global = true)]
    pub(crate) timeout: Duration,
    /// Print the result as one JSON document (errors stay text on standard
    /// error; the exit code is the same).
    #[arg(long, global = true)]
    pub(crate) json: bool,
    /// A file holding the services' key secret (one trailing newline is
    /// ignored), for --email and --api-key. Without it, the secret is read
    /// from TOLLGATE_KEY_SECRET, as the services read it.
    #[arg(long, value_name = "FILE", global = true)]
    pub(crate) key_secret_file: Option<PathBuf>,
    /// The services hash emails and API keys without a secret
    /// (`KeyHasher::unkeyed()`, an explicit opt-out).
    #[arg(long, global = true, conflicts_with = "key_secret_file")]
    pub(crate) unkeyed_hashes: bool,
}

/// The commands.
// Parsed once per process: the size of the variants does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Show a key's state under a limiter: limit, remaining, retry-after,
    /// reset-after and any override in force. Consumes nothing.
    #[command(after_help = KEYS_HELP)]
    Inspect(KeyedArgs),
    /// Forget a key: it becomes a fresh key (unblock a user after a false
    /// positive). A per-key override is kept.
    #[command(after_help = KEYS_HELP)]
    Reset(KeyedArgs),
    /// Set, clear or show a runtime override of a limiter's policy, for
    /// every key or for one. Every service sees it on its next decision.
    #[command(subcommand)]
    Override(OverrideCommand),
    /// Check that the Redis server is durable: `appendonly yes` and
    /// `maxmemory-policy noeviction`. Exits 3 when it is not.
    Durability(DurabilityArgs),
    /// Configuration commands.
    #[command(subcommand)]
    Config(ConfigCommand),
}

/// A limiter and one key.
#[derive(Debug, Args)]
pub(crate) struct KeyedArgs {
    /// The limiter, as named in configuration (`[limiters.<name>]`).
    pub(crate) limiter: String,
    #[command(flatten)]
    pub(crate) key: RequiredKey,
    /// Group IPv6 clients by their first N bits, as
    /// `ClientIp::ipv6_prefix(N)` does (default 64, the layer's default;
    /// 128 for `ClientIp::ipv6_per_address`).
    #[arg(long, value_name = "N", requires = "ip",
          value_parser = clap::value_parser!(u8).range(0..=128))]
    pub(crate) ipv6_prefix: Option<u8>,
}

/// Exactly one key.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub(crate) struct RequiredKey {
    /// A client IP address (or an IPv6 network `addr/len`).
    #[arg(long, value_name = "IP")]
    pub(crate) ip: Option<String>,
    /// An email address (normalised and hashed).
    #[arg(long, value_name = "EMAIL")]
    pub(crate) email: Option<String>,
    /// An API key or token (hashed).
    #[arg(long, value_name = "SECRET")]
    pub(crate) api_key: Option<String>,
    /// Any other identifier (channel, host, account), as `Key::new`.
    #[arg(long, value_name = "ID")]
    pub(crate) key: Option<String>,
}

/// At most one key.
#[derive(Debug, Args)]
#[group(required = false, multiple = false)]
pub(crate) struct OptionalKey {
    /// A client IP address (or an IPv6 network `addr/len`).
    #[arg(long, value_name = "IP")]
    pub(crate) ip: Option<String>,
    /// An email address (normalised and hashed).
    #[arg(long, value_name = "EMAIL")]
    pub(crate) email: Option<String>,
    /// An API key or token (hashed).
    #[arg(long, value_name = "SECRET")]
    pub(crate) api_key: Option<String>,
    /// Any other identifier (channel, host, account), as `Key::new`.
    #[arg(long, value_name = "ID")]
    pub(crate) key: Option<String>,
}

/// The override commands.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub(crate) enum OverrideCommand {
    /// Set an override: limiter-wide, or for one key with a key option.
    ///
    /// The new policy is given as flags or as a TOML snippet of the
    /// limiter's fields; fields not given keep their configured values. It
    /// is validated with the configuration's rules, and must use the
    /// limiter's strategy.
    #[command(after_help = "\
Examples:
  tollgate -c tollgate.toml override set api --capacity 500
  tollgate -c tollgate.toml override set api --api-key - --toml 'capacity = 1000
refill = \"1000/min\"'
  tollgate -c tollgate.toml override set login_ip --ip 203.0.113.7 --limit 100
  tollgate -c tollgate.toml override set api --capacity 1000 --for 2h")]
    Set(OverrideSetArgs),
    /// Remove an override (limiter-wide, or one key's).
    Clear(ScopeArgs),
    /// Show the configured policy, the overrides and the policy in force.
    Show(ScopeArgs),
    /// List every override stored (of one limiter, or of all), limiter-wide
    /// and per key, with the time each has left.
    ///
    /// Keys are listed as the store holds them: API keys and emails
    /// hashed (`#s:…`, `#e:…`). It walks the keyspace with `SCAN` (every
    /// master of a cluster): an operator's command, not a probe.
    #[command(after_help = "\
Examples:
  tollgate -c tollgate.toml override list
  tollgate -c tollgate.toml --json override list api")]
    List {
        /// Only this limiter's overrides (a `[limiters.<name>]`, or an
        /// `[adaptive.<name>]`, whose adapted rates are listed).
        limiter: Option<String>,
    },
    /// Mark every limiter that has per-key overrides stored, once, when
    /// upgrading from a version before the marker.
    ///
    /// Per-key overrides stored by such a version have no marker
    /// (`<prefix>:<limiter>:keyed{…}`), and a token-bucket limiter ignores
    /// them until it is set. This walks the keyspace with `SCAN` (every
    /// master of a cluster) and sets the marker of each limiter with a
    /// per-key override; running it again changes nothing.
    #[command(after_help = "\
Examples:
  tollgate -c tollgate.toml override mark
  tollgate --redis-url redis://10.0.0.5:6379 --prefix tollgate --timeout 60s override mark")]
    Mark,
}

/// A limiter and, optionally, one key.
#[derive(Debug, Args)]
pub(crate) struct ScopeArgs {
    /// The limiter, as named in configuration (`[limiters.<name>]`).
    pub(crate) limiter: String,
    #[command(flatten)]
    pub(crate) key: OptionalKey,
    /// Group IPv6 clients by their first N bits, as
    /// `ClientIp::ipv6_prefix(N)` does (default 64, the layer's default;
    /// 128 for `ClientIp::ipv6_per_address`).
    #[arg(long, value_name = "N", requires = "ip",
          value_parser = clap::value_parser!(u8).range(0..=128))]
    pub(crate) ipv6_prefix: Option<u8>,
}

/// `override set`.
#[derive(Debug, Args)]
pub(crate) struct OverrideSetArgs {
    #[command(flatten)]
    pub(crate) scope: ScopeArgs,
    #[command(flatten)]
    pub(crate) policy: PolicyFlags,
    /// The policy as a TOML snippet of the limiter's fields, e.g.
    /// `capacity = 500` (no table header).
    #[arg(long, value_name = "TOML", conflicts_with = "PolicyFlags")]
    pub(crate) toml: Option<String>,
    /// Keep the override only this long, e.g. `2h`: then the store forgets
    /// it and what was in force before rules again. Without it, the
    /// override stays until cleared.
    #[arg(long = "for", value_name = "DURATION", value_parser = lifetime)]
    pub(crate) ttl: Option<Duration>,
}

/// A policy as flags; the names are the configuration's fields.
#[derive(Debug, Args)]
#[group(required = false, multiple = true)]
pub(crate) struct PolicyFlags {
    /// Token bucket: the peak burst.
    #[arg(long, value_name = "N", help_heading = "Policy")]
    pub(crate) capacity: Option<u64>,
    /// Token bucket: the refill rate, e.g. `60/min`, `10/s`.
    #[arg(long, value_name = "RATE", help_heading = "Policy")]
    pub(crate) refill: Option<String>,
    /// Sliding window, calendar quota: the most cost per window.
    #[arg(long, value_name = "N", help_heading = "Policy")]
    pub(crate) limit: Option<u64>,
    /// Calendar quota: `day`, `week` (ISO, from Monday) or `month`.
    #[arg(long, value_name = "PERIOD", help_heading = "Policy")]
    pub(crate) period: Option<String>,
    /// Calendar quota: the IANA time zone, e.g. `Europe/Berlin`.
    #[arg(long, value_name = "ZONE", help_heading = "Policy")]
    pub(crate) time_zone: Option<String>,
    /// Sliding window: the window, e.g. `15m`.
    #[arg(long, value_name = "DURATION", help_heading = "Policy")]
    pub(crate) window: Option<String>,
    /// Sliding window: record refused requests too.
    #[arg(long, value_name = "BOOL", help_heading = "Policy")]
    pub(crate) penalise_refused: Option<bool>,
    /// Progressive delay: failures before the first delay.
    #[arg(long, value_name = "N", help_heading = "Policy")]
    pub(crate) free_attempts: Option<u64>,
    /// Progressive delay: the first delay, e.g. `1s`.
    #[arg(long, value_name = "DURATION", help_heading = "Policy")]
    pub(crate) base_delay: Option<String>,
    /// Progressive delay: the growth factor of successive delays.
    #[arg(long, value_name = "N", help_heading = "Policy")]
    pub(crate) factor: Option<u64>,
    /// Progressive delay: the longest delay.
    #[arg(long, value_name = "DURATION", help_heading = "Policy")]
    pub(crate) max_delay: Option<String>,
    /// Progressive delay: how long failures are remembered.
    #[arg(long, value_name = "DURATION", help_heading = "Policy")]
    pub(crate) forget_after: Option<String>,
}

impl PolicyFlags {
    /// The flags given, as TOML lines (`field = value`).
    pub(crate) fn to_toml(&self) -> String {
        let mut lines = Vec::new();
        let mut num = |name: &str, v: Option<u64>| {
            if let Some(v) = v {
                lines.push(format!("{name} = {v}"));
            }
        };
        num("capacity", self.capacity);
        num("limit", self.limit);
        num("free_attempts", self.free_attempts);
        num("factor", self.factor);
        for (name, v) in [
            ("refill", &self.refill),
            ("window", &self.window),
            ("base_delay", &self.base_delay),
            ("max_delay", &self.max_delay),
            ("forget_after", &self.forget_after),
            ("period", &self.period),
            ("time_zone", &self.time_zone),
        ] {
            if let Some(v) = v {
                lines.push(format!("{name} = {}", crate::render::toml_string(v)));
            }
        }
        if let Some(b) = self.penalise_refused {
            lines.push(format!("penalise_refused = {b}"));
        }
        lines.join("\n")
    }
}

/// `durability`.
#[derive(Debug, Args)]
pub(crate) struct DurabilityArgs {
    /// Also fail (exit 3) when a setting cannot be read (`CONFIG` renamed or
    /// denied), like `Durability::Strict` at start-up.
    #[arg(long)]
    pub(crate) strict: bool,
}

/// The config commands.
#[derive(Debug, Subcommand)]
pub(crate) enum ConfigCommand {
    /// Load the configuration (files, then `TOLLGATE_*` variables) and
    /// validate it with the start-up rules; exit 2 with an error naming the
    /// limiter and the field.
    Validate(ValidateArgs),
}

/// `config validate`.
#[derive(Debug, Args)]
pub(crate) struct ValidateArgs {
    /// Configuration files, layered in order after any `--config` ones.
    #[arg(value_name = "FILE")]
    pub(crate) files: Vec<PathBuf>,
}

impl Global {
    /// `--redis-url` splits on commas (a cluster's nodes), but a Sentinel
    /// URL lists its sentinels with commas too: puts it back together.
    pub(crate) fn rejoin_sentinel_url(&mut self) {
        let sentinel = self.redis_url.first().is_some_and(|u| {
            let u = u.trim().to_ascii_lowercase();
            u.starts_with("redis+sentinel://") || u.starts_with("rediss+sentinel://")
        });
        if sentinel && self.redis_url.len() > 1 {
            self.redis_url = vec![self.redis_url.join(",")];
        }
    }
}

/// `--timeout`: a wait of zero would fail every connection and command
/// before it is sent.
fn wait(s: &str) -> Result<Duration, String> {
    match humantime::parse_duration(s).map_err(|e| e.to_string())? {
        d if d.is_zero() => Err("must be above zero".into()),
        d => Ok(d),
    }
}

/// `--for`: Redis keeps expiries in whole milliseconds.
fn lifetime(s: &str) -> Result<Duration, String> {
    match humantime::parse_duration(s).map_err(|e| e.to_string())? {
        d if d < Duration::from_millis(1) => Err("must be at least 1ms".into()),
        d => Ok(d),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn flags_become_toml() {
        let cli = Cli::try_parse_from([
            "tollgate",
            "override",
            "set",
            "api",
            "--capacity",
            "5",
            "--refill",
            "10/s",
        ])
        .unwrap();
        let Command::Override(OverrideCommand::Set(set)) = cli.command else {
            panic!("wrong command");
        };
        assert_eq!(set.policy.to_toml(), "capacity = 5\nrefill = \"10/s\"");
    }

    #[test]
    fn toml_conflicts_with_flags() {
        let r = Cli::try_parse_from([
            "tollgate",
            "override",
            "set",
            "api",
            "--capacity",
            "5",
            "--toml",
            "capacity = 5",
        ]);
        assert!(r.is_err());
    }

    #[test]
    fn a_zero_timeout_is_refused() {
        let Err(e) = Cli::try_parse_from([
            "tollgate",
            "--timeout",
            "0s",
            "inspect",
            "api",
            "--key",
            "x",
        ]) else {
            panic!("a zero timeout was accepted");
        };
        assert!(e.to_string().contains("must be above zero"), "{e}");
        assert!(
            Cli::try_parse_from([
                "tollgate",
                "--timeout",
                "1ms",
                "inspect",
                "api",
                "--key",
                "x"
            ])
            .is_ok()
        );
    }

    #[test]
    fn one_key_only() {
        let r = Cli::try_parse_from([
            "tollgate", "inspect", "api", "--ip", "1.2.3.4", "--key", "x",
        ]);
        assert!(r.is_err());
        let r = Cli::try_parse_from(["tollgate", "inspect", "api"]);
        assert!(r.is_err());
    }
}
