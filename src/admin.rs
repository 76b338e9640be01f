//! The admin listener: Prometheus metrics, liveness and readiness, JSON views of the tenants'
//! buckets and quotas, the backends' KV ledgers and the workload profile, `POST /admin/reload`,
//! and an operator's grants and resets of a tenant's quotas. With `server.admin_token` set,
//! every path but the probes (`/healthz`, `/readyz`) needs it as a bearer token.

use crate::admission::Admission;
use crate::body::BodyError;
use crate::config::{Runner, Source};
use crate::digest::hash_key;
use crate::error::{Allow, ApiError};
use crate::gateway::Gateway;
use crate::limiter::BucketLabels;
use crate::metrics::{BackendLabel, QuotaLabels};
use crate::profile::advice::advise;
use crate::proxy::upstream::{Health, Upstream};
use crate::proxy::{json_response, GatewayBody};
use crate::quota::ledger::{Meter, Reading, Unit, PICO_PER_UNIT};
use crate::quota::store::StoreDown;
use crate::tenant::{bearer, BearerKind, Tenant};
use http::{header, Request, Response, StatusCode};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;
use subtle::ConstantTimeEq;

/// The admin listener's token.
const ADMIN_TOKEN: BearerKind = BearerKind {
    name: "admin token",
    placeholder: "TOKEN",
    code: crate::error::ErrorCode::InvalidAdminToken,
};

/// What answers one of the admin listener's routes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminRoute {
    /// Prometheus' text.
    Metrics,
    /// Liveness: the process answers.
    Healthz,
    /// Readiness: a backend is ready.
    Readyz,
    /// Every tenant's buckets.
    Tenants,
    /// Every tenant's quota meters.
    Quotas,
    /// Every backend's KV ledger.
    Backends,
    /// The workload profile.
    Profile,
    /// Reads the config file again.
    Reload,
    /// A change to one tenant's quotas.
    Quota(QuotaAction),
}

impl AdminRoute {
    /// The probes, open without the admin token so orchestrators need no secret.
    fn is_probe(self) -> bool {
        matches!(self, AdminRoute::Healthz | AdminRoute::Readyz)
    }
}

/// The admin listener's route table: each path, the one method it answers and what answers it.
/// A path holds at most one `{tenant}`: a segment naming a tenant, percent-encoded. The router,
/// a 404's hint and a 405's `allow` read it; tests/docs.rs holds docs/reference.md's list of
/// admin endpoints against it.
pub const ADMIN_ROUTES: [(&str, Allow, AdminRoute); 10] = [
    ("/metrics", Allow::Get, AdminRoute::Metrics),
    ("/healthz", Allow::Get, AdminRoute::Healthz),
    ("/readyz", Allow::Get, AdminRoute::Readyz),
    ("/admin/tenants", Allow::Get, AdminRoute::Tenants),
    ("/admin/quotas", Allow::Get, AdminRoute::Quotas),
    ("/admin/backends", Allow::Get, AdminRoute::Backends),
    ("/admin/profile", Allow::Get, AdminRoute::Profile),
    ("/admin/reload", Allow::Post, AdminRoute::Reload),
    (
        "/admin/quotas/{tenant}/grant",
        Allow::Post,
        AdminRoute::Quota(QuotaAction::Grant),
    ),
    (
        "/admin/quotas/{tenant}/reset",
        Allow::Post,
        AdminRoute::Quota(QuotaAction::Reset),
    ),
];

/// A path of the route table, found.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    route: AdminRoute,
    /// The method it answers.
    allow: Allow,
    /// The tenant its `{tenant}` names, percent-decoded (a name may hold any character); empty
    /// on a route without one.
    tenant: String,
}

/// The route of the table `path` is, whatever the method.
fn target(path: &str) -> Option<Target> {
    ADMIN_ROUTES.iter().find_map(|&(pattern, allow, route)| {
        let tenant = match pattern.split_once("{tenant}") {
            None => (pattern == path).then(String::new)?,
            Some((before, after)) => {
                let named = path.strip_prefix(before)?.strip_suffix(after)?;
                Some(percent_decoded(named)?).filter(|t| !t.is_empty())?
            }
        };
        Some(Target {
            route,
            allow,
            tenant,
        })
    })
}

