//! Prometheus metrics. One [`Metrics`] value owns its registry and is passed to whoever records
//! (no global statics), so tests can run many gateways in one process. Gauges that mirror
//! state owned elsewhere (KV ledger, queue, buckets) are refreshed when `/metrics` is scraped.

use crate::error_code::ErrorCode;
use crate::limiter::BucketLabels;
use crate::tokenize::cache::CacheStats;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::family::MetricConstructor;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use std::sync::OnceLock;

/// `{tenant}`.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantLabel {
    /// Tenant name.
    pub tenant: String,
}

/// `{tenant, outcome}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// Tenant name (`unknown` before authentication).
    pub tenant: String,
    /// How the request ended: `ok`, or the error code it got.
    pub outcome: String,
}

/// How a request ended: the `outcome` label of `tokengate_requests_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A complete answer (`ok`).
    Ok,
    /// The client went away while the request was charged and not yet settled
    /// (`client_disconnect`).
    ClientDisconnect,
    /// Refused, or cut short by the backend, with this error code (`rate_limit_exceeded`,
    /// `upstream_error`, ...).
    Failed(ErrorCode),
}

impl Outcome {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::ClientDisconnect => "client_disconnect",
            Outcome::Failed(code) => code.as_str(),
        }
    }
}

/// `{backend}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BackendLabel {
    /// Backend URL.
    pub backend: String,
}

/// `{backend, kind}` of a count the backend reported.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CountErrorLabels {
    /// Backend URL.
    pub backend: String,
    /// `prompt` (`usage.prompt_tokens` against the prompt charged) or `output`
    /// (`usage.completion_tokens` against the output the gateway metered).
    pub kind: String,
}

/// `{backend, key}` of a geometry key that differs from the engine's.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KvMismatchLabels {
    /// Backend URL.
    pub backend: String,
    /// The config key (`model.block_tokens`, `kv_capacity_bytes`, ...).
    pub key: String,
}

/// `{backend, reason}` of a failed scrape of a backend's metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ScrapeFailureLabels {
    /// Backend URL.
    pub backend: String,
    /// `fetch` (unreachable, slow, too large, not 2xx, not UTF-8) or `parse` (not Prometheus
    /// text).
    pub reason: String,
}

/// `{listener}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ListenerLabel {
    /// `main` or `admin`.
    pub listener: String,
}

/// `{class}`: a priority class.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClassLabel {
    /// `critical`, `standard` or `sheddable`.
    pub class: String,
}

/// `{class, reason}` of a request the KV queue refused.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueRefusalLabels {
    /// The request's class.
    pub class: String,
    /// `queue_full`, `shed` (sheddable while a higher class waits), `displaced` (gave its place
    /// to a higher class) or `deadline`.
    pub reason: String,
}

/// `{listener, reason}` of a connection the gateway closed.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConnectionClosedLabels {
    /// `main` or `admin`.
    pub listener: String,
    /// `header_timeout`, `idle_timeout`, `write_timeout` or `evicted`.
    pub reason: String,
}

/// `{result}` of a config reload.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReloadLabel {
    /// `ok` or `error`.
    pub result: String,
}

/// `{tenant, window, unit}` of a tenant's quota.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QuotaLabels {
    /// Tenant name.
    pub tenant: String,
    /// The window as configured: `calendar-day`, `calendar-month`, `1h`, `1d`, `7d`, with
    /// `@` and its time zone when that is not UTC (`calendar-day@Asia/Shanghai`).
    pub window: String,
    /// `prefill`, `decode`, `total`, `weighted` or `cost`.
    pub unit: String,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 1 ms .. ~65 s
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

fn count_error_histogram() -> Histogram {
    // The backend's count minus the gateway's, in tokens: 0 exactly, then powers of 4 each
    // side up to 4,096 (a template or default that changed shows as a shift, a tokenizer
    // mismatch as a spread).
    let below = (0..7).rev().map(|i| -(4f64.powi(i)));
    let above = (0..7).map(|i| 4f64.powi(i));
    Histogram::new(below.chain([0.0]).chain(above))
}

