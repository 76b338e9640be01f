//! A bounded HTTP GET: the gateway's reads of a backend's metrics page and the CLI's reads of
//! the admin listener, each within a time bound and a size bound, every failure said in words.

use super::bounded::{read_bounded, ReadError};
use bytes::Bytes;
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::time::Duration;

/// The most of a non-2xx answer's body quoted in the error.
const REFUSAL_BYTES: u64 = 1024;

/// A plain-HTTP client for bounded GETs.
pub type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Empty<Bytes>>;

/// GETs `url` (http) within `timeout`, reading at most `max_bytes` of a 2xx answer as text,
/// with `bearer` as the authorization when given. The error says what went wrong in words.
pub async fn get_text(
    url: &http::Uri,
    timeout: Duration,
    max_bytes: u64,
    bearer: Option<&str>,
) -> Result<String, String> {
    let client = Client::builder(TokioExecutor::new()).build_http();
    fetch(&client, url, timeout, max_bytes, bearer).await
}

/// [`get_text`] with a client of the caller's (kept, its connections pooled).
pub async fn fetch(
    client: &HttpClient,
    url: &http::Uri,
    timeout: Duration,
    max_bytes: u64,
    bearer: Option<&str>,
) -> Result<String, String> {
    let mut req = http::Request::get(url.clone());
    if let Some(token) = bearer {
        req = req.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let req = req
        .body(Empty::new())
        .map_err(|e| format!("bad request: {e}"))?;
    let ask = async {
        let resp = client
            .request(req)
            .await
            .map_err(|e| format!("unreachable: {e}"))?;
        let status = resp.status();
        if !status.is_success() {
            // The start of its message says why (a wrong admin token, a path unknown).
            let said = read_bounded(resp.into_body(), REFUSAL_BYTES.min(max_bytes), timeout)
                .await
                .map(|b| String::from_utf8_lossy(&b).trim().to_string())
                .unwrap_or_default();
            return Err(if said.is_empty() {
                format!("answered {status}")
            } else {
                format!("answered {status}: {said}")
            });
        }
        // The outer timeout bounds the whole exchange, this one the body alone.
        read_bounded(resp.into_body(), max_bytes, timeout)
            .await
            .map_err(|e| match e {
                ReadError::TooLarge => format!("larger than {max_bytes} bytes"),
                ReadError::TimedOut => "body timed out".to_string(),
                ReadError::Broken => "body broken".to_string(),
            })
    };
    let body = tokio::time::timeout(timeout, ask)
        .await
        .map_err(|_| format!("no answer within {}", humantime::format_duration(timeout)))??;
    String::from_utf8(body.to_vec()).map_err(|_| "not UTF-8 text".to_string())
}
