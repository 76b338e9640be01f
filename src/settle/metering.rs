//! Where a settlement is counted ([`Metering`]): the tenant's decode tokens kept and given back,
//! its latencies, and the backend's counts held against the gateway's.
//!
//! The backend is the reference for every count: when its answer carries `usage`, the prompt is
//! settled on its `prompt_tokens` (cached tokens at `limiter.cached_prefill_weight`, believed up
//! to the model's context) and the output on its `completion_tokens`, and each difference from
//! the gateway's own count is exported (`tokengate_count_error_tokens{backend,kind}`) and logged
//! at warn with the request's id, at most once a second.

use super::ending::Output;
use crate::limiter::{Cost, Settlement};
use crate::metrics::{CountErrorLabels, Outcome, SettleMetrics};
use crate::tenant::Tenant;
use crate::util::throttle::Throttle;
use std::sync::Arc;
use std::time::Duration;

/// Where a request's settlement is counted: the gateway's metrics, under its tenant, and the
/// backend's counts held against the gateway's.
#[derive(Clone, Debug)]
pub struct Metering {
    /// The tenant, whose series are counted.
    pub tenant: Arc<Tenant>,
    /// Where the settlement is counted.
    pub metrics: Arc<SettleMetrics>,
    /// The backend and how its counts are believed.
    pub reconcile: Reconcile,
    /// The forward step's span, with OpenTelemetry on: the settlement is noted in its request's
    /// span, and it ends when the settlement lets it go.
    pub span: Option<Arc<crate::otel::StepSpan>>,
}

impl Metering {
    /// Holds the backend's counts of an answered request's prompt and output against the
    /// gateway's (`cost`, and a stream's token events).
    pub(super) fn compare(&self, cost: Cost, prompt: Option<(u64, Option<u64>)>, output: &Output) {
        let m = &self.metrics;
        if let Some((prompt, _)) = prompt {
            // The difference exported is the backend's word, as it said it.
            self.reconcile.compare(m, "prompt", cost.prefill, prompt);
        }
        if let Output::Reported {
            tokens,
            streamed: Some(metered),
        } = output
        {
            self.reconcile.compare(m, "output", *metered, *tokens);
        }
    }

    /// Counts a settlement: the decode tokens kept and given back, and the latencies.
    pub(super) fn count(
        &self,
        settlement: &Settlement,
        ttft: Option<Duration>,
        tpot: Option<Duration>,
    ) {
        let (m, t) = (&self.metrics, &self.tenant.metrics);
        t.decode_tokens(m).inc_by(settlement.actual_decode);
        (t.decode_tokens_refunded(m)).inc_by(settlement.refunded_decode);
        t.output_tokens(m).observe(settlement.actual_decode as f64);
        if let Some(ttft) = ttft {
            t.ttft(m).observe(ttft.as_secs_f64());
        }
        if let Some(tpot) = tpot {
            t.tpot(m).observe(tpot.as_secs_f64());
        }
    }

    /// Notes the settlement in the request's span: `prompt` tokens charged, the output kept,
    /// the latencies, and the outcome when it is a failure.
    pub(super) fn trace(
        &self,
        prompt: u64,
        settlement: &Settlement,
        latencies: (Option<Duration>, Option<Duration>),
        outcome: Option<Outcome>,
    ) {
        if let Some(span) = &self.span {
            span.settled(crate::otel::Settled {
                input_tokens: prompt,
                output_tokens: settlement.actual_decode,
                ttft: latencies.0,
                tpot: latencies.1,
                failed: outcome.filter(|o| *o != Outcome::Ok).map(Outcome::as_str),
            });
        }
    }
}

/// What comparing the backend's counts with the gateway's needs.
#[derive(Clone, Debug)]
pub struct Reconcile {
    /// The backend's URL: the `backend` label of `tokengate_count_error_tokens`.
    pub backend: String,
    /// The request's id, named by the warning a difference is logged with.
    pub request_id: Option<String>,
    /// What a prompt token the backend's prefix cache held is charged, as a share of a token
    /// (`limiter.cached_prefill_weight`).
    pub cached_prefill_weight: f64,
    /// The most prompt tokens the request can have run (the model's context for each of its
    /// prompts): the backend's count settles the charge, the quotas and the record up to this,
    /// so a backend that says it counted a trillion cannot spend a tenant's quota whole.
    pub most_prompt_tokens: u64,
    /// The throttle of the warning, shared by every request: a backend that counts every prompt
    /// otherwise would write a line per request, a cost of its own (a formatted line and a
    /// write to standard error on the request path: 6% of the gateway's CPU in a 2 KB chat
    /// benchmark). See [`COUNT_WARNING_PERIOD`].
    pub warnings: Arc<Throttle>,
}

/// Count differences are logged at most once this often.
pub const COUNT_WARNING_PERIOD: Duration = Duration::from_secs(1);

impl Reconcile {
    /// The prompt as the backend counted it (`prompt` tokens, `cached` of them held by its
    /// prefix cache), believed up to [`Reconcile::most_prompt_tokens`]: the prompt and its cached
    /// part as believed, and the prompt tokens that stay charged, each cached one at
    /// `cached_prefill_weight` of a token (rounded up: the prefill bucket models compute, and a
    /// cached token needs next to none).
    pub(super) fn prompt(&self, prompt: u64, cached: Option<u64>) -> (u64, Option<u64>, u64) {
        let believed = prompt.min(self.most_prompt_tokens);
        let cached = cached.map(|c| c.min(believed));
        let cached_part = cached.unwrap_or(0);
        let weighted = (cached_part as f64 * self.cached_prefill_weight).ceil() as u64;
        let stays = believed - cached_part + weighted.min(cached_part);
        (believed, cached, stays)
    }

    /// Exports the backend's count of `kind` (`prompt` or `output`) against the gateway's, and
    /// warns when they differ.
    fn compare(&self, metrics: &SettleMetrics, kind: &str, gateway: u64, backend: u64) {
        let error = i128::from(backend) - i128::from(gateway);
        let labels = CountErrorLabels {
            backend: self.backend.clone(),
            kind: kind.to_owned(),
        };
        metrics
            .count_error
            .get_or_create(&labels)
            .observe(error as f64);
        if error == 0 {
            return;
        }
        if let Some(held_back) = self.warnings.allow() {
            tracing::warn!(
                request_id = self.request_id.as_deref().unwrap_or("-"),
                backend = %self.backend,
                kind,
                gateway,
                backend_count = backend,
                held_back,
                "the backend counted {kind} tokens otherwise than the gateway; settled on the backend's count (held_back: differences since the last such line, not logged; tokengate_count_error_tokens counts every one)"
            );
        }
    }
}
