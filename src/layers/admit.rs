//! Step 9, admit: the request's KV footprint (its [`Cost`](crate::limiter::Cost)'s prompt +
//! max output tokens, in whole blocks, plus the per-sequence state) is leased on a backend, at
//! once or after waiting in the bounded queue in the request's [`Priority`] class (the one its
//! extensions carry, else its tenant's) and fairly by tokens within it; the lease is added to
//! the request's [`Ticket`](crate::settle::Ticket), which frees it when it goes. A request that
//! can never fit is a 400, a full queue or a passed deadline a 503 (see [`NotAdmitted`]); either
//! way the ticket ends refused and gives back everything charged.

use super::step::{Carried, Step, StepLayer};
use crate::admission::{Admission, Priority};
pub use crate::admission::{KvGeometry, Sequences};
use crate::api::Route;
use crate::error::{ApiError, NotAdmitted, Runs};
use crate::metrics::AdmitMetrics;
use crate::settle::{Ending, Ticketed};
use futures_util::future::BoxFuture;
use std::sync::Arc;
use tokio::time::Instant;
use tower::Service;

/// Step 9 as a layer: takes a [`Ticketed`] request (the charge layer's), its [`Priority`] from
/// its extensions when there is one (its tenant's class when not) and its [`Sequences`] as the
/// request carries them ([`Carried::sequences`]: one when not known); adds the lease to the
/// ticket.
///
/// A request that was not charged is not one it takes: a stack with no charge layer before it
/// does not compile.
///
/// ```compile_fail,E0308
/// use http::{Request, Response};
/// use std::time::Duration;
/// use tokengate::admission::{Admission, BackendSpec, ClassShares, QueueSpec};
/// use tokengate::layers::{AdmitLayer, KvGeometry};
/// use tokengate::settle::Ticketed;
///
/// let admission = Admission::new(
///     vec![BackendSpec {
///         name: "gpu-0".to_string(),
///         kv_capacity_bytes: 4096,
///         max_batch: 8,
///         engine: false,
///     }],
///     QueueSpec {
///         max_waiting: 0,
///         deadline: Duration::from_secs(1),
///         shares: ClassShares::FULL,
///     },
/// );
/// let geometry = KvGeometry {
///     block_tokens: 16,
///     kv_bytes_per_token: 1,
///     state_bytes_per_sequence: 0,
///     shared_prompt_blocks: false,
///     lookahead_tokens: 0,
/// };
/// let model = tower::service_fn(|req: Ticketed<Request<String>>| async move {
///     Ok::<_, std::convert::Infallible>(Response::new(req.request.into_body()))
/// });
/// let admitted = tower::ServiceBuilder::new()
///     .layer(AdmitLayer::new(admission, geometry, None))
///     .service(model);
/// // A request with no ticket: expected `Ticketed<Request<String>>`.
/// let answer = tower::ServiceExt::oneshot(admitted, Request::new(String::new()));
/// ```
pub type AdmitLayer = StepLayer<Admitting>;

/// What step 9 admits with.
#[derive(Debug)]
pub struct Admitting {
    admission: Admission,
    geometry: KvGeometry,
    metrics: Option<Arc<AdmitMetrics>>,
}

impl AdmitLayer {
    /// Admits by `geometry`'s footprint on `admission`'s backends. With `metrics`, it records
    /// each tenant's queue wait, the queue's refusals by class and, per admitted request, its
    /// prompt and reserved tokens.
    pub fn new(
        admission: Admission,
        geometry: KvGeometry,
        metrics: Option<Arc<AdmitMetrics>>,
    ) -> Self {
        StepLayer::of(Admitting {
            admission,
            geometry,
            metrics,
        })
    }
}

