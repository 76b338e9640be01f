//! Backend feedback: the gateway reads each backend's own Prometheus metrics on an interval
//! (vLLM / vLLM-ascend and MindIE names, [`parse`]), shows the latest reading beside the ledger
//! in `/admin/backends`, and lets a backend that queues (beyond the sequences of a request it
//! runs in turns) or preempts shrink its ledger's effective KV capacity, and calm regrow it
//! ([`pressure`]). From a vLLM engine it also learns
//! the KV geometry in the engine's own units ([`engine`]): a backend with `kv = "engine"`
//! admits by it, and one whose geometry is set by hand is checked against it; and the vLLM
//! version it runs ([`version`]), which says how an output limit past the context is answered.
//!
//! This module is the thin async shell: one task per backend with `[backends.feedback]`
//! enabled or `kv = "engine"`, each GET bounded in time (`timeout`) and size (`max_bytes`), the
//! pure controller fed with the reading and the ledger, its decision applied through
//! [`Admission::set_capacity_scale`], the engine's geometry through [`Admission::learned`],
//! logged and exported.

pub mod engine;
pub mod parse;
pub mod pressure;
pub mod version;

use crate::admission::{Admission, BackendSnapshot};
use crate::metrics::{BackendLabel, FeedbackMetrics, KvMismatchLabels, ScrapeFailureLabels};
use crate::util::get::{fetch, HttpClient};
use engine::{CacheInfo, Difference, EngineKv, EngineLimits, HandSet};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use parse::{BackendReading, ParseError};
use pressure::{Adjustment, Bounds, LedgerView, Pressure};
use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::task::JoinHandle;
use version::{EngineVersions, VllmVersion};

/// `[backends.feedback]`: reading one backend's metrics and adjusting its ledger from them.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeedbackConfig {
    /// Scrape the backend's metrics (off by default).
    #[serde(default)]
    pub enabled: bool,
    /// Where its Prometheus text is: default `{url}/metrics` (vLLM, vLLM-ascend, the sim);
    /// MindIE serves it on its metrics port (`http://HOST:1027/metrics`). http only.
    #[serde(default)]
    pub metrics_url: Option<String>,
    /// Time between scrapes.
    #[serde(default = "default_interval", with = "humantime_serde")]
    pub interval: Duration,
    /// Time for one whole scrape (connect, headers and body).
    #[serde(default = "default_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    /// Largest scrape read; a larger one is an error and changes nothing.
    #[serde(default = "default_max_bytes")]
    pub max_bytes: u64,
    /// Let queueing and preemption shrink the effective KV capacity (and calm regrow it).
    #[serde(default = "yes")]
    pub adjust_capacity: bool,
    /// The effective capacity never goes below this share of the configured one.
    #[serde(default = "default_floor")]
    pub floor: f64,
    /// Up to this multiple of the configured capacity when the backend keeps using much less
    /// than the ledger reserves (1: no overcommit; at most 2).
    #[serde(default = "one")]
    pub overcommit: f64,
}

fn default_interval() -> Duration {
    Duration::from_secs(5)
}
fn default_timeout() -> Duration {
    Duration::from_secs(2)
}
fn default_max_bytes() -> u64 {
    1 << 20
}
fn yes() -> bool {
    true
}
fn default_floor() -> f64 {
    0.5
}
fn one() -> f64 {
    1.0
}

impl Default for FeedbackConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            metrics_url: None,
            interval: default_interval(),
            timeout: default_timeout(),
            max_bytes: default_max_bytes(),
            adjust_capacity: true,
            floor: default_floor(),
            overcommit: 1.0,
        }
    }
}

impl FeedbackConfig {
    /// Checks the section of backend `at` (`backends[0]`) whose base URL is `url`.
    pub fn check(&self, at: &str) -> anyhow::Result<()> {
        if let Some(url) = &self.metrics_url {
            let uri: http::Uri = url
                .parse()
                .map_err(|_| anyhow::anyhow!("{at}.feedback.metrics_url `{url}` is not a URL"))?;
            if uri.scheme_str() != Some("http") || uri.authority().is_none() {
                anyhow::bail!("{at}.feedback.metrics_url `{url}` must be http://HOST:PORT/PATH");
            }
        }
        for (field, t) in [("interval", self.interval), ("timeout", self.timeout)] {
            if t.is_zero() {
                anyhow::bail!("{at}.feedback.{field} must be positive");
            }
        }
        if self.max_bytes == 0 {
            anyhow::bail!("{at}.feedback.max_bytes must be at least 1");
        }
        if !(self.floor > 0.0 && self.floor <= 1.0) {
            anyhow::bail!(
                "{at}.feedback.floor is {}; it must be in (0, 1]",
                self.floor
            );
        }
        if !(1.0..=2.0).contains(&self.overcommit) {
            anyhow::bail!(
                "{at}.feedback.overcommit is {}; it must be from 1 (none) to 2",
                self.overcommit
            );
        }
        Ok(())
    }

