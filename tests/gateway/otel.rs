//! OpenTelemetry end to end: the gateway exports to a real OTLP/HTTP receiver started here (a
//! hyper server decoding each export with `opentelemetry-proto`'s messages), and every test
//! asserts exactly what the receiver got: the spans (names, kinds, parents, the client's trace
//! id, the GenAI attributes with exact token counts), the metrics' data points, the trace context
//! the backend got; that without `[otel]` the client's context passes as sent; and that a slow
//! or hung receiver holds back no request, its overflow dropped and counted. The gateway's clock
//! is manual and never advanced here, so every span starts and ends at the same nanosecond and
//! every duration falls in the first bucket.

use super::*;
use http_body_util::BodyExt;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::{metric, number_data_point, Metric};
use opentelemetry_proto::tonic::trace::v1::{span::SpanKind, Span};
use prost::Message;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokengate::config::OtelConfig;
use tokio::sync::{mpsc, Semaphore};

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";
const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const MODEL: &str = "qwen3.5-27b";

/// How the receiver answers.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Hold {
    /// At once.
    Never,
    /// Each export after a permit of `release`.
    Each,
    /// The first export never; the others at once.
    FirstForever,
}

/// An OTLP/HTTP receiver on 127.0.0.1: what it decoded, and each export's arrival.
struct Receiver {
    addr: std::net::SocketAddr,
    traces: mpsc::UnboundedReceiver<ExportTraceServiceRequest>,
    metrics: mpsc::UnboundedReceiver<ExportMetricsServiceRequest>,
    arrived: mpsc::UnboundedReceiver<()>,
    release: Arc<Semaphore>,
}

impl Receiver {
    async fn start(hold: Hold) -> Receiver {
        use hyper_util::rt::TokioIo;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (traces_tx, traces) = mpsc::unbounded_channel();
        let (metrics_tx, metrics) = mpsc::unbounded_channel();
        let (arrived_tx, arrived) = mpsc::unbounded_channel();
        let release = Arc::new(Semaphore::new(0));
        let first = Arc::new(AtomicBool::new(true));
        let permits = release.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (traces_tx, metrics_tx, arrived_tx) =
                    (traces_tx.clone(), metrics_tx.clone(), arrived_tx.clone());
                let (permits, first) = (permits.clone(), first.clone());
                let service =
                    hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let (traces_tx, metrics_tx, arrived_tx) =
                            (traces_tx.clone(), metrics_tx.clone(), arrived_tx.clone());
                        let (permits, first) = (permits.clone(), first.clone());
                        async move {
                            let _ = arrived_tx.send(());
                            match hold {
                                Hold::Never => {}
                                Hold::Each => permits.acquire().await.unwrap().forget(),
                                Hold::FirstForever => {
                                    if first.swap(false, Ordering::SeqCst) {
                                        std::future::pending::<()>().await;
                                    }
                                }
                            }
                            assert_eq!(req.headers()["content-type"], "application/x-protobuf");
                            let path = req.uri().path().to_owned();
                            let body = req.into_body().collect().await.unwrap().to_bytes();
                            match path.as_str() {
                                "/v1/traces" => {
                                    let _ = traces_tx
                                        .send(ExportTraceServiceRequest::decode(body).unwrap());
                                }
                                "/v1/metrics" => {
                                    let _ = metrics_tx
                                        .send(ExportMetricsServiceRequest::decode(body).unwrap());
                                }
                                other => panic!("an export to {other}"),
                            }
                            Ok::<_, std::convert::Infallible>(http::Response::new(
                                http_body_util::Full::new(bytes::Bytes::new()),
                            ))
                        }
                    });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service),
                );
            }
        });
        Receiver {
            addr,
            traces,
            metrics,
            arrived,
            release,
        }
    }

    fn config(&self, max_queued_spans: usize, export_timeout: Duration) -> OtelConfig {
        OtelConfig {
            endpoint: format!("http://{}", self.addr),
            service_name: "tokengate-test".to_owned(),
            export_interval: Duration::from_millis(50),
            export_timeout,
            max_queued_spans,
            // A request makes five spans: its whole trace goes in one export, at once.
            max_export_batch: 5.min(max_queued_spans),
            sampling_ratio: 1.0,
        }
    }

    /// The spans of the next trace exports until `n` spans of `trace_id` came (10 s at most),
    /// checking each export's resource and scope.
    async fn spans_of(&mut self, trace_id: &[u8], n: usize) -> Vec<Span> {
        let mut got = Vec::new();
        while got.len() < n {
            let export = tokio::time::timeout(Duration::from_secs(10), self.traces.recv())
                .await
                .expect("the spans within 10 s")
                .unwrap();
            for resource in export.resource_spans {
                let attributes = attrs(&resource.resource.unwrap().attributes);
                assert_eq!(attributes, map(&[("service.name", "tokengate-test")]));
                for scope in resource.scope_spans {
                    assert_eq!(scope.scope.unwrap().name, "tokengate");
                    got.extend(scope.spans.into_iter().filter(|s| s.trace_id == trace_id));
                }
            }
        }
        assert_eq!(got.len(), n);
        got
    }

    /// The metrics of the next metrics export for which `done` holds (10 s at most).
    async fn metrics_when(&mut self, done: impl Fn(&[Metric]) -> bool) -> Vec<Metric> {
        tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                let export = self.metrics.recv().await.unwrap();
                let metrics: Vec<Metric> = (export.resource_metrics.into_iter())
                    .flat_map(|r| r.scope_metrics)
                    .flat_map(|s| s.metrics)
                    .collect();
                if done(&metrics) {
                    return metrics;
                }
            }
        })
        .await
        .expect("the metrics within 10 s")
    }
}

