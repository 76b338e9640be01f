//! Every code the gateway answers an error with, and the status each is answered with: the
//! error table of docs/reference.md is held against [`ErrorCode::ALL`] by a test (`tests/docs.rs`), so a
//! code cannot be added, renamed or given another status without the table.

use http::StatusCode;

/// OpenAI's `error.code` of a refusal (TGI's `error_type` on MindIE's native routes), and the
/// `outcome` label of `tokengate_requests_total` for a request that ended with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// 400: the request is malformed or names something the gateway does not serve.
    InvalidRequest,
    /// 400: prompt + requested output past `max_model_len`.
    ContextLengthExceeded,
    /// 400: the request alone is larger than one of the tenant's buckets.
    ExceedsTenantBurst,
    /// 400: its KV footprint is larger than every backend's cache (or its class's share).
    ExceedsKvCapacity,
    /// 400: the request alone may use more than one of the tenant's quotas allows in a window.
    ExceedsQuota,
    /// 401: missing or unknown API key.
    InvalidApiKey,
    /// 401: missing or wrong admin token.
    InvalidAdminToken,
    /// 404: unknown path.
    NotFound,
    /// 404: model not served.
    ModelNotFound,
    /// 405: a known path with the wrong method.
    MethodNotAllowed,
    /// 408: the body did not arrive in time.
    RequestTimeout,
    /// 409: a reload that only a restart can apply.
    RestartRequired,
    /// 422: a reload whose file is not a valid config.
    InvalidConfig,
    /// 413: body over `server.max_body_bytes`.
    PayloadTooLarge,
    /// 415: not `application/json`.
    UnsupportedMediaType,
    /// 429: a bucket is short now.
    RateLimitExceeded,
    /// 429: the tenant's in-flight or queued requests are at their limit.
    ConcurrencyExceeded,
    /// 429: a quota window of the tenant has no room for the request until it resets.
    QuotaExceeded,
    /// The backend's own 4xx, passed on.
    UpstreamRejected,
    /// 500: a bug in the gateway.
    InternalError,
    /// 502: the backend failed.
    UpstreamError,
    /// 503: the KV queue is full or its deadline passed.
    CapacityExhausted,
    /// 503: the shared limiter store cannot be reached (`fail_closed`).
    LimiterUnavailable,
    /// 503: the tokenizer pool is saturated.
    Overloaded,
    /// 504: the backend did not answer in time.
    UpstreamTimeout,
}

impl ErrorCode {
    /// Every code, in the order of docs/reference.md's table.
    pub const ALL: [ErrorCode; 25] = [
        ErrorCode::InvalidRequest,
        ErrorCode::ContextLengthExceeded,
        ErrorCode::ExceedsTenantBurst,
        ErrorCode::ExceedsKvCapacity,
        ErrorCode::ExceedsQuota,
        ErrorCode::InvalidApiKey,
        ErrorCode::InvalidAdminToken,
        ErrorCode::ModelNotFound,
        ErrorCode::NotFound,
        ErrorCode::RestartRequired,
        ErrorCode::InvalidConfig,
        ErrorCode::MethodNotAllowed,
        ErrorCode::RequestTimeout,
        ErrorCode::PayloadTooLarge,
        ErrorCode::UnsupportedMediaType,
        ErrorCode::RateLimitExceeded,
        ErrorCode::ConcurrencyExceeded,
        ErrorCode::QuotaExceeded,
        ErrorCode::UpstreamRejected,
        ErrorCode::InternalError,
        ErrorCode::UpstreamError,
        ErrorCode::CapacityExhausted,
        ErrorCode::LimiterUnavailable,
        ErrorCode::Overloaded,
        ErrorCode::UpstreamTimeout,
    ];