/// The route `method` on `path` (whose [`target`] is `found`) asks for: a 404 for a path not in
/// the table (naming the routes under its first segment, if any), a 405 with `allow` for a known
/// path and another method.
fn answering(method: &http::Method, path: &str, found: Option<Target>) -> Result<Target, ApiError> {
    let Some(found) = found else {
        let first = |p: &str| p.split('/').take(3).collect::<Vec<_>>().join("/");
        let near: Vec<String> = (ADMIN_ROUTES.iter())
            .filter(|(p, ..)| p.contains('{') && first(p) == first(path))
            .map(|(p, allow, _)| format!("{} {p}", allow.as_str()))
            .collect();
        let hint = match near.as_slice() {
            [] => String::new(),
            near => format!("; under {}: {}", first(path), near.join(", ")),
        };
        return Err(ApiError::not_found(format!(
            "no admin route {method} {path}{hint}"
        )));
    };
    if method.as_str() != found.allow.as_str() {
        return Err(ApiError::method_not_allowed(method, path, found.allow));
    }
    Ok(found)
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

/// Routes one admin request by [`ADMIN_ROUTES`]. The token is checked before the route, so a
/// client without it learns nothing of the routes.
pub async fn route<B>(gw: &Gateway, req: Request<B>) -> Result<Response<GatewayBody>, ApiError>
where
    B: http_body::Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let path = req.uri().path();
    let found = target(path);
    if !found.as_ref().is_some_and(|t| t.route.is_probe()) {
        authorize(gw, req.headers())?;
    }
    let Target { route, tenant, .. } = answering(req.method(), path, found)?;
    match route {
        AdminRoute::Metrics => {
            refresh_gauges(gw).await;
            let mut resp = Response::new(crate::proxy::full(gw.metrics.encode()));
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                http::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            Ok(resp)
        }
        AdminRoute::Healthz => Ok(json_response(StatusCode::OK, &json!({"status": "ok"}))),
        AdminRoute::Readyz => Ok(readiness(gw).await),
        AdminRoute::Tenants => Ok(json_response(StatusCode::OK, &tenants_json(gw).await)),
        AdminRoute::Quotas => Ok(json_response(StatusCode::OK, &quotas_json(gw).await?)),
        AdminRoute::Backends => Ok(json_response(StatusCode::OK, &backends_json(gw))),
        AdminRoute::Profile => {
            let mut report = gw.recorder.profile();
            report.advice = advise(&gw.live.current().config, &report.overall.window);
            let profile = serde_json::to_value(report).map_err(|e| {
                tracing::error!(error = %e, "encoding the workload profile");
                ApiError::internal()
            })?;
            Ok(json_response(StatusCode::OK, &profile))
        }
        AdminRoute::Reload => {
            let reloaded = gw.reloader.reload().await?;
            let body = json!({"status": "reloaded", "changes": reloaded});
            Ok(json_response(StatusCode::OK, &body))
        }
        AdminRoute::Quota(action) => {
            let timeout = gw.config.server.body_read_timeout;
            let body =
                crate::util::bounded::read_bounded(req.into_body(), QUOTA_BODY_BYTES, timeout)
                    .await
                    .map_err(|error| BodyError {
                        error,
                        max_bytes: QUOTA_BODY_BYTES,
                        timeout,
                    })?;
            let change = QuotaChange::parse(&body)?;
            let meters = match action {
                QuotaAction::Grant => grant(gw, &tenant, change).await?,
                QuotaAction::Reset => reset(gw, &tenant, change).await?,
            };
            let body = json!({"tenant": tenant, "meters": meters});
            Ok(json_response(StatusCode::OK, &body))
        }
    }
}

