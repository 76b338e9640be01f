//! The whole gateway, built once from a [`ValidConfig`] by [`crate::app`]: the parts each layer,
//! route and listener takes (each takes only its own), and the state the admin listener reads.

use crate::admission::Admission;
use crate::config::ValidConfig;
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
    /// KV ledgers and the fair queue.
    pub admission: Admission,
    /// Steps 6-7: reading bodies, parsing and counting.
    pub counter: Arc<Counter>,
    /// Steps 10-11: the backends, forwarding and metering.
    pub backends: Arc<Backends>,
    /// Chat rendering and its per-message memo (the admin listener reports its cache).
    pub chat: Arc<ChatCounter>,
    /// Metrics registry.
    pub metrics: Arc<Metrics>,
    /// Where every settled request is recorded: the workload profile.
    pub recorder: Arc<Recorder>,
    /// What SIGHUP and `POST /admin/reload` run.
    pub reloader: Reloader,
    /// The backends' metrics as last scraped (backend feedback); dropping it stops the scrapes.
    pub feedback: crate::feedback::Scrapers,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("limiter", &self.limiter)
            .field("admission", &self.admission)
            .finish_non_exhaustive()
    }
}
