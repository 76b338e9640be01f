//! Step 5, authenticate: the request's API key names its tenant, in the directory in force now
//! (a reload swaps it whole); the request goes on [`Authenticated`], its tenant beside it, with
//! its [`Priority`](crate::admission::Priority) in its extensions (the tenant's class, or the
//! lower one its `x-tokengate-priority` header asks for), and the tenant is noted in the
//! request's [`Pending`] record and its trace when it has them. A missing or unknown key is a
//! 401; a header asking for a class above the tenant's, or for none, a 400 before anything is
//! counted.

use super::step::{Step, StepLayer};
use crate::error::ApiError;
use crate::record::Pending;
use crate::reload::live::LiveConfig;
use crate::tenant::Tenant;
use futures_util::future::BoxFuture;
use http::Request;
use std::sync::Arc;
use tower::Service;

/// Step 5 as a layer: passes the request on [`Authenticated`], and adds its
/// [`Priority`](crate::admission::Priority) to its extensions.
pub type AuthenticateLayer = StepLayer<Authenticating>;

/// A request whose API key named its tenant: the steps after authentication take a request only
/// in this shape, so none of them can run before it.
#[derive(Debug)]
pub struct Authenticated<R> {
    /// The request.
    pub request: R,
    /// The tenant its key names.
    pub tenant: Arc<Tenant>,
}

/// What step 5 authenticates against.
#[derive(Debug)]
pub struct Authenticating {
    live: Arc<LiveConfig>,
}

impl AuthenticateLayer {
    /// Authenticates against the tenants in force in `live`.
    pub fn new(live: Arc<LiveConfig>) -> Self {
        StepLayer::of(Authenticating { live })
    }
}

impl<S, B> Step<S, Request<B>> for Authenticating
where
    S: Service<Authenticated<Request<B>>> + Send + 'static,
    S::Future: Send,
    S::Error: Into<ApiError>,
    B: Send + 'static,
{
    type Passes = Authenticated<Request<B>>;
    type Response = S::Response;

    fn run(
        self: Arc<Self>,
        mut req: Request<B>,
        mut inner: S,
    ) -> BoxFuture<'static, Result<S::Response, ApiError>> {
        let authenticated = self.live.current().tenants.authenticate(req.headers());
        let classed = authenticated.map(|tenant| {
            if let Some(pending) = req.extensions().get::<Pending>() {
                pending.tenant(&tenant);
            }
            crate::otel::authenticated(req.extensions(), &tenant);
            let class = tenant.priority.for_request(&tenant.name, req.headers());
            (tenant, class)
        });
        Box::pin(async move {
            let (tenant, class) = classed?;
            req.extensions_mut().insert(class?);
            let authenticated = Authenticated {
                request: req,
                tenant,
            };
            inner.call(authenticated).await.map_err(Into::into)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::Priority;
    use crate::layers::testing::{live, outcomes_of, record_layer};
    use crate::metrics::Metrics;
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
        req: Authenticated<Request<Full<Bytes>>>,
        e: Option<ApiError>,
    ) -> Result<Response<String>, ApiError> {
        let tenant = req.tenant;
        match e {
            Some(e) => Err(e),
            None => Ok(Response::new(tenant.name.clone())),
        }
    }

    #[tokio::test]
    async fn the_priority_header_lowers_the_class_and_a_raise_is_refused_before_the_inner_service()
    {
        let (live, metrics) = (live(10.0), Arc::new(Metrics::new()));
        let svc = ServiceBuilder::new()
            .layer(record_layer(&metrics))
            .layer(AuthenticateLayer::new(live.clone()))
            .service_fn(|req: Authenticated<Request<Full<Bytes>>>| async move {
                let class = req.request.extensions().get::<Priority>().expect("classed");
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
        assert_eq!(outcomes_of(&metrics, "alice", "invalid_request"), 1);
    }

    #[tokio::test]
    async fn the_key_names_the_tenant_and_refusals_are_counted_under_it() {
        let (live, metrics) = (live(10.0), Arc::new(Metrics::new()));
        let svc = ServiceBuilder::new()
            .layer(record_layer(&metrics))
            .layer(AuthenticateLayer::new(live.clone()))
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
        assert_eq!(outcomes_of(&metrics, "unknown", "invalid_api_key"), 1);

        let refusing = ServiceBuilder::new()
            .layer(record_layer(&metrics))
            .layer(AuthenticateLayer::new(live.clone()))
            .service_fn(|req| names_tenant(req, Some(ApiError::invalid("no"))));
        let e = refusing.oneshot(with_key("sk-alice")).await.unwrap_err();
        assert_eq!(e.code, crate::error::ErrorCode::InvalidRequest);
        assert_eq!(outcomes_of(&metrics, "alice", "invalid_request"), 1);
        // Without the record layer: the same refusal leaves the counter as it was.
        let quiet = ServiceBuilder::new()
            .layer(AuthenticateLayer::new(live.clone()))
            .service_fn(|req| names_tenant(req, Some(ApiError::invalid("no"))));
        quiet.oneshot(with_key("sk-alice")).await.unwrap_err();
        assert_eq!(outcomes_of(&metrics, "alice", "invalid_request"), 1);
    }
}
