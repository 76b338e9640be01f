//! Everything the request path needs, built once from a [`ValidConfig`] by [`crate::app`].

use crate::admission::Admission;
use crate::config::ValidConfig;
use crate::limiter::Limiter;
use crate::metrics::Metrics;
use crate::proxy::discard::Discarder;
use crate::proxy::upstream::Upstream;
use crate::record::Recorder;
use crate::reload::live::LiveConfig;
use crate::tokenize::cache::ChatCounter;
use crate::tokenize::pool::TokenizePool;
use crate::tokenize::Tokenizer;
use std::sync::Arc;

/// Everything the request path needs, built once from a [`ValidConfig`].
pub struct Gateway {
    /// The configuration it was started with. Its restart-only settings (all but the tenants
    /// and the backends' sizing) stay in force; a reload never changes them.
    pub config: Arc<ValidConfig>,
    /// The tenants and the backends' sizing in force, swapped whole by a reload.
    pub live: LiveConfig,
    /// Per-tenant buckets.
    pub limiter: Limiter,
    /// KV ledgers and the fair queue.
    pub admission: Admission,
    /// The backends, in config order (the admission's backend indices point here).
    pub upstreams: Vec<Upstream>,
    /// The tokenizer.
    pub tokenizer: Arc<Tokenizer>,
    /// Chat rendering and its per-message memo.
    pub chat: Arc<ChatCounter>,
    /// Where tokenization runs.
    pub pool: Arc<TokenizePool>,
    /// Where chat answers are counted ahead for their next turn (`None` without a memo).
    pub replies: Option<Arc<TokenizePool>>,
    /// Metrics registry.
    pub metrics: Arc<Metrics>,
    /// Where every settled request is recorded: the workload profile.
    pub recorder: Arc<Recorder>,
    /// Each tenant's budget for bodies read to no purpose: the pace of refused bodies.
    pub discarder: Arc<Discarder>,
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