impl<S, R> Step<S, Ticketed<R>> for Admitting
where
    S: Service<Ticketed<R>> + Send + 'static,
    S::Future: Send,
    S::Error: Into<ApiError>,
    R: Carried,
{
    type Passes = Ticketed<R>;
    type Response = S::Response;

    fn run(
        self: Arc<Self>,
        req: Ticketed<R>,
        mut inner: S,
    ) -> BoxFuture<'static, Result<S::Response, ApiError>> {
        let shared = self;
        Box::pin(async move {
            let Ticketed {
                request,
                tenant,
                mut ticket,
            } = req;
            let cost = ticket.cost();
            let ext = request.extensions();
            let class = (ext.get::<Priority>().copied()).unwrap_or(tenant.priority);
            let sequences = request.sequences();
            let need = (shared.admission).need(&shared.geometry, &cost, sequences);
            let tokens = cost.prefill + cost.decode;
            let span = crate::otel::step(ext, crate::otel::Step::QueueWait);
            let started = Instant::now();
            let max_queued = tenant.caps.max_queued.map(|n| n as usize);
            let admitted = match need {
                Some(need) => {
                    (shared.admission)
                        .admit_within(&tenant.name, class, need, max_queued)
                        .await
                }
                None => Err(crate::admission::AdmitError::Unlearned),
            };
            drop(span);
            let metrics = shared.metrics.as_deref();
            let t = &tenant.metrics;
            if let Some(m) = metrics {
                (t.queue_wait(m)).observe(started.elapsed().as_secs_f64());
                if let Some(reason) = admitted.as_ref().err().and_then(|e| e.queue_refusal()) {
                    m.queue_refused(class.as_str(), reason);
                }
            }
            let lease = match admitted {
                Ok(lease) => lease,
                Err(error) => {
                    // Everything charged goes back; the refusal's code is the outcome. A
                    // refusal of too many sequences names them as the route calls them.
                    ticket.end(Ending::Refused);
                    return Err(NotAdmitted {
                        error,
                        tokens,
                        tokens_at_least: false,
                        queue_deadline: shared.admission.queue_deadline(),
                        runs: Runs::of(sequences, ext.get::<Route>().copied()),
                    }
                    .into());
                }
            };
            ticket.admit(lease);
            if let Some(m) = metrics {
                t.prefill_tokens(m).inc_by(cost.prefill);
                t.decode_tokens_reserved(m).inc_by(cost.decode);
                t.prompt_tokens(m).observe(cost.prefill as f64);
            }
            let admitted = Ticketed {
                request,
                tenant,
                ticket,
            };
            inner.call(admitted).await.map_err(Into::into)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::{BackendSpec, ClassShares, Need, QueueSpec};
    use crate::layers::charge::{AsAuthenticated, ChargeLayer};
    use crate::layers::testing::{available, cost, limiter, request};
    use crate::settle::Ending;
    use bytes::Bytes;
    use http::{Request, Response, StatusCode};
    use http_body_util::{BodyExt, Full};
    use std::time::Duration;
    use tower::{ServiceBuilder, ServiceExt};

    /// One token, one byte: a request's footprint is its prompt + max output.
    const BYTES: KvGeometry = KvGeometry {
        block_tokens: 1,
        kv_bytes_per_token: 1,
        state_bytes_per_sequence: 0,
        shared_prompt_blocks: false,
        lookahead_tokens: 0,
    };

    /// One backend of 1,000 bytes and 4 sequences; nobody waits.
    fn admission() -> Admission {
        admission_of(4)
    }

    /// One backend of 1,000 bytes and `max_batch` sequences; nobody waits.
    fn admission_of(max_batch: u32) -> Admission {
        admission_sharing(max_batch, ClassShares::FULL)
    }

    /// [`admission_of`] whose classes may hold `shares` of it.
    fn admission_sharing(max_batch: u32, shares: ClassShares) -> Admission {
        Admission::new(
            vec![BackendSpec {
                name: "b".to_string(),
                kv_capacity_bytes: 1000,
                max_batch,
                engine: false,
            }],
            QueueSpec {
                max_waiting: 0,
                deadline: Duration::from_secs(7),
                shares,
            },
        )
    }

    fn reserved(admission: &Admission) -> u64 {
        admission.snapshot().backends[0].kv_reserved_bytes
    }

    /// Takes the ticket, reports the bytes its lease holds, and lets the ticket go answered.
    async fn leased(
        req: Ticketed<Request<Full<Bytes>>>,
    ) -> Result<Response<Full<Bytes>>, ApiError> {
        let ticket = req.ticket;
        let bytes = ticket.lease().expect("admitted").bytes();
        ticket.end(Ending::Completed);
        Ok(Response::new(Full::new(Bytes::from(bytes.to_string()))))
    }

    #[tokio::test]
    async fn leases_the_footprint_of_the_cost_into_the_ticket_which_frees_it() {
        let (limiter, admission) = (limiter(), admission());
        let metrics = Arc::new(AdmitMetrics::default());
        let svc = ServiceBuilder::new()
            .layer(ChargeLayer::new(limiter, AsAuthenticated, None))
            .layer(AdmitLayer::new(
                admission.clone(),
                BYTES,
                Some(metrics.clone()),
            ))
            .service_fn(leased);
        let resp = svc.oneshot(request(cost(200, 100))).await.expect("fits");
        let body = resp
            .into_body()
            .collect()
            .await
            .expect("in memory")
            .to_bytes();
        assert_eq!(body, "300");
        assert_eq!(reserved(&admission), 0);
        let label = crate::metrics::tenant("a");
        assert_eq!(metrics.prefill_tokens.get_or_create(&label).get(), 200);
        assert_eq!(
            metrics.decode_tokens_reserved.get_or_create(&label).get(),
            100
        );
    }

    #[test]
    fn a_prompts_choices_share_its_whole_blocks_only_when_the_backend_caches_prefixes() {
        let apart = KvGeometry {
            block_tokens: 16,
            kv_bytes_per_token: 2,
            state_bytes_per_sequence: 5,
            shared_prompt_blocks: false,
            lookahead_tokens: 0,
        };
        let shared = KvGeometry {
            shared_prompt_blocks: true,
            ..apart
        };
        // 40 prompt tokens + 10 output: 4 blocks of 16 each, x 2 bytes, + 5 of state.
        assert_eq!(apart.choices_footprint_bytes(40, 10, 3), 3 * (64 * 2 + 5));
        // Its 2 whole blocks (32 tokens) once; each choice 8 + 10 tokens, 2 blocks, + state.
        assert_eq!(
            shared.choices_footprint_bytes(40, 10, 3),
            32 * 2 + 3 * (32 * 2 + 5)
        );
        // One choice shares with nobody; a prompt of whole blocks leaves each its output.
        assert_eq!(shared.choices_footprint_bytes(40, 10, 1), 64 * 2 + 5);
        assert_eq!(
            shared.choices_footprint_bytes(32, 10, 2),
            32 * 2 + 2 * (16 * 2 + 5)
        );
    }

    #[tokio::test]
    async fn a_batch_of_prompts_with_n_choices_leases_every_sequence_sharing_when_told() {
        for shared_prompt_blocks in [false, true] {
            let (limiter, admission) = (limiter(), admission_of(6));
            let geometry = KvGeometry {
                block_tokens: 16,
                shared_prompt_blocks,
                ..BYTES
            };
            let svc = ServiceBuilder::new()
                .layer(ChargeLayer::new(limiter, AsAuthenticated, None))
                .layer(AdmitLayer::new(admission.clone(), geometry, None))
                .service_fn(leased);
            // Prompts of 100 and 20 tokens, 3 choices each, 60 output tokens: 10 each.
            let mut req = request(cost(120, 60));
            req.request.extensions_mut().insert(Sequences {
                prompts: vec![100, 20],
                choices: 3,
            });
            let resp = svc.oneshot(req).await.expect("fits");
            let body = resp.into_body().collect().await.expect("in memory");
            // Apart: 110 tokens are 7 blocks (112), 30 are 2 (32). Shared: 96 once, then 4 + 10
            // (1 block) per choice; 16 of the short prompt once, then 4 + 10 per choice.
            let expected = if shared_prompt_blocks {
                96 + 3 * 16 + 16 + 3 * 16
            } else {
                3 * 112 + 3 * 32
            };
            assert_eq!(body.to_bytes(), expected.to_string());
            assert_eq!(reserved(&admission), 0);
        }
    }

    #[tokio::test]
    async fn more_sequences_than_the_batch_run_in_turns_holding_the_whole_batch_and_all_their_kv() {
        let (limiter, admission) = (limiter(), admission_of(4));
        let seen = admission.clone();
        let svc = ServiceBuilder::new()
            .layer(ChargeLayer::new(limiter, AsAuthenticated, None))
            .layer(AdmitLayer::new(admission.clone(), BYTES, None))
            .service_fn(move |req| {
                // While it runs: the whole batch, and every prompt's KV with its output.
                let backend = &seen.snapshot().backends[0];
                let held = (backend.inflight, backend.kv_reserved_bytes);
                async move {
                    assert_eq!(held, (4, 6 * 30 + 6 * 10));
                    leased(req).await
                }
            });
        // Six prompts of 30 tokens, 60 output tokens: 10 each.
        let mut req = request(cost(180, 60));
        req.request.extensions_mut().insert(Sequences {
            prompts: vec![30; 6],
            choices: 1,
        });
        let resp = svc.oneshot(req).await.expect("run in turns");
        let body = resp.into_body().collect().await.expect("in memory");
        assert_eq!(body.to_bytes(), "240");
        let backend = &admission.snapshot().backends[0];
        assert_eq!((backend.inflight, backend.kv_reserved_bytes), (0, 0));
    }

    #[tokio::test]
    async fn a_refusal_gives_back_the_charge_never_fits_is_400_a_full_queue_503() {
        let (limiter, admission) = (limiter(), admission());
        let svc = ServiceBuilder::new()
            .layer(ChargeLayer::new(limiter.clone(), AsAuthenticated, None))
            .layer(AdmitLayer::new(admission.clone(), BYTES, None))
            .service_fn(leased);
        let e = svc
            .clone()
            .oneshot(request(cost(990, 11)))
            .await
            .unwrap_err();
        assert_eq!(
            (e.status, e.code),
            (
                StatusCode::BAD_REQUEST,
                crate::error::ErrorCode::ExceedsKvCapacity
            )
        );
        assert_eq!(
            e.message,
            "the request's KV footprint (1001 tokens of prompt + max output = 1001 bytes) is larger than the KV capacity of every backend (largest: 1000 bytes); lower max_tokens or shorten the prompt"
        );
        assert_eq!(available(&limiter).await, (1000.0, 100.0, 5.0));
        // Five prompts of one choice each, more than a batch of four, in a class that may hold
        // half of it: named as the route lists them; without a route (a service of the user's
        // own), no member is named.
        let halved = ServiceBuilder::new()
            .layer(ChargeLayer::new(limiter.clone(), AsAuthenticated, None))
            .layer(AdmitLayer::new(
                admission_sharing(4, ClassShares::new(500, 500)),
                BYTES,
                None,
            ))
            .service_fn(leased);
        let too_many = |route: Option<Route>| {
            let mut req = request(cost(5, 5));
            req.request.extensions_mut().insert(Sequences {
                prompts: vec![1; 5],
                choices: 1,
            });
            if let Some(route) = route {
                req.request.extensions_mut().insert(route);
            }
            halved.clone().oneshot(req)
        };
        let completions = Route::OpenAi(crate::api::Endpoint::Completions);
        let e = too_many(Some(completions)).await.expect_err("too many");
        assert_eq!(
            (e.status, e.param.as_deref(), e.message.as_str()),
            (
                StatusCode::BAD_REQUEST,
                Some("prompt"),
                "the request runs 5 sequences (its 5 prompts), more than a standard request may run at once on any backend (largest: 2) (admission.standard_share = 0.5; more sequences than a backend's whole batch run in turns only in a class that may hold all of it); send fewer prompts"
            )
        );
        assert_eq!(too_many(None).await.expect_err("too many").param, None);
        assert_eq!(available(&limiter).await, (1000.0, 100.0, 5.0));
        let held = admission
            .admit(
                "other",
                Priority::Standard,
                Need {
                    bytes: 800,
                    prompt_tokens: 800,
                    output_tokens: 0,
                    sequences: 1,
                    alone: None,
                    in_turns: false,
                },
            )
            .await
            .expect("fits");
        let e = svc
            .clone()
            .oneshot(request(cost(200, 1)))
            .await
            .unwrap_err();
        assert_eq!(
            (e.status, e.code, e.retry_after),
            (
                StatusCode::SERVICE_UNAVAILABLE,
                crate::error::ErrorCode::CapacityExhausted,
                Some(Duration::from_secs(7))
            )
        );
        assert_eq!(available(&limiter).await, (1000.0, 100.0, 5.0));
        assert_eq!(reserved(&admission), 800);
        drop(held);
        svc.oneshot(request(cost(200, 1))).await.expect("fits now");
    }

    #[tokio::test]
    async fn the_requests_class_is_queued_and_its_refusals_counted_by_class() {
        let (limiter, admission) = (limiter(), admission());
        let metrics = Arc::new(AdmitMetrics::default());
        let svc = ServiceBuilder::new()
            .layer(ChargeLayer::new(limiter.clone(), AsAuthenticated, None))
            .layer(AdmitLayer::new(
                admission.clone(),
                BYTES,
                Some(metrics.clone()),
            ))
            .service_fn(leased);
        let held = admission
            .admit(
                "other",
                Priority::Standard,
                Need {
                    bytes: 900,
                    prompt_tokens: 900,
                    output_tokens: 0,
                    sequences: 1,
                    alone: None,
                    in_turns: false,
                },
            )
            .await
            .expect("fits");
        let mut req = request(cost(200, 1));
        req.request.extensions_mut().insert(Priority::Sheddable);
        let e = svc.clone().oneshot(req).await.unwrap_err();
        assert_eq!(e.code, crate::error::ErrorCode::CapacityExhausted);
        let refused = |class: &str| {
            metrics
                .queue_refusals
                .get_or_create(&crate::metrics::QueueRefusalLabels {
                    class: class.to_string(),
                    reason: "queue_full".to_string(),
                })
                .get()
        };
        assert_eq!((refused("sheddable"), refused("standard")), (1, 0));
        assert_eq!(available(&limiter).await, (1000.0, 100.0, 5.0));
        drop(held);
        svc.oneshot(request(cost(200, 1))).await.expect("fits now");
    }
}
