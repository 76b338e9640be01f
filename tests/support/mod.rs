//! Test support: a scriptable fake OpenAI backend on a real socket, a gateway builder on
//! `127.0.0.1:0`, and a small HTTP client. Everything waits on observable events, never on
//! sleeps.
#![allow(dead_code)] // each test binary uses a different part of this module

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokengate::app::{self, Deps};
use tokengate::clock::ManualClock;
use tokengate::config::Config;
use tokengate::server::Running;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Semaphore};

pub use crate::common::tokenizer;

pub mod redis_server;

/// How the fake backend answers generation requests.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Behaviour {
    /// Generate and finish.
    Normal,
    /// Answer with this status and body (JSON when it starts with `{`, else plain text).
    Status(u16, &'static str),
    /// Stream this many tokens (0: none), then break the connection (after them, in the middle
    /// of an event).
    ResetAfter(u64),
    /// Send a stream's headers, then nothing until the gateway hangs up (counted as held).
    StallAfterHeaders,
    /// Send a non-streamed answer's headers and its first 10 bytes, then nothing until the
    /// gateway hangs up.
    StallMidBody,
    /// Send a non-streamed answer that never ends, 64 KiB at a time, until the gateway hangs up.
    EndlessBody,
    /// Stream one token, then an event that never ends, until the gateway hangs up.
    EndlessEvent,
    /// Stream the whole answer with its `[DONE]`, then keep the connection open without
    /// ending the body, until the gateway hangs up.
    OpenAfterDone,
    /// Stream one token, then keep-alive comments and empty deltas, as fast as the gateway
    /// reads them, until it hangs up: a stream that never stalls and never generates.
    KeepAliveAfterFirst,
}

/// An OpenAI error body with a backend's internals in it (what must never reach a client).
pub const BACKEND_INTERNALS: &str = r#"{"error": {"message": "Traceback: CUDA error: out of memory at /opt/vllm/worker.py:812", "type": "InternalServerError", "code": 500}}"#;

/// A fake OpenAI-compatible backend.
pub struct FakeBackend {
    /// Bound address.
    pub addr: SocketAddr,
    /// Bodies it received, in order.
    pub seen: Arc<Mutex<Vec<Value>>>,
    /// While `hold` is on, each generation waits for one permit after its first token.
    pub release: Arc<Semaphore>,
    /// Requests that reached the backend and are waiting for a permit.
    pub held: Arc<tokio::sync::watch::Sender<usize>>,
    /// The headers of every generation request it received, in order.
    pub seen_headers: Arc<Mutex<Vec<http::HeaderMap>>>,
    /// The body of every generation request it received, byte for byte, in order.
    pub seen_bytes: Arc<Mutex<Vec<Bytes>>>,
    /// Streams it was generating when the gateway hung up.
    pub cancelled: Arc<tokio::sync::watch::Sender<usize>>,
}

/// Fake backend settings.
#[derive(Debug, Clone, Copy)]
pub struct FakeSpec {
    /// What it does.
    pub behaviour: Behaviour,
    /// Tokens generated unless `ignore_eos` asks for exactly `max_tokens`.
    pub natural_length: u64,
    /// Hold every generation after its first token (a stream's first `hold_after` tokens)
    /// until released.
    pub hold: bool,
    /// How many tokens a held stream sends before it waits (default 1).
    pub hold_after: u64,
    /// Chat answers are reasoning, as vLLM 0.32 sends it with `--reasoning-parser` and
    /// thinking on: streamed in `delta.reasoning`, whole in `message.reasoning` with `content`
    /// null.
    pub reasoning: bool,
    /// Send `usage` (a backend without it makes the gateway count the text).
    pub usage: bool,
    /// The `usage.prompt_tokens` it reports (none: its usage has only the output's count).
    pub prompt_tokens: Option<u64>,
    /// The `usage.prompt_tokens_details.cached_tokens` it reports, as vLLM does with
    /// `--enable-prompt-tokens-details`.
    pub cached_tokens: Option<u64>,
    /// Headers added to every generation answer.
    pub answer_headers: &'static [(&'static str, &'static str)],
    /// `/health` never answers.
    pub stall_health: bool,
}

