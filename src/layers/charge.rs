//! Step 8, charge, in three named parts: 8a the in-flight cap (a place among the tenant's
//! requests in flight, `max_inflight`), 8b its quotas (reserved for the most the request may
//! spend), 8c its buckets charged the request's [`Cost`] (all or nothing); the request goes on
//! as a [`Ticketed`] request, carrying by value the [`Ticket`] that holds all three and its
//! tenant as in force at the charge. It takes the request [`Priced`], its tenant and its cost
//! beside it: our counting layer prices it, or the user's own code does, so this layer works
//! without our parser. What the ticket gives back, and when, is the settlement room's
//! ([`crate::settle`]); a step or service after the charge that refuses the request ends the
//! ticket [`Ending::Refused`](crate::settle::Ending::Refused), and one that drops it unended
//! gives back the same (the error's code is the outcome either way).

use super::step::{Carried, Step, StepLayer};
use crate::error::{ApiError, CONCURRENCY_RETRY_AFTER};
use crate::limiter::{Cost, Limiter};
use crate::metrics::ChargeMetrics;
use crate::quota::ledger::Usage;
use crate::quota::{QuotaHold, Quotas};
use crate::record::Pending;
use crate::reload::live::LiveConfig;
use crate::settle::{Ticket, Ticketed};
use crate::tenant::{InFlightPlace, Tenant};
use futures_util::future::BoxFuture;
use std::sync::Arc;
use tower::Service;

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

/// Step 8 as a layer: takes a [`Priced`] request and passes it on [`Ticketed`].
pub type ChargeLayer<L = AsAuthenticated> = StepLayer<Charging<L>>;

/// A request with its tenant and what it costs: what the charge takes. The counting layer
/// passes a request on so; a service of the user's own that counts its own way makes one.
#[derive(Debug)]
pub struct Priced<R> {
    /// The request.
    pub request: R,
    /// The tenant to charge (as authenticated: the charge finds the limits in force).
    pub tenant: Arc<Tenant>,
    /// What it costs.
    pub cost: Cost,
}

/// What step 8 charges with.
#[derive(Clone, Debug)]
pub struct Charging<L> {
    limiter: Limiter,
    limits: L,
    metrics: Option<Arc<ChargeMetrics>>,
    quotas: Option<Quotas>,
}

impl<L: LimitsInForce> ChargeLayer<L> {
    /// Charges `limiter`'s buckets under the tenants' limits `limits` finds. With `metrics`,
    /// each tenant's requests in flight are shown in its gauge.
    pub fn new(limiter: Limiter, limits: L, metrics: Option<Arc<ChargeMetrics>>) -> Self {
        StepLayer::of(Charging {
            limiter,
            limits,
            metrics,
            quotas: None,
        })
    }

    /// Reserves the tenants' quotas too, before their buckets.
    pub fn with_quotas(self, quotas: Quotas) -> Self {
        let mut step = Charging::clone(self.step());
        step.quotas = Some(quotas);
        StepLayer::of(step)
    }
}

impl<L> Charging<L> {
    /// 8a, the in-flight cap: a place among `tenant`'s requests in flight (`max_inflight`),
    /// taken before anything is charged, so a refusal here charges nothing.
    fn enter_in_flight(&self, tenant: &Tenant) -> Result<InFlightPlace, ApiError> {
        let gauge = (self.metrics.as_deref()).map(|m| tenant.metrics.inflight(m).clone());
        let caps = tenant.caps;
        (tenant.in_flight.enter(caps.max_inflight, gauge)).map_err(|held| {
            ApiError::concurrency_exceeded(
                format!(
                    "tenant {} has {held} requests in flight; max_inflight is {}",
                    tenant.name,
                    caps.max_inflight.unwrap_or(u32::MAX)
                ),
                CONCURRENCY_RETRY_AFTER,
            )
        })
    }

    /// 8b, the quotas: `tenant`'s quotas reserved for the most `cost` may spend on `model`
    /// (none when the gateway or the tenant has none), before the buckets.
    async fn reserve_quotas(
        &self,
        tenant: &Tenant,
        model: &str,
        cost: Cost,
    ) -> Result<Option<QuotaHold>, ApiError> {
        let Some(quotas) = self.quotas.as_ref().filter(|_| !tenant.quotas.is_empty()) else {
            return Ok(None);
        };
        let most = Usage {
            prompt: cost.prefill,
            cached: 0,
            output: cost.decode,
        };
        let hold = quotas
            .reserve(&tenant.name, &tenant.quotas, model, most)
            .await;
        hold.map(Some).map_err(|e| ApiError::quota(&tenant.name, e))
    }
}

