//! Wire formats: what clients send and what backends answer.

pub mod mindie;
pub mod openai;
pub mod sse;

use crate::error::ApiError;
use openai::{Endpoint, GenerationRequest, ParseLimits};
use serde_json::{Map, Value};

/// A generation route of the main listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// OpenAI-compatible: `/v1/chat/completions`, `/v1/completions`.
    OpenAi(Endpoint),
    /// MindIE's native API: `/infer`, `/generate`, `/generate_stream`.
    MindIe(mindie::Native),
}

/// How a route's answers and errors are written: it decides where the output count is read,
/// and the shape of every refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    /// OpenAI: `usage`, `choices`, `{"error": {"message", "type", "param", "code"}}`.
    OpenAi,
    /// TGI as MindIE speaks it: `generated_text`, `details.generated_tokens`, one token per
    /// stream event, `{"error": "...", "error_type": "..."}`.
    Tgi,
}

impl Wire {
    /// Reads `json`, a whole answer or a stream event's [`sse::data`], in this format, as far as
    /// metering needs.
    pub fn chunk(self, json: &[u8]) -> Chunk<'_> {
        match self {
            Wire::OpenAi => Chunk::OpenAi(sse::Chunk::parse(json)),
            Wire::Tgi => Chunk::Tgi(mindie::Chunk::parse(json)),
        }
    }
}

/// A whole answer or one stream event in its wire's format, as metering reads it.
#[derive(Debug)]
pub enum Chunk<'a> {
    /// An OpenAI chunk or answer.
    OpenAi(sse::Chunk<'a>),
    /// A TGI event or answer.
    Tgi(mindie::Chunk<'a>),
}

impl Chunk<'_> {
    /// The backend's count of the tokens generated: OpenAI's `usage.completion_tokens`, TGI's
    /// `details.generated_tokens`.
    pub fn completion_tokens(&self) -> Option<u64> {
        match self {
            Chunk::OpenAi(c) => c.completion_tokens(),
            Chunk::Tgi(c) => c.generated_tokens(),
        }
    }

    /// An OpenAI chunk with usage and no choices (vLLM's `include_usage` chunk), which only a
    /// client that asked for usage gets.
    pub fn usage_only(&self) -> bool {
        match self {
            Chunk::OpenAi(c) => c.usage_only(),
            Chunk::Tgi(_) => false,
        }
    }

    /// The generated text, piece by piece.
    pub fn generated(&self) -> impl Iterator<Item = &str> {
        let (openai, tgi) = match self {
            Chunk::OpenAi(c) => (Some(c.generated()), None),
            Chunk::Tgi(c) => (None, c.generated()),
        };
        openai.into_iter().flatten().chain(tgi)
    }

    /// The first choice's chat answer (reasoning left out) and whether it calls tools; `None`
    /// when there is no choice, as in every TGI answer.
    pub fn answer(&self) -> Option<(&str, bool)> {
        match self {
            Chunk::OpenAi(c) => c.answer(),
            Chunk::Tgi(_) => None,
        }
    }
}

impl Route {
    /// The generation route at `path`, if it is one.
    pub fn from_path(path: &str) -> Option<Route> {
        match path {
            "/v1/chat/completions" => Some(Route::OpenAi(Endpoint::Chat)),
            "/v1/completions" => Some(Route::OpenAi(Endpoint::Completions)),
            _ => mindie::Native::from_path(path).map(Route::MindIe),
        }
    }

    /// The backend path: the same as the client's.
    pub fn path(self) -> &'static str {
        match self {
            Route::OpenAi(e) => e.path(),
            Route::MindIe(n) => n.path(),
        }
    }

    /// The format of its answers and errors.
    pub fn wire(self) -> Wire {
        match self {
            Route::OpenAi(_) => Wire::OpenAi,
            Route::MindIe(_) => Wire::Tgi,
        }
    }

    /// The field holding the prompt, named by errors about its length.
    pub fn prompt_param(self) -> &'static str {
        match self {
            Route::OpenAi(Endpoint::Chat) => "messages",
            Route::OpenAi(Endpoint::Completions) => "prompt",
            Route::MindIe(_) => "inputs",
        }
    }
}

/// Validates a generation body sent to `route` (see [`openai::parse_generation`] and
/// [`mindie::parse_generation`]).
pub fn parse_generation(
    route: Route,
    body: Map<String, Value>,
    limits: &ParseLimits<'_>,
) -> Result<GenerationRequest, ApiError> {
    match route {
        Route::OpenAi(endpoint) => openai::parse_generation(endpoint, body, limits),
        Route::MindIe(native) => mindie::parse_generation(native, body, limits),
    }
}

/// The body sent to the backend: the client's, with the output capped at `reserved` tokens
/// (see [`openai::rewrite_for_backend`] and [`mindie::rewrite_for_backend`]).
pub fn rewrite_for_backend(
    req: &mut GenerationRequest,
    reserved: u64,
    backend_model: &str,
) -> Vec<u8> {
    match req.endpoint {
        Route::OpenAi(_) => openai::rewrite_for_backend(req, reserved, backend_model),
        Route::MindIe(_) => mindie::rewrite_for_backend(req, reserved),
    }
}
