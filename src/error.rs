//! The one error type of the request path and its one mapping to an HTTP response:
//! status, headers and OpenAI's `{"error": {"message", "type", "param", "code"}}` body (TGI's
//! `{"error", "error_type"}` on MindIE's native routes).
//! Every room returns its own typed failure ([`Denial`], [`LowerBound`], [`AdmitError`],
//! [`PoolError`], [`BodyRefusal`], [`UpstreamFailure`]); they all become an [`ApiError`] here, and
//! nowhere else.

pub use crate::error_code::ErrorCode;

use crate::admission::{AdmitError, ClassRefused, ClassShares, Priority, Sequences};
use crate::api::{Refusal, RefusalKind, Route};
use crate::body::{BodyError, BodyRefusal, ClosesConnection};
use crate::limiter::{BucketKind, Denial, LowerBound, RateLimitHeaders};
use crate::reload::ReloadError;
use crate::tenant::Unauthenticated;
use crate::tokenize::chat::TemplateError;
use crate::tokenize::pool::PoolError;
use crate::util::bounded::ReadError;
use crate::util::decimal::push_decimal;
use crate::wire::Wire;
use bytes::Bytes;
use http::{header, HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use http_body_util::Full;
use std::time::Duration;

/// What went wrong, in the terms the client sees.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{status} {code}: {message}")]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// OpenAI `error.code`.
    pub code: ErrorCode,
    /// OpenAI `error.type`.
    pub kind: &'static str,
    /// Human message naming the field and the numbers.
    pub message: String,
    /// Offending parameter, if one.
    pub param: Option<String>,
    /// `retry-after`, rounded up to whole seconds when sent.
    pub retry_after: Option<Duration>,
    /// `x-ratelimit-*` headers of a 429 (boxed: errors travel in `Result`s on every path).
    pub rate_limit: Option<Box<RateLimitHeaders>>,
    /// `RateLimit-Policy` and `RateLimit` of a quota refusal.
    pub quota: Option<Box<crate::quota::RateLimitFields>>,
    /// `allow` of a 405: the method the path answers.
    pub allow: Option<Allow>,
    /// `connection: close`: the request's body was left unread, so its connection ends with
    /// this answer (see [`ApiError::closing_connection`]).
    pub closes_connection: bool,
}

/// The one method a path answers, for a 405's `allow` (a byte, not a string: errors travel in
/// `Result`s on every path and stay small).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allow {
    /// `GET`.
    Get,
    /// `POST`.
    Post,
}

impl Allow {
    /// The method's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Allow::Get => "GET",
            Allow::Post => "POST",
        }
    }
}

impl ApiError {
    /// An error answered with `code`'s status and `type`.
    fn new(code: ErrorCode, message: String) -> Self {
        Self {
            // upstream_rejected's status is the backend's, which its constructor sets.
            status: code.status().unwrap_or(StatusCode::BAD_REQUEST),
            code,
            kind: code.kind(),
            message,
            param: None,
            retry_after: None,
            rate_limit: None,
            quota: None,
            allow: None,
            closes_connection: false,
        }
    }

