//! The proxy room: the leaf service that forwards and meters (steps 10-11, [`forward`]), the
//! gateway's own answers, and what they stand on.
//!
//! | file | job |
//! |---|---|
//! | `forward.rs` | steps 10-11: the leaf service under the layers (see [`crate::layers`] for 5-9) |
//! | `meter.rs` | step 11: the metered answer that owns the request's ticket and settles it |
//! | `upstream.rs` | the backend client: timeouts, bounded reads, error policy, headers |
//! | `local.rs` | `POST /tokenize` and `GET /v1/models` |

pub mod forward;
pub mod local;
pub mod meter;
pub mod upstream;

use crate::api::Wire;
use crate::error::ApiError;
use bytes::Bytes;
use http::{header, Response, StatusCode};
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Full};
use std::convert::Infallible;

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