/// Every backend's health path, asked at once, each bounded by its `health_timeout`: ready
/// while at least one backend is.
async fn readiness(gw: &Gateway) -> Response<GatewayBody> {
    // Each backend with the admission that admits to it and its index there.
    let backends: Vec<(&Admission, usize, &Upstream)> = (gw.lanes())
        .flat_map(|(_, admission, b)| {
            (b.upstreams.iter().enumerate()).map(move |(i, u)| (admission, i, u))
        })
        .collect();
    let found = futures_util::future::join_all(backends.iter().map(|(_, _, u)| u.probe())).await;
    let mut ready = false;
    let backends: Vec<_> = (backends.iter())
        .zip(&found)
        .map(|((admission, i, u), h)| {
            let path = u.health_path();
            // Up, but admitting nothing until its engine's cache is read: not ready, or a
            // replica just started would take traffic only to refuse it.
            let learning = *h == Health::Ready && admission.is_learning(*i);
            let (state, detail) = match learning {
                true => (
                    "learning",
                    format!(
                        "{path} answered; its KV cache (backends[].kv = \"engine\") is not read \
                         from the engine yet, and it admits nothing until it is"
                    ),
                ),
                false => (h.state(), h.detail(path)),
            };
            ready |= *h == Health::Ready && !learning;
            json!({"url": u.url, "state": state, "detail": detail})
        })
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
            // The vLLM it runs, as declared or learned from its engine (generating backends).
            let vllm_version = match runner {
                Runner::Generate => (gw.counter.settings.versions.in_force(i))
                    .map(|(v, source)| json!({"version": v.to_string(), "source": source})),
                Runner::Pooling => None,
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
                "kv_capacity_bytes_source": cfg.capacity_sources().0,
                "max_batch_source": cfg.capacity_sources().1,
                // Per priority class: what its leases hold and the most its share allows.
                "by_class": b.by_class,
                // Waiting for the backends of its runner.
                "queued": lane_snap.queued,
                "derived": cfg.derived,
                "vllm_version": vllm_version,
                "observed": observed,
            }));
        }
    }
    let mut out = json!({
        "backends": backends,
        // Whether every generating backend runs a vLLM that serves an output limit past the
        // context with what the context leaves (and so the gateway reserves and forwards that).
        "clamps_output_to_context": gw.counter.settings.versions.clamps_output_to_context(),
        "queued": snap.queued,
        "queued_by_tenant": snap.queued_by_tenant,
        "queued_by_class": snap.queued_by_class,
    });
    if let Some(shared) = snap.shared {
        out["shared_ledger"] = json!(shared);
    }
    out
}

/// The largest body a quota change reads (`{"window", "unit", "amount"}` is tens of bytes).
const QUOTA_BODY_BYTES: u64 = 64 << 10;

/// What a POST to a tenant's quotas does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaAction {
    /// Raises one meter's limit for the rest of its window.
    Grant,
    /// Forgets what meters' windows have spent and been granted.
    Reset,
}

/// `text` with its `%XX` escapes decoded; `None` when one is broken or the result is not UTF-8.
fn percent_decoded(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The body of a grant or a reset: which meter (or meters) and, for a grant, how much.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct QuotaChange {
    /// The window as `GET /admin/quotas` names it (`calendar-day@Asia/Shanghai`), or without
    /// its zone when that names one of the tenant's windows.
    window: Option<String>,
    /// `prefill`, `decode`, `total`, `weighted` or `cost`.
    unit: Option<String>,
    /// Tokens, or the currency for `cost`.
    amount: Option<serde_json::Number>,
}

impl QuotaChange {
    /// The body as JSON; an empty body asks nothing in particular (a reset of every meter).
    fn parse(body: &[u8]) -> Result<Self, ApiError> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(Self::default());
        }
        serde_json::from_slice(body).map_err(|e| {
            ApiError::invalid(format!(
                "the body is not the JSON expected ({e}): {{\"window\": \"calendar-day\", \"unit\": \"decode\", \"amount\": 1000}}"
            ))
        })
    }
}

/// One meter as the admin API shows it: amounts in its unit (tokens, or the currency for
/// `cost`), the reset as an RFC 3339 time in the window's zone.
fn meter_json(r: &Reading) -> Value {
    let m = &r.meter;
    let amount = |v: u64| match m.unit {
        Unit::Cost => json!(m.shown(v)),
        _ => json!(v),
    };
    json!({
        "window": m.window.label(),
        "timezone": m.window.timezone(),
        "unit": m.unit.name(),
        "limit": amount(r.limit),
        "configured_limit": amount(m.limit),
        "granted": amount(r.granted),
        "spent": amount(r.spent),
        "reserved": amount(r.reserved),
        "remaining": amount(r.remaining()),
        "currency": m.currency,
        "resets_at": m.window.local_time(r.resets_at),
        "resets_in_seconds": u64::try_from(r.resets_in().as_millis().div_ceil(1000)).unwrap_or(u64::MAX),
    })
}