    /// The metrics URL of the backend at `base_url`.
    pub fn url_for(&self, base_url: &str) -> String {
        self.metrics_url
            .clone()
            .unwrap_or_else(|| format!("{}/metrics", base_url.trim_end_matches('/')))
    }

    /// The controller's bounds, in per mille.
    pub fn bounds(&self) -> Bounds {
        Bounds {
            floor_permille: (self.floor * 1000.0).round() as u32,
            ceiling_permille: (self.overcommit * 1000.0).round() as u32,
        }
    }
}

/// What the gateway last learned from one backend's metrics (shown in `/admin/backends`).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Observed {
    /// The URL scraped.
    pub metrics_url: String,
    /// Scrapes that succeeded and failed so far.
    pub scrapes: u64,
    /// See `scrapes`.
    pub failures: u64,
    /// Why the last scrape failed, if it did.
    pub last_error: Option<String>,
    /// The last successful reading.
    pub reading: Option<BackendReading>,
    /// The effective capacity's scale now, per mille of the configured one.
    pub capacity_scale_permille: u32,
    /// The last change of scale.
    pub last_adjustment: Option<Adjustment>,
    /// Where the backend's KV geometry comes from: `configured` or `engine`.
    pub kv: &'static str,
    /// The KV geometry last learned from the engine (a vLLM engine only).
    pub engine_kv: Option<EngineKv>,
    /// Why the engine's geometry could not be learned, when it could not.
    pub engine_kv_error: Option<String>,
    /// Where the geometry in force (set by hand, or the context length) differs from the
    /// engine's.
    pub kv_differences: Vec<Difference>,
    /// The version the engine says it runs (`GET /version`, a vLLM engine only), as it says it.
    pub engine_version: Option<String>,
    /// Where the backend's declared `vllm_version` is not the engine's, in words.
    pub engine_version_difference: Option<String>,
}

/// Every backend's latest observation (index = backend; `None` where feedback is off).
#[derive(Debug, Default)]
pub struct Observations {
    observed: Vec<Mutex<Option<Observed>>>,
}

impl Observations {
    /// Backend `i`'s latest observation.
    pub fn observed(&self, i: usize) -> Option<Observed> {
        self.observed
            .get(i)?
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn update(&self, i: usize, f: impl FnOnce(&mut Observed)) {
        let mut slot = self.observed[i]
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        f(slot.get_or_insert_with(Observed::default));
    }
}

/// Why a scrape gave no reading.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
enum ScrapeError {
    /// No text: the backend unreachable, a non-2xx answer, too large, too slow, not UTF-8.
    #[error("{0}")]
    Fetch(String),
    /// Text that is not Prometheus text (the URL serves something else).
    #[error("{0}")]
    Parse(#[from] ParseError),
}

impl ScrapeError {
    /// The `reason` label of `tokengate_backend_scrape_failures_total`.
    fn reason(&self) -> &'static str {
        match self {
            ScrapeError::Fetch(_) => "fetch",
            ScrapeError::Parse(_) => "parse",
        }
    }
}

fn ledger_view(b: &BackendSnapshot, in_turns: bool) -> LedgerView {
    LedgerView {
        configured_bytes: b.kv_capacity_bytes,
        reserved_bytes: b.kv_reserved_bytes,
        live: b.inflight,
        in_turns,
    }
}

/// What the gateway does with an engine's KV geometry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvWatch {
    /// Admits by it (`kv = "engine"`): `max_batch` lowers the engine's batch cap;
    /// `kv_bytes_per_token` (`model.kv_bytes_per_token`) sizes the pages of an engine that
    /// does not report their bytes; `max_model_len` is the context the gateway counts against.
    Learn {
        /// The backend's `max_batch`, when given.
        max_batch: Option<u32>,
        /// `model.kv_bytes_per_token`.
        kv_bytes_per_token: u64,
        /// `model.max_model_len`.
        max_model_len: u64,
    },
    /// Checks the geometry set by hand against it.
    Check(HandSet),
}

