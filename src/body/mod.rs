//! The body room: reading a request's body. Its content type is checked before it is read; the
//! body, already held to its size and time bounds (step 3, [`Bounded`]), is read at the pace of
//! the tenant's budget for refused bodies ([`discard`]), its JSON items counted against
//! `server.max_json_items`, and parsed as a JSON object (where it
//! arrived when small, on the tenant's share of the worker pool when large); the body of a
//! request refused unread is drained or left unread as [`discard`] decides. What it refuses
//! is a typed [`BodyRefusal`] ([`refusal`]) the error room makes an answer: this room builds
//! no answers and stands below the error room.

pub mod discard;
pub mod refusal;

use crate::api::holds_more_items_than;
use crate::api::request::read_json_body;
use crate::api::Refusal;
use crate::tokenize::pool::TokenizePool;
use crate::util::bounded::{read_paced, Bounded};
use discard::{BodyCharge, Discarder};
use http::{header, HeaderMap, Request};
use std::sync::Arc;

pub use crate::api::JsonBody;
pub use refusal::{BodyError, BodyRefusal, ClosesConnection};

/// Request bodies up to this size are parsed where they arrive (well under a millisecond);
/// larger ones on the tokenizer pool (see [`Bodies::read_body_json`]). As many bytes of every
/// body are read free of the tenant's budget for refused bodies.
const PARSE_INLINE_BYTES: usize = discard::FREE_BYTES;

/// Whether a `content-type` value names JSON (`application/json`, with any parameters).
pub(crate) fn is_json(content_type: &str) -> bool {
    let mime = content_type.split(';').next().unwrap_or_default().trim();
    mime.eq_ignore_ascii_case("application/json")
}

/// How request bodies, already [`Bounded`] in size and time (step 3), are read (at the pace of
/// each tenant's budget for refused bodies) and parsed.
#[derive(Clone, Debug)]
pub struct Bodies {
    /// Each tenant's budget for bodies read to no purpose.
    pub discarder: Arc<Discarder>,
    /// Where large bodies are parsed.
    pub pool: Arc<TokenizePool>,
    /// `server.max_json_items`: a body of more is refused before it is parsed.
    pub max_items: u64,
}

/// The content type, checked before the body is read: JSON or none.
pub fn check_content_type(headers: &HeaderMap) -> Result<(), BodyRefusal> {
    if let Some(ct) = headers.get(header::CONTENT_TYPE) {
        let ct = ct.to_str().unwrap_or_default();
        if !is_json(ct) {
            return Err(BodyRefusal::NotJson(ct.to_owned()));
        }
    }
    Ok(())
}

impl Bodies {
    /// The body, within its bounds and at the pace of the tenant's budget for refused bodies
    /// ([`discard`]), then `parse` of it as a JSON object (with its
    /// bytes); and what reading it charged that budget, to give back with
    /// [`BodyCharge::accept`] once the request is accepted (kept if it is dropped).
    /// Both parsing steps run where the body arrived for bodies up to 64 KiB (well under a
    /// millisecond), on the tenant's share of the worker pool for larger ones.
    pub async fn read_body_json<'a, B, T: Send + 'static>(
        &'a self,
        tenant: &'a str,
        body: Bounded<B>,
        parse: impl FnOnce(JsonBody) -> Result<T, Refusal> + Send + 'static,
    ) -> Result<(T, BodyCharge<'a>), BodyRefusal>
    where
        B: http_body::Body,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let (max_bytes, timeout) = (body.max_bytes(), body.timeout());
        let mut charge = self.discarder.charge_body(tenant);
        let read = read_paced(body, &mut charge).await;
        charge.read_all();
        let bytes = read.map_err(|error| {
            BodyRefusal::Unread(BodyError {
                error,
                max_bytes,
                timeout,
            })
        })?;
        let bytes_len = bytes.len();
        let max_items = self.max_items;
        let job = move || {
            if holds_more_items_than(&bytes, max_items) {
                return Err(BodyRefusal::TooManyItems(max_items));
            }
            Ok(parse(read_json_body(bytes)?)?)
        };
        if bytes_len <= PARSE_INLINE_BYTES {
            return Ok((job()?, charge));
        }
        // Milliseconds of parsing near the body limit: on the worker pool, not the executor.
        Ok((self.pool.run(tenant, job).await??, charge))
    }

    /// `e`, the refusal of `tenant`'s `req` before its body was read, once the body is disposed
    /// of ([`discard`]): a short one is drained in the background at the tenant's pace, so the connection
    /// serves the client's next request; a long one, or one the client waits for `100
    /// Continue` to send, is left unread, and `e` closes the connection.
    pub fn refuse_unread<B, E: ClosesConnection>(
        &self,
        tenant: &str,
        req: Request<Bounded<B>>,
        e: E,
    ) -> E
    where
        B: http_body::Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let expects_continue = req
            .headers()
            .get(header::EXPECT)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
        // Waiting for `100 Continue`, the client has sent nothing: there is nothing to read.
        if !expects_continue && self.discarder.discard(tenant, req.into_body()) {
            return e;
        }
        e.closing_connection()
    }
}
