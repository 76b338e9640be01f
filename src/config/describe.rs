//! A human summary of what a config sets up.

use super::{KvSource, Runner, ValidConfig};
use crate::capacity::{derived_table, DerivedBackend};

/// A human summary of what a config sets up (printed by `check-config` and at startup).
pub fn describe(cfg: &ValidConfig) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "listen {} ({} workers; admin {}{}); model {} (max_model_len {}, default_max_tokens {})",
        cfg.server.listen,
        cfg.server.workers(),
        cfg.server.admin_listen,
        if cfg.admin_token_digest().is_some() {
            ", token required"
        } else {
            ""
        },
        cfg.model.served_names.join(", "),
        cfg.model.max_model_len,
        cfg.model.default_max_tokens
    );
    let l = &cfg.limiter;
    if l.store == crate::limiter::config::StoreKind::Redis {
        let _ = writeln!(
            s,
            "limiter store redis: on_store_error {:?}, marked down after {} failures in a row, tried again every {}",
            l.on_store_error,
            l.failures_before_down,
            humantime::format_duration(l.retry_interval)
        );
    }
    let _ = writeln!(
        s,
        "limiter: a prompt token the backend's prefix cache held is charged {} of a token (cached_prefill_weight)",
        cfg.limiter.cached_prefill_weight
    );
    let generating = || cfg.running(Runner::Generate).map(|(b, _)| b);
    let _ = if generating().all(|b| b.kv == KvSource::Engine) {
        writeln!(
            s,
            "KV: each backend counts a sequence in its engine's own pages, learned from the engine (kv = \"engine\")"
        )
    } else {
        writeln!(
            s,
            "KV: a sequence holds whole blocks of {} tokens; the n choices of one prompt {}",
            cfg.model.block_tokens,
            if cfg.model.prefix_caching {
                "hold its whole blocks once (prefix_caching)"
            } else {
                "each hold all of it (prefix_caching off)"
            }
        )
    };
    let server = &cfg.server;
    let _ = writeln!(
        s,
        "client connections: at most {}; first request head within {}, idle {}, a stalled answer dropped after {}",
        server.max_connections,
        humantime::format_duration(server.header_read_timeout),
        humantime::format_duration(server.idle_timeout),
        humantime::format_duration(server.client_write_timeout),
    );
    let _ = match &cfg.vision_rules {
        v if v.enabled => writeln!(
            s,
            "vision: images and video, at most {} of each per request",
            v.max_media_per_request
        ),
        _ => writeln!(s, "vision: off (text only)"),
    };
    for b in &cfg.backends {
        if b.kv == KvSource::Engine {
            let cap = b
                .max_batch
                .map(|m| format!(", at most {m} sequences (max_batch)"));
            let _ = writeln!(
                s,
                "backend {}: KV cache, pages and batch cap learned from the engine (kv = \"engine\"){}",
                b.url,
                cap.unwrap_or_default()
            );
            continue;
        }
        let d = b.derived.as_ref();
        let kv = b.kv_capacity_bytes();
        let kv_origin = origin(
            b.kv_capacity_bytes.is_some(),
            d.map(|d| d.kv_capacity_bytes),
        );
        let batch_origin = origin(b.max_batch.is_some(), d.map(|d| d.max_batch));
        let _ = writeln!(
            s,
            "backend {}{}: kv_capacity_bytes {kv} ({:.2} GB{}), max_batch {}{}",
            b.url,
            match b.runner {
                Runner::Generate => "",
                Runner::Pooling => " (pooling)",
            },
            kv as f64 / 1e9,
            kv_origin.map(|o| format!(", {o}")).unwrap_or_default(),
            b.max_batch(),
            batch_origin.map(|o| format!(" ({o})")).unwrap_or_default(),
        );
    }
    let derived: Vec<(&str, &DerivedBackend)> = cfg
        .backends
        .iter()
        .filter_map(|b| b.derived.as_ref().map(|d| (b.url.as_str(), d)))
        .collect();
    if !derived.is_empty() {
        s.push_str(&derived_table(&derived));
    }
    for t in &cfg.tenants {
        let rates = t.rates();
        let d = t.derived;
        let rate = |given: Option<f64>, v: f64, derived: Option<f64>, places: usize| {
            let o = origin(given.is_some(), derived.map(|x| format!("{x:.places$}/s")));
            format!(
                "{v:.places$}/s{}",
                o.map(|o| format!(" ({o})")).unwrap_or_default()
            )
        };
        let _ = writeln!(
            s,
            "tenant {}: prefill {}, decode {}, requests {}, burst {} s{}{}{}",
            t.name,
            rate(
                t.prefill_tokens_per_second,
                rates.prefill_tokens_per_second,
                d.map(|d| d.prefill_tokens_per_second),
                1
            ),
            rate(
                t.decode_tokens_per_second,
                rates.decode_tokens_per_second,
                d.map(|d| d.decode_tokens_per_second),
                1
            ),
            rate(
                t.requests_per_second,
                rates.requests_per_second,
                d.map(|d| d.requests_per_second),
                3
            ),
            t.burst_seconds,
            t.share
                .map(|x| format!(" (share {x} of the derived capacity)"))
                .unwrap_or_default(),
            (t.max_inflight.map(|n| format!(", max_inflight {n}"))).unwrap_or_default(),
            (t.max_queued.map(|n| format!(", max_queued {n}"))).unwrap_or_default()
        );
        if !t.quota_meters.is_empty() {
            let meters: Vec<String> = (t.quota_meters.meters.iter())
                .map(|m| format!("{} per {}", m.phrase(m.limit), m.window.label()))
                .collect();
            let _ = writeln!(s, "tenant {} quotas: {}", t.name, meters.join("; "));
        }
    }
    if cfg.tenants.iter().any(|t| !t.quota_meters.is_empty()) {
        let q = &cfg.quotas;
        let _ = match q.store {
            crate::quota::config::QuotaStoreKind::Local => writeln!(
                s,
                "quota spend kept in {}, written every {} (a crash loses at most that much of it); while it cannot be written: {:?}",
                q.path.display(),
                humantime::format_duration(q.flush_interval),
                q.on_write_error,
            ),
            crate::quota::config::QuotaStoreKind::Redis => writeln!(
                s,
                "quota spend kept in the limiter's Redis, shared by the replicas with key_prefix {}",
                cfg.limiter.key_prefix
            ),
        };
    }
    s
}

/// Where a value in force comes from, said only where the capacity model derives one
/// (`derived` is `Some`): `derived`, or `configured; the capacity model derives D`.
fn origin(given: bool, derived: Option<impl std::fmt::Display>) -> Option<String> {
    let d = derived?;
    Some(match given {
        true => format!("configured; the capacity model derives {d}"),
        false => "derived".to_string(),
    })
}
