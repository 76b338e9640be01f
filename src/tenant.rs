//! API key -> tenant. Keys are kept only as sha256 digests, found by their first 8 bytes in a
//! hash map (constant time in the number of keys) and confirmed by comparing the whole digest in
//! constant time. What timing could tell is only whether some stored digest starts like the
//! presented key's: steering that takes a sha256 preimage, so neither a key nor which tenant
//! nearly matched leaks.

use crate::admission::Priority;
use crate::config::{TenantConfig, ValidConfig};
use crate::digest::hash_key;
use crate::error_code::ErrorCode;
use crate::limiter::{BucketSpec, TenantLimits};
use crate::metrics::TenantMetrics;
use crate::quota::config::TenantQuotas;
use http::HeaderMap;
use prometheus_client::metrics::gauge::Gauge;
use rustc_hash::FxHashMap;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use subtle::ConstantTimeEq;

/// A tenant: its name, its buckets' sizes and its metric series.
#[derive(Debug, Clone)]
pub struct Tenant {
    /// Name used in metrics, logs and the admin API.
    pub name: String,
    /// Its three buckets.
    pub limits: TenantLimits,
    /// Its class in the KV queue (a request may lower it, never raise it).
    pub priority: Priority,
    /// How many of its requests may be in flight, and queued for KV, at once.
    pub caps: Caps,
    /// Its requests in flight now: one count per tenant, which the tenant built by a reload
    /// takes over (see [`TenantDirectory::succeeding`]).
    pub in_flight: Arc<InFlight>,
    /// Its series of the per-tenant metrics, looked up once.
    pub metrics: TenantMetrics,
    /// Its quotas (none by default).
    pub quotas: Arc<TenantQuotas>,
    /// The `cache_salt` its requests are sent with (see [`crate::cache_salt`]); `None`: it
    /// shares the engine's prefix cache.
    pub cache_salt: Option<String>,
}

impl Tenant {
    /// The tenant called `name` with `limits`.
    pub fn new(name: impl Into<String>, limits: TenantLimits) -> Self {
        let name = name.into();
        Self {
            metrics: TenantMetrics::new(&name),
            name,
            limits,
            priority: Priority::default(),
            caps: Caps::default(),
            in_flight: Arc::default(),
            quotas: Arc::default(),
            cache_salt: None,
        }
    }

    /// The same tenant with `quotas`.
    pub fn with_quotas(mut self, quotas: Arc<TenantQuotas>) -> Self {
        self.quotas = quotas;
        self
    }

    /// The same tenant in class `priority`.
    pub fn with_priority(mut self, priority: Priority) -> Self {
        self.priority = priority;
        self
    }

    /// The same tenant under `caps`.
    pub fn with_caps(mut self, caps: Caps) -> Self {
        self.caps = caps;
        self
    }
}

/// A tenant's concurrency caps (`tenants[].max_inflight`, `max_queued`); `None`: no cap.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Caps {
    /// Most requests charged and not yet settled.
    pub max_inflight: Option<u32>,
    /// Most places in the KV queue.
    pub max_queued: Option<u32>,
}

/// A tenant's requests in flight: charged and not yet settled (queued for KV or running). Per
/// gateway process: replicas sharing a Redis each count their own.
#[derive(Debug, Default)]
pub struct InFlight(AtomicU32);

impl InFlight {
    /// One more request in flight, unless `max` already are: then how many are (the count is
    /// not changed). The returned place goes back when it is dropped; `gauge` (the tenant's
    /// `inflight_requests`) follows the count.
    pub fn enter(
        self: &Arc<Self>,
        max: Option<u32>,
        gauge: Option<Gauge>,
    ) -> Result<InFlightPlace, u32> {
        let max = max.unwrap_or(u32::MAX);
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })?;
        if let Some(g) = &gauge {
            g.inc();
        }
        Ok(InFlightPlace {
            count: self.clone(),
            gauge,
        })
    }

    /// Requests in flight now.
    pub fn current(&self) -> u32 {
        self.0.load(Ordering::Acquire)
    }
}

/// One request's place in its tenant's [`InFlight`]; dropping it gives the place back (the
/// request's [`crate::settle::Ticket`] holds it, so every way a request ends does).
#[derive(Debug)]
pub struct InFlightPlace {
    count: Arc<InFlight>,
    gauge: Option<Gauge>,
}