impl KvWatch {
    /// The name of its source in the config.
    fn source(&self) -> &'static str {
        match self {
            KvWatch::Learn { .. } => "engine",
            KvWatch::Check(_) => "configured",
        }
    }

    /// `model.kv_bytes_per_token`: the bytes of a token of a page whose bytes the engine
    /// does not report.
    fn kv_bytes_per_token(&self) -> u64 {
        match self {
            KvWatch::Learn {
                kv_bytes_per_token, ..
            } => *kv_bytes_per_token,
            KvWatch::Check(hand) => hand.kv_bytes_per_token,
        }
    }

    /// Where what is in force differs from engine `kv`'s: the whole hand-set geometry, or,
    /// for a geometry learned, the context length the gateway counts against.
    pub fn differences(&self, kv: &EngineKv) -> Vec<Difference> {
        match *self {
            KvWatch::Learn { max_model_len, .. } => (max_model_len != kv.max_model_len)
                .then(|| Difference {
                    key: "model.max_model_len",
                    configured: max_model_len,
                    engine: kv.max_model_len,
                    unit: "tokens".to_string(),
                })
                .into_iter()
                .collect(),
            KvWatch::Check(hand) => kv.differences(&hand),
        }
    }
}

/// GETs `path` from the engine at `base` within `timeout`, reading at most `max_bytes`; the
/// error names the URL.
async fn engine_get(
    client: &HttpClient,
    base: &str,
    path: &str,
    timeout: Duration,
    max_bytes: u64,
) -> Result<String, String> {
    let url = format!("{}{path}", base.trim_end_matches('/'));
    let uri: http::Uri = url.parse().map_err(|_| format!("{url} is not a URL"))?;
    fetch(client, &uri, timeout, max_bytes, None)
        .await
        .map_err(|e| format!("GET {url}: {e}"))
}

/// The engine's context length (`/v1/models`) and batch cap (`/server_info`, when served),
/// each GET bounded by `cfg`'s timeout and size.
async fn engine_limits(
    client: &HttpClient,
    base: &str,
    cfg: &FeedbackConfig,
) -> Result<EngineLimits, String> {
    let get = |path| engine_get(client, base, path, cfg.timeout, cfg.max_bytes);
    let models = get("/v1/models").await?;
    let max_model_len = engine::max_model_len(&models)
        .ok_or_else(|| engine::LearnError::NoContextLength.to_string())?;
    // Served only with VLLM_SERVER_DEV_MODE=1: without it the batch cap is not known.
    let max_num_seqs = match get("/server_info?config_format=json").await {
        Ok(info) => engine::max_num_seqs(&info),
        Err(_) => None,
    };
    Ok(EngineLimits {
        max_model_len,
        max_num_seqs,
    })
}

/// What the engine at `base` says it runs (`GET /version`, bounded by `cfg`'s timeout and
/// [`VERSION_BYTES`]): `None` when its answer names no version.
async fn engine_version(
    client: &HttpClient,
    base: &str,
    cfg: &FeedbackConfig,
) -> Result<Option<String>, String> {
    let text = engine_get(client, base, "/version", cfg.timeout, VERSION_BYTES).await?;
    Ok(version::said(&text))
}

/// What backend `b`'s engine says it runs, read once (`tokengate check-config`).
pub async fn read_engine_version(b: &Watched) -> Result<Option<String>, String> {
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    engine_version(&client, &b.url, &b.feedback).await
}

/// Reads backend `b`'s engine once (`tokengate check-config`): its metrics, context length and
/// batch cap, and the KV geometry they give.
pub async fn read_engine(b: &Watched) -> Result<EngineKv, String> {
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let metrics_url = b.feedback.url_for(&b.url);
    let uri: http::Uri =
        (metrics_url.parse()).map_err(|_| format!("{metrics_url} is not a URL"))?;
    let text = fetch(
        &client,
        &uri,
        b.feedback.timeout,
        b.feedback.max_bytes,
        None,
    )
    .await
    .map_err(|e| format!("GET {metrics_url}: {e}"))?;
    let reading = parse::parse(&text).map_err(|e| e.to_string())?;
    let cache = (reading.cache).ok_or_else(|| engine::LearnError::NoCacheInfo.to_string())?;
    let limits = engine_limits(&client, &b.url, &b.feedback).await?;
    EngineKv::learn(
        &cache,
        reading.draft_tokens,
        limits,
        b.kv.kv_bytes_per_token(),
    )
    .map_err(|e| e.to_string())
}

