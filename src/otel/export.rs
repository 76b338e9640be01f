//! The exporter: finished spans wait in a bounded queue and go, with the metrics, to the OTLP
//! receiver's `/v1/traces` and `/v1/metrics` as binary protobuf over HTTP, from a task of their
//! own. A request only ever pushes a finished span onto the queue (or drops it, counted, when
//! the queue is full), so a receiver that is slow, down or wrong changes nothing for requests.
//! Every export is bounded in time (`otel.export_timeout`, connecting included) and size (at most
//! `otel.max_export_batch` spans; at most [`MAX_ANSWER_BYTES`] of the receiver's answer read).

use super::attribute::string;
use super::histograms::Histograms;
use crate::clock::SharedClock;
use crate::config::OtelConfig;
use crate::metrics::OtelMetrics;
use crate::util::bounded::read_bounded;
use crate::util::throttle::Throttle;
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::InstrumentationScope;
use opentelemetry_proto::tonic::metrics::v1::{
    metric, number_data_point, AggregationTemporality, Metric, NumberDataPoint, ResourceMetrics,
    ScopeMetrics, Sum,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use prometheus_client::metrics::counter::Counter;
use prost::Message;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::Notify;

/// The most bytes of a receiver's answer read (it is only a status; reading it lets the
/// connection be used again).
const MAX_ANSWER_BYTES: u64 = 64 * 1024;

/// Failed exports and dropped spans are logged at warn at most once this often (one throttle
/// for both; each line says how many were held back since the last).
const WARNING_PERIOD: Duration = Duration::from_secs(10);

/// What requests and the exporter share: the queue of finished spans, the metrics, the counts
/// of what was lost.
#[derive(Debug)]
pub(super) struct Shared {
    pub clock: SharedClock,
    spans: Mutex<VecDeque<Span>>,
    max_queued: usize,
    batch: usize,
    /// Told when a whole batch waits, so it goes before the interval.
    batch_ready: Notify,
    pub histograms: Histograms,
    /// Spans dropped because the queue was full (`tokengate_otel_spans_dropped_total` too).
    dropped_queue_full: Counter,
    /// Spans lost with an export that failed.
    dropped_export_failed: Counter,
    warnings: Throttle,
    /// When the metrics' counts started (Unix nanoseconds).
    start: u64,
    /// `otel.sampling_ratio`.
    sampling_ratio: f64,
}

impl Shared {
    pub(super) fn new(config: &OtelConfig, clock: SharedClock, metrics: &OtelMetrics) -> Self {
        Self {
            start: unix_nanos(clock.wall_ms(), Duration::ZERO),
            warnings: Throttle::every(WARNING_PERIOD, clock.clone()),
            clock,
            spans: Mutex::new(VecDeque::new()),
            max_queued: config.max_queued_spans,
            batch: config.max_export_batch,
            batch_ready: Notify::new(),
            histograms: Histograms::default(),
            dropped_queue_full: metrics.dropped("queue_full"),
            dropped_export_failed: metrics.dropped("export_failed"),
            sampling_ratio: config.sampling_ratio,
        }
    }

    /// Whether a new trace's spans are recorded.
    pub(super) fn sampled(&self) -> bool {
        self.sampling_ratio >= 1.0 || rand::random::<f64>() < self.sampling_ratio
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, VecDeque<Span>> {
        self.spans.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A finished span, queued for export, or dropped and counted when the queue is full.
    pub(super) fn finished(&self, span: Span) {
        let mut queue = self.queue();
        if queue.len() >= self.max_queued {
            drop(queue);
            let total = self.dropped_queue_full.inc() + 1;
            if let Some(held_back) = self.warnings.allow() {
                tracing::warn!(
                    total,
                    held_back,
                    "OpenTelemetry span queue full (otel.max_queued_spans): span dropped; the receiver is slower than the gateway's requests"
                );
            }
            return;
        }
        queue.push_back(span);
        if queue.len() >= self.batch {
            self.batch_ready.notify_one();
        }
    }

    /// The oldest spans, at most a batch (empty when none wait).
    fn batch(&self) -> Vec<Span> {
        let mut queue = self.queue();
        let n = queue.len().min(self.batch);
        queue.drain(..n).collect()
    }
}

/// Unix nanoseconds of `ms` Unix milliseconds plus `after`.
pub(super) fn unix_nanos(ms: i64, after: Duration) -> u64 {
    let base = u64::try_from(ms).unwrap_or(0).saturating_mul(1_000_000);
    base.saturating_add(u64::try_from(after.as_nanos()).unwrap_or(u64::MAX))
}

/// Sends what [`Shared`] holds to the receiver until dropped.
#[derive(Debug)]
pub(super) struct Exporter {
    sender: Arc<Sender>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Exporter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Where and how the exporter sends.
#[derive(Debug)]
struct Sender {
    shared: Arc<Shared>,
    client: Client<HttpConnector, Full<Bytes>>,
    traces: http::Uri,
    metrics: http::Uri,
    timeout: Duration,
    resource: Resource,
    scope: InstrumentationScope,
}

impl Exporter {
    /// Starts exporting `shared` as `config` says, on the current runtime.
    pub(super) fn start(config: &OtelConfig, shared: Arc<Shared>) -> anyhow::Result<Self> {
        let base = config.base()?;
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(config.export_timeout));
        let sender = Sender {
            shared,
            client: Client::builder(TokioExecutor::new()).build(connector),
            traces: format!("{base}/v1/traces").parse()?,
            metrics: format!("{base}/v1/metrics").parse()?,
            timeout: config.export_timeout,
            resource: Resource {
                attributes: vec![string("service.name", &config.service_name)],
                ..Default::default()
            },
            scope: InstrumentationScope {
                name: "tokengate".to_owned(),
                version: env!("CARGO_PKG_VERSION").to_owned(),
                ..Default::default()
            },
        };
        let sender = Arc::new(sender);
        let task = tokio::spawn(sender.clone().run(config.export_interval));
        Ok(Self { sender, task })
    }

    /// Sends the spans waiting and the metrics now, within `otel.export_timeout` in all (at a
    /// clean stop, once every request has settled).
    pub(super) async fn flush(&self) {
        let round = self.sender.round(true);
        if tokio::time::timeout(self.sender.timeout, round)
            .await
            .is_err()
        {
            tracing::warn!("OpenTelemetry: the last spans and metrics were not all sent within otel.export_timeout");
        }
    }
}

impl Sender {
    async fn run(self: Arc<Self>, interval: Duration) {
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let metrics_due = tokio::select! {
                _ = ticks.tick() => true,
                () = self.shared.batch_ready.notified() => false,
            };
            self.round(metrics_due).await;
        }
    }

    /// One round of exports: the spans waiting, then the metrics when `metrics_due`.
    async fn round(&self, metrics_due: bool) {
        // What waits now goes, a batch at a time; what comes meanwhile waits for the next
        // round, so the metrics are never held back by a steady flow of spans.
        let waiting = self.shared.queue().len();
        for _ in 0..waiting.div_ceil(self.shared.batch) {
            let spans = self.shared.batch();
            if spans.is_empty() {
                break;
            }
            let count = spans.len() as u64;
            if let Err(why) = self.post(&self.traces, self.traces_body(spans)).await {
                self.shared.dropped_export_failed.inc_by(count);
                self.failed("traces", &why);
            }
        }
        if metrics_due {
            if let Err(why) = self.post(&self.metrics, self.metrics_body()).await {
                self.failed("metrics", &why);
            }
        }
    }

    fn failed(&self, signal: &str, why: &str) {
        if let Some(held_back) = self.shared.warnings.allow() {
            tracing::warn!(
                signal,
                endpoint = %self.traces,
                held_back,
                "OpenTelemetry export failed: {why}"
            );
        }
    }

    fn traces_body(&self, spans: Vec<Span>) -> Vec<u8> {
        ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(self.resource.clone()),
                scope_spans: vec![ScopeSpans {
                    scope: Some(self.scope.clone()),
                    spans,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
        .encode_to_vec()
    }

    fn metrics_body(&self) -> Vec<u8> {
        let shared = &self.shared;
        let now = unix_nanos(shared.clock.wall_ms(), Duration::ZERO);
        let mut metrics = shared.histograms.metrics(shared.start, now);
        let dropped = [
            ("queue_full", &shared.dropped_queue_full),
            ("export_failed", &shared.dropped_export_failed),
        ];
        metrics.push(Metric {
            name: "tokengate.otel.spans.dropped".to_owned(),
            description: "Finished spans never sent: the queue was full, or their export failed."
                .to_owned(),
            unit: "{span}".to_owned(),
            data: Some(metric::Data::Sum(Sum {
                data_points: (dropped.iter())
                    .map(|(reason, count)| NumberDataPoint {
                        attributes: vec![string("reason", reason)],
                        start_time_unix_nano: shared.start,
                        time_unix_nano: now,
                        value: Some(number_data_point::Value::AsInt(
                            i64::try_from(count.get()).unwrap_or(i64::MAX),
                        )),
                        ..Default::default()
                    })
                    .collect(),
                aggregation_temporality: AggregationTemporality::Cumulative as i32,
                is_monotonic: true,
            })),
            ..Default::default()
        });
        ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                resource: Some(self.resource.clone()),
                scope_metrics: vec![ScopeMetrics {
                    scope: Some(self.scope.clone()),
                    metrics,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
        .encode_to_vec()
    }

    /// POSTs `body` to `uri`, bounded by the export timeout; the receiver's answer must be a
    /// 2xx.
    async fn post(&self, uri: &http::Uri, body: Vec<u8>) -> Result<(), String> {
        let req = http::Request::post(uri.clone())
            .header(http::header::CONTENT_TYPE, "application/x-protobuf")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| e.to_string())?;
        let sent = async {
            let resp = self.client.request(req).await.map_err(|e| e.to_string())?;
            let status = resp.status();
            // Read (bounded; the timeout around it bounds it too) so the connection is kept
            // for the next export.
            let read = read_bounded(resp.into_body(), MAX_ANSWER_BYTES, self.timeout).await;
            match (status.is_success(), read) {
                (true, Ok(_)) => Ok(()),
                (true, Err(e)) => Err(format!("reading the answer: {e}")),
                (false, _) => Err(format!("the receiver answered {status}")),
            }
        };
        match tokio::time::timeout(self.timeout, sent).await {
            Ok(done) => done,
            Err(_) => Err(format!(
                "no answer within otel.export_timeout ({})",
                humantime::format_duration(self.timeout)
            )),
        }
    }
}
