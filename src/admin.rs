//! The admin listener: Prometheus metrics, liveness and readiness, JSON views of the tenants'
//! buckets, the backends' KV ledgers and the workload profile, and `POST /admin/reload`. With `server.admin_token`
//! set, every path but the probes (`/healthz`, `/readyz`) needs it as a bearer token.

use crate::config::{Runner, Source};
use crate::digest::hash_key;
use crate::error::{Allow, ApiError};
use crate::gateway::Gateway;
use crate::limiter::BucketLabels;
use crate::metrics::BackendLabel;
use crate::profile::advice::advise;
use crate::proxy::upstream::{Health, Upstream};
use crate::proxy::{json_response, GatewayBody};
use crate::tenant::{bearer, BearerKind};
use http::{header, Request, Response, StatusCode};
use serde_json::json;
use subtle::ConstantTimeEq;

/// The admin listener's token.
const ADMIN_TOKEN: BearerKind = BearerKind {
    name: "admin token",
    placeholder: "TOKEN",
    code: crate::error::ErrorCode::InvalidAdminToken,
};

/// Paths open without the admin token, so orchestrators' probes need no secret.
fn is_probe(path: &str) -> bool {
    matches!(path, "/healthz" | "/readyz")
}

/// Checks the admin token when one is configured. The presented token is hashed and its digest
/// compared in constant time, so the time taken says nothing about how much of it matched.
fn authorize(gw: &Gateway, headers: &http::HeaderMap) -> Result<(), ApiError> {
    let Some(expected) = gw.config.admin_token_digest() else {
        return Ok(());
    };
    let token = bearer(headers, &ADMIN_TOKEN)?;
    if bool::from(hash_key(token).ct_eq(&expected)) {
        Ok(())
    } else {
        Err(ApiError::admin_unauthorized(
            "incorrect admin token provided",
        ))
    }
}

/// Routes one admin request.
pub async fn route<B>(gw: &Gateway, req: Request<B>) -> Result<Response<GatewayBody>, ApiError> {
    let path = req.uri().path();
    if !is_probe(path) {
        authorize(gw, req.headers())?;
    }
    let allow = if path == "/admin/reload" {
        Allow::Post
    } else {
        Allow::Get
    };
    if req.method().as_str() != allow.as_str() {
        return Err(ApiError::method_not_allowed(req.method(), path, allow));
    }
    match path {
        "/metrics" => {
            refresh_gauges(gw).await;
            let mut resp = Response::new(crate::proxy::full(gw.metrics.encode()));
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                http::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            Ok(resp)
        }
        "/healthz" => Ok(json_response(StatusCode::OK, &json!({"status": "ok"}))),
        "/readyz" => Ok(readiness(gw).await),
        "/admin/tenants" => Ok(json_response(StatusCode::OK, &tenants_json(gw).await)),
        "/admin/backends" => Ok(json_response(StatusCode::OK, &backends_json(gw))),
        "/admin/profile" => {
            let mut report = gw.recorder.profile();
            report.advice = advise(&gw.live.current().config, &report.overall.window);
            let profile = serde_json::to_value(report).map_err(|e| {
                tracing::error!(error = %e, "encoding the workload profile");
                ApiError::internal()
            })?;
            Ok(json_response(StatusCode::OK, &profile))
        }
        "/admin/reload" => {
            let reloaded = gw.reloader.reload().await?;
            let body = json!({"status": "reloaded", "changes": reloaded});
            Ok(json_response(StatusCode::OK, &body))
        }
        _ => Err(ApiError::not_found(format!("no admin route {path}"))),
    }
}

/// Every backend's health path, asked at once, each bounded by its `health_timeout`: ready
/// while at least one backend is.
async fn readiness(gw: &Gateway) -> Response<GatewayBody> {
    let upstreams: Vec<&Upstream> = (gw.lanes())
        .flat_map(|(_, _, b)| b.upstreams.iter())
        .collect();
    let found = futures_util::future::join_all(upstreams.iter().map(|u| u.probe())).await;
    let ready = found.contains(&Health::Ready);
    let backends: Vec<_> = (upstreams.iter())
        .zip(&found)
        .map(
            |(u, h)| json!({"url": u.url, "state": h.state(), "detail": h.detail(u.health_path())}),
        )
        .collect();
    let (status, word) = if ready {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    };
    json_response(status, &json!({"status": word, "backends": backends}))
}

