//! Anthropic's `/v1/messages` end to end: counted as the chat vLLM converts it to,
//! charged its `max_tokens`, metered from its usage or its events, refunded; the key in
//! `x-api-key`; refusals and rate-limit headers in Anthropic's shape; `count_tokens` answered
//! locally for one request.

use super::*;
use http_body_util::BodyExt;

/// POSTs `body` to `path` with the key in `x-api-key`, as Anthropic's clients send it.
async fn post_anthropic(gw: &TestGateway, path: &str, key: &str, body: &Value) -> Received {
    let headers = [("content-type", "application/json"), ("x-api-key", key)];
    send(
        &gw.url(path),
        "POST",
        Some(body.to_string().into_bytes()),
        &headers,
    )
    .await
}

fn hello(max_tokens: u64, stream: bool) -> Value {
    json!({"model": "qwen3.5-27b", "max_tokens": max_tokens, "stream": stream,
           "system": "Be brief.", "messages": [{"role": "user", "content": "hi"}]})
}

/// The prompt of [`hello`] as vLLM renders its chat: the system text first.
fn hello_tokens() -> u64 {
    let rendered = format!("<|im_start|>system\nBe brief.<|im_end|>\n{USER_FRAME}hi{GEN_PROMPT}");
    tokenizer().count(&rendered) as u64
}