    /// 400 `invalid_request`.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidRequest, message.into())
    }

    /// 400 `invalid_request` about one parameter.
    pub fn invalid_param(param: &str, message: impl Into<String>) -> Self {
        Self::invalid(message).with_param(param)
    }

    /// 400 `context_length_exceeded`.
    pub fn context_length(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::ContextLengthExceeded, message.into())
    }

    /// 400 `exceeds_tenant_burst`: the request can never fit the tenant's bucket.
    pub fn exceeds_burst(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::ExceedsTenantBurst, message.into())
    }

    /// 400 `exceeds_kv_capacity`: the request can never fit any backend's KV cache.
    pub fn exceeds_kv(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::ExceedsKvCapacity, message.into())
    }

    /// 401 `invalid_api_key`.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidApiKey, message.into())
    }

    /// 401 `invalid_admin_token`: the admin listener's token is missing or wrong.
    pub fn admin_unauthorized(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidAdminToken, message.into())
    }

    /// 404 `not_found`.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::NotFound, message.into())
    }

    /// 404 `model_not_found`.
    pub fn model_not_found(model: &str) -> Self {
        Self::new(
            ErrorCode::ModelNotFound,
            format!("The model `{model}` does not exist or you do not have access to it."),
        )
        .with_param("model")
    }

    /// 405 `method_not_allowed`, with `allow` naming the method `path` answers.
    pub fn method_not_allowed(method: &http::Method, path: &str, allow: Allow) -> Self {
        let mut e = Self::new(
            ErrorCode::MethodNotAllowed,
            format!(
                "{method} is not allowed on {path}; it answers {}",
                allow.as_str()
            ),
        );
        e.allow = Some(allow);
        e
    }

    /// 408 `request_timeout`: the body did not arrive in time.
    pub fn request_timeout(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::RequestTimeout, message.into())
    }

    /// 409 `restart_required` (admin reload): the config file changes settings only a restart
    /// applies, or the gateway was not started from a file; the running config is kept.
    pub fn restart_required(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::RestartRequired, message.into())
    }

    /// 422 `invalid_config` (admin reload): the config file cannot be read, parsed or
    /// validated; the running config is kept.
    pub fn invalid_config(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidConfig, message.into())
    }

    /// 413 `payload_too_large`.
    pub fn payload_too_large(limit_bytes: u64) -> Self {
        Self::new(
            ErrorCode::PayloadTooLarge,
            format!("request body is larger than the limit of {limit_bytes} bytes"),
        )
    }

    /// 413 `payload_too_large`: a body of more JSON items than `server.max_json_items`.
    pub fn too_many_items(most: u64) -> Self {
        Self::new(
            ErrorCode::PayloadTooLarge,
            format!(
                "request body holds more than {most} JSON objects, arrays and strings, the most \
                 the gateway reads in one body (server.max_json_items): send fewer blocks, \
                 parts or messages"
            ),
        )
    }

    /// 415 `unsupported_media_type`.
    pub fn unsupported_media_type(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::UnsupportedMediaType, message.into())
    }

    /// 429 `rate_limit_exceeded`, whose `type` says which kind of bucket refused, as OpenAI's
    /// does: `tokens` (prefill or decode) or `requests`.
    pub fn rate_limited(
        bucket: BucketKind,
        message: impl Into<String>,
        retry_after: Duration,
        headers: RateLimitHeaders,
    ) -> Self {
        let mut e = Self::new(ErrorCode::RateLimitExceeded, message.into());
        e.kind = unit(bucket);
        e.retry_after = Some(retry_after);
        e.rate_limit = Some(Box::new(headers));
        e
    }

    /// 429 `concurrency_exceeded`: the tenant has `max_inflight` requests in flight or
    /// `max_queued` places in the KV queue already.
    pub fn concurrency_exceeded(message: impl Into<String>, retry_after: Duration) -> Self {
        let mut e = Self::new(ErrorCode::ConcurrencyExceeded, message.into());
        e.kind = unit(BucketKind::Requests);
        e.retry_after = Some(retry_after);
        e
    }

    /// 503 `capacity_exhausted`: the KV queue is full or the wait passed its deadline.
    pub fn capacity_exhausted(message: impl Into<String>, retry_after: Duration) -> Self {
        let mut e = Self::new(ErrorCode::CapacityExhausted, message.into());
        e.retry_after = Some(retry_after);
        e
    }

    /// 503 `overloaded`: a local resource (the tokenizer pool) is saturated.
    pub fn overloaded(message: impl Into<String>, retry_after: Duration) -> Self {
        let mut e = Self::new(ErrorCode::Overloaded, message.into());
        e.retry_after = Some(retry_after);
        e
    }

    /// 503 `limiter_unavailable`: the shared limiter store (Redis) cannot be reached and the
    /// policy is to refuse (`limiter.on_store_error = "fail_closed"`).
    pub fn limiter_unavailable(message: impl Into<String>, retry_after: Duration) -> Self {
        let mut e = Self::new(ErrorCode::LimiterUnavailable, message.into());
        e.retry_after = Some(retry_after);
        e
    }

    /// The refusal of a request by its tenant's quotas: 429 `quota_exceeded` with the wait to
    /// the window's reset (or until enough of a rolling window's spend has left it), 400
    /// `exceeds_quota` when the request alone may use more than the window allows, 503
    /// `limiter_unavailable` when the store cannot be asked, 400 for a model without a price.
    pub fn quota(tenant: &str, e: crate::quota::QuotaError) -> Self {
        use crate::quota::store::QuotaRefusal;
        use crate::quota::QuotaError;
        let denial = match e {
            QuotaError::Refused(QuotaRefusal::Denied(denial)) => denial,
            QuotaError::Refused(QuotaRefusal::Unavailable(why)) => {
                return Self::limiter_unavailable(
                    format!("the quota store cannot be reached ({why}); nothing was charged"),
                    Duration::from_secs(1),
                )
            }
            QuotaError::Unpriced(model) => {
                let why = format!(
                    "tenant {tenant} has a cost quota and model {model:?} has no price in [prices]"
                );
                return Self::invalid_param("model", why);
            }
        };
        let r = &denial.reading;
        let m = &r.meter;
        let window = m.window.label();
        let mut e = if denial.never {
            Self::new(
                ErrorCode::ExceedsQuota,
                format!(
                    "tenant {tenant}'s {} quota over {window} is {}; this request may use up to {} (its prompt and all of its output limit): lower max_tokens",
                    m.unit,
                    m.phrase(r.limit),
                    m.phrase(denial.needed),
                ),
            )
        } else {
            let mut e = Self::new(
                ErrorCode::QuotaExceeded,
                format!(
                    "tenant {tenant}'s {} quota over {window} is reached: limit {}, {} spent, {} held by requests in flight; this request may use up to {} (its prompt and all of its output limit); the window resets at {}, retry after {} s",
                    m.unit,
                    m.phrase(r.limit),
                    m.phrase(r.spent),
                    m.phrase(r.reserved),
                    m.phrase(denial.needed),
                    m.window.local_time(r.resets_at),
                    retry_after_secs(denial.retry_after),
                ),
            );
            e.retry_after = Some(denial.retry_after);
            e
        };
        // OpenAI's type for a spent budget.
        e.kind = "insufficient_quota";
        e.quota = Some(Box::new(crate::quota::RateLimitFields::of(r)));
        e
    }

    /// 502 `upstream_error`.
    pub fn upstream(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::UpstreamError, message.into())
    }

    /// A backend's 4xx passed on: its status, `upstream_rejected`, the backend's message.
    pub fn upstream_rejected(status: StatusCode, message: impl Into<String>) -> Self {
        debug_assert!(status.is_client_error(), "only a 4xx is passed on");
        let mut e = Self::new(ErrorCode::UpstreamRejected, message.into());
        e.status = status;
        e
    }

    /// 504 `upstream_timeout`.
    pub fn upstream_timeout(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::UpstreamTimeout, message.into())
    }

    /// 500 `internal_error`: a bug; the message never carries internals.
    pub fn internal() -> Self {
        Self::new(
            ErrorCode::InternalError,
            "internal error in the gateway; see its logs".to_string(),
        )
    }

    /// 500 `internal_error`: a layer did not find what the layers before it add to a request's
    /// extensions (a stack composed in the wrong order); logged with the type's name.
    pub fn missing_extension(what: &str) -> Self {
        tracing::error!(
            missing = what,
            "a request reached a layer without what an earlier layer adds"
        );
        Self::internal()
    }

    /// The same refusal, answered with `connection: close`: its request's body is not read, so
    /// the connection cannot carry another request, and a server that answers before reading
    /// the whole body says whether it will close (RFC 9110, 10.1.1).
    pub fn closing_connection(mut self) -> Self {
        self.closes_connection = true;
        self
    }

    /// Names the offending parameter.
    pub fn with_param(mut self, param: &str) -> Self {
        self.param = Some(param.to_string());
        self
    }

    /// The OpenAI error body.
    pub fn body_json(&self) -> serde_json::Value {
        self.body_in(Wire::OpenAi)
    }

    /// The error body in `wire`'s shape: OpenAI's (the Responses API's too), TGI's
    /// `{"error", "error_type"}` (what MindIE's native clients read), whose `error_type` is the
    /// OpenAI `code`, or Anthropic's `{"type": "error", "error": {"type", "message"}}` with the
    /// type its status has there.
    pub fn body_in(&self, wire: Wire) -> serde_json::Value {
        match wire {
            Wire::OpenAi | Wire::Responses | Wire::Cohere => serde_json::json!({
                "error": {
                    "message": self.message,
                    "type": self.kind,
                    "param": self.param,
                    "code": self.code.as_str(),
                }
            }),
            Wire::Tgi | Wire::VllmGenerate | Wire::Triton => serde_json::json!({
                "error": self.message,
                "error_type": self.code.as_str(),
            }),
            Wire::Anthropic => serde_json::json!({
                "type": "error",
                "error": {
                    "type": anthropic_type(self.status),
                    "message": self.message,
                }
            }),
        }
    }

    /// The full HTTP response with OpenAI's body: status, headers and body.
    pub fn to_response<B: From<Bytes>>(&self) -> Response<B> {
        self.to_response_in(Wire::OpenAi)
    }

    /// The full HTTP response with the body in `wire`'s shape; the status and headers
    /// (`retry-after`, `x-ratelimit-*`, `allow`, `www-authenticate`) are the same in both.
    pub fn to_response_in<B: From<Bytes>>(&self, wire: Wire) -> Response<B> {
        let body = Bytes::from(self.body_in(wire).to_string());
        let mut resp = Response::new(B::from(body));
        *resp.status_mut() = self.status;
        let h = resp.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if self.status == StatusCode::UNAUTHORIZED {
            // RFC 9110: a 401 names the scheme that would be accepted.
            h.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if let Some(wait) = self.retry_after {
            h.insert(
                header::RETRY_AFTER,
                HeaderValue::from(retry_after_secs(wait)),
            );
        }
        if let Some(rl) = &self.rate_limit {
            rl.apply_in(h, wire);
        }
        if let Some(fields) = &self.quota {
            fields.apply(h);
        }
        if let Some(allow) = self.allow {
            h.insert(header::ALLOW, HeaderValue::from_static(allow.as_str()));
        }
        if self.closes_connection {
            // HTTP/2 has no such header: hyper leaves it out there, and the stream is reset.
            h.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        resp
    }
}

/// A value of [`RateLimitHeaders`]: a number, or a wait in OpenAI's format.
enum Field {
    Count(u64),
    Reset(Duration),
}

impl RateLimitHeaders {
    /// [`RateLimitHeaders::apply`], and for Anthropic's clients the same limits under
    /// Anthropic's names ([`RateLimitHeaders::apply_anthropic`]).
    pub fn apply_in(&self, h: &mut HeaderMap, wire: Wire) {
        self.apply(h);
        if wire == Wire::Anthropic {
            self.apply_anthropic(h, crate::clock::Clock::wall(&crate::clock::SystemClock));
        }
    }

    /// Anthropic's `anthropic-ratelimit-{requests,input-tokens,output-tokens,tokens}-{limit,
    /// remaining,reset}`: the request bucket, the prefill bucket (what prompts may cost), the
    /// decode bucket (what answers may generate), and of those two the one with fewer tokens
    /// left (Anthropic's `tokens` are its most restrictive token limit), each reset the RFC 3339
    /// time, from `now`, at which its bucket is full again.
    pub fn apply_anthropic(&self, h: &mut HeaderMap, now: std::time::SystemTime) {
        // The names are made at compile time, as `apply`'s are.
        macro_rules! names {
            ($limit:literal) => {
                [
                    HeaderName::from_static(concat!("anthropic-ratelimit-", $limit, "-limit")),
                    HeaderName::from_static(concat!("anthropic-ratelimit-", $limit, "-remaining")),
                    HeaderName::from_static(concat!("anthropic-ratelimit-", $limit, "-reset")),
                ]
            };
        }
        const REQUESTS: [HeaderName; 3] = names!("requests");
        const INPUT_TOKENS: [HeaderName; 3] = names!("input-tokens");
        const OUTPUT_TOKENS: [HeaderName; 3] = names!("output-tokens");
        const TOKENS: [HeaderName; 3] = names!("tokens");
        let input = (
            self.limit_input_tokens,
            self.remaining_input_tokens,
            self.reset_input_tokens,
        );
        let output = (self.limit_tokens, self.remaining_tokens, self.reset_tokens);
        let tighter = if input.1 < output.1 { input } else { output };
        let requests = (
            self.limit_requests,
            self.remaining_requests,
            self.reset_requests,
        );
        let buckets = [
            (REQUESTS, requests),
            (INPUT_TOKENS, input),
            (OUTPUT_TOKENS, output),
            (TOKENS, tighter),
        ];
        for ([limit_name, remaining_name, reset_name], (limit, remaining, reset)) in buckets {
            // Whole seconds, rounded up: the bucket is full by then.
            let reset = now + Duration::from_secs(reset.as_nanos().div_ceil(1_000_000_000) as u64);
            let reset = humantime::format_rfc3339_seconds(reset).to_string();
            h.insert(limit_name, HeaderValue::from(limit));
            h.insert(remaining_name, HeaderValue::from(remaining));
            h.insert(
                reset_name,
                HeaderValue::try_from(reset).expect("an RFC 3339 time"),
            );
        }
    }

    /// Sets the six `x-ratelimit-*` headers.
    pub fn apply(&self, h: &mut HeaderMap) {
        // This runs on every answer: the six values are written without `fmt` into one buffer,
        // and each header is a slice of it (one allocation in place of six).
        // The names are made at compile time (checking a name's bytes was a fifth of this).
        const NAMES: [HeaderName; 6] = [
            HeaderName::from_static("x-ratelimit-limit-tokens"),
            HeaderName::from_static("x-ratelimit-remaining-tokens"),
            HeaderName::from_static("x-ratelimit-reset-tokens"),
            HeaderName::from_static("x-ratelimit-limit-requests"),
            HeaderName::from_static("x-ratelimit-remaining-requests"),
            HeaderName::from_static("x-ratelimit-reset-requests"),
        ];
        let fields = [
            Field::Count(self.limit_tokens),
            Field::Count(self.remaining_tokens),
            Field::Reset(self.reset_tokens),
            Field::Count(self.limit_requests),
            Field::Count(self.remaining_requests),
            Field::Reset(self.reset_requests),
        ];
        let mut text = Vec::with_capacity(128);
        let ends: [usize; 6] = std::array::from_fn(|i| {
            match fields[i] {
                Field::Count(n) => push_decimal(&mut text, n),
                Field::Reset(d) => write_reset(&mut text, d),
            }
            text.len()
        });
        let text = Bytes::from(text);
        h.reserve(fields.len());
        let mut start = 0;
        for (name, end) in NAMES.into_iter().zip(ends) {
            let value =
                HeaderValue::from_maybe_shared(text.slice(start..end)).expect("digits and units");
            h.insert(name, value);
            start = end;
        }
    }
}

/// What a bucket counts, in OpenAI's words: `tokens` or `requests` (a 429's `type`).
fn unit(bucket: BucketKind) -> &'static str {
    match bucket {
        BucketKind::Prefill | BucketKind::Decode => "tokens",
        BucketKind::Requests => "requests",
    }
}

