//! The request path of DESIGN.md, written once. `main_stack` is the main listener's whole
//! chain, outermost first: 1 request id and span, 2 a panic as a 500 and every refusal as its
//! answer, 3 the body's bounds, 4 the route table; a generation route then runs
//! [`lane_service`]: the outcome record, 5 authenticate, 6-7 count, 8 charge (8a the in-flight
//! cap, 8b the quotas, 8c the buckets), 9 admit,
//! 10-11 forward and meter (see [`crate::layers`] for what each leaves in the request's
//! extensions). `/tokenize`, `/detokenize` and `/v1/models` are answered after step 5 alone. The admin listener
//! has steps 1-2 around its own routes. The listeners that serve them are [`super`]'s.

use crate::admin;
use crate::api::route::path_matches;
use crate::api::{Route, Wire};
use crate::error::{Allow, ApiError};
use crate::gateway::{Gateway, Lane};
use crate::layers::{
    AdmitLayer, AuthenticateLayer, BoundBodyLayer, ChargeLayer, CountLayer, KvGeometry, RecordLayer,
};
use crate::proxy::forward::Forward;
use crate::proxy::local::{self, Local};
use crate::proxy::{error_response_in, GatewayBody};
use crate::request_id::RequestIds;
use crate::request_id::REQUEST_ID;
use crate::util::bounded::Bounded;
use futures_util::future::BoxFuture;
use http::{Request, Response};
use hyper::body::Incoming;
use std::any::Any;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower::{Layer, Service, ServiceBuilder, ServiceExt};
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::request_id::PropagateRequestIdLayer;
use tracing::instrument::Instrumented;
use tracing::Instrument;

/// A request's body from step 3 on.
type Body = Bounded<Incoming>;

/// Steps 1-2, every listener's outermost, around `inner` (the rest of `listener`'s stack).
fn answered<S>(listener: &'static str, inner: S) -> impl Listened
where
    S: Service<Request<Incoming>, Response = Response<GatewayBody>, Error = ApiError>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    ServiceBuilder::new()
        // 1. an id for every request (the client's when fit), echoed in the answer; the
        //    request's span
        .map_request(|req: Request<Incoming>| RequestIds.assign(req))
        .layer(PropagateRequestIdLayer::new(http::HeaderName::from_static(
            REQUEST_ID,
        )))
        .layer(SpanLayer(listener))
        // 2. a panic is a 500 in OpenAI's shape (guards dropped while unwinding settle); every
        //    refusal from here on is answered in its route's shape
        .layer(CatchPanicLayer::custom(panic_response))
        .layer(RespondLayer)
        .service(inner)
}

/// The main listener's whole stack, steps 1-11 in DESIGN.md's order.
pub(super) fn main_stack(gw: Arc<Gateway>) -> impl Listened {
    let server = &gw.config.server;
    let steps_3_on = ServiceBuilder::new()
        // 3. the body held to `server.max_body_bytes` and `server.body_read_timeout`
        .layer(BoundBodyLayer::new(
            server.max_body_bytes,
            server.body_read_timeout,
        ))
        // 4. the route table: a generation route goes on to `lane_service`
        .service_fn(route(routes(gw.clone())));
    answered("main", steps_3_on)
}

/// Steps 5-11 of a route the backends of `lane` answer (the generation backends'
/// [`Gateway::generation_lane`], or the pooling backends'), one layer per step in DESIGN.md's
/// order, under the layer that records the request's outcome; the [`Route`] is in the
/// request's extensions.
pub fn lane_service<B>(
    gw: &Gateway,
    lane: &Lane,
) -> impl tower::Service<
    Request<Bounded<B>>,
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
    ServiceBuilder::new()
        // with `[otel]`, the request's span: its steps' spans are its children
        .option_layer(gw.otel.as_ref().map(crate::otel::Otel::layer))
        // the request's record: its outcome, refused or settled, written and counted once
        .layer(RecordLayer::new(
            gw.recorder.clone(),
            gw.metrics.record.clone(),
        ))
        // 5. API key -> `Arc<Tenant>`
        .layer(AuthenticateLayer::new(gw.live.clone()))
        // 6-7. parse + count: `GenerationRequest` and its `Cost` (refused unread when the
        //      buckets cannot give even the least a request costs)
        .layer(CountLayer::new(lane.counter.clone()))
        // 8. charge, under the limits in force now: 8a a place under the tenant's in-flight
        //    cap, 8b its quotas reserved (`with_quotas`), 8c its buckets; the request's
        //    `Ticket` holds all three
        .layer(
            ChargeLayer::new(
                gw.limiter.clone(),
                gw.live.clone(),
                Some(gw.metrics.charge.clone()),
            )
            .with_quotas(gw.quotas.clone()),
        )
        // 9. admit by KV footprint, waiting fairly: the lease goes into the ticket
        .layer(AdmitLayer::new(
            lane.admission.clone(),
            geometry,
            Some(gw.metrics.admit.clone()),
        ))
        // 10-11. forward to the leased backend; the metered answer owns the ticket
        .service(Forward::new(lane.backends.clone()))
}