#[tokio::test]
async fn a_message_is_charged_metered_and_refunded() {
    let (gw, backend) = gateway(FakeSpec {
        natural_length: 3,
        ..FakeSpec::default()
    })
    .await;
    // More than the context leaves: the backend is asked for what fits, which is reserved.
    let r = post_anthropic(&gw, "/v1/messages", "sk-alice", &hello(4096, false)).await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["type"], "invalid_request_error");
    let r = post_anthropic(&gw, "/v1/messages", "sk-alice", &hello(1000, false)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    // The reservation was the 1,000 asked for, and 3 were generated.
    let sent = backend.seen.lock().unwrap()[0].clone();
    assert_eq!(
        (sent["max_tokens"].clone(), sent["system"].clone()),
        (json!(1000), json!("Be brief."))
    );
    assert_eq!(r.json()["usage"]["output_tokens"], 3);
    gw.wait_metric(r#"tokengate_decode_tokens_total{tenant="alice"}"#, "3")
        .await;
    gw.wait_bucket("alice", "decode", 997.0).await;
    assert_eq!(
        gw.bucket("alice", "prefill").await,
        10_000.0 - hello_tokens() as f64
    );
    // Anthropic's rate-limit headers beside OpenAI's, as the answer began (all 1,000 reserved).
    assert_eq!(r.headers["anthropic-ratelimit-output-tokens-limit"], "1000");
    assert_eq!(
        r.headers["anthropic-ratelimit-output-tokens-remaining"],
        "0"
    );
    assert_eq!(r.headers["x-ratelimit-remaining-tokens"], "0");
    assert!(r.headers.contains_key("anthropic-ratelimit-requests-reset"));
    // The prompt was charged to the prefill bucket: the input tokens; the decode bucket has
    // fewer left, so it is the tokens limit too.
    assert_eq!(r.headers["anthropic-ratelimit-input-tokens-limit"], "10000");
    let input_left = (10_000 - hello_tokens()).to_string();
    assert_eq!(
        r.headers["anthropic-ratelimit-input-tokens-remaining"],
        input_left.as_str()
    );
    assert_eq!(r.headers["anthropic-ratelimit-tokens-limit"], "1000");
    assert_eq!(r.headers["anthropic-ratelimit-tokens-remaining"], "0");

    // count_tokens says what was charged; it costs one request and a sixteenth of a prefill
    // token per token it counted.
    let requests = gw.bucket("alice", "requests").await;
    let body = json!({"model": "qwen3.5-27b", "system": "Be brief.",
                      "messages": [{"role": "user", "content": "hi"}]});
    let r = post_anthropic(&gw, "/v1/messages/count_tokens", "sk-alice", &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let n = hello_tokens();
    assert_eq!(
        r.json(),
        json!({"input_tokens": n, "context_management": {"original_input_tokens": n}})
    );
    assert_eq!(gw.bucket("alice", "requests").await, requests - 1.0);
    let counting = n.div_ceil(16);
    assert_eq!(
        gw.bucket("alice", "prefill").await,
        10_000.0 - (n + counting) as f64
    );
    assert_eq!(backend.seen.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn a_stream_without_usage_is_charged_the_text_of_its_deltas() {
    let (gw, _backend) = gateway(FakeSpec {
        natural_length: 5,
        usage: false,
        ..FakeSpec::default()
    })
    .await;
    let r = post_anthropic(&gw, "/v1/messages", "sk-alice", &hello(50, true)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.text().matches("content_block_delta").count(), 5 * 2);
    let used = tokenizer().count(&WORD.repeat(5));
    assert_eq!(used, 5);
    gw.wait_metric(r#"tokengate_decode_tokens_total{tenant="alice"}"#, "5")
        .await;
    gw.wait_bucket("alice", "decode", 995.0).await;
}

#[tokio::test]
async fn refusals_are_in_anthropics_shape_and_cost_nothing() {
    let (gw, backend) = gateway(FakeSpec::default()).await;
    let no_max = json!({"model": "qwen3.5-27b", "messages": [{"role": "user", "content": "hi"}]});
    let r = post_anthropic(&gw, "/v1/messages", "sk-alice", &no_max).await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json(),
        json!({"type": "error", "error": {"type": "invalid_request_error", "message": "`max_tokens` is required"}})
    );
    let r = post_anthropic(&gw, "/v1/messages", "sk-nobody", &hello(5, false)).await;
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["error"]["type"], "authentication_error");
    // Without any key, the 401 is Anthropic's too, on count_tokens as well.
    let headers = [("content-type", "application/json")];
    let body = Some(hello(5, false).to_string().into_bytes());
    let r = send(&gw.url("/v1/messages/count_tokens"), "POST", body, &headers).await;
    assert_eq!((r.status, r.json()["type"].clone()), (401, json!("error")));
    // A block the gateway cannot count, named.
    let mut body = hello(5, false);
    body["messages"][0]["content"] =
        json!([{"type": "tool_removal", "tool": {"type": "tool_reference", "name": "x"}}]);
    let r = post_anthropic(&gw, "/v1/messages", "sk-alice", &body).await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json()["error"]["message"],
        "`messages[0].content[0]` is a tool_removal block, which is not accepted: they are only allowed in system messages"
    );
    assert_eq!(gw.bucket("alice", "decode").await, 1000.0);
    assert_eq!(gw.bucket("alice", "prefill").await, 10_000.0);
    assert_eq!(gw.bucket("alice", "requests").await, 100.0);
    assert!(backend.seen.lock().unwrap().is_empty());
    // A 429 has Anthropic's type and headers.
    let r = post_anthropic(&gw, "/v1/messages", "sk-alice", &hello(1000, false)).await;
    assert_eq!(r.status, 200);
    let r = post_anthropic(&gw, "/v1/messages", "sk-alice", &hello(1000, false)).await;
    assert_eq!(
        (r.status, r.json()["error"]["type"].clone()),
        (429, json!("rate_limit_error"))
    );
    assert_eq!(
        r.headers["anthropic-ratelimit-output-tokens-remaining"],
        "0"
    );
    assert!(r.headers.contains_key("retry-after"));
}

#[tokio::test]
async fn a_stream_the_client_leaves_is_charged_what_it_delivered() {
    let (gw, backend) = gateway(FakeSpec {
        hold: true,
        ..FakeSpec::default()
    })
    .await;
    let headers = [
        ("content-type", "application/json"),
        ("x-api-key", "sk-alice"),
    ];
    let body = Some(hello(100, true).to_string().into_bytes());
    let resp = start_request(&gw.url("/v1/messages"), "POST", body, &headers).await;
    assert_eq!(resp.status(), 200);
    // The backend holds after its first token: read until the client has that token's delta.
    let mut body = resp.into_body();
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains("text_delta") {
        let frame = body.frame().await.expect("a frame").expect("no error");
        seen.extend_from_slice(&frame.into_data().unwrap_or_default());
    }
    drop(body);
    gw.wait_metric(
        r#"tokengate_requests_total{tenant="alice",outcome="client_disconnect"}"#,
        "1",
    )
    .await;
    gw.wait_metric(r#"tokengate_decode_tokens_total{tenant="alice"}"#, "1")
        .await;
    gw.wait_bucket("alice", "decode", 999.0).await;
    assert_eq!(gw.kv_reserved(0).await, 0);
    backend.release.add_permits(1);
}

/// Counting is work the gateway does with its own cores, so `count_tokens` and `/tokenize`
/// are charged for it: one request and a sixteenth of a prefill token per token counted (as far
/// as the prefill bucket holds), and an empty prefill bucket refuses the next count before its
/// body is read. A tenant of 10 prefill tokens a second (a 100-token bucket) counts a
/// 3,000-token conversation once and is then told to wait; before, each count cost one request
/// and a flood of large ones took another tenant's p90 from 5.6 ms to 185 ms.
#[tokio::test]
async fn counting_is_charged_a_sixteenth_of_a_prefill_token_per_token_counted() {
    let (gw, _backend) = gateway_with(FakeSpec::default(), |cfg| {
        cfg.tenants[0].prefill_tokens_per_second = Some(10.0);
    })
    .await;
    let long = "hello ".repeat(3000);
    let body = json!({"model": "qwen3.5-27b", "messages": [{"role": "user", "content": long}]});
    let r = post_anthropic(&gw, "/v1/messages/count_tokens", "sk-alice", &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let n = r.json()["input_tokens"].as_u64().unwrap();
    assert!(n.div_ceil(16) > 100, "{n}");
    assert_eq!(gw.bucket("alice", "prefill").await, 0.0);
    let r = post_anthropic(&gw, "/v1/messages/count_tokens", "sk-alice", &body).await;
    assert_eq!(
        (r.status, &r.json()["error"]["type"]),
        (429, &json!("rate_limit_error"))
    );
    let tokenize = json!({"model": "qwen3.5-27b", "prompt": "hi"});
    let r = post(&gw.url("/tokenize"), "sk-alice", &tokenize).await;
    assert_eq!((r.status, r.code().as_str()), (429, "rate_limit_exceeded"));
    // With room again (100 tokens), /tokenize is charged the same way.
    gw.clock.advance(Duration::from_secs(10));
    let r = post(
        &gw.url("/tokenize"),
        "sk-alice",
        &json!({"prompt": "hello".repeat(10)}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let counted = r.json()["count"].as_u64().unwrap();
    assert_eq!(
        gw.bucket("alice", "prefill").await,
        100.0 - counted.div_ceil(16) as f64
    );
}

/// A body is refused before it is parsed when it holds more JSON objects, arrays and strings
/// than `server.max_json_items`: what the gateway does with a body grows with its items, and a
/// 3 MB Messages body of 120,000 one-letter blocks cost `count_tokens` 0.4 CPU-s for one request.
/// Nothing is charged and the backend sees nothing; the bound is exact.
#[tokio::test]
async fn a_body_of_more_json_items_than_the_bound_is_refused_before_it_is_parsed() {
    let blocks = |n: usize| {
        let block = json!({"type": "text", "text": "a"});
        // 11 items around the blocks, 5 in each: {, "model", "qwen3.5-27b", "max_tokens",
        // "messages", [, {, "role", "user", "content", [.
        json!({"model": "qwen3.5-27b", "max_tokens": 1,
               "messages": [{"role": "user", "content": vec![block; n]}]})
    };
    let (gw, backend) = gateway_with(FakeSpec::default(), |cfg| {
        cfg.server.max_body_bytes = 4 << 20;
    })
    .await;
    let requests = gw.bucket("alice", "requests").await;
    for path in ["/v1/messages", "/v1/messages/count_tokens"] {
        let r = post_anthropic(&gw, path, "sk-alice", &blocks(120_000)).await;
        assert_eq!(r.status, 413, "{}", r.text());
        assert_eq!(
            r.json()["error"]["message"],
            "request body holds more than 65536 JSON objects, arrays and strings, the most the \
             gateway reads in one body (server.max_json_items): send fewer blocks, parts or \
             messages"
        );
    }
    assert_eq!(gw.bucket("alice", "requests").await, requests);
    assert!(backend.seen.lock().unwrap().is_empty());

    let (gw, _backend) = gateway_with(FakeSpec::default(), |cfg| {
        cfg.server.max_json_items = 511;
    })
    .await;
    let r = post_anthropic(&gw, "/v1/messages/count_tokens", "sk-alice", &blocks(100)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = post_anthropic(&gw, "/v1/messages/count_tokens", "sk-alice", &blocks(101)).await;
    assert_eq!(r.status, 413, "{}", r.text());
}