impl From<Refusal> for ApiError {
    /// A 400 `invalid_request`, or a 404 `model_not_found`, with the reader's message and field.
    fn from(r: Refusal) -> Self {
        let code = match r.kind {
            RefusalKind::Invalid => ErrorCode::InvalidRequest,
            RefusalKind::ModelNotFound => ErrorCode::ModelNotFound,
        };
        let e = ApiError::new(code, r.message);
        match r.param {
            Some(param) => e.with_param(&param),
            None => e,
        }
    }
}

impl From<Denial> for ApiError {
    /// `NotYet` is a 429 with the exact wait; `Never` a 400 naming the bucket and its capacity.
    fn from(denial: Denial) -> Self {
        denial_error(denial, [true; 3])
    }
}

impl From<LowerBound> for ApiError {
    /// As a [`Denial`], with "at least" before each amount that is a lower bound (and before
    /// the wait, when any is).
    fn from(bound: LowerBound) -> Self {
        denial_error(bound.denial, bound.exact)
    }
}

/// The error of `denial` for a cost whose amounts are exact where `exact` says so.
fn denial_error(denial: Denial, exact: [bool; 3]) -> ApiError {
    let least = |exact: bool| if exact { "" } else { "at least " };
    match denial {
        Denial::NotYet {
            bucket,
            needed,
            available,
            retry_after,
            snapshot,
        } => ApiError::rate_limited(
            bucket,
            format!(
                "rate limit reached for {bucket}: request needs {}{needed} {}, {} available; \
                 retry after {}{:.3} s",
                least(exact[bucket as usize]),
                unit(bucket),
                available.floor(),
                least(exact.iter().all(|&e| e)),
                retry_after.as_secs_f64()
            ),
            retry_after,
            snapshot.rate_limit_headers(),
        ),
        Denial::Never {
            bucket,
            needed,
            capacity,
        } => {
            let e = ApiError::exceeds_burst(format!(
                "request needs {}{needed} {bucket} {}; the tenant's {bucket} burst is {}",
                least(exact[bucket as usize]),
                unit(bucket),
                capacity.floor()
            ));
            if bucket == BucketKind::Decode {
                e.with_param("max_tokens")
            } else {
                e
            }
        }
        Denial::Unavailable {
            reason,
            retry_after,
        } => ApiError::limiter_unavailable(
            format!(
                "the rate limiter's shared store cannot be reached ({reason}) and \
                 limiter.on_store_error is fail_closed: no request is admitted until it \
                 answers; retry after {:.3} s",
                retry_after.as_secs_f64()
            ),
            retry_after,
        ),
    }
}

