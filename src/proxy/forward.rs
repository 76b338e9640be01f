//! Steps 10-11, forward + meter: the leaf service under the layers. It sends the parsed
//! request to the backend its lease is on (`max_tokens` rewritten to what was reserved, usage
//! asked for, the request's id) and answers with the backend's answer, metered: a whole answer
//! read and settled at once, a stream passed on event by event by [`MeteredStream`], which owns
//! the request's [`Ticket`] (through [`Admitted`]) until it ends, breaks or the client goes.
//!
//! Anything but a 2xx answer (and, for a stream, its first chunk) leaves the ticket in its first
//! phase: dropped, it gives back everything charged. The backend's error policy is
//! [`super::upstream`]'s.

use super::meter::{Admitted, MeteredStream, OutputCounter, ReplyMemo};
use super::{full, Gateway, GatewayBody, REQUEST_ID};
use crate::api::openai::{Endpoint, GenerationRequest};
use crate::api::{self, Route};
use crate::error::{ApiError, UpstreamFailure};
use crate::layers::{needs, Arrived, TicketSlot};
use crate::limiter::Cost;
use crate::tenant::Tenant;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{Method, Request, Response};
use http_body_util::BodyExt;
use std::sync::Arc;
use std::task::{Context, Poll};

/// The leaf service: needs everything the layers add (`Arc<Tenant>`, [`Arrived`], [`Route`],
/// [`GenerationRequest`], [`Cost`], [`TicketSlot`]); answers with the metered answer.
#[derive(Clone, Debug)]
pub struct Forward {
    gw: Arc<Gateway>,
}

impl Forward {
    /// Forwards to `gw`'s backends.
    pub fn new(gw: Arc<Gateway>) -> Self {
        Self { gw }
    }
}

impl<B> tower::Service<Request<B>> for Forward {
    type Response = Response<GatewayBody>;
    type Error = ApiError;
    type Future = BoxFuture<'static, Result<Response<GatewayBody>, ApiError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), ApiError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let gw = self.gw.clone();
        // Everything is taken out here, so the future does not hold the body type.
        let taken = (|| {
            let tenant = needs::<Arc<Tenant>>(req.extensions())?.clone();
            let Arrived(arrived) = *needs::<Arrived>(req.extensions())?;
            let route = *needs::<Route>(req.extensions())?;
            let max_output = needs::<Cost>(req.extensions())?.decode;
            let request_id = req.headers().get(REQUEST_ID).cloned();
            let ticket = needs::<TicketSlot>(req.extensions())?
                .take()
                .ok_or_else(|| ApiError::missing_extension("Ticket"))?;
            let (mut parts, _) = req.into_parts();
            let parsed = parts
                .extensions
                .remove::<GenerationRequest>()
                .ok_or_else(|| ApiError::missing_extension("GenerationRequest"))?;
            let admitted = Admitted::new(
                tenant,
                ticket,
                gw.metrics.clone(),
                OutputCounter {
                    wire: route.wire(),
                    tokenizer: gw.tokenizer.clone(),
                    pool: gw.pool.clone(),
                    replies: match (route, &gw.replies) {
                        (Route::OpenAi(Endpoint::Chat), Some(pool)) => Some(ReplyMemo {
                            chat: gw.chat.clone(),
                            pool: pool.clone(),
                        }),
                        _ => None,
                    },
                },
                arrived,
            );
            Ok::<_, ApiError>((parsed, max_output, admitted, request_id))
        })();
        Box::pin(async move {
            let (parsed, max_output, admitted, request_id) = taken?;
            gw.forward(parsed, max_output, admitted, request_id.as_ref())
                .await
        })
    }
}

impl Gateway {
    /// Steps 10-11: send to the leased backend (with the request's id) and meter the answer.
    async fn forward(
        &self,
        mut req: GenerationRequest,
        max_output: u64,
        admitted: Admitted,
        request_id: Option<&http::HeaderValue>,
    ) -> Result<Response<GatewayBody>, ApiError> {
        let upstream = &self.upstreams[admitted.backend()];
        let first_byte_deadline = tokio::time::Instant::now() + upstream.first_byte_timeout();
        let body =
            api::rewrite_for_backend(&mut req, max_output, &self.config.model.served_names[0]);
        let resp = match upstream
            .send(Method::POST, req.endpoint.path(), Some(body), request_id)
            .await
        {
            Ok(r) => r,
            Err(e) => return Err(admitted.refuse(e)),
        };
        let (mut parts, incoming) = resp.into_parts();
        if !parts.status.is_success() {
            // The lease and the charge go back before the error body is read.
            admitted.refused();
            return Err(upstream.refusal(parts.status, incoming).await);
        }
        // What every answer from here carries: the backend's end-to-end headers and the
        // tenant's rate limits.
        super::upstream::answer_headers(&mut parts.headers);
        admitted.rate_limit_headers().apply(&mut parts.headers);
        if !req.stream {
            let bytes = match upstream.read_answer(incoming).await {
                Ok(bytes) => bytes,
                Err(e) => return Err(admitted.refuse(e)),
            };
            admitted.finish_json(&bytes);
            return Ok(Response::from_parts(parts, full(bytes)));
        }
        // Wait for the first bytes before answering, so a backend that fails before its
        // first token still gets a proper 502 (or 504) instead of a broken 200 stream. Engines
        // send a stream's headers at once: the first-byte timeout bounds its first chunk too.
        let mut incoming = incoming;
        let first = match tokio::time::timeout_at(first_byte_deadline, incoming.frame()).await {
            Err(_) => {
                let e = UpstreamFailure::NoFirstChunk(upstream.first_byte_timeout());
                return Err(admitted.refuse(e.into()));
            }
            Ok(frame) => frame,
        };
        let first = match first {
            Some(Ok(frame)) => frame.into_data().unwrap_or_default(),
            Some(Err(_)) => {
                return Err(admitted.refuse(UpstreamFailure::BrokeBeforeFirstChunk.into()))
            }
            None => Bytes::new(),
        };
        let stream = MeteredStream::new(
            incoming,
            first,
            admitted,
            req.client_wants_usage,
            upstream.stream_idle_timeout(),
            upstream.max_event_bytes(),
        );
        Ok(Response::from_parts(parts, stream.boxed_unsync()))
    }
}
