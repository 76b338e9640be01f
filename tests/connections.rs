//! Connections a hostile or broken client holds, end to end on real sockets: ones that send no
//! request head (HTTP/1, HTTP/2, and the protocol sniff before either), kept-alive ones left
//! idle, an admin listener full of idle sockets, and clients that stop reading an answer. The
//! gateway's bounds are set short; every test waits on what the client sees (the connection
//! closed, an answer) or on what the gateway exports, never on a sleep.

mod common;
mod support;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A gateway in front of a fake backend, its test config changed by `tweak` first.
async fn gateway_with(
    spec: FakeSpec,
    tweak: impl FnOnce(&mut tokengate::config::Config),
) -> (TestGateway, FakeBackend) {
    let backend = FakeBackend::start(spec).await;
    let mut cfg = config(&[backend.addr]);
    tweak(&mut cfg);
    (TestGateway::start(cfg).await, backend)
}

/// `tokengate_connections_closed_total` of a listener for a reason.
fn closed(listener: &str, reason: &str) -> String {
    format!("tokengate_connections_closed_total{{listener=\"{listener}\",reason=\"{reason}\"}}")
}

/// Reads until the gateway closes the connection (within 10 s: the bounds under test are far
/// shorter); what it sent before.
async fn read_until_closed(stream: &mut TcpStream) -> Vec<u8> {
    let mut sent = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut sent))
        .await
        .expect("the gateway closed the connection in time")
        .expect("closed, not reset");
    sent
}