impl Default for FakeSpec {
    fn default() -> Self {
        Self {
            behaviour: Behaviour::Normal,
            natural_length: 1_000_000,
            hold: false,
            hold_after: 1,
            reasoning: false,
            usage: true,
            prompt_tokens: None,
            cached_tokens: None,
            answer_headers: &[],
            stall_health: false,
        }
    }
}

impl FakeSpec {
    /// Holds every generation after its first token until the test releases it.
    pub fn held() -> FakeSpec {
        FakeSpec {
            hold: true,
            ..FakeSpec::default()
        }
    }
}

/// The word each fake token is (one Qwen token, its own pre-token).
pub const WORD: &str = " hello";

impl FakeBackend {
    /// Starts a fake backend on 127.0.0.1:0.
    pub async fn start(spec: FakeSpec) -> FakeBackend {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let release = Arc::new(Semaphore::new(0));
        let (held, _) = tokio::sync::watch::channel(0usize);
        let held = Arc::new(held);
        let seen_headers = Arc::new(Mutex::new(Vec::new()));
        let seen_bytes = Arc::new(Mutex::new(Vec::new()));
        let cancelled = Arc::new(tokio::sync::watch::channel(0usize).0);
        let fake = Fake {
            cancelled: cancelled.clone(),
            spec,
            seen: seen.clone(),
            seen_headers: seen_headers.clone(),
            seen_bytes: seen_bytes.clone(),
            release: release.clone(),
            held: held.clone(),
        };
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                if let Behaviour::ResetAfter(n) = spec.behaviour {
                    tokio::spawn(reset_after(stream, n, fake.seen.clone()));
                    continue;
                }
                let fake = fake.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| handle(fake.clone(), req));
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        FakeBackend {
            addr,
            seen,
            release,
            held,
            seen_headers,
            seen_bytes,
            cancelled,
        }
    }

    /// Waits until the gateway has hung up on `n` streams the backend was generating.
    pub async fn wait_cancelled(&self, n: usize) {
        let mut rx = self.cancelled.subscribe();
        tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|c| *c >= n))
            .await
            .expect("the gateway hung up on the backend's streams in time")
            .unwrap();
    }

    /// Waits until `n` generations are held.
    pub async fn wait_held(&self, n: usize) {
        let mut rx = self.held.subscribe();
        tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|h| *h >= n))
            .await
            .expect("backend held requests in time")
            .unwrap();
    }

    /// The `max_tokens` of every request it received.
    pub fn max_tokens_seen(&self) -> Vec<u64> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .map(|b| b["max_tokens"].as_u64().unwrap())
            .collect()
    }
}

/// Speaks raw HTTP/1.1 so the break is exact: reads one request, streams `n` SSE token chunks
/// (flushed), then closes the connection without ending the chunked body.
async fn reset_after(mut stream: tokio::net::TcpStream, n: u64, seen: Arc<Mutex<Vec<Value>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let (head_end, len) = loop {
        let read = stream.read(&mut chunk).await.unwrap();
        assert!(read > 0, "client closed before sending a request");
        buf.extend_from_slice(&chunk[..read]);
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..p]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map(|v| v.trim().parse().unwrap())
                .unwrap_or(0);
            break (p + 4, len);
        }
    };
    while buf.len() < head_end + len {
        let read = stream.read(&mut chunk).await.unwrap();
        buf.extend_from_slice(&chunk[..read]);
    }
    seen.lock()
        .unwrap()
        .push(serde_json::from_slice(&buf[head_end..head_end + len]).unwrap());
    if n == 0 {
        return; // close before any answer
    }
    let mut out =
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            .to_vec();
    for _ in 0..n {
        let chunk = json!({"id": "fake-1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": WORD}}]});
        let event = format!("data: {chunk}\n\n");
        out.extend_from_slice(format!("{:x}\r\n{event}\r\n", event.len()).as_bytes());
    }
    // The connection breaks in the middle of the next event.
    let partial = r#"data: {"id": "fake-1", "cho"#;
    out.extend_from_slice(format!("{:x}\r\n{partial}\r\n", partial.len()).as_bytes());
    stream.write_all(&out).await.unwrap();
    stream.flush().await.unwrap();
}

