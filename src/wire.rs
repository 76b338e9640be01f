//! The dialects the gateway speaks with clients and backends: OpenAI's (vLLM's), OpenAI's
//! Responses API, Anthropic's (vLLM's `/v1/messages`), TGI's (MindIE's native routes) and MindIE's vLLM-compatible `/generate`. A route names its dialect (`api::Route::wire`); the metering and
//! every refusal follow it.

/// How a route's answers and errors are written: it decides where the output count is read,
/// and the shape of every refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    /// OpenAI: `usage`, `choices`, `{"error": {"message", "type", "param", "code"}}`.
    OpenAi,
    /// TGI as MindIE speaks it: `generated_text`, `details.generated_tokens`, one token per
    /// stream event, `{"error": "...", "error_type": "..."}`.
    Tgi,
    /// Anthropic's Messages API: `usage.input_tokens` / `output_tokens`, stream events
    /// (`message_start`, `content_block_delta`, `message_delta`),
    /// `{"type": "error", "error": {"type", "message"}}`.
    Anthropic,
    /// OpenAI's Responses API: `usage.input_tokens` / `output_tokens`, stream events with a
    /// `delta` and a last `response.completed`; errors in OpenAI's shape.
    Responses,
    /// MindIE's vLLM-compatible `/generate`: `{"text": [...]}`, a text per sequence and no
    /// count (a whole answer's texts begin with the prompt); stream events are such objects,
    /// each ended by a NUL byte rather than a blank line, with each sequence's new text; errors
    /// as TGI's.
    VllmGenerate,
    /// Cohere's embed answer (vLLM's `/v2/embed`): `meta.billed_units.input_tokens` (and
    /// `image_tokens`); never streamed; errors in OpenAI's shape.
    Cohere,
    /// MindIE's Triton generate extension: `text_output` (never the prompt) and, when asked,
    /// `details.generated_tokens` (a stream's running total); SSE events; errors as TGI's.
    Triton,
}

impl Wire {
    /// How its stream's events end.
    pub fn framing(self) -> Framing {
        match self {
            Wire::VllmGenerate => Framing::Nul,
            Wire::OpenAi
            | Wire::Tgi
            | Wire::Anthropic
            | Wire::Responses
            | Wire::Triton
            | Wire::Cohere => Framing::Sse,
        }
    }

    /// Whether a stream event's `data` is the last one a whole answer sends: OpenAI's
    /// `[DONE]`, or Anthropic's `message_stop` (a short event: its type is all it holds). The
    /// other wires' streams end with their body.
    pub fn ends_answer(self, data: &str) -> bool {
        match self {
            Wire::OpenAi => data == "[DONE]",
            Wire::Anthropic => {
                data.len() < 64
                    && data.contains("message_stop")
                    && serde_json::from_str::<serde_json::Value>(data)
                        .is_ok_and(|v| v["type"] == "message_stop")
            }
            Wire::Tgi | Wire::Responses | Wire::VllmGenerate | Wire::Triton | Wire::Cohere => false,
        }
    }

    /// `json` as one event of its stream.
    pub fn event(self, json: &serde_json::Value) -> String {
        match self.framing() {
            Framing::Sse => format!("data: {json}\n\n"),
            Framing::Nul => format!("{json}\0"),
        }
    }
}

/// How a stream's events are cut apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// Server-sent events: each ends with a blank line, its payload in `data:` lines.
    Sse,
    /// Each event is a JSON object followed by a NUL byte (MindIE's vLLM-compatible stream).
    Nul,
}

impl Framing {
    /// The byte an event ends with: an SSE event's last `\n`, or its NUL.
    pub fn end_byte(self) -> u8 {
        match self {
            Framing::Sse => b'\n',
            Framing::Nul => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Wire;

    #[test]
    fn the_last_event_of_a_whole_answer_is_known_where_the_wire_sends_one() {
        assert!(Wire::OpenAi.ends_answer("[DONE]"));
        assert!(!Wire::OpenAi.ends_answer(r#"{"choices":[],"usage":{}}"#));
        assert!(Wire::Anthropic.ends_answer(r#"{"type":"message_stop"}"#));
        assert!(Wire::Anthropic.ends_answer(r#"{"type": "message_stop"}"#));
        // A text that says "message_stop" is a delta, not the end.
        assert!(!Wire::Anthropic.ends_answer(r#"{"delta":{"text":"message_stop"}}"#));
        assert!(!Wire::Responses.ends_answer("[DONE]"));
        assert!(!Wire::Tgi.ends_answer("[DONE]"));
    }
}
