//! Step 8, charge: the tenant's buckets are charged the request's [`Cost`] (all or nothing) and
//! the request goes on carrying the [`Ticket`] that holds the charge, in a [`TicketSlot`] in its
//! extensions. The cost is whatever [`Cost`] the request's extensions hold: our counting layer
//! puts it there, or the user's own code does, so this layer works without our parser.
//!
//! The ticket is the request's one guard, in two phases. Until the request is forwarded (its
//! bytes handed to the backend's connection, [`Forwarded`]) dropping it gives back everything
//! charged: the client went away while queued, admission refused it, no connection could be
//! made. From then on the backend has done or is doing the prefill, so dropping it settles:
//! only the decode tokens reserved and not produced ([`Ticket::record_output`]) go back, even
//! when the client goes before the first token or the gateway stops waiting for it (a 504).
//! Only a backend that fails the request ([`Ticket::backend_failed`]: its error status, a
//! connection broken before its answer) gives everything back after that. The KV lease the
//! admission layer adds goes with it, freed first.

use crate::admission::Lease;
use crate::api::request::GenerationRequest;
use crate::error::{ApiError, CONCURRENCY_RETRY_AFTER};
use crate::limiter::{Cost, Limiter, RateLimitHeaders, Reservation, TenantSnapshot};
use crate::metrics::{Metrics, Outcome};
use crate::quota::ledger::Usage;
use crate::quota::{QuotaHold, Quotas, RateLimitFields};
use crate::record::{Forwarded, Pending, RecordHold};
use crate::reload::live::LiveConfig;
use crate::settled::Charged;
use crate::tenant::{InFlightPlace, Tenant};
use futures_util::future::BoxFuture;
use http::Request;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;
use tower::{Layer, Service};

/// A request's charge and, once admitted, its KV lease: everything it holds until it settles.
pub struct Ticket {
    /// `None` only inside `drop`.
    reservation: Option<Reservation>,
    lease: Option<Lease>,
    forwarded: Forwarded,
    /// The backend failed the request after it was forwarded: everything goes back.
    backend_failed: bool,
    answered: bool,
    /// Noted in the request's record when the ticket goes; `None` when the request is
    /// answered with an error, whose code is its outcome.
    outcome: Option<Outcome>,
    /// The request's record, held open until the ticket goes.
    record: Option<RecordHold>,
    ttft: Option<Duration>,
    tpot: Option<Duration>,
    /// The request's place among its tenant's requests in flight, given back after it settles
    /// (a field: dropped after `drop` has run).
    in_flight: Option<InFlightPlace>,
    /// The backend's count of the prompt and of its cached part, once its answer said them.
    reported: Option<(u64, Option<u64>)>,
    /// The tenant's quota reservation, settled when the ticket goes (given back whole if the
    /// ticket goes before `drop`'s settlement tells it what was used).
    quota: Option<QuotaHold>,
}

impl std::fmt::Debug for Ticket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticket")
            .field("reservation", &self.reservation)
            .field("lease", &self.lease)
            .field("forwarded", &self.forwarded.is_marked())
            .field("backend_failed", &self.backend_failed)
            .field("answered", &self.answered)
            .field("outcome", &self.outcome)
            .finish_non_exhaustive()
    }
}

impl Ticket {
    /// Holds `reservation` in the first phase: everything goes back unless it is forwarded.
    pub fn new(reservation: Reservation) -> Self {
        Self {
            reservation: Some(reservation),
            lease: None,
            forwarded: Forwarded::default(),
            backend_failed: false,
            answered: false,
            outcome: Some(Outcome::ClientDisconnect),
            record: None,
            ttft: None,
            tpot: None,
            in_flight: None,
            reported: None,
            quota: None,
        }
    }

    /// Adds the tenant's quota reservation: it keeps what the request used when the ticket
    /// goes (nothing unless the request is billable).
    pub fn hold_quota(&mut self, hold: QuotaHold) {
        self.quota = Some(hold);
    }

    /// The IETF `RateLimit-Policy` and `RateLimit` fields of the tenant's tightest quota right
    /// after the reservation (none without quotas).
    pub fn quota_fields(&self) -> Option<RateLimitFields> {
        RateLimitFields::tightest(self.quota.as_ref()?.readings())
    }