fn token_histogram() -> Histogram {
    // 16 .. ~1M tokens
    Histogram::new(exponential_buckets(16.0, 2.0, 17))
}

/// Every metric the gateway exports.
pub struct Metrics {
    registry: Registry,
    /// Requests by tenant and outcome.
    pub requests: Family<OutcomeLabels, Counter>,
    /// Prompt tokens charged.
    pub prefill_tokens: Family<TenantLabel, Counter>,
    /// Output tokens actually generated.
    pub decode_tokens: Family<TenantLabel, Counter>,
    /// Output tokens reserved at admission.
    pub decode_tokens_reserved: Family<TenantLabel, Counter>,
    /// Output tokens given back at settlement.
    pub decode_tokens_refunded: Family<TenantLabel, Counter>,
    /// Chats sent without an output limit whose output was capped at `model.default_max_tokens`
    /// (vLLM alone would allow up to the context).
    pub output_capped_at_default: Family<TenantLabel, Counter>,
    /// Bytes of request bodies read and then refused, or drained after a refusal.
    pub refused_body_bytes: Family<TenantLabel, Counter>,
    /// Time from request arrival to the first output token.
    pub ttft: HistogramFamily<TenantLabel>,
    /// Mean gap between output tokens after the first.
    pub tpot: HistogramFamily<TenantLabel>,
    /// Time waiting for KV space.
    pub queue_wait: HistogramFamily<TenantLabel>,
    /// Time to count one request's prompt (queue for a worker included).
    pub tokenize: Histogram,
    /// Prompt lengths.
    pub prompt_tokens: HistogramFamily<TenantLabel>,
    /// Output lengths.
    pub output_tokens: HistogramFamily<TenantLabel>,
    /// Requests in flight: charged and not yet settled (queued for KV or running), what
    /// `tenants[].max_inflight` caps.
    pub inflight: Family<TenantLabel, Gauge>,
    /// KV bytes leased per backend.
    pub kv_reserved_bytes: Family<BackendLabel, Gauge>,
    /// KV bytes per backend.
    pub kv_capacity_bytes: Family<BackendLabel, Gauge>,
    /// 1 while a backend answers its health path (asked at each scrape), else 0.
    pub backend_up: Family<BackendLabel, Gauge>,
    /// The effective KV capacity as a share of the configured one (backend feedback).
    pub kv_capacity_scale: Family<BackendLabel, Gauge<f64, AtomicU64>>,
    /// Requests waiting in the backend's own queue, as it last reported.
    pub backend_waiting: Family<BackendLabel, Gauge>,
    /// Requests in the backend's running batch, as it last reported.
    pub backend_running: Family<BackendLabel, Gauge>,
    /// The backend's KV-cache usage (0..1), as it last reported.
    pub backend_kv_usage: Family<BackendLabel, Gauge<f64, AtomicU64>>,
    /// Scrapes of the backend's metrics that failed, by why.
    pub backend_scrape_failures: Family<ScrapeFailureLabels, Counter>,
    /// 1 where a key of the geometry in force differs from the engine's.
    pub backend_kv_mismatch: Family<KvMismatchLabels, Gauge>,
    /// Requests waiting for KV space.
    pub queue_depth: Gauge,
    /// Requests waiting for KV space, per priority class.
    pub queue_depth_by_class: Family<ClassLabel, Gauge>,
    /// Requests waiting for KV space, per tenant (what `tenants[].max_queued` caps).
    pub queue_depth_by_tenant: Family<TenantLabel, Gauge>,
    /// Requests the KV queue refused (503 `capacity_exhausted`), by class and reason.
    pub queue_refusals: Family<QueueRefusalLabels, Counter>,
    /// Client connections open per listener.
    pub open_connections: Family<ListenerLabel, Gauge>,
    /// Client connections the gateway closed for a bound in time (or to make room), per
    /// listener and reason.
    pub connections_closed: Family<ConnectionClosedLabels, Counter>,
    /// Tokens available now per tenant bucket.
    pub bucket_available: Family<BucketLabels, Gauge<f64, AtomicU64>>,
    /// Capacity per tenant bucket (rate x burst), so levels can be shown as a fraction.
    pub bucket_capacity: Family<BucketLabels, Gauge<f64, AtomicU64>>,
    /// What a tenant has spent in its quota window's current period, in the quota's unit
    /// (tokens, or currency for `cost`).
    pub quota_spent: Family<QuotaLabels, Gauge<f64, AtomicU64>>,
    /// The limit in force for the current period of a tenant's quota window (grants included).
    pub quota_limit: Family<QuotaLabels, Gauge<f64, AtomicU64>>,
    /// Chat-count memo hits (per rendered message).
    pub tokenize_cache_hits: Counter,
    /// Chat-count memo misses.
    pub tokenize_cache_misses: Counter,
    /// Chat answers counted ahead for their conversation's next turn.
    pub tokenize_cache_replies: Counter,
    /// Config reloads (SIGHUP, `POST /admin/reload`) by result.
    pub config_reloads: Family<ReloadLabel, Counter>,
    /// The backend's count minus the gateway's, per answer that reported one.
    pub count_error: HistogramFamily<CountErrorLabels>,
    /// The shared limiter store's errors, latency and fallback state.
    pub limiter_store: crate::limiter::redis::StoreMetrics,
    /// How the local quota store's file writes go.
    pub quota_file: crate::quota::store::FileMetrics,
    /// Usage-log records dropped because its buffer was full.
    pub usage_log_dropped: Counter,
    /// Usage-log batches that failed to write.
    pub usage_log_write_errors: Counter,
    /// 1 when the last load of the config file (at start or a reload) succeeded, else 0.
    pub config_last_reload_successful: Gauge,
    /// Unix time of the last successful load of the config file (at start or a reload).
    pub config_last_reload_success: Gauge<f64, AtomicU64>,
    /// Memo totals already exported (hits, misses, replies), so each scrape adds only what is
    /// new.
    cache_exported: [std::sync::atomic::AtomicU64; 3],
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A fresh registry with every metric registered under the `tokengate_` prefix.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("tokengate");
        let m = Self {
            requests: Family::default(),
            prefill_tokens: Family::default(),
            decode_tokens: Family::default(),
            decode_tokens_reserved: Family::default(),
            decode_tokens_refunded: Family::default(),
            output_capped_at_default: Family::default(),
            refused_body_bytes: Family::default(),
            ttft: Family::new_with_constructor(latency_histogram),
            tpot: Family::new_with_constructor(latency_histogram),
            queue_wait: Family::new_with_constructor(latency_histogram),
            tokenize: Histogram::new(exponential_buckets(0.00001, 2.0, 20)),
            prompt_tokens: Family::new_with_constructor(token_histogram),
            output_tokens: Family::new_with_constructor(token_histogram),
            inflight: Family::default(),
            kv_reserved_bytes: Family::default(),
            kv_capacity_bytes: Family::default(),
            backend_up: Family::default(),
            kv_capacity_scale: Family::default(),
            backend_waiting: Family::default(),
            backend_running: Family::default(),
            backend_kv_usage: Family::default(),
            backend_kv_mismatch: Family::default(),
            backend_scrape_failures: Family::default(),
            queue_depth: Gauge::default(),
            queue_depth_by_class: Family::default(),
            queue_depth_by_tenant: Family::default(),
            queue_refusals: Family::default(),
            open_connections: Family::default(),
            connections_closed: Family::default(),
            bucket_available: Family::default(),
            bucket_capacity: Family::default(),
            quota_spent: Family::default(),
            quota_limit: Family::default(),
            tokenize_cache_hits: Counter::default(),
            tokenize_cache_misses: Counter::default(),
            tokenize_cache_replies: Counter::default(),
            config_reloads: Family::default(),
            count_error: Family::new_with_constructor(count_error_histogram),
            limiter_store: Default::default(),
            quota_file: Default::default(),
            usage_log_dropped: Counter::default(),
            usage_log_write_errors: Counter::default(),
            config_last_reload_successful: Gauge::default(),
            config_last_reload_success: Gauge::default(),
            cache_exported: Default::default(),
            registry: Registry::default(),
        };
        let r = &mut registry;
        r.register(
            "requests",
            "Requests by tenant and outcome",
            m.requests.clone(),
        );
        r.register(
            "prefill_tokens",
            "Prompt tokens charged",
            m.prefill_tokens.clone(),
        );
        r.register(
            "decode_tokens",
            "Output tokens generated",
            m.decode_tokens.clone(),
        );
        r.register(
            "decode_tokens_reserved",
            "Output tokens reserved at admission (max_tokens)",
            m.decode_tokens_reserved.clone(),
        );
        r.register(
            "decode_tokens_refunded",
            "Reserved output tokens given back at settlement",
            m.decode_tokens_refunded.clone(),
        );
        r.register(
            "output_capped_at_default",
            "Chats and responses without an output limit capped at model.default_max_tokens (vLLM would allow up to the context)",
            m.output_capped_at_default.clone(),
        );
        r.register(
            "refused_body_bytes",
            "Bytes of request bodies read and then refused, or drained after a refusal before reading (what server.refused_body_bytes_per_second paces)",
            m.refused_body_bytes.clone(),
        );
        r.register(
            "ttft_seconds",
            "Time from request arrival to first output token (queueing included)",
            m.ttft.clone(),
        );
        r.register(
            "tpot_seconds",
            "Mean time per output token after the first",
            m.tpot.clone(),
        );
        r.register(
            "queue_wait_seconds",
            "Time spent waiting for KV space",
            m.queue_wait.clone(),
        );
        r.register(
            "tokenize_seconds",
            "Time to count a request's prompt tokens",
            m.tokenize.clone(),
        );
        r.register(
            "prompt_tokens",
            "Prompt length per request",
            m.prompt_tokens.clone(),
        );
        r.register(
            "output_tokens",
            "Output length per request",
            m.output_tokens.clone(),
        );
        r.register(
            "inflight_requests",
            "Requests charged and not yet settled (queued for KV or running)",
            m.inflight.clone(),
        );
        r.register(
            "kv_reserved_bytes",
            "KV-cache bytes leased on a backend",
            m.kv_reserved_bytes.clone(),
        );
        r.register(
            "kv_capacity_bytes",
            "KV-cache bytes a backend has for sequences",
            m.kv_capacity_bytes.clone(),
        );
        r.register(
            "backend_up",
            "1 while the backend answers its health path within its health_timeout (asked at each scrape)",
            m.backend_up.clone(),
        );
        r.register(
            "kv_capacity_scale",
            "Effective KV capacity admitted against, as a share of the configured one (backend feedback)",
            m.kv_capacity_scale.clone(),
        );
        r.register(
            "backend_requests_waiting",
            "Requests waiting in the backend's own queue, as its metrics last said",
            m.backend_waiting.clone(),
        );
        r.register(
            "backend_requests_running",
            "Requests in the backend's running batch, as its metrics last said",
            m.backend_running.clone(),
        );
        r.register(
            "backend_kv_usage",
            "The backend's KV-cache usage (0..1), as its metrics last said",
            m.backend_kv_usage.clone(),
        );
        r.register(
            "backend_kv_mismatch",
            "1 where a key of the KV geometry in force (set by hand, or model.max_model_len) differs from what the engine reports (0 once it no longer does)",
            m.backend_kv_mismatch.clone(),
        );
        r.register(
            "backend_scrape_failures",
            "Scrapes of the backend's metrics that failed: fetch (unreachable, slow, too large, not 2xx) or parse (not Prometheus text)",
            m.backend_scrape_failures.clone(),
        );
        r.register(
            "queue_depth",
            "Requests waiting for KV space",
            m.queue_depth.clone(),
        );
        r.register(
            "queue_depth_by_class",
            "Requests waiting for KV space, per priority class",
            m.queue_depth_by_class.clone(),
        );
        r.register(
            "queue_depth_by_tenant",
            "Requests waiting for KV space, per tenant",
            m.queue_depth_by_tenant.clone(),
        );
        r.register(
            "queue_refusals",
            "Requests the KV queue refused with 503, by class and reason (queue_full, shed, displaced, deadline)",
            m.queue_refusals.clone(),
        );
        r.register(
            "open_connections",
            "Client connections open on a listener (main: at most server.max_connections)",
            m.open_connections.clone(),
        );
        r.register(
            "connections_closed",
            "Client connections the gateway closed: no request head within server.header_read_timeout, idle for server.idle_timeout, no bytes of a write or of an answer taken for server.client_write_timeout, or (admin) the oldest idle one closed to make room at the cap",
            m.connections_closed.clone(),
        );
        r.register(
            "bucket_available_tokens",
            "Tokens available now in a tenant's bucket",
            m.bucket_available.clone(),
        );
        r.register(
            "bucket_capacity_tokens",
            "Capacity of a tenant's bucket (rate x burst_seconds)",
            m.bucket_capacity.clone(),
        );
        r.register(
            "quota_spent",
            "What a tenant has spent in the current period of its quota window, in the quota's unit (tokens for prefill, decode, total and weighted; currency for cost)",
            m.quota_spent.clone(),
        );
        r.register(
            "quota_limit",
            "The limit of a tenant's quota for the current period of its window, in the quota's unit (grants included)",
            m.quota_limit.clone(),
        );
        r.register(
            "tokenize_cache_hits",
            "Chat turn spans whose token count came from the memo",
            m.tokenize_cache_hits.clone(),
        );
        r.register(
            "tokenize_cache_misses",
            "Chat turn spans that had to be tokenized",
            m.tokenize_cache_misses.clone(),
        );
        r.register(
            "tokenize_cache_replies",
            "Chat answers counted ahead for their conversation's next turn",
            m.tokenize_cache_replies.clone(),
        );
        r.register(
            "count_error_tokens",
            "The backend's usage count minus what the gateway counted (prompt: charged; output: metered), per answer",
            m.count_error.clone(),
        );
        r.register(
            "config_reloads",
            "Config reloads (SIGHUP, POST /admin/reload) by result",
            m.config_reloads.clone(),
        );
        r.register(
            "config_last_reload_successful",
            "1 when the last load of the config file (at start or a reload) succeeded, else 0",
            m.config_last_reload_successful.clone(),
        );
        r.register(
            "config_last_reload_success_timestamp_seconds",
            "Unix time of the last successful load of the config file (at start or a reload)",
            m.config_last_reload_success.clone(),
        );
        r.register(
            "usage_log_dropped",
            "Usage-log records dropped because its buffer was full",
            m.usage_log_dropped.clone(),
        );
        r.register(
            "usage_log_write_errors",
            "Usage-log batches that failed to write (their records are lost)",
            m.usage_log_write_errors.clone(),
        );
        m.limiter_store.register(r);
        m.quota_file.register(r);
        // Both results exported from the start, so a rate over them is defined before the first
        // reload.
        for result in ["ok", "error"] {
            drop(m.config_reloads.get_or_create(&ReloadLabel {
                result: result.to_string(),
            }));
        }
        Self { registry, ..m }
    }

    /// The config was loaded at startup: the last load succeeded, now.
    pub fn config_loaded(&self) {
        self.config_last_reload_successful.set(1);
        self.config_last_reload_success.set(unix_now());
    }

    /// Counts a reload and its result.
    pub fn config_reloaded(&self, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.config_reloads
            .get_or_create(&ReloadLabel {
                result: result.to_string(),
            })
            .inc();
        if ok {
            self.config_loaded();
        } else {
            self.config_last_reload_successful.set(0);
        }
    }

    /// A removed tenant's bucket gauges (and its queue depth, set at each scrape) are dropped,
    /// so the dashboard stops showing them.
    pub fn forget_tenant_buckets(&self, tenant: &str) {
        self.queue_depth_by_tenant.remove(&self::tenant(tenant));
        for bucket in ["prefill", "decode", "requests"] {
            let labels = BucketLabels {
                tenant: tenant.to_string(),
                bucket: bucket.to_string(),
            };
            self.bucket_available.remove(&labels);
            self.bucket_capacity.remove(&labels);
        }
    }

    /// Sets a tenant's quota gauges: `spent` in the current period of the window, against
    /// `limit` (grants included), both in the quota's unit.
    pub fn quota(&self, labels: &QuotaLabels, spent: f64, limit: f64) {
        self.quota_spent.get_or_create(labels).set(spent);
        self.quota_limit.get_or_create(labels).set(limit);
    }

    /// Counts a finished request.
    pub fn outcome(&self, tenant: &str, outcome: Outcome) {
        self.requests
            .get_or_create(&OutcomeLabels {
                tenant: tenant.to_string(),
                outcome: outcome.as_str().to_string(),
            })
            .inc();
    }

    /// Counts a request of `class` the KV queue refused for `reason`.
    pub fn queue_refused(&self, class: &str, reason: &str) {
        self.queue_refusals
            .get_or_create(&QueueRefusalLabels {
                class: class.to_string(),
                reason: reason.to_string(),
            })
            .inc();
    }

    /// Brings the memo counters up to the memo's own running totals. `fetch_max` makes
    /// concurrent scrapes add each increment once.
    pub fn sync_cache_counters(&self, stats: &CacheStats) {
        use std::sync::atomic::Ordering;
        for (total, exported, counter) in [
            (
                stats.hits,
                &self.cache_exported[0],
                &self.tokenize_cache_hits,
            ),
            (
                stats.misses,
                &self.cache_exported[1],
                &self.tokenize_cache_misses,
            ),
            (
                stats.replies,
                &self.cache_exported[2],
                &self.tokenize_cache_replies,
            ),
        ] {
            let before = exported.fetch_max(total, Ordering::Relaxed);
            if total > before {
                counter.inc_by(total - before);
            }
        }
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

/// Wall-clock seconds since the Unix epoch (a timestamp for dashboards, never a decision).
fn unix_now() -> f64 {
    use crate::clock::{Clock, SystemClock};
    SystemClock.wall_ms() as f64 / 1000.0
}

/// Label helper.
pub fn tenant(name: &str) -> TenantLabel {
    TenantLabel {
        tenant: name.to_string(),
    }
}

/// One tenant's series of the per-tenant metrics, each found in its family the first time it
/// is recorded and kept from then on, so the request path records without building label
/// strings or looking up a family. A series appears in the exposition when it is first
/// recorded, as it would with `get_or_create` at each request. Resolved against the first
/// [`Metrics`] passed in: one tenant value serves one gateway (each builds its own tenants).
#[derive(Clone, Default)]
pub struct TenantMetrics {
    label: TenantLabel,
    requests_ok: OnceLock<Counter>,
    prefill_tokens: OnceLock<Counter>,
    decode_tokens: OnceLock<Counter>,
    decode_tokens_reserved: OnceLock<Counter>,
    decode_tokens_refunded: OnceLock<Counter>,
    ttft: OnceLock<Histogram>,
    tpot: OnceLock<Histogram>,
    queue_wait: OnceLock<Histogram>,
    prompt_tokens: OnceLock<Histogram>,
    output_tokens: OnceLock<Histogram>,
    inflight: OnceLock<Gauge>,
}

impl std::fmt::Debug for TenantMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantMetrics")
            .field("tenant", &self.label.tenant)
            .finish_non_exhaustive()
    }
}

