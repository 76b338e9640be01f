//! Step 9, admit: the request's KV footprint (its [`Cost`]'s prompt + max output tokens, in
//! whole blocks, plus the per-sequence state) is leased on a backend, at once or after waiting
//! fairly in the bounded queue; the lease is added to the request's [`Ticket`], which frees it
//! when it goes. A request that can never fit is a 400, a full queue or a passed deadline a 503
//! (see [`NotAdmitted`]); either way the ticket gives back everything charged.

use super::charge::TicketSlot;
use crate::admission::Admission;
use crate::capacity::sequence_footprint_bytes;
use crate::error::{ApiError, NotAdmitted};
use crate::limiter::Cost;
use crate::metrics::{self, Metrics};
use crate::tenant::Tenant;
use futures_util::future::BoxFuture;
use http::Request;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::time::Instant;
use tower::{Layer, Service};

/// What one sequence of the model holds in KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvGeometry {
    /// Tokens per KV block (a sequence holds whole blocks).
    pub block_tokens: u64,
    /// KV bytes per token.
    pub kv_bytes_per_token: u64,
    /// Fixed state per sequence (DeltaNet's), whatever its length.
    pub state_bytes_per_sequence: u64,
}

impl KvGeometry {
    /// The KV bytes a sequence of `tokens` (prompt + max output) holds.
    pub fn footprint_bytes(&self, tokens: u64) -> u64 {
        sequence_footprint_bytes(
            tokens,
            self.block_tokens,
            self.kv_bytes_per_token,
            self.state_bytes_per_sequence,
        )
    }
}

/// Step 9 as a layer: needs `Arc<Tenant>`, [`Cost`] and a [`TicketSlot`] (the charge layer's)
/// in the request's extensions; adds the lease to the ticket.
#[derive(Clone, Debug)]
pub struct AdmitLayer {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    admission: Admission,
    geometry: KvGeometry,
    metrics: Option<Arc<Metrics>>,
}

impl AdmitLayer {
    /// Admits by `geometry`'s footprint on `admission`'s backends. With `metrics`, it records
    /// each tenant's queue wait and, per admitted request, its prompt and reserved tokens.
    pub fn new(admission: Admission, geometry: KvGeometry, metrics: Option<Arc<Metrics>>) -> Self {
        Self {
            shared: Arc::new(Shared {
                admission,
                geometry,
                metrics,
            }),
        }
    }
}

impl<S> Layer<S> for AdmitLayer {
    type Service = Admit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Admit {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// The service of [`AdmitLayer`].
#[derive(Clone, Debug)]
pub struct Admit<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S, B> Service<Request<B>> for Admit<S>
where
    S: Service<Request<B>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<ApiError>,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = ApiError;
    type Future = BoxFuture<'static, Result<S::Response, ApiError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ApiError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let mut inner = self.inner.clone();
        std::mem::swap(&mut self.inner, &mut inner);
        let shared = self.shared.clone();
        Box::pin(async move {
            let tenant = super::needs::<Arc<Tenant>>(req.extensions())?.clone();
            let cost = *super::needs::<Cost>(req.extensions())?;
            let slot = super::needs::<TicketSlot>(req.extensions())?.clone();
            let tokens = cost.prefill + cost.decode;
            let started = Instant::now();
            let admitted = shared
                .admission
                .admit(&tenant.name, shared.geometry.footprint_bytes(tokens))
                .await;
            let metrics = shared.metrics.as_deref();
            let label = metrics.map(|_| metrics::tenant(&tenant.name));
            if let (Some(m), Some(label)) = (metrics, &label) {
                m.queue_wait
                    .get_or_create(label)
                    .observe(started.elapsed().as_secs_f64());
            }
            let lease = admitted.map_err(|error| NotAdmitted {
                error,
                tokens,
                queue_deadline: shared.admission.queue_deadline(),
            })?;
            if slot.with(|ticket| ticket.admit(lease)).is_none() {
                return Err(ApiError::missing_extension("Ticket"));
            }
            if let (Some(m), Some(label)) = (metrics, &label) {
                m.prefill_tokens.get_or_create(label).inc_by(cost.prefill);
                m.decode_tokens_reserved
                    .get_or_create(label)
                    .inc_by(cost.decode);
                m.prompt_tokens
                    .get_or_create(label)
                    .observe(cost.prefill as f64);
            }
            inner.call(req).await.map_err(Into::into)
        })
    }
}