/// One backend the feedback loops read.
#[derive(Clone, Debug)]
pub struct Watched {
    /// Its base URL.
    pub url: String,
    /// `[backends.feedback]`.
    pub feedback: FeedbackConfig,
    /// What its engine's KV geometry is for.
    pub kv: KvWatch,
}

impl Watched {
    /// Whether it is read at all: feedback on, or a geometry to learn.
    pub fn read(&self) -> bool {
        self.feedback.enabled || matches!(self.kv, KvWatch::Learn { .. })
    }
}

/// Readings that ask for an engine's batch cap before it is taken as not said.
const BATCH_CAP_TRIES: u32 = 12;

/// The most of a `/version` answer read (vLLM's is about 30 bytes).
const VERSION_BYTES: u64 = 4096;

/// One backend's scrape loop.
struct Scraper {
    index: usize,
    backend_url: String,
    metrics_url: http::Uri,
    cfg: FeedbackConfig,
    kv: KvWatch,
    /// The cache configuration and draft tokens the geometry was last learned from, once
    /// nothing more is to be asked of the engine for them.
    learned_from: Option<(CacheInfo, u64)>,
    /// Readings so far that learned all but the engine's batch cap.
    batch_cap_tries: u32,
    /// Whether the engine's version was learned since its last failed scrape.
    version_learned: bool,
    versions: Arc<EngineVersions>,
    admission: Admission,
    feedback: Arc<Observations>,
    metrics: Arc<FeedbackMetrics>,
    pressure: Pressure,
}

impl Scraper {
    async fn run(mut self) {
        let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
        let mut ticks = tokio::time::interval(self.cfg.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let got = fetch(
                &client,
                &self.metrics_url,
                self.cfg.timeout,
                self.cfg.max_bytes,
                None,
            )
            .await
            .map_err(ScrapeError::Fetch)
            .and_then(|text| Ok(parse::parse(&text)?));
            match &got {
                Ok(reading) => {
                    self.learn(&client, reading).await;
                    self.learn_version(&client, reading).await;
                }
                // The engine may come back as another version.
                Err(_) => self.version_learned = false,
            }
            self.take(got);
        }
    }

    /// Learns the engine's KV geometry from `reading` when its cache configuration is new
    /// (the first reading, or an engine restarted with another cache), asking the engine for
    /// its context length and batch cap; applies it (`kv = "engine"`) or checks the hand-set
    /// geometry against it.
    async fn learn(&mut self, client: &HttpClient, reading: &BackendReading) {
        let Some(cache) = &reading.cache else {
            if matches!(self.kv, KvWatch::Learn { .. }) {
                self.learn_failed(engine::LearnError::NoCacheInfo.to_string());
            }
            return;
        };
        let from = (cache.clone(), reading.draft_tokens);
        if self.learned_from.as_ref() == Some(&from) {
            return;
        }
        let kv = match engine_limits(client, &self.backend_url, &self.cfg).await {
            Ok(limits) => EngineKv::learn(
                cache,
                reading.draft_tokens,
                limits,
                self.kv.kv_bytes_per_token(),
            )
            .map_err(|e| e.to_string()),
            Err(e) => Err(e),
        };
        let kv = match kv {
            Ok(kv) => kv,
            Err(e) => return self.learn_failed(e),
        };
        // The batch cap may come later than the rest: vLLM's first `/server_info` answer
        // gathers the system's details and can take longer than a scrape may.
        self.batch_cap_tries += 1;
        if kv.max_num_seqs.is_some() || self.batch_cap_tries >= BATCH_CAP_TRIES {
            self.learned_from = Some(from);
            self.batch_cap_tries = 0;
        }
        let before = self.feedback.observed(self.index).and_then(|o| o.engine_kv);
        if before.as_ref() == Some(&kv) {
            return;
        }
        if let KvWatch::Learn { max_batch, .. } = self.kv {
            let capacity = kv.capacity(max_batch);
            self.admission.learned(self.index, kv.geometry(), capacity);
            let verb = if before.is_some() {
                "changed"
            } else {
                "learned"
            };
            tracing::info!(backend = %self.backend_url, page_tokens = kv.page_tokens, page_bytes = kv.page_bytes,
                pages = kv.pages, state_pages = kv.state_pages_per_sequence, lookahead_tokens = kv.lookahead_tokens,
                max_num_seqs = ?kv.max_num_seqs, kv_capacity_bytes = capacity.0, max_batch = capacity.1,
                "engine's KV cache {verb}");
        }
        let differences = self.kv.differences(&kv);
        for d in &differences {
            tracing::warn!(backend = %self.backend_url, key = d.key, configured = d.configured, engine = d.engine,
                "the geometry in force differs from the engine's: {d}");
        }
        self.export_differences(&differences);
        self.feedback.update(self.index, |o| {
            o.engine_kv = Some(kv);
            o.engine_kv_error = None;
            o.kv_differences = differences;
        });
    }

