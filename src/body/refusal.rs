//! What this room refuses: a body that is not JSON, could not be read within its bounds, holds
//! too many JSON items, is not a JSON object (or not what its route's reader takes), or found
//! no tokenizer worker to parse it. The error room makes each an answer by one `From`, so the
//! body room knows nothing of statuses, headers or the error body.

use crate::api::Refusal;
use crate::tokenize::pool::PoolError;
use crate::util::bounded::ReadError;
use std::time::Duration;

/// A request body refused before its route's reader took it, or by that reader.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BodyRefusal {
    /// `content-type` names something other than JSON (the value as sent).
    #[error("content-type must be application/json, got `{0}`")]
    NotJson(String),
    /// The body could not be read within its bounds.
    #[error("the request body could not be read within its bounds")]
    Unread(BodyError),
    /// The body holds more JSON items than `server.max_json_items` (the bound).
    #[error("the request body holds more than {0} JSON items")]
    TooManyItems(u64),
    /// The body is not a JSON object, or not what its route's reader takes.
    #[error(transparent)]
    Invalid(#[from] Refusal),
    /// A large body found no tokenizer worker to parse it.
    #[error(transparent)]
    Pool(#[from] PoolError),
}

/// A client's request body that could not be read within `server.max_body_bytes` and
/// `server.body_read_timeout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyError {
    /// Why the read stopped.
    pub error: ReadError,
    /// The size bound.
    pub max_bytes: u64,
    /// The time bound.
    pub timeout: Duration,
}

/// An answer that can ask for its connection to be closed: what a refusal of a body left
/// unread must do ([`super::Bodies::refuse_unread`]).
pub trait ClosesConnection {
    /// The same answer, closing the connection after it.
    fn closing_connection(self) -> Self;
}
