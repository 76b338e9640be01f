//! The backend client: a pooled keep-alive HTTP client (TLS for `https` backends: see `tls`), the mapping of transport failures to
//! 502 / 504, every read from a backend bounded in size and time, the backend error policy,
//! and what headers cross the gateway.
//!
//! Error policy: a backend 4xx is the client's request refused; it is passed on with its status
//! in OpenAI's shape (`upstream_rejected`, the backend's message bounded). Any other status that
//! is not a 2xx is the backend failing: a 502 `upstream_error` that says only the status, never
//! the backend's body. Either way the caller charges nothing.
//!
//! Headers: a backend request is built from scratch (content type, the request id), so nothing
//! of the client's headers (its API key, its hop-by-hop headers) reaches the backend. Of a
//! backend's answer, the hop-by-hop headers and those the gateway sets itself are dropped (see
//! [`answer_headers`]).

use crate::config::{BackendBase, BackendConfig};
use crate::error::{ApiError, UpstreamFailure};
use crate::record::Forwarded;
use crate::request_id::REQUEST_ID;
use crate::util::bounded::{read_bounded, ReadError};
use bytes::Bytes;
use http::{
    header, HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, Uri,
};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::cell::Cell;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

/// The most of a backend's 4xx error body that is read for its message.
const ERROR_BODY_BYTES: u64 = 64 << 10;

/// The most characters of a backend's error message passed on to the client.
const ERROR_MESSAGE_CHARS: usize = 1_000;

thread_local! {
    /// Which of each backend's connection pools this thread sends through: 0 unless
    /// [`use_pool`] said otherwise.
    static POOL: Cell<usize> = const { Cell::new(0) };
}

/// Makes this thread send through each backend's connection pool `index` from now on. A
/// pooled connection is served by a task on the runtime that opened it, so a thread running
/// a runtime of its own (a worker of `crate::server`) keeps a pool of its own: otherwise
/// each request would be handed to another thread and back. An index beyond a backend's
/// pools uses pool 0.
pub(crate) fn use_pool(index: usize) {
    POOL.with(|p| p.set(index));
}

/// One backend as the forwarder sees it.
#[derive(Debug, Clone)]
pub struct Upstream {
    /// Base URL (`http://host:port` or `https://host:port`), as configured.
    pub url: String,
    base: BackendBase,
    first_byte_timeout: Duration,
    decode_floor: crate::settle::DecodeFloor,
    stream_idle_timeout: Duration,
    body_read_timeout: Duration,
    max_response_bytes: u64,
    max_event_bytes: u64,
    health_path: String,
    health_timeout: Duration,
    /// One connection pool per runtime that sends through it (see [`use_pool`]).
    pools: Arc<[Client<HttpsConnector<HttpConnector>, Outgoing>]>,
}

/// A request body to a backend, in one piece, that marks its request [`Forwarded`] when the
/// backend's connection first asks for it. The client asks for a body only once it holds a
/// connection and has written the request's head to it, so the mark means "handed to the
/// backend's connection": a connect failure, a refused connection, or a pooled connection
/// found closed before the request went out (which the client retries on a new one) never
/// mark it.
#[derive(Debug, Default)]
struct Outgoing {
    bytes: Option<Bytes>,
    forwarded: Option<Forwarded>,
}

impl http_body::Body for Outgoing {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(forwarded) = self.forwarded.take() {
            forwarded.mark();
        }
        Poll::Ready(self.bytes.take().map(|b| Ok(Frame::data(b))))
    }

    fn is_end_stream(&self) -> bool {
        self.bytes.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.bytes.as_ref().map_or(0, |b| b.len() as u64))
    }
}

/// Why a request to a backend got no response headers.
enum SendError {
    TimedOut,
    Unreachable,
    Closed,
}

/// What a backend's health check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    /// Its health path answered with a 2xx.
    Ready,
    /// Its health path answered with this other status.
    Unhealthy(StatusCode),
    /// No connection could be made, or it broke before an answer.
    Unreachable,
    /// No answer within `health_timeout`.
    TimedOut(Duration),
}

impl Health {
    /// `ready`, `unhealthy`, `unreachable` or `timeout`.
    pub fn state(&self) -> &'static str {
        match self {
            Health::Ready => "ready",
            Health::Unhealthy(_) => "unhealthy",
            Health::Unreachable => "unreachable",
            Health::TimedOut(_) => "timeout",
        }
    }

    /// What was seen, for a person reading `/readyz`.
    pub fn detail(&self, health_path: &str) -> String {
        match self {
            Health::Ready => format!("{health_path} answered"),
            Health::Unhealthy(s) => format!("{health_path} answered {s}"),
            Health::Unreachable => "could not connect, or the connection broke".to_string(),
            Health::TimedOut(t) => format!(
                "{health_path} did not answer within {} (backends[].health_timeout)",
                humantime::format_duration(*t)
            ),
        }
    }
}

