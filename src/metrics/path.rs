//! The groups the request path records into, one per room that records: the record (each
//! request's outcome), counting (output caps, refused bodies, tokenize time), the charge (requests
//! in flight), admission (tokens charged and reserved, queueing) and the settlement (tokens
//! generated and given back, latencies, the backend's counts held against the gateway's). Each
//! room is handed its group alone.

use super::labels::{
    count_error_histogram, latency_histogram, tenant, token_histogram, CountErrorLabels,
    HistogramFamily, Outcome, OutcomeLabels, QueueRefusalLabels, TenantLabel,
};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// What the record counts: each request once, by how it ended.
#[derive(Clone, Debug, Default)]
pub struct RecordMetrics {
    /// Requests by tenant and outcome.
    pub requests: Family<OutcomeLabels, Counter>,
}

impl RecordMetrics {
    /// Registers `requests_total`.
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "requests",
            "Requests by tenant and outcome",
            self.requests.clone(),
        );
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
}

/// What counting records: the output caps it sets, the bodies it refuses, and its own time.
#[derive(Clone, Debug)]
pub struct CountMetrics {
    /// Chats sent without an output limit whose output was capped at `model.default_max_tokens`
    /// (vLLM alone would allow up to the context).
    pub output_capped_at_default: Family<TenantLabel, Counter>,
    /// Bytes of request bodies read and then refused, or drained after a refusal.
    pub refused_body_bytes: Family<TenantLabel, Counter>,
    /// Time to count one request's prompt (queue for a worker included).
    pub tokenize: Histogram,
}

impl Default for CountMetrics {
    fn default() -> Self {
        Self {
            output_capped_at_default: Family::default(),
            refused_body_bytes: Family::default(),
            tokenize: Histogram::new(exponential_buckets(0.00001, 2.0, 20)),
        }
    }
}

impl CountMetrics {
    /// Registers `output_capped_at_default_total`, `refused_body_bytes_total` and
    /// `tokenize_seconds`.
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "output_capped_at_default",
            "Chats and responses without an output limit capped at model.default_max_tokens (vLLM would allow up to the context)",
            self.output_capped_at_default.clone(),
        );
        r.register(
            "refused_body_bytes",
            "Bytes of request bodies read and then refused, or drained after a refusal before reading (what server.refused_body_bytes_per_second paces)",
            self.refused_body_bytes.clone(),
        );
        r.register(
            "tokenize_seconds",
            "Time to count a request's prompt tokens",
            self.tokenize.clone(),
        );
    }

    /// Counts a chat of `tenant` whose output the gateway capped at the model's default.
    pub fn capped_at_default(&self, tenant: &str) {
        self.output_capped_at_default
            .get_or_create(&self::tenant(tenant))
            .inc();
    }
}

/// What the charge shows: each tenant's requests in flight.
#[derive(Clone, Debug, Default)]
pub struct ChargeMetrics {
    /// Requests in flight: charged and not yet settled (queued for KV or running), what
    /// `tenants[].max_inflight` caps.
    pub inflight: Family<TenantLabel, Gauge>,
}

impl ChargeMetrics {
    /// Registers `inflight_requests`.
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "inflight_requests",
            "Requests charged and not yet settled (queued for KV or running)",
            self.inflight.clone(),
        );
    }
}

/// What admission records: the tokens a request is charged and reserved once it holds KV
/// space, how long it waited for it, and the requests the KV queue refused.
#[derive(Clone, Debug)]
pub struct AdmitMetrics {
    /// Prompt tokens charged.
    pub prefill_tokens: Family<TenantLabel, Counter>,
    /// Output tokens reserved at admission.
    pub decode_tokens_reserved: Family<TenantLabel, Counter>,
    /// Time waiting for KV space.
    pub queue_wait: HistogramFamily<TenantLabel>,
    /// Prompt lengths.
    pub prompt_tokens: HistogramFamily<TenantLabel>,
    /// Requests the KV queue refused (503 `capacity_exhausted`), by class and reason.
    pub queue_refusals: Family<QueueRefusalLabels, Counter>,
}

impl Default for AdmitMetrics {
    fn default() -> Self {
        Self {
            prefill_tokens: Family::default(),
            decode_tokens_reserved: Family::default(),
            queue_wait: Family::new_with_constructor(latency_histogram),
            prompt_tokens: Family::new_with_constructor(token_histogram),
            queue_refusals: Family::default(),
        }
    }
}

impl AdmitMetrics {
    /// Registers `prefill_tokens_total`, `decode_tokens_reserved_total`, `queue_wait_seconds`,
    /// `prompt_tokens` and `queue_refusals_total`.
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "prefill_tokens",
            "Prompt tokens charged",
            self.prefill_tokens.clone(),
        );
        r.register(
            "decode_tokens_reserved",
            "Output tokens reserved at admission (max_tokens)",
            self.decode_tokens_reserved.clone(),
        );
        r.register(
            "queue_wait_seconds",
            "Time spent waiting for KV space",
            self.queue_wait.clone(),
        );
        r.register(
            "prompt_tokens",
            "Prompt length per request",
            self.prompt_tokens.clone(),
        );
        r.register(
            "queue_refusals",
            "Requests the KV queue refused with 503, by class and reason (queue_full, shed, displaced, deadline)",
            self.queue_refusals.clone(),
        );
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
}

/// What the settlement records: the output tokens generated and given back, the latencies,
/// and the backend's counts held against the gateway's.
#[derive(Clone, Debug)]
pub struct SettleMetrics {
    /// Output tokens actually generated.
    pub decode_tokens: Family<TenantLabel, Counter>,
    /// Output tokens given back at settlement.
    pub decode_tokens_refunded: Family<TenantLabel, Counter>,
    /// Time from request arrival to the first output token.
    pub ttft: HistogramFamily<TenantLabel>,
    /// Mean gap between output tokens after the first.
    pub tpot: HistogramFamily<TenantLabel>,
    /// Output lengths.
    pub output_tokens: HistogramFamily<TenantLabel>,
    /// The backend's count minus the gateway's, per answer that reported one.
    pub count_error: HistogramFamily<CountErrorLabels>,
}

impl Default for SettleMetrics {
    fn default() -> Self {
        Self {
            decode_tokens: Family::default(),
            decode_tokens_refunded: Family::default(),
            ttft: Family::new_with_constructor(latency_histogram),
            tpot: Family::new_with_constructor(latency_histogram),
            output_tokens: Family::new_with_constructor(token_histogram),
            count_error: Family::new_with_constructor(count_error_histogram),
        }
    }
}

impl SettleMetrics {
    /// Registers `decode_tokens_total`, `decode_tokens_refunded_total`, `ttft_seconds`,
    /// `tpot_seconds`, `output_tokens` and `count_error_tokens`.
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "decode_tokens",
            "Output tokens generated",
            self.decode_tokens.clone(),
        );
        r.register(
            "decode_tokens_refunded",
            "Reserved output tokens given back at settlement",
            self.decode_tokens_refunded.clone(),
        );
        r.register(
            "ttft_seconds",
            "Time from request arrival to first output token (queueing included)",
            self.ttft.clone(),
        );
        r.register(
            "tpot_seconds",
            "Mean time per output token after the first",
            self.tpot.clone(),
        );
        r.register(
            "output_tokens",
            "Output length per request",
            self.output_tokens.clone(),
        );
        r.register(
            "count_error_tokens",
            "The backend's usage count minus what the gateway counted (prompt: charged; output: metered), per answer",
            self.count_error.clone(),
        );
    }
}
