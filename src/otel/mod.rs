//! OpenTelemetry: a span per request with the GenAI semantic conventions' attributes, a child
//! span per step of the request path, W3C trace context passed to the backend, and the GenAI
//! server metrics, sent over OTLP/HTTP (binary protobuf, the `opentelemetry-proto` messages) by
//! a task of their own. Off without `[otel]`: then no layer, no span and no task exist, and the
//! client's trace context reaches the backend as [`crate::trace_context`] passes it.
//!
//! The request path touches it only through narrow hooks: [`TraceLayer`] (outermost around a
//! lane's steps) starts the request's span and notes the answer's status; [`step`] opens a
//! step's span from the request's extensions (nothing when off); [`counted`] notes the model;
//! the forward step's span travels with the request's settlement, which notes the tokens and
//! latencies in it ([`StepSpan::settled`]). Every span ends when its guard drops.

mod attribute;
mod export;
mod histograms;
mod span;

use crate::config::OtelConfig;
pub use span::{RequestTrace, Settled, Step, StepSpan};

use crate::api::request::GenerationRequest;
use crate::api::route::{Endpoint, PooledKind};
use crate::api::Route;
use crate::clock::SharedClock;
use crate::error::ApiError;
use crate::metrics::OtelMetrics;
use crate::tenant::Tenant;
use export::{Exporter, Shared};
use futures_util::future::BoxFuture;
use http::{Extensions, Request, Response};
use std::sync::Arc;
use std::task::{Context, Poll};

/// The running exporter and what requests record into; dropping it stops the exports.
#[derive(Debug)]
pub struct Otel {
    shared: Arc<Shared>,
    exporter: Exporter,
}

impl Otel {
    /// Starts exporting as `config` says (on the current runtime), timing spans on `clock` and
    /// counting the spans it drops in `metrics`.
    pub fn start(
        config: &OtelConfig,
        clock: SharedClock,
        metrics: &OtelMetrics,
    ) -> anyhow::Result<Self> {
        let shared = Arc::new(Shared::new(config, clock, metrics));
        let exporter = Exporter::start(config, shared.clone())?;
        Ok(Self { shared, exporter })
    }

    /// Sends the spans waiting and the metrics now, within `otel.export_timeout` (at a clean
    /// stop, once every request has settled: nothing finished is left unsent).
    pub async fn flush(&self) {
        self.exporter.flush().await;
    }

    /// The layer that starts each request's span.
    pub fn layer(&self) -> TraceLayer {
        TraceLayer {
            shared: self.shared.clone(),
        }
    }
}

/// `gen_ai.operation.name` of a route: the conventions' `chat`, `text_completion` and
/// `embeddings`, and the pooling routes' own names where the conventions have none.
fn operation(route: Option<&Route>) -> &'static str {
    match route {
        Some(
            Route::OpenAi(Endpoint::Chat | Endpoint::ChatBatch)
            | Route::Messages
            | Route::Responses,
        )
        | None => "chat",
        Some(Route::OpenAi(Endpoint::Completions) | Route::MindIe(_)) => "text_completion",
        Some(Route::GenerativeScoring) => "score",
        Some(Route::Pooling(p)) => match p.kind() {
            PooledKind::Embed | PooledKind::CohereEmbed => "embeddings",
            PooledKind::Score => "score",
            PooledKind::Rerank => "rerank",
        },
    }
}

/// Starts each request's span (see [`RequestTrace`]) and notes its answer's status.
#[derive(Clone, Debug)]
pub struct TraceLayer {
    shared: Arc<Shared>,
}

impl<S> tower::Layer<S> for TraceLayer {
    type Service = Traced<S>;

    fn layer(&self, inner: S) -> Traced<S> {
        Traced {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// The service of [`TraceLayer`].
#[derive(Clone, Debug)]
pub struct Traced<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S, B, RB> tower::Service<Request<B>> for Traced<S>
where
    S: tower::Service<Request<B>, Response = Response<RB>, Error = ApiError>,
    S::Future: Send + 'static,
{
    type Response = Response<RB>;
    type Error = ApiError;
    type Future = BoxFuture<'static, Result<Response<RB>, ApiError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ApiError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let context = crate::trace_context::passed_on(req.headers());
        let operation = operation(req.extensions().get::<Route>());
        let trace = RequestTrace::start(self.shared.clone(), operation, context);
        req.extensions_mut().insert(trace.clone());
        let answer = self.inner.call(req);
        Box::pin(async move {
            let answered = answer.await;
            match &answered {
                Ok(resp) => trace.answered(resp.status().as_u16(), None),
                Err(e) => trace.answered(e.status.as_u16(), Some(e.code.as_str())),
            }
            answered
        })
    }
}

/// A span for `step` of the request whose extensions are `ext` (none when OpenTelemetry is
/// off).
pub fn step(ext: &Extensions, step: Step) -> Option<StepSpan> {
    Some(ext.get::<RequestTrace>()?.step(step))
}

/// Notes `tenant`, whose key the request whose extensions are `ext` carries, in its span.
pub fn authenticated(ext: &Extensions, tenant: &Tenant) {
    if let Some(trace) = ext.get::<RequestTrace>() {
        trace.tenant(&tenant.name);
    }
}

/// Notes the model `req`, counted, named and the output limit it asked for, in the span of the
/// request whose extensions are `ext`.
pub fn counted(ext: &Extensions, req: &GenerationRequest) {
    if let Some(trace) = ext.get::<RequestTrace>() {
        trace.request(&req.model, req.requested_max_tokens.map(|(_, n)| n));
    }
}
