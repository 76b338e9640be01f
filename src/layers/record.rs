//! The outcome of a generation request, recorded once: the outermost of steps 5-11 opens the
//! request's [`Pending`] record (in its extensions, with the instant it [`Arrived`]), the layers
//! after it note what they learn (the tenant, the model named, how the ticket settled), and it
//! notes the error when the request is refused, here or anywhere after. The record is written,
//! and counted in `tokengate_requests_total`, when the last holder lets go: this layer once the
//! answer's head is out, or the ticket once the answer is complete, cut or abandoned (see
//! [`crate::record`]). A refused request is recorded with its error code, under its tenant
//! (`unknown` when its key named none), with the id the client sent only once its key checked.

use super::step::{Step, StepLayer};
use crate::error::ApiError;
use crate::metrics::RecordMetrics;
use crate::record::{Arrived, Pending, Recorder};
use crate::request_id::{request_id, GatewayMade};
use futures_util::future::BoxFuture;
use http::Request;
use std::sync::Arc;
use tokio::time::Instant;
use tower::Service;

/// The outcome layer: adds [`Pending`] and [`Arrived`].
pub type RecordLayer = StepLayer<Recording>;

/// Where step 5-11's outcomes are recorded and counted.
#[derive(Debug)]
pub struct Recording {
    recorder: Arc<Recorder>,
    metrics: Arc<RecordMetrics>,
}

impl RecordLayer {
    /// Records every request in `recorder` and counts its outcome in `metrics`.
    pub fn new(recorder: Arc<Recorder>, metrics: Arc<RecordMetrics>) -> Self {
        StepLayer::of(Recording { recorder, metrics })
    }
}

impl<S, B> Step<S, Request<B>> for Recording
where
    S: Service<Request<B>> + Send + 'static,
    S::Future: Send,
    S::Error: Into<ApiError>,
    B: Send + 'static,
{
    type Passes = Request<B>;
    type Response = S::Response;

    fn run(
        self: Arc<Self>,
        mut req: Request<B>,
        mut inner: S,
    ) -> BoxFuture<'static, Result<S::Response, ApiError>> {
        let arrived = Instant::now();
        let (recorder, metrics) = (self.recorder.clone(), self.metrics.clone());
        let made_here = req.extensions().get::<GatewayMade>().is_some();
        let (pending, hold) = Pending::open(
            recorder,
            metrics,
            request_id(req.headers()),
            made_here,
            arrived,
        );
        req.extensions_mut().insert(pending.clone());
        req.extensions_mut().insert(Arrived(arrived));
        Box::pin(async move {
            let _hold = hold;
            (inner.call(req).await)
                .map_err(Into::into)
                .inspect_err(|e: &ApiError| pending.failed(e.code))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error_code::ErrorCode;
    use crate::layers::testing::{outcomes, outcomes_of, record_layer, tenant};
    use crate::metrics::{Metrics, Outcome};
    use crate::record::RecordHold;
    use crate::settled::Charged;
    use http::Response;
    use tower::{ServiceBuilder, ServiceExt};

    #[tokio::test]
    async fn the_outcome_is_counted_once_when_the_last_holder_goes() {
        let metrics = Arc::new(Metrics::new());
        // The service notes the tenant, takes a hold as a ticket does and answers with it.
        let svc = ServiceBuilder::new()
            .layer(record_layer(&metrics))
            .service_fn(|req: Request<()>| async move {
                let pending = req.extensions().get::<Pending>().expect("opened");
                assert!(req.extensions().get::<Arrived>().is_some());
                pending.tenant(&tenant());
                Ok::<_, ApiError>(Response::new(pending.hold()))
            });
        let hold: RecordHold = svc.oneshot(Request::new(())).await.unwrap().into_body();
        // Answered, the layer's hold is gone; the ticket's still is: nothing counted yet.
        assert_eq!(outcomes(&metrics, "ok"), 0);
        hold.settled(Outcome::Ok, Charged::default());
        drop(hold);
        assert_eq!(outcomes(&metrics, "ok"), 1);
    }

    #[tokio::test]
    async fn a_refusal_is_counted_with_its_code_under_no_tenant_before_its_key_is_known() {
        let metrics = Arc::new(Metrics::new());
        let svc = ServiceBuilder::new()
            .layer(record_layer(&metrics))
            .service_fn(|_: Request<()>| async { Err::<Response<()>, _>(ApiError::invalid("no")) });
        let e = svc.oneshot(Request::new(())).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidRequest);
        assert_eq!(outcomes_of(&metrics, "unknown", "invalid_request"), 1);
    }
}