type FakeBody = http_body_util::combinators::BoxBody<Bytes, std::io::Error>;

/// What every connection of a fake backend shares.
#[derive(Clone)]
struct Fake {
    spec: FakeSpec,
    seen: Arc<Mutex<Vec<Value>>>,
    seen_headers: Arc<Mutex<Vec<http::HeaderMap>>>,
    seen_bytes: Arc<Mutex<Vec<Bytes>>>,
    release: Arc<Semaphore>,
    held: Arc<tokio::sync::watch::Sender<usize>>,
    cancelled: Arc<tokio::sync::watch::Sender<usize>>,
}

/// A body fed by a task through a channel (bounded: the task waits while the gateway does not
/// read).
fn channel_body(rx: mpsc::Receiver<Result<Frame<Bytes>, std::io::Error>>) -> FakeBody {
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    BodyExt::boxed(StreamBody::new(stream))
}

/// Sends `first`, then `rest` over and over until the receiver is gone (`rest` empty: sends
/// nothing more and waits for that).
async fn send_forever(
    tx: mpsc::Sender<Result<Frame<Bytes>, std::io::Error>>,
    first: Bytes,
    rest: Bytes,
) {
    if tx.send(Ok(Frame::data(first))).await.is_err() {
        return;
    }
    if rest.is_empty() {
        tx.closed().await;
        return;
    }
    while tx.send(Ok(Frame::data(rest.clone()))).await.is_ok() {}
}

async fn handle(
    fake: Fake,
    req: Request<Incoming>,
) -> Result<Response<FakeBody>, std::convert::Infallible> {
    let spec = fake.spec;
    let path = req.uri().path().to_string();
    match path.as_str() {
        "/health" if spec.stall_health => std::future::pending().await,
        "/health" => return Ok(answer_with(200, Bytes::from("{}"), "application/json")),
        "/v1/models" => {
            let models =
                json!({"object": "list", "data": [{"id": "qwen3.5-27b", "object": "model"}]});
            return Ok(answer_with(
                200,
                Bytes::from(models.to_string()),
                "application/json",
            ));
        }
        // No engine behind it: nothing else is read (its metrics, `/server_info`).
        _ if req.method() == http::Method::GET => {
            return Ok(answer_with(404, Bytes::from("{}"), "application/json"));
        }
        _ => {}
    }
    fake.seen_headers
        .lock()
        .unwrap()
        .push(req.headers().clone());
    let bytes = req.into_body().collect().await.unwrap().to_bytes();
    let body: Value = serde_json::from_slice(&bytes).unwrap();
    fake.seen_bytes.lock().unwrap().push(bytes);
    fake.seen.lock().unwrap().push(body.clone());
    let mut answer = generate(&fake, &path, &body).await;
    for (k, v) in spec.answer_headers {
        answer.headers_mut().append(*k, v.parse().unwrap());
    }
    Ok(answer)
}

/// A whole answer.
fn answer_with(status: u16, body: Bytes, content_type: &str) -> Response<FakeBody> {
    let body = Full::new(body).map_err(|never| match never {}).boxed();
    let mut r = streamed(body, content_type);
    *r.status_mut() = StatusCode::from_u16(status).unwrap();
    r
}

/// A 200 answer with a body sent as it comes.
fn streamed(body: FakeBody, content_type: &str) -> Response<FakeBody> {
    let mut r = Response::new(body);
    r.headers_mut()
        .insert("content-type", content_type.parse().unwrap());
    r
}