/// Every connection that has not sent a whole request head within `header_read_timeout` of
/// its accept is closed, on both listeners: silent ones, one in the middle of an HTTP/1 head,
/// and one whose first bytes could still be HTTP/2's preface (the protocol sniff, which had no
/// bound before).
#[tokio::test]
async fn connections_without_a_request_head_are_closed_after_header_read_timeout() {
    let (gw, _backend) = gateway_with(FakeSpec::default(), |cfg| {
        cfg.server.header_read_timeout = ms(300);
    })
    .await;
    let (main, admin) = (gw.running.addr, gw.running.admin_addr);
    let connected = Instant::now();
    let mut silent = Vec::new();
    for addr in [main, admin] {
        for _ in 0..20 {
            silent.push(TcpStream::connect(addr).await.unwrap());
        }
    }
    let mut partial = TcpStream::connect(main).await.unwrap();
    partial
        .write_all(b"GET /v1/models HTTP/1.1\r\nhost: gateway\r\n")
        .await
        .unwrap();
    let mut sniffed = TcpStream::connect(main).await.unwrap();
    sniffed.write_all(b"PRI * HTTP").await.unwrap();
    for stream in silent.iter_mut().chain([&mut partial, &mut sniffed]) {
        assert_eq!(read_until_closed(stream).await, b"");
    }
    assert!(connected.elapsed() >= ms(300), "{:?}", connected.elapsed());
    let header_timeouts = (
        gw.metric(&closed("main", "header_timeout")).await,
        gw.metric(&closed("admin", "header_timeout")).await,
    );
    assert_eq!(
        header_timeouts,
        (Some("22".to_string()), Some("20".to_string()))
    );
    gw.wait_metric(r#"tokengate_open_connections{listener="main"}"#, "0")
        .await;
}

/// The parameters of the first SETTINGS frame (not an acknowledgement) in `frames`, HTTP/2
/// frames as a server sent them, by identifier.
fn first_settings(frames: &[u8]) -> BTreeMap<u16, u32> {
    let mut rest = frames;
    while rest.len() >= 9 {
        let len = u32::from_be_bytes([0, rest[0], rest[1], rest[2]]) as usize;
        let (kind, flags, payload) = (rest[3], rest[4], &rest[9..9 + len]);
        if kind == 0x4 && flags & 0x1 == 0 {
            return payload
                .chunks(6)
                .map(|p| {
                    let id = u16::from_be_bytes([p[0], p[1]]);
                    (id, u32::from_be_bytes([p[2], p[3], p[4], p[5]]))
                })
                .collect();
        }
        rest = &rest[9 + len..];
    }
    panic!("no SETTINGS frame in {frames:?}");
}

/// An HTTP/2 client that sends its preface and SETTINGS and no request is closed after
/// `header_read_timeout`; the SETTINGS it was sent bound its concurrent streams to 128.
#[tokio::test]
async fn an_http2_client_that_sends_no_request_is_closed_after_header_read_timeout() {
    let (gw, _backend) = gateway_with(FakeSpec::default(), |cfg| {
        cfg.server.header_read_timeout = ms(300);
    })
    .await;
    let mut h2 = TcpStream::connect(gw.running.addr).await.unwrap();
    // The preface and an empty SETTINGS frame: a client's whole greeting.
    h2.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .await
        .unwrap();
    let sent = read_until_closed(&mut h2).await;
    // SETTINGS_MAX_CONCURRENT_STREAMS
    assert_eq!(first_settings(&sent).get(&0x3), Some(&128));
    assert_eq!(
        gw.metric(&closed("main", "header_timeout"))
            .await
            .as_deref(),
        Some("1")
    );
}

/// The status of an answer to a request sent on an HTTP/1 or HTTP/2 connection, its body
/// read to the end.
async fn status_of(
    answer: impl std::future::Future<Output = hyper::Result<http::Response<hyper::body::Incoming>>>,
) -> u16 {
    let resp = answer.await.unwrap();
    let status = resp.status().as_u16();
    resp.into_body().collect().await.unwrap();
    status
}

/// `GET /v1/models` as alice.
fn models_request(addr: SocketAddr) -> http::Request<Full<Bytes>> {
    http::Request::get(format!("http://{addr}/v1/models"))
        .header("authorization", "Bearer sk-alice")
        .body(Full::new(Bytes::new()))
        .unwrap()
}

/// A kept-alive connection is closed once it has had no request in flight for
/// `idle_timeout`, over HTTP/1 (where hyper's header timeout, running from the moment the
/// connection went idle, closed it after `header_read_timeout`) and HTTP/2 (never closed).
#[tokio::test]
async fn kept_alive_connections_close_after_idle_timeout_not_header_read_timeout() {
    let idle = ms(1000);
    let (gw, _backend) = gateway_with(FakeSpec::default(), |cfg| {
        cfg.server.header_read_timeout = ms(200);
        cfg.server.idle_timeout = idle;
    })
    .await;
    let addr = gw.running.addr;
    let within_10s = Duration::from_secs(10);

    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut h1, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    let h1_conn = tokio::spawn(conn);
    let h1_sent = Instant::now();
    assert_eq!(status_of(h1.send_request(models_request(addr))).await, 200);

    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut h2, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    let h2_conn = tokio::spawn(conn);
    let h2_sent = Instant::now();
    assert_eq!(status_of(h2.send_request(models_request(addr))).await, 200);

    let h1_end = tokio::time::timeout(within_10s, h1_conn)
        .await
        .expect("the HTTP/1 connection closed in time")
        .unwrap();
    let h1_open = h1_sent.elapsed();
    let h2_end = tokio::time::timeout(within_10s, h2_conn)
        .await
        .expect("the HTTP/2 connection closed in time")
        .unwrap();
    let h2_open = h2_sent.elapsed();
    assert!(h1_end.is_ok() && h2_end.is_ok(), "{h1_end:?} {h2_end:?}");
    assert!(
        h1_open >= idle && h2_open >= idle,
        "{h1_open:?} {h2_open:?}"
    );
    assert_eq!(
        gw.metric(&closed("main", "idle_timeout")).await.as_deref(),
        Some("2")
    );
}

/// The admin listener serves 64 connections at once. With 80 idle sockets open to it (each
/// would be held until its `header_read_timeout`, a minute here), `/healthz` is still
/// answered: each connection past the cap closed the oldest idle one, so the 16 past it and
/// the probe closed the 17 oldest, and the others are open.
#[tokio::test]
async fn health_probes_are_answered_while_idle_sockets_fill_the_admin_cap() {
    let (gw, _backend) = gateway_with(FakeSpec::default(), |cfg| {
        cfg.server.header_read_timeout = Duration::from_secs(60);
    })
    .await;
    let admin = gw.running.admin_addr;
    let mut idle = Vec::new();
    for _ in 0..80 {
        idle.push(TcpStream::connect(admin).await.unwrap());
    }
    let probe = tokio::time::timeout(
        Duration::from_secs(5),
        send(&format!("http://{admin}/healthz"), "GET", None, &[]),
    )
    .await
    .expect("/healthz answered within 5 s");
    assert_eq!((probe.status, probe.json()), (200, json!({"status": "ok"})));
    for stream in &mut idle[..17] {
        assert_eq!(read_until_closed(stream).await, b"");
    }
    for stream in &idle[17..] {
        let still_open = stream.try_read(&mut [0u8; 1]).unwrap_err();
        assert_eq!(still_open.kind(), std::io::ErrorKind::WouldBlock);
    }
    drop(idle);
    // Only the scrape's own connection is left.
    gw.wait_metric(r#"tokengate_open_connections{listener="admin"}"#, "1")
        .await;
    assert_eq!(
        gw.metric(&closed("admin", "evicted")).await.as_deref(),
        Some("17")
    );
    let ready = send(&format!("http://{admin}/readyz"), "GET", None, &[]).await;
    assert_eq!(ready.status, 200, "{}", ready.text());
}

/// A tenant and a backend large enough for answers of millions of tokens, and a short
/// `client_write_timeout`.
fn for_large_answers(cfg: &mut tokengate::config::Config) {
    cfg.server.client_write_timeout = ms(500);
    cfg.model.max_model_len = 4_000_000;
    cfg.backends[0].kv_capacity_bytes = Some(1 << 50);
    cfg.tenants[0].decode_tokens_per_second = Some(1_000_000.0);
}

/// A client socket with a 4 KiB receive buffer (set before it connects, so its window stays
/// small), which `post_completion` writes a request on and nothing ever reads.
async fn slow_reader(addr: SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    socket.connect(addr).await.unwrap()
}

/// Writes alice's `POST /v1/completions` of `body` on `stream`.
async fn post_completion(stream: &mut TcpStream, body: &Value) {
    let body = body.to_string();
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: gateway\r\nauthorization: Bearer sk-alice\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body.as_bytes()).await.unwrap();
}

/// The value of a counter the gateway exports.
async fn count(gw: &TestGateway, series: &str) -> u64 {
    let value = gw
        .metric(series)
        .await
        .unwrap_or_else(|| panic!("{series}"));
    value.parse().unwrap()
}

fn completion(max_tokens: u64, stream: bool) -> Value {
    json!({
        "model": "qwen3.5-27b",
        "prompt": "hello",
        "max_tokens": max_tokens,
        "stream": stream,
        "ignore_eos": true,
    })
}

/// A client streams an answer of 2,000,000 tokens and never reads it. Once its receive
/// buffer and the gateway's send buffer are full, it accepts no bytes; after
/// `client_write_timeout` it is dropped, the backend's stream is cancelled, and the request
/// settles: the output the gateway received is charged, the rest of the decode reservation
/// refunded, the KV lease freed. Before, all of it was held for as long as the socket was.
#[tokio::test]
async fn a_client_that_stops_reading_a_stream_is_dropped_and_its_request_settled() {
    let (gw, backend) = gateway_with(FakeSpec::default(), for_large_answers).await;
    let reserved = 2_000_000u64;
    let decode_capacity = gw.bucket("alice", "decode").await;
    let mut client = slow_reader(gw.running.addr).await;
    post_completion(&mut client, &completion(reserved, true)).await;
    let sent = Instant::now();
    backend.wait_cancelled(1).await;
    assert!(sent.elapsed() >= ms(500), "{:?}", sent.elapsed());
    gw.wait_metric(
        r#"tokengate_requests_total{tenant="alice",outcome="client_disconnect"}"#,
        "1",
    )
    .await;
    let charged = count(&gw, r#"tokengate_decode_tokens_total{tenant="alice"}"#).await;
    let refunded = count(
        &gw,
        r#"tokengate_decode_tokens_refunded_total{tenant="alice"}"#,
    )
    .await;
    assert!(charged > 0 && charged < reserved, "{charged}");
    assert_eq!(refunded, reserved - charged);
    assert_eq!(
        gw.bucket("alice", "decode").await,
        decode_capacity - charged as f64
    );
    assert_eq!(gw.kv_reserved(0).await, 0);
    assert_eq!(
        gw.metric(r#"tokengate_inflight_requests{tenant="alice"}"#)
            .await
            .as_deref(),
        Some("0")
    );
    assert_eq!(
        gw.metric(&closed("main", "write_timeout")).await.as_deref(),
        Some("1")
    );
}

/// A whole answer of 1,000,000 tokens (6 MB, more than a socket's send buffer holds) to a
/// client that does not read it: the request settled as answered when the backend finished,
/// and after `client_write_timeout` without a byte accepted the connection, and the answer
/// held for it, are dropped.
#[tokio::test]
async fn a_whole_answer_a_client_does_not_read_is_dropped_after_client_write_timeout() {
    let (gw, _backend) = gateway_with(FakeSpec::default(), for_large_answers).await;
    let mut client = slow_reader(gw.running.addr).await;
    post_completion(&mut client, &completion(1_000_000, false)).await;
    let sent = Instant::now();
    gw.wait_metric(&closed("main", "write_timeout"), "1").await;
    assert!(sent.elapsed() >= ms(500), "{:?}", sent.elapsed());
    gw.wait_metric(r#"tokengate_open_connections{listener="main"}"#, "0")
        .await;
    let settled = (
        gw.metric(r#"tokengate_requests_total{tenant="alice",outcome="ok"}"#)
            .await,
        gw.metric(r#"tokengate_decode_tokens_total{tenant="alice"}"#)
            .await,
    );
    assert_eq!(
        settled,
        (Some("1".to_string()), Some("1000000".to_string()))
    );
    let mut status_line = [0u8; 12];
    client.read_exact(&mut status_line).await.unwrap();
    assert_eq!(&status_line, b"HTTP/1.1 200");
}

/// An HTTP/2 connection from a client that sets `SETTINGS_INITIAL_WINDOW_SIZE` to `window`
/// and never reads (so never gives more): with 0 the gateway may send it headers but never a
/// byte of an answer's body. Its task answers the gateway's pings, so the connection itself
/// stays healthy; it ends when the gateway closes the connection.
async fn h2_window(
    addr: SocketAddr,
    window: u32,
) -> (
    h2::client::SendRequest<Bytes>,
    tokio::task::JoinHandle<Result<(), h2::Error>>,
) {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (client, conn) = h2::client::Builder::new()
        .initial_window_size(window)
        .handshake::<_, Bytes>(tcp)
        .await
        .unwrap();
    (client, tokio::spawn(conn))
}

/// Sends `method path` (with `key` as its bearer, and `body` as JSON) on an HTTP/2 connection
/// and waits for the answer's head, whose status it returns; the body is never read.
async fn h2_head(
    client: &mut h2::client::SendRequest<Bytes>,
    addr: SocketAddr,
    method: &str,
    path: &str,
    key: Option<&str>,
    body: Option<&Value>,
) -> (u16, h2::RecvStream) {
    let mut req = http::Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .header("content-type", "application/json");
    if let Some(key) = key {
        req = req.header("authorization", format!("Bearer {key}"));
    }
    let ready = client.clone().ready().await.unwrap();
    *client = ready;
    let (answer, mut send) = client
        .send_request(req.body(()).unwrap(), body.is_none())
        .unwrap();
    if let Some(body) = body {
        send.send_data(Bytes::from(body.to_string()), true).unwrap();
    }
    let answer = tokio::time::timeout(Duration::from_secs(10), answer)
        .await
        .expect("the answer's head came in time")
        .unwrap();
    (answer.status().as_u16(), answer.into_body())
}

/// Waits (10 s at most) for the gateway to close an HTTP/2 connection; how long after `from`.
async fn h2_closed(
    conn: tokio::task::JoinHandle<Result<(), h2::Error>>,
    from: Instant,
) -> Duration {
    let ended = tokio::time::timeout(Duration::from_secs(10), conn)
        .await
        .expect("the gateway closed the HTTP/2 connection in time");
    assert!(ended.is_ok(), "{ended:?}");
    from.elapsed()
}

/// A streamed chat to an HTTP/2 client whose streams have no window: the gateway has the
/// first token for it and the client takes no byte. After `client_write_timeout` from the
/// answer's head the request settles as a disconnect: the one token streamed charged, the
/// other 999 refunded, the KV lease freed, the connection closed (counted as a write
/// time-out). Before, the connection's deadlines never expired a busy connection and the
/// socket's writes kept flowing (pings), so the lease was held for as long as the client liked.
#[tokio::test]
async fn an_http2_stream_without_window_is_settled_after_client_write_timeout() {
    let (gw, backend) = gateway_with(FakeSpec::held(), |cfg| {
        cfg.server.client_write_timeout = ms(500);
    })
    .await;
    let addr = gw.running.addr;
    let decode = gw.bucket("alice", "decode").await;
    let (mut client, conn) = h2_window(addr, 0).await;
    let body = chat("hi", 1000, true);
    let (status, _unread) = h2_head(
        &mut client,
        addr,
        "POST",
        "/v1/chat/completions",
        Some("sk-alice"),
        Some(&body),
    )
    .await;
    let head = Instant::now();
    assert_eq!(status, 200);
    backend.wait_held(1).await;
    assert!(gw.kv_reserved(0).await > 0);
    gw.wait_metric(
        r#"tokengate_requests_total{tenant="alice",outcome="client_disconnect"}"#,
        "1",
    )
    .await;
    assert!(head.elapsed() >= ms(500), "{:?}", head.elapsed());
    assert_eq!(gw.kv_reserved(0).await, 0);
    gw.wait_bucket("alice", "decode", decode - 1.0).await;
    assert_eq!(
        (
            count(&gw, r#"tokengate_decode_tokens_total{tenant="alice"}"#).await,
            count(
                &gw,
                r#"tokengate_decode_tokens_refunded_total{tenant="alice"}"#
            )
            .await,
        ),
        (1, 999)
    );
    h2_closed(conn, head).await;
    assert_eq!(count(&gw, &closed("main", "write_timeout")).await, 1);
}

/// Answers nobody needs to be authenticated for, to HTTP/2 clients that never read them: a
/// 401 on the main listener and `/healthz` on the admin listener, to clients whose streams have
/// no window, each closed `client_write_timeout` after its answer's head; and a 401 to a client
/// whose window (16 bytes) takes its head and a piece of its body, closed
/// `client_write_timeout` after its `idle_timeout` (its GOAWAY waits for the rest of the body).
/// Before, each held its place (under `max_connections`, and under the admin listener's cap,
/// where a connection with a request in flight is never evicted) for as long as its client
/// answered pings.
#[tokio::test]
async fn unread_http2_answers_on_both_listeners_close_after_client_write_timeout() {
    let (gw, _backend) = gateway_with(FakeSpec::default(), |cfg| {
        cfg.server.client_write_timeout = ms(500);
        cfg.server.idle_timeout = ms(300);
    })
    .await;
    let (main, admin) = (gw.running.addr, gw.running.admin_addr);
    let (mut unauthenticated, main_conn) = h2_window(main, 0).await;
    let (status, _unread) =
        h2_head(&mut unauthenticated, main, "GET", "/v1/models", None, None).await;
    assert_eq!(status, 401);
    let main_head = Instant::now();
    let (mut probe, admin_conn) = h2_window(admin, 0).await;
    let (status, _unread) = h2_head(&mut probe, admin, "GET", "/healthz", None, None).await;
    assert_eq!(status, 200);
    let admin_head = Instant::now();
    let (mut trickle, trickle_conn) = h2_window(main, 16).await;
    let (status, _unread) = h2_head(&mut trickle, main, "GET", "/v1/models", None, None).await;
    assert_eq!(status, 401);
    let trickle_head = Instant::now();
    let main_open = h2_closed(main_conn, main_head).await;
    let admin_open = h2_closed(admin_conn, admin_head).await;
    let trickle_open = h2_closed(trickle_conn, trickle_head).await;
    assert!(
        main_open >= ms(500) && admin_open >= ms(500) && trickle_open >= ms(800),
        "{main_open:?} {admin_open:?} {trickle_open:?}"
    );
    let closed = (
        count(&gw, &closed("main", "write_timeout")).await,
        count(&gw, &closed("admin", "write_timeout")).await,
        count(&gw, &closed("main", "idle_timeout")).await,
    );
    assert_eq!(closed, (1, 1, 1));
    gw.wait_metric(r#"tokengate_open_connections{listener="main"}"#, "0")
        .await;
}