/// The `retry-after` of a 429 `concurrency_exceeded`: a place frees when one of the tenant's
/// own requests ends or is granted, which nothing foretells, so a short wait.
pub const CONCURRENCY_RETRY_AFTER: Duration = Duration::from_secs(1);

/// A refusal of the KV admission (step 9), with what its message names: the request's
/// tokens (prompt + max output) and the queue deadline a 503 asks to wait.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotAdmitted {
    /// Why.
    pub error: AdmitError,
    /// The request's prompt + max output tokens.
    pub tokens: u64,
    /// `tokens` is a lower bound: the prompt was not counted yet (one token each was taken).
    pub tokens_at_least: bool,
    /// `admission.queue_deadline`: the `retry-after` of a 503.
    pub queue_deadline: Duration,
    /// Its sequences, as a refusal of their number names them.
    pub runs: Runs,
}

/// A request's sequences as a refusal of their number names them: its prompts, the choices of
/// each, and the member listing the prompts with what they are called
/// ([`Route::prompts_listed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Runs {
    /// How many prompts.
    pub prompts: u64,
    /// The choices of each (`n`).
    pub choices: u32,
    /// The member listing the prompts, and what they are called.
    pub listed: Option<(&'static str, &'static str)>,
}

impl Runs {
    /// `sequences` of a request to `route`; a request without them (the user's own code's)
    /// is one prompt of one choice, as admission counts it.
    pub fn of(sequences: Option<&Sequences>, route: Option<Route>) -> Self {
        Self {
            prompts: sequences.map_or(1, |s| s.prompts.len() as u64),
            choices: sequences.map_or(1, |s| s.choices),
            listed: route.and_then(Route::prompts_listed),
        }
    }

    /// The refusal of these sequences where a backend runs at most `largest_batch` of a `class`
    /// request at once, `share_permille` of its batch (more than a whole batch run in turns,
    /// so only a class with a share of less than the whole is refused them): naming `n` when a
    /// prompt has several choices, else the member listing the prompts (none when the route
    /// is not known).
    fn too_many(self, largest_batch: u32, class: Priority, share_permille: u32) -> ApiError {
        let sequences = self.prompts.saturating_mul(u64::from(self.choices));
        let share = if share_permille < ClassShares::FULL.permille(class) {
            format!(
                " (admission.{class}_share = {}; more sequences than a backend's whole batch run in turns only in a class that may hold all of it)",
                f64::from(share_permille) / 1000.0
            )
        } else {
            String::new()
        };
        let over = format!(
            "more than a {class} request may run at once on any backend (largest: {largest_batch}){share}"
        );
        let many = self.listed.map_or("prompts", |(_, many)| many);
        let prompts = self.prompts;
        let (message, param) = match (prompts, self.choices) {
            (0 | 1, _) => (
                format!("the request runs {sequences} sequences (`n` choices), {over}; lower n"),
                Some("n"),
            ),
            (_, 1) => (
                format!("the request runs {sequences} sequences (its {prompts} {many}), {over}; send fewer {many}"),
                self.listed.map(|(member, _)| member),
            ),
            _ => (
                format!("the request runs {sequences} sequences (its {prompts} {many}, `n` choices of each), {over}; lower n or send fewer {many}"),
                Some("n"),
            ),
        };
        let e = ApiError::exceeds_kv(message);
        match param {
            Some(param) => e.with_param(param),
            None => e,
        }
    }
}

impl From<NotAdmitted> for ApiError {
    /// Never fits: 400 `exceeds_kv_capacity`; queue full or deadline passed: 503
    /// `capacity_exhausted` with `retry-after` = the queue deadline.
    fn from(refusal: NotAdmitted) -> Self {
        let NotAdmitted {
            error,
            tokens,
            tokens_at_least,
            queue_deadline,
            runs,
        } = refusal;
        let at_least = if tokens_at_least { "at least " } else { "" };
        match error {
            AdmitError::NeverFits { sequences, largest_batch, class, share_permille, .. } if sequences > largest_batch => {
                runs.too_many(largest_batch, class, share_permille)
            }
            AdmitError::NeverFits { bytes, largest_capacity, class, share_permille, .. } => {
                let whole = if share_permille < ClassShares::FULL.permille(class) {
                    format!("the share a {class} request may hold of any backend (admission.{class}_share = {}; largest: {largest_capacity} bytes)", f64::from(share_permille) / 1000.0)
                } else {
                    format!("the KV capacity of every backend (largest: {largest_capacity} bytes)")
                };
                ApiError::exceeds_kv(format!(
                    "the request's KV footprint ({at_least}{tokens} tokens of prompt + max output = {at_least}{bytes} bytes) is larger than {whole}; lower max_tokens or shorten the prompt"
                ))
            }
            AdmitError::QueueFull { waiting, max_waiting } => ApiError::capacity_exhausted(
                format!("the KV cache is full and {waiting} requests already wait for it (queue limit {max_waiting}); retry later"),
                queue_deadline,
            ),
            AdmitError::TenantQueueFull { tenant, queued, max_queued } => ApiError::concurrency_exceeded(
                format!("tenant {tenant} has {queued} requests waiting in the KV queue; max_queued is {max_queued}"),
                CONCURRENCY_RETRY_AFTER,
            ),
            AdmitError::Shed { waiting_above } => ApiError::capacity_exhausted(
                format!("the KV cache is full and {waiting_above} requests of a higher priority class wait for it; a sheddable request is not queued behind them; retry later"),
                queue_deadline,
            ),
            AdmitError::Displaced { class, by, waited, max_waiting } => ApiError::capacity_exhausted(
                format!(
                    "this {class} request waited {} in the full KV queue (limit {max_waiting}) and gave its place to a {by} request; retry later",
                    humantime::format_duration(Duration::from_millis(waited.as_millis() as u64))
                ),
                queue_deadline,
            ),
            AdmitError::Unavailable { retry_after } => ApiError::limiter_unavailable(
                format!(
                    "the shared KV ledger (Redis) cannot be reached and limiter.on_store_error is fail_closed: no request is admitted until it answers; retry after {:.3} s",
                    retry_after.as_secs_f64()
                ),
                retry_after,
            ),
            AdmitError::Unlearned => ApiError::capacity_exhausted(
                "no backend's KV cache is known yet: every backend learns it from its engine (kv = \"engine\") and none has been read (GET /admin/backends says why); retry later".to_string(),
                queue_deadline,
            ),
            AdmitError::DeadlineExceeded { waited, deadline } => ApiError::capacity_exhausted(
                format!(
                    "no KV-cache space freed up within the queue deadline of {} (waited {}); retry later",
                    humantime::format_duration(deadline),
                    humantime::format_duration(Duration::from_millis(waited.as_millis() as u64))
                ),
                queue_deadline,
            ),
        }
    }
}

