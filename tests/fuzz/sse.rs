//! Target `sse`: a backend's streamed answer through the gateway's metered body
//! (`MeteredStream`: SSE splitting, chunk inspection, the bound on one event, settlement of
//! the reservation), fed as frames cut at arbitrary points.
//!
//! Streams are either well-formed OpenAI chunk streams (content, reasoning, completion text,
//! tool calls, usage chunks, `[DONE]`, comments, named events, data split over several lines,
//! LF or CRLF line ends, an unfinished last event) or arbitrary bytes with SSE markup sprinkled
//! in; the bound on one event (`backends[].max_event_bytes`) is often small enough to be hit.
//! Properties:
//! - the client sees the same bytes and the request settles with the same output tokens however
//!   the stream is cut into frames (compared with the same stream sent as one frame);
//! - the client sees the backend's events in order, less the usage-only chunks unless it asked
//!   for usage; an event over the bound (or an unfinished one growing past it) ends the stream
//!   with an `upstream_error` event in OpenAI's shape, and nothing of it or after it is sent:
//!   the gateway never buffers more than the bound of one event;
//! - a well-formed stream settles at the last `completion_tokens` it reported before any cut
//!   (capped at what was reserved) or, without usage, at the token count of the text generated
//!   before it;
//! - nothing panics, and every stream settles (the lease is freed, the reservation settled).

use crate::gen::text;
use bytes::Bytes;
use futures_util::stream;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use proptest::prelude::*;
use proptest::sample::{select, Index};
use proptest::test_runner::TestCaseError;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokengate::admission::{Admission, BackendSpec, ClassShares, QueueSpec};
use tokengate::api::Wire;
use tokengate::clock::SystemClock;
use tokengate::limiter::{BucketSpec, Cost, Limiter, LocalStore, Settlement, TenantLimits};
use tokengate::metrics::SettleMetrics;
use tokengate::proxy::meter::{Admitted, MeteredStream, OutputCounter};
use tokengate::settle::{Reconcile, Ticket, COUNT_WARNING_PERIOD};
use tokengate::tenant::Tenant;
use tokengate::tokenize::TokenizePool;
use tokengate::util::throttle::Throttle;
use tokio::sync::mpsc;

/// One choice of a chunk: what the backend generated for it.
#[derive(Debug, Clone)]
enum Choice {
    /// A chat delta.
    Delta {
        content: Option<String>,
        reasoning: Option<String>,
        tool_call: Option<(String, String)>,
    },
    /// A completion choice: its text, no delta.
    Text(String),
}

/// One event of a well-formed stream.
#[derive(Debug, Clone)]
enum Event {
    Chunk {
        choices: Vec<Choice>,
        usage: Option<u64>,
    },
    /// vLLM's last chunk with `include_usage`: no choices, only usage.
    UsageOnly(u64),
    Done,
    Comment(String),
    /// `event: NAME` and a JSON payload without choices.
    Named,
}

