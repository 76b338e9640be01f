//! Tenant-isolated prefix caches: the `cache_salt` the gateway sends vLLM. vLLM mixes a
//! request's `cache_salt` into the hash of its first KV block, so requests share cached prefixes
//! only when their salts are equal. Without one, a tenant that times its own requests can learn
//! whether another tenant's prompt began the same way (a cache hit answers sooner).
//!
//! A tenant isolated (`prefix_cache.isolation` or `tenants[].prefix_cache`) has a salt of its
//! own, 64 hex digits of sha256 over its name and the optional `prefix_cache.salt_secret`; every
//! request of it is sent with that salt, or, when the client sent a salt of its own, with
//! sha256 of the tenant's salt and the client's (its salt scoped under the tenant's): so a
//! client may split its tenant's cache further but never reach another tenant's. The salts
//! are the same on every replica and after a restart (the engine's cache stays warm).
//!
//! A client's `cache_salt` is checked as vLLM 0.32 checks it (`validate_cache_salt` in
//! `vllm/entrypoints/generate/base/protocol.py`): a non-empty string of at most 128 characters
//! without `@`, `/`, `\` or NUL; null is no salt.

use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The body field vLLM reads the salt from.
pub const CACHE_SALT: &str = "cache_salt";

/// The most characters vLLM takes in a salt.
const MAX_SALT_CHARS: usize = 128;

/// Whether a tenant's prompts share the engine's prefix cache with other tenants'.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheIsolation {
    /// No salt is added: the cache is shared (a client's own salt goes as sent).
    #[default]
    Shared,
    /// Every request carries the tenant's salt (scoping the client's own).
    Tenant,
}

/// `[prefix_cache]`: the isolation of tenants that do not set their own.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrefixCacheConfig {
    /// The isolation of a tenant without `tenants[].prefix_cache`.
    #[serde(default)]
    pub isolation: CacheIsolation,
    /// Mixed into every tenant's salt, so that nobody who knows the tenants' names can work
    /// out their salts (only matters where clients can reach the engine other than through
    /// the gateway).
    #[serde(default)]
    pub salt_secret: Option<String>,
}

impl PrefixCacheConfig {
    /// The salt of tenant `name` whose own setting is `own`; `None` when it shares the cache.
    pub fn salt_of(&self, name: &str, own: Option<CacheIsolation>) -> Option<String> {
        match own.unwrap_or(self.isolation) {
            CacheIsolation::Shared => None,
            CacheIsolation::Tenant => {
                let secret = self.salt_secret.as_deref().unwrap_or("");
                Some(sha256_hex(&[
                    b"tokengate tenant cache salt",
                    secret.as_bytes(),
                    name.as_bytes(),
                ]))
            }
        }
    }
}

/// The salt sent for a request of a tenant whose salt is `tenant_salt`, whose client sent
/// `client` (checked by [`client_salt`]).
pub fn scoped(tenant_salt: &str, client: Option<&str>) -> String {
    match client {
        None => tenant_salt.to_owned(),
        Some(client) => sha256_hex(&[tenant_salt.as_bytes(), client.as_bytes()]),
    }
}

/// The client's salt in a body's `cache_salt` (`None` when absent or null), or why vLLM would
/// refuse it.
pub fn client_salt(value: Option<&Value>) -> Result<Option<&str>, String> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s))
            if !s.is_empty()
                && s.chars().nth(MAX_SALT_CHARS).is_none()
                && !s.contains(['@', '/', '\\', '\0']) =>
        {
            Ok(Some(s))
        }
        Some(other) => Err(format!(
            "`cache_salt` must be a non-empty string of at most {MAX_SALT_CHARS} characters without '@', '/', '\\' or NUL, got {}",
            crate::util::json::shown(other, MAX_SALT_CHARS)
        )),
    }
}

/// sha256 of `parts`, each preceded by its length (so no two lists of parts hash alike), as 64
/// lowercase hex digits: within what vLLM takes as a salt.
fn sha256_hex(parts: &[&[u8]]) -> String {
    let mut hash = Sha256::new();
    for part in parts {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part);
    }
    hex::encode(hash.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_tenant_salt_is_fixed_by_its_name_and_the_secret() {
        let config = |secret: Option<&str>| PrefixCacheConfig {
            isolation: CacheIsolation::Tenant,
            salt_secret: secret.map(str::to_owned),
        };
        let alice = config(None).salt_of("alice", None).unwrap();
        // The formula docs/reference.md gives, worked by another sha256: a salt must stay the
        // same across replicas and versions, or every isolated tenant's cache goes cold.
        assert_eq!(
            alice,
            "ddc7e6e8a2887d72220d07ab9d18dfa279fef9fb9568f1061274f4131a9391aa"
        );
        assert_eq!(config(None).salt_of("alice", None).unwrap(), alice);
        assert_ne!(config(None).salt_of("bob", None).unwrap(), alice);
        assert_ne!(
            config(Some("s3cret")).salt_of("alice", None).unwrap(),
            alice
        );
        // The tenant's own setting wins over the default, either way.
        assert_eq!(
            config(None).salt_of("alice", Some(CacheIsolation::Shared)),
            None
        );
        let shared = PrefixCacheConfig::default();
        assert_eq!(shared.salt_of("alice", None), None);
        assert_eq!(
            shared.salt_of("alice", Some(CacheIsolation::Tenant)),
            Some(alice)
        );
    }

    #[test]
    fn a_client_salt_is_scoped_under_the_tenants() {
        let (a, b) = ("a".repeat(64), "b".repeat(64));
        assert_eq!(scoped(&a, None), a);
        let scoped_a = scoped(&a, Some("x"));
        assert_eq!(scoped_a.len(), 64);
        let alice = "ddc7e6e8a2887d72220d07ab9d18dfa279fef9fb9568f1061274f4131a9391aa";
        assert_eq!(
            scoped(alice, Some("x")),
            "8331696782d48945f2fcb96c31a9b53ae288fc589131387b351b4213633b9475"
        );
        assert_ne!(scoped_a, a);
        // The same client salt under another tenant is another salt.
        assert_ne!(scoped(&b, Some("x")), scoped_a);
        // Lengths are hashed too: moving a byte between the parts changes the salt.
        assert_ne!(scoped("ab", Some("c")), scoped("a", Some("bc")));
    }

    #[test]
    fn a_client_salt_is_checked_as_vllm_checks_it() {
        assert_eq!(client_salt(None), Ok(None));
        assert_eq!(client_salt(Some(&json!(null))), Ok(None));
        let ok = "x".repeat(128);
        assert_eq!(client_salt(Some(&json!(ok))), Ok(Some(ok.as_str())));
        for bad in [
            json!(""),
            json!("x".repeat(129)),
            json!("a@b"),
            json!("a/b"),
            json!("a\\b"),
            json!("a\u{0}b"),
            json!(7),
        ] {
            assert!(client_salt(Some(&bad)).is_err(), "{bad}");
        }
        assert_eq!(
            client_salt(Some(&json!("a/b"))).unwrap_err(),
            r#"`cache_salt` must be a non-empty string of at most 128 characters without '@', '/', '\' or NUL, got "a/b""#
        );
        let long = client_salt(Some(&json!("x".repeat(129)))).unwrap_err();
        assert!(long.ends_with("got a string of 129 characters"), "{long}");
        let number = client_salt(Some(&json!(7))).unwrap_err();
        assert!(number.ends_with("got 7"), "{number}");
    }
}