impl Upstream {
    /// A backend with `pools` connection pools of its own (at least one), speaking TLS when
    /// its URL is `https` (fails only when its `tls` files cannot be read).
    pub fn new(cfg: &BackendConfig, base: &BackendBase, pools: usize) -> anyhow::Result<Self> {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(cfg.connect_timeout));
        connector.set_nodelay(true);
        connector.enforce_http(false);
        let tls = crate::tls::client_config(cfg.tls.as_ref())?;
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(connector);
        let pools = (0..pools.max(1))
            .map(|_| {
                Client::builder(TokioExecutor::new())
                    .pool_idle_timeout(Duration::from_secs(90))
                    .build(connector.clone())
            })
            .collect();
        Ok(Self {
            url: cfg.url.trim_end_matches('/').to_string(),
            base: base.clone(),
            first_byte_timeout: cfg.first_byte_timeout,
            decode_floor: crate::settle::DecodeFloor::of(cfg),
            stream_idle_timeout: cfg.stream_idle_timeout,
            body_read_timeout: cfg.body_read_timeout,
            max_response_bytes: cfg.max_response_bytes,
            max_event_bytes: cfg.max_event_bytes,
            health_path: cfg.health_path.clone(),
            health_timeout: cfg.health_timeout,
            pools,
        })
    }

    /// This thread's connection pool.
    fn pool(&self) -> &Client<HttpsConnector<HttpConnector>, Outgoing> {
        let index = POOL.with(Cell::get);
        self.pools.get(index).unwrap_or(&self.pools[0])
    }

    /// The backend's host and port (the scheme's when the URL names none).
    pub fn address(&self) -> (&str, u16) {
        let BackendBase { scheme, authority } = &self.base;
        let default = if *scheme == http::uri::Scheme::HTTPS {
            443
        } else {
            80
        };
        (authority.host(), authority.port_u16().unwrap_or(default))
    }

    fn uri(&self, path: &str) -> Uri {
        Uri::builder()
            .scheme(self.base.scheme.clone())
            .authority(self.base.authority.clone())
            .path_and_query(path)
            .build()
            .expect("a path from a fixed set is a valid URI")
    }

    /// How long the backend has to start answering: its headers, and for a stream its first
    /// chunk.
    pub fn first_byte_timeout(&self) -> Duration {
        self.first_byte_timeout
    }

    /// The least decode it does for a request it runs and never answers.
    pub fn decode_floor(&self) -> crate::settle::DecodeFloor {
        self.decode_floor
    }

    /// Longest silence between two chunks of a streamed answer.
    pub fn stream_idle_timeout(&self) -> Duration {
        self.stream_idle_timeout
    }

    /// Largest non-streamed answer read from it.
    pub fn max_response_bytes(&self) -> u64 {
        self.max_response_bytes
    }

    /// Largest event of a streamed answer.
    pub fn max_event_bytes(&self) -> u64 {
        self.max_event_bytes
    }

    async fn request(
        &self,
        method: Method,
        path: &str,
        body: Outgoing,
        request_id: Option<&HeaderValue>,
        trace: &[(HeaderName, HeaderValue)],
        timeout: Duration,
    ) -> Result<Response<Incoming>, SendError> {
        let mut req = Request::builder().method(method).uri(self.uri(path));
        if body.bytes.is_some() {
            req = req.header(header::CONTENT_TYPE, "application/json");
        }
        if let Some(id) = request_id {
            req = req.header(REQUEST_ID, id);
        }
        for (name, value) in trace {
            req = req.header(name, value);
        }
        let req = req
            .body(body)
            .expect("a request of a built URI and typed headers builds");
        match tokio::time::timeout(timeout, self.pool().request(req)).await {
            Err(_) => Err(SendError::TimedOut),
            Ok(Err(e)) => {
                tracing::warn!(backend = %self.url, error = %e, "backend request failed");
                Err(if e.is_connect() {
                    SendError::Unreachable
                } else {
                    SendError::Closed
                })
            }
            Ok(Ok(resp)) => Ok(resp),
        }
    }

    /// Sends a request (with the client request's id and the `trace` context to pass on:
    /// [`crate::trace_context`]) and waits for the response headers, bounded by the first-byte
    /// timeout. `forwarded`, when given, is marked once the body is handed to the backend's
    /// connection (see this module's `Outgoing`).
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<Bytes>,
        request_id: Option<&HeaderValue>,
        trace: &[(HeaderName, HeaderValue)],
        forwarded: Option<Forwarded>,
    ) -> Result<Response<Incoming>, ApiError> {
        let timeout = self.first_byte_timeout;
        let body = Outgoing {
            bytes: body,
            forwarded,
        };
        self.request(method, path, body, request_id, trace, timeout)
            .await
            .map_err(|e| {
                ApiError::from(match e {
                    SendError::TimedOut => UpstreamFailure::NoAnswer(timeout),
                    SendError::Unreachable => UpstreamFailure::Unreachable,
                    SendError::Closed => UpstreamFailure::Closed,
                })
            })
    }

    /// Reads a whole (non-streamed) answer: at most `max_response_bytes`, all of it within
    /// `body_read_timeout` of its headers.
    pub async fn read_answer(&self, body: Incoming) -> Result<Bytes, ApiError> {
        let (max, timeout) = (self.max_response_bytes, self.body_read_timeout);
        read_bounded(body, max, timeout).await.map_err(|e| {
            ApiError::from(match e {
                ReadError::TooLarge => {
                    tracing::warn!(backend = %self.url, max_bytes = max, "backend answer over max_response_bytes");
                    UpstreamFailure::AnswerTooLarge(max)
                }
                ReadError::TimedOut => UpstreamFailure::AnswerTimedOut(timeout),
                ReadError::Broken => UpstreamFailure::AnswerBroken,
            })
        })
    }

    /// The error for a backend answer whose status is not a 2xx (see the module's policy).
    pub async fn refusal(&self, status: StatusCode, body: Incoming) -> ApiError {
        if !status.is_client_error() {
            tracing::warn!(backend = %self.url, status = status.as_u16(), "backend failed");
            return UpstreamFailure::Status(status).into();
        }
        let max = ERROR_BODY_BYTES.min(self.max_response_bytes);
        let message = match read_bounded(body, max, self.body_read_timeout).await {
            Ok(bytes) => backend_message(&bytes),
            Err(e) => {
                tracing::warn!(backend = %self.url, status = status.as_u16(), error = ?e, "backend error body unreadable");
                BackendMessage::default()
            }
        };
        let text = match message.text.as_deref() {
            Some(m) => format!("the backend refused the request with status {status}: {m}"),
            None => format!("the backend refused the request with status {status}"),
        };
        let e = ApiError::upstream_rejected(status, text);
        match &message.param {
            Some(p) => e.with_param(p),
            None => e,
        }
    }

    /// Asks the backend's health path, bounded by `health_timeout` (far below the request
    /// timeouts: `/readyz` must answer before its prober gives up).
    pub async fn probe(&self) -> Health {
        let timeout = self.health_timeout;
        match self
            .request(
                Method::GET,
                &self.health_path,
                Outgoing::default(),
                None,
                &[],
                timeout,
            )
            .await
        {
            Ok(r) if r.status().is_success() => Health::Ready,
            Ok(r) => Health::Unhealthy(r.status()),
            Err(SendError::TimedOut) => Health::TimedOut(timeout),
            Err(SendError::Unreachable | SendError::Closed) => Health::Unreachable,
        }
    }

    /// The configured health path.
    pub fn health_path(&self) -> &str {
        &self.health_path
    }
}