/// Attributes as text.
fn attrs(kvs: &[KeyValue]) -> BTreeMap<String, String> {
    (kvs.iter())
        .map(|kv| {
            let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(any_value::Value::StringValue(s)) => s.clone(),
                Some(any_value::Value::IntValue(i)) => format!("{i}"),
                other => panic!("{other:?}"),
            };
            (kv.key.clone(), value)
        })
        .collect()
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    (pairs.iter())
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A chat from alice with `headers` beside its key.
async fn chat_with(gw: &TestGateway, body: &Value, headers: &[(&str, &str)]) -> Received {
    let mut all = vec![
        ("content-type", "application/json"),
        ("authorization", "Bearer sk-alice"),
    ];
    all.extend_from_slice(headers);
    let body = body.to_string().into_bytes();
    send(&gw.url("/v1/chat/completions"), "POST", Some(body), &all).await
}

/// The spans by name.
fn by_name(spans: Vec<Span>) -> BTreeMap<String, Span> {
    let named: BTreeMap<String, Span> = (spans.into_iter()).map(|s| (s.name.clone(), s)).collect();
    let names: Vec<&str> = named.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "charge",
            "chat qwen3.5-27b",
            "count",
            "forward",
            "queue_wait"
        ]
    );
    named
}

/// Every data point of the histogram `name`: its attributes and count.
fn histogram(metrics: &[Metric], name: &str) -> Vec<(BTreeMap<String, String>, u64)> {
    let Some(metric) = metrics.iter().find(|m| m.name == name) else {
        return Vec::new();
    };
    assert_eq!(metric.unit, "s");
    let Some(metric::Data::Histogram(h)) = &metric.data else {
        panic!("{name} is not a histogram");
    };
    assert_eq!(h.aggregation_temporality, 2, "cumulative");
    (h.data_points.iter())
        .map(|p| (attrs(&p.attributes), p.count))
        .collect()
}

