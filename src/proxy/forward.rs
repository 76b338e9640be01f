//! Steps 10-11, forward + meter: the leaf service under the layers. It sends the parsed
//! request to the backend its lease is on (`max_tokens` rewritten to what was reserved, usage
//! asked for, an id of the gateway's: [`crate::request_id::backend_id`]) and answers with the backend's answer, metered: a whole answer
//! (or a JSON one to a streamed request) read and settled at once, a stream passed on event by
//! event by [`MeteredStream`], which owns the request's [`Ticket`](crate::settle::Ticket) (through [`Admitted`]) until
//! it ends, breaks or the client goes. Each way out of `Backends::forward` ends the ticket with
//! its [`Ending`].
//!
//! Once the request's bytes are handed to the backend's connection (the backend client marks
//! the ticket [`Forwarded`](crate::record::Forwarded)), its prefill is spent: a client that goes
//! before the first token, or a backend slower than `first_byte_timeout` (a 504), settles with
//! the prompt and the decode floor of the time the backend ran it charged
//! ([`crate::settle::DecodeFloor`]), every other decode token back; so does a 2xx answer whose
//! body then fails (over `max_response_bytes`, broken, too slow). A backend that fails the
//! request before answering (an error status, a broken connection) gives everything back. The
//! backend's error policy is [`super::upstream`]'s.

use super::meter::{Admitted, MeteredStream, OutputCounter, ReplyMemo};
use super::upstream::Upstream;
use super::{full, GatewayBody};
use crate::api::Endpoint;
use crate::api::GenerationRequest;
use crate::api::{self, Route};
use crate::config::ValidConfig;
use crate::error::{ApiError, UpstreamFailure};
use crate::layers::extensions::needs;
use crate::layers::Counted;
use crate::metrics::SettleMetrics;
use crate::record::Arrived;
use crate::settle::{Ending, Reconcile, Ticketed};
use crate::tokenize::cache::ChatCounter;
use crate::tokenize::pool::TokenizePool;
use crate::tokenize::Tokenizer;
use crate::util::throttle::Throttle;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{Method, Response};
use http_body_util::BodyExt;
use std::sync::Arc;
use std::task::{Context, Poll};

/// The leaf service: takes a [`Ticketed`] [`Counted`] request (counted, charged and admitted)
/// and needs the instant it [`Arrived`], which the record layer adds to its extensions; answers
/// with the metered answer.
#[derive(Clone, Debug)]
pub struct Forward {
    shared: Arc<Backends>,
}

/// What forwarding and metering use.
#[derive(Debug)]
pub struct Backends {
    /// The backends, in config order (the admission's backend indices point here).
    pub upstreams: Arc<[Upstream]>,
    /// What forwarding and metering read of the config.
    pub settings: ForwardSettings,
    /// Where answers are metered.
    pub metrics: Arc<SettleMetrics>,
    /// Counts what a backend's answer does not say it generated.
    pub tokenizer: Arc<Tokenizer>,
    /// Where that counting runs.
    pub pool: Arc<TokenizePool>,
    /// Chat rendering, for answers counted ahead for their next turn.
    pub chat: Arc<ChatCounter>,
    /// Where chat answers are counted ahead (`None` without a memo).
    pub replies: Option<Arc<TokenizePool>>,
    /// How often a difference between the backend's count and the gateway's is logged.
    pub count_warnings: Arc<Throttle>,
}

/// What forwarding and metering read of the config, and no more.
#[derive(Clone, Debug)]
pub struct ForwardSettings {
    /// The name the backends are asked for the model by (the first of `model.served_names`).
    pub backend_model: String,
    /// The model's context (`model.max_model_len`): no engine runs a longer prompt, so a
    /// backend's count of a request's prompts is believed up to this for each.
    pub max_model_len: u64,
    /// What a prompt token the backend's prefix cache held is charged, as a share of a token
    /// (`limiter.cached_prefill_weight`).
    pub cached_prefill_weight: f64,
}

impl ForwardSettings {
    /// The settings `config` gives.
    pub fn of(config: &ValidConfig) -> Self {
        Self {
            backend_model: config.model.served_names[0].clone(),
            max_model_len: config.model.max_model_len,
            cached_prefill_weight: config.limiter.cached_prefill_weight,
        }
    }
}