/// The series of `family` for `label`, from `cell` once it was looked up.
fn series<'a, M: Clone, C: MetricConstructor<M>>(
    cell: &'a OnceLock<M>,
    family: &Family<TenantLabel, M, C>,
    label: &TenantLabel,
) -> &'a M {
    cell.get_or_init(|| family.get_or_create(label).clone())
}

impl TenantMetrics {
    /// The (not yet looked up) series of tenant `name`.
    pub fn new(name: &str) -> Self {
        Self {
            label: tenant(name),
            ..Self::default()
        }
    }

    /// Counts a finished request ([`Metrics::outcome`]); `ok`, the common one, from its kept
    /// series.
    pub fn outcome(&self, m: &Metrics, outcome: Outcome) {
        if outcome == Outcome::Ok {
            let ok = self.requests_ok.get_or_init(|| {
                m.requests
                    .get_or_create(&OutcomeLabels {
                        tenant: self.label.tenant.clone(),
                        outcome: outcome.as_str().to_string(),
                    })
                    .clone()
            });
            ok.inc();
        } else {
            m.outcome(&self.label.tenant, outcome);
        }
    }

    /// `prefill_tokens_total`.
    pub fn prefill_tokens(&self, m: &Metrics) -> &Counter {
        series(&self.prefill_tokens, &m.prefill_tokens, &self.label)
    }