/// The spans dropped so far, by reason.
fn dropped(metrics: &[Metric]) -> BTreeMap<String, i64> {
    let metric = (metrics.iter()).find(|m| m.name == "tokengate.otel.spans.dropped");
    let Some(metric::Data::Sum(sum)) = metric.and_then(|m| m.data.as_ref()) else {
        panic!("no dropped-span count");
    };
    assert!(sum.is_monotonic);
    (sum.data_points.iter())
        .map(|p| {
            let Some(number_data_point::Value::AsInt(n)) = p.value.as_ref() else {
                panic!("an integer count");
            };
            (attrs(&p.attributes)["reason"].clone(), *n)
        })
        .collect()
}

/// A request's span and its steps' reach the receiver exactly: the client's trace, one child
/// per step, the GenAI attributes with the tokens the request was charged; the backend's parent
/// is the forward span; and the GenAI server metrics count each request once per series.
#[tokio::test]
async fn a_requests_spans_and_the_genai_metrics_reach_an_otlp_receiver() {
    let mut receiver = Receiver::start(Hold::Never).await;
    let otel = receiver.config(64, Duration::from_secs(5));
    // The backend counts each prompt as 20 tokens: the span says what was charged, its count.
    let spec = FakeSpec {
        prompt_tokens: Some(20),
        ..FakeSpec::default()
    };
    let (gw, backend) = gateway_with(spec, |cfg| cfg.otel = Some(otel)).await;

    // A whole answer, in the client's trace.
    let r = chat_with(
        &gw,
        &chat("hi", 3, false),
        &[("traceparent", PARENT), ("tracestate", "congo=t61rcWkgMzE")],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let spans = by_name(receiver.spans_of(&hex::decode(TRACE_ID).unwrap(), 5).await);
    let root = &spans["chat qwen3.5-27b"];
    assert_eq!(root.parent_span_id, hex::decode(CLIENT_SPAN).unwrap());
    assert_eq!(root.kind, SpanKind::Server as i32);
    assert_eq!(root.trace_state, "congo=t61rcWkgMzE");
    assert_ne!(chat_tokens("hi"), 20);
    assert_eq!(
        attrs(&root.attributes),
        map(&[
            ("gen_ai.operation.name", "chat"),
            ("gen_ai.request.model", MODEL),
            ("gen_ai.request.max_tokens", "3"),
            ("gen_ai.usage.input_tokens", "20"),
            ("gen_ai.usage.output_tokens", "3"),
            ("http.response.status_code", "200"),
            ("tokengate.tenant", "alice"),
        ])
    );
    assert_eq!(root.status, None);
    assert_eq!(r.json()["usage"]["prompt_tokens"], 20);
    for step in ["count", "charge", "queue_wait", "forward"] {
        let span = &spans[step];
        assert_eq!(span.parent_span_id, root.span_id, "{step}");
        let kind = match step {
            "forward" => SpanKind::Client,
            _ => SpanKind::Internal,
        };
        assert_eq!(span.kind, kind as i32, "{step}");
        let attributes = match step {
            "forward" => map(&[
                ("server.address", "127.0.0.1"),
                ("server.port", &backend.addr.port().to_string()),
            ]),
            _ => BTreeMap::new(),
        };
        assert_eq!(attrs(&span.attributes), attributes, "{step}");
        assert_eq!(
            (span.start_time_unix_nano, span.end_time_unix_nano),
            (root.start_time_unix_nano, root.end_time_unix_nano),
            "{step}: the manual clock stood still"
        );
    }
    assert!(root.start_time_unix_nano > 0);
    // The backend's parent is the forward span, in the client's trace; its state passed on.
    let seen = backend.seen_headers.lock().unwrap().last().unwrap().clone();
    let forward = hex::encode(&spans["forward"].span_id);
    assert_eq!(
        seen["traceparent"].to_str().unwrap(),
        format!("00-{TRACE_ID}-{forward}-01")
    );
    assert_eq!(seen["tracestate"], "congo=t61rcWkgMzE");

    // A stream without a trace context starts a trace of its own.
    let r = chat_with(&gw, &chat("hello there", 4, true), &[]).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let seen = backend.seen_headers.lock().unwrap().last().unwrap().clone();
    let sent = seen["traceparent"].to_str().unwrap().to_owned();
    assert!(seen.get("tracestate").is_none());
    let trace_id = hex::decode(&sent[3..35]).unwrap();
    assert_ne!(trace_id, hex::decode(TRACE_ID).unwrap());
    let spans = by_name(receiver.spans_of(&trace_id, 5).await);
    let root = &spans["chat qwen3.5-27b"];
    assert!(root.parent_span_id.is_empty());
    assert_eq!(sent[36..52], hex::encode(&spans["forward"].span_id));
    let attributes = attrs(&root.attributes);
    assert_eq!(attributes["gen_ai.usage.input_tokens"], "20");
    assert_eq!(attributes["gen_ai.usage.output_tokens"], "4");

    // A refusal before the count: the request's span alone, with the error.
    let r = post(
        &gw.url("/v1/chat/completions"),
        "sk-nobody",
        &chat("hi", 3, false),
    )
    .await;
    assert_eq!(r.status, 401);
    let refused = BTreeMap::from([
        ("gen_ai.operation.name".to_owned(), "chat".to_owned()),
        ("error.type".to_owned(), "invalid_api_key".to_owned()),
    ]);
    let metrics = receiver
        .metrics_when(|m| {
            (histogram(m, "gen_ai.server.request.duration").iter()).any(|(a, _)| *a == refused)
        })
        .await;
    let model = || {
        map(&[
            ("gen_ai.operation.name", "chat"),
            ("gen_ai.request.model", MODEL),
        ])
    };
    assert_eq!(
        histogram(&metrics, "gen_ai.server.request.duration"),
        [(refused, 1), (model(), 2)]
    );
    // Only the stream has a first token and tokens after it.
    assert_eq!(
        histogram(&metrics, "gen_ai.server.time_to_first_token"),
        [(model(), 1)]
    );
    assert_eq!(
        histogram(&metrics, "gen_ai.server.time_per_output_token"),
        [(model(), 1)]
    );
    let duration = (metrics.iter())
        .find(|m| m.name == "gen_ai.server.request.duration")
        .unwrap();
    let Some(metric::Data::Histogram(h)) = &duration.data else {
        unreachable!()
    };
    for point in &h.data_points {
        assert_eq!(
            point.explicit_bounds,
            [
                0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96,
                81.92
            ]
        );
        assert_eq!(point.bucket_counts[0], point.count);
        assert_eq!(point.sum, Some(0.0));
    }
    assert_eq!(
        dropped(&metrics),
        BTreeMap::from([
            ("export_failed".to_owned(), 0),
            ("queue_full".to_owned(), 0)
        ])
    );
}

/// Without `[otel]` (the default) the client's trace context reaches the backend as sent, and
/// nothing reaches a receiver: only the spans of a gateway with `[otel]` do.
#[tokio::test]
async fn off_by_default_the_context_passes_as_sent_and_nothing_is_exported() {
    let mut receiver = Receiver::start(Hold::Never).await;
    let (off, off_backend) = gateway(FakeSpec::default()).await;
    assert_eq!(config(&[off_backend.addr]).otel, None);
    let r = chat_with(&off, &chat("hi", 2, false), &[("traceparent", PARENT)]).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let seen = off_backend
        .seen_headers
        .lock()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(seen["traceparent"], PARENT);

    let otel = receiver.config(64, Duration::from_secs(5));
    let (on, _backend) = gateway_with(FakeSpec::default(), |cfg| cfg.otel = Some(otel)).await;
    let other = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let r = chat_with(&on, &chat("hi", 2, false), &[("traceparent", other)]).await;
    assert_eq!(r.status, 200, "{}", r.text());
    receiver
        .spans_of(&hex::decode("0af7651916cd43dd8448eb211c80319c").unwrap(), 5)
        .await;
    // Every span received so far is the second gateway's.
    while let Ok(export) = receiver.traces.try_recv() {
        for span in (export.resource_spans.iter())
            .flat_map(|r| &r.scope_spans)
            .flat_map(|s| &s.spans)
        {
            assert_ne!(span.trace_id, hex::decode(TRACE_ID).unwrap());
        }
    }
}

/// A receiver that holds every export: requests are answered meanwhile; the finished spans past
/// `otel.max_queued_spans` are dropped and counted, and the ones queued go once it answers.
#[tokio::test]
async fn a_slow_receiver_holds_back_no_request_and_the_overflow_is_dropped_and_counted() {
    let mut receiver = Receiver::start(Hold::Each).await;
    let otel = receiver.config(2, Duration::from_secs(30));
    let (gw, backend) = gateway_with(FakeSpec::default(), |cfg| cfg.otel = Some(otel)).await;
    // The first export (the metrics, at start) is held: the exporter waits on it.
    receiver.arrived.recv().await.unwrap();
    let r = chat_with(&gw, &chat("hi", 3, false), &[("traceparent", PARENT)]).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(backend.seen.lock().unwrap().len(), 1);
    // count and charge fill the queue; queue_wait, forward and the request's span are dropped.
    receiver.release.add_permits(1_000);
    let spans = receiver.spans_of(&hex::decode(TRACE_ID).unwrap(), 2).await;
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["count", "charge"]);
    let metrics = receiver
        .metrics_when(|m| dropped(m)["queue_full"] > 0)
        .await;
    assert_eq!(
        dropped(&metrics),
        BTreeMap::from([
            ("export_failed".to_owned(), 0),
            ("queue_full".to_owned(), 3)
        ])
    );
    // The request was counted in the metrics all the same.
    assert_eq!(
        histogram(&metrics, "gen_ai.server.request.duration").len(),
        1
    );
    // Prometheus counts them too.
    assert_eq!(prometheus_dropped(&gw).await, (3, 0));
}