/// The admin listener's stack: steps 1-2 around its routes, every refusal in OpenAI's shape.
pub(super) fn admin_stack(gw: Arc<Gateway>) -> impl Listened {
    let routes = tower::service_fn(move |req: Request<Incoming>| {
        let gw = gw.clone();
        async move { admin::route(&gw, req).await }
    });
    answered("admin", routes)
}

/// What a listener serves: every request answered (a refusal or a panic included).
pub(super) trait Listened:
    Service<
        Request<Incoming>,
        Response = Response<Self::Body>,
        Error = std::convert::Infallible,
        Future: Send + 'static,
    > + Clone
    + Send
    + 'static
{
    /// The answer's body.
    type Body: http_body::Body<Data = bytes::Bytes, Error: Into<Box<dyn std::error::Error + Send + Sync>>>
        + Send
        + 'static;
}

impl<S, B> Listened for S
where
    S: Service<
            Request<Incoming>,
            Response = Response<B>,
            Error = std::convert::Infallible,
            Future: Send + 'static,
        > + Clone
        + Send
        + 'static,
    B: http_body::Body<Data = bytes::Bytes, Error: Into<Box<dyn std::error::Error + Send + Sync>>>
        + Send
        + 'static,
{
    type Body = B;
}

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

/// Step 1's span: the rest of the request runs in it (the listener, the request's id, method
/// and path), so every log line carries them.
#[derive(Clone, Copy, Debug)]
struct SpanLayer(&'static str);

impl<S> Layer<S> for SpanLayer {
    type Service = Span<S>;

    fn layer(&self, inner: S) -> Span<S> {
        Span {
            inner,
            listener: self.0,
        }
    }
}

/// The service of [`SpanLayer`].
#[derive(Clone, Debug)]
struct Span<S> {
    inner: S,
    listener: &'static str,
}

impl<S: Service<Request<B>>, B> Service<Request<B>> for Span<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = Instrumented<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let id = req
            .headers()
            .get(REQUEST_ID)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        // `backend_id`: the gateway's id the request goes to a backend with, when the client's
        // is `id` (`crate::request_id::backend_id`).
        let span = tracing::info_span!("request", listener = self.listener, id = %id, backend_id = tracing::field::Empty, method = %req.method(), path = %req.uri().path());
        self.inner.call(req).instrument(span)
    }
}

/// Step 2's answers: every refusal as a response, in the shape of the route it was sent to
/// (MindIE's native clients read TGI's, everyone else OpenAI's), logged once.
#[derive(Clone, Copy, Debug)]
struct RespondLayer;

impl<S> Layer<S> for RespondLayer {
    type Service = Respond<S>;

    fn layer(&self, inner: S) -> Respond<S> {
        Respond(inner)
    }
}

/// The service of [`RespondLayer`].
#[derive(Clone, Debug)]
struct Respond<S>(S);

