//! The TOML configuration: schema, defaults and validation. Parsing is strict
//! (`deny_unknown_fields`), units are in the field names, and [`Config::load`] is the one
//! validation path used by `serve` and `check-config` alike. Relative paths are resolved
//! against the directory of the config file.
//!
//! What the rest of the gateway receives is a [`ValidConfig`]: made only by the checks, read-only,
//! and holding what they parsed (backend addresses, key digests), so no code that takes one meets
//! a value the checks refuse or parses anything again.
//!
//! | file | job |
//! |---|---|
//! | `mod.rs` | the schema and its defaults; [`Config::load`], [`Config::parse`], [`Config::validated`] |
//! | `derive.rs` | what the capacity model derives (backends' sizing, tenants' rates), kept beside what the file gives |
//! | `validate.rs` | the cross-field checks, relative paths |
//! | `restart.rs` | which settings only a restart applies ([`Config::restart_only_changes`]) |
//! | `describe.rs` | the human summary of a config ([`describe::describe`]) |
//! | `profile.rs` | `[profile]`, the workload profile's window |
//! | `otel.rs` | `[otel]`, the OpenTelemetry receiver and the export's bounds (what `crate::otel` exports with) |

mod derive;
pub mod describe;
mod otel;
pub mod profile;
mod restart;
mod validate;

use crate::admission::{ClassShares, KvGeometry, Priority};
use crate::capacity::{DerivedBackend, ProfileOverrides, StateDtype, WeightPrecision};
use crate::digest::{hash_key, parse_sha256_hex};
use crate::limiter::config::LimiterConfig;
use crate::tls::BackendTls;
use crate::vision::{VisionConfig, VisionRules};
use anyhow::{bail, Context};
use http::uri::{Authority, Scheme};
pub use otel::OtelConfig;
use profile::ProfileConfig;
use serde::Deserialize;
use std::net::SocketAddr;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The whole configuration file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Listeners and HTTP limits.
    #[serde(default)]
    pub server: ServerConfig,
    /// Tokenizer and chat template.
    pub tokenizer: TokenizerConfig,
    /// The model served behind the gateway.
    pub model: ModelConfig,
    /// The KV admission queue.
    #[serde(default)]
    pub admission: AdmissionConfig,
    /// The average request the capacity-model sizing is done for.
    #[serde(default)]
    pub workload: WorkloadConfig,
    /// Where the tenants' buckets live (this process, or Redis shared by replicas).
    #[serde(default)]
    pub limiter: LimiterConfig,
    /// The workload profile (`GET /admin/profile`).
    #[serde(default)]
    pub profile: ProfileConfig,
    /// The usage log (the billing record): off unless the section is given.
    #[serde(default)]
    pub usage_log: Option<crate::usage_log::UsageLogConfig>,
    /// OpenTelemetry traces and metrics over OTLP: off unless the section is given.
    #[serde(default)]
    pub otel: Option<OtelConfig>,
    /// Where tenants' quota spend is kept (`[quotas]`).
    #[serde(default)]
    pub quotas: crate::quota::config::QuotaStoreConfig,
    /// Whether tenants share the engine's prefix cache (`[prefix_cache]`; each tenant may
    /// set its own).
    #[serde(default)]
    pub prefix_cache: crate::cache_salt::PrefixCacheConfig,
    /// Prices per million tokens by model name (`[prices."MODEL"]`), for cost quotas and the
    /// usage log's cost.
    #[serde(default)]
    pub prices: std::collections::BTreeMap<String, crate::quota::config::PriceConfig>,
    /// Inference backends (vLLM, MindIE, `tokengate sim`).
    pub backends: Vec<BackendConfig>,
    /// Tenants and their budgets.
    pub tenants: Vec<TenantConfig>,
    /// Images and video: accepted or not, and how they are counted.
    #[serde(default)]
    pub vision: VisionConfig,
    /// The rules `vision` resolves to (its processor files read), set by [`Config::validated`].
    #[serde(skip)]
    pub vision_rules: VisionRules,
    /// The file it was read from ([`Config::load`]; `None` for text given to
    /// [`Config::parse`]): a reload reads it again.
    #[serde(skip)]
    pub file: Option<PathBuf>,
}

/// The declared average request used to derive batch ceilings and token rates.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadConfig {
    /// Average prompt tokens (default: a RAG request's 3000).
    #[serde(default = "default_avg_input")]
    pub avg_input_tokens: u64,
    /// Average output tokens (default 800).
    #[serde(default = "default_avg_output")]
    pub avg_output_tokens: u64,
}

impl Default for WorkloadConfig {
    fn default() -> Self {
        Self {
            avg_input_tokens: default_avg_input(),
            avg_output_tokens: default_avg_output(),
        }
    }
}

fn default_avg_input() -> u64 {
    3000
}
fn default_avg_output() -> u64 {
    800
}

/// Listeners and HTTP limits.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// Main (API) listener.
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// Admin listener: metrics, health, admin API.
    #[serde(default = "default_admin_listen")]
    pub admin_listen: SocketAddr,
    /// Largest accepted request body.
    #[serde(default = "default_max_body_bytes")]
    pub max_body_bytes: u64,
    /// Most JSON objects, arrays and strings (keys included) a request body may hold; numbers,
    /// booleans and nulls are not counted, so a prompt of token ids is one array. What the
    /// gateway does with a body (convert, check, render, count) grows with its items, not its
    /// bytes: a body of a hundred thousand tiny blocks costs far more than one long text.
    #[serde(default = "default_max_json_items")]
    pub max_json_items: u64,
    /// Time from a connection's accept to its first complete request head (the protocol
    /// sniff and HTTP/2's preface included); a connection without one is closed.
    #[serde(default = "default_header_timeout", with = "humantime_serde")]
    pub header_read_timeout: Duration,
    /// Time a kept-alive connection may stay open with no request in flight (the wait for its
    /// next request's head and the head itself) before it is closed; HTTP/2 gets a GOAWAY.
    #[serde(default = "default_idle_timeout", with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// Time a client may accept no bytes of what is written to it (its receive buffer full)
    /// before its connection is dropped: its requests end and settle as on a disconnect.
    #[serde(default = "default_client_write_timeout", with = "humantime_serde")]
    pub client_write_timeout: Duration,
    /// Time allowed to receive a request's body.
    #[serde(default = "default_body_timeout", with = "humantime_serde")]
    pub body_read_timeout: Duration,
    /// Bytes per second of request bodies a tenant may have read to no purpose (drained after
    /// a refusal, or read and then refused); its budget holds four bodies of `max_body_bytes`,
    /// and past it the tenant's bodies are read at this pace (`crate::body::discard`).
    #[serde(default = "default_refused_body_bytes_per_second")]
    pub refused_body_bytes_per_second: u64,
    /// On SIGTERM / ctrl-c, how long in-flight streams may run before they are cut.
    #[serde(default = "default_shutdown_grace", with = "humantime_serde")]
    pub shutdown_grace: Duration,
    /// Client connections the main listener serves at once; at the cap it stops accepting
    /// until one closes (they wait in the kernel's backlog).
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Threads that serve the main listener, each an event loop of its own with its own
    /// connections to the backends (see `crate::server`). Default: one per core this process
    /// may use.
    #[serde(default)]
    pub workers: Option<usize>,
    /// Bearer token the admin listener requires on every path but `/healthz` and `/readyz`.
    /// Required when `admin_listen` is not a loopback address.
    #[serde(default)]
    pub admin_token: Option<String>,
    /// The admin token stored as lowercase sha256 hex instead (as `api_key_sha256`).
    #[serde(default)]
    pub admin_token_sha256: Option<String>,
}

impl ServerConfig {
    /// The threads that serve the main listener: `workers`, or one per core this process may
    /// use (its CPU affinity and cgroup quota counted).
    pub fn workers(&self) -> usize {
        self.workers.unwrap_or_else(|| {
            std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
        })
    }

