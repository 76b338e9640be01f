//! API key -> tenant. Keys are kept only as sha256 digests; a presented key is hashed and
//! compared with every stored digest in constant time, so neither the key nor which tenant
//! nearly matched leaks through timing.

use crate::config::TenantConfig;
use crate::error::ApiError;
use crate::limiter::{BucketSpec, TenantLimits};
use http::HeaderMap;
use sha2::{Digest, Sha256};
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

/// sha256 of an API key.
pub fn hash_key(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// Every tenant and the digests of its keys.
#[derive(Debug)]
pub struct TenantDirectory {
    tenants: Vec<Arc<Tenant>>,
    keys: Vec<([u8; 32], usize)>,
}

impl TenantDirectory {
    /// Builds the directory from validated config (digests in config are 64 hex digits).
    pub fn from_config(configs: &[TenantConfig]) -> Self {
        let mut tenants = Vec::with_capacity(configs.len());
        let mut keys = Vec::new();
        for (i, t) in configs.iter().enumerate() {
            tenants.push(Arc::new(Tenant {
                name: t.name.clone(),
                limits: limits_of(t),
            }));
            keys.extend(t.api_keys.iter().map(|k| (hash_key(k), i)));
            for h in &t.api_key_sha256 {
                let mut digest = [0u8; 32];
                if hex::decode_to_slice(h, &mut digest).is_ok() {
                    keys.push((digest, i));
                }
            }
        }
        Self { tenants, keys }
    }

    /// All tenants, in config order.
    pub fn tenants(&self) -> &[Arc<Tenant>] {
        &self.tenants
    }

    /// The tenant whose key is in `Authorization: Bearer KEY`, or 401.
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<Arc<Tenant>, ApiError> {
        let value = headers
            .get(http::header::AUTHORIZATION)
            .ok_or_else(|| {
                ApiError::unauthorized(
                    "missing API key: send it as `Authorization: Bearer KEY`".to_string(),
                )
            })?
            .to_str()
            .map_err(|_| ApiError::unauthorized("the Authorization header is not ASCII"))?;
        let key = value
            .strip_prefix("Bearer ")
            .or_else(|| value.strip_prefix("bearer "))
            .map(str::trim)
            .filter(|k| !k.is_empty())
            .ok_or_else(|| {
                ApiError::unauthorized("the Authorization header must be `Bearer KEY`")
            })?;
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
        let dir = TenantDirectory::from_config(&[
            tenant("alice", &["sk-alice"], &[]),
            tenant("bob", &[], &[&bob_hash]),
        ]);
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
