//! The request path of DESIGN.md, written once: [`outer`] and [`route`] (steps 1-4: request id,
//! panic -> 500, route) and [`generation_service`] (steps 5-11, one layer each: authenticate,
//! count, charge, admit, then the leaf that forwards and meters; see [`crate::layers`] for what
//! each leaves in the request's extensions). The listeners that serve it are [`super`]'s.

use crate::admin;
use crate::api::{Route, Wire};
use crate::error::{Allow, ApiError};
use crate::gateway::Gateway;
use crate::layers::{AdmitLayer, AuthenticateLayer, ChargeLayer, CountLayer, KvGeometry};
use crate::proxy::forward::Forward;
use crate::proxy::{error_response, error_response_in, local, GatewayBody};
use crate::request_id::RequestIds;
use crate::request_id::REQUEST_ID;
use futures_util::future::BoxFuture;
use http::{Request, Response};
use hyper::body::Incoming;
use std::any::Any;
use std::future::Future;
use std::sync::Arc;
use tower::{ServiceBuilder, ServiceExt};
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::request_id::PropagateRequestIdLayer;
use tracing::Instrument;

fn panic_response(panic: Box<dyn Any + Send + 'static>) -> Response<String> {
    let what = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    tracing::error!(panic = %what, "handler panicked; its reservation and lease were released by their guards");
    let e = ApiError::internal();
    let (parts, _) = e
        .to_response::<http_body_util::Full<bytes::Bytes>>()
        .into_parts();
    Response::from_parts(parts, e.body_json().to_string())
}

/// Steps 5-11 of a generation route (OpenAI's or MindIE's native ones), one layer per step in
/// DESIGN.md's order; the [`Route`] is in the request's extensions.
pub fn generation_service<B>(
    gw: Arc<Gateway>,
) -> impl tower::Service<
    Request<B>,
    Response = Response<GatewayBody>,
    Error = ApiError,
    Future = impl Future + Send + 'static,
> + Clone
       + Send
       + 'static
where
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let geometry = KvGeometry::from(&gw.config.model);
    let metrics = Some(gw.metrics.clone());
    ServiceBuilder::new()
        // 5. API key -> `Arc<Tenant>`; counts every refusal from here on under the tenant
        .layer(
            AuthenticateLayer::new(gw.live.clone())
                .counting_outcomes(gw.recorder.clone(), gw.metrics.clone()),
        )
        // 6-7. parse + count: `GenerationRequest` and its `Cost` (refused unread when the
        //      buckets cannot give even the least a request costs)
        .layer(CountLayer::new(gw.counter.clone()))
        // 8. charge the buckets (under the limits in force now): the request's `Ticket`,
        //    recorded in the workload profile when it settles
        .layer(
            ChargeLayer::new(gw.limiter.clone(), gw.live.clone(), metrics.clone())
                .recording(gw.recorder.clone()),
        )
        // 9. admit by KV footprint, waiting fairly: the lease goes into the ticket
        .layer(AdmitLayer::new(gw.admission.clone(), geometry, metrics))
        // 10-11. forward to the leased backend; the metered answer owns the ticket
        .service(Forward::new(gw.backends.clone()))
}

/// What answers one of the main listener's routes.
trait Handler:
    tower::Service<
        Request<Incoming>,
        Response = Response<GatewayBody>,
        Error = ApiError,
        Future: Send + 'static,
    > + Clone
    + Send
    + 'static
{
}

impl<S> Handler for S where
    S: tower::Service<
            Request<Incoming>,
            Response = Response<GatewayBody>,
            Error = ApiError,
            Future: Send + 'static,
        > + Clone
        + Send
        + 'static
{
}

/// The main listener's routes: generation through [`generation_service`]; `/tokenize` and
/// `/v1/models` after authentication alone.
#[derive(Clone)]
struct Routes<G, T, M> {
    generate: G,
    tokenize: T,
    models: M,
}

fn routes(gw: Arc<Gateway>) -> Routes<impl Handler, impl Handler, impl Handler> {
    let (counter, upstreams) = (gw.counter.clone(), gw.backends.upstreams.clone());
    Routes {
        generate: generation_service(gw.clone()),
        tokenize: ServiceBuilder::new()
            .layer(AuthenticateLayer::new(gw.live.clone()))
            .service_fn(move |req| local::tokenize(counter.clone(), req)),
        models: ServiceBuilder::new()
            .layer(AuthenticateLayer::new(gw.live.clone()))
            .service_fn(move |req| local::models(upstreams.clone(), req)),
    }
}

/// What answers a path of the main listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Steps 5-11 ([`generation_service`]) on this generation route.
    Generate(Route),
    /// `/tokenize`, answered here after authentication.
    Tokenize,
    /// `/v1/models`, from the backends after authentication.
    Models,
}

/// The main listener's route table: each path, the one method it answers and what answers it.
/// The router and a 405's `allow` read it; tests/docs.rs holds the README's list of endpoints
/// against it.
pub fn main_routes() -> impl Iterator<Item = (&'static str, Allow, Answer)> {
    (Route::ALL.into_iter())
        .map(|r| (r.path(), Allow::Post, Answer::Generate(r)))
        .chain([
            ("/tokenize", Allow::Post, Answer::Tokenize),
            ("/v1/models", Allow::Get, Answer::Models),
        ])
}