impl<S, B> Service<Request<B>> for Respond<S>
where
    S: Service<Request<B>, Response = Response<GatewayBody>, Error = ApiError>,
    S::Future: Send + 'static,
{
    type Response = Response<GatewayBody>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<'static, Result<Response<GatewayBody>, std::convert::Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // The services under this one are always ready (they make their clones ready per call).
        self.0.poll_ready(cx).map(|_| Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let path = req.uri().path();
        let wire = (main_routes().find(|(p, ..)| path_matches(p, path)))
            .map_or(Wire::OpenAi, |r| r.2.wire());
        let started = tokio::time::Instant::now();
        let answer = self.0.call(req);
        Box::pin(async move {
            let resp = answer.await.unwrap_or_else(|e| {
                tracing::info!(status = e.status.as_u16(), code = e.code.as_str(), message = %e.message, "refused");
                error_response_in(&e, wire)
            });
            tracing::debug!(
                status = resp.status().as_u16(),
                elapsed_ms = started.elapsed().as_millis() as u64,
                "answered"
            );
            Ok(resp)
        })
    }
}

/// What answers one of the main listener's routes.
trait Handler:
    tower::Service<
        Request<Body>,
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
            Request<Body>,
            Response = Response<GatewayBody>,
            Error = ApiError,
            Future: Send + 'static,
        > + Clone
        + Send
        + 'static
{
}

/// The main listener's routes: generation and pooling each through [`lane_service`] on their
/// own backends (no pooling one without pooling backends); the local answers (`/tokenize`,
/// `/detokenize`, `/v1/models`) after authentication alone.
#[derive(Clone)]
struct Routes<G, L> {
    generate: G,
    pool: Option<G>,
    local: L,
}

fn routes(gw: Arc<Gateway>) -> Routes<impl Handler, impl Handler> {
    let (counter, upstreams) = (gw.counter.clone(), gw.backends.upstreams.clone());
    Routes {
        generate: lane_service(&gw, &gw.generation_lane()),
        pool: (gw.pooling.as_ref()).map(|lane| lane_service(&gw, lane)),
        local: ServiceBuilder::new()
            .layer(AuthenticateLayer::new(gw.live.clone()))
            .service_fn(move |req| local::answer(counter.clone(), upstreams.clone(), req)),
    }
}

/// What answers a path of the main listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Steps 5-11 on this route: [`lane_service`] on the generation backends, or on the
    /// pooling backends' when it pools.
    Generate(Route),
    /// Answered by the gateway itself after authentication.
    Local(Local),
}

impl Answer {
    /// The dialect of its answers and refusals.
    pub fn wire(self) -> Wire {
        match self {
            Answer::Generate(route) => route.wire(),
            Answer::Local(local) => local.wire(),
        }
    }
}

/// The main listener's route table: each path, the one method it answers and what answers it.
/// The router and a 405's `allow` read it; tests/docs.rs holds docs/reference.md's list of endpoints
/// against it.
pub fn main_routes() -> impl Iterator<Item = (&'static str, Allow, Answer)> {
    (Route::ALL.into_iter())
        .map(|r| (r.path(), Allow::Post, Answer::Generate(r)))
        .chain(Local::ALL.map(|l| (l.path(), l.method(), Answer::Local(l))))
}

/// Step 4: the route table's answer for the request's path and method; a 404 or a 405 (with
/// `allow`) for anything else.
fn route<G: Handler, L: Handler>(
    routes: Routes<G, L>,
) -> impl Fn(Request<Body>) -> BoxFuture<'static, Result<Response<GatewayBody>, ApiError>> + Clone {
    move |mut req| {
        let routes = routes.clone();
        Box::pin(async move {
            let (method, path) = (req.method(), req.uri().path());
            let Some((_, allow, answer)) = main_routes().find(|(p, ..)| path_matches(p, path))
            else {
                return Err(ApiError::not_found(format!("no route {method} {path}")));
            };
            if method.as_str() != allow.as_str() {
                return Err(ApiError::method_not_allowed(method, path, allow));
            }
            match answer {
                Answer::Generate(route) => {
                    let lane = match (route.generates(), routes.pool) {
                        (true, _) => routes.generate,
                        (false, Some(pool)) => pool,
                        (false, None) => {
                            return Err(ApiError::not_found(format!(
                                "no backend serves {path}: it needs a pooling backend (`runner = \"pooling\"` in [[backends]])"
                            )))
                        }
                    };
                    req.extensions_mut().insert(route);
                    lane.oneshot(req).await
                }
                Answer::Local(local) => {
                    req.extensions_mut().insert(local);
                    routes.local.oneshot(req).await
                }
            }
        })
    }
}
