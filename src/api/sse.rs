//! Server-sent events as backends stream them: splitting a byte stream into events, and reading
//! what the gateway meters from each OpenAI `data:` chunk (MindIE's events: `api::mindie`).

use bytes::{Bytes, BytesMut};
use serde_json::Value;

/// Cuts a byte stream into complete SSE events (each ending in a blank line), none longer
/// than a bound: the buffer of an unfinished event never grows past it.
#[derive(Debug)]
pub struct SseSplitter {
    buf: BytesMut,
    max_event_bytes: usize,
    /// An event went over the bound: the split is over.
    overflowed: bool,
}

/// What one [`SseSplitter::push`] completed.
#[derive(Debug, Default, PartialEq)]
pub struct Split {
    /// The events completed, in order, each with its trailing blank line.
    pub events: Vec<Bytes>,
    /// An event (complete or still growing) is longer than the bound: the events before it
    /// are in `events`, nothing after it is read.
    pub too_large: bool,
}

impl SseSplitter {
    /// A splitter for events of at most `max_event_bytes` (blank line included).
    pub fn new(max_event_bytes: u64) -> Self {
        Self {
            buf: BytesMut::new(),
            max_event_bytes: usize::try_from(max_event_bytes).unwrap_or(usize::MAX),
            overflowed: false,
        }
    }

    /// Adds bytes; returns the events completed by them.
    pub fn push(&mut self, bytes: &[u8]) -> Split {
        let mut split = Split {
            too_large: self.overflowed,
            ..Split::default()
        };
        if self.overflowed {
            return split;
        }
        self.buf.extend_from_slice(bytes);
        while let Some(end) = find_event_end(&self.buf) {
            if end > self.max_event_bytes {
                break;
            }
            split.events.push(self.buf.split_to(end).freeze());
        }
        // What is left is one event: unfinished, or finished but over the bound.
        if self.buf.len() > self.max_event_bytes {
            self.overflowed = true;
            self.buf = BytesMut::new();
            split.too_large = true;
        }
        split
    }

    /// What is left when the stream ends (an event without its blank line), if anything.
    pub fn finish(&mut self) -> Option<Bytes> {
        (!self.buf.is_empty()).then(|| self.buf.split().freeze())
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

/// What one event says, as far as metering cares.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ChunkInfo {
    /// The event is `data: [DONE]`.
    pub done: bool,
    /// The chunk has no choices and carries `usage` (vLLM's `include_usage` chunk).
    pub usage_only: bool,
    /// `usage.completion_tokens`, wherever it appears.
    pub completion_tokens: Option<u64>,
    /// Generated text in this chunk (content, reasoning, completion text, tool-call arguments).
    pub text: String,
    /// The answer part of it: the first choice's `content`.
    pub content: String,
    /// The first choice calls tools in this chunk.
    pub tool_calls: bool,
}

/// An event's `data:` payload (its `data:` lines joined), if the event is UTF-8.
fn event_data(event: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(event).ok()?;
    Some(
        text.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(|d| d.strip_prefix(' ').unwrap_or(d))
            .collect::<Vec<_>>()
            .join("\n"),
    )
}

/// An event's `data:` payload as JSON, if it is JSON.
pub fn event_json(event: &[u8]) -> Option<Value> {
    serde_json::from_str(&event_data(event)?).ok()
}

/// Reads an OpenAI chunk's `data:` payload.
pub fn inspect(event: &[u8]) -> ChunkInfo {
    let mut info = ChunkInfo::default();
    let Some(data) = event_data(event) else {
        return info;
    };
    if data.trim() == "[DONE]" {
        info.done = true;
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
        append_generated_text(delta, &mut info.text);
        if i == 0 {
            let (content, tool_calls) = answer(delta);
            info.content.push_str(content);
            info.tool_calls = tool_calls;
        }
    }
    info
}

/// The answer text of a chat delta or message (its `content`, without reasoning), and whether
/// it calls tools.
pub fn answer(v: &Value) -> (&str, bool) {
    let content = v.get("content").and_then(Value::as_str).unwrap_or_default();
    let tool_calls = v
        .get("tool_calls")
        .and_then(Value::as_array)
        .is_some_and(|calls| !calls.is_empty());
    (content, tool_calls)
}

/// Appends the generated text of a chat delta/message or a completion choice.
pub fn append_generated_text(v: &Value, out: &mut String) {
    for key in ["reasoning_content", "content", "text"] {
        if let Some(s) = v.get(key).and_then(Value::as_str) {
            out.push_str(s);
        }
    }
    if let Some(calls) = v.get("tool_calls").and_then(Value::as_array) {
        for call in calls {
            if let Some(f) = call.get("function") {
                for key in ["name", "arguments"] {
                    if let Some(s) = f.get(key).and_then(Value::as_str) {
                        out.push_str(s);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_events_across_pushes() {
        let mut s = SseSplitter::new(1 << 20);
        assert_eq!(s.push(b"data: {\"a\""), Split::default());
        let split = s.push(b":1}\n\ndata: [DONE]\n\n");
        assert_eq!(
            split.events,
            vec![
                Bytes::from("data: {\"a\":1}\n\n"),
                Bytes::from("data: [DONE]\n\n")
            ]
        );
        assert!(!split.too_large);
        assert_eq!(s.finish(), None);
    }

    #[test]
    fn an_event_over_the_bound_ends_the_split_after_the_events_before_it() {
        let split = |events: Vec<Bytes>, too_large: bool| Split { events, too_large };
        // "data: 12345\n\n" is 13 bytes: the bound.
        let ok = Bytes::from("data: 12345\n\n");
        // Complete but one byte over, behind an event that fits: that one still comes out.
        let mut s = SseSplitter::new(13);
        let pushed = s.push(b"data: 12345\n\ndata: 123456\n\ndata: 1\n\n");
        assert_eq!(pushed, split(vec![ok.clone()], true));
        assert_eq!(s.push(b"data: 1\n\n"), split(vec![], true));
        assert_eq!(s.finish(), None);
        // Unfinished and growing past the bound, a few bytes at a time: the buffer never
        // holds more than the bound plus one push.
        let mut s = SseSplitter::new(13);
        assert_eq!(s.push(b"data: 12345\n\ndata: 12"), split(vec![ok], false));
        assert_eq!(s.push(b"345678"), split(vec![], true));
        assert_eq!(s.finish(), None);
    }

    #[test]
    fn reads_usage_and_text() {
        let c = inspect(b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n");
        assert_eq!(
            (c.text.as_str(), c.usage_only, c.done),
            ("hi", false, false)
        );
        let u = inspect(
            b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":9}}\n\n",
        );
        assert_eq!((u.usage_only, u.completion_tokens), (true, Some(9)));
        assert!(inspect(b"data: [DONE]\n\n").done);
    }

    #[test]
    fn separates_the_answer_from_reasoning_and_tool_calls() {
        let c =
            inspect(br#"data: {"choices":[{"delta":{"reasoning_content":"hm","content":"ok"}}]}"#);
        assert_eq!(
            (c.text.as_str(), c.content.as_str(), c.tool_calls),
            ("hmok", "ok", false)
        );
        let t = inspect(
            br#"data: {"choices":[{"delta":{"tool_calls":[{"function":{"name":"f","arguments":"{}"}}]}}]}"#,
        );
        assert_eq!(
            (t.text.as_str(), t.content.as_str(), t.tool_calls),
            ("f{}", "", true)
        );
    }
}