    /// Checks the section; the sha256 of the admin token, when one is set.
    fn check(&self) -> anyhow::Result<Option<[u8; 32]>> {
        if self.listen == self.admin_listen && self.listen.port() != 0 {
            bail!("server.admin_listen must differ from server.listen");
        }
        if self.max_body_bytes == 0 {
            bail!("server.max_body_bytes must be at least 1");
        }
        if self.max_json_items == 0 {
            bail!("server.max_json_items must be at least 1");
        }
        if self.refused_body_bytes_per_second == 0 {
            bail!("server.refused_body_bytes_per_second must be at least 1");
        }
        if self.max_connections == 0 {
            bail!("server.max_connections must be at least 1");
        }
        if self.workers == Some(0) {
            bail!("server.workers must be at least 1");
        }
        for (field, t) in [
            ("header_read_timeout", self.header_read_timeout),
            ("idle_timeout", self.idle_timeout),
            ("client_write_timeout", self.client_write_timeout),
        ] {
            if t.is_zero() {
                bail!("server.{field} must be positive");
            }
        }
        match (&self.admin_token, &self.admin_token_sha256) {
            (Some(_), Some(_)) => bail!("server: give admin_token or admin_token_sha256, not both"),
            (Some(token), None) if token.is_empty() => {
                bail!("server.admin_token must not be empty")
            }
            (Some(token), None) => Ok(Some(hash_key(token))),
            (None, Some(h)) => match parse_sha256_hex(h) {
                Some(digest) => Ok(Some(digest)),
                None => bail!("server.admin_token_sha256: `{h}` is not 64 hex digits"),
            },
            (None, None) if !self.admin_listen.ip().is_loopback() => bail!(
                "server.admin_listen {} is not a loopback address: set server.admin_token (or admin_token_sha256), or anyone who reaches it can read every tenant's budget and the metrics",
                self.admin_listen
            ),
            (None, None) => Ok(None),
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: default_listen(),
            admin_listen: default_admin_listen(),
            max_body_bytes: default_max_body_bytes(),
            max_json_items: default_max_json_items(),
            header_read_timeout: default_header_timeout(),
            idle_timeout: default_idle_timeout(),
            client_write_timeout: default_client_write_timeout(),
            body_read_timeout: default_body_timeout(),
            refused_body_bytes_per_second: default_refused_body_bytes_per_second(),
            shutdown_grace: default_shutdown_grace(),
            max_connections: default_max_connections(),
            workers: None,
            admin_token: None,
            admin_token_sha256: None,
        }
    }
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8080))
}
fn default_admin_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8081))
}
fn default_max_body_bytes() -> u64 {
    4 * 1024 * 1024
}
/// A conversation of thousands of turns with content parts, tools with their schemas, and a
/// few thousand documents is well under it; 120,000 Anthropic blocks (600,000 items) are not.
fn default_max_json_items() -> u64 {
    65_536
}
fn default_header_timeout() -> Duration {
    Duration::from_secs(10)
}
/// nginx's `keepalive_timeout`: above the 60 s that load balancers (AWS ALB's idle timeout,
/// ingress-nginx's upstream keep-alive) keep a connection to their targets open between
/// requests, so the gateway is not the side that closes first and races the balancer's next
/// request on a connection it is closing.
fn default_idle_timeout() -> Duration {
    Duration::from_secs(75)
}
/// nginx's `send_timeout` is 60 s; half of it still leaves a client that reads every few
/// seconds (a slow link, a paused UI) untouched, and frees a lease held for nobody in half the
/// time.
fn default_client_write_timeout() -> Duration {
    Duration::from_secs(30)
}
fn default_body_timeout() -> Duration {
    Duration::from_secs(30)
}
/// Two bodies of the default size limit a second: a client that overruns the context now and
/// then never notices; a flood costs the gateway a few percent of a core.
fn default_refused_body_bytes_per_second() -> u64 {
    8 * 1024 * 1024
}
fn default_shutdown_grace() -> Duration {
    Duration::from_secs(30)
}
fn default_max_connections() -> usize {
    4096
}

/// Tokenizer and chat template.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenizerConfig {
    /// HuggingFace `tokenizer.json` (the model directory's own, or one made by
    /// `tokengate tokenizer import`).
    pub path: PathBuf,
    /// A Jinja chat template file; without it the built-in Qwen3.5 renderer is used.
    #[serde(default)]
    pub chat_template: Option<PathBuf>,
    /// Blocking worker threads that tokenize.
    #[serde(default = "default_workers")]
    pub workers: usize,
    /// Jobs that may wait for a worker, all tenants together; beyond it, and beyond a tenant's
    /// share of it while others wait, requests get 503 `overloaded`.
    #[serde(default = "default_queue_depth")]
    pub queue_depth: usize,
    /// Bytes of the per-turn count memo (each turn's text plus a fixed overhead).
    #[serde(default = "default_cache_bytes")]
    pub cache_bytes: u64,
}

fn default_workers() -> usize {
    2
}
fn default_queue_depth() -> usize {
    256
}
fn default_cache_bytes() -> u64 {
    64 * 1024 * 1024
}

/// The model served behind the gateway.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// Model names clients may ask for. The first is the name the backends serve (vLLM
    /// `--served-model-name`, MindIE `modelName`): requests are forwarded with it.
    pub served_names: Vec<String>,
    /// Context length of the backend (prompt + output).
    pub max_model_len: u64,
    /// Output tokens reserved when a client sends no `max_tokens`.
    pub default_max_tokens: u64,
    /// KV block size of the engine (MindIE `cacheBlockSize`, vLLM `block_size`).
    #[serde(default = "default_block_tokens")]
    pub block_tokens: u64,
    /// KV bytes per token (Qwen3.5-27B: 16 layers x 2 x 4 heads x 256 x 2 B = 65,536).
    #[serde(default = "default_kv_bytes_per_token")]
    pub kv_bytes_per_token: u64,
    /// Fixed state per running sequence (Qwen3.5-27B DeltaNet, fp32: 153,944,064 B).
    #[serde(default = "default_state_bytes")]
    pub state_bytes_per_sequence: u64,
    /// Whether the backends cache prefixes (vLLM's prefix caching, on by default since V1;
    /// MindIE's prefix cache), so that the `n` choices of one prompt share its whole blocks.
    /// Off, each choice is reserved the whole prompt.
    #[serde(default)]
    pub prefix_caching: bool,
}

impl From<&ModelConfig> for KvGeometry {
    /// The model's geometry as configured (`model.block_tokens`, `kv_bytes_per_token`,
    /// `state_bytes_per_sequence`, `prefix_caching`).
    fn from(m: &ModelConfig) -> Self {
        Self {
            block_tokens: m.block_tokens,
            kv_bytes_per_token: m.kv_bytes_per_token,
            state_bytes_per_sequence: m.state_bytes_per_sequence,
            shared_prompt_blocks: m.prefix_caching,
            lookahead_tokens: 0,
        }
    }
}

/// The KV admission queue.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdmissionConfig {
    /// Requests that may wait for KV space at once (all tenants).
    #[serde(default = "default_queue_max_waiting")]
    pub queue_max_waiting: usize,
    /// How long a request may wait for KV space before a 503.
    #[serde(default = "default_queue_deadline", with = "humantime_serde")]
    pub queue_deadline: Duration,
    /// The most of each backend's KV capacity and batch that `standard` requests may hold
    /// together, in (0, 1]; what they may not take stays free for `critical` ones.
    #[serde(default = "default_standard_share")]
    pub standard_share: f64,
    /// The same for `sheddable` requests: by default half, so that a sheddable flood leaves
    /// room for the classes above it to start at once.
    #[serde(default = "default_sheddable_share")]
    pub sheddable_share: f64,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        Self {
            queue_max_waiting: default_queue_max_waiting(),
            queue_deadline: default_queue_deadline(),
            standard_share: default_standard_share(),
            sheddable_share: default_sheddable_share(),
        }
    }
}

