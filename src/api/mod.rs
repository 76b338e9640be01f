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
    /// What one stream event of this format says, as far as metering cares.
    pub fn inspect(self, event: &[u8]) -> sse::ChunkInfo {
        match self {
            Wire::OpenAi => sse::inspect(event),
            Wire::Tgi => mindie::inspect(event),
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