impl Event {
    fn payload(&self) -> Option<Value> {
        match self {
            Event::Chunk { choices, usage } => {
                let choices: Vec<Value> = choices
                    .iter()
                    .enumerate()
                    .map(|(i, c)| match c {
                        Choice::Text(t) => json!({"index": i, "text": t, "finish_reason": null}),
                        Choice::Delta {
                            content,
                            reasoning,
                            tool_call,
                        } => {
                            let mut delta = serde_json::Map::new();
                            if let Some(r) = reasoning {
                                // vLLM 0.32's field, or the one older versions send.
                                let field = if r.len() % 2 == 0 {
                                    "reasoning"
                                } else {
                                    "reasoning_content"
                                };
                                delta.insert(field.into(), json!(r));
                            }
                            if let Some(t) = content {
                                delta.insert("content".into(), json!(t));
                            }
                            if let Some((name, args)) = tool_call {
                                delta.insert(
                                    "tool_calls".into(),
                                    json!([{"index": 0, "function": {"name": name, "arguments": args}}]),
                                );
                            }
                            json!({"index": i, "delta": delta, "finish_reason": null})
                        }
                    })
                    .collect();
                let mut v = json!({"id": "cmpl-1", "object": "chat.completion.chunk",
                    "created": 1, "model": "m", "choices": choices});
                if let Some(n) = usage {
                    v["usage"] = json!({"prompt_tokens": 3, "completion_tokens": n,
                        "total_tokens": 3 + n});
                }
                Some(v)
            }
            Event::UsageOnly(n) => Some(json!({"id": "cmpl-1", "choices": [],
                "usage": {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": 3 + n}})),
            Event::Named => Some(json!({"type": "ping"})),
            Event::Done | Event::Comment(_) => None,
        }
    }

    /// The event as the backend sends it, lines ended by `eol`; `multiline` spreads the JSON
    /// over several `data:` lines (joined with newlines by the reader: still the same JSON).
    fn render(&self, eol: &str, multiline: bool, space: bool) -> String {
        let field = if space { "data: " } else { "data:" };
        let mut out = String::new();
        match self {
            Event::Done => out.push_str(&format!("{field}[DONE]{eol}")),
            Event::Comment(c) => {
                out.push_str(&format!(": {}{eol}", c.replace(['\r', '\n'], " ")));
            }
            _ => {
                if let Event::Named = self {
                    out.push_str(&format!("event: ping{eol}"));
                }
                let payload = self.payload().expect("a data event");
                if multiline {
                    // Pretty JSON breaks lines only between tokens (strings escape theirs).
                    let json = serde_json::to_string_pretty(&payload).expect("JSON");
                    for line in json.lines() {
                        out.push_str(&format!("{field}{line}{eol}"));
                    }
                } else {
                    out.push_str(&format!("{field}{payload}{eol}"));
                }
            }
        }
        out.push_str(eol);
        out
    }

    fn is_usage_only(&self) -> bool {
        match self {
            Event::UsageOnly(_) => true,
            Event::Chunk { choices, usage } => usage.is_some() && choices.is_empty(),
            _ => false,
        }
    }

    /// The text the gateway counts when the backend reports no usage, in the order it reads it.
    fn generated_text(&self, out: &mut String) {
        if let Event::Chunk { choices, .. } = self {
            for c in choices {
                match c {
                    Choice::Text(t) => out.push_str(t),
                    Choice::Delta {
                        content,
                        reasoning,
                        tool_call,
                    } => {
                        for part in [reasoning, content].into_iter().flatten() {
                            out.push_str(part);
                        }
                        if let Some((name, args)) = tool_call {
                            out.push_str(name);
                            out.push_str(args);
                        }
                    }
                }
            }
        }
    }

    fn usage(&self) -> Option<u64> {
        match self {
            Event::Chunk { usage, .. } => *usage,
            Event::UsageOnly(n) => Some(*n),
            _ => None,
        }
    }
}

fn choice() -> impl Strategy<Value = Choice> {
    prop_oneof![
        8 => (
            prop::option::of(text()),
            prop::option::of(text()),
            prop::option::weighted(0.1, (text(), text())),
        )
            .prop_map(|(content, reasoning, tool_call)| Choice::Delta {
                content,
                reasoning,
                tool_call,
            }),
        1 => text().prop_map(Choice::Text),
    ]
}

fn event(with_usage: bool) -> impl Strategy<Value = Event> {
    let chunk = |usage: BoxedStrategy<Option<u64>>| {
        (prop::collection::vec(choice(), 0..3), usage)
            .prop_map(|(choices, usage)| Event::Chunk { choices, usage })
    };
    let others = prop_oneof![
        Just(Event::Done),
        text().prop_map(Event::Comment),
        Just(Event::Named),
    ];
    if with_usage {
        prop_oneof![
            12 => chunk(prop::option::weighted(0.2, 0..100_000u64).boxed()),
            1 => (0..100_000u64).prop_map(Event::UsageOnly),
            3 => others,
        ]
        .boxed()
    } else {
        prop_oneof![12 => chunk(Just(None).boxed()), 3 => others].boxed()
    }
}

/// A backend's byte stream and what it must meter to.
#[derive(Clone)]
struct Stream {
    bytes: Vec<u8>,
    /// For well-formed streams: the events and the length of each as sent, to compute the
    /// expected outcome from.
    events: Option<Vec<(Event, usize)>>,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("bytes", &format_args!("b\"{}\"", self.bytes.escape_ascii()))
            .field("events", &self.events)
            .finish()
    }
}

fn well_formed() -> impl Strategy<Value = Stream> {
    any::<bool>()
        .prop_flat_map(|with_usage| {
            (
                prop::collection::vec(
                    (
                        event(with_usage),
                        select(vec!["\n", "\r\n"]),
                        prop::bool::weighted(0.1),
                        any::<bool>(),
                    ),
                    0..12,
                ),
                prop::option::weighted(0.2, "data: \\{\"choices\":\\[[a-z\"{}:, ]{0,20}"),
            )
        })
        .prop_map(|(events, tail)| {
            let mut bytes = String::new();
            let mut sent = Vec::new();
            for (e, eol, multiline, space) in events {
                let rendered = e.render(eol, multiline, space);
                bytes.push_str(&rendered);
                sent.push((e, rendered.len()));
            }
            if let Some(tail) = tail {
                bytes.push_str(&tail);
            }
            Stream {
                bytes: bytes.into_bytes(),
                events: Some(sent),
            }
        })
}

fn arbitrary_bytes() -> impl Strategy<Value = Stream> {
    prop::collection::vec(
        prop_oneof![
            4 => prop::collection::vec(any::<u8>(), 0..24),
            2 => select(vec![
                "\n\n", "\r\n\r\n", "\r\n", "\n", "\r\r", "data: ", "data:", "[DONE]", ": x",
                "{\"choices\":[]", "\"usage\":{\"completion_tokens\":7}}",
                "{\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}",
            ])
            .prop_map(|s| s.as_bytes().to_vec()),
            1 => text().prop_map(String::into_bytes),
        ],
        0..24,
    )
    .prop_map(|parts| Stream {
        bytes: parts.concat(),
        events: None,
    })
}

#[derive(Debug, Clone)]
struct Case {
    stream: Stream,
    /// Where the stream is cut into frames (empty frames included).
    cuts: Vec<Index>,
    client_wants_usage: bool,
    reserved: u64,
    /// The bound on one event (`backends[].max_event_bytes`): often small enough to be hit.
    max_event_bytes: u64,
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop_oneof![3 => well_formed(), 1 => arbitrary_bytes()],
        prop::collection::vec(any::<Index>(), 0..16),
        any::<bool>(),
        prop_oneof![1..50u64, 1..200_000u64],
        prop_oneof![2 => Just(1u64 << 20), 1 => 1..600u64],
    )
        .prop_map(
            |(stream, cuts, client_wants_usage, reserved, max_event_bytes)| Case {
                stream,
                cuts,
                client_wants_usage,
                reserved,
                max_event_bytes,
            },
        )
}

fn frames(bytes: &[u8], cuts: &[Index]) -> Vec<Bytes> {
    let mut at: Vec<usize> = cuts.iter().map(|i| i.index(bytes.len() + 1)).collect();
    at.sort_unstable();
    let mut frames = Vec::new();
    let mut start = 0;
    for end in at.into_iter().chain([bytes.len()]) {
        frames.push(Bytes::copy_from_slice(&bytes[start..end]));
        start = end;
    }
    frames
}

/// The gateway's parts a metered stream needs, shared by every case.
struct Harness {
    runtime: tokio::runtime::Runtime,
    limiter: Limiter,
    admission: Admission,
    tenant: Arc<Tenant>,
    metrics: Arc<SettleMetrics>,
    pool: Arc<TokenizePool>,
    settled: std::sync::Mutex<mpsc::UnboundedReceiver<Settlement>>,
}

fn harness() -> &'static Harness {
    static HARNESS: OnceLock<Harness> = OnceLock::new();
    HARNESS.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let (tx, rx) = mpsc::unbounded_channel();
        let limiter = Limiter::new(Arc::new(LocalStore::default()), Arc::new(SystemClock))
            .with_settle_hook(Arc::new(move |_, s: &Settlement| {
                let _ = tx.send(*s);
            }));
        let plenty = BucketSpec {
            rate_per_second: 1e12,
            burst_seconds: 1.0,
        };
        let tenant = Arc::new(Tenant::new(
            "fuzz",
            TenantLimits {
                prefill: plenty,
                decode: plenty,
                requests: plenty,
            },
        ));
        let admission = Admission::new(
            vec![BackendSpec {
                name: "backend".into(),
                kv_capacity_bytes: 1 << 40,
                max_batch: 1_000,
                engine: false,
            }],
            QueueSpec {
                max_waiting: 1,
                deadline: Duration::from_secs(1),
                shares: ClassShares::FULL,
            },
        );
        Harness {
            runtime,
            limiter,
            admission,
            tenant,
            metrics: Arc::default(),
            pool: Arc::new(TokenizePool::new("fuzz-sse", 1, 4)),
            settled: std::sync::Mutex::new(rx),
        }
    })
}