    /// Notes how the request settled, and its charge, in its record when the ticket goes
    /// (`client_disconnect` unless told otherwise; nothing when refused: the refusal's code is
    /// the outcome), and keeps the record open until then.
    pub fn recorded_by(&mut self, record: RecordHold) {
        self.record = Some(record);
    }

    /// The request's time to first token and per output token, for its record.
    pub fn record_latency(&mut self, ttft: Option<Duration>, tpot: Option<Duration>) {
        (self.ttft, self.tpot) = (ttft, tpot);
    }

    fn reservation(&self) -> &Reservation {
        self.reservation.as_ref().expect("taken only by drop")
    }

    fn reservation_mut(&mut self) -> &mut Reservation {
        self.reservation.as_mut().expect("taken only by drop")
    }

    /// The tenant charged.
    pub fn tenant(&self) -> &str {
        self.reservation().tenant()
    }

    /// What was charged.
    pub fn cost(&self) -> Cost {
        self.reservation().cost()
    }

    /// The tenant's buckets right after the charge.
    pub fn remaining(&self) -> &TenantSnapshot {
        self.reservation().remaining()
    }

    /// The tenant's `x-ratelimit-*` headers right after the charge.
    pub fn rate_limit_headers(&self) -> RateLimitHeaders {
        self.remaining().rate_limit_headers()
    }

    /// Adds the KV lease the request was admitted with; it is freed when the ticket goes.
    pub fn admit(&mut self, lease: Lease) {
        self.lease = Some(lease);
    }

    /// The KV lease, once admitted.
    pub fn lease(&self) -> Option<&Lease> {
        self.lease.as_ref()
    }

    /// Frees the KV lease now (the backend has stopped using it); the charge stays held. The
    /// tenant's fairness counter keeps the output recorded, or nothing if the prefill is not
    /// spent.
    pub fn release_lease(&mut self) {
        if let Some(mut lease) = self.lease.take() {
            if !self.is_billable() {
                lease.refund_all();
            }
        }
    }

    /// What marks the request forwarded: hand it to whatever writes the request to the
    /// backend. From the mark on, only the decode tokens not produced go back.
    pub fn forwarded(&self) -> Forwarded {
        self.forwarded.clone()
    }

    /// The backend failed the request (an error status, a connection broken before its
    /// answer): it gives everything back, forwarded or not. Not for a timeout: a backend that
    /// is slow to answer is busy with the request.
    pub fn backend_failed(&mut self) {
        self.backend_failed = true;
    }

    /// Whether the prompt (and the output produced) stay charged: the request was forwarded,
    /// or answered, and the backend did not fail it.
    pub fn is_billable(&self) -> bool {
        (self.answered || self.forwarded.is_marked()) && !self.backend_failed
    }

    /// The backend has answered (a 2xx and its first bytes), so the request was forwarded:
    /// only the decode tokens not produced go back.
    pub fn answered(&mut self) {
        self.answered = true;
    }

    /// Whether the backend has answered.
    pub fn is_answered(&self) -> bool {
        self.answered
    }

    /// The backend's own count of the prompt (`usage.prompt_tokens`) and of the part its prefix
    /// cache held (`cached_tokens`), from its answer: the prompt stays charged as the backend
    /// counted it, each cached token at `cached_weight` of a token (rounded up: the prefill
    /// bucket models compute, and a cached token needs next to none), and settlement gives
    /// back or charges the difference from what was charged.
    pub fn reconcile_prompt(&mut self, prompt: u64, cached: Option<u64>, cached_weight: f64) {
        let cached_part = cached.unwrap_or(0).min(prompt);
        let weighted = (cached_part as f64 * cached_weight).ceil() as u64;
        let stays = prompt - cached_part + weighted.min(cached_part);
        self.reservation_mut().settle_prefill(stays);
        self.reported = Some((prompt, cached));
    }

    /// The decode tokens produced so far (a running total, saturating at the reservation).
    pub fn record_output(&mut self, tokens: u64) {
        self.reservation_mut().record_output(tokens);
        if let Some(lease) = &mut self.lease {
            lease.record_output(tokens);
        }
    }

