//! A request's spans: the request's own ([`RequestTrace`], kind SERVER, named
//! `{gen_ai.operation.name} {gen_ai.request.model}` as the GenAI semantic conventions name an
//! inference span) and one child per step it went through ([`StepSpan`]: `count`, `charge`,
//! `queue_wait`, `forward`). Each is a guard: it ends when dropped, whatever ended the request
//! (an answer, a refusal, a client gone), and its end queues it for export and counts the
//! request's duration and latencies in the GenAI server metrics.

use super::attribute::{int, string};
use super::export::{unix_nanos, Shared};
use super::histograms::{Instrument, Series};
use http::{HeaderName, HeaderValue};
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::trace::v1::{span::SpanKind, status::StatusCode, Span, Status};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::time::Instant;

/// The W3C trace flags the gateway sends: sampled (every request's spans are recorded).
const SAMPLED: &str = "01";

/// A request's span, shared by the steps that note what they learn in it; it ends when the last
/// holder lets go (the answer's end, through the request's settlement).
#[derive(Clone, Debug)]
pub struct RequestTrace(Arc<Root>);

#[derive(Debug)]
struct Root {
    shared: Arc<Shared>,
    trace_id: [u8; 16],
    span_id: [u8; 8],
    /// The client's span, when its `traceparent` was valid.
    parent: Option<[u8; 8]>,
    /// The client's `tracestate`, passed on beside the gateway's `traceparent`.
    tracestate: Option<HeaderValue>,
    /// Whether its spans are recorded: the caller's `sampled` flag, else `otel.sampling_ratio`.
    sampled: bool,
    /// The client's trace context as kept: what the backend gets when the spans are not
    /// recorded (the gateway then stays outside the trace, as without `[otel]`).
    context: Vec<(HeaderName, HeaderValue)>,
    started: Instant,
    /// `started` on the wall clock, Unix milliseconds.
    wall_ms: i64,
    operation: &'static str,
    notes: Mutex<Notes>,
}

/// What the request's steps noted.
#[derive(Debug, Default)]
struct Notes {
    tenant: Option<String>,
    model: Option<String>,
    max_tokens: Option<u64>,
    status: Option<u16>,
    error: Option<&'static str>,
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    ttft: Option<Duration>,
    tpot: Option<Duration>,
}

/// How a request settled, as its span tells it.
#[derive(Clone, Copy, Debug)]
pub struct Settled {
    /// The prompt tokens charged (the backend's count when it said one).
    pub input_tokens: u64,
    /// The output tokens produced.
    pub output_tokens: u64,
    /// Time to first token, when one streamed.
    pub ttft: Option<Duration>,
    /// Time per output token after the first, when two or more streamed.
    pub tpot: Option<Duration>,
    /// The outcome when the request failed after its answer began (cut off, client gone).
    pub failed: Option<&'static str>,
}

/// A random id that is not all zeros (the W3C recommendation's invalid id).
fn id<const N: usize>() -> [u8; N] {
    loop {
        let bytes: [u8; N] = std::array::from_fn(|_| rand::random());
        if bytes.iter().any(|&b| b != 0) {
            return bytes;
        }
    }
}

/// The trace and span ids of a valid `traceparent`, and its `sampled` flag.
fn parse_parent(value: &HeaderValue) -> Option<([u8; 16], [u8; 8], bool)> {
    let text = value.to_str().ok()?;
    let trace = hex::decode(text.get(3..35)?).ok()?;
    let span = hex::decode(text.get(36..52)?).ok()?;
    let flags = u8::from_str_radix(text.get(53..55)?, 16).ok()?;
    Some((
        trace.try_into().ok()?,
        span.try_into().ok()?,
        flags & 1 == 1,
    ))
}