/// Streams `frames` through a metered body; returns what the client got and the settlement.
fn meter(frames: Vec<Bytes>, case: &Case) -> (Vec<u8>, Settlement) {
    let h = harness();
    let mut settled = h.settled.lock().expect("one case at a time");
    h.runtime.block_on(async {
        let cost = Cost {
            prefill: 1,
            decode: case.reserved,
            requests: 1,
        };
        let reservation = h
            .limiter
            .reserve(&h.tenant.name, &h.tenant.limits, cost)
            .await
            .expect("the bucket is ample");
        let lease = h
            .admission
            .admit(
                &h.tenant.name,
                h.tenant.priority,
                tokengate::admission::Need {
                    bytes: 1,
                    prompt_tokens: 1,
                    output_tokens: case.reserved,
                    sequences: 1,
                    alone: None,
                    in_turns: false,
                },
            )
            .await
            .expect("KV is ample");
        let mut ticket = Ticket::new(reservation);
        ticket.admit(lease);
        let admitted = Admitted::new(
            h.tenant.clone(),
            ticket,
            h.metrics.clone(),
            OutputCounter {
                wire: Wire::OpenAi,
                tokenizer: crate::common::tokenizer(),
                pool: h.pool.clone(),
                replies: None,
            },
            Reconcile {
                backend: "fuzz".to_string(),
                request_id: None,
                cached_prefill_weight: 0.1,
                most_prompt_tokens: u64::MAX,
                warnings: Arc::new(Throttle::every(COUNT_WARNING_PERIOD, Arc::new(SystemClock))),
            },
            tokio::time::Instant::now(),
            None,
        );
        let mut frames = frames.into_iter();
        let first = frames.next().unwrap_or_default();
        let rest = StreamBody::new(stream::iter(
            frames.map(|f| Ok::<_, Infallible>(Frame::data(f))),
        ));
        let body = MeteredStream::new(
            rest,
            first,
            admitted,
            case.client_wants_usage,
            Duration::from_secs(60),
            case.max_event_bytes,
        );
        let out = body
            .collect()
            .await
            .expect("infallible")
            .to_bytes()
            .to_vec();
        // Settlement happens when the body ends, or on the pool when the text must be counted.
        let settlement = tokio::time::timeout(Duration::from_secs(30), settled.recv())
            .await
            .expect("the stream settles")
            .expect("the hook is alive");
        assert_eq!(
            h.admission.snapshot().backends[0].kv_reserved_bytes,
            0,
            "the lease is freed"
        );
        (out, settlement)
    })
}

