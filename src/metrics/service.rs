//! The groups of the gateway's own running, beside the requests: its listeners' connections,
//! its config's loads, and its usage log.

use super::labels::{ConnectionClosedLabels, ListenerLabel, ReloadLabel, SpansDroppedLabel};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

/// What the listeners record of their client connections.
#[derive(Clone, Debug, Default)]
pub struct ConnectionMetrics {
    /// Client connections open per listener.
    pub open_connections: Family<ListenerLabel, Gauge>,
    /// Client connections the gateway closed for a bound in time (or to make room), per
    /// listener and reason.
    pub connections_closed: Family<ConnectionClosedLabels, Counter>,
}

impl ConnectionMetrics {
    /// Registers `open_connections` and `connections_closed_total`.
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "open_connections",
            "Client connections open on a listener (main: at most server.max_connections)",
            self.open_connections.clone(),
        );
        r.register(
            "connections_closed",
            "Client connections the gateway closed: no request head within server.header_read_timeout, idle for server.idle_timeout, no bytes of a write or of an answer taken for server.client_write_timeout, or (admin) the oldest idle one closed to make room at the cap",
            self.connections_closed.clone(),
        );
    }
}

/// What the start and each reload record of loading the config file.
#[derive(Clone, Debug, Default)]
pub struct ConfigMetrics {
    /// Config reloads (SIGHUP, `POST /admin/reload`) by result.
    pub config_reloads: Family<ReloadLabel, Counter>,
    /// 1 when the last load of the config file (at start or a reload) succeeded, else 0.
    pub config_last_reload_successful: Gauge,
    /// Unix time of the last successful load of the config file (at start or a reload).
    pub config_last_reload_success: Gauge<f64, AtomicU64>,
}

impl ConfigMetrics {
    /// Registers `config_reloads_total` (both results, from the start),
    /// `config_last_reload_successful` and `config_last_reload_success_timestamp_seconds`.
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "config_reloads",
            "Config reloads (SIGHUP, POST /admin/reload) by result",
            self.config_reloads.clone(),
        );
        r.register(
            "config_last_reload_successful",
            "1 when the last load of the config file (at start or a reload) succeeded, else 0",
            self.config_last_reload_successful.clone(),
        );
        r.register(
            "config_last_reload_success_timestamp_seconds",
            "Unix time of the last successful load of the config file (at start or a reload)",
            self.config_last_reload_success.clone(),
        );
        // Both results exported from the start, so a rate over them is defined before the first
        // reload.
        for result in ["ok", "error"] {
            drop(self.config_reloads.get_or_create(&ReloadLabel {
                result: result.to_string(),
            }));
        }
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
}

/// Wall-clock seconds since the Unix epoch (a timestamp for dashboards, never a decision).
fn unix_now() -> f64 {
    use crate::clock::{Clock, SystemClock};
    SystemClock.wall_ms() as f64 / 1000.0
}

/// What the usage log records of the records it could not write.
#[derive(Clone, Debug, Default)]
pub struct UsageLogMetrics {
    /// Usage-log records dropped because its buffer was full.
    pub usage_log_dropped: Counter,
    /// Usage-log batches that failed to write.
    pub usage_log_write_errors: Counter,
}

impl UsageLogMetrics {
    /// Registers `usage_log_dropped_total` and `usage_log_write_errors_total`.
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "usage_log_dropped",
            "Usage-log records dropped because its buffer was full",
            self.usage_log_dropped.clone(),
        );
        r.register(
            "usage_log_write_errors",
            "Usage-log batches that failed to write (their records are lost)",
            self.usage_log_write_errors.clone(),
        );
    }
}

/// What the OpenTelemetry exporter records of the spans it could not send, where it cannot be
/// lost with them (a receiver that is down never hears of its own drops).
#[derive(Clone, Debug, Default)]
pub struct OtelMetrics {
    /// Finished spans never sent, by reason.
    pub spans_dropped: Family<SpansDroppedLabel, Counter>,
}

impl OtelMetrics {
    /// Registers `otel_spans_dropped_total` (its series appear once `[otel]` is on).
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "otel_spans_dropped",
            "OpenTelemetry spans never sent: the span queue was full (otel.max_queued_spans), or their export failed",
            self.spans_dropped.clone(),
        );
    }

    /// The counter of the spans dropped for `reason`.
    pub fn dropped(&self, reason: &str) -> Counter {
        (self.spans_dropped)
            .get_or_create(&SpansDroppedLabel {
                reason: reason.to_string(),
            })
            .clone()
    }
}
