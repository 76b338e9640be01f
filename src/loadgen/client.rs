//! Room `loadgen`: the streaming client. Sends one planned request (OpenAI chat or completions,
//! `stream: true` with `include_usage`, `ignore_eos` + `max_tokens` for an exact output length),
//! reads the SSE stream and measures TTFT, TPOT and end-to-end from the planned arrival instant,
//! so a late send is charged to the server like a queue (open loop). With `retry`, 429 and 503
//! answers carrying `retry-after` are retried after that wait.

use super::report::{Outcome, Sample};
use bytes::Bytes;
use http::{header, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use std::time::Duration;
use tokio::time::Instant;

/// The APIs the load is sent to: those that stream (vLLM's batch of chats does not).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Api {
    /// `POST /v1/chat/completions`, one user message.
    Chat,
    /// `POST /v1/completions`, a text prompt.
    Completions,
}

impl Api {
    /// Its path.
    pub fn path(self) -> &'static str {
        let endpoint = match self {
            Api::Chat => crate::api::Endpoint::Chat,
            Api::Completions => crate::api::Endpoint::Completions,
        };
        endpoint.path()
    }
}

/// Most attempts of one request with `retry`.
const MAX_ATTEMPTS: u32 = 5;

/// Where and how requests go.
#[derive(Debug, Clone)]
pub struct Target {
    /// Base URL, e.g. `http://127.0.0.1:8080`.
    pub url: String,
    /// API.
    pub endpoint: Api,
    /// `model` of every request.
    pub model: String,
    /// Server seconds per real second (the sim's `--time-scale`); measured times are scaled by it.
    pub time_scale: f64,
    /// Retry 429 / 503 after `retry-after`.
    pub retry: bool,
    /// Give up on one attempt after this long (real time).
    pub timeout: Duration,
}

/// What a request carries besides its text.
#[derive(Debug, Clone)]
pub struct Job {
    /// Tenant, for the report.
    pub tenant: String,
    /// Planned arrival, server seconds from the start.
    pub at: Duration,
    /// Prompt text (chat content or raw prompt).
    pub text: String,
    /// Prompt tokens as planned.
    pub input_tokens: u64,
    /// `max_tokens`.
    pub output_tokens: u64,
    /// `Authorization: Bearer` key.
    pub api_key: Option<String>,
}

/// A pooled keep-alive HTTP client for one target.
#[derive(Debug, Clone)]
pub struct Client {
    http: HyperClient<HttpConnector, Full<Bytes>>,
    target: Target,
}

/// What the SSE stream of one attempt showed.
#[derive(Debug, Default)]
struct StreamSeen {
    first: Option<Instant>,
    last: Option<Instant>,
    chunks: u64,
    usage_prompt: Option<u64>,
    usage_completion: Option<u64>,
    done: bool,
    error: bool,
    timed_out: bool,
}

impl Client {
    /// A client for `target`.
    pub fn new(target: Target) -> Self {
        let mut connector = HttpConnector::new();
        // Requests and SSE chunks are small: without this, Nagle's algorithm and delayed ACKs
        // add ~40 ms to measured latencies.
        connector.set_nodelay(true);
        let http = HyperClient::builder(TokioExecutor::new()).build(connector);
        Self { http, target }
    }

    /// The target.
    pub fn target(&self) -> &Target {
        &self.target
    }