/// `tokengate_otel_spans_dropped_total`: the spans dropped because the queue was full, and
/// lost with exports that failed.
async fn prometheus_dropped(gw: &TestGateway) -> (u64, u64) {
    let count = |reason: &str, text: &str| -> u64 {
        let series = format!("tokengate_otel_spans_dropped_total{{reason=\"{reason}\"}} ");
        let line = text.lines().find_map(|l| l.strip_prefix(series.as_str()));
        line.expect("the series is exported with [otel]")
            .parse()
            .unwrap()
    };
    let text = gw.metrics().await;
    (count("queue_full", &text), count("export_failed", &text))
}

/// A receiver that never answers an export: that export is abandoned at
/// `otel.export_timeout` and the next ones go; requests are answered throughout.
#[tokio::test]
async fn a_hung_export_is_abandoned_at_its_timeout() {
    let mut receiver = Receiver::start(Hold::FirstForever).await;
    let otel = receiver.config(64, Duration::from_millis(200));
    let (gw, _backend) = gateway_with(FakeSpec::default(), |cfg| cfg.otel = Some(otel)).await;
    receiver.arrived.recv().await.unwrap();
    let r = chat_with(&gw, &chat("hi", 3, false), &[("traceparent", PARENT)]).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let spans = receiver.spans_of(&hex::decode(TRACE_ID).unwrap(), 5).await;
    assert_eq!(spans.len(), 5);
}