impl AdmissionConfig {
    /// The class shares in per mille, as the ledger takes them.
    pub fn class_shares(&self) -> ClassShares {
        let permille = |share: f64| (share * 1000.0).round() as u32;
        ClassShares::new(
            permille(self.standard_share),
            permille(self.sheddable_share),
        )
    }
}

fn default_standard_share() -> f64 {
    1.0
}
fn default_sheddable_share() -> f64 {
    0.5
}

fn default_queue_max_waiting() -> usize {
    256
}
fn default_queue_deadline() -> Duration {
    Duration::from_secs(10)
}

/// Where a backend's KV geometry, capacity and batch cap come from (`backends[].kv`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KvSource {
    /// `[model]`'s geometry, and `kv_capacity_bytes` / `max_batch` as given or as the
    /// capacity model derives them.
    #[default]
    Configured,
    /// Learned from the engine itself, at start and at every reading of its metrics: its page
    /// size in tokens and bytes, its pages, the state pages a sequence holds, its speculative
    /// lookahead, its batch cap and context length (docs/capacity.md).
    Engine,
}

impl KvSource {
    /// Its name in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            KvSource::Configured => "configured",
            KvSource::Engine => "engine",
        }
    }
}

/// What a backend runs (`backends[].runner`), as vLLM's `--runner` says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Runner {
    /// Generation: chat, completions, the Responses and Messages APIs, MindIE's routes.
    #[default]
    Generate,
    /// A pooling model: embeddings, pooling, score and rerank.
    Pooling,
}

impl Runner {
    /// Its name in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            Runner::Generate => "generate",
            Runner::Pooling => "pooling",
        }
    }
}

/// One inference backend.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendConfig {
    /// Base URL, e.g. `http://127.0.0.1:9000`, or `https://...` with `tls`.
    pub url: String,
    /// What it serves: `generate` (the default; every generation route) or `pooling` (a
    /// pooling model, vLLM's `--runner pooling`: `/v1/embeddings`, `/pooling`, `/score`,
    /// `/rerank`). Each kind is admitted on its own backends, in its own queue.
    #[serde(default)]
    pub runner: Runner,
    /// Where its KV geometry, capacity and batch cap come from: `configured` (the default) or
    /// `engine` (learned from the engine: `[model]`'s geometry keys, `kv_capacity_bytes` and
    /// `max_batch` are then not needed, and `max_batch`, when given, only lowers the engine's).
    #[serde(default)]
    pub kv: KvSource,
    /// The vLLM it runs, as `vllm --version` prints it (`"0.32.0"`): where vLLM's versions
    /// handle a request differently, the gateway does as this one does
    /// ([`crate::feedback::version`]). Left out, the version its engine says when its scrape
    /// loop reads it; until then, or when none is said (MindIE, the sim), the behaviour of the
    /// versions before 0.32.
    #[serde(default)]
    pub vllm_version: Option<crate::feedback::version::VllmVersion>,
    /// TLS for an `https` URL: the CA that signed the backend's certificate, and the
    /// gateway's own certificate for backends that verify their clients (MindIE does).
    #[serde(default)]
    pub tls: Option<BackendTls>,
    /// Bytes of KV cache the backend has for sequences (KV plus per-sequence state), as the
    /// file gives it; derived from `hardware` + `model` when left out (the one in force:
    /// [`BackendConfig::kv_capacity_bytes`]).
    #[serde(default)]
    pub kv_capacity_bytes: Option<u64>,
    /// Most sequences the backend runs at once, as the file gives it; derived (the safe batch
    /// ceiling for the declared workload) when left out (the one in force:
    /// [`BackendConfig::max_batch`]).
    #[serde(default)]
    pub max_batch: Option<u32>,
    /// Capacity-model sizing: hardware profile (`910b3`, `910b4`, ...; see `tokengate capacity`).
    #[serde(default)]
    pub hardware: Option<String>,
    /// Capacity-model sizing: model profile (`qwen3.5-27b`, `qwen3-32b`, ...).
    #[serde(default)]
    pub model: Option<String>,
    /// Capacity-model sizing: precision of the weights (`bf16`, or `w8a8`: vLLM-ascend's
    /// `--quantization ascend` checkpoints).
    #[serde(default)]
    pub weights: WeightPrecision,
    /// Capacity-model sizing: draft tokens per step of the engine's speculative decoding (vLLM
    /// `num_speculative_tokens`, MTP); 0 = none.
    #[serde(default)]
    pub speculative_tokens: u32,
    /// Capacity-model sizing: mean fraction of the draft tokens accepted (needs
    /// `speculative_tokens`; default 0.7, unverified: docs/capacity.md).
    #[serde(default)]
    pub acceptance: Option<f64>,
    /// Cards one model replica is split over (tensor parallelism).
    #[serde(default = "one")]
    pub tp: u32,
    /// Model replicas behind this URL.
    #[serde(default = "one")]
    pub replicas: u32,
    /// One achieved fraction of peak for every kind of work (1 = the pure roofline); default:
    /// the fitted efficiency (docs/capacity.md).
    #[serde(default)]
    pub efficiency: Option<f64>,
    /// Measured fraction of peak bandwidth streaming the weights (`tokengate capacity
    /// --observed-tpot-ms` reports it).
    #[serde(default)]
    pub weight_efficiency: Option<f64>,
    /// Measured fraction of peak bandwidth reading KV and state.
    #[serde(default)]
    pub cache_efficiency: Option<f64>,
    /// Measured fraction of peak FLOPS.
    #[serde(default)]
    pub compute_efficiency: Option<f64>,
    /// TPOT target the SLA batch ceiling is computed for.
    #[serde(default)]
    pub tpot_slo_ms: Option<f64>,
    /// Precision of the DeltaNet state (`fp32` or `bf16`).
    #[serde(default)]
    pub state_dtype: StateDtype,
    /// The engine's own batch limit (MindIE `maxBatchSize`, vLLM `--max-num-seqs`).
    #[serde(default)]
    pub engine_max_batch: Option<u64>,
    /// Figures that replace the named profiles' (`tflops`, `bandwidth_gbs`, `hbm_gb`, ...).
    #[serde(default)]
    pub overrides: ProfileOverrides,
    /// What the capacity model derives for the backend (`hardware` + `model`), whether or not
    /// `kv_capacity_bytes` and `max_batch` are given by hand.
    #[serde(skip)]
    pub derived: Option<DerivedBackend>,
    /// Path answered by a ready backend on its `url` (`/health` for vLLM and the sim,
    /// `/v1/models` for MindIE, whose own health paths are on its management port).
    #[serde(default = "default_health_path")]
    pub health_path: String,
    /// TCP connect timeout.
    #[serde(default = "default_connect_timeout", with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Time until the backend's response headers arrive, and for a stream its first chunk.
    #[serde(default = "default_first_byte_timeout", with = "humantime_serde")]
    pub first_byte_timeout: Duration,
    /// Longest silence between two chunks of a streamed answer; past it the stream ends with
    /// an `upstream_timeout` error event and the request is settled.
    #[serde(default = "default_stream_idle_timeout", with = "humantime_serde")]
    pub stream_idle_timeout: Duration,
    /// Time for a whole non-streamed body (an answer, an error, `/v1/models`) once its
    /// headers arrived; past it the request gets a 504.
    #[serde(default = "default_body_read_timeout", with = "humantime_serde")]
    pub body_read_timeout: Duration,
    /// Largest non-streamed answer read from the backend; a larger one is a 502.
    #[serde(default = "default_max_response_bytes")]
    pub max_response_bytes: u64,
    /// Largest single event of a streamed answer; a larger one ends the stream with an
    /// `upstream_error` event.
    #[serde(default = "default_max_event_bytes")]
    pub max_event_bytes: u64,
    /// Time the health check (`/readyz`) waits for `health_path` to answer.
    #[serde(default = "default_health_timeout", with = "humantime_serde")]
    pub health_timeout: Duration,
    /// Reading the backend's own metrics and adjusting its ledger from them.
    #[serde(default)]
    pub feedback: crate::feedback::FeedbackConfig,
}