/// 503 when the quota store cannot be asked (Redis down): nothing was read or changed.
fn store_down(e: StoreDown) -> ApiError {
    ApiError::limiter_unavailable(e.to_string(), Duration::from_secs(1))
}

/// Every tenant in force with quotas, in config order, and its meters now.
async fn quotas_json(gw: &Gateway) -> Result<Value, ApiError> {
    let live = gw.live.current();
    let mut out = Vec::new();
    for t in live
        .tenants
        .tenants()
        .iter()
        .filter(|t| !t.quotas.is_empty())
    {
        let readings = gw
            .quotas
            .read(&t.name, &t.quotas)
            .await
            .map_err(store_down)?;
        let meters: Vec<Value> = readings.iter().map(meter_json).collect();
        out.push(json!({"name": t.name, "meters": meters}));
    }
    Ok(json!({"tenants": out}))
}

/// The tenant in force called `name`, when it has quotas; else 404 naming those that do.
fn quota_tenant(gw: &Gateway, name: &str) -> Result<Arc<Tenant>, ApiError> {
    let live = gw.live.current();
    let with: Vec<&str> = (live.tenants.tenants().iter())
        .filter(|t| !t.quotas.is_empty())
        .map(|t| t.name.as_str())
        .collect();
    let those = match with.as_slice() {
        [] => "no tenant has quotas".to_string(),
        names => format!("tenants with quotas: {}", names.join(", ")),
    };
    match live.tenants.named(name) {
        Some(t) if !t.quotas.is_empty() => Ok(t.clone()),
        Some(_) => Err(ApiError::not_found(format!(
            "tenant {name} has no quotas; {those}"
        ))),
        None => Err(ApiError::not_found(format!("no tenant {name}; {those}"))),
    }
}

/// `amount` in the meter's unit for a log line: tokens, or the currency.
fn number(m: &Meter, amount: u64) -> String {
    match m.unit {
        Unit::Cost => m.shown(amount).to_string(),
        _ => amount.to_string(),
    }
}

/// `decode over calendar-day@Asia/Shanghai`.
fn named(m: &Meter) -> String {
    format!("{} over {}", m.unit, m.window.label())
}

/// The tenant's meters that `window` and `unit` pick (each, when given), in config order; a
/// window or a unit the tenant has none of is a 400 naming what it has.
fn pick<'t>(
    tenant: &'t Tenant,
    window: Option<&str>,
    unit: Option<&str>,
) -> Result<Vec<&'t Meter>, ApiError> {
    let meters = &tenant.quotas.meters;
    let mut labels: Vec<&str> = Vec::new();
    for m in meters {
        if !labels.contains(&m.window.label()) {
            labels.push(m.window.label());
        }
    }
    let mut picked: Vec<&Meter> = meters.iter().collect();
    if let Some(window) = window {
        let zoneless: Vec<&str> = (labels.iter().copied())
            .filter(|l| l.split('@').next() == Some(window))
            .collect();
        let label = match labels.iter().find(|l| **l == window) {
            Some(label) => *label,
            None => match zoneless.as_slice() {
                [label] => *label,
                [] => {
                    return Err(ApiError::invalid_param(
                        "window",
                        format!(
                            "tenant {} has no quota window {window}; its windows: {}",
                            tenant.name,
                            labels.join(", ")
                        ),
                    ))
                }
                several => {
                    return Err(ApiError::invalid_param(
                        "window",
                        format!(
                            "tenant {} has several {window} windows ({}): name one with its time zone",
                            tenant.name,
                            several.join(", ")
                        ),
                    ));
                }
            },
        };
        picked.retain(|m| m.window.label() == label);
    }
    if let Some(unit) = unit {
        let Some(&wanted) = Unit::ALL.iter().find(|u| u.name() == unit) else {
            let units: Vec<&str> = Unit::ALL.iter().map(|u| u.name()).collect();
            return Err(ApiError::invalid_param(
                "unit",
                format!("unit {unit} is none of {}", units.join(", ")),
            ));
        };
        let had: Vec<String> = picked.iter().map(|m| named(m)).collect();
        picked.retain(|m| m.unit == wanted);
        if picked.is_empty() {
            let over = window.map(|w| format!(" over {w}")).unwrap_or_default();
            return Err(ApiError::invalid_param(
                "unit",
                format!(
                    "tenant {} has no {unit} quota{over}; its quotas{over}: {}",
                    tenant.name,
                    had.join(", ")
                ),
            ));
        }
    }
    Ok(picked)
}