impl From<ReloadError> for ApiError {
    /// 422 `invalid_config` for a file that does not load; 409 `restart_required` otherwise.
    fn from(e: ReloadError) -> Self {
        match e {
            ReloadError::Invalid(_) => ApiError::invalid_config(e.to_string()),
            ReloadError::NoFile | ReloadError::NeedsRestart(_) => {
                ApiError::restart_required(e.to_string())
            }
        }
    }
}

impl From<Unauthenticated> for ApiError {
    /// 401 with the credential's code (`invalid_api_key`, `invalid_admin_token`).
    fn from(e: Unauthenticated) -> Self {
        ApiError::new(e.code, e.message)
    }
}

impl From<ClassRefused> for ApiError {
    /// 400 `invalid_request` naming the `x-tokengate-priority` header or `service_tier`.
    fn from(e: ClassRefused) -> Self {
        ApiError::invalid_param(e.param, e.message)
    }
}

impl From<TemplateError> for ApiError {
    /// What the template refused, as the request's readers refuse it ([`Refusal`]).
    fn from(err: TemplateError) -> Self {
        Refusal::from(err).into()
    }
}

impl From<PoolError> for ApiError {
    /// A full tokenizer queue is a 503 `overloaded` (retry in a second); a panicked job a 500.
    fn from(e: PoolError) -> Self {
        match e {
            PoolError::Full { waiting, share } => ApiError::overloaded(
                format!("all tokenizer workers are busy and the queue is full (tokenizer.queue_depth); this tenant already has {waiting} jobs waiting, its share of the queue while others wait is {share}; retry shortly"),
                Duration::from_secs(1),
            ),
            PoolError::PushedOut { waiting, share } => ApiError::overloaded(
                format!("this request waited for a tokenizer worker and gave its place to another tenant's: this tenant had {waiting} jobs waiting in the full queue, more than its share of {share}; retry shortly"),
                Duration::from_secs(1),
            ),
            PoolError::Panicked => ApiError::internal(),
        }
    }
}

impl From<BodyRefusal> for ApiError {
    /// 415 for a body not JSON, 413 for one of too many items; the rest as their own kind.
    fn from(r: BodyRefusal) -> Self {
        match r {
            BodyRefusal::NotJson(_) => ApiError::unsupported_media_type(r.to_string()),
            BodyRefusal::Unread(e) => e.into(),
            BodyRefusal::TooManyItems(most) => ApiError::too_many_items(most),
            BodyRefusal::Invalid(r) => r.into(),
            BodyRefusal::Pool(e) => e.into(),
        }
    }
}

impl ClosesConnection for ApiError {
    fn closing_connection(self) -> Self {
        ApiError::closing_connection(self)
    }
}

impl From<BodyError> for ApiError {
    /// 413 over the size bound, 408 past the time bound, 400 for a broken body.
    fn from(e: BodyError) -> Self {
        match e.error {
            ReadError::TimedOut => ApiError::request_timeout(format!(
                "the request body did not arrive within {}",
                humantime::format_duration(e.timeout)
            )),
            ReadError::TooLarge => ApiError::payload_too_large(e.max_bytes),
            ReadError::Broken => ApiError::invalid("the request body could not be read"),
        }
    }
}

/// How a backend failed a request: every one is a 502 or a 504 whose message says what the
/// gateway saw and nothing of the backend's body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamFailure {
    /// No connection could be made.
    Unreachable,
    /// The connection closed before the response headers.
    Closed,
    /// No response headers within the first-byte timeout.
    NoAnswer(Duration),
    /// A stream's first chunk did not come within the first-byte timeout.
    NoFirstChunk(Duration),
    /// A stream broke before its first chunk.
    BrokeBeforeFirstChunk,
    /// A status neither 2xx nor 4xx.
    Status(StatusCode),
    /// A whole answer over `max_response_bytes`.
    AnswerTooLarge(u64),
    /// A whole answer not complete within `body_read_timeout` of its headers.
    AnswerTimedOut(Duration),
    /// The connection closed in the middle of a whole answer.
    AnswerBroken,
    /// A stream event over `max_event_bytes`.
    EventTooLarge(u64),
    /// A stream silent for `stream_idle_timeout` after its first chunk.
    Stalled(Duration),
    /// A stream that broke after its first chunk.
    StreamBroke,
}

