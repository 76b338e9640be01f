//! Prometheus metrics. One [`Metrics`] value owns the registry and is passed to whoever records
//! (no global statics), so tests can run many gateways in one process. It is made of groups,
//! one for each room that records, each registering its own metrics in that registry, and a
//! room is handed its group alone: the record layer [`RecordMetrics`], counting
//! [`CountMetrics`], the charge [`ChargeMetrics`], admission [`AdmitMetrics`], the settlement
//! [`SettleMetrics`], the feedback loops [`FeedbackMetrics`], the listeners
//! [`ConnectionMetrics`], the start and the reloads [`ConfigMetrics`], the usage log
//! [`UsageLogMetrics`], the shared limiter store and the quota file their own. The gauges that
//! mirror state owned elsewhere (KV ledgers, queue, buckets, quotas, the count memo) are set by
//! the admin listener when `/metrics` is scraped ([`StateGauges`]).

mod labels;
mod path;
mod series;
mod service;
mod state;

pub use labels::{
    tenant, BackendLabel, ClassLabel, ConnectionClosedLabels, CountErrorLabels, KvMismatchLabels,
    ListenerLabel, Outcome, OutcomeLabels, QueueRefusalLabels, QuotaLabels, ReloadLabel,
    ScrapeFailureLabels, TenantLabel,
};
pub use path::{AdmitMetrics, ChargeMetrics, CountMetrics, RecordMetrics, SettleMetrics};
pub use series::TenantMetrics;
pub use service::{ConfigMetrics, ConnectionMetrics, OtelMetrics, UsageLogMetrics};
pub use state::{FeedbackMetrics, StateGauges};

use crate::limiter::redis::StoreMetrics;
use crate::quota::store::FileMetrics;
use prometheus_client::registry::Registry;
use std::sync::Arc;

/// Every metric the gateway exports, in its groups.
pub struct Metrics {
    registry: Registry,
    /// Each request's outcome.
    pub record: Arc<RecordMetrics>,
    /// Output caps, refused bodies and tokenize time.
    pub count: Arc<CountMetrics>,
    /// Each tenant's requests in flight.
    pub charge: Arc<ChargeMetrics>,
    /// Tokens charged and reserved at admission, queue waits and refusals.
    pub admit: Arc<AdmitMetrics>,
    /// Tokens generated and given back, latencies, the backend's counts against the gateway's.
    pub settle: Arc<SettleMetrics>,
    /// The KV ledgers, queue, buckets, quotas and count memo, as of the last scrape.
    pub state: Arc<StateGauges>,
    /// What the backends' own metrics last said.
    pub feedback: Arc<FeedbackMetrics>,
    /// The listeners' client connections.
    pub connections: ConnectionMetrics,
    /// The config file's loads.
    pub config: Arc<ConfigMetrics>,
    /// The usage log's lost records.
    pub usage_log: UsageLogMetrics,
    /// The OpenTelemetry exporter's lost spans.
    pub otel: OtelMetrics,
    /// The shared limiter store's errors, latency and fallback state.
    pub limiter_store: StoreMetrics,
    /// How the local quota store's file writes go.
    pub quota_file: FileMetrics,
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
    /// A fresh registry with every group registered under the `tokengate_` prefix.
    pub fn new() -> Self {
        let mut m = Self {
            registry: Registry::with_prefix("tokengate"),
            record: Default::default(),
            count: Default::default(),
            charge: Default::default(),
            admit: Default::default(),
            settle: Default::default(),
            state: Default::default(),
            feedback: Default::default(),
            connections: Default::default(),
            config: Default::default(),
            usage_log: Default::default(),
            otel: Default::default(),
            limiter_store: Default::default(),
            quota_file: Default::default(),
        };
        let r = &mut m.registry;
        m.record.register(r);
        m.count.register(r);
        m.charge.register(r);
        m.admit.register(r);
        m.settle.register(r);
        m.state.register(r);
        m.feedback.register(r);
        m.connections.register(r);
        m.config.register(r);
        m.usage_log.register(r);
        m.otel.register(r);
        m.limiter_store.register(r);
        m.quota_file.register(r);
        m
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error_code::ErrorCode;
    use crate::tokenize::cache::CacheStats;

    #[test]
    fn names_carry_prefix_and_total_suffix() {
        let m = Metrics::new();
        m.record.outcome("alice", Outcome::Ok);
        m.state.queue_depth.set(3);
        let stats = |hits, replies| CacheStats {
            hits,
            misses: 2,
            replies,
            entries: 0,
            bytes: 0,
        };
        m.state.sync_cache_counters(&stats(5, 1));
        m.state.sync_cache_counters(&stats(5, 1));
        m.state.sync_cache_counters(&stats(7, 3));
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
    fn each_group_registers_its_families_once() {
        let text = Metrics::new().encode();
        let families: Vec<&str> = (text.lines())
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .collect();
        let once: std::collections::BTreeSet<&str> = families.iter().copied().collect();
        assert_eq!(families.len(), once.len(), "{families:?}");
    }

    #[test]
    fn tenant_series_are_the_families_series() {
        let m = Metrics::new();
        let alice = TenantMetrics::new("alice");
        assert!(!m.encode().contains("alice"), "nothing recorded yet");
        alice.prefill_tokens(&m.admit).inc_by(5);
        alice.prefill_tokens(&m.admit).inc_by(2);
        m.admit.prefill_tokens.get_or_create(&tenant("alice")).inc();
        alice.outcome(&m.record, Outcome::Ok);
        alice.outcome(&m.record, Outcome::Ok);
        alice.outcome(&m.record, Outcome::Failed(ErrorCode::RateLimitExceeded));
        alice.inflight(&m.charge).inc();
        alice.output_tokens(&m.settle).observe(20.0);
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
        m.config.config_loaded();
        m.config.config_reloaded(false);
        let text = m.encode();
        assert!(text.contains("tokengate_config_reloads_total{result=\"error\"} 1"));
        assert!(text.contains("tokengate_config_last_reload_successful 0"));
        let at_start = m.config.config_last_reload_success.get();
        assert!(at_start > 1.7e9, "{at_start}");
        m.config.config_reloaded(true);
        let text = m.encode();
        assert!(text.contains("tokengate_config_reloads_total{result=\"ok\"} 1"));
        assert!(text.contains("tokengate_config_last_reload_successful 1"));
        assert!(m.config.config_last_reload_success.get() >= at_start);
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
        m.state.quota(&labels, 1.5, 100.0);
        m.state.quota(&labels, 12.25, 150.0);
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