/// `amount` of `meter`'s unit, as the meter keeps it: whole tokens, or the currency in
/// pico-units (at most 10^7 of it, as a config's cost limit).
fn grant_amount(meter: &Meter, amount: &serde_json::Number) -> Result<u64, ApiError> {
    let refused = |what: &str| {
        ApiError::invalid_param(
            "amount",
            format!("amount {amount} for {}: {what}", named(meter)),
        )
    };
    match meter.unit {
        Unit::Cost => {
            let currency = meter.currency.as_deref().unwrap_or("");
            let value = amount.as_f64().unwrap_or(f64::NAN);
            if !(value > 0.0 && value <= 1e7) {
                return Err(refused(&format!(
                    "a grant is a sum of {currency} above 0, at most 10^7"
                )));
            }
            Ok((value * PICO_PER_UNIT).round() as u64)
        }
        _ => match amount.as_u64() {
            Some(tokens) if tokens > 0 => Ok(tokens),
            _ => Err(refused("a grant is a whole number of tokens above 0")),
        },
    }
}

/// `POST /admin/quotas/{tenant}/grant`: raises one meter's limit by `amount` for the rest of
/// its window (a rolling window's grant leaves it with the slice it was made in).
async fn grant(gw: &Gateway, name: &str, change: QuotaChange) -> Result<Vec<Value>, ApiError> {
    let tenant = quota_tenant(gw, name)?;
    let picked = pick(&tenant, change.window.as_deref(), change.unit.as_deref())?;
    let meter = match picked.as_slice() {
        [meter] => *meter,
        several => {
            let several: Vec<String> = several.iter().map(|m| named(m)).collect();
            return Err(ApiError::invalid(format!(
                "a grant raises one quota, and tenant {name} has {} that fit ({}): give window and unit",
                several.len(),
                several.join(", ")
            )));
        }
    };
    let Some(amount) = &change.amount else {
        return Err(ApiError::invalid_param(
            "amount",
            format!(
                "a grant needs an amount, in {}",
                meter.currency.as_deref().unwrap_or("tokens")
            ),
        ));
    };
    let amount = grant_amount(meter, amount)?;
    let reading = gw
        .quotas
        .grant(name, meter, amount)
        .await
        .map_err(store_down)?;
    tracing::info!(
        tenant = name,
        window = meter.window.label(),
        unit = meter.unit.name(),
        amount = %number(meter, amount),
        limit = %number(meter, reading.limit),
        by = "admin API",
        "quota granted"
    );
    Ok(vec![meter_json(&reading)])
}

/// `POST /admin/quotas/{tenant}/reset`: forgets what the meters picked (all of the tenant's
/// without `window` and `unit`) have spent and been granted in their windows; what requests in
/// flight hold stays held.
async fn reset(gw: &Gateway, name: &str, change: QuotaChange) -> Result<Vec<Value>, ApiError> {
    let tenant = quota_tenant(gw, name)?;
    if change.amount.is_some() {
        return Err(ApiError::invalid_param(
            "amount",
            "a reset takes window and unit (or neither: every quota of the tenant), no amount",
        ));
    }
    let picked = pick(&tenant, change.window.as_deref(), change.unit.as_deref())?;
    let before = gw
        .quotas
        .read(name, &tenant.quotas)
        .await
        .map_err(store_down)?;
    let mut out = Vec::with_capacity(picked.len());
    for meter in picked {
        let was = before.iter().find(|r| r.meter.id() == meter.id());
        let reading = gw.quotas.reset(name, meter).await.map_err(store_down)?;
        tracing::info!(
            tenant = name,
            window = meter.window.label(),
            unit = meter.unit.name(),
            spent = %number(meter, was.map_or(0, |r| r.spent)),
            granted = %number(meter, was.map_or(0, |r| r.granted)),
            by = "admin API",
            "quota reset"
        );
        out.push(meter_json(&reading));
    }
    Ok(out)
}