impl<S, L, R> Step<S, Priced<R>> for Charging<L>
where
    S: Service<Ticketed<R>> + Send + 'static,
    S::Future: Send,
    S::Error: Into<ApiError>,
    L: LimitsInForce,
    R: Carried,
{
    type Passes = Ticketed<R>;
    type Response = S::Response;

    fn run(
        self: Arc<Self>,
        req: Priced<R>,
        mut inner: S,
    ) -> BoxFuture<'static, Result<S::Response, ApiError>> {
        let shared = self;
        Box::pin(async move {
            let Priced {
                request: req,
                tenant,
                cost,
            } = req;
            let span = crate::otel::step(req.extensions(), crate::otel::Step::Charge);
            let current = shared.limits.in_force(&tenant)?;
            // 8a, then 8b, then 8c: a refusal by a later part drops what the earlier ones
            // hold, which gives it back.
            let place = shared.enter_in_flight(&current)?;
            let quota = shared.reserve_quotas(&current, req.model(), cost).await?;
            let reservation = shared
                .limiter
                .reserve(&current.name, &current.limits, cost)
                .await?;
            let mut ticket = Ticket::new(reservation);
            ticket.hold_place(place);
            if let Some(quota) = quota {
                ticket.hold_quota(quota);
            }
            if let Some(pending) = req.extensions().get::<Pending>() {
                pending.tenant(&current);
                ticket.recorded_by(pending.hold());
            }
            drop(span);
            // The ticket goes on with the request: whoever refuses it later, or drops it, ends
            // it, and its outcome is the error's.
            let ticketed = Ticketed {
                request: req,
                tenant: current,
                ticket,
            };
            inner.call(ticketed).await.map_err(Into::into)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::testing::{
        available, cost, limiter, outcomes, price, record_layer, request, unpriced,
    };
    use crate::metrics::Metrics;
    use crate::settle::Ending;
    use bytes::Bytes;
    use http::{Request, Response, StatusCode};
    use http_body_util::Full;
    use std::time::Duration;
    use tower::{ServiceBuilder, ServiceExt};

    type Answer = Result<Response<Full<Bytes>>, ApiError>;

    /// A service that takes the ticket, has the backend answer and produce `produced` decode
    /// tokens, and answers with the ticket's rate-limit headers; the ticket ends complete.
    async fn answers(req: Ticketed<Request<Full<Bytes>>>, produced: u64) -> Answer {
        let mut ticket = req.ticket;
        ticket.answered();
        ticket.record_output(produced);
        let mut resp = Response::new(Full::new(Bytes::from_static(b"done")));
        ticket.rate_limit_headers().apply(resp.headers_mut());
        ticket.end(Ending::Completed);
        Ok(resp)
    }

    #[tokio::test]
    async fn charges_the_cost_in_the_extensions_and_refunds_only_unused_decode_once_answered() {
        let limiter = limiter();
        let metrics = Arc::new(Metrics::new());
        let svc = ServiceBuilder::new()
            .layer(record_layer(&metrics))
            .map_request(price)
            .layer(ChargeLayer::new(
                limiter.clone(),
                AsAuthenticated,
                Some(metrics.charge.clone()),
            ))
            .service_fn(|req| answers(req, 30));
        let resp = svc.oneshot(unpriced(cost(200, 80))).await.expect("charged");
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
            .map_request(price)
            .layer(ChargeLayer::new(
                limiter.clone(),
                AsAuthenticated,
                Some(metrics.charge.clone()),
            ))
            .service_fn(|_: Ticketed<Request<Full<Bytes>>>| async {
                Err::<Response<Full<Bytes>>, _>(ApiError::upstream("the backend is gone"))
            });
        let e = svc.oneshot(unpriced(cost(200, 80))).await.unwrap_err();
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
            .map_request(price)
            .layer(ChargeLayer::new(
                limiter.clone(),
                AsAuthenticated,
                Some(metrics.charge.clone()),
            ))
            .service_fn(move |req: Ticketed<Request<Full<Bytes>>>| {
                let reached = reached.clone();
                async move {
                    // The service holds the ticket while it works.
                    let _ticket = req.ticket;
                    reached.send(()).await.expect("the test listens");
                    std::future::pending::<Answer>().await
                }
            });
        let call = tokio::spawn(svc.oneshot(unpriced(cost(200, 80))));
        reached_rx.recv().await.expect("the service was called");
        assert_eq!(available(&limiter).await, (800.0, 20.0, 4.0));
        call.abort();
        assert!(call.await.unwrap_err().is_cancelled());
        assert_eq!(available(&limiter).await, (1000.0, 100.0, 5.0));
        assert_eq!(outcomes(&metrics, "client_disconnect"), 1);
    }

    /// The service hands the request to the backend (marks it forwarded), then never answers.
    async fn forwards_and_waits(
        req: Ticketed<Request<Full<Bytes>>>,
        reached: tokio::sync::mpsc::Sender<()>,
    ) -> Answer {
        // Held until the client goes.
        let ticket = req.ticket;
        ticket.forwarded().mark();
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
            .map_request(price)
            .layer(ChargeLayer::new(
                limiter.clone(),
                AsAuthenticated,
                Some(metrics.charge.clone()),
            ))
            .service_fn(move |req| forwards_and_waits(req, reached.clone()));
        let call = tokio::spawn(svc.oneshot(unpriced(cost(200, 80))));
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
            .service_fn(|req: Ticketed<Request<Full<Bytes>>>| async move {
                let ticket = req.ticket;
                ticket.forwarded().mark();
                assert!(ticket.is_billable());
                ticket.end(Ending::BackendFailed);
                Err::<Response<Full<Bytes>>, _>(ApiError::upstream("reset"))
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
                Some(metrics.charge.clone()),
            ))
            .service_fn(move |req: Ticketed<Request<Full<Bytes>>>| {
                let reached = reached.clone();
                async move {
                    let Ticketed {
                        request, ticket, ..
                    } = req;
                    // The service holds the ticket while it works (or drops it panicking).
                    let _ticket = ticket;
                    match *request.extensions().get::<&'static str>().expect("told") {
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
            req.tenant = capped.clone();
            req.request.extensions_mut().insert(how);
            tokio::spawn(svc.clone().oneshot(req))
        };
        let gauge = || capped.metrics.inflight(&metrics.charge).get();
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
    async fn the_limits_in_force_decide() {
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
        assert_eq!(available(&limiter).await, (1000.0, 100.0, 5.0));
    }
}
