//! Tenant-isolated prefix caches end to end: the exact bytes the backend gets for an isolated
//! tenant (its salt added, a client's salt scoped under it), for a tenant that shares the
//! cache (as sent), and a bad client salt refused before anything is charged or forwarded.

use super::*;
use sha2::{Digest, Sha256};
use tokengate::cache_salt::CacheIsolation;

/// sha256 of `parts`, each preceded by its length as 8 big-endian bytes, in hex: the salts'
/// construction as docs/reference.md states it.
fn documented(parts: &[&str]) -> String {
    let mut hash = Sha256::new();
    for part in parts {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part.as_bytes());
    }
    hex::encode(hash.finalize())
}

#[tokio::test]
async fn an_isolated_tenants_requests_carry_its_salt_and_scope_the_clients() {
    let (gw, backend) = gateway_with(FakeSpec::default(), |cfg| {
        cfg.prefix_cache.isolation = CacheIsolation::Tenant;
        cfg.prefix_cache.salt_secret = Some("s3cret".into());
        cfg.tenants[1].prefix_cache = Some(CacheIsolation::Shared);
    })
    .await;
    let url = gw.url("/v1/chat/completions");
    let sent = |key: &'static str, body: &'static str| {
        let url = url.clone();
        async move {
            let auth = format!("Bearer {key}");
            let headers = [
                ("content-type", "application/json"),
                ("authorization", auth.as_str()),
            ];
            send(&url, "POST", Some(body.as_bytes().to_vec()), &headers).await
        }
    };
    let forwarded = |i: usize| String::from_utf8(backend.seen_bytes.lock().unwrap()[i].to_vec());
    let alice = documented(&["tokengate tenant cache salt", "s3cret", "alice"]);

    // A salt vLLM would refuse is refused here, naming it, before anything is charged
    // or forwarded.
    let bad = r#"{"model": "qwen3.5-27b", "cache_salt": "a/b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}"#;
    let r = sent("sk-alice", bad).await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["param"], "cache_salt");
    assert_eq!(
        r.json()["error"]["message"],
        r#"`cache_salt` must be a non-empty string of at most 128 characters without '@', '/', '\' or NUL, got "a/b""#
    );
    assert_eq!(
        gw.bucket("alice", "decode").await,
        1000.0,
        "full, as before"
    );
    assert!(backend.seen_bytes.lock().unwrap().is_empty());

    let plain = r#"{"model": "qwen3.5-27b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}"#;
    assert_eq!(sent("sk-alice", plain).await.status, 200);
    assert_eq!(
        forwarded(0).unwrap(),
        format!(
            r#"{{"model":"qwen3.5-27b","messages":[{{"role": "user", "content": "hi"}}],"max_tokens":5,"cache_salt":"{alice}"}}"#
        )
    );

    let salted = r#"{"model": "qwen3.5-27b", "cache_salt": "team-x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}"#;
    assert_eq!(sent("sk-alice", salted).await.status, 200);
    let scoped = documented(&[&alice, "team-x"]);
    assert_eq!(
        forwarded(1).unwrap(),
        format!(
            r#"{{"model":"qwen3.5-27b","cache_salt":"{scoped}","messages":[{{"role": "user", "content": "hi"}}],"max_tokens":5}}"#
        )
    );

    // bob shares the cache: his body goes as he wrote it, his salt with it.
    assert_eq!(sent("sk-bob", salted).await.status, 200);
    assert_eq!(forwarded(2).unwrap(), salted);
}

/// vLLM's generative scoring reads a `cache_salt` too: an isolated tenant's goes with its salt.
#[tokio::test]
async fn an_isolated_tenants_generative_scoring_carries_its_salt() {
    let (gw, backend) = gateway_with(FakeSpec::default(), |cfg| {
        cfg.prefix_cache.isolation = CacheIsolation::Tenant;
    })
    .await;
    let body = json!({"model": "qwen3.5-27b", "query": "Is it good?", "items": ["yes", "no"], "label_token_ids": [9707]});
    let prefill = gw.bucket("alice", "prefill").await;
    let r = post(&gw.url("/generative_scoring"), "sk-alice", &body).await;
    assert_eq!(r.status, 200);
    let alice = documented(&["tokengate tenant cache salt", "", "alice"]);
    let forwarded = backend.seen_bytes.lock().unwrap()[0].to_vec();
    assert_eq!(
        String::from_utf8(forwarded).unwrap(),
        format!(
            r#"{{"model":"qwen3.5-27b","query":"Is it good?","items":["yes","no"],"label_token_ids":[9707],"cache_salt":"{alice}"}}"#
        )
    );
    // The query with each item, tokenized apart.
    let tok = tokenizer();
    let each = |item: &str| (tok.count("Is it good?") + tok.count(item)) as f64;
    assert_eq!(
        prefill - gw.bucket("alice", "prefill").await,
        each("yes") + each("no")
    );
}
