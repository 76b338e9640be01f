//! The request path of a generation request, steps 5 to 11 of DESIGN.md, one function per
//! step: authenticate, parse, count, charge, admit, forward, meter. Each step either hands the
//! next one what it needs or returns an [`ApiError`]; whatever was taken before a failing step
//! is given back by the guards it lives in.

pub mod bounded;
pub mod discard;
pub mod forward;
pub mod meter;
pub mod tls;

use crate::admission::Admission;
use crate::api::openai::{self, Endpoint, GenerationRequest, ParseLimits, Prompt};
use crate::api::{self, Route, Wire};
use crate::capacity::sequence_footprint_bytes;
use crate::config::Config;
use crate::error::{ApiError, BodyError, NotAdmitted, UpstreamFailure};
use crate::limiter::{BucketKind, Cost, Denial, Limiter, LowerBound, Reservation};
use crate::metrics::{self, Metrics};
use crate::reload::LiveConfig;
use crate::tenant::Tenant;
use crate::tokenize::cache::ChatCounter;
use crate::tokenize::chat::ChatPrompt;
use crate::tokenize::pool::TokenizePool;
use crate::tokenize::{TokenCount, Tokenizer};
use crate::vision;
use bounded::read_bounded;
use bytes::Bytes;
use forward::Upstream;
use http::{header, HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Full};
use hyper::body::Incoming;
use meter::{Admitted, MeteredStream, OutputCounter, ReplyMemo};
use std::convert::Infallible;
use std::sync::Arc;
use tokio::time::Instant;

/// The body of every response the gateway sends.
pub type GatewayBody = UnsyncBoxBody<Bytes, Infallible>;

/// A complete in-memory body.
pub fn full(bytes: impl Into<Bytes>) -> GatewayBody {
    Full::new(bytes.into()).boxed_unsync()
}

