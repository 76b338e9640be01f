//! Limiter room, configuration: the `[limiter]` section, which store keeps the tenants'
//! buckets (this process, or Redis shared by several gateway replicas) and what happens when
//! the shared store cannot be reached. Read at startup only: a change needs a restart.

use anyhow::bail;
use serde::Deserialize;
use std::time::Duration;

/// Where the buckets live.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StoreKind {
    /// In this process: one gateway (N replicas would admit N times the limits).
    #[default]
    Local,
    /// In Redis (or Valkey), shared by every replica that names the same server and prefix.
    Redis,
}

/// What a gateway with `store = "redis"` does while Redis cannot be reached.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnStoreError {
    /// Refuse every request with 503 `limiter_unavailable` (no overshoot; no service).
    #[default]
    FailClosed,
    /// Admit every request unlimited (service; no limit at all while it lasts).
    FailOpen,
    /// Limit in this process with each rate (and so each capacity) divided by
    /// `expected_replicas` (the replicas together admit about the limits).
    Local,
}

/// The `[limiter]` section.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimiterConfig {
    /// `local` (default) or `redis`.
    #[serde(default)]
    pub store: StoreKind,
    /// `redis://[user:password@]host:port[/db]`, required with `store = "redis"`.
    #[serde(default)]
    pub redis_url: Option<String>,
    /// Prefix of every key (`PREFIX{tenant}`); replicas that share limits use the same one.
    #[serde(default = "default_key_prefix")]
    pub key_prefix: String,
    /// Time allowed to open a connection to Redis.
    #[serde(default = "default_connect_timeout", with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Time allowed for one command's answer.
    #[serde(default = "default_command_timeout", with = "humantime_serde")]
    pub command_timeout: Duration,
    /// How long a charge's lease record lives: a reservation that settles later (a longer
    /// stream) gets nothing back, as does one of a replica that died.
    #[serde(default = "default_lease_ttl", with = "humantime_serde")]
    pub lease_ttl: Duration,
    /// What happens while Redis cannot be reached.
    #[serde(default)]
    pub on_store_error: OnStoreError,
    /// The number of replicas sharing the limits: with `on_store_error = "local"`, each
    /// limits alone at rates divided by it.
    #[serde(default)]
    pub expected_replicas: Option<u32>,
    /// After a failure, how often Redis is tried again (requests meanwhile get the policy at
    /// once instead of waiting for a timeout each).
    #[serde(default = "default_retry_interval", with = "humantime_serde")]
    pub retry_interval: Duration,
    /// Consecutive failed commands (errors or timeouts) before the store is marked down and
    /// `on_store_error` decides for every request; a command that answers starts the count
    /// again. The request whose command failed gets the policy's answer either way.
    #[serde(default = "default_failures_before_down")]
    pub failures_before_down: u32,
    /// With `store = "redis"` the KV ledger is shared too: a replica that stops renewing its
    /// leases for this long (it died, or cannot reach Redis) has them taken back. A live
    /// replica renews them every third of it.
    #[serde(default = "default_kv_lease_ttl", with = "humantime_serde")]
    pub kv_lease_ttl: Duration,
    /// While requests wait for KV space, how often the shared ledger is read again for room
    /// another replica freed (room this replica frees is handed out at once).
    #[serde(default = "default_kv_recheck_interval", with = "humantime_serde")]
    pub kv_recheck_interval: Duration,
    /// With `store = "redis"`: admit from slices of each tenant's budget leased to this
    /// replica, going to Redis only for the next slice (see [`LocalFirst`]). Absent: every
    /// charge is a round trip.
    #[serde(default)]
    pub local_first: Option<LocalFirst>,
    /// What a prompt token the backend's prefix cache held is charged to the prefill bucket,
    /// as a share of a token, when the backend says how many it held
    /// (`usage.prompt_tokens_details.cached_tokens`): the bucket models compute, and a cached
    /// token needs next to none. 1 charges them in full.
    #[serde(default = "default_cached_prefill_weight")]
    pub cached_prefill_weight: f64,
}

/// `[limiter] local_first = { slice = 0.05, return_after = "5s" }`: each replica leases from
/// Redis a slice of every bucket of a tenant (`slice` x its capacity), all-or-nothing by the
/// bucket script, and admits from it here until it is spent. Still no overshoot; the price is
/// capacity held idle: at most `slice` x capacity per replica, tenant and bucket.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LocalFirst {
    /// A slice, as a fraction of each bucket's capacity (0 < slice <= 1).
    pub slice: f64,
    /// A slice untouched this long is given back to Redis (the capacity no longer idles here).
    #[serde(default = "default_return_after", with = "humantime_serde")]
    pub return_after: Duration,
}