    /// How the request ended, counted when the ticket goes.
    pub fn settle_as(&mut self, outcome: Outcome) {
        self.outcome = Some(outcome);
    }

    /// The outcome the ticket will count (`None` once refused).
    pub fn outcome(&self) -> Option<Outcome> {
        self.outcome
    }

    /// The request is answered with an error, whose code is its outcome: the ticket notes
    /// none (and no charge) in its record when it goes.
    pub fn refused(&mut self) {
        self.outcome = None;
    }

    /// [`Ticket::refused`], and the ticket goes now (giving back what its phase says), for an
    /// answer with `e`.
    pub fn refuse(mut self, e: ApiError) -> ApiError {
        self.refused();
        e
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        // KV first: the backend has stopped (or never started) using it.
        self.release_lease();
        let Some(mut reservation) = self.reservation.take() else {
            return;
        };
        let billable = self.is_billable();
        if !billable {
            reservation.refund_all();
        }
        let cost = reservation.cost();
        let settlement = reservation.settle();
        // The quota settles with the buckets, before the request is recorded.
        if let Some(mut quota) = self.quota.take() {
            if billable {
                let (prompt, cached) = self.reported.unwrap_or((cost.prefill, None));
                quota.used(Usage {
                    prompt,
                    cached: cached.unwrap_or(0),
                    output: settlement.actual_decode,
                });
            }
        }
        let Some(outcome) = self.outcome else {
            return;
        };
        if let Some(record) = self.record.take() {
            record.settled(
                outcome,
                Charged {
                    prompt_tokens: self.reported.map_or(cost.prefill, |(prompt, _)| prompt),
                    counted_prompt_tokens: cost.prefill,
                    cached_prompt_tokens: self.reported.and_then(|(_, cached)| cached),
                    reserved_output_tokens: cost.decode,
                    output_tokens: settlement.actual_decode,
                    refunded_output_tokens: settlement.refunded_decode,
                    answered: self.answered,
                    billable,
                    ttft: self.ttft,
                    tpot: self.tpot,
                },
            );
        }
    }
}

/// Where a request's [`Ticket`] travels in its extensions (which hold only `Clone` values): the
/// layer after the charge adds its lease to it, the service at the end takes it out to own it
/// until the answer is complete.
#[derive(Clone, Debug)]
pub struct TicketSlot(Arc<Mutex<Option<Ticket>>>);

impl TicketSlot {
    /// A slot holding `ticket`.
    pub fn new(ticket: Ticket) -> Self {
        Self(Arc::new(Mutex::new(Some(ticket))))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Ticket>> {
        // Only moves of the ticket happen under the lock: nothing is left half done.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes the ticket out (`None` when it was already taken).
    pub fn take(&self) -> Option<Ticket> {
        self.lock().take()
    }

    /// Runs `f` on the ticket while it is in the slot.
    pub fn with<R>(&self, f: impl FnOnce(&mut Ticket) -> R) -> Option<R> {
        self.lock().as_mut().map(f)
    }
}

/// The limits a tenant is charged under: its own, as the request's `Arc<Tenant>` carries them
/// ([`AsAuthenticated`]), or the ones in force at the charge (the gateway's: a reload may have
/// changed them, or removed the tenant, while the request was read and counted).
pub trait LimitsInForce: Clone + Send + Sync + 'static {
    /// The tenant to charge, or the error that refuses the request.
    fn in_force(&self, tenant: &Arc<Tenant>) -> Result<Arc<Tenant>, ApiError>;
}

/// Charges the tenant under the limits its `Arc<Tenant>` carries.
#[derive(Clone, Copy, Debug, Default)]
pub struct AsAuthenticated;

impl LimitsInForce for AsAuthenticated {
    fn in_force(&self, tenant: &Arc<Tenant>) -> Result<Arc<Tenant>, ApiError> {
        Ok(tenant.clone())
    }
}

impl LimitsInForce for Arc<LiveConfig> {
    fn in_force(&self, tenant: &Arc<Tenant>) -> Result<Arc<Tenant>, ApiError> {
        let live = self.current();
        live.tenants.named(&tenant.name).cloned().ok_or_else(|| {
            ApiError::unauthorized(format!(
                "tenant {} was removed by a config reload while this request was read; its API keys no longer work",
                tenant.name
            ))
        })
    }
}

/// Step 8 as a layer: needs `Arc<Tenant>` and [`Cost`] in the request's extensions, adds a
/// [`TicketSlot`].
#[derive(Clone, Debug)]
pub struct ChargeLayer<L = AsAuthenticated> {
    shared: Arc<Shared<L>>,
}

#[derive(Clone, Debug)]
struct Shared<L> {
    limiter: Limiter,
    limits: L,
    metrics: Option<Arc<Metrics>>,
    quotas: Option<Quotas>,
}

impl<L: LimitsInForce> ChargeLayer<L> {
    /// Charges `limiter`'s buckets under the tenants' limits `limits` finds. With `metrics`,
    /// each tenant's requests in flight are shown in its gauge.
    pub fn new(limiter: Limiter, limits: L, metrics: Option<Arc<Metrics>>) -> Self {
        Self {
            shared: Arc::new(Shared {
                limiter,
                limits,
                metrics,
                quotas: None,
            }),
        }
    }

