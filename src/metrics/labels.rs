//! The vocabulary the metric groups share: their label sets, how a request ended, and the
//! buckets of their histograms.

use crate::error_code::ErrorCode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};

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

/// `{reason}`: why OpenTelemetry spans were not sent.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SpansDroppedLabel {
    /// `queue_full` or `export_failed`.
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

/// A family of histograms, each series made by one of the constructors below.
pub type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

pub(super) fn latency_histogram() -> Histogram {
    // 1 ms .. ~65 s
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

pub(super) fn count_error_histogram() -> Histogram {
    // The backend's count minus the gateway's, in tokens: 0 exactly, then powers of 4 each
    // side up to 4,096 (a template or default that changed shows as a shift, a tokenizer
    // mismatch as a spread).
    let below = (0..7).rev().map(|i| -(4f64.powi(i)));
    let above = (0..7).map(|i| 4f64.powi(i));
    Histogram::new(below.chain([0.0]).chain(above))
}

pub(super) fn token_histogram() -> Histogram {
    // 16 .. ~1M tokens
    Histogram::new(exponential_buckets(16.0, 2.0, 17))
}

/// Label helper.
pub fn tenant(name: &str) -> TenantLabel {
    TenantLabel {
        tenant: name.to_string(),
    }
}
