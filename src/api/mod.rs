//! Wire formats: what clients send and what backends answer.

//!
//! | file | job |
//! |---|---|
//! | `route.rs` | the routes (OpenAI's endpoints, MindIE's native routes) and their wire formats |
//! | `request.rs` | the validated [`GenerationRequest`], the JSON reading the parsers share, the body rewrite |
//! | `openai.rs`, `responses.rs`, `anthropic.rs`, `mindie.rs`, `pooling.rs` | each API's parsing, validation and rewrite |
//! | `sse.rs`, `scan.rs`, `chunk.rs` | reading the backends' answers and stream events for metering |
//! | `logprobs.rs` | the least room a whole answer's log probabilities take |

pub mod anthropic;
pub mod chunk;
pub mod generative_scoring;
pub mod logprobs;
pub mod mindie;
pub mod openai;
pub mod pooling;
pub mod refusal;
pub mod request;
pub mod responses;
pub mod route;
mod scan;
pub(crate) use scan::holds_more_items_than;
pub mod sse;

pub use crate::wire::Wire;
pub use chunk::Chunk;
pub use refusal::{Refusal, RefusalKind};
pub use request::{Echo, GenerationRequest, JsonBody, Layout, MaxTokensField, ParseLimits, Prompt};
pub use route::{Endpoint, Native, Pooled, Route};

use bytes::Bytes;

/// Validates a generation body sent to `route`, read with its bytes (see
/// [`openai::parse_generation_from`] and [`mindie::parse_generation`]).
pub fn parse_generation(
    route: Route,
    body: JsonBody,
    limits: &ParseLimits<'_>,
) -> Result<GenerationRequest, Refusal> {
    let JsonBody {
        object,
        raw,
        layout,
    } = body;
    let parsed = match route {
        Route::OpenAi(endpoint) => {
            let body = JsonBody {
                object,
                raw,
                layout,
            };
            return openai::parse_generation_from(endpoint, body, limits);
        }
        Route::MindIe(native) => mindie::parse_generation(native, object, limits),
        Route::Messages => anthropic::parse_generation(object, limits),
        Route::Responses => responses::parse_generation(object, limits),
        Route::Pooling(pooled) => pooling::parse_generation(pooled, object, limits),
        Route::GenerativeScoring => generative_scoring::parse_generation(object, limits),
    }?;
    Ok(GenerationRequest {
        raw,
        raw_layout: layout,
        ..parsed
    })
}

/// The body sent to the backend: the client's, with the output capped at `reserved` tokens
/// (see [`openai::rewrite_for_backend`] and [`mindie::rewrite_for_backend`]; on
/// `/v1/messages` its `max_tokens`, on `/v1/responses` its `max_output_tokens`; a pooling
/// route's body, and generative scoring's (one token an item, whatever it says), only asks
/// for the model by the backend's name).
pub fn rewrite_for_backend(
    req: &mut GenerationRequest,
    reserved: u64,
    backend_model: &str,
) -> Bytes {
    match req.endpoint {
        Route::OpenAi(_) => openai::rewrite_for_backend(req, reserved, backend_model),
        Route::MindIe(_) => mindie::rewrite_for_backend(req, reserved),
        Route::Messages => model_and_limit(req, "max_tokens", reserved, backend_model),
        Route::Responses => model_and_limit(req, "max_output_tokens", reserved, backend_model),
        Route::Pooling(_) | Route::GenerativeScoring => {
            request::splice_body(req, vec![("model", serde_json::Value::from(backend_model))])
        }
    }
}

/// The client's body asking for the model by the name the backend serves (`backend_model`),
/// with its output limit `field` set to `reserved`.
fn model_and_limit(
    req: &mut GenerationRequest,
    field: &'static str,
    reserved: u64,
    backend_model: &str,
) -> Bytes {
    let set = vec![
        ("model", serde_json::Value::from(backend_model)),
        (field, serde_json::Value::from(reserved)),
    ];
    request::splice_body(req, set)
}