impl BackendConfig {
    /// The KV budget in force: `kv_capacity_bytes` as given, else the capacity model's (0
    /// with neither, which the checks refuse).
    pub fn kv_capacity_bytes(&self) -> u64 {
        (self.kv_capacity_bytes)
            .or_else(|| self.derived.as_ref().map(|d| d.kv_capacity_bytes))
            .unwrap_or(0)
    }

    /// Where its KV capacity and its batch cap come from: the file, the capacity model, or
    /// the engine (with `kv = "engine"`, a `max_batch` given only lowers the engine's).
    pub fn capacity_sources(&self) -> (Source, Source) {
        match self.kv {
            KvSource::Engine => (Source::Engine, Source::Engine),
            KvSource::Configured => (
                Source::of(&self.kv_capacity_bytes),
                Source::of(&self.max_batch),
            ),
        }
    }

    /// The batch cap in force: `max_batch` as given, else the capacity model's safe batch (0
    /// with neither, which the checks refuse).
    pub fn max_batch(&self) -> u32 {
        (self.max_batch)
            .or_else(|| {
                (self.derived.as_ref()).map(|d| u32::try_from(d.max_batch).unwrap_or(u32::MAX))
            })
            .unwrap_or(0)
    }
}

/// Where a value in force comes from: the config file, the capacity model (a backend's
/// `hardware` + `model`, a tenant's `share`), or the engine itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// Given in the file.
    Configured,
    /// Left out of the file and derived.
    Derived,
    /// Learned from the engine (`kv = "engine"`).
    Engine,
}

impl Source {
    /// `Configured` when the file gave the value (`given` is `Some`).
    pub fn of<T>(given: &Option<T>) -> Source {
        match given {
            Some(_) => Source::Configured,
            None => Source::Derived,
        }
    }
}

fn one() -> u32 {
    1
}
fn default_block_tokens() -> u64 {
    128
}
fn default_kv_bytes_per_token() -> u64 {
    65_536
}
fn default_state_bytes() -> u64 {
    153_944_064
}
fn default_health_path() -> String {
    "/health".to_string()
}
fn default_connect_timeout() -> Duration {
    Duration::from_secs(2)
}
fn default_first_byte_timeout() -> Duration {
    Duration::from_secs(120)
}
fn default_stream_idle_timeout() -> Duration {
    Duration::from_secs(60)
}
fn default_body_read_timeout() -> Duration {
    Duration::from_secs(30)
}
/// A 32K-token answer with `top_logprobs = 20` is about 1.5 KB of JSON per token (48 MB).
fn default_max_response_bytes() -> u64 {
    64 << 20
}
/// One token with 20 top logprobs is about 2 KB; a tool call's whole arguments in one event
/// (engines that do not stream them) fit many times over.
fn default_max_event_bytes() -> u64 {
    1 << 20
}
/// Under Kubernetes' default probe timeout of 1 s, so `/readyz` answers before its prober
/// gives up.
fn default_health_timeout() -> Duration {
    Duration::from_millis(500)
}

/// A tenant: who it is and its budget.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    /// Name used in metrics, logs and the admin API.
    pub name: String,
    /// API keys in clear (fine for local setups).
    #[serde(default)]
    pub api_keys: Vec<String>,
    /// API keys stored as lowercase sha256 hex of the key.
    #[serde(default)]
    pub api_key_sha256: Vec<String>,
    /// Prompt (prefill) tokens per second, as the file gives it (or derived from `share`; the
    /// rates in force: [`TenantConfig::rates`]).
    #[serde(default)]
    pub prefill_tokens_per_second: Option<f64>,
    /// Output (decode) tokens per second, charged at max_tokens and refunded when unused, as
    /// the file gives it (or derived from `share`).
    #[serde(default)]
    pub decode_tokens_per_second: Option<f64>,
    /// Requests per second, as the file gives it (derived from `share` of the sustainable
    /// request rate if left out).
    #[serde(default)]
    pub requests_per_second: Option<f64>,
    /// Instead of rates: this share of the backends' sustainable prefill and decode token rates
    /// at the safe batch for the declared `[workload]` (needs capacity-model backends).
    #[serde(default)]
    pub share: Option<f64>,
    /// What `share` derives, all three rates, whether or not `requests_per_second` is given.
    #[serde(skip)]
    pub derived: Option<TenantRates>,
    /// Bucket capacity in seconds of rate (capacity = rate x burst).
    #[serde(default = "default_burst_seconds")]
    pub burst_seconds: f64,
    /// Priority class in the KV queue (`critical`, `standard`, `sheddable`); a request may
    /// lower its own with the `x-tokengate-priority` header.
    #[serde(default)]
    pub priority: Priority,
    /// Most of this tenant's requests in flight at once (charged and not yet settled: queued
    /// for KV or running); one more is refused with 429 `concurrency_exceeded`. None: no cap.
    #[serde(default)]
    pub max_inflight: Option<u32>,
    /// Most places in the KV queue this tenant may hold at once (0: its requests never wait);
    /// one more that would wait is refused with 429 `concurrency_exceeded`. None: only
    /// `admission.queue_max_waiting` bounds it.
    #[serde(default)]
    pub max_queued: Option<u32>,
    /// `shared` or `tenant`: whether this tenant's prompts share the engine's prefix cache
    /// with other tenants' (`tenant`: a `cache_salt` of its own on every request); None:
    /// `prefix_cache.isolation`.
    #[serde(default)]
    pub prefix_cache: Option<crate::cache_salt::CacheIsolation>,
    /// Budgets over windows (`[[tenants.quotas]]`): each a window and its limits.
    #[serde(default)]
    pub quotas: Vec<crate::quota::config::QuotaConfig>,
    /// `quotas` as meters, made by validation.
    #[serde(skip)]
    pub quota_meters: std::sync::Arc<crate::quota::config::TenantQuotas>,
}

fn default_burst_seconds() -> f64 {
    10.0
}

/// A tenant's three bucket rates.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct TenantRates {
    /// Prompt tokens per second.
    pub prefill_tokens_per_second: f64,
    /// Output tokens per second.
    pub decode_tokens_per_second: f64,
    /// Requests per second.
    pub requests_per_second: f64,
}

impl TenantConfig {
    /// The rates in force: each as given, else as `share` derives it (0 with neither, which
    /// the checks refuse).
    pub fn rates(&self) -> TenantRates {
        let derived = self.derived.unwrap_or_default();
        TenantRates {
            prefill_tokens_per_second: (self.prefill_tokens_per_second)
                .unwrap_or(derived.prefill_tokens_per_second),
            decode_tokens_per_second: (self.decode_tokens_per_second)
                .unwrap_or(derived.decode_tokens_per_second),
            requests_per_second: self
                .requests_per_second
                .unwrap_or(derived.requests_per_second),
        }
    }
}

/// A [`Config`] that passed every check, with what the checks parsed. Only [`Config::load`],
/// [`Config::parse`] and [`Config::validated`] make one; it reads as the `Config` it holds but
/// cannot be changed (change [`ValidConfig::into_inner`] and validate it again).
#[derive(Debug, Clone)]
pub struct ValidConfig {
    config: Config,
    backend_bases: Vec<BackendBase>,
    key_digests: Vec<Vec<[u8; 32]>>,
    admin_token_digest: Option<[u8; 32]>,
}

/// Where a backend is reached: the scheme (`http` or `https`) and authority of its `url`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendBase {
    /// `http`, or `https` with the backend's `tls` set.
    pub scheme: Scheme,
    /// `HOST:PORT`.
    pub authority: Authority,
}