impl Drop for InFlightPlace {
    fn drop(&mut self) {
        self.count.0.fetch_sub(1, Ordering::AcqRel);
        if let Some(g) = &self.gauge {
            g.dec();
        }
    }
}

/// What a bearer credential is called in a refusal, and the code of the 401 that refuses it.
#[derive(Debug)]
pub struct BearerKind {
    /// Its name in messages (`API key`).
    pub name: &'static str,
    /// The placeholder in `Authorization: Bearer KEY`.
    pub placeholder: &'static str,
    /// The 401's code.
    pub code: ErrorCode,
}

/// A credential refused: a 401 with this code and message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Unauthenticated {
    /// `invalid_api_key` or `invalid_admin_token`.
    pub code: ErrorCode,
    /// What is wrong with the credential.
    pub message: String,
}

/// The header Anthropic's clients send their API key in.
const X_API_KEY: &str = "x-api-key";

/// A tenant's API key.
pub const API_KEY: BearerKind = BearerKind {
    name: "API key",
    placeholder: "KEY",
    code: ErrorCode::InvalidApiKey,
};

/// The credential in `Authorization: Bearer CREDENTIAL`, or the 401 of `kind` saying what is
/// wrong with the header.
pub fn bearer<'h>(headers: &'h HeaderMap, kind: &BearerKind) -> Result<&'h str, Unauthenticated> {
    let BearerKind {
        name,
        placeholder,
        code,
    } = kind;
    let refuse = |message: String| Unauthenticated {
        code: *code,
        message,
    };
    let value = headers
        .get(http::header::AUTHORIZATION)
        .ok_or_else(|| {
            refuse(format!(
                "missing {name}: send it as `Authorization: Bearer {placeholder}`"
            ))
        })?
        .to_str()
        .map_err(|_| refuse("the Authorization header is not ASCII".to_string()))?;
    value
        .strip_prefix("Bearer ")
        .or_else(|| value.strip_prefix("bearer "))
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .ok_or_else(|| {
            refuse(format!(
                "the Authorization header must be `Bearer {placeholder}`"
            ))
        })
}

/// The first 8 bytes of a digest: the key of [`TenantDirectory`]'s map.
fn prefix(digest: &[u8; 32]) -> u64 {
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_le_bytes(first)
}

/// Every tenant, by name and by the digests of its keys.
#[derive(Debug)]
pub struct TenantDirectory {
    tenants: Vec<Arc<Tenant>>,
    by_name: HashMap<String, usize>,
    /// Digests (with their tenant's index) by their first 8 bytes; sha256 output is uniform,
    /// so a list holds more than one digest only by a 2^-64 chance.
    keys: FxHashMap<u64, Vec<([u8; 32], usize)>>,
}

impl TenantDirectory {
    /// Builds the directory of a config's tenants.
    pub fn from_config(config: &ValidConfig) -> Self {
        Self::build(config, None)
    }

    /// The directory of a reloaded config: a tenant that `previous` has too keeps its requests
    /// in flight (counted against its caps as they are now).
    pub fn succeeding(config: &ValidConfig, previous: &TenantDirectory) -> Self {
        Self::build(config, Some(previous))
    }

    fn build(config: &ValidConfig, previous: Option<&TenantDirectory>) -> Self {
        let mut tenants = Vec::with_capacity(config.tenants.len());
        let mut keys: FxHashMap<u64, Vec<([u8; 32], usize)>> = FxHashMap::default();
        for (i, (t, digests)) in config.tenants_with_keys().enumerate() {
            let caps = Caps {
                max_inflight: t.max_inflight,
                max_queued: t.max_queued,
            };
            let mut tenant = Tenant::new(t.name.clone(), limits_of(t))
                .with_priority(t.priority)
                .with_caps(caps)
                .with_quotas(t.quota_meters.clone());
            tenant.cache_salt = config.prefix_cache.salt_of(&t.name, t.prefix_cache);
            if let Some(kept) = previous.and_then(|p| p.named(&t.name)) {
                tenant.in_flight = kept.in_flight.clone();
            }
            tenants.push(Arc::new(tenant));
            for &digest in digests {
                keys.entry(prefix(&digest)).or_default().push((digest, i));
            }
        }
        let by_name = (tenants.iter().enumerate())
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Self {
            tenants,
            by_name,
            keys,
        }
    }