/// A receiver that is down changes nothing for requests.
#[tokio::test]
async fn a_receiver_that_is_down_changes_nothing_for_requests() {
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let otel = OtelConfig {
        endpoint: format!("http://{addr}"),
        service_name: "tokengate-test".to_owned(),
        export_interval: Duration::from_millis(10),
        export_timeout: Duration::from_millis(100),
        max_queued_spans: 4,
        max_export_batch: 1,
        sampling_ratio: 1.0,
    };
    let (gw, backend) = gateway_with(FakeSpec::default(), |cfg| cfg.otel = Some(otel)).await;
    for n in 1..=3 {
        let r = chat_within_10s(&gw, &chat("hi", 3, false), "an answer").await;
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(backend.seen.lock().unwrap().len(), n);
    }
    // Each of the 3 requests' 5 spans is lost, dropped from the full queue or with its failed
    // export, and said where the receiver cannot miss it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (full, failed) = prometheus_dropped(&gw).await;
        if full + failed == 15 {
            break;
        }
        assert!(
            full + failed < 15 && tokio::time::Instant::now() < deadline,
            "{full} dropped from a full queue and {failed} with failed exports, of 15"
        );
        tokio::task::yield_now().await;
    }
}

/// A client that leaves mid-stream ends its request's spans all the same (their guards drop):
/// the request's span says `client_disconnect` with the one token it was charged, the forward
/// span ends with it, and the request counts in the duration alone.
#[tokio::test]
async fn a_client_gone_mid_stream_ends_its_spans_with_the_error() {
    let mut receiver = Receiver::start(Hold::Never).await;
    let otel = receiver.config(64, Duration::from_secs(5));
    let spec = FakeSpec {
        usage: false,
        ..FakeSpec::held()
    };
    let (gw, backend) = gateway_with(spec, |cfg| cfg.otel = Some(otel)).await;
    let client = first_event_then_leave(gw.url("/v1/chat/completions"), chat("a", 50, true));
    backend.wait_held(1).await;
    client.await.unwrap();
    let seen = backend.seen_headers.lock().unwrap().last().unwrap().clone();
    let sent = seen["traceparent"].to_str().unwrap().to_owned();
    let spans = by_name(
        receiver
            .spans_of(&hex::decode(&sent[3..35]).unwrap(), 5)
            .await,
    );
    let root = &spans["chat qwen3.5-27b"];
    let prompt = chat_tokens("a").to_string();
    assert_eq!(
        attrs(&root.attributes),
        map(&[
            ("gen_ai.operation.name", "chat"),
            ("gen_ai.request.model", MODEL),
            ("gen_ai.request.max_tokens", "50"),
            ("gen_ai.usage.input_tokens", prompt.as_str()),
            ("gen_ai.usage.output_tokens", "1"),
            ("http.response.status_code", "200"),
            ("tokengate.tenant", "alice"),
            ("error.type", "client_disconnect"),
        ])
    );
    let status = root.status.clone().unwrap();
    assert_eq!(
        (status.code, status.message.as_str()),
        (2, "client_disconnect")
    );
    assert_eq!(sent[36..52], hex::encode(&spans["forward"].span_id));
    let gone = map(&[
        ("gen_ai.operation.name", "chat"),
        ("gen_ai.request.model", MODEL),
        ("error.type", "client_disconnect"),
    ]);
    let metrics = receiver
        .metrics_when(|m| !histogram(m, "gen_ai.server.request.duration").is_empty())
        .await;
    assert_eq!(
        histogram(&metrics, "gen_ai.server.request.duration"),
        [(gone, 1)]
    );
    // A first token streamed, but the conventions count latencies of successful answers only.
    assert_eq!(histogram(&metrics, "gen_ai.server.time_to_first_token"), []);
}

