//! Listeners, the tower stack and graceful shutdown. The middleware order of DESIGN.md is
//! written once, in [`main_service`]: request id, panic -> 500, then the router, whose
//! handlers run auth, parse, count, charge, admit, forward and meter (see `proxy`).

use crate::admin;
use crate::api::openai::Endpoint;
use crate::error::ApiError;
use crate::proxy::{error_response, Gateway, GatewayBody, REQUEST_ID};
use http::{HeaderValue, Method, Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::any::Any;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tower::ServiceBuilder;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::request_id::{
    MakeRequestId, PropagateRequestIdLayer, RequestId, SetRequestIdLayer,
};
use tracing::Instrument;

/// Request ids: a process-unique prefix and a counter (cheap, sortable, never reused).
#[derive(Clone)]
struct Sequential {
    prefix: u32,
    next: Arc<AtomicU64>,
}

impl MakeRequestId for Sequential {
    fn make_request_id<B>(&mut self, _: &Request<B>) -> Option<RequestId> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        HeaderValue::from_str(&format!("tg-{:08x}-{n}", self.prefix))
            .ok()
            .map(RequestId::new)
    }
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

async fn route_main(
    gw: Arc<Gateway>,
    req: Request<Incoming>,
) -> Result<Response<GatewayBody>, std::convert::Infallible> {
    let rid = req
        .headers()
        .get(REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let span =
        tracing::info_span!("request", id = %rid, method = %req.method(), path = %req.uri().path());
    Ok(route(gw, req).instrument(span).await)
}

async fn route(gw: Arc<Gateway>, req: Request<Incoming>) -> Response<GatewayBody> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let started = tokio::time::Instant::now();
    let (tenant, result) = match (method.clone(), path.as_str()) {
        (Method::POST, "/v1/chat/completions") => gw.generate(Endpoint::Chat, req).await,
        (Method::POST, "/v1/completions") => gw.generate(Endpoint::Completions, req).await,
        (Method::POST, "/tokenize") => (None, gw.tokenize(req).await),
        (Method::GET, "/v1/models") => (None, gw.models(req.headers()).await),
        (_, "/v1/chat/completions" | "/v1/completions" | "/tokenize" | "/v1/models") => (
            None,
            Err(ApiError::method_not_allowed(format!(
                "{method} is not allowed on {path}"
            ))),
        ),
        _ => (
            None,
            Err(ApiError::not_found(format!("no route {method} {path}"))),
        ),
    };
    let resp = match result {
        Ok(r) => r,
        Err(e) => {
            if let Some(tenant) = &tenant {
                gw.metrics.outcome(tenant, e.code);
            }
            tracing::info!(status = e.status.as_u16(), code = e.code, message = %e.message, "refused");
            error_response(&e)
        }
    };
    tracing::debug!(
        status = resp.status().as_u16(),
        elapsed_ms = started.elapsed().as_millis() as u64,
        "answered"
    );
    resp
}

/// The main listener's service: the whole stack, outermost first.
fn main_service(
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
    let ids = Sequential {
        prefix: rand::random(),
        next: Arc::new(AtomicU64::new(1)),
    };
    ServiceBuilder::new()
        // 1. every request gets an id (kept if the client sent one), echoed in the response
        .layer(SetRequestIdLayer::new(
            http::HeaderName::from_static(REQUEST_ID),
            ids,
        ))
        .layer(PropagateRequestIdLayer::new(http::HeaderName::from_static(
            REQUEST_ID,
        )))
        // 2. a panic becomes a 500 in OpenAI's shape; guards dropped while unwinding settle
        .layer(CatchPanicLayer::custom(panic_response))
        // 3-11. body limit and timeouts, route, auth, parse, count, charge, admit, forward,
        //       meter: see `proxy::Gateway::generate`
        .service_fn(move |req| route_main(gw.clone(), req))
}

fn admin_service(
    gw: Arc<Gateway>,
) -> impl tower::Service<
    Request<Incoming>,
    Response = Response<GatewayBody>,
    Error = std::convert::Infallible,
    Future = impl Future + Send + 'static,
> + Clone
       + Send
       + 'static {
    tower::service_fn(move |req: Request<Incoming>| {
        let gw = gw.clone();
        async move {
            Ok::<_, std::convert::Infallible>(match admin::route(&gw, req).await {
                Ok(r) => r,
                Err(e) => error_response(&e),
            })
        }
    })
}

/// A running gateway: its bound addresses and a way to stop it.
pub struct Running {
    /// Main (API) address.
    pub addr: SocketAddr,
    /// Admin address.
    pub admin_addr: SocketAddr,
    /// The gateway state (for tests and tools in the same process).
    pub gateway: Arc<Gateway>,
    shutdown: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Running {
    /// Stops accepting, lets in-flight requests finish within the grace period, then returns.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
    }

    /// Waits until SIGTERM or ctrl-c, then shuts down gracefully.
    pub async fn run_until_signal(self) {
        shutdown_signal().await;
        tracing::info!("shutting down: no new connections, in-flight streams may finish");
        self.shutdown().await;
    }
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
}

/// Binds both listeners and serves until [`Running::shutdown`].
pub async fn serve(gw: Arc<Gateway>) -> anyhow::Result<Running> {
    let cfg = gw.config.clone();
    let main = TcpListener::bind(cfg.server.listen).await?;
    let admin = TcpListener::bind(cfg.server.admin_listen).await?;
    let (addr, admin_addr) = (main.local_addr()?, admin.local_addr()?);
    let (tx, rx) = watch::channel(false);
    let grace = cfg.server.shutdown_grace;
    let header_timeout = cfg.server.header_read_timeout;
    let tasks = vec![
        tokio::spawn(accept_loop(
            main,
            TowerToHyperService::new(main_service(gw.clone())),
            rx.clone(),
            grace,
            header_timeout,
        )),
        tokio::spawn(accept_loop(
            admin,
            TowerToHyperService::new(admin_service(gw.clone())),
            rx,
            grace,
            header_timeout,
        )),
    ];
    tracing::info!(%addr, %admin_addr, "tokengate listening");
    Ok(Running {
        addr,
        admin_addr,
        gateway: gw,
        shutdown: tx,
        tasks,
    })
}

async fn accept_loop<S, B>(
    listener: TcpListener,
    service: S,
    mut stop: watch::Receiver<bool>,
    grace: Duration,
    header_timeout: Duration,
) where
    S: hyper::service::Service<Request<Incoming>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let graceful = GracefulShutdown::new();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let _ = stream.set_nodelay(true);
                let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), service.clone());
                let conn = graceful.watch(conn.into_owned());
                tokio::spawn(async move {
                    if let Err(e) = conn.await {
                        tracing::debug!(error = %e, "connection ended with an error");
                    }
                });
            }
            _ = stop.changed() => break,
        }
    }
    drop(listener);
    if tokio::time::timeout(grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("shutdown grace period over; cutting remaining connections");
    }
}
