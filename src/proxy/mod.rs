//! The proxy room: the [`Gateway`] state every layer and route shares, the leaf service that
//! forwards and meters (steps 10-11, [`forward`]), and what they stand on.
//!
//! | file | job |
//! |---|---|
//! | `forward.rs` | steps 10-11: the leaf service under the layers (see [`crate::layers`] for 5-9) |
//! | `meter.rs` | step 11: the metered answer that owns the request's ticket and settles it |
//! | `upstream.rs` | the backend client: timeouts, bounded reads, error policy, headers |
//! | `body.rs` | a request body: content type, bounded read at the tenant's pace, JSON parse, discard |
//! | `local.rs` | `POST /tokenize` and `GET /v1/models` |
//! | `bounded.rs`, `discard.rs`, `tls.rs` | bounded (and paced) reads, each tenant's budget for refused bodies, backend TLS |

pub mod body;
pub mod bounded;
pub mod discard;
pub mod forward;
pub mod local;
pub mod meter;
pub mod tls;
pub mod upstream;

use crate::admission::Admission;
use crate::api::Wire;
use crate::config::ValidConfig;
use crate::error::ApiError;
use crate::limiter::Limiter;
use crate::metrics::Metrics;
use crate::reload::LiveConfig;
use crate::tokenize::cache::ChatCounter;
use crate::tokenize::pool::TokenizePool;
use crate::tokenize::Tokenizer;
use bytes::Bytes;
use http::{header, Response, StatusCode};
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Full};
use std::convert::Infallible;
use std::sync::Arc;
use upstream::Upstream;

/// The body of every response the gateway sends.
pub type GatewayBody = UnsyncBoxBody<Bytes, Infallible>;

/// A complete in-memory body.
pub fn full(bytes: impl Into<Bytes>) -> GatewayBody {
    Full::new(bytes.into()).boxed_unsync()
}

/// A JSON response.
pub fn json_response(status: StatusCode, value: &serde_json::Value) -> Response<GatewayBody> {
    json_text_response(status, value.to_string())
}

/// A response of JSON text already written.
pub fn json_text_response(status: StatusCode, json: impl Into<Bytes>) -> Response<GatewayBody> {
    let mut resp = Response::new(full(json));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    resp
}

/// An error as a response, in OpenAI's shape.
pub fn error_response(e: &ApiError) -> Response<GatewayBody> {
    error_response_in(e, Wire::OpenAi)
}

/// An error as a response, in `wire`'s shape.
pub fn error_response_in(e: &ApiError, wire: Wire) -> Response<GatewayBody> {
    e.to_response_in::<Full<Bytes>>(wire)
        .map(|b| b.boxed_unsync())
}

/// Everything the request path needs, built once from a [`ValidConfig`].
pub struct Gateway {
    /// The configuration it was started with. Its restart-only settings (all but the tenants
    /// and the backends' sizing) stay in force; a reload never changes them.
    pub config: Arc<ValidConfig>,
    /// The tenants and the backends' sizing in force, swapped whole by a reload.
    pub live: LiveConfig,
    /// Per-tenant buckets.
    pub limiter: Limiter,
    /// KV ledgers and the fair queue.
    pub admission: Admission,
    /// The backends, in config order (the admission's backend indices point here).
    pub upstreams: Vec<Upstream>,
    /// The tokenizer.
    pub tokenizer: Arc<Tokenizer>,
    /// Chat rendering and its per-message memo.
    pub chat: Arc<ChatCounter>,
    /// Where tokenization runs.
    pub pool: Arc<TokenizePool>,
    /// Where chat answers are counted ahead for their next turn (`None` without a memo).
    pub replies: Option<Arc<TokenizePool>>,
    /// Metrics registry.
    pub metrics: Arc<Metrics>,
    /// Where every settled request is recorded: the workload profile.
    pub recorder: Arc<crate::record::Recorder>,
    /// Each tenant's budget for bodies read to no purpose: the pace of refused bodies.
    pub discarder: Arc<discard::Discarder>,
    /// The backends' metrics as last scraped (backend feedback); dropping it stops the scrapes.
    pub feedback: crate::feedback::Scrapers,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("limiter", &self.limiter)
            .field("admission", &self.admission)
            .finish_non_exhaustive()
    }
}

/// The header of a request's id (the client's, or one the gateway made): sent to the backend,
/// and the gateway's is the one in the answer.
pub const REQUEST_ID: &str = "x-request-id";