async fn tenants_json(gw: &Gateway) -> serde_json::Value {
    let live = gw.live.current();
    let mut out = Vec::new();
    // The directory holds the tenants in config order.
    for (t, cfg) in live.tenants.tenants().iter().zip(&live.config.tenants) {
        let s = gw.limiter.snapshot(&t.name, &t.limits).await;
        // Each bucket's rate as the file gives it, or derived from `share`.
        let bucket = |snapshot, given: &Option<f64>| {
            let mut b = json!(snapshot);
            b["rate_source"] = json!(Source::of(given));
            b
        };
        out.push(json!({
            "name": t.name,
            "burst_seconds": t.limits.decode.burst_seconds,
            "buckets": {
                "prefill": bucket(s.prefill, &cfg.prefill_tokens_per_second),
                "decode": bucket(s.decode, &cfg.decode_tokens_per_second),
                "requests": bucket(s.requests, &cfg.requests_per_second),
            },
            "share": cfg.share,
            // What `share` derives (null without one), in force or not.
            "derived": cfg.derived,
        }));
    }
    json!({"tenants": out})
}

fn backends_json(gw: &Gateway) -> serde_json::Value {
    let snap = gw.admission.snapshot();
    let live = gw.live.current();
    let mut backends = Vec::new();
    for (runner, admission, lane) in gw.lanes() {
        let lane_snap = admission.snapshot();
        let configs = (live.config.backends.iter()).filter(|b| b.runner == runner);
        for (i, ((b, u), cfg)) in (lane_snap.backends.iter())
            .zip(lane.upstreams.iter())
            .zip(configs)
            .enumerate()
        {
            // What the backend's own metrics said last (null with feedback off, and on the
            // pooling backends, which have none).
            let observed = match runner {
                Runner::Generate => json!(gw.feedback.observed.observed(i)),
                Runner::Pooling => serde_json::Value::Null,
            };
            backends.push(json!({
                "url": u.url,
                "runner": runner.as_str(),
                "kv_capacity_bytes": b.kv_capacity_bytes,
                "kv_effective_capacity_bytes": b.kv_effective_capacity_bytes,
                "kv_reserved_bytes": b.kv_reserved_bytes,
                "inflight": b.inflight,
                "max_batch": b.max_batch,
                // Each as the file gives it, or derived by the capacity model (`derived` holds
                // what the model derives, in force or not).
                "kv_capacity_bytes_source": Source::of(&cfg.kv_capacity_bytes),
                "max_batch_source": Source::of(&cfg.max_batch),
                // Per priority class: what its leases hold and the most its share allows.
                "by_class": b.by_class,
                // Waiting for the backends of its runner.
                "queued": lane_snap.queued,
                "derived": cfg.derived,
                "observed": observed,
            }));
        }
    }
    let mut out = json!({
        "backends": backends,
        "queued": snap.queued,
        "queued_by_tenant": snap.queued_by_tenant,
        "queued_by_class": snap.queued_by_class,
    });
    if let Some(shared) = snap.shared {
        out["shared_ledger"] = json!(shared);
    }
    out
}

async fn refresh_gauges(gw: &Gateway) {
    // Asked at once, each within its health_timeout, so a scrape waits at most the longest.
    let upstreams: Vec<&Upstream> = (gw.lanes())
        .flat_map(|(_, _, b)| b.upstreams.iter())
        .collect();
    let health = futures_util::future::join_all(upstreams.iter().map(|u| u.probe())).await;
    let ledgers: Vec<_> = (gw.lanes())
        .flat_map(|(_, admission, _)| admission.snapshot().backends)
        .collect();
    let snap = gw.admission.snapshot();
    for ((b, u), h) in ledgers.iter().zip(upstreams).zip(&health) {
        let label = BackendLabel {
            backend: u.url.clone(),
        };
        gw.metrics
            .backend_up
            .get_or_create(&label)
            .set(i64::from(*h == Health::Ready));
        gw.metrics
            .kv_reserved_bytes
            .get_or_create(&label)
            .set(b.kv_reserved_bytes as i64);
        gw.metrics
            .kv_capacity_bytes
            .get_or_create(&label)
            .set(b.kv_capacity_bytes as i64);
    }
    gw.metrics.queue_depth.set(snap.queued as i64);
    for (class, depth) in &snap.queued_by_class {
        let label = crate::metrics::ClassLabel {
            class: class.as_str().to_string(),
        };
        gw.metrics
            .queue_depth_by_class
            .get_or_create(&label)
            .set(*depth as i64);
    }
    for t in gw.live.current().tenants.tenants() {
        let queued = snap.queued_by_tenant.get(&t.name).copied().unwrap_or(0);
        (gw.metrics.queue_depth_by_tenant)
            .get_or_create(&crate::metrics::tenant(&t.name))
            .set(queued as i64);
        let s = gw.limiter.snapshot(&t.name, &t.limits).await;
        for (bucket, b) in [
            ("prefill", &s.prefill),
            ("decode", &s.decode),
            ("requests", &s.requests),
        ] {
            let labels = BucketLabels {
                tenant: t.name.clone(),
                bucket: bucket.to_string(),
            };
            gw.metrics
                .bucket_available
                .get_or_create(&labels)
                .set(b.available);
            gw.metrics
                .bucket_capacity
                .get_or_create(&labels)
                .set(b.capacity);
        }
    }
    gw.metrics.sync_cache_counters(&gw.chat.stats());
}