/// Splits `out` into what the backend's events gave and the gateway's error event ending a
/// stream cut short, if it ends with one (checking that it is one: OpenAI's shape, code
/// `upstream_error`).
fn split_error(out: &[u8]) -> Result<(&[u8], bool), TestCaseError> {
    const START: &[u8] = b"data: {\"error\":";
    let Some(at) = out.windows(START.len()).rposition(|w| w == START) else {
        return Ok((out, false));
    };
    let event = &out[at..];
    let Some(json) = event
        .strip_prefix(b"data: ")
        .and_then(|e| e.strip_suffix(b"\n\n"))
        .and_then(|j| serde_json::from_slice::<Value>(j).ok())
    else {
        return Ok((out, false));
    };
    prop_assert_eq!(&json["error"]["code"], "upstream_error", "{}", json);
    prop_assert_eq!(json["error"].as_object().map(|e| e.len()), Some(4));
    Ok((&out[..at], true))
}

fn check(case: Case) -> Result<(), TestCaseError> {
    let bytes = &case.stream.bytes;
    let (whole, whole_settled) = meter(vec![Bytes::copy_from_slice(bytes)], &case);
    let (cut, cut_settled) = meter(frames(bytes, &case.cuts), &case);
    prop_assert_eq!(
        &cut,
        &whole,
        "the cut stream reached the client differently"
    );
    prop_assert_eq!(cut_settled, whole_settled);
    prop_assert!(!whole_settled.refunded_all);
    prop_assert_eq!(
        whole_settled.actual_decode + whole_settled.refunded_decode,
        case.reserved
    );
    let Some(events) = &case.stream.events else {
        // Arbitrary bytes: what the client gets is the backend's bytes (all of them, or only
        // the events before one over the bound, then the error event), less dropped usage
        // chunks.
        let (forwarded, _) = split_error(&whole)?;
        if case.client_wants_usage {
            prop_assert!(
                bytes.starts_with(forwarded),
                "the client got bytes the backend did not send"
            );
        }
        prop_assert!(forwarded.len() <= bytes.len());
        return Ok(());
    };
    // Independent expectations from the events themselves: every event in order until one is
    // over the bound, then the error event; the unfinished tail, unless it is over the bound.
    let bound = usize::try_from(case.max_event_bytes).unwrap_or(usize::MAX);
    let mut expected = Vec::new();
    let mut offset = 0;
    let mut text = String::new();
    let mut usage = None;
    let mut cut_short = false;
    for (e, len) in events {
        if *len > bound {
            cut_short = true;
            break;
        }
        let raw = &bytes[offset..offset + len];
        offset += len;
        if case.client_wants_usage || !e.is_usage_only() {
            expected.extend_from_slice(raw);
        }
        e.generated_text(&mut text);
        usage = e.usage().or(usage);
    }
    let tail = &bytes[offset..];
    if !cut_short && tail.len() > bound {
        cut_short = true;
    }
    let (forwarded, ended_with_error) = split_error(&whole)?;
    prop_assert_eq!(ended_with_error, cut_short);
    if !cut_short {
        expected.extend_from_slice(tail);
    }
    prop_assert_eq!(forwarded, &expected[..]);
    if case.client_wants_usage && !cut_short {
        prop_assert_eq!(&whole, bytes);
    }
    let output = match usage {
        Some(n) => n,
        None if text.is_empty() => 0,
        None => crate::common::tokenizer().count(&text) as u64,
    };
    prop_assert_eq!(whole_settled.actual_decode, output.min(case.reserved));
    Ok(())
}

#[test]
fn sse() {
    crate::fuzz("sse", "tests/fuzz/regressions/sse.txt", case(), check);
}