/// A clean stop sends what waits: the spans that never filled a batch and the last metrics
/// go before the gateway's shutdown returns, an interval or not.
#[tokio::test]
async fn a_clean_stop_sends_the_spans_and_metrics_left() {
    let mut receiver = Receiver::start(Hold::Never).await;
    let otel = OtelConfig {
        // Only the metrics at start go before the stop: the batch is never full.
        export_interval: Duration::from_secs(3600),
        max_export_batch: 64,
        ..receiver.config(64, Duration::from_secs(5))
    };
    let (gw, _backend) = gateway_with(FakeSpec::default(), |cfg| cfg.otel = Some(otel)).await;
    let at_start = receiver.metrics_when(|_| true).await;
    assert!(histogram(&at_start, "gen_ai.server.request.duration").is_empty());
    let r = chat_with(&gw, &chat("hi", 3, false), &[("traceparent", PARENT)]).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(receiver.traces.try_recv().is_err());
    gw.running.shutdown().await;
    let spans = by_name(receiver.spans_of(&hex::decode(TRACE_ID).unwrap(), 5).await);
    assert_eq!(spans.len(), 5);
    let last = receiver
        .metrics
        .try_recv()
        .expect("the last metrics, sent before the stop returned");
    let last: Vec<Metric> = (last.resource_metrics.into_iter())
        .flat_map(|r| r.scope_metrics)
        .flat_map(|s| s.metrics)
        .collect();
    let model = map(&[
        ("gen_ai.operation.name", "chat"),
        ("gen_ai.request.model", MODEL),
    ]);
    assert_eq!(
        histogram(&last, "gen_ai.server.request.duration"),
        [(model, 1)]
    );
}

