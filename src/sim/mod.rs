//! Room `sim`: the simulated MindIE / vLLM backend (`tokengate sim`). A continuous-batching engine
//! whose pass durations come from the capacity model ([`timing::Roofline`]) or a fixed pace
//! ([`timing::Pace`], fast and deterministic, for the gateway's integration tests), served over
//! HTTP with vLLM's and MindIE's APIs and vLLM's metric names.
//!
//! Layout: [`engine`] is the pure scheduler core; [`shell`] drives it on scaled tokio time;
//! [`http`] and [`wire`] are the HTTP face ([`pooled`] its pooling routes); [`text`] counts prompts and makes output text;
//! [`cli`] is `tokengate sim`.

pub mod cli;
pub mod engine;
pub mod http;
pub mod metrics;
pub mod pooled;
pub mod prefix;
pub mod shell;
pub mod text;
pub mod timing;
pub mod wire;

use engine::{Engine, EngineConfig, EngineSnapshot, KvGeometry};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use text::SharedCounter;
use timing::{Pace, Roofline, StepTiming};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

/// Failures the simulated backend injects on purpose, for the gateway's tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Faults {
    /// Cut the connection after this many tokens of a generation (streamed or not).
    pub fail_after_tokens: Option<u64>,
    /// Answer every generation request with this status and an OpenAI error body.
    pub status: Option<u16>,
    /// With `status`: the `retry-after` of those answers (whole seconds, rounded up).
    pub retry_after: Option<Duration>,
}

/// Everything a simulated backend needs. `Default` is the fast fixed-pace mode (1 ms per pass,
/// a cache that never fills) suited to tests.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Served model names (vLLM `--served-model-name`): requests may name any of them; the
    /// first is the one answers carry.
    pub served_names: Vec<String>,
    /// Scheduler settings.
    pub engine: EngineConfig,
    /// Pass durations.
    pub timing: Arc<dyn StepTiming>,
    /// Simulated seconds per real second.
    pub time_scale: f64,
    /// Seed of the output lengths drawn when `ignore_eos` is off.
    pub seed: u64,
    /// Mean of those output lengths.
    pub mean_output_tokens: f64,
    /// Injected failures at start (changeable later through [`SimHandle::set_faults`]).
    pub faults: Faults,
    /// vLLM's `--reasoning-parser qwen3`: a chat that thinks (`enable_thinking` not false)
    /// sends the first half of its output (rounded up) as `reasoning`, the rest as `content`.
    pub reasoning_parser: bool,
    /// vLLM's `--enable-prompt-tokens-details`: usage carries
    /// `prompt_tokens_details.cached_tokens` from a prefix cache ([`prefix`]).
    pub prompt_tokens_details: bool,
}

/// The served model names by default: the capacity profile's name, then the Hugging Face
/// repository's (the gateway's example configs forward the first).
pub const DEFAULT_SERVED_NAMES: [&str; 2] = ["qwen3.5-27b", "Qwen/Qwen3.5-27B"];

/// The model name clients send by default.
pub const DEFAULT_MODEL: &str = DEFAULT_SERVED_NAMES[0];

impl SimConfig {
    /// The fixed-pace engine: every pass (a prefill or one token for every running request)
    /// takes `pace`, and the cache never fills.
    pub fn pace(pace: Duration) -> Self {
        Self {
            served_names: DEFAULT_SERVED_NAMES.map(String::from).to_vec(),
            engine: EngineConfig {
                max_batch: 1024,
                max_prefill_tokens: u64::MAX,
                ..EngineConfig::mindie(KvGeometry::unlimited())
            },
            timing: Arc::new(Pace(pace)),
            time_scale: 1.0,
            seed: 0,
            mean_output_tokens: 150.0,
            faults: Faults::default(),
            reasoning_parser: false,
            prompt_tokens_details: false,
        }
    }

    /// The physics engine on `roofline`'s deployment: its cache budget in blocks, MindIE's
    /// default batch (200) and prefill budget (8,192 tokens), 65,536-token contexts.
    pub fn roofline(roofline: Roofline) -> Self {
        Self {
            engine: EngineConfig::mindie(KvGeometry::of_deployment(&roofline.0)),
            timing: Arc::new(roofline),
            ..Self::pace(Duration::ZERO)
        }
    }

    /// The physics engine on one 910B3 running Qwen3.5-27B (8e9 bytes of cache).
    pub fn roofline_910b3() -> Self {
        Self::roofline(Roofline::qwen35_27b_on_910b3())
    }
}

impl Default for SimConfig {
    fn default() -> Self {
        Self::pace(Duration::from_millis(1))
    }
}

/// What a simulated backend has seen, for tests and the bench.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SimStats {
    /// Generation requests received (also those answered with an error).
    pub requests: u64,
    /// Prompt tokens of the requests sent to the engine.
    pub prompt_tokens: u64,
    /// Tokens the engine generated.
    pub generated_tokens: u64,
    /// `max_tokens` (`max_new_tokens`) of each generation request as received, in order.
    pub max_tokens: Vec<Option<u64>>,
    /// The engine's gauges and preemption count.
    pub engine: EngineSnapshot,
}

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