/// How a request goes to its backend beside its body.
struct Sent {
    /// The output limit of each sequence (its share of the reservation).
    max_output: u64,
    /// The sequences it runs (every prompt's `n` choices).
    sequences: u64,
    /// The id the backend gets (the gateway's).
    request_id: http::HeaderValue,
    /// The client's trace context, passed on ([`crate::trace_context`]).
    trace: Vec<(http::HeaderName, http::HeaderValue)>,
}

impl Forward {
    /// Forwards to `backends`.
    pub fn new(backends: Arc<Backends>) -> Self {
        Self { shared: backends }
    }
}

impl tower::Service<Ticketed<Counted>> for Forward {
    type Response = Response<GatewayBody>;
    type Error = ApiError;
    type Future = BoxFuture<'static, Result<Response<GatewayBody>, ApiError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), ApiError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, ticketed: Ticketed<Counted>) -> Self::Future {
        let gw = self.shared.clone();
        // Everything is taken out here, so the future holds only what forwarding reads.
        let taken = (|| {
            let Ticketed {
                request: counted,
                tenant,
                ticket,
            } = ticketed;
            let Counted {
                request: req,
                route,
                mut parsed,
                sequences,
            } = counted;
            let Arrived(arrived) = *needs::<Arrived>(req.extensions())?;
            let reserved = ticket.cost().decode;
            let request_id = crate::request_id::backend_id(req.headers(), req.extensions());
            let backend = ticket.lease().map_or(0, |l| l.backend());
            // With OpenTelemetry on, the backend's parent span is the forward step's; it ends
            // when the request settles.
            let mut span = crate::otel::step(req.extensions(), crate::otel::Step::Forward);
            let trace = match &mut span {
                Some(span) => {
                    span.server(gw.upstreams[backend].address());
                    span.passed_on()
                }
                None => crate::trace_context::passed_on(req.headers()),
            };
            // No engine runs a prompt longer than the model's context: a backend's count of the
            // prompts is believed up to that.
            let prompts = sequences.prompts.len();
            let reconcile = Reconcile {
                backend: gw.upstreams[backend].url.clone(),
                request_id: crate::request_id::request_id(req.headers()),
                cached_prefill_weight: gw.settings.cached_prefill_weight,
                most_prompt_tokens: (gw.settings.max_model_len)
                    .saturating_mul(prompts.max(1) as u64),
                warnings: gw.count_warnings.clone(),
            };
            // An isolated tenant's requests carry its salt (scoping the client's own) on the
            // routes where vLLM reads one.
            if let (true, Some(salt)) = (route.reads_cache_salt(), &tenant.cache_salt) {
                let client = parsed.body.get(crate::cache_salt::CACHE_SALT);
                let client = client.and_then(serde_json::Value::as_str);
                parsed.cache_salt = Some(crate::cache_salt::scoped(salt, client));
            }
            // Each sequence (every prompt's `n` choices) may write its share of the reservation.
            let sequences = sequences.count();
            let max_output = reserved / sequences.max(1);
            let mut admitted = Admitted::new(
                tenant,
                ticket,
                gw.metrics.clone(),
                OutputCounter {
                    wire: parsed.endpoint.wire(),
                    tokenizer: gw.tokenizer.clone(),
                    pool: gw.pool.clone(),
                    // One answer of one choice is the next turn's history; of several, which
                    // the client keeps is not known.
                    replies: match (route, &gw.replies) {
                        (Route::OpenAi(Endpoint::Chat), Some(pool)) if sequences == 1 => {
                            Some(ReplyMemo {
                                chat: gw.chat.clone(),
                                pool: pool.clone(),
                            })
                        }
                        _ => None,
                    },
                },
                reconcile,
                arrived,
                span,
            );
            admitted.echoes(parsed.echoed_prompt.take());
            let sent = Sent {
                max_output,
                sequences,
                request_id,
                trace,
            };
            Ok::<_, ApiError>((parsed, sent, admitted))
        })();
        Box::pin(async move {
            let (parsed, sent, admitted) = taken?;
            gw.forward(parsed, sent, admitted).await
        })
    }
}

