//! Backend feedback: the gateway reads each backend's own Prometheus metrics on an interval
//! (vLLM / vLLM-ascend and MindIE names, [`parse`]), shows the latest reading beside the ledger
//! in `/admin/backends`, and lets a backend that queues or preempts shrink its ledger's
//! effective KV capacity, and calm regrow it ([`pressure`]).
//!
//! This module is the thin async shell: one task per backend with `[backends.feedback]`
//! enabled, each GET bounded in time (`timeout`) and size (`max_bytes`), the pure controller fed
//! with the reading and the ledger, its decision applied through
//! [`Admission::set_capacity_scale`], logged and exported.

pub mod parse;
pub mod pressure;

use crate::admission::{Admission, BackendSnapshot};
use crate::metrics::{BackendLabel, Metrics, ScrapeFailureLabels};
use crate::util::get::{fetch, HttpClient};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use parse::{BackendReading, ParseError};
use pressure::{Adjustment, Bounds, LedgerView, Pressure};
use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::task::JoinHandle;

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

fn ledger_view(b: &BackendSnapshot) -> LedgerView {
    LedgerView {
        configured_bytes: b.kv_capacity_bytes,
        reserved_bytes: b.kv_reserved_bytes,
        live: b.inflight,
    }
}

/// One backend's scrape loop.
struct Scraper {
    index: usize,
    backend_url: String,
    metrics_url: http::Uri,
    cfg: FeedbackConfig,
    admission: Admission,
    feedback: Arc<Observations>,
    metrics: Arc<Metrics>,
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
            self.take(got);
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
            self.pressure.observe(&reading, ledger_view(ledger))
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

/// Starts a scrape loop for every backend with feedback enabled (`backends`: `(base URL,
/// feedback config)` in config order), on the current runtime.
pub fn spawn(
    backends: &[(String, FeedbackConfig)],
    admission: &Admission,
    metrics: &Arc<Metrics>,
) -> Scrapers {
    let feedback = Arc::new(Observations {
        observed: backends.iter().map(|_| Mutex::new(None)).collect(),
    });
    let tasks = backends
        .iter()
        .enumerate()
        .filter(|(_, (_, cfg))| cfg.enabled)
        .filter_map(|(index, (url, cfg))| {
            let metrics_url = cfg.url_for(url).parse().ok()?;
            feedback.update(index, |o| {
                o.metrics_url = cfg.url_for(url);
                o.capacity_scale_permille = crate::admission::KvLedger::UNSCALED;
            });
            let scraper = Scraper {
                index,
                backend_url: url.clone(),
                metrics_url,
                cfg: cfg.clone(),
                admission: admission.clone(),
                feedback: feedback.clone(),
                metrics: metrics.clone(),
                pressure: Pressure::new(cfg.bounds()),
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