    /// Reserves the tenants' quotas too, before their buckets.
    pub fn with_quotas(self, quotas: Quotas) -> Self {
        let mut shared = Shared::clone(&self.shared);
        shared.quotas = Some(quotas);
        Self {
            shared: Arc::new(shared),
        }
    }
}

impl<S, L> Layer<S> for ChargeLayer<L> {
    type Service = Charge<S, L>;

    fn layer(&self, inner: S) -> Self::Service {
        Charge {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// The service of [`ChargeLayer`].
#[derive(Clone, Debug)]
pub struct Charge<S, L = AsAuthenticated> {
    inner: S,
    shared: Arc<Shared<L>>,
}

impl<S, L, B> Service<Request<B>> for Charge<S, L>
where
    S: Service<Request<B>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<ApiError>,
    L: LimitsInForce,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = ApiError;
    type Future = BoxFuture<'static, Result<S::Response, ApiError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ApiError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        // The clone that was made ready goes with this request.
        let mut inner = self.inner.clone();
        std::mem::swap(&mut self.inner, &mut inner);
        let shared = self.shared.clone();
        Box::pin(async move {
            let tenant = super::extensions::needs::<Arc<Tenant>>(req.extensions())?.clone();
            let cost = *super::extensions::needs::<Cost>(req.extensions())?;
            let current = shared.limits.in_force(&tenant)?;
            // A place among the tenant's requests in flight before anything is charged: a
            // refusal here charges nothing.
            let gauge = (shared.metrics.as_deref()).map(|m| current.metrics.inflight(m).clone());
            let caps = current.caps;
            let place = (current.in_flight.enter(caps.max_inflight, gauge)).map_err(|held| {
                ApiError::concurrency_exceeded(
                    format!(
                        "tenant {} has {held} requests in flight; max_inflight is {}",
                        current.name,
                        caps.max_inflight.unwrap_or(u32::MAX)
                    ),
                    CONCURRENCY_RETRY_AFTER,
                )
            })?;
            // The quotas before the buckets: a refusal by the buckets drops the hold unused,
            // which gives its reservation back.
            let quota = match &shared.quotas {
                Some(quotas) if !current.quotas.is_empty() => {
                    let model = (req.extensions().get::<GenerationRequest>())
                        .map_or("", |p| p.model.as_str());
                    let most = Usage {
                        prompt: cost.prefill,
                        cached: 0,
                        output: cost.decode,
                    };
                    let hold = (quotas
                        .reserve(&current.name, &current.quotas, model, most)
                        .await)
                        .map_err(|e| ApiError::quota(&current.name, e))?;
                    Some(hold)
                }
                _ => None,
            };
            let reservation = shared
                .limiter
                .reserve(&current.name, &current.limits, cost)
                .await?;
            // Later steps see the tenant as in force at the charge (its caps, its class).
            req.extensions_mut().insert(current.clone());
            let mut ticket = Ticket::new(reservation);
            ticket.in_flight = Some(place);
            ticket.quota = quota;
            if let Some(pending) = req.extensions().get::<Pending>() {
                pending.tenant(&current);
                ticket.recorded_by(pending.hold());
            }
            let slot = TicketSlot::new(ticket);
            req.extensions_mut().insert(slot.clone());
            let answered = inner.call(req).await.map_err(Into::into);
            // A refusal after the charge (admission, or a service that left the ticket) gives
            // everything back; its outcome is the error's.
            answered.map_err(|e| match slot.take() {
                Some(ticket) => ticket.refuse(e),
                None => e,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::testing::{available, cost, limiter, outcomes, record_layer, request};
    use bytes::Bytes;
    use http::{Response, StatusCode};
    use http_body_util::Full;
    use tower::{service_fn, ServiceBuilder, ServiceExt};

    type Answer = Result<Response<Full<Bytes>>, ApiError>;

    /// A service that takes the ticket, has the backend answer and produce `produced` decode
    /// tokens, and answers with the ticket's rate-limit headers; the ticket goes with the
    /// answer.
    async fn answers(req: Request<Full<Bytes>>, produced: u64) -> Answer {
        let slot = req.extensions().get::<TicketSlot>().expect("charged");
        let mut ticket = slot.take().expect("the ticket is in its slot");
        ticket.answered();
        ticket.record_output(produced);
        ticket.settle_as(Outcome::Ok);
        let mut resp = Response::new(Full::new(Bytes::from_static(b"done")));
        ticket.rate_limit_headers().apply(resp.headers_mut());
        Ok(resp)
    }

    #[tokio::test]
    async fn charges_the_cost_in_the_extensions_and_refunds_only_unused_decode_once_answered() {
        let limiter = limiter();
        let metrics = Arc::new(Metrics::new());
        let svc = ServiceBuilder::new()
            .layer(record_layer(&metrics))
            .layer(ChargeLayer::new(
                limiter.clone(),
                AsAuthenticated,
                Some(metrics.clone()),
            ))
            .service_fn(|req| answers(req, 30));
        let resp = svc.oneshot(request(cost(200, 80))).await.expect("charged");
        // The headers right after the charge: 80 of the 100 decode tokens counted as used.
        assert_eq!(resp.headers()["x-ratelimit-remaining-tokens"], "20");
        // Settled: 200 prefill and the request stay charged, 50 unused decode tokens back.
        assert_eq!(available(&limiter).await, (800.0, 70.0, 4.0));
        assert_eq!(outcomes(&metrics, "ok"), 1);
    }

    #[tokio::test]
    async fn an_error_after_the_charge_gives_everything_back_and_is_counted_as_the_error() {
        let limiter = limiter();
        let metrics = Arc::new(Metrics::new());
        let svc = ServiceBuilder::new()
            .layer(record_layer(&metrics))
            .layer(ChargeLayer::new(
                limiter.clone(),
                AsAuthenticated,
                Some(metrics.clone()),
            ))
            .service_fn(|_: Request<Full<Bytes>>| async {
                Err::<Response<Full<Bytes>>, _>(ApiError::upstream("the backend is gone"))
            });
        let e = svc.oneshot(request(cost(200, 80))).await.unwrap_err();
        assert_eq!(e.code, crate::error::ErrorCode::UpstreamError);
        assert_eq!(available(&limiter).await, (1000.0, 100.0, 5.0));
        // The error's code is the outcome, counted once; the ticket counts none of its own.
        assert_eq!(outcomes(&metrics, "client_disconnect"), 0);
        assert_eq!(outcomes(&metrics, "upstream_error"), 1);
    }

    #[tokio::test]
    async fn a_client_gone_before_the_answer_gets_everything_back_and_is_counted() {
        let limiter = limiter();
        let metrics = Arc::new(Metrics::new());
        let (reached, mut reached_rx) = tokio::sync::mpsc::channel::<()>(1);
        let svc = ServiceBuilder::new()
            .layer(record_layer(&metrics))
            .layer(ChargeLayer::new(
                limiter.clone(),
                AsAuthenticated,
                Some(metrics.clone()),
            ))
            .service_fn(move |_: Request<Full<Bytes>>| {
                let reached = reached.clone();
                async move {
                    reached.send(()).await.expect("the test listens");
                    std::future::pending::<Answer>().await
                }
            });
        let call = tokio::spawn(svc.oneshot(request(cost(200, 80))));
        reached_rx.recv().await.expect("the service was called");
        assert_eq!(available(&limiter).await, (800.0, 20.0, 4.0));
        call.abort();
        assert!(call.await.unwrap_err().is_cancelled());
        assert_eq!(available(&limiter).await, (1000.0, 100.0, 5.0));
        assert_eq!(outcomes(&metrics, "client_disconnect"), 1);
    }

    /// The service hands the request to the backend (marks it forwarded), then never answers.
    async fn forwards_and_waits(
        req: Request<Full<Bytes>>,
        reached: tokio::sync::mpsc::Sender<()>,
    ) -> Answer {
        let slot = req.extensions().get::<TicketSlot>().expect("charged");
        slot.with(|ticket| ticket.forwarded().mark())
            .expect("the ticket is in its slot");
        reached.send(()).await.expect("the test listens");
        std::future::pending::<Answer>().await
    }

    #[tokio::test]
    async fn a_client_gone_after_the_request_was_forwarded_keeps_its_prefill_charged() {
        let limiter = limiter();
        let metrics = Arc::new(Metrics::new());
        let (reached, mut reached_rx) = tokio::sync::mpsc::channel::<()>(1);
        let svc = ServiceBuilder::new()
            .layer(record_layer(&metrics))
            .layer(ChargeLayer::new(
                limiter.clone(),
                AsAuthenticated,
                Some(metrics.clone()),
            ))
            .service_fn(move |req| forwards_and_waits(req, reached.clone()));
        let call = tokio::spawn(svc.oneshot(request(cost(200, 80))));
        reached_rx.recv().await.expect("the service was called");
        call.abort();
        assert!(call.await.unwrap_err().is_cancelled());
        // The prompt and the request stay charged; all 80 decode tokens come back.
        assert_eq!(available(&limiter).await, (800.0, 100.0, 4.0));
        assert_eq!(outcomes(&metrics, "client_disconnect"), 1);
    }

    #[tokio::test]
    async fn a_backend_that_fails_a_forwarded_request_gives_everything_back() {
        let limiter = limiter();
        let svc = ServiceBuilder::new()
            .layer(ChargeLayer::new(limiter.clone(), AsAuthenticated, None))
            .service_fn(|req: Request<Full<Bytes>>| async move {
                let slot = req.extensions().get::<TicketSlot>().expect("charged");
                let mut ticket = slot.take().expect("in its slot");
                ticket.forwarded().mark();
                assert!(ticket.is_billable());
                ticket.backend_failed();
                Err::<Response<Full<Bytes>>, _>(ticket.refuse(ApiError::upstream("reset")))
            });
        let e = svc.oneshot(request(cost(200, 80))).await.unwrap_err();
        assert_eq!(e.code, crate::error::ErrorCode::UpstreamError);
        assert_eq!(available(&limiter).await, (1000.0, 100.0, 5.0));
    }

    #[tokio::test]
    async fn max_inflight_refuses_before_the_charge_and_every_way_a_request_ends_gives_its_place_back(
    ) {
        use crate::layers::testing::tenant;
        use crate::tenant::Caps;
        let limiter = limiter();
        let metrics = Arc::new(Metrics::new());
        let capped = Arc::new(Tenant::clone(&tenant()).with_caps(Caps {
            max_inflight: Some(1),
            max_queued: None,
        }));
        let (reached, mut reached_rx) = tokio::sync::mpsc::channel::<()>(1);
        // Each request says how its service ends: held until aborted, an error, a panic.
        let svc = ServiceBuilder::new()
            .layer(ChargeLayer::new(
                limiter.clone(),
                AsAuthenticated,
                Some(metrics.clone()),
            ))
            .service_fn(move |req: Request<Full<Bytes>>| {
                let reached = reached.clone();
                async move {
                    match *req.extensions().get::<&'static str>().expect("told") {
                        "hold" => {
                            reached.send(()).await.expect("the test listens");
                            std::future::pending::<Answer>().await
                        }
                        "fail" => Err(ApiError::upstream("the backend is gone")),
                        _ => panic!("the service panics"),
                    }
                }
            });
        let call = |how: &'static str| {
            let mut req = request(cost(10, 10));
            req.extensions_mut().insert(capped.clone());
            req.extensions_mut().insert(how);
            tokio::spawn(svc.clone().oneshot(req))
        };
        let gauge = || capped.metrics.inflight(&metrics).get();
        let held = call("hold");
        reached_rx.recv().await.expect("the service was called");
        assert_eq!((capped.in_flight.current(), gauge()), (1, 1));
        let e = call("fail").await.unwrap().unwrap_err();
        assert_eq!(
            (e.status, e.code, e.message.as_str(), e.retry_after),
            (
                StatusCode::TOO_MANY_REQUESTS,
                crate::error::ErrorCode::ConcurrencyExceeded,
                "tenant a has 1 requests in flight; max_inflight is 1",
                Some(Duration::from_secs(1))
            )
        );
        // Refused before the charge: only the held request's is taken.
        assert_eq!(available(&limiter).await, (990.0, 90.0, 4.0));
        held.abort();
        assert!(held.await.unwrap_err().is_cancelled());
        assert_eq!((capped.in_flight.current(), gauge()), (0, 0));
        let e = call("fail").await.unwrap().unwrap_err();
        assert_eq!(e.code, crate::error::ErrorCode::UpstreamError);
        assert_eq!((capped.in_flight.current(), gauge()), (0, 0));
        assert!(call("panic").await.unwrap_err().is_panic());
        assert_eq!((capped.in_flight.current(), gauge()), (0, 0));
        assert_eq!(available(&limiter).await, (1000.0, 100.0, 5.0));
    }

    #[tokio::test]
    async fn a_denial_is_the_error_and_charges_nothing() {
        let limiter = limiter();
        let svc = ServiceBuilder::new()
            .layer(ChargeLayer::new(limiter.clone(), AsAuthenticated, None))
            .service_fn(|req| answers(req, 100));
        let e = svc
            .clone()
            .oneshot(request(cost(0, 101)))
            .await
            .unwrap_err();
        assert_eq!(
            (e.status, e.code),
            (
                StatusCode::BAD_REQUEST,
                crate::error::ErrorCode::ExceedsTenantBurst
            )
        );
        assert_eq!(available(&limiter).await, (1000.0, 100.0, 5.0));
        // The decode bucket drained by a request that used it all: the next is not yet.
        svc.clone()
            .oneshot(request(cost(0, 100)))
            .await
            .expect("full");
        let e = svc.oneshot(request(cost(0, 1))).await.unwrap_err();
        assert_eq!(
            (e.status, e.code, e.kind),
            (
                StatusCode::TOO_MANY_REQUESTS,
                crate::error::ErrorCode::RateLimitExceeded,
                "tokens"
            )
        );
        assert_eq!(e.retry_after, Some(std::time::Duration::from_millis(100)));
        assert_eq!(available(&limiter).await, (1000.0, 0.0, 4.0));
    }

    #[tokio::test]
    async fn the_limits_in_force_decide_and_a_missing_cost_is_a_stack_built_wrong() {
        #[derive(Clone)]
        struct Removed;
        impl LimitsInForce for Removed {
            fn in_force(&self, tenant: &Arc<Tenant>) -> Result<Arc<Tenant>, ApiError> {
                Err(ApiError::unauthorized(format!("{} is gone", tenant.name)))
            }
        }
        let limiter = limiter();
        let svc = ServiceBuilder::new()
            .layer(ChargeLayer::new(limiter.clone(), Removed, None))
            .service_fn(|req| answers(req, 0));
        let e = svc.oneshot(request(cost(1, 1))).await.unwrap_err();
        assert_eq!(
            (e.status, e.message.as_str()),
            (StatusCode::UNAUTHORIZED, "a is gone")
        );
        let svc = ServiceBuilder::new()
            .layer(ChargeLayer::new(limiter.clone(), AsAuthenticated, None))
            .service(service_fn(|req| answers(req, 0)));
        let mut req = request(cost(1, 1));
        req.extensions_mut().remove::<Cost>();
        let e = svc.oneshot(req).await.unwrap_err();
        assert_eq!(e.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(available(&limiter).await, (1000.0, 100.0, 5.0));
    }
}
