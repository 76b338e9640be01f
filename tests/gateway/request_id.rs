//! Request ids end to end: a client's `x-request-id` comes back in its answer (and names the
//! request in the logs) only when it is 1 to 128 bytes of visible ASCII; anything else is
//! replaced by an unpredictable gateway id; the backend always gets a gateway id, never the
//! client's; and an unauthenticated client's own id never reaches the usage log. A client's W3C
//! trace context reaches the backend when valid.

use super::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Whether `id` is one the gateway made: `tg-` and 32 lowercase hex digits.
fn is_gateway_id(id: &str) -> bool {
    id.len() == 35
        && id.starts_with("tg-")
        && id[3..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// A chat from alice with the `x-request-id` headers `ids`: the answer's id and the one the
/// backend got.
async fn chat_with_ids(gw: &TestGateway, backend: &FakeBackend, ids: &[&str]) -> (String, String) {
    let mut headers = vec![
        ("content-type", "application/json"),
        ("authorization", "Bearer sk-alice"),
    ];
    headers.extend(ids.iter().map(|id| ("x-request-id", *id)));
    let body = chat("a", 2, false).to_string().into_bytes();
    let r = send(
        &gw.url("/v1/chat/completions"),
        "POST",
        Some(body),
        &headers,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let answered = r.headers["x-request-id"].to_str().unwrap().to_owned();
    let sent = backend.seen_headers.lock().unwrap().last().unwrap()["x-request-id"]
        .to_str()
        .unwrap()
        .to_owned();
    (answered, sent)
}

/// A fit client id comes back in the answer, and the backend gets an id of the gateway's, a new
/// one each time: vLLM takes the id as its engine request id, so two tenants sending the same
/// id (or one guessing another's) would collide there. Before, the client's id reached vLLM
/// verbatim.
#[tokio::test]
async fn a_client_id_comes_back_only_when_short_and_visible_ascii_and_never_reaches_the_backend() {
    let (gw, backend) = gateway(FakeSpec::default()).await;
    let visible: String = (0x21u8..=0x7e).map(char::from).collect();
    let longest = "a".repeat(128);
    let mut sent_ids = std::collections::HashSet::new();
    for id in ["client-42", "client-42", visible.as_str(), longest.as_str()] {
        let (answered, sent) = chat_with_ids(&gw, &backend, &[id]).await;
        assert_eq!(answered, id);
        assert!(is_gateway_id(&sent), "{id} reached the backend as {sent}");
        sent_ids.insert(sent);
    }
    assert_eq!(sent_ids.len(), 4);
    let too_long = "a".repeat(129);
    let huge = "x".repeat(60 << 10);
    for ids in [
        &[too_long.as_str()][..],
        &[huge.as_str()],
        &["two words"],
        &["tab\tinside"],
        &["first", "second"],
    ] {
        let (answered, sent) = chat_with_ids(&gw, &backend, ids).await;
        assert!(is_gateway_id(&answered), "{ids:?} answered {answered}");
        assert_eq!(sent, answered);
    }
    // Bytes past ASCII (a raw request: clients' header types refuse to send them).
    let body = chat("a", 2, false).to_string();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n\
         authorization: Bearer sk-alice\r\ncontent-length: {}\r\nconnection: close\r\n",
        body.len()
    );
    let mut request = head.into_bytes();
    request.extend_from_slice(b"x-request-id: caf\xc3\xa9\r\n\r\n");
    request.extend_from_slice(body.as_bytes());
    let mut stream = tokio::net::TcpStream::connect(gw.running.addr)
        .await
        .unwrap();
    stream.write_all(&request).await.unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.unwrap();
    let answer = String::from_utf8(answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    let answered = answer
        .lines()
        .find_map(|l| l.strip_prefix("x-request-id: "))
        .expect("an id");
    assert!(is_gateway_id(answered), "{answered}");
    let sent = backend.seen_headers.lock().unwrap().last().unwrap()["x-request-id"].clone();
    assert_eq!(sent, answered);
}

/// A chat posted with `key` and the `x-request-id` `id`: the status and the answer's id.
async fn post_with_id(url: &str, key: &str, id: Option<&str>) -> (u16, String) {
    let auth = format!("Bearer {key}");
    let mut headers = vec![
        ("content-type", "application/json"),
        ("authorization", auth.as_str()),
    ];
    headers.extend(id.map(|id| ("x-request-id", id)));
    let body = chat("a", 2, false).to_string().into_bytes();
    let r = send(url, "POST", Some(body), &headers).await;
    (
        r.status,
        r.headers["x-request-id"].to_str().unwrap().to_owned(),
    )
}

#[tokio::test]
async fn an_unauthenticated_clients_id_never_reaches_the_usage_log() {
    let dir = TempDir::new("request-id-usage-log");
    let path = dir.0.join("usage.jsonl");
    let (gw, _backend) = gateway_with(FakeSpec::default(), |cfg| {
        cfg.usage_log = Some(tokengate::usage_log::UsageLogConfig {
            path: path.display().to_string(),
            buffer_records: 16,
        });
    })
    .await;
    let url = gw.url("/v1/chat/completions");
    // 1. An unknown key with a fit id of its own: the client is answered with it, the log
    //    line has none.
    let (status, answered) = post_with_id(&url, "sk-nobody", Some("client-7")).await;
    assert_eq!((status, answered.as_str()), (401, "client-7"));
    // 2. An unknown key with 60 KB of id: replaced, and the gateway's id is on the line.
    let (status, made) = post_with_id(&url, "sk-nobody", Some(&"x".repeat(60 << 10))).await;
    assert_eq!(status, 401);
    assert!(is_gateway_id(&made), "{made}");
    // 3. A known key with a fit id, refused after authentication (over alice's decode burst):
    //    its id is on the line.
    let over = chat("a", 1001, false).to_string().into_bytes();
    let r = send(
        &url,
        "POST",
        Some(over),
        &[
            ("content-type", "application/json"),
            ("authorization", "Bearer sk-alice"),
            ("x-request-id", "client-8"),
        ],
    )
    .await;
    assert_eq!(r.code(), "exceeds_tenant_burst");
    gw.running
        .gateway
        .recorder
        .flush(Duration::from_secs(10))
        .await;
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<(Value, Value)> = text
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .map(|l| (l["outcome"].clone(), l["request_id"].clone()))
        .collect();
    assert_eq!(
        lines,
        [
            (json!("invalid_api_key"), Value::Null),
            (json!("invalid_api_key"), json!(made)),
            (json!("exceeds_tenant_burst"), json!("client-8")),
        ],
        "{text}"
    );
}

/// The admin listener gives ids as the main one does: its answers carry one (a fit client id
/// echoed, anything else replaced), so a probe's or a scraper's request can be found in the
/// logs. Before, admin answers carried none.
#[tokio::test]
async fn admin_answers_carry_request_ids_too() {
    let (gw, _backend) = gateway(FakeSpec::default()).await;
    let url = format!("http://{}/healthz", gw.running.admin_addr);
    let r = send(&url, "GET", None, &[]).await;
    assert_eq!(r.status, 200);
    let made = r.headers["x-request-id"].to_str().unwrap();
    assert!(is_gateway_id(made), "{made}");
    let r = send(&url, "GET", None, &[("x-request-id", "probe-7")]).await;
    assert_eq!(r.headers["x-request-id"], "probe-7");
    let long = "x".repeat(129);
    let r = send(&url, "GET", None, &[("x-request-id", long.as_str())]).await;
    assert!(is_gateway_id(r.headers["x-request-id"].to_str().unwrap()));
    // An admin refusal too (a path the admin listener does not serve).
    let r = send(
        &format!("http://{}/nowhere", gw.running.admin_addr),
        "GET",
        None,
        &[],
    )
    .await;
    assert_eq!(r.status, 404);
    assert!(is_gateway_id(r.headers["x-request-id"].to_str().unwrap()));
}

/// A client's W3C trace context reaches the backend as sent; an invalid `traceparent` does not,
/// nor its `tracestate`.
#[tokio::test]
async fn the_clients_trace_context_reaches_the_backend() {
    let (gw, backend) = gateway(FakeSpec::default()).await;
    let url = gw.url("/v1/chat/completions");
    let body = chat("hi", 3, false).to_string().into_bytes();
    let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let sent = |traceparent: &'static str| {
        let (url, body) = (url.clone(), body.clone());
        let seen_headers = backend.seen_headers.clone();
        async move {
            let headers = [
                ("content-type", "application/json"),
                ("authorization", "Bearer sk-alice"),
                ("traceparent", traceparent),
                ("tracestate", "congo=t61rcWkgMzE"),
            ];
            assert_eq!(send(&url, "POST", Some(body), &headers).await.status, 200);
            let seen = seen_headers.lock().unwrap().last().unwrap().clone();
            let header = |name: &str| seen.get(name).map(|v| v.to_str().unwrap().to_owned());
            (header("traceparent"), header("tracestate"))
        }
    };
    assert_eq!(
        sent(parent).await,
        (
            Some(parent.to_owned()),
            Some("congo=t61rcWkgMzE".to_owned())
        )
    );
    let zero_trace = "00-00000000000000000000000000000000-00f067aa0ba902b7-01";
    assert_eq!(sent(zero_trace).await, (None, None));
}