    /// All tenants, in config order.
    pub fn tenants(&self) -> &[Arc<Tenant>] {
        &self.tenants
    }

    /// The tenant called `name`, if there is one.
    pub fn named(&self, name: &str) -> Option<&Arc<Tenant>> {
        self.by_name.get(name).map(|&i| &self.tenants[i])
    }

    /// The tenant whose key is in `Authorization: Bearer KEY`, or in `x-api-key: KEY` (how
    /// Anthropic's clients send it) when there is no `Authorization`; else 401.
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<Arc<Tenant>, Unauthenticated> {
        let key = match headers.get(X_API_KEY) {
            Some(key) if !headers.contains_key(http::header::AUTHORIZATION) => key
                .to_str()
                .ok()
                .map(str::trim)
                .filter(|k| !k.is_empty())
                .ok_or_else(|| Unauthenticated {
                    code: ErrorCode::InvalidApiKey,
                    message: "the x-api-key header must be the API key, in ASCII".to_string(),
                })?,
            _ => bearer(headers, &API_KEY)?,
        };
        let digest = hash_key(key);
        // The candidates share the digest's first 8 bytes; each is compared whole in constant
        // time, all of them whatever matches.
        let mut found = usize::MAX;
        for (stored, idx) in self.keys.get(&prefix(&digest)).into_iter().flatten() {
            if bool::from(stored.ct_eq(&digest)) {
                found = *idx;
            }
        }
        self.tenants
            .get(found)
            .cloned()
            .ok_or_else(|| Unauthenticated {
                code: ErrorCode::InvalidApiKey,
                message: "incorrect API key provided".to_string(),
            })
    }
}