impl RequestTrace {
    /// The span of a request of `operation` whose client sent `context` (what
    /// [`crate::trace_context::passed_on`] keeps of its trace context): a child of the client's
    /// span, recorded when the client's is, else the root of a new trace, recorded at
    /// `otel.sampling_ratio`.
    pub(super) fn start(
        shared: Arc<Shared>,
        operation: &'static str,
        context: Vec<(HeaderName, HeaderValue)>,
    ) -> Self {
        let header = |name: &HeaderName| (context.iter()).find(|(n, _)| n == name).map(|(_, v)| v);
        let parent = header(&crate::trace_context::TRACEPARENT).and_then(parse_parent);
        let tracestate = (parent.is_some())
            .then(|| header(&crate::trace_context::TRACESTATE).cloned())
            .flatten();
        let sampled = parent.map_or_else(|| shared.sampled(), |(_, _, sampled)| sampled);
        let started = shared.clock.now();
        let wall_ms = shared.clock.wall_ms();
        Self(Arc::new(Root {
            trace_id: parent.map_or_else(id, |(trace, _, _)| trace),
            span_id: id(),
            parent: parent.map(|(_, span, _)| span),
            tracestate,
            sampled,
            context,
            started,
            wall_ms,
            operation,
            notes: Mutex::new(Notes::default()),
            shared,
        }))
    }

    fn note(&self, f: impl FnOnce(&mut Notes)) {
        f(&mut self.0.notes.lock().unwrap_or_else(PoisonError::into_inner));
    }

    /// The tenant, once authenticated (noted once).
    pub(super) fn tenant(&self, name: &str) {
        self.note(|n| {
            if n.tenant.is_none() {
                n.tenant = Some(name.to_owned());
            }
        });
    }

    /// The model named and the output limit asked for, once the request is counted.
    pub(super) fn request(&self, model: &str, max_tokens: Option<u64>) {
        self.note(|n| (n.model, n.max_tokens) = (Some(model.to_owned()), max_tokens));
    }

    /// The answer's status, and the error's code when it is an error.
    pub(super) fn answered(&self, status: u16, error: Option<&'static str>) {
        self.note(|n| {
            n.status = Some(status);
            n.error = n.error.or(error);
        });
    }

    /// What the request's settlement knows.
    pub(super) fn settled(&self, s: Settled) {
        self.note(|n| {
            n.input_tokens = Some(s.input_tokens);
            n.output_tokens = Some(s.output_tokens);
            (n.ttft, n.tpot) = (s.ttft, s.tpot);
            n.error = n.error.or(s.failed);
        });
    }

    /// A child span for `step`, starting now.
    pub(super) fn step(&self, step: Step) -> StepSpan {
        StepSpan {
            root: self.clone(),
            span_id: id(),
            step,
            started: self.0.shared.clock.now(),
            attributes: Vec::new(),
        }
    }
}

impl Root {
    /// `at` as Unix nanoseconds.
    fn unix_nanos(&self, at: Instant) -> u64 {
        unix_nanos(self.wall_ms, at.saturating_duration_since(self.started))
    }

    fn span(
        &self,
        span_id: [u8; 8],
        parent: Option<[u8; 8]>,
        name: String,
        kind: SpanKind,
    ) -> Span {
        Span {
            trace_id: self.trace_id.to_vec(),
            span_id: span_id.to_vec(),
            parent_span_id: parent.map_or_else(Vec::new, |p| p.to_vec()),
            name,
            kind: kind as i32,
            ..Default::default()
        }
    }
}

