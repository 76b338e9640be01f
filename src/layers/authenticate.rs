//! Step 5, authenticate: the request's API key names its tenant, in the directory in force now
//! (a reload swaps it whole); the tenant goes on as `Arc<Tenant>` in the request's extensions,
//! with the instant the request [`Arrived`] and its [`Priority`](crate::admission::Priority) (the tenant's class, or the
//! lower one its `x-tokengate-priority` header asks for). A missing or unknown key is a 401; a
//! header asking for a class above the tenant's, or for none, a 400 before anything is counted.
//!
//! With outcomes counted ([`AuthenticateLayer::counting_outcomes`]), every refusal from here on
//! is counted in `tokengate_requests_total` under its tenant (`unknown` when the key named
//! none) and its error code; the answers themselves are counted by the ticket they settle.
//! The record of a request refused here for its key carries its id only when the gateway made
//! it ([`GatewayMade`]): an id the client chose is its own word until its key is checked, and
//! an unauthenticated client must not write what it likes into the usage log.

use crate::error::ApiError;
use crate::metrics::{Metrics, Outcome};
use crate::record::Arrived;
use crate::record::{NamedModel, Recorder, Settled};
use crate::reload::live::LiveConfig;
use crate::request_id::request_id;
use crate::request_id::GatewayMade;
use futures_util::future::BoxFuture;
use http::Request;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::time::Instant;
use tower::{Layer, Service};

/// Step 5 as a layer: adds `Arc<Tenant>`, [`Arrived`] and [`Priority`](crate::admission::Priority).
#[derive(Clone, Debug)]
pub struct AuthenticateLayer {
    live: Arc<LiveConfig>,
    outcomes: Option<Outcomes>,
}

/// Where refusals are counted: the workload profile and usage log, and the metrics.
#[derive(Clone, Debug)]
struct Outcomes {
    recorder: Arc<Recorder>,
    metrics: Arc<Metrics>,
}

impl AuthenticateLayer {
    /// Authenticates against the tenants in force in `live`.
    pub fn new(live: Arc<LiveConfig>) -> Self {
        Self {
            live,
            outcomes: None,
        }
    }

    /// Also counts every refusal of the request, here or in the layers after this one, in
    /// `recorder` and `metrics`.
    pub fn counting_outcomes(mut self, recorder: Arc<Recorder>, metrics: Arc<Metrics>) -> Self {
        self.outcomes = Some(Outcomes { recorder, metrics });
        self
    }
}