    /// The code as the client reads it.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidRequest => "invalid_request",
            ErrorCode::ContextLengthExceeded => "context_length_exceeded",
            ErrorCode::ExceedsTenantBurst => "exceeds_tenant_burst",
            ErrorCode::ExceedsKvCapacity => "exceeds_kv_capacity",
            ErrorCode::ExceedsQuota => "exceeds_quota",
            ErrorCode::InvalidApiKey => "invalid_api_key",
            ErrorCode::InvalidAdminToken => "invalid_admin_token",
            ErrorCode::NotFound => "not_found",
            ErrorCode::ModelNotFound => "model_not_found",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::RequestTimeout => "request_timeout",
            ErrorCode::RestartRequired => "restart_required",
            ErrorCode::InvalidConfig => "invalid_config",
            ErrorCode::PayloadTooLarge => "payload_too_large",
            ErrorCode::UnsupportedMediaType => "unsupported_media_type",
            ErrorCode::RateLimitExceeded => "rate_limit_exceeded",
            ErrorCode::ConcurrencyExceeded => "concurrency_exceeded",
            ErrorCode::QuotaExceeded => "quota_exceeded",
            ErrorCode::UpstreamRejected => "upstream_rejected",
            ErrorCode::InternalError => "internal_error",
            ErrorCode::UpstreamError => "upstream_error",
            ErrorCode::CapacityExhausted => "capacity_exhausted",
            ErrorCode::LimiterUnavailable => "limiter_unavailable",
            ErrorCode::Overloaded => "overloaded",
            ErrorCode::UpstreamTimeout => "upstream_timeout",
        }
    }

    /// The status it is answered with; `None` for `upstream_rejected`, which keeps the
    /// backend's own 4xx.
    pub fn status(self) -> Option<StatusCode> {
        Some(match self {
            ErrorCode::InvalidRequest
            | ErrorCode::ContextLengthExceeded
            | ErrorCode::ExceedsTenantBurst
            | ErrorCode::ExceedsKvCapacity
            | ErrorCode::ExceedsQuota => StatusCode::BAD_REQUEST,
            ErrorCode::InvalidApiKey | ErrorCode::InvalidAdminToken => StatusCode::UNAUTHORIZED,
            ErrorCode::NotFound | ErrorCode::ModelNotFound => StatusCode::NOT_FOUND,
            ErrorCode::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ErrorCode::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            ErrorCode::RestartRequired => StatusCode::CONFLICT,
            ErrorCode::InvalidConfig => StatusCode::UNPROCESSABLE_ENTITY,
            ErrorCode::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ErrorCode::RateLimitExceeded
            | ErrorCode::ConcurrencyExceeded
            | ErrorCode::QuotaExceeded => StatusCode::TOO_MANY_REQUESTS,
            ErrorCode::UpstreamRejected => return None,
            ErrorCode::InternalError => StatusCode::INTERNAL_SERVER_ERROR,
            ErrorCode::UpstreamError => StatusCode::BAD_GATEWAY,
            ErrorCode::CapacityExhausted
            | ErrorCode::LimiterUnavailable
            | ErrorCode::Overloaded => StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::UpstreamTimeout => StatusCode::GATEWAY_TIMEOUT,
        })
    }

    /// OpenAI's `error.type`: `server_error` for a 5xx, `invalid_request_error` for a 4xx; a
    /// 429 says what its bucket counts, `tokens` or `requests`, which the refusal gives.
    pub fn kind(self) -> &'static str {
        match self.status() {
            Some(s) if s.is_server_error() => "server_error",
            _ => "invalid_request_error",
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_distinct_and_kinds_follow_the_status() {
        let names: std::collections::BTreeSet<_> =
            ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(names.len(), ErrorCode::ALL.len());
        assert_eq!(ErrorCode::Overloaded.kind(), "server_error");
        assert_eq!(ErrorCode::UpstreamRejected.kind(), "invalid_request_error");
        assert_eq!(ErrorCode::PayloadTooLarge.kind(), "invalid_request_error");
    }
}