/// A request whose caller's trace is not sampled (flags `00`), and one without a trace context
/// at `otel.sampling_ratio` 0, record no span: the backend gets the client's context as sent
/// (none for the second), and both count in the metrics. A sampled caller's trace is recorded.
#[tokio::test]
async fn an_unsampled_trace_records_no_span_and_counts_in_the_metrics() {
    let mut receiver = Receiver::start(Hold::Never).await;
    let otel = OtelConfig {
        sampling_ratio: 0.0,
        ..receiver.config(64, Duration::from_secs(5))
    };
    let (gw, backend) = gateway_with(FakeSpec::default(), |cfg| cfg.otel = Some(otel)).await;
    let unsampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
    let r = chat_with(
        &gw,
        &chat("hi", 3, false),
        &[
            ("traceparent", unsampled),
            ("tracestate", "congo=t61rcWkgMzE"),
        ],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let seen = backend.seen_headers.lock().unwrap().last().unwrap().clone();
    assert_eq!(seen["traceparent"], unsampled);
    assert_eq!(seen["tracestate"], "congo=t61rcWkgMzE");
    let r = chat_with(&gw, &chat("hi", 3, false), &[]).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let seen = backend.seen_headers.lock().unwrap().last().unwrap().clone();
    assert!(seen.get("traceparent").is_none());
    // A sampled caller is followed whatever the ratio; its spans come after any of the others.
    let sampled = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let r = chat_with(&gw, &chat("hi", 3, false), &[("traceparent", sampled)]).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let trace_id = hex::decode("0af7651916cd43dd8448eb211c80319c").unwrap();
    let mut exported = Vec::new();
    while exported
        .iter()
        .filter(|s: &&Span| s.trace_id == trace_id)
        .count()
        < 5
    {
        let export = tokio::time::timeout(Duration::from_secs(10), receiver.traces.recv())
            .await
            .expect("the sampled spans within 10 s")
            .unwrap();
        exported.extend(
            (export.resource_spans.into_iter())
                .flat_map(|r| r.scope_spans)
                .flat_map(|s| s.spans),
        );
    }
    assert_eq!(exported.len(), 5, "only the sampled trace's spans");
    let model = map(&[
        ("gen_ai.operation.name", "chat"),
        ("gen_ai.request.model", MODEL),
    ]);
    let metrics = receiver
        .metrics_when(|m| {
            let counts = histogram(m, "gen_ai.server.request.duration");
            counts.first().is_some_and(|(_, n)| *n == 3)
        })
        .await;
    assert_eq!(
        histogram(&metrics, "gen_ai.server.request.duration"),
        [(model, 3)]
    );
}