/// What a backend's error body says, as far as the client is told.
#[derive(Debug, Default, PartialEq)]
struct BackendMessage {
    text: Option<String>,
    param: Option<String>,
}

/// Reads the message of a backend's error body: OpenAI's `{"error": {"message", "param"}}`,
/// vLLM's `{"object": "error", "message", "param"}`, TGI's `{"error": "..."}`, FastAPI's
/// `{"detail": "..."}`, or plain text (MindIE); cut to [`ERROR_MESSAGE_CHARS`].
fn backend_message(body: &[u8]) -> BackendMessage {
    let text = String::from_utf8_lossy(body);
    let json: Option<serde_json::Value> = serde_json::from_str(&text).ok();
    let (message, param) = match &json {
        Some(v @ serde_json::Value::Object(_)) => {
            let inner = v.get("error").filter(|e| e.is_object()).unwrap_or(v);
            let message = inner
                .get("message")
                .or_else(|| v.get("error"))
                .or_else(|| v.get("detail"))
                .and_then(serde_json::Value::as_str);
            let param = inner.get("param").and_then(serde_json::Value::as_str);
            (message.map(str::to_owned), param.map(str::to_owned))
        }
        // Some other JSON (or none): the text itself is the message.
        _ => (Some(text.trim().to_owned()), None),
    };
    let cut = |s: String| match s.char_indices().nth(ERROR_MESSAGE_CHARS) {
        Some((at, _)) => format!("{}...", &s[..at]),
        None => s,
    };
    BackendMessage {
        text: message.filter(|m| !m.is_empty()).map(cut),
        param: param.filter(|p| !p.is_empty()).map(cut),
    }
}