    /// Asks a vLLM engine (its metrics say its cache configuration) which version it runs,
    /// once, and again after a scrape that failed: the backend then clamps an output limit past
    /// the context as that version does ([`EngineVersions`]), unless it declares its own. An
    /// engine that does not answer is asked again at the next scrape.
    async fn learn_version(&mut self, client: &HttpClient, reading: &BackendReading) {
        if self.version_learned || reading.cache.is_none() {
            return;
        }
        let said = match engine_version(client, &self.backend_url, &self.cfg).await {
            Ok(said) => said,
            Err(e) => {
                tracing::debug!(backend = %self.backend_url, error = %e, "engine's version not read");
                return;
            }
        };
        self.version_learned = true;
        let version = said.as_deref().and_then(VllmVersion::parse);
        let changed = self.versions.learned(self.index, version);
        let clamps = self.versions.clamps_output_to_context();
        match (&said, version) {
            (Some(said), Some(_)) => {
                tracing::info!(backend = %self.backend_url, version = %said, clamps_output_to_context = clamps,
                    "engine runs vLLM {said}")
            }
            _ => {
                tracing::warn!(backend = %self.backend_url, said = ?said, clamps_output_to_context = clamps,
                "the engine's /version names no vLLM version: none is learned (backends[].vllm_version, when set, is the one in force)")
            }
        }
        if changed {
            tracing::info!(
                clamps_output_to_context = clamps,
                "a generation whose output limit passes the context is now {}",
                if clamps {
                    "served with the limit clamped to what the context leaves"
                } else {
                    "refused"
                }
            );
        }
        // A declared version the engine does not run: said, as a hand-set geometry is.
        let differs = (self.versions.declared_by(self.index))
            .zip(version)
            .zip(said.as_deref())
            .and_then(|((declared, engine), said)| version::difference(declared, engine, said));
        if let Some(d) = &differs {
            tracing::warn!(backend = %self.backend_url, "{d}");
        }
        self.feedback.update(self.index, |o| {
            o.engine_version = said;
            o.engine_version_difference = differs;
        });
    }

    /// The engine's geometry could not be learned: said once per reason, in the log and in
    /// `/admin/backends`.
    fn learn_failed(&mut self, error: String) {
        let mut new = false;
        self.feedback.update(self.index, |o| {
            new = o.engine_kv_error.as_ref() != Some(&error);
            o.engine_kv_error = Some(error.clone());
        });
        if new {
            match self.kv {
                KvWatch::Learn { .. } if self.admission.learned_geometry(self.index).is_none() => {
                    tracing::warn!(backend = %self.backend_url, error = %error,
                        "cannot learn the engine's KV cache (kv = \"engine\"): nothing is admitted on this backend until it is read")
                }
                _ => tracing::warn!(backend = %self.backend_url, error = %error,
                    "cannot read the engine's KV cache"),
            }
        }
    }

    /// `tokengate_backend_kv_mismatch{backend,key}`: 1 for each key that differs now, 0 for
    /// one that did and no longer does.
    fn export_differences(&self, differences: &[Difference]) {
        let before = (self.feedback.observed(self.index))
            .map(|o| o.kv_differences)
            .unwrap_or_default();
        for d in before.iter().chain(differences) {
            let differs = differences.iter().any(|n| n.key == d.key);
            self.metrics
                .backend_kv_mismatch
                .get_or_create(&KvMismatchLabels {
                    backend: self.backend_url.clone(),
                    key: d.key.to_string(),
                })
                .set(i64::from(differs));
        }
    }

