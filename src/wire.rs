//! The dialects the gateway speaks with clients and backends: OpenAI's (vLLM's), OpenAI's
//! Responses API, Anthropic's (vLLM's `/v1/messages`) and TGI's (MindIE's native routes). A route names its dialect (`api::Route::wire`); the metering and
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
}