impl Drop for Root {
    fn drop(&mut self) {
        let ended = self.shared.clock.now();
        let notes = std::mem::take(self.notes.get_mut().unwrap_or_else(PoisonError::into_inner));
        let series = Series {
            operation: self.operation,
            model: notes.model.clone(),
            error: notes.error,
        };
        let histograms = &self.shared.histograms;
        let duration = ended.saturating_duration_since(self.started);
        histograms.observe(Instrument::Duration, &series, duration);
        // The conventions count the token latencies of successful responses only.
        if notes.error.is_none() {
            if let Some(ttft) = notes.ttft {
                histograms.observe(Instrument::TimeToFirstToken, &series, ttft);
            }
            if let Some(tpot) = notes.tpot {
                histograms.observe(Instrument::TimePerOutputToken, &series, tpot);
            }
        }
        if !self.sampled {
            return;
        }
        let name = match &notes.model {
            Some(model) => format!("{} {model}", self.operation),
            None => self.operation.to_owned(),
        };
        let mut span = self.span(self.span_id, self.parent, name, SpanKind::Server);
        span.start_time_unix_nano = self.unix_nanos(self.started);
        span.end_time_unix_nano = self.unix_nanos(ended);
        if let Some(state) = (self.tracestate.as_ref()).and_then(|s| s.to_str().ok()) {
            state.clone_into(&mut span.trace_state);
        }
        let a = &mut span.attributes;
        a.push(string("gen_ai.operation.name", self.operation));
        let numbers = [
            ("gen_ai.request.max_tokens", notes.max_tokens),
            ("gen_ai.usage.input_tokens", notes.input_tokens),
            ("gen_ai.usage.output_tokens", notes.output_tokens),
            ("http.response.status_code", notes.status.map(u64::from)),
        ];
        if let Some(model) = &notes.model {
            a.push(string("gen_ai.request.model", model));
        }
        a.extend((numbers.into_iter()).filter_map(|(k, v)| Some(int(k, v?))));
        if let Some(tenant) = &notes.tenant {
            a.push(string("tokengate.tenant", tenant));
        }
        if let Some(error) = notes.error {
            a.push(string("error.type", error));
            span.status = Some(Status {
                message: error.to_owned(),
                code: StatusCode::Error as i32,
            });
        }
        self.shared.finished(span);
    }
}

/// A step of the request path with a span of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Parsing and counting the prompt.
    Count,
    /// The in-flight cap, the quotas and the buckets.
    Charge,
    /// Admission by KV footprint, waiting in the queue when it must.
    QueueWait,
    /// The backend's part: from sending the request to the end of its answer.
    Forward,
}

impl Step {
    fn name(self) -> &'static str {
        match self {
            Step::Count => "count",
            Step::Charge => "charge",
            Step::QueueWait => "queue_wait",
            Step::Forward => "forward",
        }
    }
}

/// A step's span: a child of the request's, ended when dropped.
#[derive(Debug)]
pub struct StepSpan {
    root: RequestTrace,
    span_id: [u8; 8],
    step: Step,
    started: Instant,
    attributes: Vec<KeyValue>,
}

impl StepSpan {
    /// The trace context the backend gets: the gateway's `traceparent` naming this span, and
    /// the client's `tracestate` when it sent one; the client's context as sent when the spans
    /// are not recorded.
    pub fn passed_on(&self) -> Vec<(HeaderName, HeaderValue)> {
        let root = &self.root.0;
        if !root.sampled {
            return root.context.clone();
        }
        let parent = format!(
            "00-{}-{}-{SAMPLED}",
            hex::encode(root.trace_id),
            hex::encode(self.span_id)
        );
        let mut context = vec![(
            crate::trace_context::TRACEPARENT,
            HeaderValue::from_str(&parent).expect("hex and dashes"),
        )];
        if let Some(state) = &root.tracestate {
            context.push((crate::trace_context::TRACESTATE, state.clone()));
        }
        context
    }

    /// The backend at `host` and `port` is the server this step calls (`server.address`,
    /// `server.port`).
    pub fn server(&mut self, (host, port): (&str, u16)) {
        self.attributes.push(string("server.address", host));
        self.attributes.push(int("server.port", u64::from(port)));
    }

    /// The request settled so: noted in the request's span.
    pub fn settled(&self, settled: Settled) {
        self.root.settled(settled);
    }
}

impl Drop for StepSpan {
    fn drop(&mut self) {
        let root = &self.root.0;
        if !root.sampled {
            return;
        }
        let kind = match self.step {
            Step::Forward => SpanKind::Client,
            _ => SpanKind::Internal,
        };
        let name = self.step.name().to_owned();
        let mut span = root.span(self.span_id, Some(root.span_id), name, kind);
        span.attributes = std::mem::take(&mut self.attributes);
        span.start_time_unix_nano = root.unix_nanos(self.started);
        span.end_time_unix_nano = root.unix_nanos(root.shared.clock.now());
        root.shared.finished(span);
    }
}