impl Deref for ValidConfig {
    type Target = Config;

    fn deref(&self) -> &Config {
        &self.config
    }
}

impl ValidConfig {
    /// The config, to be changed and validated again.
    pub fn into_inner(self) -> Config {
        self.config
    }

    /// The backends in config order, each with its parsed address.
    pub fn backends_with_base(&self) -> impl Iterator<Item = (&BackendConfig, &BackendBase)> {
        self.config.backends.iter().zip(&self.backend_bases)
    }

    /// The backends that run `runner`, in config order, each with its parsed address.
    pub fn running(&self, runner: Runner) -> impl Iterator<Item = (&BackendConfig, &BackendBase)> {
        (self.backends_with_base()).filter(move |(b, _)| b.runner == runner)
    }

    /// The tenants in config order, each with the digests of all its keys (`api_keys` hashed,
    /// then `api_key_sha256` parsed).
    pub fn tenants_with_keys(&self) -> impl Iterator<Item = (&TenantConfig, &[[u8; 32]])> {
        self.config
            .tenants
            .iter()
            .zip(self.key_digests.iter().map(Vec::as_slice))
    }

    /// The sha256 of the admin token, when one is set.
    pub fn admin_token_digest(&self) -> Option<[u8; 32]> {
        self.admin_token_digest
    }
}