impl From<UpstreamFailure> for ApiError {
    fn from(f: UpstreamFailure) -> Self {
        let t = humantime::format_duration;
        match f {
            UpstreamFailure::Unreachable => {
                ApiError::upstream("the backend refused the connection or could not be reached")
            }
            UpstreamFailure::Closed => {
                ApiError::upstream("the backend closed the connection before answering")
            }
            UpstreamFailure::NoAnswer(d) => {
                ApiError::upstream_timeout(format!("the backend did not answer within {}", t(d)))
            }
            UpstreamFailure::NoFirstChunk(d) => {
                ApiError::upstream_timeout(format!("the backend streamed nothing within {}", t(d)))
            }
            UpstreamFailure::BrokeBeforeFirstChunk => {
                ApiError::upstream("the backend stream broke before its first token")
            }
            UpstreamFailure::Status(status) => {
                ApiError::upstream(format!("the backend failed with status {status}"))
            }
            UpstreamFailure::AnswerTooLarge(max) => ApiError::upstream(format!(
                "the backend's answer is larger than the gateway's limit of {max} bytes (backends[].max_response_bytes)"
            )),
            UpstreamFailure::AnswerTimedOut(d) => ApiError::upstream_timeout(format!(
                "the backend did not finish its answer within {} of starting it (backends[].body_read_timeout)",
                t(d)
            )),
            UpstreamFailure::AnswerBroken => {
                ApiError::upstream("the backend closed the connection mid-answer")
            }
            UpstreamFailure::EventTooLarge(max) => ApiError::upstream(format!(
                "the backend sent a stream event larger than the gateway's limit of {max} bytes (backends[].max_event_bytes)"
            )),
            UpstreamFailure::Stalled(d) => ApiError::upstream_timeout(format!(
                "the backend sent no output for {} in the middle of its answer",
                t(d)
            )),
            UpstreamFailure::StreamBroke => {
                ApiError::upstream("the backend stream broke before it finished")
            }
        }
    }
}

impl From<std::convert::Infallible> for ApiError {
    /// For services that cannot fail, under layers whose error is an `ApiError`.
    fn from(never: std::convert::Infallible) -> Self {
        match never {}
    }
}

/// `retry-after` in whole seconds, rounded up, never 0 for a positive wait.
pub fn retry_after_secs(wait: Duration) -> u64 {
    let whole = wait.as_secs();
    if wait.subsec_nanos() > 0 {
        whole + 1
    } else {
        whole
    }
}

/// OpenAI's reset duration format onto `out`: `12ms`, `1s`, `1.5s`, `6m0s`; under a second in
/// whole milliseconds, under a minute in seconds with up to three decimals (rounded up), then
/// minutes and seconds, and hours.
fn write_reset(out: &mut Vec<u8>, d: Duration) {
    let ms = d.as_millis();
    if ms < 1000 {
        push_decimal(out, ms as u64);
        out.extend_from_slice(b"ms");
        return;
    }
    if d < Duration::from_secs(60) {
        // Whole milliseconds, rounded up, written as seconds.
        let ms = (d.as_nanos()).div_ceil(1_000_000) as u64;
        push_decimal(out, ms / 1000);
        let frac = ms % 1000;
        if frac > 0 {
            let digits = [
                b'.',
                b'0' + (frac / 100) as u8,
                b'0' + (frac / 10 % 10) as u8,
                b'0' + (frac % 10) as u8,
            ];
            // Without trailing zeros (a digit is not zero: `frac` is not).
            let mut keep = digits.len();
            while digits[keep - 1] == b'0' {
                keep -= 1;
            }
            out.extend_from_slice(&digits[..keep]);
        }
        out.push(b's');
        return;
    }
    let mins = d.as_secs() / 60;
    let secs = d.as_secs() % 60;
    if mins >= 60 {
        push_decimal(out, mins / 60);
        out.push(b'h');
    }
    push_decimal(out, if mins >= 60 { mins % 60 } else { mins });
    out.push(b'm');
    push_decimal(out, secs);
    out.push(b's');
}

/// The body type used for locally generated responses.
pub type FullBody = Full<Bytes>;

