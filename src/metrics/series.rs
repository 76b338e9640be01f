//! One tenant's series of the per-tenant metrics, kept once found, so the request path records
//! without building label strings or looking up a family.

use super::labels::{tenant, Outcome, OutcomeLabels, TenantLabel};
use super::path::{AdmitMetrics, ChargeMetrics, RecordMetrics, SettleMetrics};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use std::sync::OnceLock;

/// One tenant's series of the per-tenant metrics, each found in its family the first time it
/// is recorded and kept from then on, so the request path records without building label
/// strings or looking up a family. A series appears in the exposition when it is first
/// recorded, as it would with `get_or_create` at each request. Each is resolved against the
/// first group passed in for it: one tenant value serves one gateway (each builds its own
/// tenants).
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

    /// Counts a finished request ([`RecordMetrics::outcome`]); `ok`, the common one, from its
    /// kept series.
    pub fn outcome(&self, m: &RecordMetrics, outcome: Outcome) {
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
    pub fn prefill_tokens(&self, m: &AdmitMetrics) -> &Counter {
        series(&self.prefill_tokens, &m.prefill_tokens, &self.label)
    }

    /// `decode_tokens_total`.
    pub fn decode_tokens(&self, m: &SettleMetrics) -> &Counter {
        series(&self.decode_tokens, &m.decode_tokens, &self.label)
    }

    /// `decode_tokens_reserved_total`.
    pub fn decode_tokens_reserved(&self, m: &AdmitMetrics) -> &Counter {
        series(
            &self.decode_tokens_reserved,
            &m.decode_tokens_reserved,
            &self.label,
        )
    }

    /// `decode_tokens_refunded_total`.
    pub fn decode_tokens_refunded(&self, m: &SettleMetrics) -> &Counter {
        series(
            &self.decode_tokens_refunded,
            &m.decode_tokens_refunded,
            &self.label,
        )
    }

    /// `ttft_seconds`.
    pub fn ttft(&self, m: &SettleMetrics) -> &Histogram {
        series(&self.ttft, &m.ttft, &self.label)
    }

    /// `tpot_seconds`.
    pub fn tpot(&self, m: &SettleMetrics) -> &Histogram {
        series(&self.tpot, &m.tpot, &self.label)
    }

    /// `queue_wait_seconds`.
    pub fn queue_wait(&self, m: &AdmitMetrics) -> &Histogram {
        series(&self.queue_wait, &m.queue_wait, &self.label)
    }

    /// `prompt_tokens`.
    pub fn prompt_tokens(&self, m: &AdmitMetrics) -> &Histogram {
        series(&self.prompt_tokens, &m.prompt_tokens, &self.label)
    }

    /// `output_tokens`.
    pub fn output_tokens(&self, m: &SettleMetrics) -> &Histogram {
        series(&self.output_tokens, &m.output_tokens, &self.label)
    }

    /// `inflight_requests`.
    pub fn inflight(&self, m: &ChargeMetrics) -> &Gauge {
        series(&self.inflight, &m.inflight, &self.label)
    }
}