    /// `decode_tokens_total`.
    pub fn decode_tokens(&self, m: &Metrics) -> &Counter {
        series(&self.decode_tokens, &m.decode_tokens, &self.label)
    }

    /// `decode_tokens_reserved_total`.
    pub fn decode_tokens_reserved(&self, m: &Metrics) -> &Counter {
        series(
            &self.decode_tokens_reserved,
            &m.decode_tokens_reserved,
            &self.label,
        )
    }

    /// `decode_tokens_refunded_total`.
    pub fn decode_tokens_refunded(&self, m: &Metrics) -> &Counter {
        series(
            &self.decode_tokens_refunded,
            &m.decode_tokens_refunded,
            &self.label,
        )
    }

    /// `ttft_seconds`.
    pub fn ttft(&self, m: &Metrics) -> &Histogram {
        series(&self.ttft, &m.ttft, &self.label)
    }

    /// `tpot_seconds`.
    pub fn tpot(&self, m: &Metrics) -> &Histogram {
        series(&self.tpot, &m.tpot, &self.label)
    }

    /// `queue_wait_seconds`.
    pub fn queue_wait(&self, m: &Metrics) -> &Histogram {
        series(&self.queue_wait, &m.queue_wait, &self.label)
    }

    /// `prompt_tokens`.
    pub fn prompt_tokens(&self, m: &Metrics) -> &Histogram {
        series(&self.prompt_tokens, &m.prompt_tokens, &self.label)
    }