/// The header of vLLM's binary embeddings (`encoding_format: "bytes"`) that holds the rest of
/// the answer as JSON.
const METADATA: &str = "metadata";

impl Backends {
    /// Steps 10-11: send to the leased backend as `sent` says and meter the answer.
    async fn forward(
        &self,
        mut req: Box<GenerationRequest>,
        sent: Sent,
        mut admitted: Admitted,
    ) -> Result<Response<GatewayBody>, ApiError> {
        let Sent {
            max_output,
            sequences,
            request_id,
            trace,
        } = sent;
        let upstream = &self.upstreams[admitted.backend()];
        let now = tokio::time::Instant::now();
        admitted.sent(upstream.decode_floor(), sequences, now);
        let first_byte_deadline = now + upstream.first_byte_timeout();
        let backend_model = &self.settings.backend_model;
        let body = api::rewrite_for_backend(&mut req, max_output, backend_model);
        let forwarded = Some(admitted.forwarded());
        let resp = match upstream
            .send(
                Method::POST,
                &req.endpoint.backend_path(backend_model),
                Some(body),
                Some(&request_id),
                &trace,
                forwarded,
            )
            .await
        {
            Ok(r) => r,
            Err(e) => {
                admitted.end(Ending::unanswered(&e));
                return Err(e);
            }
        };
        let (mut parts, incoming) = resp.into_parts();
        if !parts.status.is_success() {
            // The lease and the charge go back before the error body is read.
            admitted.end(Ending::BackendFailed);
            return Err(upstream.refusal(parts.status, incoming).await);
        }
        // What every answer from here carries: the backend's end-to-end headers and the
        // tenant's rate limits.
        super::upstream::answer_headers(&mut parts.headers);
        (admitted.rate_limit_headers()).apply_in(&mut parts.headers, req.endpoint.wire());
        if let Some(fields) = admitted.quota_fields() {
            fields.apply(&mut parts.headers);
        }
        // A stream the backend answered whole (JSON, not events) is metered as the whole answer
        // it is: read as events it holds none, and would settle as if nothing was generated.
        let answered_whole = parts
            .headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|ct| ct.to_str().ok())
            .is_some_and(crate::body::is_json);
        if !req.stream || answered_whole {
            let bytes = match upstream.read_answer(incoming).await {
                Ok(bytes) => bytes,
                // The backend answered: a body that then fails does not make it free.
                Err(e) => {
                    admitted.end(Ending::CutOff(e.code));
                    return Err(e);
                }
            };
            // An embedding's `bytes` encoding is answered in binary: vLLM sends what its JSON
            // would say beside the vectors (the usage among it) in a `metadata` header.
            // (Looked up for such an answer alone: a JSON answer pays nothing for it.)
            match (!answered_whole)
                .then(|| parts.headers.get(METADATA))
                .flatten()
            {
                Some(metadata) => admitted.finish_json(metadata.as_bytes()),
                None => admitted.finish_json(&bytes),
            }
            return Ok(Response::from_parts(parts, full(bytes)));
        }
        // Wait for the first bytes before answering, so a backend that fails before its
        // first token still gets a proper 502 (or 504) instead of a broken 200 stream. Engines
        // send a stream's headers at once: the first-byte timeout bounds its first chunk too.
        let mut incoming = incoming;
        let first = match tokio::time::timeout_at(first_byte_deadline, incoming.frame()).await {
            Err(_) => {
                let e: ApiError =
                    UpstreamFailure::NoFirstChunk(upstream.first_byte_timeout()).into();
                admitted.end(Ending::unanswered(&e));
                return Err(e);
            }
            Ok(frame) => frame,
        };
        let first = match first {
            Some(Ok(frame)) => frame.into_data().unwrap_or_default(),
            Some(Err(_)) => {
                let e: ApiError = UpstreamFailure::BrokeBeforeFirstChunk.into();
                admitted.end(Ending::unanswered(&e));
                return Err(e);
            }
            None => Bytes::new(),
        };
        // A completion with `echo` streams its whole prompt in its first event (with its
        // logprobs when asked): an event may be as large as a whole answer.
        let max_event_bytes = match admitted.echoes_prompt() {
            true => upstream
                .max_event_bytes()
                .max(upstream.max_response_bytes()),
            false => upstream.max_event_bytes(),
        };
        let stream = MeteredStream::new(
            incoming,
            first,
            admitted,
            req.client_wants_usage,
            upstream.stream_idle_timeout(),
            max_event_bytes,
        );
        Ok(Response::from_parts(parts, stream.boxed_unsync()))
    }
}

