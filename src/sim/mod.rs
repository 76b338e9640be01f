//! Room `sim`: the simulated MindIE / vLLM backend (`tokengate sim`). A continuous-batching engine
//! whose pass durations come from the capacity model ([`timing::Roofline`]) or a fixed pace
//! ([`timing::Pace`], fast and deterministic, for the gateway's integration tests), served over
//! HTTP with vLLM's and MindIE's APIs and vLLM's metric names.
//!
//! Layout: [`engine`] is the pure scheduler core; [`shell`] drives it on scaled tokio time;
//! [`http`] and [`wire`] are the HTTP face ([`pooled`] its pooling routes); [`text`] counts prompts and makes output text;
//! [`config`] holds what it is started with and reports; [`cli`] is `tokengate sim`.

pub mod cli;
pub mod config;
pub mod engine;
pub mod http;
pub mod metrics;
pub mod pooled;
pub mod prefix;
pub mod shell;
pub mod text;
pub mod timing;
pub mod wire;

pub use config::{Faults, SimConfig, SimStats, DEFAULT_MODEL, DEFAULT_SERVED_NAMES};
use engine::Engine;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use std::net::SocketAddr;
use std::sync::Arc;
use text::SharedCounter;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

/// A running simulated backend. Dropping it stops it (connections are cut).
#[derive(Debug)]
pub struct SimHandle {
    addr: SocketAddr,
    shared: Arc<http::Shared>,
    stop: watch::Sender<bool>,
    server: Option<JoinHandle<()>>,
    engine: JoinHandle<()>,
}

impl SimHandle {
    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Counters so far.
    pub fn stats(&self) -> SimStats {
        let mut stats = self
            .shared
            .stats
            .lock()
            .expect("stats lock poisoned")
            .clone();
        stats.generated_tokens = self.shared.metrics.generation_tokens.get();
        stats.engine = self.shared.engine.snapshot();
        stats
    }

    /// Replaces the injected failures for the requests that arrive from now on.
    pub fn set_faults(&self, faults: Faults) {
        *self.shared.faults.lock().expect("faults lock poisoned") = faults;
    }

    /// Stops accepting, cuts every connection and stops the engine.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        if let Some(server) = self.server.take() {
            let _ = server.await;
        }
        self.engine.abort();
    }
}

impl Drop for SimHandle {
    fn drop(&mut self) {
        if let Some(server) = &self.server {
            server.abort();
        }
        self.engine.abort();
    }
}

/// Starts a simulated backend on `listener` (e.g. bound to `127.0.0.1:0`), counting prompts with
/// `tokenizer` (a [`crate::tokenize::Tokenizer`]). Fails if the configuration is inconsistent.
pub async fn start(
    cfg: SimConfig,
    tokenizer: SharedCounter,
    listener: TcpListener,
) -> anyhow::Result<SimHandle> {
    cfg.engine.validate().map_err(anyhow::Error::msg)?;
    anyhow::ensure!(
        !cfg.served_names.is_empty(),
        "the sim needs a served model name"
    );
    if !(cfg.time_scale > 0.0 && cfg.time_scale.is_finite()) {
        anyhow::bail!(
            "time_scale must be a positive number, got {}",
            cfg.time_scale
        );
    }
    let addr = listener.local_addr()?;
    let metrics = Arc::new(metrics::SimMetrics::of_engine(&cfg.engine));
    let engine = Engine::new(cfg.engine.clone(), cfg.timing.clone());
    let time_scale = cfg.time_scale;
    let (handle, engine_task) =
        shell::spawn(engine, shell::SimClock::start(time_scale), metrics.clone());
    let shared = Arc::new(http::Shared::new(cfg, tokenizer, handle, metrics));
    let (stop, stopped) = watch::channel(false);
    let server = tokio::spawn(accept_loop(listener, shared.clone(), stopped));
    Ok(SimHandle {
        addr,
        shared,
        stop,
        server: Some(server),
        engine: engine_task,
    })
}

async fn accept_loop(
    listener: TcpListener,
    shared: Arc<http::Shared>,
    mut stopped: watch::Receiver<bool>,
) {
    // Dropping the set at the end aborts every connection still open.
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            _ = stopped.changed() => return,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                // Tokens go out one small SSE chunk at a time: Nagle's algorithm would hold each
                // for the peer's delayed ACK (~40 ms), far above a decode step.
                let _ = stream.set_nodelay(true);
                let shared = shared.clone();
                connections.spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let shared = shared.clone();
                        async move { Ok::<_, std::convert::Infallible>(http::handle(shared, req).await) }
                    });
                    // A connection error (a client that went away) ends only that connection.
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        }
    }
}

#[cfg(test)]
mod tests;