/// Step 4: the route, and every refusal as a response in the route's shape.
async fn route<G: Handler, T: Handler, M: Handler>(
    routes: Routes<G, T, M>,
    mut req: Request<Incoming>,
) -> Response<GatewayBody> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let started = tokio::time::Instant::now();
    let found = main_routes().find(|(p, ..)| *p == path);
    let route = match found {
        Some((_, _, Answer::Generate(route))) => Some(route),
        _ => None,
    };
    let result = match found {
        None => Err(ApiError::not_found(format!("no route {method} {path}"))),
        Some((_, allow, _)) if method.as_str() != allow.as_str() => {
            Err(ApiError::method_not_allowed(&method, &path, allow))
        }
        Some((_, _, Answer::Generate(route))) => {
            req.extensions_mut().insert(route);
            routes.generate.oneshot(req).await
        }
        Some((_, _, Answer::Tokenize)) => routes.tokenize.oneshot(req).await,
        Some((_, _, Answer::Models)) => routes.models.oneshot(req).await,
    };
    let resp = match result {
        Ok(r) => r,
        Err(e) => {
            tracing::info!(status = e.status.as_u16(), code = e.code.as_str(), message = %e.message, "refused");
            // MindIE's native clients read TGI's error shape; everyone else OpenAI's.
            let wire = route.map_or(Wire::OpenAi, Route::wire);
            error_response_in(&e, wire)
        }
    };
    tracing::debug!(
        status = resp.status().as_u16(),
        elapsed_ms = started.elapsed().as_millis() as u64,
        "answered"
    );
    resp
}

/// Steps 1-2, every listener's outermost: every request gets an id (the client's when fit, see
/// `request_id`), echoed in the response, and a panic becomes a 500 in OpenAI's shape (guards
/// dropped while unwinding settle); then `serve` runs in the request's span (the listener, its
/// id, method and path).
fn outer<F, Fut, B>(
    listener: &'static str,
    serve: F,
) -> impl tower::Service<
    Request<Incoming>,
    Response = Response<
        impl http_body::Body<
                Data = bytes::Bytes,
                Error = impl Into<Box<dyn std::error::Error + Send + Sync>>,
            > + Send
            + 'static,
    >,
    Error = std::convert::Infallible,
    Future = impl Future + Send + 'static,
> + Clone
       + Send
       + 'static
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Response<B>> + Send + 'static,
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    ServiceBuilder::new()
        .map_request(|req: Request<Incoming>| RequestIds.assign(req))
        .layer(PropagateRequestIdLayer::new(http::HeaderName::from_static(
            REQUEST_ID,
        )))
        .layer(CatchPanicLayer::custom(panic_response))
        .service_fn(move |req: Request<Incoming>| {
            let rid = req
                .headers()
                .get(REQUEST_ID)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            let span = tracing::info_span!("request", listener, id = %rid, method = %req.method(), path = %req.uri().path());
            let answer = serve(req).instrument(span);
            async move { Ok::<_, std::convert::Infallible>(answer.await) }
        })
}

/// The admin listener's routes (under [`outer`], as the main listener's), every refusal in
/// OpenAI's shape.
fn admin_route(
    gw: Arc<Gateway>,
) -> impl Fn(Request<Incoming>) -> BoxFuture<'static, Response<GatewayBody>> + Clone + Send + 'static
{
    move |req| {
        let gw = gw.clone();
        Box::pin(async move {
            match admin::route(&gw, req).await {
                Ok(r) => r,
                Err(e) => error_response(&e),
            }
        })
    }
}

/// The main listener's whole stack, outermost first: steps 1-2 ([`outer`]), then 3-4 (the body
/// limit and timeouts are the layers' that read bodies) and the route, whose generation routes
/// run steps 5-11 ([`generation_service`]).
pub(super) fn main_stack(
    gw: Arc<Gateway>,
) -> impl tower::Service<
    Request<Incoming>,
    Response = Response<
        impl http_body::Body<
                Data = bytes::Bytes,
                Error = impl Into<Box<dyn std::error::Error + Send + Sync>>,
            > + Send
            + 'static,
    >,
    Error = std::convert::Infallible,
    Future = impl Future + Send + 'static,
> + Clone
       + Send
       + 'static {
    let routes = routes(gw);
    outer("main", move |req| route(routes.clone(), req))
}

/// The admin listener's stack: [`outer`] around its routes.
pub(super) fn admin_stack(
    gw: Arc<Gateway>,
) -> impl tower::Service<
    Request<Incoming>,
    Response = Response<
        impl http_body::Body<
                Data = bytes::Bytes,
                Error = impl Into<Box<dyn std::error::Error + Send + Sync>>,
            > + Send
            + 'static,
    >,
    Error = std::convert::Infallible,
    Future = impl Future + Send + 'static,
> + Clone
       + Send
       + 'static {
    outer("admin", admin_route(gw))
}