#[cfg(test)]
mod tests {
    use crate::api::Endpoint;
    use crate::api::Route;
    use crate::layers::testing::{alice, gateway_to, outcomes_of};
    use crate::server::lane_service;
    use crate::util::bounded::Bounded;
    use bytes::Bytes;
    use http::{Request, Response, StatusCode};
    use http_body_util::{BodyExt, Full};
    use hyper_util::rt::TokioIo;
    use std::convert::Infallible;
    use std::net::SocketAddr;
    use std::time::Duration;
    use tower::ServiceExt;

    /// A backend on 127.0.0.1 that answers every request with `status` and a JSON `body`; it
    /// lives as long as the test's runtime.
    async fn backend(status: u16, body: &'static str) -> SocketAddr {
        let json = [("content-type", "application/json")];
        backend_answering(status, &json, body.as_bytes()).await
    }

    /// [`backend`] answering with these `headers` and any `body`.
    async fn backend_answering(
        status: u16,
        headers: &[(&'static str, &'static str)],
        body: &'static [u8],
    ) -> SocketAddr {
        let headers = headers.to_vec();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binds");
        let addr = listener.local_addr().expect("bound");
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let headers = headers.clone();
                let answer = hyper::service::service_fn(move |_: Request<_>| {
                    let mut answer = Response::builder().status(status);
                    for (name, value) in &headers {
                        answer = answer.header(*name, *value);
                    }
                    let answer = answer
                        .body(Full::new(Bytes::from_static(body)))
                        .expect("valid");
                    async move { Ok::<_, Infallible>(answer) }
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), answer),
                );
            }
        });
        addr
    }

    /// Alice's completion of 3 token ids asking for 10 output tokens, on an in-memory body.
    fn completion() -> Request<Bounded<Full<Bytes>>> {
        let body = r#"{"model": "qwen3.5-27b", "prompt": [1, 2, 3], "max_tokens": 10}"#;
        let mut req = Request::post("/v1/completions")
            .header("authorization", "Bearer sk-alice")
            .body(Full::new(Bytes::from_static(body.as_bytes())))
            .expect("valid");
        req.extensions_mut()
            .insert(Route::OpenAi(Endpoint::Completions));
        req.map(|body| Bounded::new(body, 1 << 16, Duration::from_secs(30)))
    }

    async fn buckets(gw: &crate::gateway::Gateway) -> (f64, f64, f64) {
        let alice = alice(gw);
        let s = gw.limiter.snapshot("alice", &alice.limits).await;
        (
            s.prefill.available,
            s.decode.available,
            s.requests.available,
        )
    }

    #[tokio::test]
    async fn a_whole_answer_is_passed_on_and_settles_what_it_used() {
        let answer = r#"{"choices": [{"index": 0, "text": "abc", "finish_reason": "stop"}], "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}}"#;
        let gw = gateway_to(&backend(200, answer).await.to_string(), 10.0).await;
        let resp = lane_service(&gw, &gw.generation_lane())
            .oneshot(completion())
            .await
            .expect("answered");
        assert_eq!(resp.status(), StatusCode::OK);
        // Right after the charge: 10 of the 1,000 decode tokens counted as used.
        assert_eq!(resp.headers()["x-ratelimit-remaining-tokens"], "990");
        let body = resp.into_body().collect().await.expect("whole").to_bytes();
        assert_eq!(body, answer);
        // 3 prompt tokens and the request stay charged; 6 of the 10 decode tokens came back.
        assert_eq!(buckets(&gw).await, (9997.0, 996.0, 99.0));
        assert_eq!(gw.admission.snapshot().backends[0].kv_reserved_bytes, 0);
        assert_eq!(outcomes_of(&gw.metrics, "alice", "ok"), 1);
    }

    /// An answer in binary (vLLM's embeddings in the `bytes` encoding) is metered by the usage
    /// its `metadata` header holds, as the same answer in JSON would be: settled on the
    /// backend's 5 prompt tokens where 3 were counted.
    #[tokio::test]
    async fn a_binary_answer_is_metered_by_its_metadata_header() {
        let usage = r#"{"usage": {"prompt_tokens": 5, "completion_tokens": 0, "total_tokens": 5}}"#;
        let settled = |gw: std::sync::Arc<crate::gateway::Gateway>| async move {
            let resp = lane_service(&gw, &gw.generation_lane())
                .oneshot(completion())
                .await
                .expect("answered");
            assert_eq!(resp.status(), StatusCode::OK);
            let body = resp.into_body().collect().await.expect("whole").to_bytes();
            (
                body,
                buckets(&gw).await,
                outcomes_of(&gw.metrics, "alice", "ok"),
            )
        };
        let binary_answer = [
            ("content-type", "application/octet-stream"),
            ("metadata", usage),
        ];
        let addr = backend_answering(200, &binary_answer, &[0x3f, 0x80, 0, 0]).await;
        let binary = settled(gateway_to(&addr.to_string(), 10.0).await).await;
        assert_eq!(binary.0, Bytes::from_static(&[0x3f, 0x80, 0, 0]));
        let json = settled(gateway_to(&backend(200, usage).await.to_string(), 10.0).await).await;
        assert_eq!((binary.1, binary.2), (json.1, json.2));
        assert_eq!(binary.1 .0, 9995.0);
    }

    #[tokio::test]
    async fn a_stream_the_backend_answers_whole_is_metered_as_the_whole_answer() {
        let answer = r#"{"choices": [{"index": 0, "text": "abc", "finish_reason": "stop"}], "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}}"#;
        let gw = gateway_to(&backend(200, answer).await.to_string(), 10.0).await;
        let body =
            r#"{"model": "qwen3.5-27b", "prompt": [1, 2, 3], "max_tokens": 10, "stream": true}"#;
        let req = completion().map(|b| {
            let streamed = Full::new(Bytes::from_static(body.as_bytes()));
            Bounded::new(streamed, b.max_bytes(), b.timeout())
        });
        let resp = lane_service(&gw, &gw.generation_lane())
            .oneshot(req)
            .await
            .expect("answered");
        assert_eq!(resp.status(), StatusCode::OK);
        let body = resp.into_body().collect().await.expect("whole").to_bytes();
        assert_eq!(body, answer);
        // As the same answer not streamed: 6 of the 10 decode tokens came back, not all 10.
        assert_eq!(buckets(&gw).await, (9997.0, 996.0, 99.0));
        assert_eq!(gw.admission.snapshot().backends[0].kv_reserved_bytes, 0);
        assert_eq!(outcomes_of(&gw.metrics, "alice", "ok"), 1);
    }

    #[tokio::test]
    async fn a_failing_backend_is_a_502_that_charges_nothing() {
        let gw = gateway_to(&backend(500, "{}").await.to_string(), 10.0).await;
        let e = lane_service(&gw, &gw.generation_lane())
            .oneshot(completion())
            .await
            .unwrap_err();
        assert_eq!(
            (e.status, e.code, e.message.as_str()),
            (
                StatusCode::BAD_GATEWAY,
                crate::error::ErrorCode::UpstreamError,
                "the backend failed with status 500 Internal Server Error"
            )
        );
        assert_eq!(buckets(&gw).await, (10000.0, 1000.0, 100.0));
        assert_eq!(gw.admission.snapshot().backends[0].kv_reserved_bytes, 0);
        // Counted once, as the error, not as a client gone.
        assert_eq!(outcomes_of(&gw.metrics, "alice", "upstream_error"), 1);
        assert_eq!(outcomes_of(&gw.metrics, "alice", "client_disconnect"), 0);
    }
}