impl Config {
    /// Reads, parses and validates a config file; relative paths become relative to its folder.
    pub fn load(path: &Path) -> anyhow::Result<ValidConfig> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading config file {}", path.display()))?;
        let in_file = || format!("in config file {}", path.display());
        let mut cfg = Config::from_toml(&text).with_context(in_file)?;
        let base = path.parent().unwrap_or_else(|| Path::new("."));
        cfg.resolve_paths(base);
        cfg.file = Some(path.to_path_buf());
        cfg.finish().with_context(in_file)
    }

    /// Parses, sizes (capacity model) and validates config text (paths taken as written).
    pub fn parse(text: &str) -> anyhow::Result<ValidConfig> {
        Config::from_toml(text)?.finish()
    }

    fn from_toml(text: &str) -> anyhow::Result<Config> {
        toml::from_str(text).map_err(|e| anyhow::anyhow!("{e}"))
    }

    /// Sizes, then validates.
    fn finish(mut self) -> anyhow::Result<ValidConfig> {
        self.derive_capacity()?;
        self.validated()
    }

    /// Checks every cross-field rule (the message names the field) and reads the vision
    /// processor files: the config the rest of the gateway takes. The capacity model's sizing
    /// is not done again: a config from [`ValidConfig::into_inner`] keeps what it derived.
    pub fn validated(mut self) -> anyhow::Result<ValidConfig> {
        let admin_token_digest = self.server.check()?;
        self.profile.check()?;
        if let Some(log) = &self.usage_log {
            log.check()?;
        }
        if let Some(otel) = &self.otel {
            otel.check()?;
        }
        let backend_bases = self.check_model_and_backends()?;
        let key_digests = self.check_tenants()?;
        self.check_quotas()?;
        self.refuse_example_secrets(admin_token_digest.as_ref(), &key_digests)?;
        self.vision_rules = self.vision.load()?;
        Ok(ValidConfig {
            config: self,
            backend_bases,
            key_digests,
            admin_token_digest,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_usage_log_file_is_relative_to_the_config_file_and_standard_output_stays() {
        let dir = std::env::temp_dir().join(format!("tokengate-usage-path-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let load = |path: &str| {
            let file = dir.join("gw.toml");
            let text = format!("{}\n[usage_log]\npath = \"{path}\"\n", sized_text(2, ""));
            std::fs::write(&file, text).unwrap();
            let cfg = Config::load(&file).unwrap().into_inner();
            cfg.usage_log.unwrap().path
        };
        let in_dir = dir.join("usage.jsonl").to_string_lossy().into_owned();
        assert_eq!(load("usage.jsonl"), in_dir);
        assert_eq!(load(&in_dir), in_dir);
        assert_eq!(load("-"), "-");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A backend sized by the capacity model on `tp` 910B3s, with `extra` lines in its entry.
    fn sized_backend(tp: u32, extra: &str) -> anyhow::Result<ValidConfig> {
        Config::parse(&sized_text(tp, extra))
    }

    /// The text of [`sized_backend`]'s config.
    fn sized_text(tp: u32, extra: &str) -> String {
        format!(
            r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
[tokenizer]
path = "unused"
[model]
served_names = ["qwen3.5-27b"]
max_model_len = 32768
default_max_tokens = 800
[[backends]]
url = "http://127.0.0.1:9"
hardware = "910b3"
model = "qwen3.5-27b"
tp = {tp}
{extra}
[[tenants]]
name = "alice"
api_keys = ["sk-alice"]
share = 0.5
requests_per_second = 1
"#
        )
    }

    #[test]
    fn a_backend_carries_its_measured_efficiency() {
        let fitted = sized_backend(2, "").unwrap();
        assert_eq!(fitted.backends[0].max_batch(), 45);
        // what `tokengate capacity --observed-tpot-ms 60 --observed-batch 45` reports
        let measured =
            sized_backend(2, "weight_efficiency = 0.373\ncache_efficiency = 0.506").unwrap();
        let derived = measured.backends[0].derived.as_ref().unwrap();
        assert_eq!(
            derived.per_replica.efficiency,
            crate::capacity::Efficiency {
                weights: 0.373,
                cache: 0.506,
                ..crate::capacity::Efficiency::FITTED
            }
        );
        assert_eq!(measured.backends[0].max_batch(), 14);
        assert!(
            measured.tenants[0].rates().decode_tokens_per_second
                < fitted.tenants[0].rates().decode_tokens_per_second
        );
        assert_eq!(
            sized_backend(2, "weight_efficiency = 1.5")
                .unwrap_err()
                .to_string(),
            "backends[0]: invalid weight_efficiency: must be in (0, 1], got 1.5"
        );
        // one card cannot hold 50 ms with bf16 weights: refused, naming the bound and the
        // changes that fit, which do
        let err = sized_backend(1, "").unwrap_err().to_string();
        let (why, derivation) = err.split_once(". The derivation: ").unwrap();
        assert_eq!(
            why,
            "backends[0]: no batch of the declared workload (3000 + 800 tokens) is safe (bound: \
             HBM bandwidth (TPOT SLO)): one sequence takes 76.46 ms a step, over the 50 ms TPOT \
             SLO; it fits with tpot_slo_ms = 100 (safe batch 19, bound: memory capacity (KV + \
             state)) or tp = 2 (safe batch 45, bound: HBM bandwidth (TPOT SLO))"
        );
        assert!(derivation.starts_with("910b3 x1 (TP) per replica"), "{err}");
        let held = sized_backend(1, "tpot_slo_ms = 100").unwrap();
        assert_eq!(held.backends[0].max_batch(), 19);
        // the pure roofline fits 19 RAG sequences in its 8 GB
        assert_eq!(
            sized_backend(1, "efficiency = 1").unwrap().backends[0].max_batch(),
            19
        );
    }

    /// What a backend that learns its cache from the engine may not be given.
    #[test]
    fn a_backend_learning_from_its_engine_refuses_what_it_would_learn() {
        let with_backend = |url: &str, lines: &str| {
            let text = format!(
                "[tokenizer]\npath = \"t.json\"\n[model]\nserved_names = [\"m\"]\nmax_model_len = 4096\ndefault_max_tokens = 16\n\
                 [[backends]]\nurl = \"{url}\"\n{lines}\n\
                 [[tenants]]\nname = \"a\"\napi_keys = [\"sk-a\"]\n\
                 prefill_tokens_per_second = 1\ndecode_tokens_per_second = 1\nrequests_per_second = 1\n"
            );
            Config::parse(&text).map(|_| ()).map_err(|e| e.to_string())
        };
        let local = "http://127.0.0.1:9000";
        assert_eq!(with_backend(local, "kv = \"engine\""), Ok(()));
        assert_eq!(
            with_backend(local, "kv = \"engine\"\nmax_batch = 8"),
            Ok(())
        );
        assert_eq!(
            with_backend(local, "kv = \"engine\"\nkv_capacity_bytes = 1000"),
            Err("backends[0].kv_capacity_bytes is 1000, but backends[0].kv is \"engine\": the capacity is learned from the engine (its pages); leave kv_capacity_bytes out".to_string())
        );
        assert_eq!(
            with_backend(local, "kv = \"engine\"\nmax_batch = 0"),
            Err("backends[0].max_batch must be at least 1: with kv = \"engine\" it lowers the engine's own batch cap (leave it out to use the engine's)".to_string())
        );
        assert_eq!(
            with_backend("https://127.0.0.1:9000", "kv = \"engine\"\ntls = { ca_file = \"ca.pem\" }"),
            Err("backends[0].kv is \"engine\", but backends[0].url `https://127.0.0.1:9000` is https: the engine's metrics, /v1/models and /server_info are read over http; give the backend an http url, or its geometry by hand".to_string())
        );
        let unknown = with_backend(local, "kv = \"disk\"").unwrap_err();
        assert!(
            unknown.contains("unknown variant `disk`, expected `configured` or `engine`"),
            "{unknown}"
        );
    }

    /// The shipped vLLM-ascend configs learn every backend's cache from its engine.
    #[test]
    fn the_vllm_ascend_configs_learn_their_caches_from_the_engines() {
        for (file, engines) in [("vllm-ascend.toml", 1), ("vllm-ascend-dp.toml", 4)] {
            let path = format!("{}/config/{file}", env!("CARGO_MANIFEST_DIR"));
            let cfg = Config::parse(&std::fs::read_to_string(&path).unwrap()).unwrap();
            let kv: Vec<KvSource> = cfg.backends.iter().map(|b| b.kv).collect();
            assert_eq!(kv, vec![KvSource::Engine; engines], "{file}");
            let described = describe::describe(&cfg);
            assert!(
                described.contains("KV: each backend counts a sequence in its engine's own pages"),
                "{described}"
            );
        }
    }

    #[test]
    fn a_backend_sized_as_the_vllm_ascend_recipe() {
        let recipe = "weights = \"w8a8\"\nspeculative_tokens = 3\nengine_max_batch = 32";
        // [model] says one state per sequence; the engine holds one per verified token
        assert_eq!(
            sized_backend(2, recipe).unwrap_err().to_string(),
            "backends[0]: model profile `qwen3.5-27b` has 65536 KV bytes/token and 615776256 state bytes/sequence (4 states of 153944064 B: one per token a step verifies), but [model] says 65536 and 153944064: make them agree"
        );
        let four_states = |extra: &str| {
            Config::parse(&sized_text(2, extra).replace(
                "default_max_tokens = 800\n",
                "default_max_tokens = 800\nstate_bytes_per_sequence = 615776256\n",
            ))
        };
        let cfg = four_states(recipe).unwrap();
        let b = &cfg.backends[0];
        let d = b.derived.as_ref().unwrap();
        // 2 x 64 GB - 29.54 GB of W8A8 weights - 2 x 2 GB; max-num-seqs binds
        assert_eq!(
            (b.kv_capacity_bytes(), b.max_batch(), d.lookahead_tokens),
            (94_457_203_200, 32, 3)
        );
        assert_eq!(d.inputs.speculation.acceptance, 0.7);
        assert!(
            d.explanation
                .contains("qwen3.5-27b (w8a8 weights), 3 draft tokens a step at acceptance 0.7"),
            "{}",
            d.explanation
        );
        // a measured acceptance lowers the rates the shares are of
        let measured = four_states(&format!("{recipe}\nacceptance = 0.4")).unwrap();
        assert_eq!(
            measured.backends[0]
                .derived
                .as_ref()
                .unwrap()
                .inputs
                .speculation
                .acceptance,
            0.4
        );
        assert!(
            measured.tenants[0].rates().decode_tokens_per_second
                < cfg.tenants[0].rates().decode_tokens_per_second
        );
        // an engine that reports its own geometry is not held to [model]'s
        let engine = sized_backend(2, &format!("kv = \"engine\"\n{recipe}")).unwrap();
        assert_eq!(
            engine.backends[0]
                .derived
                .as_ref()
                .unwrap()
                .state_bytes_per_sequence,
            615_776_256
        );
        let err = |extra: &str| sized_backend(2, extra).unwrap_err().to_string();
        assert_eq!(
            err("acceptance = 0.5"),
            "backends[0].acceptance is the share of draft tokens kept: give speculative_tokens too"
        );
        assert_eq!(
            err("kv = \"engine\"\nspeculative_tokens = 3\nacceptance = 2"),
            "backends[0]: invalid acceptance: must be in [0, 1], got 2"
        );
        assert!(
            err("weights = \"int4\"").contains("unknown variant `int4`"),
            "{}",
            err("weights = \"int4\"")
        );
    }

    fn quickstart() -> String {
        std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/config/quickstart.toml"
        ))
        .unwrap()
    }

    /// The quickstart config with its backend sized by hand: its cache given in place of the
    /// capacity model's hardware, model and SLO.
    fn by_hand() -> String {
        let text = quickstart();
        let changed = text.replace(
            "hardware = \"910b3\"\nmodel = \"qwen3.5-27b\"\ntpot_slo_ms = 100\n",
            "kv_capacity_bytes = 8000000000\n",
        );
        assert_ne!(changed, text);
        changed
    }

    /// The quickstart config with `server` lines in place of its admin_listen line.
    fn with_admin(lines: &str) -> anyhow::Result<ValidConfig> {
        let text = quickstart();
        let changed = text.replace("admin_listen = \"127.0.0.1:8081\"", lines);
        assert_ne!(changed, text);
        Config::parse(&changed)
    }

    #[test]
    fn admin_listen_off_loopback_needs_a_token() {
        assert_eq!(
            with_admin("admin_listen = \"0.0.0.0:8081\"").unwrap_err().to_string(),
            "server.admin_listen 0.0.0.0:8081 is not a loopback address: set server.admin_token (or admin_token_sha256), or anyone who reaches it can read every tenant's budget and the metrics"
        );
        let digest = hex::encode(crate::digest::hash_key("s3cret"));
        for lines in [
            "admin_listen = \"0.0.0.0:8081\"\nadmin_token = \"s3cret\"".to_string(),
            format!("admin_listen = \"[::]:8081\"\nadmin_token_sha256 = \"{digest}\""),
        ] {
            let cfg = with_admin(&lines).unwrap();
            assert_eq!(
                cfg.admin_token_digest(),
                Some(crate::digest::hash_key("s3cret"))
            );
        }
        // Loopback (v4 or v6) needs none.
        let cfg = with_admin("admin_listen = \"[::1]:8081\"").unwrap();
        assert_eq!(cfg.admin_token_digest(), None);
    }

    #[test]
    fn the_deploy_examples_secrets_are_refused_beyond_loopback_only() {
        let example_digest = |clear| hex::encode(crate::digest::hash_key(clear));
        let admin = example_digest("example-admin-token-change-me");
        let parse = |listen: &str, admin_lines: &str, key: &str| {
            let text = quickstart()
                .replace("listen = \"127.0.0.1:8080\"", listen)
                .replace("admin_listen = \"127.0.0.1:8081\"", admin_lines)
                .replace("api_keys = [\"sk-alice\"]", key);
            Config::parse(&text).map(|_| ()).map_err(|e| e.to_string())
        };
        let loopback = (
            "listen = \"127.0.0.1:8080\"",
            "admin_listen = \"127.0.0.1:8081\"",
        );
        let open_admin =
            format!("admin_listen = \"0.0.0.0:8081\"\nadmin_token_sha256 = \"{admin}\"");
        assert_eq!(
            parse(loopback.0, &open_admin, "api_keys = [\"sk-alice\"]"),
            Err("server.admin_token_sha256 is the example `example-admin-token-change-me` shipped in deploy/k8s/base/configmap.yaml and server.admin_listen 0.0.0.0:8081 is not a loopback address: anyone who has read that file holds it; edit deploy/k8s/base/configmap.yaml to set a secret of your own".to_string())
        );
        let open_api = "listen = \"0.0.0.0:8080\"";
        let team_a = format!(
            "api_key_sha256 = [\"{}\"]",
            example_digest("sk-example-team-a-change-me")
        );
        let refused = "tenants[0] (alice).api_key_sha256 is the example `sk-example-team-a-change-me` shipped in deploy/k8s/base/secret.yaml and server.listen 0.0.0.0:8080 is not a loopback address: anyone who has read that file holds it; edit deploy/k8s/base/secret.yaml to set a secret of your own";
        assert_eq!(
            parse(open_api, loopback.1, &team_a),
            Err(refused.to_string())
        );
        // The same key in clear is refused naming its list.
        assert_eq!(
            parse(
                open_api,
                loopback.1,
                "api_keys = [\"sk-example-team-a-change-me\"]"
            ),
            Err(refused.replace(".api_key_sha256 ", ".api_keys "))
        );
        let admin_clear =
            "admin_listen = \"0.0.0.0:8081\"\nadmin_token = \"example-admin-token-change-me\"";
        assert!(parse(loopback.0, admin_clear, "api_keys = [\"sk-alice\"]")
            .unwrap_err()
            .starts_with("server.admin_token is the example `example-admin-token-change-me`"));
        // On loopback (the quickstart) the examples start, and so do keys of one's own beyond it.
        assert_eq!(parse(loopback.0, loopback.1, &team_a), Ok(()));
        assert_eq!(
            parse("listen = \"[::1]:8080\"", loopback.1, &team_a),
            Ok(())
        );
        let own = "admin_listen = \"0.0.0.0:8081\"\nadmin_token = \"a-token-of-mine\"";
        assert_eq!(parse(open_api, own, "api_keys = [\"sk-mine\"]"), Ok(()));
    }

    #[test]
    fn admin_token_forms_are_checked() {
        let err = |lines: &str| with_admin(lines).unwrap_err().to_string();
        assert_eq!(
            err("admin_listen = \"127.0.0.1:8081\"\nadmin_token = \"\""),
            "server.admin_token must not be empty"
        );
        assert_eq!(
            err("admin_listen = \"127.0.0.1:8081\"\nadmin_token_sha256 = \"abc\""),
            "server.admin_token_sha256: `abc` is not 64 hex digits"
        );
        let digest = hex::encode(crate::digest::hash_key("s3cret"));
        assert_eq!(
            err(&format!(
                "admin_listen = \"127.0.0.1:8081\"\nadmin_token = \"s3cret\"\nadmin_token_sha256 = \"{digest}\""
            )),
            "server: give admin_token or admin_token_sha256, not both"
        );
    }

    #[test]
    fn a_reload_names_each_setting_only_a_restart_applies() {
        let text = by_hand();
        let running = Config::parse(&text).unwrap();
        let edit = |pairs: &[(&str, &str)]| {
            let mut t = text.clone();
            for (from, to) in pairs {
                assert!(t.contains(from), "{from}");
                t = t.replace(from, to);
            }
            Config::parse(&t).unwrap()
        };
        // Tenants and the backends' sizing reload.
        let reloadable = edit(&[
            (
                "decode_tokens_per_second = 20",
                "decode_tokens_per_second = 40",
            ),
            ("api_keys = [\"sk-alice\"]", "api_keys = [\"sk-alice-2\"]"),
            ("max_batch = 32", "max_batch = 16"),
            (
                "kv_capacity_bytes = 8000000000",
                "kv_capacity_bytes = 4000000000",
            ),
        ]);
        assert_eq!(
            running.restart_only_changes(&reloadable),
            Vec::<String>::new()
        );
        let fixed = edit(&[
            ("listen = \"127.0.0.1:8080\"", "listen = \"127.0.0.1:8090\""),
            ("idle_timeout = \"75s\"", "idle_timeout = \"60s\""),
            ("workers = 2", "workers = 3"),
            ("# workers = 4", "workers = 3"),
            ("max_model_len = 32768", "max_model_len = 16384"),
            ("queue_deadline = \"10s\"", "queue_deadline = \"5s\""),
            (
                "url = \"http://127.0.0.1:9000\"",
                "url = \"http://127.0.0.1:9001\"",
            ),
            (
                "first_byte_timeout = \"60s\"",
                "first_byte_timeout = \"30s\"",
            ),
            ("max_batch = 32", "max_batch = 16"),
        ]);
        assert_eq!(
            running.restart_only_changes(&fixed),
            [
                "server.listen",
                "server.idle_timeout",
                "server.workers",
                "tokenizer.workers",
                "model.max_model_len",
                "admission.queue_deadline",
                "backends[0].url",
                "backends[0].first_byte_timeout",
            ]
        );
        let two = edit(&[(
            "[[tenants]]\nname = \"alice\"",
            "[[backends]]\nurl = \"http://127.0.0.1:9001\"\nkv_capacity_bytes = 1\nmax_batch = 1\n\n[[tenants]]\nname = \"alice\"",
        )]);
        assert_eq!(
            running.restart_only_changes(&two),
            ["backends (their number: 1 then 2)"]
        );
        // The exporter is started once, with the gateway.
        let traced = edit(&[(
            "[[tenants]]\nname = \"alice\"",
            "[otel]\nendpoint = \"http://127.0.0.1:4318\"\n\n[[tenants]]\nname = \"alice\"",
        )]);
        assert_eq!(running.restart_only_changes(&traced), ["otel"]);
    }

    #[test]
    fn backend_bounds_default_and_must_be_positive() {
        let text = quickstart();
        let cfg = Config::parse(&text).unwrap();
        let b = &cfg.backends[0];
        assert_eq!(
            (b.stream_idle_timeout, b.body_read_timeout, b.health_timeout),
            (
                Duration::from_secs(60),
                Duration::from_secs(30),
                Duration::from_millis(500)
            )
        );
        assert_eq!(
            (b.max_response_bytes, b.max_event_bytes),
            (64 << 20, 1 << 20)
        );
        assert_eq!(cfg.server.max_connections, 4096);
        for (line, message) in [
            (
                "stream_idle_timeout = \"0s\"",
                "backends[0].stream_idle_timeout must be positive",
            ),
            (
                "body_read_timeout = \"0s\"",
                "backends[0].body_read_timeout must be positive",
            ),
            (
                "health_timeout = \"0s\"",
                "backends[0].health_timeout must be positive",
            ),
            (
                "max_response_bytes = 0",
                "backends[0].max_response_bytes must be at least 1",
            ),
            (
                "max_event_bytes = 0",
                "backends[0].max_event_bytes must be at least 1",
            ),
        ] {
            let bad = text.replace(
                "first_byte_timeout = \"60s\"",
                &format!("first_byte_timeout = \"60s\"\n{line}"),
            );
            assert_ne!(bad, text);
            assert_eq!(Config::parse(&bad).unwrap_err().to_string(), message);
        }
        for field in ["max_connections", "refused_body_bytes_per_second"] {
            let bad = text.replace(
                "shutdown_grace = \"10s\"",
                &format!("shutdown_grace = \"10s\"\n{field} = 0"),
            );
            assert_ne!(bad, text);
            assert_eq!(
                Config::parse(&bad).unwrap_err().to_string(),
                format!("server.{field} must be at least 1")
            );
        }
        let server: ServerConfig = toml::from_str("").unwrap();
        assert_eq!(
            (server.idle_timeout, server.client_write_timeout),
            (Duration::from_secs(75), Duration::from_secs(30))
        );
        for (line, field) in [
            ("header_read_timeout = \"10s\"", "header_read_timeout"),
            ("idle_timeout = \"75s\"", "idle_timeout"),
            ("client_write_timeout = \"30s\"", "client_write_timeout"),
        ] {
            let bad = text.replace(line, &format!("{field} = \"0s\""));
            assert_ne!(bad, text);
            assert_eq!(
                Config::parse(&bad).unwrap_err().to_string(),
                format!("server.{field} must be positive")
            );
        }
    }

    #[test]
    fn a_share_too_small_for_one_request_names_the_derived_rate() {
        // Found by the config fuzz target: the refusal named a field the file did not set, and
        // no numbers.
        let text = |burst: &str| {
            sized_text(2, "").replace(
                "share = 0.5\nrequests_per_second = 1",
                &format!("share = 0.001\nburst_seconds = {burst}"),
            )
        };
        let rps = Config::parse(&text("1000000")).unwrap().tenants[0]
            .rates()
            .requests_per_second;
        assert!(rps > 0.0 && rps < 1.0, "{rps}");
        assert_eq!(
            Config::parse(&text("1")).unwrap_err().to_string(),
            format!(
                "tenants[0] (alice): requests_per_second ({rps}, derived from share 0.001) x burst_seconds (1) = {rps} must be at least 1, else no request ever fits: raise burst_seconds or set requests_per_second"
            )
        );
    }

    /// The lines of [`describe::describe`] that show the backends' sizing and the tenants' rates.
    fn sizing_and_rates(cfg: &ValidConfig) -> Vec<String> {
        (describe::describe(cfg).lines())
            .filter(|l| l.starts_with("backend http") || l.starts_with("tenant "))
            .map(String::from)
            .collect()
    }

    #[test]
    fn describe_tells_each_value_in_force_configured_or_derived() {
        // A hand-set max_batch beside the capacity model's 45: each is shown as what it is.
        let hand_set = sized_backend(2, "max_batch = 200").unwrap();
        assert_eq!(
            (
                hand_set.backends[0].max_batch(),
                hand_set.backends[0].max_batch
            ),
            (200, Some(200))
        );
        assert_eq!(
            sizing_and_rates(&hand_set),
            [
                "backend http://127.0.0.1:9: kv_capacity_bytes 70000000000 (70.00 GB, derived), max_batch 200 (configured; the capacity model derives 45)",
                "tenant alice: prefill 923.9/s (derived), decode 246.4/s (derived), requests 1.000/s (configured; the capacity model derives 0.308/s), burst 10 s (share 0.5 of the derived capacity)",
            ]
        );
        let kv = sized_text(2, "kv_capacity_bytes = 4000000000")
            .replace("share = 0.5\nrequests_per_second = 1", "share = 0.5");
        assert_eq!(
            sizing_and_rates(&Config::parse(&kv).unwrap()),
            [
                "backend http://127.0.0.1:9: kv_capacity_bytes 4000000000 (4.00 GB, configured; the capacity model derives 70000000000), max_batch 45 (derived)",
                "tenant alice: prefill 923.9/s (derived), decode 246.4/s (derived), requests 0.308/s (derived), burst 10 s (share 0.5 of the derived capacity)",
            ]
        );
        // Without the capacity model, every value is the file's and nothing is said of it.
        assert_eq!(
            sizing_and_rates(&Config::parse(&by_hand()).unwrap()),
            [
                "backend http://127.0.0.1:9000: kv_capacity_bytes 8000000000 (8.00 GB), max_batch 32",
                "tenant alice: prefill 2000.0/s, decode 20.0/s, requests 1.000/s, burst 15 s",
                "tenant bob: prefill 2000.0/s, decode 20.0/s, requests 1.000/s, burst 15 s",
            ]
        );
    }

    #[test]
    fn a_zero_or_missing_figure_is_named_and_nothing_given_is_asked_for() {
        let err = |text: &str| Config::parse(text).unwrap_err().to_string();
        // `max_batch = 0` is a mistake, not a figure left out for the model to derive; and
        // nothing given is asked for.
        assert_eq!(
            err(&sized_text(2, "max_batch = 0")),
            "backends[0].max_batch must be at least 1: it is the most sequences the backend runs at once (leave it out to use the capacity model's 45)"
        );
        assert_eq!(
            err(&sized_text(2, "kv_capacity_bytes = 0")),
            "backends[0].kv_capacity_bytes must be at least 1: it is the bytes of KV cache the backend has for sequences (leave it out to use the capacity model's 70000000000)"
        );
        let text = by_hand();
        assert_eq!(
            err(&text.replace("max_batch = 32", "max_batch = 0")),
            "backends[0].max_batch must be at least 1: it is the most sequences the backend runs at once (or leave it out and set `hardware` and `model` to derive it)"
        );
        let without = |prefixes: &[&str]| {
            (text.lines())
                .filter(|l| !prefixes.iter().any(|p| l.starts_with(p)))
                .collect::<Vec<_>>()
                .join("\n")
        };
        assert_eq!(
            err(&without(&["max_batch"])),
            "backends[0]: give max_batch, or `hardware` and `model` to derive it"
        );
        assert_eq!(
            err(&without(&["max_batch", "kv_capacity_bytes"])),
            "backends[0]: give kv_capacity_bytes and max_batch, or `hardware` and `model` to derive them"
        );
        assert_eq!(
            err(&sized_text(2, "").replace("model = \"qwen3.5-27b\"\n", "")),
            "backends[0]: `hardware` is given without `model`: capacity-model sizing needs both"
        );
        // A tenant's rates: given, or all derived from `share`.
        assert_eq!(
            err(&without(&["decode_tokens_per_second", "requests_per_second"])),
            "tenants[0] (alice): give decode_tokens_per_second and requests_per_second, or `share` to derive the rates from the backends the capacity model sizes"
        );
        let shared = |lines: &str| {
            err(&sized_text(2, "").replace("share = 0.5\nrequests_per_second = 1", lines))
        };
        assert_eq!(
            shared("share = 0.5\nprefill_tokens_per_second = 0"),
            "tenants[0] (alice): `share` derives the token rates and prefill_tokens_per_second is given too: give one or the other"
        );
        assert_eq!(
            shared("share = 0.5\nrequests_per_second = 0"),
            "tenants[0] (alice).requests_per_second must be a positive number, got 0"
        );
    }

    #[test]
    fn describe_shows_the_tenants_caps_and_when_the_shared_store_is_marked_down() {
        let text = quickstart().replacen(
            "api_keys = [\"sk-alice\"]",
            "api_keys = [\"sk-alice\"]\nmax_inflight = 8\nmax_queued = 0",
            1,
        ) + "\n[limiter]\nstore = \"redis\"\nredis_url = \"redis://127.0.0.1:6379\"\nfailures_before_down = 5\n";
        let shown = describe::describe(&Config::parse(&text).unwrap());
        assert!(
            shown.contains("burst 15 s, max_inflight 8, max_queued 0\n"),
            "{shown}"
        );
        assert!(
            shown.contains("limiter store redis: on_store_error FailClosed, marked down after 5 failures in a row, tried again every 1s\n"),
            "{shown}"
        );
        let zero = text.replace("failures_before_down = 5", "failures_before_down = 0");
        assert_eq!(
            Config::parse(&zero).unwrap_err().to_string(),
            "limiter.failures_before_down must be at least 1"
        );
        let none = text.replace("max_inflight = 8", "max_inflight = 0");
        assert_eq!(
            Config::parse(&none).unwrap_err().to_string(),
            "tenants[0] (alice).max_inflight must be at least 1 (leave it out for no cap)"
        );
    }
}