/// The three bucket specs of a tenant's config.
pub fn limits_of(t: &TenantConfig) -> TenantLimits {
    let spec = |rate: f64| BucketSpec {
        rate_per_second: rate,
        burst_seconds: t.burst_seconds,
    };
    let rates = t.rates();
    TenantLimits {
        prefill: spec(rates.prefill_tokens_per_second),
        decode: spec(rates.decode_tokens_per_second),
        requests: spec(rates.requests_per_second),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn tenant(name: &str, keys: &[&str], hashed: &[&str]) -> TenantConfig {
        TenantConfig {
            name: name.into(),
            api_keys: keys.iter().map(|s| s.to_string()).collect(),
            api_key_sha256: hashed.iter().map(|s| s.to_string()).collect(),
            prefill_tokens_per_second: Some(100.0),
            decode_tokens_per_second: Some(10.0),
            requests_per_second: Some(1.0),
            burst_seconds: 5.0,
            share: None,
            derived: None,
            priority: Priority::Standard,
            max_inflight: None,
            max_queued: None,
            prefix_cache: None,
            quotas: Vec::new(),
            quota_meters: Arc::default(),
        }
    }

    fn bearer(key: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            http::header::AUTHORIZATION,
            format!("Bearer {key}").parse().unwrap(),
        );
        h
    }

    #[test]
    fn maps_clear_and_hashed_keys() {
        let bob_hash = hex::encode(hash_key("sk-bob"));
        let quickstart = concat!(env!("CARGO_MANIFEST_DIR"), "/config/quickstart.toml");
        let mut cfg = Config::load(quickstart.as_ref()).unwrap().into_inner();
        cfg.tenants = vec![
            tenant("alice", &["sk-alice"], &[]),
            tenant("bob", &[], &[&bob_hash]),
        ];
        let dir = TenantDirectory::from_config(&cfg.validated().unwrap());
        assert_eq!(dir.authenticate(&bearer("sk-alice")).unwrap().name, "alice");
        assert_eq!(dir.authenticate(&bearer("sk-bob")).unwrap().name, "bob");
        let e = crate::error::ApiError::from(dir.authenticate(&bearer("sk-carol")).unwrap_err());
        assert_eq!(
            (e.status.as_u16(), e.code, e.message.as_str()),
            (401, ErrorCode::InvalidApiKey, "incorrect API key provided")
        );
        let e = crate::error::ApiError::from(dir.authenticate(&HeaderMap::new()).unwrap_err());
        assert_eq!((e.status.as_u16(), e.code), (401, ErrorCode::InvalidApiKey));
        // Anthropic's clients send `x-api-key`; `Authorization` wins when both come.
        let mut h = HeaderMap::new();
        h.insert(X_API_KEY, "sk-bob".parse().unwrap());
        assert_eq!(dir.authenticate(&h).unwrap().name, "bob");
        h.insert(
            http::header::AUTHORIZATION,
            "Bearer sk-alice".parse().unwrap(),
        );
        assert_eq!(dir.authenticate(&h).unwrap().name, "alice");
        h.insert(
            http::header::AUTHORIZATION,
            "Bearer sk-carol".parse().unwrap(),
        );
        assert!(dir.authenticate(&h).is_err());
    }

    #[test]
    fn finds_each_of_many_tenants_by_key_and_name() {
        let quickstart = concat!(env!("CARGO_MANIFEST_DIR"), "/config/quickstart.toml");
        let mut cfg = Config::load(quickstart.as_ref()).unwrap().into_inner();
        cfg.tenants = (0..1000)
            .map(|i| {
                let clear = format!("sk-{i}");
                let hashed = hex::encode(hash_key(&format!("sk-hashed-{i}")));
                tenant(&format!("t{i}"), &[&clear], &[&hashed])
            })
            .collect();
        let dir = TenantDirectory::from_config(&cfg.validated().unwrap());
        for i in [0, 1, 499, 999] {
            let name = format!("t{i}");
            let clear = bearer(&format!("sk-{i}"));
            assert_eq!(dir.authenticate(&clear).unwrap().name, name);
            let hashed = bearer(&format!("sk-hashed-{i}"));
            assert_eq!(dir.authenticate(&hashed).unwrap().name, name);
            assert_eq!(dir.named(&name).unwrap().name, name);
        }
        assert!(dir.authenticate(&bearer("sk-1000")).is_err());
        assert!(dir.named("t1000").is_none());
        assert_eq!(dir.tenants().len(), 1000);
    }

    #[test]
    fn in_flight_places_are_capped_and_given_back_when_dropped() {
        let count = Arc::new(InFlight::default());
        let gauge = Gauge::default();
        let first = count.enter(Some(2), Some(gauge.clone())).unwrap();
        let second = count.enter(Some(2), Some(gauge.clone())).unwrap();
        assert_eq!(count.enter(Some(2), Some(gauge.clone())).unwrap_err(), 2);
        assert_eq!((count.current(), gauge.get()), (2, 2));
        drop(first);
        assert_eq!((count.current(), gauge.get()), (1, 1));
        let _third = count.enter(Some(2), None).unwrap();
        drop(second);
        assert_eq!((count.current(), gauge.get()), (1, 0));
        // Without a cap every request enters.
        let many: Vec<_> = (0..100).map(|_| count.enter(None, None).unwrap()).collect();
        assert_eq!(count.current(), 101);
        drop(many);
        assert_eq!(count.current(), 1);
    }

    #[test]
    fn a_reloaded_directory_keeps_each_kept_tenants_count_and_its_new_caps() {
        let quickstart = concat!(env!("CARGO_MANIFEST_DIR"), "/config/quickstart.toml");
        let mut cfg = Config::load(quickstart.as_ref()).unwrap().into_inner();
        cfg.tenants = vec![tenant("a", &["ka"], &[]), tenant("b", &["kb"], &[])];
        let old = TenantDirectory::from_config(&cfg.clone().validated().unwrap());
        let held = old.named("a").unwrap().in_flight.enter(None, None).unwrap();
        cfg.tenants[0].max_inflight = Some(1);
        cfg.tenants[1].name = "c".into();
        let new = TenantDirectory::succeeding(&cfg.validated().unwrap(), &old);
        let a = new.named("a").unwrap();
        assert_eq!(a.caps.max_inflight, Some(1));
        assert_eq!(a.in_flight.enter(a.caps.max_inflight, None).unwrap_err(), 1);
        drop(held);
        assert_eq!(new.named("a").unwrap().in_flight.current(), 0);
        assert_eq!(new.named("c").unwrap().in_flight.current(), 0);
    }

    #[test]
    fn limits_use_burst_for_every_bucket() {
        let l = limits_of(&tenant("a", &["k"], &[]));
        assert_eq!(l.decode.rate_per_second, 10.0);
        assert_eq!(l.requests.burst_seconds, 5.0);
    }
}