/// A JSON response.
pub fn json_response(status: StatusCode, value: &serde_json::Value) -> Response<GatewayBody> {
    let mut resp = Response::new(full(value.to_string()));
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

/// Everything the request path needs, built once from a validated [`Config`].
pub struct Gateway {
    /// The configuration it was started with. Its restart-only settings (all but the tenants
    /// and the backends' sizing) stay in force; a reload never changes them.
    pub config: Arc<Config>,
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
    /// Where the bodies of requests refused unread are read and dropped.
    pub discarder: Arc<discard::Discarder>,
}

/// Request bodies up to this size are parsed where they arrive (well under a millisecond);
/// larger ones on the tokenizer pool (see [`Gateway::read_json`]).
const PARSE_INLINE_BYTES: usize = 64 << 10;

/// The header of a request's id (the client's, or one the gateway made): sent to the backend,
/// and the gateway's is the one in the answer.
pub const REQUEST_ID: &str = "x-request-id";

impl Gateway {
    /// Step 5: the tenant behind the request's API key.
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<Arc<Tenant>, ApiError> {
        self.live.current().tenants.authenticate(headers)
    }

    /// Step 3 (body side): the content type, checked before the body is read.
    pub fn check_content_type(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        if let Some(ct) = headers.get(header::CONTENT_TYPE) {
            let ct = ct.to_str().unwrap_or_default();
            let mime = ct.split(';').next().unwrap_or_default().trim();
            if !mime.eq_ignore_ascii_case("application/json") {
                return Err(ApiError::unsupported_media_type(format!(
                    "content-type must be application/json, got `{ct}`"
                )));
            }
        }
        Ok(())
    }

    /// Step 3 (body side) and step 6: [`Gateway::check_content_type`], then
    /// [`Gateway::read_body_json`].
    pub async fn read_json<T: Send + 'static>(
        &self,
        tenant: &str,
        req: Request<Incoming>,
        parse: impl FnOnce(serde_json::Map<String, serde_json::Value>) -> Result<T, ApiError>
            + Send
            + 'static,
    ) -> Result<T, ApiError> {
        self.check_content_type(req.headers())?;
        self.read_body_json(tenant, req.into_body(), parse).await
    }

    /// The body, within the size limit and read timeout, then `parse` of it as a JSON object.
    /// Both parsing steps run where the body arrived for bodies up to 64 KiB (well under a
    /// millisecond), on the tenant's share of the worker pool for larger ones.
    pub async fn read_body_json<T: Send + 'static>(
        &self,
        tenant: &str,
        body: Incoming,
        parse: impl FnOnce(serde_json::Map<String, serde_json::Value>) -> Result<T, ApiError>
            + Send
            + 'static,
    ) -> Result<T, ApiError> {
        let limit = self.config.server.max_body_bytes;
        let timeout = self.config.server.body_read_timeout;
        let bytes = read_bounded(body, limit, timeout)
            .await
            .map_err(|error| BodyError {
                error,
                max_bytes: limit,
                timeout,
            })?;
        let bytes_len = bytes.len();
        let job = move || parse(openai::parse_object(&bytes)?);
        if bytes_len <= PARSE_INLINE_BYTES {
            return job();
        }
        // Milliseconds of parsing near the body limit: on the worker pool, not the executor.
        self.pool.run(tenant, job).await?
    }

    /// Reads and drops the body of a request refused before its body was read, at the pace of
    /// [`discard`], so the client reads its answer and the connection stays usable. A client
    /// waiting for `100 Continue` has sent nothing: there is nothing to read.
    fn discard_body(&self, req: Request<Incoming>) {
        let expects_continue = req
            .headers()
            .get(header::EXPECT)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
        if !expects_continue {
            let server = &self.config.server;
            self.discarder.discard(
                req.into_body(),
                server.max_body_bytes,
                server.body_read_timeout,
            );
        }
    }

    /// A refusal of what the tenant's buckets cannot admit now even at the least the request
    /// can cost (`cost`, exact where `exact` says so), before its prompt is counted. Charges
    /// nothing (the charge after counting decides again).
    async fn check_at_least(
        &self,
        tenant: &Tenant,
        cost: Cost,
        exact: [bool; 3],
    ) -> Result<(), ApiError> {
        match self.limiter.check(&tenant.name, &tenant.limits, cost).await {
            Ok(_) => Ok(()),
            Err(denial) => Err(LowerBound { denial, exact }.into()),
        }
    }

    /// Step 7: prompt tokens, counted on the tenant's share of the worker pool, never on the
    /// executor, and only up to `ceiling`: past it, the count is a lower bound and the rest
    /// of the prompt is never tokenized.
    pub async fn count_prompt(
        &self,
        tenant: &str,
        prompt: Prompt,
        ceiling: u64,
    ) -> Result<TokenCount, ApiError> {
        let ceiling = usize::try_from(ceiling).unwrap_or(usize::MAX);
        let started = Instant::now();
        let tok = self.tokenizer.clone();
        let counted = match prompt {
            // Already tokens: nothing to run on the pool (nor to be refused by it).
            Prompt::TokenIds(ids) => return Ok(TokenCount::of(ids.len(), ceiling)),
            Prompt::Chat { prompt, media } => {
                let chat = self.chat.clone();
                self.pool
                    .run(tenant, move || {
                        if !media.is_empty() {
                            render_paired(&chat, &prompt, &media)?;
                        }
                        // Images and video are counted from their headers: the text gets what
                        // is left of the ceiling.
                        let media = vision::extra_tokens(&media, tok.as_ref());
                        let media = usize::try_from(media).unwrap_or(usize::MAX);
                        let left = ceiling.saturating_sub(media);
                        let text = chat.count_up_to(tok.as_ref(), &prompt, left)?;
                        Ok::<_, ApiError>(match text {
                            TokenCount::Exact(n) => {
                                TokenCount::of(n.saturating_add(media), ceiling)
                            }
                            TokenCount::AtLeast(n) => TokenCount::AtLeast(n.saturating_add(media)),
                        })
                    })
                    .await
            }
            Prompt::Text(t) => {
                self.pool
                    .run(tenant, move || {
                        Ok::<_, ApiError>(tok.count_up_to(&t, ceiling))
                    })
                    .await
            }
        };
        self.metrics
            .tokenize
            .observe(started.elapsed().as_secs_f64());
        match counted {
            Ok(Ok(n)) => Ok(n),
            Ok(Err(e)) => Err(e),
            Err(e) => Err(e.into()),
        }
    }

    /// The ids the engine will run (for `/tokenize`): a chat rendered, encoded and its image
    /// and video placeholders expanded, so their number is what [`Gateway::count_prompt`]
    /// charges.
    pub async fn encode_prompt(&self, tenant: &str, prompt: Prompt) -> Result<Vec<u32>, ApiError> {
        let tok = self.tokenizer.clone();
        let chat = self.chat.clone();
        let encoded = self
            .pool
            .run(tenant, move || match prompt {
                Prompt::Chat { prompt, media } => {
                    let ids = tok.encode(&render_paired(&chat, &prompt, &media)?);
                    vision::expand_ids(ids, &media, &tok).map_err(ApiError::invalid)
                }
                Prompt::Text(t) => Ok(tok.encode(&t)),
                Prompt::TokenIds(ids) => Ok(ids),
            })
            .await;
        encoded?
    }

    /// The longest prompt `req` may have: the context minus the output asked for (the prompt
    /// alone must leave room for one output token), and no more than the tenant's prefill
    /// burst. Counting stops past it: a longer prompt is refused whatever its exact count.
    fn prompt_ceiling(&self, tenant: &Tenant, req: &GenerationRequest) -> u64 {
        let max_len = self.config.model.max_model_len;
        let context = match req.requested_max_tokens {
            Some((_, asked)) => max_len.saturating_sub(asked),
            None => max_len - 1,
        };
        context.min(tenant.limits.prefill.capacity().floor() as u64)
    }

    /// Output tokens to reserve: what the client asked for, or the default clamped to the
    /// context; more than the context allows is a 400 naming both numbers (the prompt's "at
    /// least" when its count stopped at the ceiling).
    pub fn output_budget(
        &self,
        req: &GenerationRequest,
        prompt: TokenCount,
    ) -> Result<u64, ApiError> {
        let max_len = self.config.model.max_model_len;
        let (prompt_tokens, least) = match prompt {
            TokenCount::Exact(n) => (n as u64, ""),
            TokenCount::AtLeast(n) => (n as u64, "at least "),
        };
        match req.requested_max_tokens {
            Some((field, asked)) if prompt_tokens + asked > max_len => Err(ApiError::context_length(format!(
                "this model's maximum context length is {max_len} tokens; the prompt is {least}{prompt_tokens} tokens and {asked} output tokens were requested ({least}{} in all)",
                prompt_tokens + asked
            ))
            .with_param(field.param())),
            Some((_, asked)) => Ok(asked),
            None if prompt_tokens >= max_len => Err(ApiError::context_length(format!(
                "this model's maximum context length is {max_len} tokens; the prompt alone is {least}{prompt_tokens} tokens"
            ))
            .with_param(req.endpoint.prompt_param())),
            None => Ok(self.config.model.default_max_tokens.min(max_len - prompt_tokens)),
        }
    }

    /// Step 8: charge the tenant's buckets, all or nothing, under the limits in force now: a
    /// reload while the request was read or counted may have changed them, or removed the
    /// tenant (whose key then no longer works).
    pub async fn charge(&self, tenant: &Tenant, cost: Cost) -> Result<Reservation, ApiError> {
        let live = self.live.current();
        let current = live.tenants.named(&tenant.name).ok_or_else(|| {
            ApiError::unauthorized(format!(
                "tenant {} was removed by a config reload while this request was read; its API keys no longer work",
                tenant.name
            ))
        })?;
        self.limiter
            .reserve(&current.name, &current.limits, cost)
            .await
            .map_err(ApiError::from)
    }

    /// Step 9: a KV lease for the request's footprint, waiting fairly if needed.
    pub async fn admit(
        &self,
        tenant: &Tenant,
        tokens: u64,
    ) -> Result<crate::admission::Lease, ApiError> {
        let m = &self.config.model;
        let bytes = sequence_footprint_bytes(
            tokens,
            m.block_tokens,
            m.kv_bytes_per_token,
            m.state_bytes_per_sequence,
        );
        let started = Instant::now();
        let result = self.admission.admit(&tenant.name, bytes).await;
        self.metrics
            .queue_wait
            .get_or_create(&metrics::tenant(&tenant.name))
            .observe(started.elapsed().as_secs_f64());
        result.map_err(|error| {
            ApiError::from(NotAdmitted {
                error,
                tokens,
                queue_deadline: self.config.admission.queue_deadline,
            })
        })
    }

    /// Steps 5-11 for a generation route (OpenAI's or MindIE's native ones); also returns the
    /// tenant (`unknown` when authentication failed) so the outcome can be counted.
    pub async fn generate(
        &self,
        route: Route,
        req: Request<Incoming>,
    ) -> (Option<String>, Result<Response<GatewayBody>, ApiError>) {
        let arrived = Instant::now();
        let tenant = match self.authenticate(req.headers()) {
            Ok(t) => t,
            Err(e) => return (Some("unknown".to_string()), Err(e)),
        };
        let name = tenant.name.clone();
        (
            Some(name),
            self.generate_for(tenant, route, req, arrived).await,
        )
    }

    async fn generate_for(
        &self,
        tenant: Arc<Tenant>,
        route: Route,
        req: Request<Incoming>,
        arrived: Instant,
    ) -> Result<Response<GatewayBody>, ApiError> {
        let request_id = req.headers().get(REQUEST_ID).cloned();
        self.check_content_type(req.headers())?;
        // Every request costs at least one prefill token, one decode token and one request:
        // what the buckets cannot give even that now is refused before its body is read.
        let least = Cost {
            prefill: 1,
            decode: 1,
            requests: 1,
        };
        if let Err(e) = self
            .check_at_least(&tenant, least, [false, false, true])
            .await
        {
            self.discard_body(req);
            return Err(e);
        }
        let config = self.config.clone();
        let mut parsed = self
            .read_body_json(&tenant.name, req.into_body(), move |body| {
                let limits = ParseLimits {
                    served_names: &config.model.served_names,
                    max_model_len: config.model.max_model_len,
                    vision: &config.vision_rules,
                };
                api::parse_generation(route, body, &limits)
            })
            .await?;
        // With max_tokens known, the decode bucket is checked before counting too.
        if let Some((_, asked)) = parsed.requested_max_tokens {
            let least = Cost {
                decode: asked,
                ..least
            };
            self.check_at_least(&tenant, least, [false, true, true])
                .await?;
        }
        let prompt = std::mem::replace(&mut parsed.prompt, Prompt::TokenIds(Vec::new()));
        let ceiling = self.prompt_ceiling(&tenant, &parsed);
        let counted = self.count_prompt(&tenant.name, prompt, ceiling).await?;
        let max_output = self.output_budget(&parsed, counted)?;
        let prompt_tokens = match counted {
            TokenCount::Exact(n) => n as u64,
            // Within the context, so past the prefill burst: it can never be admitted.
            TokenCount::AtLeast(n) => {
                let denial = Denial::Never {
                    bucket: BucketKind::Prefill,
                    needed: n as u64,
                    capacity: tenant.limits.prefill.capacity(),
                };
                return Err(LowerBound {
                    denial,
                    exact: [false, true, true],
                }
                .into());
            }
        };
        let cost = Cost {
            prefill: prompt_tokens,
            decode: max_output,
            requests: 1,
        };
        let mut queued = Queued {
            reservation: Some(self.charge(&tenant, cost).await?),
            tenant: &tenant.name,
            metrics: &self.metrics,
        };
        let admitted = self.admit(&tenant, prompt_tokens + max_output).await;
        let mut reservation = queued.reservation.take().expect("taken only here");
        drop(queued);
        let lease = match admitted {
            Ok(l) => l,
            Err(e) => {
                reservation.refund_all();
                return Err(e);
            }
        };
        let label = metrics::tenant(&tenant.name);
        self.metrics
            .prefill_tokens
            .get_or_create(&label)
            .inc_by(prompt_tokens);
        self.metrics
            .decode_tokens_reserved
            .get_or_create(&label)
            .inc_by(max_output);
        self.metrics
            .prompt_tokens
            .get_or_create(&label)
            .observe(prompt_tokens as f64);
        let admitted = Admitted::new(
            tenant,
            reservation,
            lease,
            self.metrics.clone(),
            OutputCounter {
                wire: route.wire(),
                tokenizer: self.tokenizer.clone(),
                pool: self.pool.clone(),
                replies: match (route, &self.replies) {
                    (Route::OpenAi(Endpoint::Chat), Some(pool)) => Some(ReplyMemo {
                        chat: self.chat.clone(),
                        pool: pool.clone(),
                    }),
                    _ => None,
                },
            },
            arrived,
        );
        self.forward(parsed, max_output, admitted, request_id.as_ref())
            .await
    }

    /// Steps 10-11: send to the leased backend (with the request's id) and meter the answer.
    /// Anything but a complete 2xx answer charges nothing (see `forward` for the policy).
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
            Err(e) => {
                admitted.cancel();
                return Err(e);
            }
        };
        let (mut parts, incoming) = resp.into_parts();
        if !parts.status.is_success() {
            // The lease and the charge go back before the error body is read.
            admitted.cancel();
            return Err(upstream.refusal(parts.status, incoming).await);
        }
        // What every answer from here carries: the backend's end-to-end headers and the
        // tenant's rate limits.
        forward::answer_headers(&mut parts.headers);
        admitted.rate_limit_headers().apply(&mut parts.headers);
        if !req.stream {
            let bytes = match upstream.read_answer(incoming).await {
                Ok(bytes) => bytes,
                Err(e) => {
                    admitted.cancel();
                    return Err(e);
                }
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
                admitted.cancel();
                return Err(UpstreamFailure::NoFirstChunk(upstream.first_byte_timeout()).into());
            }
            Ok(frame) => frame,
        };
        let first = match first {
            Some(Ok(frame)) => frame.into_data().unwrap_or_default(),
            Some(Err(_)) => {
                admitted.cancel();
                return Err(UpstreamFailure::BrokeBeforeFirstChunk.into());
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

    /// `POST /tokenize`, answered locally in vLLM's shape.
    pub async fn tokenize(
        &self,
        req: Request<Incoming>,
    ) -> Result<Response<GatewayBody>, ApiError> {
        let tenant = self.authenticate(req.headers())?;
        let config = self.config.clone();
        let prompt = self
            .read_json(&tenant.name, req, move |body| {
                if let Some(v) = body.get("model").filter(|v| !v.is_null()) {
                    let m = v.as_str().unwrap_or_default();
                    if !config.model.served_names.iter().any(|n| n == m) {
                        return Err(ApiError::model_not_found(m));
                    }
                }
                if body.contains_key("messages") {
                    openai::parse_chat_prompt(&body, &config.vision_rules)
                } else {
                    openai::parse_completion_prompt(&body)
                }
            })
            .await?;
        let ids = self.encode_prompt(&tenant.name, prompt).await?;
        Ok(json_response(
            StatusCode::OK,
            &serde_json::json!({
                "count": ids.len(),
                "max_model_len": self.config.model.max_model_len,
                "tokens": ids,
            }),
        ))
    }

    /// `GET /v1/models`, from the first backend that answers with a 2xx (a 4xx is passed on
    /// in OpenAI's shape; a backend that fails is skipped).
    pub async fn models(&self, headers: &HeaderMap) -> Result<Response<GatewayBody>, ApiError> {
        self.authenticate(headers)?;
        let request_id = headers.get(REQUEST_ID);
        let mut last = ApiError::upstream("no backend is configured");
        for upstream in &self.upstreams {
            let answer = async {
                let resp = upstream
                    .send(Method::GET, "/v1/models", None, request_id)
                    .await?;
                let (mut parts, body) = resp.into_parts();
                if !parts.status.is_success() {
                    return Err(upstream.refusal(parts.status, body).await);
                }
                let bytes = upstream.read_answer(body).await?;
                forward::answer_headers(&mut parts.headers);
                Ok(Response::from_parts(parts, full(bytes)))
            };
            match answer.await {
                Err(e) if e.status.is_server_error() => last = e,
                done => return done,
            }
        }
        Err(last)
    }
}

/// A charged request waiting for KV space. Dropped there (the client went away), it gives back
/// everything that was charged, since nothing reached a backend, and counts the disconnect.
struct Queued<'a> {
    reservation: Option<Reservation>,
    tenant: &'a str,
    metrics: &'a Metrics,
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        if let Some(mut r) = self.reservation.take() {
            r.refund_all();
            self.metrics
                .outcome(self.tenant, metrics::Outcome::ClientDisconnect);
        }
    }
}

/// The chat rendered, refused with a 400 naming `messages` when its placeholders do not pair
/// with the images and videos sent ([`vision::check_placeholders`]).
fn render_paired(
    chat: &ChatCounter,
    prompt: &ChatPrompt,
    media: &[vision::Media],
) -> Result<String, ApiError> {
    let rendered = chat.template().render(prompt)?;
    vision::check_placeholders(&rendered, media)
        .map_err(|m| ApiError::invalid_param("messages", m))?;
    Ok(rendered)
}