/// Drops from a backend answer's headers what must not cross a proxy (RFC 9110 section 7.6.1:
/// `connection` and every header it names, `keep-alive`, `transfer-encoding`, `te`, `trailer`,
/// `upgrade`, `proxy-*`) and what the gateway sets itself: `content-length` (the body is
/// re-framed or metered) and `x-request-id` (the client gets the gateway's id).
pub fn answer_headers(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    let proxy: Vec<HeaderName> = headers
        .keys()
        .filter(|name| name.as_str().starts_with("proxy-"))
        .cloned()
        .collect();
    let fixed = [
        header::CONNECTION,
        HeaderName::from_static("keep-alive"),
        header::TRANSFER_ENCODING,
        header::TE,
        header::TRAILER,
        header::UPGRADE,
        header::CONTENT_LENGTH,
        HeaderName::from_static(REQUEST_ID),
    ];
    for name in named.into_iter().chain(proxy).chain(fixed) {
        headers.remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each thread sends through the pool it was told to use, pool 0 when told none or one
    /// the backend does not have.
    #[test]
    fn a_thread_sends_through_its_own_pool() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/config/quickstart.toml"
        ))
        .unwrap();
        let cfg = crate::config::Config::parse(&text).unwrap();
        let (backend, base) = cfg.backends_with_base().next().unwrap();
        let up = Upstream::new(backend, base, 3).unwrap();
        assert_eq!(up.pools.len(), 3);
        assert_eq!(Upstream::new(backend, base, 0).unwrap().pools.len(), 1);
        let uses = |index: Option<usize>| {
            let up = up.clone();
            std::thread::spawn(move || {
                if let Some(index) = index {
                    use_pool(index);
                }
                (0..up.pools.len()).find(|&i| std::ptr::eq(up.pool(), &up.pools[i]))
            })
            .join()
            .unwrap()
        };
        assert_eq!(uses(None), Some(0));
        assert_eq!(uses(Some(1)), Some(1));
        assert_eq!(uses(Some(2)), Some(2));
        assert_eq!(uses(Some(3)), Some(0));
    }

    #[test]
    fn backend_messages_are_read_from_every_known_shape() {
        let msg = |body: &str| backend_message(body.as_bytes());
        let expect = |text: &str, param: Option<&str>| BackendMessage {
            text: Some(text.to_string()),
            param: param.map(str::to_string),
        };
        assert_eq!(
            msg(
                r#"{"object":"error","message":"max_tokens must be at least 1","type":"BadRequestError","param":"max_tokens","code":400}"#
            ),
            expect("max_tokens must be at least 1", Some("max_tokens"))
        );
        assert_eq!(
            msg(
                r#"{"error":{"message":"no such model","type":"NotFoundError","param":null,"code":404}}"#
            ),
            expect("no such model", None)
        );
        assert_eq!(
            msg(
                r#"{"error":"Input validation error: inputs must not be empty","error_type":"validation"}"#
            ),
            expect("Input validation error: inputs must not be empty", None)
        );
        assert_eq!(
            msg("  Input length exceeds the limit\n"),
            expect("Input length exceeds the limit", None)
        );
        assert_eq!(msg(r#"{"detail":"Not Found"}"#), expect("Not Found", None));
        assert_eq!(
            msg(r#"{"detail":[{"msg":"x"}]}"#),
            BackendMessage::default()
        );
        assert_eq!(msg(""), BackendMessage::default());
        let long = "é".repeat(ERROR_MESSAGE_CHARS + 5);
        let cut = msg(&long).text.unwrap();
        assert_eq!(cut, format!("{}...", "é".repeat(ERROR_MESSAGE_CHARS)));
    }

    #[test]
    fn hop_by_hop_and_gateway_headers_are_dropped_from_answers() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("connection", "keep-alive, x-hop"),
            ("connection", "x-hop-2"),
            ("keep-alive", "timeout=5"),
            ("transfer-encoding", "chunked"),
            ("te", "trailers"),
            ("trailer", "x-checksum"),
            ("upgrade", "h2c"),
            ("proxy-authenticate", "Basic"),
            ("proxy-connection", "keep-alive"),
            ("x-hop", "1"),
            ("x-hop-2", "2"),
            ("content-length", "10"),
            ("x-request-id", "backend-7"),
            ("content-type", "application/json"),
            ("x-backend-kept", "yes"),
        ] {
            h.append(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        answer_headers(&mut h);
        let mut left: Vec<(&str, &str)> = h
            .iter()
            .map(|(k, v)| (k.as_str(), v.to_str().unwrap()))
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                ("content-type", "application/json"),
                ("x-backend-kept", "yes")
            ]
        );
    }
}