impl Default for LimiterConfig {
    fn default() -> Self {
        Self {
            store: StoreKind::Local,
            redis_url: None,
            key_prefix: default_key_prefix(),
            connect_timeout: default_connect_timeout(),
            command_timeout: default_command_timeout(),
            lease_ttl: default_lease_ttl(),
            on_store_error: OnStoreError::FailClosed,
            expected_replicas: None,
            retry_interval: default_retry_interval(),
            failures_before_down: default_failures_before_down(),
            kv_lease_ttl: default_kv_lease_ttl(),
            kv_recheck_interval: default_kv_recheck_interval(),
            local_first: None,
            cached_prefill_weight: default_cached_prefill_weight(),
        }
    }
}

fn default_key_prefix() -> String {
    "tokengate:".to_string()
}
fn default_connect_timeout() -> Duration {
    Duration::from_millis(500)
}
fn default_command_timeout() -> Duration {
    Duration::from_millis(250)
}
fn default_lease_ttl() -> Duration {
    Duration::from_secs(3600)
}
fn default_retry_interval() -> Duration {
    Duration::from_secs(1)
}
/// One slow answer (a fork for a snapshot, a long script of another client) is no outage; three
/// in a row are as much as a request path should pay before the policy takes over.
fn default_failures_before_down() -> u32 {
    3
}
fn default_kv_lease_ttl() -> Duration {
    Duration::from_secs(10)
}
fn default_kv_recheck_interval() -> Duration {
    Duration::from_millis(50)
}
fn default_cached_prefill_weight() -> f64 {
    0.1
}
fn default_return_after() -> Duration {
    Duration::from_secs(5)
}

