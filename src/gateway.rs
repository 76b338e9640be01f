//! The whole gateway, built once from a [`ValidConfig`] by [`crate::app`]: the parts each layer,
//! route and listener takes (each takes only its own), and the state the admin listener reads.

use crate::admission::Admission;
use crate::config::{Runner, ValidConfig};
use crate::layers::count::Counter;
use crate::limiter::Limiter;
use crate::metrics::Metrics;
use crate::proxy::forward::Backends;
use crate::record::Recorder;
use crate::reload::live::LiveConfig;
use crate::reload::Reloader;
use crate::tokenize::cache::ChatCounter;
use std::sync::Arc;

/// Everything the request path needs.
pub struct Gateway {
    /// The configuration it was started with. Its restart-only settings (all but the tenants
    /// and the backends' sizing) stay in force; a reload never changes them.
    pub config: Arc<ValidConfig>,
    /// The tenants and the backends' sizing in force, swapped whole by a reload.
    pub live: Arc<LiveConfig>,
    /// Per-tenant buckets.
    pub limiter: Limiter,
    /// KV ledgers and the fair queue of the generation backends.
    pub admission: Admission,
    /// Steps 6-7: reading bodies, parsing and counting.
    pub counter: Arc<Counter>,
    /// Steps 10-11: the backends, forwarding and metering.
    pub backends: Arc<Backends>,
    /// Chat rendering and its per-message memo (the admin listener reports its cache).
    pub chat: Arc<ChatCounter>,
    /// The metrics registry and its groups, each handed to the room that records into it;
    /// the admin listener encodes it whole.
    pub metrics: Arc<Metrics>,
    /// Where every settled request is recorded: the workload profile.
    pub recorder: Arc<Recorder>,
    /// What SIGHUP and `POST /admin/reload` run.
    pub reloader: Reloader,
    /// The backends' metrics as last scraped (backend feedback); dropping it stops the scrapes.
    pub feedback: crate::feedback::Scrapers,
    /// The pooling backends' own admission, counting and forwarding (`None` without any
    /// backend declared `runner = "pooling"`); `admission`, `counter` and `backends` above are
    /// the generation backends'.
    pub pooling: Option<Lane>,
    /// Tenants' quotas (budgets over windows), beside the buckets.
    pub quotas: crate::quota::Quotas,
    /// Writes the local quota store's spend to its file every `quotas.flush_interval` (`None`
    /// for a store in Redis); dropping it stops the writes.
    pub quota_flusher: Option<crate::quota::Flusher>,
    /// OpenTelemetry's exporter (`None` without `[otel]`); dropping it stops the exports.
    pub otel: Option<crate::otel::Otel>,
}

impl Gateway {
    /// Each kind of backend with its admission and backends: the generation ones, then the
    /// pooling ones when there are any.
    pub fn lanes(&self) -> impl Iterator<Item = (Runner, &Admission, &Backends)> {
        let pooling = (self.pooling.iter()).map(|l| (Runner::Pooling, &l.admission, &*l.backends));
        std::iter::once((Runner::Generate, &self.admission, &*self.backends)).chain(pooling)
    }

    /// The generation backends' part of the request path.
    pub fn generation_lane(&self) -> Lane {
        Lane {
            admission: self.admission.clone(),
            counter: self.counter.clone(),
            backends: self.backends.clone(),
        }
    }
}

/// The part of the request path one kind of backend has to itself: its admission (ledgers and
/// queue), the counting layer that asks that admission, and forwarding to its backends.
pub struct Lane {
    /// KV ledgers and the fair queue of its backends.
    pub admission: Admission,
    /// Steps 6-7, asking `admission` whether a request could ever be admitted.
    pub counter: Arc<Counter>,
    /// Steps 10-11: its backends (`admission`'s lease indices point into them).
    pub backends: Arc<Backends>,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("limiter", &self.limiter)
            .field("admission", &self.admission)
            .finish_non_exhaustive()
    }
}