    /// `output_tokens`.
    pub fn output_tokens(&self, m: &Metrics) -> &Histogram {
        series(&self.output_tokens, &m.output_tokens, &self.label)
    }

    /// `inflight_requests`.
    pub fn inflight(&self, m: &Metrics) -> &Gauge {
        series(&self.inflight, &m.inflight, &self.label)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_prefix_and_total_suffix() {
        let m = Metrics::new();
        m.outcome("alice", Outcome::Ok);
        m.queue_depth.set(3);
        let stats = |hits, replies| CacheStats {
            hits,
            misses: 2,
            replies,
            entries: 0,
            bytes: 0,
        };
        m.sync_cache_counters(&stats(5, 1));
        m.sync_cache_counters(&stats(5, 1));
        m.sync_cache_counters(&stats(7, 3));
        let text = m.encode();
        assert!(text.contains("tokengate_requests_total{tenant=\"alice\",outcome=\"ok\"} 1"));
        assert!(text.contains("tokengate_queue_depth 3"));
        assert!(text.contains("tokengate_tokenize_cache_hits_total 7"));
        assert!(text.contains("tokengate_tokenize_cache_misses_total 2"));
        assert!(text.contains("tokengate_tokenize_cache_replies_total 3"));
        assert!(text.contains("tokengate_config_reloads_total{result=\"ok\"} 0"));
        assert!(text.contains("tokengate_config_reloads_total{result=\"error\"} 0"));
        assert!(text.contains("tokengate_config_last_reload_successful 0"));
    }

    #[test]
    fn tenant_series_are_the_families_series() {
        let m = Metrics::new();
        let alice = TenantMetrics::new("alice");
        assert!(!m.encode().contains("alice"), "nothing recorded yet");
        alice.prefill_tokens(&m).inc_by(5);
        alice.prefill_tokens(&m).inc_by(2);
        m.prefill_tokens.get_or_create(&tenant("alice")).inc();
        alice.outcome(&m, Outcome::Ok);
        alice.outcome(&m, Outcome::Ok);
        alice.outcome(&m, Outcome::Failed(ErrorCode::RateLimitExceeded));
        alice.inflight(&m).inc();
        alice.output_tokens(&m).observe(20.0);
        let text = m.encode();
        assert!(text.contains("tokengate_prefill_tokens_total{tenant=\"alice\"} 8"));
        assert!(text.contains("tokengate_requests_total{tenant=\"alice\",outcome=\"ok\"} 2"));
        assert!(text.contains(
            "tokengate_requests_total{tenant=\"alice\",outcome=\"rate_limit_exceeded\"} 1"
        ));
        assert!(text.contains("tokengate_inflight_requests{tenant=\"alice\"} 1"));
        assert!(text.contains("tokengate_output_tokens_count{tenant=\"alice\"} 1"));
        assert!(!text.contains("tokengate_ttft_seconds_count{tenant=\"alice\"}"));
    }

    #[test]
    fn reloads_are_counted_and_the_last_result_kept() {
        let m = Metrics::new();
        m.config_loaded();
        m.config_reloaded(false);
        let text = m.encode();
        assert!(text.contains("tokengate_config_reloads_total{result=\"error\"} 1"));
        assert!(text.contains("tokengate_config_last_reload_successful 0"));
        let at_start = m.config_last_reload_success.get();
        assert!(at_start > 1.7e9, "{at_start}");
        m.config_reloaded(true);
        let text = m.encode();
        assert!(text.contains("tokengate_config_reloads_total{result=\"ok\"} 1"));
        assert!(text.contains("tokengate_config_last_reload_successful 1"));
        assert!(m.config_last_reload_success.get() >= at_start);
    }

    #[test]
    fn quota_gauges_carry_no_suffix() {
        let m = Metrics::new();
        let text = m.encode();
        assert!(
            text.contains("# TYPE tokengate_quota_spent gauge\n"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE tokengate_quota_limit gauge\n"),
            "{text}"
        );
        assert!(!text.contains("tokengate_quota_spent{"), "no series yet");
        let labels = QuotaLabels {
            tenant: "alice".to_string(),
            window: "calendar-day@Asia/Shanghai".to_string(),
            unit: "cost".to_string(),
        };
        m.quota(&labels, 1.5, 100.0);
        m.quota(&labels, 12.25, 150.0);
        let text = m.encode();
        let series: Vec<&str> = (text.lines())
            .filter(|l| {
                l.starts_with("tokengate_quota_spent") || l.starts_with("tokengate_quota_limit")
            })
            .collect();
        assert_eq!(
            series,
            [
                "tokengate_quota_spent{tenant=\"alice\",window=\"calendar-day@Asia/Shanghai\",unit=\"cost\"} 12.25",
                "tokengate_quota_limit{tenant=\"alice\",window=\"calendar-day@Asia/Shanghai\",unit=\"cost\"} 150.0",
            ]
        );
    }
}