/// Sets every quota's gauges from its meter read now, so a rolling window's spend leaving it
/// and a calendar window's reset show without a request. The series are set anew each scrape
/// (a quota a reload removed goes); with a meter that cannot be read, the last values stay.
async fn refresh_quota_gauges(gw: &Gateway) {
    let live = gw.live.current();
    let mut read = Vec::new();
    let mut complete = true;
    for t in live
        .tenants
        .tenants()
        .iter()
        .filter(|t| !t.quotas.is_empty())
    {
        match gw.quotas.read(&t.name, &t.quotas).await {
            Ok(readings) => read.push((t.name.clone(), readings)),
            Err(e) => {
                complete = false;
                tracing::warn!(tenant = %t.name, error = %e, "quota gauges keep their last values");
            }
        }
    }
    // No await from here on: a scrape on this thread never sees the series half set.
    let m = &gw.metrics.state;
    if complete {
        m.quota_spent.clear();
        m.quota_limit.clear();
    }
    for (tenant, readings) in read {
        for r in readings {
            let labels = QuotaLabels {
                tenant: tenant.clone(),
                window: r.meter.window.label().to_string(),
                unit: r.meter.unit.name().to_string(),
            };
            m.quota(&labels, r.meter.shown(r.spent), r.meter.shown(r.limit));
        }
    }
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
    let m = &gw.metrics.state;
    for ((b, u), h) in ledgers.iter().zip(upstreams).zip(&health) {
        let label = BackendLabel {
            backend: u.url.clone(),
        };
        m.backend_up
            .get_or_create(&label)
            .set(i64::from(*h == Health::Ready));
        m.kv_reserved_bytes
            .get_or_create(&label)
            .set(b.kv_reserved_bytes as i64);
        m.kv_capacity_bytes
            .get_or_create(&label)
            .set(b.kv_capacity_bytes as i64);
    }
    m.queue_depth.set(snap.queued as i64);
    for (class, depth) in &snap.queued_by_class {
        let label = crate::metrics::ClassLabel {
            class: class.as_str().to_string(),
        };
        m.queue_depth_by_class
            .get_or_create(&label)
            .set(*depth as i64);
    }
    for t in gw.live.current().tenants.tenants() {
        let queued = snap.queued_by_tenant.get(&t.name).copied().unwrap_or(0);
        (m.queue_depth_by_tenant)
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
            m.bucket_available.get_or_create(&labels).set(b.available);
            m.bucket_capacity.get_or_create(&labels).set(b.capacity);
        }
    }
    refresh_quota_gauges(gw).await;
    m.sync_cache_counters(&gw.chat.stats());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{BucketSpec, TenantLimits};
    use crate::quota::config::TenantQuotas;
    use crate::quota::window::Window;

    fn meter(window: &str, zone: Option<&str>, unit: Unit, limit: u64) -> Meter {
        Meter {
            window: Window::parse(window, zone).unwrap(),
            unit,
            limit,
            currency: (unit == Unit::Cost).then(|| "USD".to_string()),
        }
    }

    /// Alice: decode and total over Shanghai's day, decode over Berlin's, cost over an hour.
    fn alice() -> Tenant {
        let spec = BucketSpec {
            rate_per_second: 1.0,
            burst_seconds: 1.0,
        };
        let limits = TenantLimits {
            prefill: spec,
            decode: spec,
            requests: spec,
        };
        let quotas = TenantQuotas {
            meters: vec![
                meter("calendar-day", Some("Asia/Shanghai"), Unit::Decode, 100),
                meter("calendar-day", Some("Asia/Shanghai"), Unit::Total, 1000),
                meter("calendar-day", Some("Europe/Berlin"), Unit::Decode, 50),
                meter("1h", None, Unit::Cost, 5_000_000_000_000),
            ],
            ..TenantQuotas::default()
        };
        Tenant::new("alice", limits).with_quotas(Arc::new(quotas))
    }

    fn ids(picked: Result<Vec<&Meter>, ApiError>) -> Vec<String> {
        picked.unwrap().iter().map(|m| m.id()).collect()
    }

    fn refusal(picked: Result<Vec<&Meter>, ApiError>) -> (Option<String>, String) {
        let e = picked.unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        (e.param, e.message)
    }

    /// What the table answers `method` on `path`: the route and tenant, or the refusal's status,
    /// `allow` header and message.
    fn answered(method: &str, path: &str) -> Result<(AdminRoute, String), (u16, String, String)> {
        let method = http::Method::from_bytes(method.as_bytes()).unwrap();
        match answering(&method, path, target(path)) {
            Ok(t) => Ok((t.route, t.tenant)),
            Err(e) => {
                let resp = e.to_response::<http_body_util::Full<bytes::Bytes>>();
                let allow = (resp.headers().get(header::ALLOW))
                    .map_or(String::new(), |v| v.to_str().unwrap().to_string());
                Err((resp.status().as_u16(), allow, e.message))
            }
        }
    }

    #[test]
    fn every_route_answers_its_method_on_its_path() {
        let ok = |route| Ok((route, String::new()));
        assert_eq!(answered("GET", "/metrics"), ok(AdminRoute::Metrics));
        assert_eq!(answered("GET", "/healthz"), ok(AdminRoute::Healthz));
        assert_eq!(answered("GET", "/readyz"), ok(AdminRoute::Readyz));
        assert_eq!(answered("GET", "/admin/tenants"), ok(AdminRoute::Tenants));
        assert_eq!(answered("GET", "/admin/quotas"), ok(AdminRoute::Quotas));
        assert_eq!(answered("GET", "/admin/backends"), ok(AdminRoute::Backends));
        assert_eq!(answered("GET", "/admin/profile"), ok(AdminRoute::Profile));
        assert_eq!(answered("POST", "/admin/reload"), ok(AdminRoute::Reload));
        assert_eq!(
            answered("POST", "/admin/quotas/alice/grant"),
            Ok((AdminRoute::Quota(QuotaAction::Grant), "alice".to_string()))
        );
        assert_eq!(
            answered("POST", "/admin/quotas/team%20a%2Fb/reset"),
            Ok((
                AdminRoute::Quota(QuotaAction::Reset),
                "team a/b".to_string()
            ))
        );
    }

    #[test]
    fn an_unknown_path_is_a_404_whatever_the_method() {
        let missing = |method: &str, path: &str| {
            (
                404,
                String::new(),
                format!("no admin route {method} {path}"),
            )
        };
        for method in ["GET", "POST", "DELETE"] {
            for path in [
                "/admin/anything",
                "/admin",
                "/",
                "/metrics/",
                "/admin/tenants/alice",
            ] {
                assert_eq!(answered(method, path), Err(missing(method, path)));
            }
        }
        let quota = "; under /admin/quotas: POST /admin/quotas/{tenant}/grant, POST /admin/quotas/{tenant}/reset";
        for path in [
            "/admin/quotas/alice/spend",
            "/admin/quotas/alice",
            "/admin/quotas//grant",
            "/admin/quotas/al%2/grant",
            "/admin/quotas/%ff/grant",
        ] {
            let (status, allow, message) = missing("POST", path);
            assert_eq!(
                answered("POST", path),
                Err((status, allow, message + quota)),
                "{path}"
            );
        }
    }

    #[test]
    fn a_known_path_with_another_method_is_a_405_allowing_its_own() {
        let wrong = |method: &str, path: &str, allow: &str| {
            let message = format!("{method} is not allowed on {path}; it answers {allow}");
            assert_eq!(
                answered(method, path),
                Err((405, allow.to_string(), message))
            );
        };
        wrong("POST", "/metrics", "GET");
        wrong("POST", "/healthz", "GET");
        wrong("HEAD", "/readyz", "GET");
        wrong("POST", "/admin/tenants", "GET");
        wrong("POST", "/admin/quotas", "GET");
        wrong("DELETE", "/admin/backends", "GET");
        wrong("PUT", "/admin/profile", "GET");
        wrong("GET", "/admin/reload", "POST");
        wrong("GET", "/admin/quotas/alice/grant", "POST");
        wrong("GET", "/admin/quotas/alice/reset", "POST");
    }

    #[test]
    fn only_the_probes_are_open_without_the_token() {
        let open: Vec<&str> = (ADMIN_ROUTES.iter())
            .filter(|(_, _, route)| route.is_probe())
            .map(|(path, ..)| *path)
            .collect();
        assert_eq!(open, ["/healthz", "/readyz"]);
    }

    #[test]
    fn window_and_unit_pick_meters_and_what_is_missing_is_named_with_what_there_is() {
        let alice = alice();
        assert_eq!(ids(pick(&alice, None, None)).len(), 4);
        assert_eq!(
            ids(pick(&alice, Some("calendar-day@Asia/Shanghai"), None)),
            [
                "calendar-day@Asia/Shanghai|decode",
                "calendar-day@Asia/Shanghai|total"
            ]
        );
        assert_eq!(ids(pick(&alice, Some("1h"), None)), ["1h|cost"]);
        assert_eq!(
            ids(pick(&alice, None, Some("decode"))),
            [
                "calendar-day@Asia/Shanghai|decode",
                "calendar-day@Europe/Berlin|decode"
            ]
        );
        assert_eq!(
            refusal(pick(&alice, Some("calendar-day"), None)),
            (
                Some("window".to_string()),
                "tenant alice has several calendar-day windows (calendar-day@Asia/Shanghai, calendar-day@Europe/Berlin): name one with its time zone".to_string()
            )
        );
        assert_eq!(
            refusal(pick(&alice, Some("7d"), None)).1,
            "tenant alice has no quota window 7d; its windows: calendar-day@Asia/Shanghai, calendar-day@Europe/Berlin, 1h"
        );
        assert_eq!(
            refusal(pick(&alice, Some("1h"), Some("decode"))),
            (
                Some("unit".to_string()),
                "tenant alice has no decode quota over 1h; its quotas over 1h: cost over 1h"
                    .to_string()
            )
        );
        assert_eq!(
            refusal(pick(&alice, None, Some("weighted"))).1,
            "tenant alice has no weighted quota; its quotas: decode over calendar-day@Asia/Shanghai, total over calendar-day@Asia/Shanghai, decode over calendar-day@Europe/Berlin, cost over 1h"
        );
        assert_eq!(
            refusal(pick(&alice, None, Some("tokens"))).1,
            "unit tokens is none of prefill, decode, total, weighted, cost"
        );
        // A window's name without its zone is enough when it names one window.
        let mut one = alice.clone();
        Arc::make_mut(&mut one.quotas).meters.truncate(2);
        assert_eq!(
            ids(pick(&one, Some("calendar-day"), Some("total"))),
            ["calendar-day@Asia/Shanghai|total"]
        );
    }

    #[test]
    fn a_grant_is_whole_tokens_or_a_sum_of_the_currency_in_pico_units() {
        let alice = alice();
        let (decode, cost) = (&alice.quotas.meters[0], &alice.quotas.meters[3]);
        let n = |text: &str| serde_json::from_str::<serde_json::Number>(text).unwrap();
        assert_eq!(grant_amount(decode, &n("1000")).unwrap(), 1000);
        assert_eq!(grant_amount(cost, &n("2.5")).unwrap(), 2_500_000_000_000);
        assert_eq!(grant_amount(cost, &n("0.000001")).unwrap(), 1_000_000);
        let refused = |m: &Meter, text: &str| grant_amount(m, &n(text)).unwrap_err().message;
        assert_eq!(
            refused(decode, "1.5"),
            "amount 1.5 for decode over calendar-day@Asia/Shanghai: a grant is a whole number of tokens above 0"
        );
        assert_eq!(
            refused(decode, "0"),
            "amount 0 for decode over calendar-day@Asia/Shanghai: a grant is a whole number of tokens above 0"
        );
        assert_eq!(
            refused(cost, "-1"),
            "amount -1 for cost over 1h: a grant is a sum of USD above 0, at most 10^7"
        );
    }

    #[test]
    fn a_change_is_json_with_known_fields_or_nothing() {
        let parsed =
            QuotaChange::parse(br#"{"window": "1h", "unit": "cost", "amount": 2.5}"#).unwrap();
        assert_eq!(
            (parsed.window.as_deref(), parsed.unit.as_deref()),
            (Some("1h"), Some("cost"))
        );
        let empty = QuotaChange::parse(b" \n").unwrap();
        assert!(empty.window.is_none() && empty.unit.is_none() && empty.amount.is_none());
        let e = QuotaChange::parse(br#"{"windw": "1h"}"#).unwrap_err();
        assert!(
            e.message
                .starts_with("the body is not the JSON expected (unknown field `windw`"),
            "{}",
            e.message
        );
    }
}