    fn body(&self, job: &Job) -> Bytes {
        let mut body = serde_json::json!({
            "model": self.target.model,
            "max_tokens": job.output_tokens,
            "ignore_eos": true,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        match self.target.endpoint {
            Api::Chat => {
                body["messages"] = serde_json::json!([{"role": "user", "content": job.text}]);
            }
            Api::Completions => body["prompt"] = Value::String(job.text.clone()),
        }
        Bytes::from(body.to_string())
    }

    fn request(&self, job: &Job, body: Bytes) -> Request<Full<Bytes>> {
        let mut req = Request::post(format!(
            "{}{}",
            self.target.url,
            self.target.endpoint.path()
        ))
        .header(header::CONTENT_TYPE, "application/json");
        if let Some(key) = &job.api_key {
            req = req.header(header::AUTHORIZATION, format!("Bearer {key}"));
        }
        req.body(Full::new(body))
            .expect("method, URL and headers are valid")
    }

    /// `GET` of `path_and_query` on the target: the status and the whole body; `None` when no
    /// answer came (a failed connection, a broken body, or nothing within the timeout).
    pub async fn get(&self, path_and_query: &str) -> Option<(StatusCode, Bytes)> {
        let req = Request::get(format!("{}{path_and_query}", self.target.url))
            .body(Full::new(Bytes::new()))
            .ok()?;
        let answer = async {
            let resp = self.http.request(req).await.ok()?;
            let status = resp.status();
            let body = resp.into_body().collect().await.ok()?.to_bytes();
            Some((status, body))
        };
        tokio::time::timeout(self.target.timeout, answer)
            .await
            .ok()
            .flatten()
    }

    /// Server time from the planned arrival to `t`, ms.
    fn server_ms(&self, planned: Instant, t: Instant) -> f64 {
        t.saturating_duration_since(planned).as_secs_f64() * self.target.time_scale * 1000.0
    }

    /// Sends `job` (planned at real instant `planned`) and measures it.
    pub async fn run(&self, job: &Job, planned: Instant) -> Sample {
        let body = self.body(job);
        let mut attempts = 0;
        loop {
            attempts += 1;
            let attempt =
                tokio::time::timeout(self.target.timeout, self.attempt(job, body.clone()));
            let (status, retry_after, seen) = match attempt.await {
                Ok(Ok(r)) => r,
                Ok(Err(())) => (0, None, StreamSeen::default()),
                Err(_) => {
                    let seen = StreamSeen {
                        timed_out: true,
                        ..StreamSeen::default()
                    };
                    (0, None, seen)
                }
            };
            let retryable = status == 429 || status == 503;
            if self.target.retry && retryable && attempts < MAX_ATTEMPTS {
                if let Some(wait) = retry_after {
                    tokio::time::sleep(wait).await;
                    continue;
                }
            }
            return self.sample(job, planned, status, seen, attempts);
        }
    }

    fn sample(
        &self,
        job: &Job,
        planned: Instant,
        status: u16,
        seen: StreamSeen,
        attempts: u32,
    ) -> Sample {
        let outcome = match status {
            _ if seen.timed_out => Outcome::Timeout,
            200..=299 if seen.done && !seen.error => Outcome::Ok,
            429 => Outcome::RateLimited,
            503 => Outcome::Unavailable,
            400..=499 => Outcome::ClientError,
            _ => Outcome::ServerError,
        };
        let tokens = seen.usage_completion.unwrap_or(seen.chunks);
        let ttft_ms = seen.first.map(|t| self.server_ms(planned, t));
        let tpot_ms = match (seen.first, seen.last) {
            (Some(first), Some(last)) if tokens >= 2 => {
                Some(self.server_ms(first, last) / (tokens - 1) as f64)
            }
            _ => None,
        };
        Sample {
            tenant: job.tenant.clone(),
            at_s: job.at.as_secs_f64(),
            outcome,
            status,
            ttft_ms,
            tpot_ms,
            e2e_ms: self.server_ms(planned, Instant::now()),
            prompt_tokens: seen.usage_prompt.unwrap_or(job.input_tokens),
            output_tokens: if outcome == Outcome::Ok { tokens } else { 0 },
            attempts,
        }
    }

    /// One attempt: status, `retry-after`, and what the stream showed. `Err` when the
    /// connection failed before a response head.
    async fn attempt(
        &self,
        job: &Job,
        body: Bytes,
    ) -> Result<(u16, Option<Duration>, StreamSeen), ()> {
        let resp = self
            .http
            .request(self.request(job, body))
            .await
            .map_err(|_| ())?;
        let status = resp.status();
        let retry_after = resp
            .headers()
            .get(header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<f64>().ok())
            .and_then(|s| Duration::try_from_secs_f64(s).ok());
        let mut seen = StreamSeen::default();
        let mut body = resp.into_body();
        if status != StatusCode::OK {
            // Drain so the connection can be reused; the error body is not needed.
            while let Some(Ok(_)) = body.frame().await {}
            return Ok((status.as_u16(), retry_after, seen));
        }
        let mut sse = SseParser::default();
        while let Some(frame) = body.frame().await {
            let Ok(frame) = frame else {
                seen.error = true;
                break;
            };
            let Some(data) = frame.data_ref() else {
                continue;
            };
            let now = Instant::now();
            for event in sse.push(data) {
                seen.observe(&event, now);
            }
        }
        Ok((status.as_u16(), retry_after, seen))
    }
}

impl StreamSeen {
    fn observe(&mut self, event: &str, now: Instant) {
        if event == "[DONE]" {
            self.done = true;
            return;
        }
        let Ok(v) = serde_json::from_str::<Value>(event) else {
            self.error = true;
            return;
        };
        if v.get("error").is_some() {
            self.error = true;
            return;
        }
        if let Some(usage) = v.get("usage").filter(|u| !u.is_null()) {
            self.usage_prompt = usage["prompt_tokens"].as_u64();
            self.usage_completion = usage["completion_tokens"].as_u64();
        }
        let choice = &v["choices"][0];
        let text = choice["delta"]["content"]
            .as_str()
            .or_else(|| choice["text"].as_str());
        if text.is_some_and(|t| !t.is_empty()) {
            self.chunks += 1;
            self.first.get_or_insert(now);
            self.last = Some(now);
        }
    }
}

/// Splits an SSE byte stream into the payloads of its `data:` lines, one per event.
#[derive(Debug, Default)]
pub struct SseParser {
    buf: Vec<u8>,
}

impl SseParser {
    /// Feeds bytes; returns the payloads of the events they complete.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        while let Some(end) = self.buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.buf.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            let line = line.trim_end_matches(['\n', '\r']);
            if let Some(data) = line.strip_prefix("data:") {
                out.push(data.trim_start().to_string());
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_parser_handles_split_frames_and_crlf() {
        let mut p = SseParser::default();
        assert!(p.push(b"data: {\"a\"").is_empty());
        assert_eq!(
            p.push(b":1}\n\ndata:[DONE]\r\n\r\n"),
            vec!["{\"a\":1}", "[DONE]"]
        );
        assert_eq!(p.push(b": comment\nevent: x\ndata: y\n\n"), vec!["y"]);
    }

    #[test]
    fn stream_observation_counts_content_and_reads_usage() {
        let t0 = Instant::now();
        let mut s = StreamSeen::default();
        s.observe(
            r#"{"choices":[{"delta":{"role":"assistant","content":""}}]}"#,
            t0,
        );
        assert_eq!((s.chunks, s.first), (0, None));
        s.observe(r#"{"choices":[{"delta":{"content":" the"}}]}"#, t0);
        s.observe(
            r#"{"choices":[{"text":" fox"}]}"#,
            t0 + Duration::from_millis(30),
        );
        s.observe(
            r#"{"choices":[],"usage":{"prompt_tokens":17,"completion_tokens":2}}"#,
            t0,
        );
        s.observe("[DONE]", t0);
        assert_eq!(s.chunks, 2);
        assert_eq!(s.first, Some(t0));
        assert_eq!(s.last, Some(t0 + Duration::from_millis(30)));
        assert_eq!((s.usage_prompt, s.usage_completion), (Some(17), Some(2)));
        assert!(s.done && !s.error);
        s.observe(r#"{"error":{"message":"boom"}}"#, t0);
        assert!(s.error);
    }
}
