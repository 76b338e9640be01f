//! The groups that mirror state owned elsewhere: what the backends' own metrics last said (set by
//! the feedback loops at each of their scrapes), and the KV ledgers, the queue, the buckets, the
//! quotas and the count memo (set by the admin listener when `/metrics` is scraped).

use super::labels::{
    tenant, BackendLabel, ClassLabel, KvMismatchLabels, QuotaLabels, ScrapeFailureLabels,
    TenantLabel,
};
use crate::limiter::BucketLabels;
use crate::tokenize::cache::CacheStats;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::{AtomicU64, Ordering};

/// What the feedback loops record of each backend they read.
#[derive(Clone, Debug, Default)]
pub struct FeedbackMetrics {
    /// The effective KV capacity as a share of the configured one (backend feedback).
    pub kv_capacity_scale: Family<BackendLabel, Gauge<f64, AtomicU64>>,
    /// Requests waiting in the backend's own queue, as it last reported.
    pub backend_waiting: Family<BackendLabel, Gauge>,
    /// Requests in the backend's running batch, as it last reported.
    pub backend_running: Family<BackendLabel, Gauge>,
    /// The backend's KV-cache usage (0..1), as it last reported.
    pub backend_kv_usage: Family<BackendLabel, Gauge<f64, AtomicU64>>,
    /// 1 where a key of the geometry in force differs from the engine's.
    pub backend_kv_mismatch: Family<KvMismatchLabels, Gauge>,
    /// Scrapes of the backend's metrics that failed, by why.
    pub backend_scrape_failures: Family<ScrapeFailureLabels, Counter>,
}

impl FeedbackMetrics {
    /// Registers `kv_capacity_scale`, `backend_requests_waiting`, `backend_requests_running`,
    /// `backend_kv_usage`, `backend_kv_mismatch` and `backend_scrape_failures_total`.
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "kv_capacity_scale",
            "Effective KV capacity admitted against, as a share of the configured one (backend feedback)",
            self.kv_capacity_scale.clone(),
        );
        r.register(
            "backend_requests_waiting",
            "Requests waiting in the backend's own queue, as its metrics last said",
            self.backend_waiting.clone(),
        );
        r.register(
            "backend_requests_running",
            "Requests in the backend's running batch, as its metrics last said",
            self.backend_running.clone(),
        );
        r.register(
            "backend_kv_usage",
            "The backend's KV-cache usage (0..1), as its metrics last said",
            self.backend_kv_usage.clone(),
        );
        r.register(
            "backend_kv_mismatch",
            "1 where a key of the KV geometry in force (set by hand, or model.max_model_len) differs from what the engine reports (0 once it no longer does)",
            self.backend_kv_mismatch.clone(),
        );
        r.register(
            "backend_scrape_failures",
            "Scrapes of the backend's metrics that failed: fetch (unreachable, slow, too large, not 2xx) or parse (not Prometheus text)",
            self.backend_scrape_failures.clone(),
        );
    }
}

/// What the admin listener sets at each scrape of `/metrics` from the state it mirrors: each
/// backend's health and KV ledger, the KV queue, the tenants' buckets and quotas, and the count
/// memo's running totals. A reload forgets a removed tenant's series here.
#[derive(Debug, Default)]
pub struct StateGauges {
    /// KV bytes leased per backend.
    pub kv_reserved_bytes: Family<BackendLabel, Gauge>,
    /// KV bytes per backend.
    pub kv_capacity_bytes: Family<BackendLabel, Gauge>,
    /// 1 while a backend answers its health path (asked at each scrape), else 0.
    pub backend_up: Family<BackendLabel, Gauge>,
    /// Requests waiting for KV space.
    pub queue_depth: Gauge,
    /// Requests waiting for KV space, per priority class.
    pub queue_depth_by_class: Family<ClassLabel, Gauge>,
    /// Requests waiting for KV space, per tenant (what `tenants[].max_queued` caps).
    pub queue_depth_by_tenant: Family<TenantLabel, Gauge>,
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
    /// Memo totals already exported (hits, misses, replies), so each scrape adds only what is
    /// new.
    cache_exported: [AtomicU64; 3],
}

impl StateGauges {
    /// Registers `kv_reserved_bytes`, `kv_capacity_bytes`, `backend_up`, the `queue_depth`s,
    /// `bucket_available_tokens`, `bucket_capacity_tokens`, `quota_spent`, `quota_limit` and
    /// the `tokenize_cache_*_total`s.
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "kv_reserved_bytes",
            "KV-cache bytes leased on a backend",
            self.kv_reserved_bytes.clone(),
        );
        r.register(
            "kv_capacity_bytes",
            "KV-cache bytes a backend has for sequences",
            self.kv_capacity_bytes.clone(),
        );
        r.register(
            "backend_up",
            "1 while the backend answers its health path within its health_timeout (asked at each scrape)",
            self.backend_up.clone(),
        );
        r.register(
            "queue_depth",
            "Requests waiting for KV space",
            self.queue_depth.clone(),
        );
        r.register(
            "queue_depth_by_class",
            "Requests waiting for KV space, per priority class",
            self.queue_depth_by_class.clone(),
        );
        r.register(
            "queue_depth_by_tenant",
            "Requests waiting for KV space, per tenant",
            self.queue_depth_by_tenant.clone(),
        );
        r.register(
            "bucket_available_tokens",
            "Tokens available now in a tenant's bucket",
            self.bucket_available.clone(),
        );
        r.register(
            "bucket_capacity_tokens",
            "Capacity of a tenant's bucket (rate x burst_seconds)",
            self.bucket_capacity.clone(),
        );
        r.register(
            "quota_spent",
            "What a tenant has spent in the current period of its quota window, in the quota's unit (tokens for prefill, decode, total and weighted; currency for cost)",
            self.quota_spent.clone(),
        );
        r.register(
            "quota_limit",
            "The limit of a tenant's quota for the current period of its window, in the quota's unit (grants included)",
            self.quota_limit.clone(),
        );
        r.register(
            "tokenize_cache_hits",
            "Chat turn spans whose token count came from the memo",
            self.tokenize_cache_hits.clone(),
        );
        r.register(
            "tokenize_cache_misses",
            "Chat turn spans that had to be tokenized",
            self.tokenize_cache_misses.clone(),
        );
        r.register(
            "tokenize_cache_replies",
            "Chat answers counted ahead for their conversation's next turn",
            self.tokenize_cache_replies.clone(),
        );
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

    /// Brings the memo counters up to the memo's own running totals. `fetch_max` makes
    /// concurrent scrapes add each increment once.
    pub fn sync_cache_counters(&self, stats: &CacheStats) {
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
}