    /// Applies one scrape's outcome: a failed one is counted and changes nothing else.
    fn take(&mut self, got: Result<BackendReading, ScrapeError>) {
        let label = BackendLabel {
            backend: self.backend_url.clone(),
        };
        let reading = match got {
            Ok(r) => r,
            Err(e) => {
                match &e {
                    // An engine whose geometry is still to be learned: said at once.
                    ScrapeError::Fetch(e)
                        if matches!(self.kv, KvWatch::Learn { .. })
                            && self.admission.learned_geometry(self.index).is_none() =>
                    {
                        self.learn_failed(format!("its metrics: {e}"))
                    }
                    // A backend down or slow for a moment: its gauges and the counter say so.
                    ScrapeError::Fetch(_) => {
                        tracing::debug!(backend = %self.backend_url, error = %e, "metrics scrape failed")
                    }
                    // It answers, with something else than its metrics: a wrong metrics_url.
                    ScrapeError::Parse(_) => {
                        tracing::warn!(backend = %self.backend_url, url = %self.metrics_url, error = %e, "metrics scrape is not Prometheus text")
                    }
                }
                self.metrics
                    .backend_scrape_failures
                    .get_or_create(&ScrapeFailureLabels {
                        backend: self.backend_url.clone(),
                        reason: e.reason().to_string(),
                    })
                    .inc();
                self.feedback.update(self.index, |o| {
                    o.failures += 1;
                    o.last_error = Some(e.to_string());
                });
                return;
            }
        };
        let adjustment = if self.cfg.adjust_capacity {
            let ledger = &self.admission.snapshot().backends[self.index];
            let in_turns = self.admission.runs_in_turns(self.index);
            self.pressure
                .observe(&reading, ledger_view(ledger, in_turns))
        } else {
            None
        };
        if let Some(a) = &adjustment {
            self.admission.set_capacity_scale(self.index, a.to_permille);
            if a.to_permille < a.from_permille {
                tracing::warn!(backend = %self.backend_url, from = a.from_permille, to = a.to_permille,
                    reason = ?a.reason, "backend under pressure: effective KV capacity shrunk (per mille of configured)");
            } else {
                tracing::info!(backend = %self.backend_url, from = a.from_permille, to = a.to_permille,
                    reason = ?a.reason, "effective KV capacity grown (per mille of configured)");
            }
        }
        let scale = self.pressure.scale_permille();
        self.metrics
            .kv_capacity_scale
            .get_or_create(&label)
            .set(f64::from(scale) / 1000.0);
        for (gauge, v) in [
            (&self.metrics.backend_waiting, reading.waiting),
            (&self.metrics.backend_running, reading.running),
        ] {
            if let Some(v) = v {
                gauge.get_or_create(&label).set(v as i64);
            }
        }
        if let Some(u) = reading.kv_usage {
            self.metrics.backend_kv_usage.get_or_create(&label).set(u);
        }
        self.feedback.update(self.index, |o| {
            o.scrapes += 1;
            o.last_error = None;
            o.reading = Some(reading);
            o.capacity_scale_permille = scale;
            if adjustment.is_some() {
                o.last_adjustment = adjustment;
            }
        });
    }
}

/// The scrape loops of a gateway and what they observed. Dropping it stops the loops.
#[derive(Debug)]
pub struct Scrapers {
    /// Every backend's latest observation.
    pub observed: Arc<Observations>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Scrapers {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Starts a scrape loop for every backend that is read (feedback enabled, or `kv = "engine"`;
/// `backends` in config order), on the current runtime. The first reading is at once.
pub fn spawn(
    backends: &[Watched],
    admission: &Admission,
    versions: &Arc<EngineVersions>,
    metrics: &Arc<FeedbackMetrics>,
) -> Scrapers {
    let feedback = Arc::new(Observations {
        observed: backends.iter().map(|_| Mutex::new(None)).collect(),
    });
    let tasks = (backends.iter().enumerate())
        .filter(|(_, b)| b.read())
        .filter_map(|(index, b)| {
            let metrics_url = b.feedback.url_for(&b.url).parse().ok()?;
            feedback.update(index, |o| {
                o.metrics_url = b.feedback.url_for(&b.url);
                o.capacity_scale_permille = crate::admission::KvLedger::UNSCALED;
                o.kv = b.kv.source();
            });
            // Without feedback, the engine is read for its geometry alone.
            let cfg = FeedbackConfig {
                adjust_capacity: b.feedback.enabled && b.feedback.adjust_capacity,
                ..b.feedback.clone()
            };
            let scraper = Scraper {
                index,
                backend_url: b.url.clone(),
                metrics_url,
                pressure: Pressure::new(cfg.bounds()),
                cfg,
                kv: b.kv,
                learned_from: None,
                batch_cap_tries: 0,
                version_learned: false,
                versions: versions.clone(),
                admission: admission.clone(),
                feedback: feedback.clone(),
                metrics: metrics.clone(),
            };
            Some(tokio::spawn(scraper.run()))
        })
        .collect();
    Scrapers {
        observed: feedback,
        tasks,
    }
}

#[cfg(test)]
mod tests;
