//! SSE metering per streamed answer: the splitter and the per-event reading of
//! `tokengate::api::sse` against the approach they replaced (kept below, bench-only, as the
//! baseline), in the same run: `cargo bench --bench sse`. The answer is vLLM-shaped, 200
//! events in 36 KB (a role chunk, content chunks, the finish chunk, the usage chunk,
//! `[DONE]`), read whole in one push and in 1,460-byte reads (one TCP segment each). Prints
//! microseconds per answer, MB/s and the ratio baseline / new. Bounded: a fixed number of
//! answers, best of five passes.

use bytes::Bytes;
use std::hint::black_box;
use tokengate::api::sse::{self, Chunk, EventHead, SseSplitter};
use tokengate::clock::SystemClock;

const EVENTS: usize = 200;
const ANSWERS: usize = 200;
const PASSES: usize = 5;
const SEGMENT: usize = 1460;

/// A 200-event streamed chat answer as vLLM sends it, about 36 KB.
fn answer() -> Vec<u8> {
    let head = r#"{"id":"chatcmpl-9a6e3b2d","object":"chat.completion.chunk","created":1767225600,"model":"qwen3.5-27b","choices":[{"index":0,"#;
    let mut out = String::new();
    let mut event = |json: String| out.push_str(&format!("data: {json}\n\n"));
    event(format!(
        r#"{head}"delta":{{"role":"assistant","content":""}},"finish_reason":null}}]}}"#
    ));
    for i in 0..EVENTS - 4 {
        event(format!(
            r#"{head}"delta":{{"content":" t{i:03}"}},"finish_reason":null}}]}}"#
        ));
    }
    event(format!(
        r#"{head}"delta":{{"content":""}},"finish_reason":"stop","stop_reason":null}}]}}"#
    ));
    event(r#"{"id":"chatcmpl-9a6e3b2d","object":"chat.completion.chunk","created":1767225600,"model":"qwen3.5-27b","choices":[],"usage":{"prompt_tokens":512,"total_tokens":708,"completion_tokens":196}}"#.to_string());
    out.push_str("data: [DONE]\n\n");
    out.into_bytes()
}

/// What metering reads from the events of one answer, summed, so both ways do the same work
/// and can be checked against each other.
#[derive(Debug, Default, PartialEq)]
struct Metered {
    events: usize,
    usage_only: usize,
    completion_tokens: u64,
    text_bytes: usize,
    answer_bytes: usize,
}

fn new_way(body: &Bytes, read: usize) -> Metered {
    let mut m = Metered::default();
    let mut splitter = SseSplitter::new(1 << 20);
    let mut head = EventHead::default();
    // Each read a slice of the answer, as hyper hands the gateway a body's frames.
    let reads = (0..body.len()).step_by(read);
    for piece in reads.map(|at| body.slice(at..(at + read).min(body.len()))) {
        for event in splitter.push(piece).events {
            let data = sse::data(&event);
            let chunk = Chunk::parse_event(&data, &mut head);
            m.events += 1;
            m.usage_only += usize::from(chunk.usage_only());
            m.completion_tokens += chunk.completion_tokens().unwrap_or(0);
            m.text_bytes += chunk.generated().map(str::len).sum::<usize>();
            m.answer_bytes += chunk.answer().map_or(0, |(content, _)| content.len());
        }
    }
    m
}

fn baseline_way(body: &Bytes, read: usize) -> Metered {
    let mut m = Metered::default();
    let mut splitter = baseline::SseSplitter::new(1 << 20);
    for piece in body.chunks(read) {
        for event in splitter.push(piece) {
            let info = baseline::inspect(&event);
            m.events += 1;
            m.usage_only += usize::from(info.usage_only);
            m.completion_tokens += info.completion_tokens.unwrap_or(0);
            m.text_bytes += info.text.len();
            m.answer_bytes += info.content.len();
        }
    }
    m
}

/// Best (lowest) microseconds per answer over a few passes.
fn best_us(body: &Bytes, read: usize, way: fn(&Bytes, usize) -> Metered) -> f64 {
    (0..PASSES)
        .map(|_| {
            let start = SystemClock.instant();
            for _ in 0..ANSWERS {
                black_box(way(black_box(body), read));
            }
            start.elapsed().as_secs_f64() * 1e6 / ANSWERS as f64
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    let body = Bytes::from(answer());
    println!("one streamed answer: {EVENTS} events, {} bytes", body.len());
    for (label, read) in [
        ("whole answer in one read", body.len()),
        ("1460-byte reads", SEGMENT),
    ] {
        let expected = baseline_way(&body, read);
        assert_eq!(new_way(&body, read), expected, "both ways meter alike");
        assert_eq!((expected.events, expected.completion_tokens), (EVENTS, 196));
        let old = best_us(&body, read, baseline_way);
        let new = best_us(&body, read, new_way);
        let mbps = |us: f64| body.len() as f64 / us;
        println!(
            "{label:<26} baseline {old:8.1} us ({:6.1} MB/s)  new {new:7.1} us ({:6.1} MB/s)  baseline/new {:.1}x",
            mbps(old),
            mbps(new),
            old / new
        );
    }
}

/// The approach `tokengate::api::sse` replaced, kept here only as the baseline: the buffer is
/// searched from its start for both event ends after every event, and each event's data is
/// joined into a new string and parsed into a `serde_json::Value`.
mod baseline {
    use bytes::{Bytes, BytesMut};
    use serde_json::Value;

    pub struct SseSplitter {
        buf: BytesMut,
        max_event_bytes: usize,
    }

    impl SseSplitter {
        pub fn new(max_event_bytes: usize) -> Self {
            Self {
                buf: BytesMut::new(),
                max_event_bytes,
            }
        }

        pub fn push(&mut self, bytes: &[u8]) -> Vec<Bytes> {
            let mut events = Vec::new();
            self.buf.extend_from_slice(bytes);
            while let Some(end) = find_event_end(&self.buf) {
                if end > self.max_event_bytes {
                    break;
                }
                events.push(self.buf.split_to(end).freeze());
            }
            assert!(self.buf.len() <= self.max_event_bytes);
            events
        }
    }

    fn find_event_end(buf: &[u8]) -> Option<usize> {
        let lf = buf.windows(2).position(|w| w == b"\n\n").map(|p| p + 2);
        let crlf = buf.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4);
        match (lf, crlf) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    #[derive(Default)]
    pub struct ChunkInfo {
        pub usage_only: bool,
        pub completion_tokens: Option<u64>,
        pub text: String,
        pub content: String,
    }

    pub fn inspect(event: &[u8]) -> ChunkInfo {
        let mut info = ChunkInfo::default();
        let Ok(text) = std::str::from_utf8(event) else {
            return info;
        };
        let data: String = text
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(|d| d.strip_prefix(' ').unwrap_or(d))
            .collect::<Vec<_>>()
            .join("\n");
        if data.trim() == "[DONE]" {
            return info;
        }
        let Ok(v) = serde_json::from_str::<Value>(&data) else {
            return info;
        };
        info.completion_tokens = v
            .get("usage")
            .and_then(|u| u.get("completion_tokens"))
            .and_then(Value::as_u64);
        let choices = v.get("choices").and_then(Value::as_array);
        info.usage_only = info.completion_tokens.is_some() && choices.is_none_or(|c| c.is_empty());
        for (i, choice) in choices.into_iter().flatten().enumerate() {
            let delta = choice.get("delta").unwrap_or(choice);
            for key in ["reasoning_content", "content", "text"] {
                if let Some(s) = delta.get(key).and_then(Value::as_str) {
                    info.text.push_str(s);
                }
            }
            if let Some(calls) = delta.get("tool_calls").and_then(Value::as_array) {
                for f in calls.iter().filter_map(|c| c.get("function")) {
                    for key in ["name", "arguments"] {
                        if let Some(s) = f.get(key).and_then(Value::as_str) {
                            info.text.push_str(s);
                        }
                    }
                }
            }
            if i == 0 {
                let content = delta.get("content").and_then(Value::as_str);
                info.content.push_str(content.unwrap_or_default());
            }
        }
        info
    }
}