impl LimiterConfig {
    /// Checks the section; the message names the field.
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.key_prefix.contains(['{', '}']) {
            bail!(
                "limiter.key_prefix `{}` must not contain `{{` or `}}`: the keys' hash tag is the tenant name",
                self.key_prefix
            );
        }
        for (field, d) in [
            ("connect_timeout", self.connect_timeout),
            ("command_timeout", self.command_timeout),
            ("retry_interval", self.retry_interval),
            ("kv_recheck_interval", self.kv_recheck_interval),
        ] {
            if d.is_zero() {
                bail!("limiter.{field} must be positive");
            }
        }
        if self.failures_before_down == 0 {
            bail!("limiter.failures_before_down must be at least 1");
        }
        if !(0.0..=1.0).contains(&self.cached_prefill_weight) {
            bail!(
                "limiter.cached_prefill_weight must be in [0, 1], the share of a token a cached prompt token is charged (it is {})",
                self.cached_prefill_weight
            );
        }
        if self.lease_ttl < Duration::from_secs(1) {
            bail!(
                "limiter.lease_ttl must be at least 1s (it is {}): a reservation settling later gets nothing back",
                humantime::format_duration(self.lease_ttl)
            );
        }
        if self.kv_lease_ttl < Duration::from_secs(1) {
            bail!(
                "limiter.kv_lease_ttl must be at least 1s (it is {}): a live replica renews its KV leases every third of it",
                humantime::format_duration(self.kv_lease_ttl)
            );
        }
        match (self.on_store_error, self.expected_replicas) {
            (OnStoreError::Local, None) => bail!(
                "limiter.on_store_error = \"local\" needs limiter.expected_replicas (each replica then limits alone at the rates divided by it)"
            ),
            (OnStoreError::Local, Some(0)) => bail!("limiter.expected_replicas must be at least 1"),
            (OnStoreError::FailClosed | OnStoreError::FailOpen, Some(n)) => bail!(
                "limiter.expected_replicas ({n}) is only used with on_store_error = \"local\""
            ),
            _ => {}
        }
        if let Some(lf) = &self.local_first {
            if self.store != StoreKind::Redis {
                bail!("limiter.local_first needs limiter.store = \"redis\" (a local store has no round trip to save)");
            }
            if !(lf.slice > 0.0 && lf.slice <= 1.0) {
                bail!(
                    "limiter.local_first.slice must be in (0, 1], a fraction of each bucket's capacity (it is {})",
                    lf.slice
                );
            }
            if lf.return_after.is_zero() {
                bail!("limiter.local_first.return_after must be positive");
            }
        }
        match (self.store, &self.redis_url) {
            (StoreKind::Local, Some(url)) => bail!(
                "limiter.redis_url is set (`{url}`) but limiter.store is \"local\": set store = \"redis\" to share the limits through it, or remove it"
            ),
            (StoreKind::Local, None) => Ok(()),
            (StoreKind::Redis, None) => bail!(
                "limiter.store = \"redis\" needs limiter.redis_url (redis://HOST:PORT)"
            ),
            (StoreKind::Redis, Some(url)) => {
                if !url.starts_with("redis://") {
                    bail!("limiter.redis_url `{url}` must be redis://[user:password@]HOST:PORT[/DB] (TLS, rediss://, is not supported)");
                }
                match redis::Client::open(url.as_str()) {
                    Ok(_) => Ok(()),
                    Err(e) => bail!("limiter.redis_url `{url}` is not a Redis URL: {e}"),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> anyhow::Result<LimiterConfig> {
        let c: LimiterConfig = toml::from_str(text)?;
        c.validate()?;
        Ok(c)
    }

    fn error(text: &str) -> String {
        format!("{:#}", parse(text).expect_err("invalid"))
    }

    #[test]
    fn defaults_are_a_local_store() {
        let c = parse("").expect("empty section");
        assert_eq!(c, LimiterConfig::default());
        assert_eq!(c.store, StoreKind::Local);
    }

    #[test]
    fn a_redis_store_with_every_field() {
        let c = parse(
            r#"
store = "redis"
redis_url = "redis://:secret@127.0.0.1:6379/2"
key_prefix = "prod:"
connect_timeout = "1s"
command_timeout = "100ms"
lease_ttl = "30m"
on_store_error = "local"
expected_replicas = 3
retry_interval = "2s"
kv_lease_ttl = "5s"
kv_recheck_interval = "20ms"
local_first = { slice = 0.05, return_after = "2s" }
cached_prefill_weight = 0.25
"#,
        )
        .expect("valid");
        assert_eq!(c.on_store_error, OnStoreError::Local);
        assert_eq!(c.expected_replicas, Some(3));
        assert_eq!(c.command_timeout, Duration::from_millis(100));
        assert_eq!(c.lease_ttl, Duration::from_secs(1800));
        assert_eq!(c.cached_prefill_weight, 0.25);
        assert_eq!(
            (c.kv_lease_ttl, c.kv_recheck_interval),
            (Duration::from_secs(5), Duration::from_millis(20))
        );
        assert_eq!(
            c.local_first,
            Some(LocalFirst {
                slice: 0.05,
                return_after: Duration::from_secs(2)
            })
        );
        let c =
            parse("store = \"redis\"\nredis_url = \"redis://h:1\"\nlocal_first = { slice = 1 }")
                .expect("valid");
        assert_eq!(
            c.local_first.map(|l| l.return_after),
            Some(Duration::from_secs(5))
        );
    }

    #[test]
    fn errors_name_the_field() {
        assert_eq!(
            error(r#"store = "redis""#),
            "limiter.store = \"redis\" needs limiter.redis_url (redis://HOST:PORT)"
        );
        assert!(error(r#"redis_url = "redis://h:1""#).starts_with("limiter.redis_url is set"));
        assert!(error("store = \"redis\"\nredis_url = \"rediss://h:1\"")
            .contains("TLS, rediss://, is not supported"));
        assert!(
            error("store = \"redis\"\nredis_url = \"redis://h:notaport\"")
                .starts_with("limiter.redis_url `redis://h:notaport` is not a Redis URL")
        );
        let redis = "store = \"redis\"\nredis_url = \"redis://127.0.0.1:6379\"\n";
        assert!(error(&format!("{redis}key_prefix = \"a{{b\""))
            .starts_with("limiter.key_prefix `a{b` must not contain"));
        assert_eq!(
            error(&format!("{redis}command_timeout = \"0s\"")),
            "limiter.command_timeout must be positive"
        );
        assert!(error(&format!("{redis}kv_lease_ttl = \"900ms\""))
            .starts_with("limiter.kv_lease_ttl must be at least 1s (it is 900ms)"));
        assert!(error(&format!("{redis}lease_ttl = \"500ms\""))
            .starts_with("limiter.lease_ttl must be at least 1s (it is 500ms)"));
        assert!(error(&format!("{redis}on_store_error = \"local\""))
            .starts_with("limiter.on_store_error = \"local\" needs limiter.expected_replicas"));
        assert_eq!(
            error(&format!(
                "{redis}on_store_error = \"local\"\nexpected_replicas = 0"
            )),
            "limiter.expected_replicas must be at least 1"
        );
        assert!(error(&format!("{redis}expected_replicas = 2"))
            .starts_with("limiter.expected_replicas (2) is only used with"));
        assert!(error(&format!("{redis}on_store_error = \"ignore\"")).contains("unknown variant"));
        assert!(error("stor = \"redis\"").contains("unknown field `stor`"));
        for (weight, shown) in [("1.5", "1.5"), ("-0.1", "-0.1"), ("nan", "NaN")] {
            assert_eq!(
                error(&format!("cached_prefill_weight = {weight}")),
                format!("limiter.cached_prefill_weight must be in [0, 1], the share of a token a cached prompt token is charged (it is {shown})"),
            );
        }
        assert_eq!(
            parse("cached_prefill_weight = 1")
                .unwrap()
                .cached_prefill_weight,
            1.0
        );
        assert!(error("local_first = { slice = 0.1 }")
            .starts_with("limiter.local_first needs limiter.store = \"redis\""));
        for slice in ["0", "1.5", "-0.1", "nan"] {
            assert!(
                error(&format!("{redis}local_first = {{ slice = {slice} }}"))
                    .starts_with("limiter.local_first.slice must be in (0, 1]"),
                "{slice}"
            );
        }
        assert_eq!(
            error(&format!(
                "{redis}local_first = {{ slice = 0.1, return_after = \"0s\" }}"
            )),
            "limiter.local_first.return_after must be positive"
        );
        assert!(error(&format!("{redis}local_first = {{ slic = 0.1 }}"))
            .contains("unknown field `slic`"));
    }
}
