//! The backend side: a pooled keep-alive HTTP client, timeouts, and the mapping of transport
//! failures to 502 / 504. Backend error statuses are not failures here: they are passed through.

use crate::error::ApiError;
use bytes::Bytes;
use http::{header, Method, Request, Response, Uri};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::time::Duration;

/// One backend as the forwarder sees it.
#[derive(Debug, Clone)]
pub struct Upstream {
    /// Base URL (`http://host:port`), as configured.
    pub url: String,
    base: Uri,
    first_byte_timeout: Duration,
    stream_idle_timeout: Duration,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Upstream {
    /// A backend with its own connection pool.
    pub fn new(
        url: &str,
        connect_timeout: Duration,
        first_byte_timeout: Duration,
        stream_idle_timeout: Duration,
    ) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(connect_timeout));
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .build(connector);
        Self {
            url: url.trim_end_matches('/').to_string(),
            base: url
                .parse()
                .expect("backend URLs are validated with the config"),
            first_byte_timeout,
            stream_idle_timeout,
            client,
        }
    }

    fn uri(&self, path: &str) -> Uri {
        let authority = self.base.authority().expect("validated").clone();
        Uri::builder()
            .scheme("http")
            .authority(authority)
            .path_and_query(path)
            .build()
            .expect("a path from a fixed set is a valid URI")
    }

    /// How long the backend has to start answering: its headers, and for a stream its first
    /// chunk.
    pub fn first_byte_timeout(&self) -> Duration {
        self.first_byte_timeout
    }

    /// Longest silence between two chunks of a streamed answer.
    pub fn stream_idle_timeout(&self) -> Duration {
        self.stream_idle_timeout
    }

    /// Sends a request and waits for the response headers (bounded by the first-byte timeout).
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<Response<Incoming>, ApiError> {
        let mut req = Request::builder().method(method).uri(self.uri(path));
        if body.is_some() {
            req = req.header(header::CONTENT_TYPE, "application/json");
        }
        let req = req
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .expect("a request from validated parts builds");
        match tokio::time::timeout(self.first_byte_timeout, self.client.request(req)).await {
            Err(_) => Err(ApiError::upstream_timeout(format!(
                "the backend did not answer within {}",
                humantime::format_duration(self.first_byte_timeout)
            ))),
            Ok(Err(e)) => {
                tracing::warn!(backend = %self.url, error = %e, "backend request failed");
                Err(ApiError::upstream(if e.is_connect() {
                    "the backend refused the connection or could not be reached"
                } else {
                    "the backend closed the connection before answering"
                }))
            }
            Ok(Ok(resp)) => Ok(resp),
        }
    }

    /// Whether the backend answers its health path with a 2xx.
    pub async fn is_ready(&self, health_path: &str) -> bool {
        matches!(self.send(Method::GET, health_path, None).await, Ok(r) if r.status().is_success())
    }
}
