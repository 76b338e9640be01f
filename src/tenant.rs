//! API key -> tenant. Keys are kept only as sha256 digests; a presented key is hashed and
//! compared with every stored digest in constant time, so neither the key nor which tenant
//! nearly matched leaks through timing.

use crate::config::{TenantConfig, ValidConfig};
use crate::digest::hash_key;
use crate::error::ApiError;
use crate::limiter::{BucketSpec, TenantLimits};
use http::HeaderMap;
use std::sync::Arc;
use subtle::ConstantTimeEq;

/// A tenant: its name and its buckets' sizes.
#[derive(Debug, Clone, PartialEq)]
pub struct Tenant {
    /// Name used in metrics, logs and the admin API.
    pub name: String,
    /// Its three buckets.
    pub limits: TenantLimits,
}

/// What a bearer credential is called in a refusal, and which 401 refuses it.
#[derive(Debug)]
pub struct BearerKind {
    /// Its name in messages (`API key`).
    pub name: &'static str,
    /// The placeholder in `Authorization: Bearer KEY`.
    pub placeholder: &'static str,
    /// Builds the 401.
    pub refuse: fn(String) -> ApiError,
}

/// A tenant's API key.
pub const API_KEY: BearerKind = BearerKind {
    name: "API key",
    placeholder: "KEY",
    refuse: ApiError::unauthorized,
};

/// The credential in `Authorization: Bearer CREDENTIAL`, or the 401 of `kind` saying what is
/// wrong with the header.
pub fn bearer<'h>(headers: &'h HeaderMap, kind: &BearerKind) -> Result<&'h str, ApiError> {
    let BearerKind {
        name,
        placeholder,
        refuse,
    } = kind;
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

/// Every tenant and the digests of its keys.
#[derive(Debug)]
pub struct TenantDirectory {
    tenants: Vec<Arc<Tenant>>,
    keys: Vec<([u8; 32], usize)>,
}

impl TenantDirectory {
    /// Builds the directory of a config's tenants.
    pub fn from_config(config: &ValidConfig) -> Self {
        let mut tenants = Vec::with_capacity(config.tenants.len());
        let mut keys = Vec::new();
        for (i, (t, digests)) in config.tenants_with_keys().enumerate() {
            tenants.push(Arc::new(Tenant {
                name: t.name.clone(),
                limits: limits_of(t),
            }));
            keys.extend(digests.iter().map(|&digest| (digest, i)));
        }
        Self { tenants, keys }
    }

    /// All tenants, in config order.
    pub fn tenants(&self) -> &[Arc<Tenant>] {
        &self.tenants
    }

    /// The tenant called `name`, if there is one.
    pub fn named(&self, name: &str) -> Option<&Arc<Tenant>> {
        self.tenants.iter().find(|t| t.name == name)
    }

    /// The tenant whose key is in `Authorization: Bearer KEY`, or 401.
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<Arc<Tenant>, ApiError> {
        let key = bearer(headers, &API_KEY)?;
        let digest = hash_key(key);
        // Visit every stored digest whatever matches, so the time taken does not depend on
        // which one (if any) matched.
        let mut found = usize::MAX;
        for (stored, idx) in &self.keys {
            if bool::from(stored.ct_eq(&digest)) {
                found = *idx;
            }
        }
        self.tenants
            .get(found)
            .cloned()
            .ok_or_else(|| ApiError::unauthorized("incorrect API key provided"))
    }
}

/// The three bucket specs of a tenant's config.
pub fn limits_of(t: &TenantConfig) -> TenantLimits {
    let spec = |rate: f64| BucketSpec {
        rate_per_second: rate,
        burst_seconds: t.burst_seconds,
    };
    TenantLimits {
        prefill: spec(t.prefill_tokens_per_second),
        decode: spec(t.decode_tokens_per_second),
        requests: spec(t.requests_per_second),
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
            prefill_tokens_per_second: 100.0,
            decode_tokens_per_second: 10.0,
            requests_per_second: 1.0,
            burst_seconds: 5.0,
            share: None,
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
        let e = dir.authenticate(&bearer("sk-carol")).unwrap_err();
        assert_eq!((e.status.as_u16(), e.code), (401, "invalid_api_key"));
        let e = dir.authenticate(&HeaderMap::new()).unwrap_err();
        assert_eq!((e.status.as_u16(), e.code), (401, "invalid_api_key"));
    }

    #[test]
    fn limits_use_burst_for_every_bucket() {
        let l = limits_of(&tenant("a", &["k"], &[]));
        assert_eq!(l.decode.rate_per_second, 10.0);
        assert_eq!(l.requests.burst_seconds, 5.0);
    }
}