/// The error type Anthropic's API gives a status (what its SDKs' users read; the SDKs pick
/// their exception by the status).
fn anthropic_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        400..=499 => "invalid_request_error",
        _ => "api_error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_rounds_up() {
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_secs(2)), 2);
        assert_eq!(retry_after_secs(Duration::from_millis(2001)), 3);
        assert_eq!(retry_after_secs(Duration::ZERO), 0);
    }

    fn format_reset(d: Duration) -> String {
        let mut text = Vec::new();
        write_reset(&mut text, d);
        String::from_utf8(text).unwrap()
    }

    #[test]
    fn reset_format_matches_openai() {
        assert_eq!(format_reset(Duration::from_millis(12)), "12ms");
        assert_eq!(format_reset(Duration::from_secs(1)), "1s");
        assert_eq!(format_reset(Duration::from_millis(1500)), "1.5s");
        assert_eq!(format_reset(Duration::from_secs(360)), "6m0s");
        assert_eq!(format_reset(Duration::from_secs(3 * 3600 + 125)), "3h2m5s");
        assert_eq!(format_reset(Duration::from_nanos(1_001_000_001)), "1.002s");
        assert_eq!(
            format_reset(Duration::from_millis(59_999) + Duration::from_nanos(1)),
            "60s"
        );
        assert_eq!(format_reset(Duration::ZERO), "0ms");
    }

    /// The seconds are written with integers: every millisecond under a minute (and a
    /// nanosecond past each, which rounds up) reads back as that many milliseconds, in at most
    /// three decimals without trailing zeros. (The floating-point formula this replaced read an
    /// exact 1.132 s as 1.133 s: 1.132 x 1000 is 1132.0000000000002 in binary.)
    #[test]
    fn reset_seconds_are_exact_milliseconds_rounded_up() {
        assert_eq!(format_reset(Duration::from_millis(1132)), "1.132s");
        for ms in 1000..60_000u64 {
            for (d, want) in [
                (Duration::from_millis(ms), ms),
                (Duration::from_millis(ms) + Duration::from_nanos(1), ms + 1),
            ] {
                let text = format_reset(d);
                let number = text.strip_suffix('s').unwrap();
                let secs: f64 = number.parse().unwrap();
                assert_eq!((secs * 1000.0).round() as u64, want, "{d:?}: {text}");
                let decimals = number.split_once('.').map_or("", |(_, f)| f);
                assert!(decimals.len() <= 3 && !decimals.ends_with('0'), "{text}");
            }
        }
    }

    #[test]
    fn rate_limit_headers_are_written_as_numbers_and_durations() {
        let mut h = HeaderMap::new();
        RateLimitHeaders {
            limit_tokens: 12_000,
            remaining_tokens: 0,
            reset_tokens: Duration::from_millis(1500),
            limit_requests: 18_446_744_073_709_551_615,
            remaining_requests: 7,
            reset_requests: Duration::from_millis(12),
            limit_input_tokens: 99,
            remaining_input_tokens: 98,
            reset_input_tokens: Duration::from_millis(97),
        }
        .apply(&mut h);
        let got: Vec<(&str, &str)> = h
            .iter()
            .map(|(k, v)| (k.as_str(), v.to_str().unwrap()))
            .collect();
        assert_eq!(
            got,
            [
                ("x-ratelimit-limit-tokens", "12000"),
                ("x-ratelimit-remaining-tokens", "0"),
                ("x-ratelimit-reset-tokens", "1.5s"),
                ("x-ratelimit-limit-requests", "18446744073709551615"),
                ("x-ratelimit-remaining-requests", "7"),
                ("x-ratelimit-reset-requests", "12ms"),
            ]
        );
    }

    #[test]
    fn anthropic_rate_limit_headers_say_when_each_bucket_is_full_again() {
        let mut h = HeaderMap::new();
        let now = std::time::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        RateLimitHeaders {
            limit_tokens: 300,
            remaining_tokens: 50,
            reset_tokens: Duration::from_millis(12_500),
            limit_requests: 15,
            remaining_requests: 15,
            reset_requests: Duration::ZERO,
            limit_input_tokens: 20_000,
            remaining_input_tokens: 19_000,
            reset_input_tokens: Duration::from_millis(1),
        }
        .apply_anthropic(&mut h, now);
        let got: Vec<(&str, &str)> = h
            .iter()
            .map(|(k, v)| (k.as_str(), v.to_str().unwrap()))
            .collect();
        assert_eq!(
            got,
            [
                ("anthropic-ratelimit-requests-limit", "15"),
                ("anthropic-ratelimit-requests-remaining", "15"),
                ("anthropic-ratelimit-requests-reset", "2027-01-15T08:00:00Z"),
                ("anthropic-ratelimit-input-tokens-limit", "20000"),
                ("anthropic-ratelimit-input-tokens-remaining", "19000"),
                (
                    "anthropic-ratelimit-input-tokens-reset",
                    "2027-01-15T08:00:01Z"
                ),
                ("anthropic-ratelimit-output-tokens-limit", "300"),
                ("anthropic-ratelimit-output-tokens-remaining", "50"),
                // 12.5 s, rounded up to whole seconds.
                (
                    "anthropic-ratelimit-output-tokens-reset",
                    "2027-01-15T08:00:13Z"
                ),
                // The output tokens: fewer are left of them.
                ("anthropic-ratelimit-tokens-limit", "300"),
                ("anthropic-ratelimit-tokens-remaining", "50"),
                ("anthropic-ratelimit-tokens-reset", "2027-01-15T08:00:13Z"),
            ]
        );
        let e = ApiError::invalid_param("max_tokens", "`max_tokens` is required");
        assert_eq!(
            e.body_in(Wire::Anthropic),
            serde_json::json!({"type": "error", "error": {
                "type": "invalid_request_error", "message": "`max_tokens` is required"}})
        );
        let statuses = [401, 403, 404, 413, 429, 500, 502, 503, 504];
        let types: Vec<_> = statuses
            .map(|s| anthropic_type(StatusCode::from_u16(s).unwrap()))
            .into();
        assert_eq!(
            types,
            [
                "authentication_error",
                "permission_error",
                "not_found_error",
                "request_too_large",
                "rate_limit_error",
                "api_error",
                "api_error",
                "overloaded_error",
                "api_error",
            ]
        );
    }

    fn not_yet(bucket: BucketKind) -> Denial {
        let full = crate::limiter::BucketSnapshot {
            rate_per_second: 1.0,
            available: 0.0,
            capacity: 10.0,
            time_to_full: Duration::from_secs(10),
        };
        Denial::NotYet {
            bucket,
            needed: 2,
            available: 0.0,
            retry_after: Duration::from_secs(2),
            snapshot: crate::limiter::TenantSnapshot {
                prefill: full,
                decode: full,
                requests: full,
            },
        }
    }

    #[test]
    fn a_429_says_which_kind_of_bucket_refused_as_openai_does() {
        let kind = |bucket| ApiError::from(not_yet(bucket)).body_json()["error"]["type"].clone();
        assert_eq!(kind(BucketKind::Prefill), "tokens");
        assert_eq!(kind(BucketKind::Decode), "tokens");
        assert_eq!(kind(BucketKind::Requests), "requests");
        let e = ApiError::from(LowerBound {
            denial: not_yet(BucketKind::Requests),
            exact: [false, false, true],
        });
        assert_eq!(
            (e.status, e.code, e.kind),
            (
                StatusCode::TOO_MANY_REQUESTS,
                crate::error::ErrorCode::RateLimitExceeded,
                "requests"
            )
        );
        assert_eq!(
            e.message,
            "rate limit reached for requests: request needs 2 requests, 0 available; retry after at least 2.000 s"
        );
    }

    #[test]
    fn too_many_sequences_name_what_the_client_can_lower() {
        use crate::api::{Endpoint, Pooled};
        // The refusal of `prompts` of `choices` each to `route` (if known), at most 4 at once.
        let refusal = |route: Option<Route>, prompts: usize, choices| {
            let sequences = Sequences {
                prompts: vec![7; prompts],
                choices,
            };
            let e = ApiError::from(NotAdmitted {
                error: AdmitError::NeverFits {
                    bytes: 900,
                    largest_capacity: 4000,
                    sequences: sequences.count() as u32,
                    largest_batch: 4,
                    class: Priority::Standard,
                    share_permille: 1000,
                },
                tokens: 300,
                tokens_at_least: false,
                queue_deadline: Duration::from_secs(10),
                runs: Runs::of(Some(&sequences), route),
            });
            assert_eq!(e.code, crate::error::ErrorCode::ExceedsKvCapacity);
            (e.param, e.message)
        };
        let over = "more than a standard request may run at once on any backend (largest: 4)";
        let (batch, scoring) = (Route::OpenAi(Endpoint::ChatBatch), Route::GenerativeScoring);
        let (completions, chat) = (
            Route::OpenAi(Endpoint::Completions),
            Route::OpenAi(Endpoint::Chat),
        );
        // One choice of each prompt: the member listing them, counted; several choices: `n`,
        // whatever the prompts; a route not known (the user's own code's): prompts, no member.
        let cases = [
            (
                Some(batch),
                5,
                1,
                Some("messages"),
                "(its 5 conversations)",
                "send fewer conversations",
            ),
            (
                Some(scoring),
                5,
                1,
                Some("items"),
                "(its 5 items)",
                "send fewer items",
            ),
            (
                Some(Route::Pooling(Pooled::Rerank)),
                5,
                1,
                Some("documents"),
                "(its 5 queries and documents)",
                "send fewer queries and documents",
            ),
            (
                Some(completions),
                5,
                1,
                Some("prompt"),
                "(its 5 prompts)",
                "send fewer prompts",
            ),
            (
                Some(completions),
                3,
                2,
                Some("n"),
                "(its 3 prompts, `n` choices of each)",
                "lower n or send fewer prompts",
            ),
            (
                Some(completions),
                1,
                5,
                Some("n"),
                "(`n` choices)",
                "lower n",
            ),
            (Some(chat), 1, 5, Some("n"), "(`n` choices)", "lower n"),
            (None, 5, 1, None, "(its 5 prompts)", "send fewer prompts"),
        ];
        for (route, prompts, choices, param, what, advice) in cases {
            let sequences = prompts as u32 * choices;
            assert_eq!(
                refusal(route, prompts, choices),
                (
                    param.map(str::to_string),
                    format!("the request runs {sequences} sequences {what}, {over}; {advice}")
                ),
                "{route:?} {prompts} {choices}"
            );
        }
    }

    #[test]
    fn kv_refusals_name_the_tokens_and_wait_the_queue_deadline() {
        let deadline = Duration::from_secs(10);
        let refusal_of = |error, tokens_at_least| {
            ApiError::from(NotAdmitted {
                error,
                tokens: 300,
                tokens_at_least,
                queue_deadline: deadline,
                runs: Runs::of(None, None),
            })
        };
        let refusal = |error| refusal_of(error, false);
        let too_big = AdmitError::NeverFits {
            bytes: 900,
            largest_capacity: 800,
            sequences: 1,
            largest_batch: 4,
            class: Priority::Standard,
            share_permille: 1000,
        };
        let e = refusal(too_big.clone());
        assert_eq!(
            (e.status, e.code, e.retry_after),
            (
                StatusCode::BAD_REQUEST,
                crate::error::ErrorCode::ExceedsKvCapacity,
                None
            )
        );
        assert_eq!(e.message, "the request's KV footprint (300 tokens of prompt + max output = 900 bytes) is larger than the KV capacity of every backend (largest: 800 bytes); lower max_tokens or shorten the prompt");
        // Refused before its prompt was counted: the numbers are lower bounds, and say so.
        let e = refusal_of(too_big, true);
        assert_eq!(e.message, "the request's KV footprint (at least 300 tokens of prompt + max output = at least 900 bytes) is larger than the KV capacity of every backend (largest: 800 bytes); lower max_tokens or shorten the prompt");
        let e = refusal(AdmitError::NeverFits {
            bytes: 900,
            largest_capacity: 400,
            sequences: 1,
            largest_batch: 4,
            class: Priority::Sheddable,
            share_permille: 500,
        });
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.message, "the request's KV footprint (300 tokens of prompt + max output = 900 bytes) is larger than the share a sheddable request may hold of any backend (admission.sheddable_share = 0.5; largest: 400 bytes); lower max_tokens or shorten the prompt");
        let e = refusal(AdmitError::DeadlineExceeded {
            waited: Duration::from_millis(10_000_400),
            deadline: Duration::from_secs(10),
        });
        assert_eq!(
            (e.status, e.code, e.retry_after),
            (
                StatusCode::SERVICE_UNAVAILABLE,
                crate::error::ErrorCode::CapacityExhausted,
                Some(deadline)
            )
        );
        assert_eq!(e.message, "no KV-cache space freed up within the queue deadline of 10s (waited 2h 46m 40s 400ms); retry later");
        let e = refusal(AdmitError::Shed { waiting_above: 7 });
        assert_eq!(
            (e.status, e.code, e.retry_after),
            (
                StatusCode::SERVICE_UNAVAILABLE,
                crate::error::ErrorCode::CapacityExhausted,
                Some(deadline)
            )
        );
        assert_eq!(e.message, "the KV cache is full and 7 requests of a higher priority class wait for it; a sheddable request is not queued behind them; retry later");
        let e = refusal(AdmitError::Displaced {
            class: crate::admission::Priority::Sheddable,
            by: crate::admission::Priority::Critical,
            waited: Duration::from_millis(1500),
            max_waiting: 256,
        });
        assert_eq!(
            (e.status, e.code, e.retry_after),
            (
                StatusCode::SERVICE_UNAVAILABLE,
                crate::error::ErrorCode::CapacityExhausted,
                Some(deadline)
            )
        );
        assert_eq!(e.message, "this sheddable request waited 1s 500ms in the full KV queue (limit 256) and gave its place to a critical request; retry later");
    }

    #[test]
    fn body_refusals_map_to_their_answers() {
        let not_json = ApiError::from(BodyRefusal::NotJson("text/plain".into()));
        assert_eq!(
            (not_json.status, not_json.code, not_json.message.as_str()),
            (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                ErrorCode::UnsupportedMediaType,
                "content-type must be application/json, got `text/plain`"
            )
        );
        let items = ApiError::from(BodyRefusal::TooManyItems(7));
        assert_eq!(
            (items.status, items.code),
            (StatusCode::PAYLOAD_TOO_LARGE, ErrorCode::PayloadTooLarge)
        );
        assert!(items
            .message
            .starts_with("request body holds more than 7 JSON"));
        let invalid = ApiError::from(BodyRefusal::from(Refusal::invalid_param("n", "bad n")));
        assert_eq!(
            (invalid.status, invalid.param.as_deref()),
            (StatusCode::BAD_REQUEST, Some("n"))
        );
        let unread = ApiError::from(BodyRefusal::Unread(BodyError {
            error: ReadError::TooLarge,
            max_bytes: 5,
            timeout: Duration::from_secs(3),
        }));
        assert_eq!(
            unread.message,
            "request body is larger than the limit of 5 bytes"
        );
        assert!(ClosesConnection::closing_connection(unread).closes_connection);
    }

    #[test]
    fn body_and_upstream_failures_map_to_their_status() {
        let body = |error| {
            ApiError::from(BodyError {
                error,
                max_bytes: 5,
                timeout: Duration::from_secs(3),
            })
        };
        assert_eq!(
            body(ReadError::TooLarge).status,
            StatusCode::PAYLOAD_TOO_LARGE
        );
        assert_eq!(
            body(ReadError::TimedOut).message,
            "the request body did not arrive within 3s"
        );
        assert_eq!(
            body(ReadError::Broken).code,
            crate::error::ErrorCode::InvalidRequest
        );
        let up = |f| ApiError::from(f);
        assert_eq!(
            up(UpstreamFailure::NoAnswer(Duration::from_secs(2))).status,
            StatusCode::GATEWAY_TIMEOUT
        );
        assert_eq!(
            up(UpstreamFailure::Stalled(Duration::from_secs(2))).code,
            crate::error::ErrorCode::UpstreamTimeout
        );
        assert_eq!(
            up(UpstreamFailure::Status(StatusCode::SERVICE_UNAVAILABLE)).message,
            "the backend failed with status 503 Service Unavailable"
        );
        assert_eq!(
            up(UpstreamFailure::StreamBroke).status,
            StatusCode::BAD_GATEWAY
        );
    }

    #[test]
    fn error_body_has_openai_shape() {
        let e = ApiError::invalid_param("max_tokens", "max_tokens must be at least 1");
        assert_eq!(
            e.body_json(),
            serde_json::json!({"error": {"message": "max_tokens must be at least 1",
                "type": "invalid_request_error", "param": "max_tokens", "code": "invalid_request"}})
        );
        assert_eq!(
            e.body_in(Wire::Tgi),
            serde_json::json!({"error": "max_tokens must be at least 1", "error_type": "invalid_request"})
        );
    }
}