impl<S> Layer<S> for AuthenticateLayer {
    type Service = Authenticate<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Authenticate {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service of [`AuthenticateLayer`].
#[derive(Clone, Debug)]
pub struct Authenticate<S> {
    inner: S,
    layer: AuthenticateLayer,
}

impl<S, B> Service<Request<B>> for Authenticate<S>
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

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let arrived = Arrived(Instant::now());
        let mut inner = self.inner.clone();
        std::mem::swap(&mut self.inner, &mut inner);
        let AuthenticateLayer { live, outcomes } = self.layer.clone();
        let count_outcomes = outcomes.is_some();
        let authenticated = live
            .current()
            .tenants
            .authenticate(req.headers())
            .map_err(ApiError::from)
            .map(|tenant| {
                let class = tenant
                    .priority
                    .for_request(&tenant.name, req.headers())
                    .map_err(ApiError::from);
                (tenant, class)
            });
        let id = count_outcomes.then(|| request_id(req.headers())).flatten();
        let made_here = req.extensions().get::<GatewayMade>().is_some();
        let unauthenticated_id = id.clone().filter(|_| made_here);
        let named = count_outcomes.then(NamedModel::default);
        Box::pin(async move {
            let count = |tenant: &str, id: &Option<String>, e: &ApiError| {
                let Some(Outcomes { recorder, metrics }) = &outcomes else {
                    return;
                };
                if !e.recorded {
                    let outcome = Outcome::Failed(e.code);
                    recorder.settle(Settled {
                        request_id: id.clone(),
                        tenant: tenant.to_owned(),
                        model: named.as_ref().and_then(NamedModel::get),
                        outcome,
                        arrived: Some(arrived.0),
                        charge: None,
                    });
                    metrics.outcome(tenant, outcome);
                }
            };
            let (tenant, class) =
                authenticated.inspect_err(|e| count("unknown", &unauthenticated_id, e))?;
            let class = class.inspect_err(|e| count(&tenant.name, &id, e))?;
            req.extensions_mut().insert(tenant.clone());
            req.extensions_mut().insert(class);
            req.extensions_mut().insert(arrived);
            if let Some(named) = &named {
                req.extensions_mut().insert(named.clone());
            }
            inner
                .call(req)
                .await
                .map_err(Into::into)
                .inspect_err(|e| count(&tenant.name, &id, e))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::Priority;
    use crate::layers::testing::{gateway, outcomes_of};
    use crate::tenant::Tenant;
    use bytes::Bytes;
    use http::{Response, StatusCode};
    use http_body_util::Full;
    use tower::{ServiceBuilder, ServiceExt};

    fn with_key(key: &str) -> Request<Full<Bytes>> {
        Request::builder()
            .header("authorization", format!("Bearer {key}"))
            .body(Full::new(Bytes::from_static(b"{}")))
            .expect("valid")
    }

    /// Answers with the name of the tenant it was handed, or `e` when given one.
    async fn names_tenant(
        req: Request<Full<Bytes>>,
        e: Option<ApiError>,
    ) -> Result<Response<String>, ApiError> {
        let tenant = req
            .extensions()
            .get::<Arc<Tenant>>()
            .expect("authenticated");
        assert!(req.extensions().get::<Arrived>().is_some());
        match e {
            Some(e) => Err(e),
            None => Ok(Response::new(tenant.name.clone())),
        }
    }

    #[tokio::test]
    async fn the_priority_header_lowers_the_class_and_a_raise_is_refused_before_the_inner_service()
    {
        let gw = gateway(10.0).await;
        let svc = ServiceBuilder::new()
            .layer(
                AuthenticateLayer::new(gw.live.clone())
                    .counting_outcomes(gw.recorder.clone(), gw.metrics.clone()),
            )
            .service_fn(|req: Request<Full<Bytes>>| async move {
                let class = req.extensions().get::<Priority>().expect("classed");
                Ok::<_, ApiError>(Response::new(class.as_str()))
            });
        let asking = |value: &str| {
            let mut req = with_key("sk-alice");
            req.headers_mut()
                .insert(crate::admission::PRIORITY_HEADER, value.parse().unwrap());
            req
        };
        let class = |req| async { svc.clone().oneshot(req).await.map(Response::into_body) };
        // alice is `standard` (the default).
        assert_eq!(class(with_key("sk-alice")).await.unwrap(), "standard");
        assert_eq!(class(asking("sheddable")).await.unwrap(), "sheddable");
        let e = class(asking("critical")).await.unwrap_err();
        assert_eq!(
            (e.status, e.code, e.param.as_deref()),
            (
                StatusCode::BAD_REQUEST,
                crate::error::ErrorCode::InvalidRequest,
                Some("x-tokengate-priority")
            )
        );
        assert_eq!(outcomes_of(&gw.metrics, "alice", "invalid_request"), 1);
    }

    #[tokio::test]
    async fn the_key_names_the_tenant_and_refusals_are_counted_under_it() {
        let gw = gateway(10.0).await;
        let svc = ServiceBuilder::new()
            .layer(
                AuthenticateLayer::new(gw.live.clone())
                    .counting_outcomes(gw.recorder.clone(), gw.metrics.clone()),
            )
            .service_fn(|req| names_tenant(req, None));
        let resp = svc
            .clone()
            .oneshot(with_key("sk-alice"))
            .await
            .expect("known");
        assert_eq!(resp.into_body(), "alice");
        let e = svc.oneshot(with_key("sk-mallory")).await.unwrap_err();
        assert_eq!(
            (e.status, e.code),
            (
                StatusCode::UNAUTHORIZED,
                crate::error::ErrorCode::InvalidApiKey
            )
        );
        assert_eq!(outcomes_of(&gw.metrics, "unknown", "invalid_api_key"), 1);

        let refusing = ServiceBuilder::new()
            .layer(
                AuthenticateLayer::new(gw.live.clone())
                    .counting_outcomes(gw.recorder.clone(), gw.metrics.clone()),
            )
            .service_fn(|req| names_tenant(req, Some(ApiError::invalid("no"))));
        let e = refusing.oneshot(with_key("sk-alice")).await.unwrap_err();
        assert_eq!(e.code, crate::error::ErrorCode::InvalidRequest);
        assert_eq!(outcomes_of(&gw.metrics, "alice", "invalid_request"), 1);
        // Not counting: the same refusal leaves the counter as it was.
        let quiet = ServiceBuilder::new()
            .layer(AuthenticateLayer::new(gw.live.clone()))
            .service_fn(|req| names_tenant(req, Some(ApiError::invalid("no"))));
        quiet.oneshot(with_key("sk-alice")).await.unwrap_err();
        assert_eq!(outcomes_of(&gw.metrics, "alice", "invalid_request"), 1);
    }
}