/// A generation request's answer, by the spec's behaviour.
async fn generate(fake: &Fake, path: &str, body: &Value) -> Response<FakeBody> {
    let spec = fake.spec;
    let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(4);
    match spec.behaviour {
        Behaviour::Status(code, text) => {
            let json = text.starts_with('{');
            let content_type = if json {
                "application/json"
            } else {
                "text/plain"
            };
            return answer_with(code, Bytes::from(text), content_type);
        }
        Behaviour::StallMidBody => {
            tokio::spawn(send_forever(tx, Bytes::from(r#"{"id": "fa"#), Bytes::new()));
            return streamed(channel_body(rx), "application/json");
        }
        Behaviour::EndlessBody => {
            let rest = Bytes::from(" ".repeat(64 << 10));
            tokio::spawn(send_forever(
                tx,
                Bytes::from(r#"{"id": "fake-1", "x": ""#),
                rest,
            ));
            return streamed(channel_body(rx), "application/json");
        }
        Behaviour::EndlessEvent => {
            let token = json!({"id": "fake-1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": WORD}}]});
            let first = format!("data: {token}\n\ndata: {{\"id\": \"fake-1\", \"x\": \"");
            let rest = Bytes::from("a".repeat(16 << 10));
            tokio::spawn(send_forever(tx, Bytes::from(first), rest));
            return streamed(channel_body(rx), "text/event-stream");
        }
        Behaviour::KeepAliveAfterFirst => {
            let event = |delta: Value| {
                let chunk = json!({"id": "fake-1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta}]});
                format!("data: {chunk}\n\n")
            };
            let first = event(json!({"role": "assistant", "content": WORD}));
            let rest = format!(": keep-alive\n\n{}", event(json!({"content": ""})));
            tokio::spawn(send_forever(tx, Bytes::from(first), Bytes::from(rest)));
            return streamed(channel_body(rx), "text/event-stream");
        }
        Behaviour::Normal
        | Behaviour::ResetAfter(_)
        | Behaviour::StallAfterHeaders
        | Behaviour::OpenAfterDone => {}
    }
    let max = body["max_tokens"].as_u64().unwrap_or(16);
    let n = if body["ignore_eos"].as_bool() == Some(true) {
        max
    } else {
        max.min(spec.natural_length)
    };
    let chat = path == "/v1/chat/completions";
    if path == "/v1/messages" {
        return messages_answer(fake, body, n).await;
    }
    let mut usage = json!({"completion_tokens": n, "total_tokens": n});
    if let Some(prompt) = spec.prompt_tokens {
        usage["prompt_tokens"] = json!(prompt);
        usage["total_tokens"] = json!(prompt + n);
    }
    if let Some(cached) = spec.cached_tokens {
        usage["prompt_tokens_details"] = json!({"cached_tokens": cached});
    }
    let (release, held, cancelled) = (
        fake.release.clone(),
        fake.held.clone(),
        fake.cancelled.clone(),
    );
    if body["stream"].as_bool() != Some(true) {
        if spec.hold {
            held.send_modify(|h| *h += 1);
            release.acquire().await.unwrap().forget();
        }
        let text = WORD.repeat(n as usize);
        let choice = if chat && spec.reasoning {
            json!({"index": 0, "message": {"role": "assistant", "content": null, "reasoning": text}, "finish_reason": "length"})
        } else if chat {
            json!({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"})
        } else {
            json!({"index": 0, "text": text, "finish_reason": "length"})
        };
        let mut v = json!({"id": "fake-1", "object": "chat.completion", "choices": [choice]});
        if spec.usage {
            v["usage"] = usage;
        }
        return answer_with(200, Bytes::from(v.to_string()), "application/json");
    }
    let include_usage =
        spec.usage && body["stream_options"]["include_usage"].as_bool() == Some(true);
    // A completion with `echo` repeats its prompt before its first token, as vLLM does.
    let echoed = match (chat, body["echo"].as_bool(), body["prompt"].as_str()) {
        (false, Some(true), Some(prompt)) => prompt.to_owned(),
        _ => String::new(),
    };
    tokio::spawn(async move {
        if let Behaviour::StallAfterHeaders = spec.behaviour {
            held.send_modify(|h| *h += 1);
            tx.closed().await;
            return;
        }
        for i in 0..n {
            let delta = if chat && spec.reasoning {
                json!({"index": 0, "delta": {"reasoning": WORD}})
            } else if chat {
                json!({"index": 0, "delta": {"content": WORD}})
            } else if i == 0 {
                json!({"index": 0, "text": format!("{echoed}{WORD}")})
            } else {
                json!({"index": 0, "text": WORD})
            };
            let chunk =
                json!({"id": "fake-1", "object": "chat.completion.chunk", "choices": [delta]});
            if tx
                .send(Ok(Frame::data(Bytes::from(format!("data: {chunk}\n\n")))))
                .await
                .is_err()
            {
                cancelled.send_modify(|c| *c += 1);
                return;
            }
            if i + 1 == spec.hold_after && spec.hold {
                held.send_modify(|h| *h += 1);
                release.acquire().await.unwrap().forget();
            }
        }
        if include_usage {
            let chunk = json!({"id": "fake-1", "object": "chat.completion.chunk", "choices": [], "usage": usage});
            let _ = tx
                .send(Ok(Frame::data(Bytes::from(format!("data: {chunk}\n\n")))))
                .await;
        }
        let _ = tx
            .send(Ok(Frame::data(Bytes::from("data: [DONE]\n\n"))))
            .await;
        if let Behaviour::OpenAfterDone = spec.behaviour {
            tx.closed().await;
        }
    });
    streamed(channel_body(rx), "text/event-stream")
}

/// A `/v1/messages` answer of `n` tokens in vLLM's Anthropic shape: whole, or as its stream's
/// events (`message_start`, a `content_block_delta` per token, `message_delta` with the usage
/// when the spec sends usage, `message_stop`); held as the spec says.
async fn messages_answer(fake: &Fake, body: &Value, n: u64) -> Response<FakeBody> {
    let spec = fake.spec;
    // Without a prompt count in the spec, the usage has only the output's (as OpenAI's does).
    let input = spec
        .prompt_tokens
        .map(|p| p - spec.cached_tokens.unwrap_or(0));
    let mut usage = json!({"output_tokens": n});
    if let Some(input) = input {
        usage["input_tokens"] = json!(input);
    }
    if let Some(cached) = spec.cached_tokens {
        usage["cache_read_input_tokens"] = json!(cached);
    }
    if body["stream"].as_bool() != Some(true) {
        let mut v = json!({"id": "msg-1", "type": "message", "role": "assistant",
            "content": [{"type": "text", "text": WORD.repeat(n as usize)}], "stop_reason": "max_tokens"});
        if spec.usage {
            v["usage"] = usage;
        }
        return answer_with(200, Bytes::from(v.to_string()), "application/json");
    }
    let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(4);
    let (release, held) = (fake.release.clone(), fake.held.clone());
    let event = |kind: &str, data: Value| Bytes::from(format!("event: {kind}\ndata: {data}\n\n"));
    let mut start = json!({"type": "message_start", "message": {"id": "msg-1", "type": "message",
        "role": "assistant", "content": [], "usage": {"output_tokens": 0}}});
    if let Some(input) = input {
        start["message"]["usage"]["input_tokens"] = json!(input);
    }
    let mut events = vec![event("message_start", start)];
    events.extend((0..n).map(|_| {
        let delta = json!({"type": "content_block_delta", "index": 0,
            "delta": {"type": "text_delta", "text": WORD}});
        event("content_block_delta", delta)
    }));
    if spec.usage {
        let end = json!({"type": "message_delta", "delta": {"stop_reason": "max_tokens"}, "usage": usage});
        events.push(event("message_delta", end));
    }
    events.push(event("message_stop", json!({"type": "message_stop"})));
    tokio::spawn(async move {
        for (i, e) in events.into_iter().enumerate() {
            if tx.send(Ok(Frame::data(e))).await.is_err() {
                return;
            }
            // Held after the first token's event (the second event).
            if i == 1 && spec.hold {
                held.send_modify(|h| *h += 1);
                release.acquire().await.unwrap().forget();
            }
        }
    });
    streamed(channel_body(rx), "text/event-stream")
}

/// A gateway config for tests: both listeners on port 0, generous limits unless changed.
pub fn config(backends: &[SocketAddr]) -> Config {
    Config::parse(&config_text(backends)).unwrap().into_inner()
}

/// The text of [`config`] (for tests that write it to a file and edit it).
pub fn config_text(backends: &[SocketAddr]) -> String {
    let backends: String = backends
        .iter()
        .map(|a| {
            format!(
                "[[backends]]\nurl = \"http://{a}\"\nkv_capacity_bytes = 8000000000\nmax_batch = 32\nfirst_byte_timeout = \"5s\"\n"
            )
        })
        .collect();
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
max_body_bytes = 65536
[tokenizer]
path = "unused: tests pass the tokenizer in"
[model]
served_names = ["qwen3.5-27b"]
max_model_len = 4096
default_max_tokens = 100
[admission]
queue_max_waiting = 64
queue_deadline = "5s"
{backends}
[[tenants]]
name = "alice"
api_keys = ["sk-alice"]
prefill_tokens_per_second = 1000
decode_tokens_per_second = 100
requests_per_second = 10
burst_seconds = 10
[[tenants]]
name = "bob"
api_keys = ["sk-bob"]
prefill_tokens_per_second = 1000
decode_tokens_per_second = 100
requests_per_second = 10
burst_seconds = 10
"#
    )
}

/// A fresh folder of its own under the system temp dir, removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// `tokengate-NAME-PID` under the temp dir, empty.
    pub fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("tokengate-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The address a `tokengate serve` logged after `key=` (as in `addr=127.0.0.1:8080`).
pub fn logged_addr(line: &str, key: &str) -> String {
    let at = line.find(key).unwrap_or_else(|| panic!("{key} in {line}")) + key.len();
    line[at..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ':')
        .collect()
}

/// `tokengate serve` as a process of its own, on `text` (a [`config_text`], its tokenizer path
/// filled in) written to `tokengate.toml` in `dir`; its log (info, no colours) on a pipe in
/// `stderr`, and killed when dropped.
pub fn spawn_serve(dir: &TempDir, text: &str) -> (tokio::process::Child, PathBuf) {
    let file = dir.0.join("tokengate.toml");
    let tokenizer = crate::common::tokenizer_json();
    let text = text.replace(
        "path = \"unused: tests pass the tokenizer in\"",
        &format!("path = {:?}", tokenizer.display().to_string()),
    );
    std::fs::write(&file, text).unwrap();
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_tokengate"))
        .args(["serve", "--config", file.to_str().unwrap()])
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    (child, file)
}

/// The log lines of a spawned gateway, as they come.
pub struct Logs(tokio::sync::mpsc::UnboundedReceiver<String>);

impl Logs {
    /// Reads `child`'s standard error (piped, as [`spawn_serve`] leaves it) line by line.
    pub fn of(child: &mut tokio::process::Child) -> Logs {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let stderr = child.stderr.take().expect("standard error piped");
        tokio::spawn(async move {
            use tokio::io::AsyncBufReadExt;
            let mut lines = tokio::io::BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Logs(rx)
    }

    /// Waits (60 s at most: a debug build loads the tokenizer first) for a line containing
    /// `needle`, and returns it without colour codes.
    pub async fn wait_for(&mut self, needle: &str) -> String {
        let found = tokio::time::timeout(Duration::from_secs(60), async {
            while let Some(line) = self.0.recv().await {
                let line = strip_ansi(&line);
                if line.contains(needle) {
                    return Some(line);
                }
            }
            None
        })
        .await;
        match found {
            Ok(Some(line)) => line,
            Ok(None) => panic!("the gateway exited before logging {needle:?}"),
            Err(_) => panic!("no log line {needle:?} within 60 s"),
        }
    }
}

fn strip_ansi(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ parameters letter
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Sends the signal `name` (`HUP`, `TERM`) to process `pid` with kill(1).
pub fn signal(pid: u32, name: &str) {
    let status = std::process::Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -{name} {pid}");
}

/// A gateway under test with a manual clock.
pub struct TestGateway {
    /// The running gateway.
    pub running: Running,
    /// Its limiter clock.
    pub clock: ManualClock,
}

impl TestGateway {
    /// Starts a gateway for `config` (validated here).
    pub async fn start(config: Config) -> TestGateway {
        Self::try_start(config).await.unwrap()
    }

    /// [`TestGateway::start`], or why it could not start.
    pub async fn try_start(config: Config) -> anyhow::Result<TestGateway> {
        Self::try_start_on(config, ManualClock::new()).await
    }

    /// [`TestGateway::start`] with its clock's wall time at `wall_ms` (Unix milliseconds):
    /// quota windows follow it.
    pub async fn start_at_wall(config: Config, wall_ms: i64) -> TestGateway {
        (Self::try_start_on(config, ManualClock::at_wall(wall_ms)).await).unwrap()
    }

    async fn try_start_on(config: Config, clock: ManualClock) -> anyhow::Result<TestGateway> {
        let running = app::start(
            config.validated()?,
            Deps {
                clock: Arc::new(clock.clone()),
                tokenizer: Some(tokenizer()),
            },
        )
        .await?;
        Ok(TestGateway { running, clock })
    }

    /// `http://addr` of the main listener.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.running.addr, path)
    }

    /// POST `body` to `/v1/chat/completions` with API key `key`.
    pub async fn chat(&self, key: &str, body: &Value) -> Received {
        post(&self.url("/v1/chat/completions"), key, body).await
    }

    /// GETs an admin path.
    pub async fn admin_answer(&self, path: &str) -> Received {
        let url = format!("http://{}{}", self.running.admin_addr, path);
        send(&url, "GET", None, &[]).await
    }

    /// GETs an admin path as JSON.
    pub async fn admin(&self, path: &str) -> Value {
        serde_json::from_slice(&self.admin_answer(path).await.body).unwrap()
    }

    /// The admin view of one tenant's bucket: (available, capacity).
    pub async fn bucket(&self, tenant: &str, bucket: &str) -> f64 {
        let v = self.admin("/admin/tenants").await;
        v["tenants"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == tenant)
            .unwrap()["buckets"][bucket]["available"]
            .as_f64()
            .unwrap()
    }

    /// Waits until one tenant's bucket holds exactly `value` tokens: a settlement's refund lands
    /// after the output metrics it follows are written, so a test that waited on those reads the
    /// bucket through this.
    pub async fn wait_bucket(&self, tenant: &str, bucket: &str, value: f64) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let now = self.bucket(tenant, bucket).await;
            if now == value {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{tenant}'s {bucket} bucket never held {value} (it holds {now})"
            );
            tokio::task::yield_now().await;
        }
    }

    /// KV bytes reserved on backend `i`.
    pub async fn kv_reserved(&self, i: usize) -> u64 {
        self.admin("/admin/backends").await["backends"][i]["kv_reserved_bytes"]
            .as_u64()
            .unwrap()
    }

    /// The metrics text.
    pub async fn metrics(&self) -> String {
        String::from_utf8(self.admin_answer("/metrics").await.body).unwrap()
    }

    /// The value of the metrics series `series` (name and labels), if it is exported.
    pub async fn metric(&self, series: &str) -> Option<String> {
        let text = self.metrics().await;
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ').map(str::to_owned))
    }

    /// Waits until a metrics line starting with `prefix` reads `value`.
    pub async fn wait_metric(&self, prefix: &str, value: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let text = self.metrics().await;
            if text
                .lines()
                .any(|l| l.starts_with(prefix) && l.rsplit(' ').next() == Some(value))
            {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "metric {prefix} never became {value}:\n{text}"
            );
            tokio::task::yield_now().await;
        }
    }

    /// Waits until the admin API shows `n` requests queued for KV.
    pub async fn wait_queued(&self, n: u64) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            if self.admin("/admin/backends").await["queued"].as_u64() == Some(n) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "queue never reached {n}"
            );
            tokio::task::yield_now().await;
        }
    }
}

/// A received response.
#[derive(Debug)]
pub struct Received {
    /// Status.
    pub status: u16,
    /// Headers.
    pub headers: http::HeaderMap,
    /// Whole body.
    pub body: Vec<u8>,
}

impl Received {
    /// The body as JSON.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|_| panic!("not JSON: {}", String::from_utf8_lossy(&self.body)))
    }

    /// `error.code` of an error body.
    pub fn code(&self) -> String {
        self.json()["error"]["code"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Sends one HTTP/1.1 request on a fresh connection and reads the whole answer.
pub async fn send(
    url: &str,
    method: &str,
    body: Option<Vec<u8>>,
    headers: &[(&str, &str)],
) -> Received {
    let resp = start_request(url, method, body, headers).await;
    let (parts, body) = resp.into_parts();
    let body = body
        .collect()
        .await
        .map(|c| c.to_bytes().to_vec())
        .unwrap_or_default();
    Received {
        status: parts.status.as_u16(),
        headers: parts.headers,
        body,
    }
}

/// Sends a request and returns as soon as the response headers arrive.
pub async fn start_request(
    url: &str,
    method: &str,
    body: Option<Vec<u8>>,
    headers: &[(&str, &str)],
) -> Response<Incoming> {
    let uri: http::Uri = url.parse().unwrap();
    let addr = format!("{}:{}", uri.host().unwrap(), uri.port_u16().unwrap());
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut req = Request::builder()
        .method(method)
        .uri(uri.path_and_query().unwrap().as_str())
        .header("host", uri.authority().unwrap().as_str());
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req
        .body(Full::new(Bytes::from(body.unwrap_or_default())))
        .unwrap();
    sender.send_request(req).await.unwrap()
}

/// POSTs JSON with a bearer key.
pub async fn post(url: &str, key: &str, body: &Value) -> Received {
    post_with(url, key, &[], body).await
}

/// [`post`] asking for priority class `class` (`x-tokengate-priority`).
pub async fn post_as(url: &str, key: &str, class: &str, body: &Value) -> Received {
    post_with(url, key, &[("x-tokengate-priority", class)], body).await
}

/// [`post`] with `more` headers.
async fn post_with(url: &str, key: &str, more: &[(&str, &str)], body: &Value) -> Received {
    let auth = format!("Bearer {key}");
    let mut headers = vec![
        ("content-type", "application/json"),
        ("authorization", &auth),
    ];
    headers.extend_from_slice(more);
    send(url, "POST", Some(body.to_string().into_bytes()), &headers).await
}

/// [`post`] on a task of its own, for requests that must wait while the test goes on.
pub fn spawn_post(url: &str, key: &'static str, body: Value) -> tokio::task::JoinHandle<Received> {
    let url = url.to_string();
    tokio::spawn(async move { post(&url, key, &body).await })
}

/// A one-message chat body.
pub fn chat(content: &str, max_tokens: u64, stream: bool) -> Value {
    json!({
        "model": "qwen3.5-27b",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "stream": stream,
        "ignore_eos": true,
    })
}

/// The `data:` payloads of an SSE body.
pub fn sse_data(body: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(body)
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: ").map(str::to_string))
        .collect()
}
