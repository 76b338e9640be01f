//! The gateway end to end on real sockets: a fake backend and a gateway on 127.0.0.1:0, the
//! limiter on a manual clock. Every test asserts exact statuses, codes, headers and ledger
//! numbers, and waits only on observable events.

mod common;
mod support;

use serde_json::{json, Value};
use std::time::Duration;
use support::*;

const USER_FRAME: &str = "<|im_start|>user\n";
const GEN_PROMPT: &str = "<|im_end|>\n<|im_start|>assistant\n<think>\n";

/// Prompt tokens of a one-message chat, from the tokenizer on the hand-written rendering.
fn chat_tokens(content: &str) -> u64 {
    tokenizer().count(&format!("{USER_FRAME}{content}{GEN_PROMPT}")) as u64
}

async fn gateway(spec: FakeSpec) -> (TestGateway, FakeBackend) {
    gateway_with(spec, |_| {}).await
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

/// A chat request that must be answered within 10 s (the gateway's timeouts under test are
/// far shorter).
async fn chat_within_10s(gw: &TestGateway, body: &Value, what: &str) -> Received {
    tokio::time::timeout(Duration::from_secs(10), gw.chat("sk-alice", body))
        .await
        .unwrap_or_else(|_| panic!("{what}"))
}

#[tokio::test]
async fn streams_meters_and_hides_the_usage_chunk_it_asked_for() {
    let (gw, backend) = gateway(FakeSpec::default()).await;
    let r = gw.chat("sk-alice", &chat("hello world", 5, true)).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["x-ratelimit-remaining-tokens"], "995");
    let data = sse_data(&r.body);
    assert_eq!(
        data.len(),
        6,
        "5 tokens and [DONE], no usage chunk: {data:?}"
    );
    assert_eq!(data[5], "[DONE]");
    for d in &data[..5] {
        let v: Value = serde_json::from_str(d).unwrap();
        assert_eq!(v["choices"][0]["delta"]["content"], WORD);
    }
    let sent = backend.seen.lock().unwrap()[0].clone();
    assert_eq!(sent["max_tokens"], 5);
    assert_eq!(sent["stream_options"]["include_usage"], true);
    let prompt = chat_tokens("hello world");
    assert_eq!(
        gw.bucket("alice", "prefill").await,
        10_000.0 - prompt as f64
    );
    assert_eq!(gw.bucket("alice", "decode").await, 995.0);
    assert_eq!(gw.bucket("alice", "requests").await, 99.0);
    assert_eq!(gw.kv_reserved(0).await, 0);
    gw.wait_metric("tokengate_decode_tokens_total{tenant=\"alice\"}", "5")
        .await;
    gw.wait_metric(
        "tokengate_prefill_tokens_total{tenant=\"alice\"}",
        &prompt.to_string(),
    )
    .await;

    // Asked for usage: the client gets the usage chunk.
    let mut body = chat("hello world", 3, true);
    body["stream_options"] = json!({"include_usage": true});
    let r = gw.chat("sk-alice", &body).await;
    let data = sse_data(&r.body);
    assert_eq!(data.len(), 5);
    let usage: Value = serde_json::from_str(&data[3]).unwrap();
    assert_eq!(usage["usage"]["completion_tokens"], 3);
}

#[tokio::test]
async fn non_streaming_answer_is_passed_and_settled() {
    let (gw, backend) = gateway(FakeSpec::default()).await;
    let r = gw.chat("sk-alice", &chat("hi there", 7, false)).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["choices"][0]["message"]["content"], WORD.repeat(7));
    assert_eq!(r.json()["usage"]["completion_tokens"], 7);
    assert_eq!(backend.max_tokens_seen(), vec![7]);
    assert_eq!(gw.bucket("alice", "decode").await, 993.0);
    assert!(r.headers.get("x-request-id").is_some());
    // The tenant's limits right after the charge (7 decode tokens and 1 request reserved),
    // as OpenAI sends them with every answer.
    let limits: Vec<(&str, &str)> = [
        "limit-tokens",
        "remaining-tokens",
        "reset-tokens",
        "limit-requests",
        "remaining-requests",
        "reset-requests",
    ]
    .iter()
    .map(|h| (*h, r.headers[format!("x-ratelimit-{h}")].to_str().unwrap()))
    .collect();
    assert_eq!(
        limits,
        [
            ("limit-tokens", "1000"),
            ("remaining-tokens", "993"),
            ("reset-tokens", "70ms"),
            ("limit-requests", "100"),
            ("remaining-requests", "99"),
            ("reset-requests", "100ms"),
        ]
    );

    // Completions endpoint, no max_tokens: vLLM's own default (16, as vLLM 0.32 generates),
    // smaller than the gateway's (100), is reserved and forwarded.
    let body = json!({"model": "qwen3.5-27b", "prompt": "Once upon a time"});
    let r = post(&gw.url("/v1/completions"), "sk-alice", &body).await;
    assert_eq!(r.status, 200);
    assert_eq!(backend.max_tokens_seen(), vec![7, 16]);

    // A prompt of token ids is charged its length (and never waits for the tokenizer pool).
    let prefill = gw.bucket("alice", "prefill").await;
    let body = json!({"model": "qwen3.5-27b", "prompt": [9707, 11, 1879, 0, 42], "max_tokens": 2});
    let r = post(&gw.url("/v1/completions"), "sk-alice", &body).await;
    assert_eq!(r.status, 200);
    assert_eq!(prefill - gw.bucket("alice", "prefill").await, 5.0);
}

/// vLLM's batch of chats: each conversation's prompt counted and its output reserved, the
/// whole settled on the answer's usage; a streamed batch is refused before anything is charged.
#[tokio::test]
async fn a_batch_of_chats_is_charged_each_conversation_and_settled_on_its_usage() {
    let (gw, backend) = gateway(FakeSpec::default()).await;
    let conversation = |content: &str| json!([{"role": "user", "content": content}]);
    let tools = json!([{"type": "function", "function": {"name": "f"}}]);
    let body = json!({"model": "qwen3.5-27b", "messages": [conversation("hi there"), conversation("Once upon a time")],
                      "max_tokens": 7, "ignore_eos": true, "tools": tools});
    let prefill = gw.bucket("alice", "prefill").await;
    let r = post(&gw.url("/v1/chat/completions/batch"), "sk-alice", &body).await;
    assert_eq!(r.status, 200);
    assert_eq!(backend.max_tokens_seen(), vec![7]);
    // Both prompts, rendered without the tools; 14 tokens reserved, 7 written (the fake
    // backend's usage), the rest given back.
    let prompts = chat_tokens("hi there") + chat_tokens("Once upon a time");
    assert_eq!(
        prefill - gw.bucket("alice", "prefill").await,
        prompts as f64
    );
    assert_eq!(gw.bucket("alice", "decode").await, 993.0);

    let streamed = json!({"model": "qwen3.5-27b", "messages": [conversation("hi")], "max_tokens": 7, "stream": true});
    let r = post(&gw.url("/v1/chat/completions/batch"), "sk-alice", &streamed).await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["param"], "stream");
    assert_eq!(backend.max_tokens_seen(), vec![7]);
    assert_eq!(
        prefill - gw.bucket("alice", "prefill").await,
        prompts as f64
    );
    assert_eq!(gw.bucket("alice", "decode").await, 993.0);
}

#[tokio::test]
async fn drained_decode_bucket_gives_exact_retry_after_then_admits_after_refill() {
    let (gw, _backend) = gateway(FakeSpec::default()).await;
    let url = gw.url("/v1/chat/completions");
    assert_eq!(
        post(&url, "sk-alice", &chat("a", 600, false)).await.status,
        200
    );
    assert_eq!(gw.bucket("alice", "decode").await, 400.0);
    let r = post(&url, "sk-alice", &chat("a", 600, false)).await;
    assert_eq!(r.status, 429);
    assert_eq!(r.code(), "rate_limit_exceeded");
    // The decode bucket refused: a token bucket, as OpenAI's `type` says.
    assert_eq!(r.json()["error"]["type"], "tokens");
    // 200 tokens short at 100 tokens/s: exactly 2 s.
    assert_eq!(r.headers["retry-after"], "2");
    assert_eq!(r.headers["x-ratelimit-limit-tokens"], "1000");
    assert_eq!(r.headers["x-ratelimit-remaining-tokens"], "400");
    assert_eq!(r.headers["x-ratelimit-reset-tokens"], "6s");
    assert_eq!(r.headers["x-ratelimit-remaining-requests"], "99");
    let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
    // Refused before the prompt was counted: the wait is exact for the decode bucket and a
    // lower bound for the whole request (whose prefill is not known yet).
    assert_eq!(
        msg,
        "rate limit reached for decode: request needs 600 tokens, 400 available; retry after at \
         least 2.000 s"
    );
    // Nothing was charged by the refusal.
    assert_eq!(gw.bucket("alice", "decode").await, 400.0);
    assert_eq!(gw.bucket("alice", "requests").await, 99.0);

    gw.clock.advance(Duration::from_millis(1999));
    assert_eq!(
        post(&url, "sk-alice", &chat("a", 600, false)).await.status,
        429
    );
    gw.clock.advance(Duration::from_millis(1));
    assert_eq!(
        post(&url, "sk-alice", &chat("a", 600, false)).await.status,
        200
    );
    assert_eq!(gw.bucket("alice", "decode").await, 0.0);
}

#[tokio::test]
async fn early_stop_refunds_exactly_the_unused_decode_tokens() {
    let (gw, _backend) = gateway(FakeSpec {
        natural_length: 3,
        ..FakeSpec::default()
    })
    .await;
    let mut body = chat("tell me", 50, true);
    body.as_object_mut().unwrap().remove("ignore_eos");
    let r = gw.chat("sk-alice", &body).await;
    assert_eq!(r.status, 200);
    assert_eq!(sse_data(&r.body).len(), 4);
    assert_eq!(gw.bucket("alice", "decode").await, 997.0);
    gw.wait_metric(
        "tokengate_decode_tokens_refunded_total{tenant=\"alice\"}",
        "47",
    )
    .await;
    gw.wait_metric(
        "tokengate_decode_tokens_reserved_total{tenant=\"alice\"}",
        "50",
    )
    .await;
}

#[tokio::test]
async fn one_tenant_drained_leaves_the_other_untouched() {
    let (gw, _backend) = gateway(FakeSpec::default()).await;
    let url = gw.url("/v1/chat/completions");
    assert_eq!(
        post(&url, "sk-alice", &chat("a", 1000, false)).await.status,
        200
    );
    assert_eq!(
        post(&url, "sk-alice", &chat("a", 1, false)).await.status,
        429
    );
    assert_eq!(gw.bucket("bob", "decode").await, 1000.0);
    assert_eq!(
        post(&url, "sk-bob", &chat("a", 1000, false)).await.status,
        200
    );
}

#[tokio::test]
async fn requests_that_can_never_fit_are_400_not_429() {
    let (gw, _backend) = gateway(FakeSpec::default()).await;
    let url = gw.url("/v1/chat/completions");
    let r = post(&url, "sk-alice", &chat("a", 1001, false)).await;
    assert_eq!((r.status, r.code().as_str()), (400, "exceeds_tenant_burst"));
    assert_eq!(
        r.json()["error"]["message"],
        "request needs 1001 decode tokens; the tenant's decode burst is 1000"
    );
    assert!(r.headers.get("retry-after").is_none());
    // Over the decode burst and the context at once: the burst, checked before counting, decides.
    let r = post(&url, "sk-alice", &chat("a", 4090, false)).await;
    assert_eq!((r.status, r.code().as_str()), (400, "exceeds_tenant_burst"));
    assert_eq!(gw.bucket("alice", "decode").await, 1000.0);

    // Within a larger decode burst, the context decides: 4,090 tokens of output leave 6 for the
    // prompt, so counting stops at its 7th token, and the message says so.
    let (gw, _backend) = gateway_with(FakeSpec::default(), |cfg| {
        cfg.tenants[0].decode_tokens_per_second = Some(1000.0);
    })
    .await;
    let r = gw.chat("sk-alice", &chat("a", 4090, false)).await;
    assert_eq!(
        (r.status, r.code().as_str()),
        (400, "context_length_exceeded")
    );
    assert_eq!(
        r.json()["error"]["message"],
        "this model's maximum context length is 4096 tokens; the prompt is at least 7 tokens \
         and 4090 output tokens were requested (at least 4097 in all)"
    );
    assert_eq!(chat_tokens("a"), 11);
    assert_eq!(gw.bucket("alice", "decode").await, 10000.0);

    // KV: one sequence's footprint over the whole backend capacity.
    let (gw, _backend) = gateway_with(FakeSpec::default(), |cfg| {
        cfg.backends[0].kv_capacity_bytes = Some(153_944_064 + 65_536 * 128); // one block of KV
    })
    .await;
    let r = gw.chat("sk-alice", &chat("a", 200, false)).await;
    assert_eq!((r.status, r.code().as_str()), (400, "exceeds_kv_capacity"));
    assert_eq!(gw.bucket("alice", "decode").await, 1000.0);
    assert_eq!(gw.bucket("alice", "requests").await, 100.0);
}

/// A gateway whose backend holds every generation after its first token, with `max_batch`
/// sequences of KV room and the given queue deadline.
async fn held_gateway(
    spec: FakeSpec,
    max_batch: u32,
    deadline: &str,
) -> (TestGateway, FakeBackend) {
    gateway_with(spec, |cfg| {
        cfg.backends[0].max_batch = Some(max_batch);
        cfg.admission.queue_deadline = humantime::parse_duration(deadline).unwrap();
    })
    .await
}

#[tokio::test]
async fn third_request_waits_for_kv_and_proceeds_when_one_finishes() {
    let (gw, backend) = held_gateway(FakeSpec::held(), 2, "10s").await;
    let url = gw.url("/v1/chat/completions");
    let mut tasks = Vec::new();
    for _ in 0..2 {
        tasks.push(spawn_post(&url, "sk-alice", chat("a", 4, true)));
    }
    backend.wait_held(2).await;
    let third = spawn_post(&url, "sk-bob", chat("b", 4, true));
    gw.wait_queued(1).await;
    assert_eq!(backend.seen.lock().unwrap().len(), 2);
    backend.release.add_permits(1);
    backend.wait_held(3).await;
    gw.wait_queued(0).await;
    backend.release.add_permits(2);
    for t in tasks {
        assert_eq!(t.await.unwrap().status, 200);
    }
    assert_eq!(third.await.unwrap().status, 200);
    assert_eq!(gw.kv_reserved(0).await, 0);
}

#[tokio::test]
async fn queue_deadline_gives_503_and_refunds_the_waiter() {
    let (gw, backend) = held_gateway(FakeSpec::held(), 1, "100ms").await;
    let url = gw.url("/v1/chat/completions");
    let first = spawn_post(&url, "sk-alice", chat("a", 4, true));
    backend.wait_held(1).await;
    let r = post(&url, "sk-bob", &chat("b", 30, true)).await;
    assert_eq!((r.status, r.code().as_str()), (503, "capacity_exhausted"));
    assert_eq!(r.headers["retry-after"], "1");
    assert_eq!(gw.bucket("bob", "decode").await, 1000.0);
    assert_eq!(gw.bucket("bob", "requests").await, 100.0);
    backend.release.add_permits(1);
    assert_eq!(first.await.unwrap().status, 200);
    assert_eq!(gw.kv_reserved(0).await, 0);
}

#[tokio::test]
async fn a_flood_from_one_tenant_does_not_starve_another() {
    let (gw, backend) = held_gateway(FakeSpec::held(), 1, "30s").await;
    let url = gw.url("/v1/chat/completions");
    let mut tasks = Vec::new();
    let spawn = |key: &'static str, text: &str| spawn_post(&url, key, chat(text, 2, true));
    tasks.push(spawn("sk-alice", "alice 0"));
    backend.wait_held(1).await;
    for (i, text) in ["alice 1", "alice 2", "alice 3", "alice 4", "alice 5"]
        .into_iter()
        .enumerate()
    {
        tasks.push(spawn("sk-alice", text));
        gw.wait_queued(i as u64 + 1).await;
    }
    tasks.push(spawn("sk-bob", "bob 0"));
    gw.wait_queued(6).await;
    // bob joins at alice's fairness counter; on a tie the older head (alice 1) goes first, then
    // bob's: one grant later, not after alice's whole flood.
    backend.release.add_permits(2);
    backend.wait_held(3).await;
    let third = backend.seen.lock().unwrap()[2]["messages"][0]["content"].clone();
    assert_eq!(
        third, "bob 0",
        "bob goes after one of alice's, not after her flood"
    );
    backend.release.add_permits(10);
    for t in tasks {
        assert_eq!(t.await.unwrap().status, 200);
    }
}

/// alice's stream of `body` to `url`, on a task that reads its first piece, returns it as text
/// and leaves: the body dropped closes the connection mid-stream.
fn first_event_then_leave(url: String, body: Value) -> tokio::task::JoinHandle<String> {
    tokio::spawn(async move {
        let headers = [
            ("content-type", "application/json"),
            ("authorization", "Bearer sk-alice"),
        ];
        let resp = start_request(&url, "POST", Some(body.to_string().into_bytes()), &headers).await;
        use http_body_util::BodyExt;
        let first = resp.into_body().frame().await.unwrap().unwrap();
        String::from_utf8_lossy(&first.into_data().unwrap()).into_owned()
    })
}

#[tokio::test]
async fn client_disconnect_mid_stream_frees_kv_and_settles_tokens_seen() {
    let (gw, backend) = held_gateway(
        FakeSpec {
            usage: false,
            ..FakeSpec::held()
        },
        4,
        "10s",
    )
    .await;
    let client = first_event_then_leave(gw.url("/v1/chat/completions"), chat("a", 50, true));
    backend.wait_held(1).await;
    assert!(client.await.unwrap().contains(WORD));
    // One token was streamed: 49 of the 50 reserved come back once the drop is seen.
    gw.wait_metric(
        "tokengate_decode_tokens_refunded_total{tenant=\"alice\"}",
        "49",
    )
    .await;
    assert_eq!(gw.kv_reserved(0).await, 0);
    assert_eq!(gw.bucket("alice", "decode").await, 999.0);
    gw.wait_metric(
        "tokengate_requests_total{tenant=\"alice\",outcome=\"client_disconnect\"}",
        "1",
    )
    .await;
}

/// A completions stream with `echo` starts with the prompt, which is not output: cut before
/// the backend's usage, it is charged the one token generated, not the prompt's tokens.
#[tokio::test]
async fn an_echoed_prompt_in_a_cut_stream_is_not_charged_as_output() {
    let (gw, backend) = held_gateway(
        FakeSpec {
            usage: false,
            ..FakeSpec::held()
        },
        4,
        "10s",
    )
    .await;
    let prompt = "Once upon a time there was a gateway that counted tokens";
    let body = json!({"model": "qwen3.5-27b", "prompt": prompt, "max_tokens": 50, "echo": true,
                      "stream": true});
    let client = first_event_then_leave(gw.url("/v1/completions"), body);
    backend.wait_held(1).await;
    assert!(client.await.unwrap().contains(prompt));
    // One token was generated after the prompt: 49 of the 50 reserved come back.
    gw.wait_metric(
        "tokengate_decode_tokens_refunded_total{tenant=\"alice\"}",
        "49",
    )
    .await;
    assert_eq!(gw.bucket("alice", "decode").await, 999.0);
}

/// The first event of a completions stream with `echo` holds the whole prompt: it may be as
/// large as a whole answer (`max_response_bytes`), not only `max_event_bytes`.
#[tokio::test]
async fn an_echoed_prompt_may_pass_the_stream_event_bound() {
    let (gw, _backend) = gateway_with(FakeSpec::default(), |cfg| {
        cfg.backends[0].max_event_bytes = 1024;
    })
    .await;
    let prompt = WORD.repeat(400);
    for (echo, complete) in [(true, true), (false, true)] {
        let body = json!({"model": "qwen3.5-27b", "prompt": prompt, "max_tokens": 3,
                          "echo": echo, "stream": true});
        let r = post(&gw.url("/v1/completions"), "sk-alice", &body).await;
        assert_eq!(r.status, 200);
        let text = r.text();
        assert!(!text.contains("upstream_error"), "echo {echo}: {text}");
        assert_eq!(text.ends_with("data: [DONE]\n\n"), complete, "echo {echo}");
    }
    // Without `echo`, an event past the bound ends the stream with an error.
    let (gw, _backend) = gateway_with(FakeSpec::default(), |cfg| {
        cfg.backends[0].max_event_bytes = 16;
    })
    .await;
    let body = json!({"model": "qwen3.5-27b", "prompt": "hi", "max_tokens": 3, "stream": true});
    let r = post(&gw.url("/v1/completions"), "sk-alice", &body).await;
    assert!(r.text().contains("upstream_error"), "{}", r.text());
}

#[tokio::test]
async fn client_disconnect_while_queued_leaves_the_queue_at_once() {
    let (gw, backend) = held_gateway(FakeSpec::held(), 1, "30s").await;
    let url = gw.url("/v1/chat/completions");
    let first = spawn_post(&url, "sk-alice", chat("a", 4, true));
    backend.wait_held(1).await;
    let waiting = spawn_post(&url, "sk-bob", chat("b", 30, true));
    gw.wait_queued(1).await;
    waiting.abort();
    gw.wait_queued(0).await;
    gw.wait_metric(
        "tokengate_requests_total{tenant=\"bob\",outcome=\"client_disconnect\"}",
        "1",
    )
    .await;
    assert_eq!(gw.bucket("bob", "decode").await, 1000.0);
    assert_eq!(gw.bucket("bob", "prefill").await, 10_000.0);
    assert_eq!(gw.bucket("bob", "requests").await, 100.0);
    backend.release.add_permits(1);
    assert_eq!(first.await.unwrap().status, 200);
    assert_eq!(gw.kv_reserved(0).await, 0);
}

#[tokio::test]
async fn backend_down_is_502_and_changes_nothing() {
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let gw = TestGateway::start(config(&[closed])).await;
    let r = gw.chat("sk-alice", &chat("a", 10, true)).await;
    assert_eq!((r.status, r.code().as_str()), (502, "upstream_error"));
    assert_nothing_charged(&gw).await;
    assert_failure_counted_once(&gw, "upstream_error").await;
    let r = send(
        &gw.url("/v1/models"),
        "GET",
        None,
        &[("authorization", "Bearer sk-alice")],
    )
    .await;
    assert_eq!(r.status, 502);
}

#[tokio::test]
async fn backend_reset_before_the_first_token_is_502_and_changes_nothing() {
    let (gw, _backend) = gateway(FakeSpec {
        behaviour: Behaviour::ResetAfter(0),
        ..FakeSpec::default()
    })
    .await;
    let r = gw.chat("sk-alice", &chat("a", 10, true)).await;
    assert_eq!((r.status, r.code().as_str()), (502, "upstream_error"));
    assert_nothing_charged(&gw).await;
    assert_failure_counted_once(&gw, "upstream_error").await;
}

#[tokio::test]
async fn a_non_streamed_answer_without_usage_is_counted_from_its_text() {
    let (gw, _backend) = gateway(FakeSpec {
        usage: false,
        ..FakeSpec::default()
    })
    .await;
    let r = gw.chat("sk-alice", &chat("a", 10, false)).await;
    assert_eq!(r.status, 200);
    let used = tokenizer().count(&WORD.repeat(10));
    assert_eq!(used, 10);
    gw.wait_metric(r#"tokengate_decode_tokens_total{tenant="alice"}"#, "10")
        .await;
    gw.wait_bucket("alice", "decode", 990.0).await;
}

/// The backend had the request when the gateway stopped waiting for its first chunk (its
/// headers came): a 504, the prefill it was doing stays charged, and the decode floor of the
/// time it ran, 5 TPOTs of the 10 tokens reserved (before: every decode token came back).
#[tokio::test]
async fn a_stream_silent_past_the_first_byte_timeout_is_504_charged_its_prefill_and_decode_floor() {
    let spec = FakeSpec {
        behaviour: Behaviour::StallAfterHeaders,
        ..FakeSpec::default()
    };
    let (gw, _backend) = gateway_with(spec, |cfg| {
        cfg.backends[0].first_byte_timeout = RUNS;
        cfg.backends[0].tpot_slo_ms = Some(FLOOR_TPOT_MS);
    })
    .await;
    let r = chat_within_10s(
        &gw,
        &chat("a", 10, true),
        "the gateway gives up on a silent stream",
    )
    .await;
    assert_eq!((r.status, r.code().as_str()), (504, "upstream_timeout"));
    assert_prefill_and_decode_charged(&gw, chat_tokens("a"), 5).await;
    assert_failure_counted_once_refunding(&gw, "upstream_timeout", 5).await;
}

/// A backend that stalls mid-answer must not hold the KV lease and the reservation until the
/// client gives up: past `stream_idle_timeout` of silence the stream ends with an
/// `upstream_timeout` error event, and the tokens that did stream are all that is charged.
#[tokio::test]
async fn a_stream_stalled_mid_answer_ends_with_a_timeout_event_and_settles() {
    let (gw, _backend) = gateway_with(FakeSpec::held(), |cfg| {
        cfg.backends[0].stream_idle_timeout = Duration::from_millis(200);
    })
    .await;
    let r = chat_within_10s(
        &gw,
        &chat("a", 10, true),
        "the gateway gives up on a stalled stream",
    )
    .await;
    let message = "the backend sent no output for 200ms in the middle of its answer";
    assert_cut_short_after_one_token(&gw, &r, "upstream_timeout", message).await;
}

/// A backend that sends keep-alive comments and empty deltas after its first token, and
/// nothing else, is not making progress: past `stream_idle_timeout` without output the stream
/// ends with the same `upstream_timeout` event and settles (one token charged, the lease freed).
/// Before, each keep-alive restarted the timer and the lease was held for as long as the
/// backend kept sending them.
#[tokio::test]
async fn keep_alives_and_empty_deltas_do_not_extend_stream_idle_timeout() {
    let spec = FakeSpec {
        behaviour: Behaviour::KeepAliveAfterFirst,
        ..FakeSpec::default()
    };
    let (gw, _backend) = gateway_with(spec, |cfg| {
        cfg.backends[0].stream_idle_timeout = Duration::from_millis(200);
    })
    .await;
    let sent = tokio::time::Instant::now();
    let r = chat_within_10s(
        &gw,
        &chat("a", 10, true),
        "the gateway gives up on a stream of keep-alives",
    )
    .await;
    assert!(sent.elapsed() >= Duration::from_millis(200));
    let mut data = sse_data(&r.body);
    // The empty deltas passed on before the end carry nothing.
    let empty = json!({"id": "fake-1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": ""}}]});
    let last = data.pop();
    let keep_alives = data.split_off(1);
    assert!(keep_alives
        .iter()
        .all(|d| serde_json::from_str::<Value>(d).unwrap() == empty));
    data.extend(last);
    let r = Received {
        body: data
            .iter()
            .map(|d| format!("data: {d}\n\n"))
            .collect::<String>()
            .into_bytes(),
        ..r
    };
    let message = "the backend sent no output for 200ms in the middle of its answer";
    assert_cut_short_after_one_token(&gw, &r, "upstream_timeout", message).await;
}

/// Alice's stream (10 output tokens reserved) was cut short after its first token: it ends
/// with exactly this error event, and that one token is all that is charged.
async fn assert_cut_short_after_one_token(
    gw: &TestGateway,
    r: &Received,
    code: &str,
    message: &str,
) {
    assert_eq!(r.status, 200);
    let data = sse_data(&r.body);
    assert_eq!(data.len(), 2, "one token, then the error: {data:?}");
    let token: Value = serde_json::from_str(&data[0]).unwrap();
    assert_eq!(token["choices"][0]["delta"]["content"], WORD);
    let err: Value = serde_json::from_str(&data[1]).unwrap();
    assert_eq!(
        err,
        json!({"error": {"message": message, "type": "server_error", "param": null, "code": code}})
    );
    gw.wait_metric(
        "tokengate_decode_tokens_refunded_total{tenant=\"alice\"}",
        "9",
    )
    .await;
    assert_eq!(gw.bucket("alice", "decode").await, 999.0);
    assert_eq!(gw.kv_reserved(0).await, 0);
    let outcome = format!(r#"tokengate_requests_total{{tenant="alice",outcome="{code}"}}"#);
    assert_eq!(gw.metric(&outcome).await.as_deref(), Some("1"));
}

/// After one request of alice's (10 output tokens reserved) failed with error `code`
/// before the backend answered: one outcome, and the whole reservation counted as refunded.
async fn assert_failure_counted_once(gw: &TestGateway, code: &str) {
    assert_failure_counted_once_refunding(gw, code, 10).await;
}

/// [`assert_failure_counted_once`] of a request that kept 10 - `refunded` decode tokens.
async fn assert_failure_counted_once_refunding(gw: &TestGateway, code: &str, refunded: u64) {
    let outcome = format!(r#"tokengate_requests_total{{tenant="alice",outcome="{code}"}}"#);
    assert_eq!(gw.metric(&outcome).await.as_deref(), Some("1"));
    let reserved = r#"tokengate_decode_tokens_reserved_total{tenant="alice"}"#;
    assert_eq!(gw.metric(reserved).await.as_deref(), Some("10"));
    let series = r#"tokengate_decode_tokens_refunded_total{tenant="alice"}"#;
    let refunded = refunded.to_string();
    assert_eq!(gw.metric(series).await, Some(refunded));
}

#[tokio::test]
async fn backend_reset_mid_stream_ends_with_an_error_event_and_settles_tokens_seen() {
    let (gw, _backend) = gateway(FakeSpec {
        behaviour: Behaviour::ResetAfter(2),
        usage: false,
        ..FakeSpec::default()
    })
    .await;
    let r = gw.chat("sk-alice", &chat("a", 10, true)).await;
    assert_eq!(r.status, 200);
    let data = sse_data(&r.body);
    assert_eq!(data.len(), 3, "{data:?}");
    let err: Value = serde_json::from_str(&data[2]).unwrap();
    assert_eq!(err["error"]["code"], "upstream_error");
    gw.wait_metric(
        "tokengate_decode_tokens_refunded_total{tenant=\"alice\"}",
        "8",
    )
    .await;
    assert_eq!(gw.bucket("alice", "decode").await, 998.0);
    assert_eq!(gw.kv_reserved(0).await, 0);
}

/// Alice's buckets are all full and no KV is leased: nothing of what she sent was charged.
/// Alice's request was forwarded and ended before its first token: its `prompt` tokens and the
/// request stay charged, nothing else.
async fn assert_only_prefill_charged(gw: &TestGateway, prompt: u64) {
    assert_prefill_and_decode_charged(gw, prompt, 0).await;
}

/// The prompt of `prompt` tokens and `decode` output tokens stay charged (and the request);
/// nothing else, and no KV.
async fn assert_prefill_and_decode_charged(gw: &TestGateway, prompt: u64, decode: u64) {
    assert_eq!(
        gw.bucket("alice", "prefill").await,
        10_000.0 - prompt as f64
    );
    gw.wait_bucket("alice", "decode", 1000.0 - decode as f64)
        .await;
    assert_eq!(gw.bucket("alice", "requests").await, 99.0);
    assert_eq!(gw.kv_reserved(0).await, 0);
}

/// The TPOT the decode floor counts in the tests of requests that end unanswered
/// (`backends[].tpot_slo_ms`), and how long they run before they end: 5.5 TPOTs, so the floor
/// is 5 tokens a sequence however a loaded machine's scheduling moves the end by less than
/// 250 ms.
const FLOOR_TPOT_MS: f64 = 500.0;
const RUNS: Duration = Duration::from_millis(2750);

async fn assert_nothing_charged(gw: &TestGateway) {
    assert_eq!(gw.bucket("alice", "prefill").await, 10_000.0);
    assert_eq!(gw.bucket("alice", "decode").await, 1000.0);
    assert_eq!(gw.bucket("alice", "requests").await, 100.0);
    assert_eq!(gw.kv_reserved(0).await, 0);
}

/// A backend's 4xx is the request refused: passed on with its status in OpenAI's shape, with
/// the backend's message (vLLM's JSON or MindIE's plain text), and nothing charged.
#[tokio::test]
async fn a_backend_4xx_is_passed_on_in_openai_shape_and_charges_nothing() {
    let vllm = r#"{"object":"error","message":"max_tokens must be at most 8, got 10","type":"BadRequestError","param":"max_tokens","code":400}"#;
    let cases = [
        (
            Behaviour::Status(400, vllm),
            json!({"error": {
                "message": "the backend refused the request with status 400 Bad Request: max_tokens must be at most 8, got 10",
                "type": "invalid_request_error", "param": "max_tokens", "code": "upstream_rejected"}}),
        ),
        (
            Behaviour::Status(
                422,
                "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 8\n",
            ),
            json!({"error": {
                "message": "the backend refused the request with status 422 Unprocessable Entity: Input validation error: `inputs` tokens + `max_new_tokens` must be <= 8",
                "type": "invalid_request_error", "param": null, "code": "upstream_rejected"}}),
        ),
    ];
    for (behaviour, expected) in cases {
        let (gw, _backend) = gateway(FakeSpec {
            behaviour,
            ..FakeSpec::default()
        })
        .await;
        let r = gw.chat("sk-alice", &chat("a", 10, false)).await;
        let Behaviour::Status(status, _) = behaviour else {
            unreachable!()
        };
        assert_eq!(r.status, status);
        assert_eq!(r.headers["content-type"], "application/json");
        assert_eq!(r.json(), expected);
        assert_nothing_charged(&gw).await;
        assert_failure_counted_once(&gw, "upstream_rejected").await;
    }
}

/// A backend's 5xx is the backend failing: a 502 that says the status and nothing of the
/// backend's body, streamed or not, and nothing charged.
#[tokio::test]
async fn a_backend_5xx_is_a_502_without_its_internals_and_charges_nothing() {
    for (status, stream) in [(500, false), (503, true)] {
        let (gw, _backend) = gateway(FakeSpec {
            behaviour: Behaviour::Status(status, BACKEND_INTERNALS),
            ..FakeSpec::default()
        })
        .await;
        let r = gw.chat("sk-alice", &chat("a", 10, stream)).await;
        assert_eq!(r.status, 502);
        let reason = if status == 500 {
            "500 Internal Server Error"
        } else {
            "503 Service Unavailable"
        };
        assert_eq!(
            r.json(),
            json!({"error": {"message": format!("the backend failed with status {reason}"),
                "type": "server_error", "param": null, "code": "upstream_error"}})
        );
        assert_nothing_charged(&gw).await;
        assert_failure_counted_once(&gw, "upstream_error").await;
    }
}

/// Log probabilities a whole answer cannot hold within `max_response_bytes` (100,000 bytes
/// here) are refused before anything is charged or forwarded, with the numbers: a chat's
/// `top_logprobs` 20 for 2 sequences of 100 tokens take at least 154,000 bytes (770 a token),
/// a completion's `logprobs` 5 for 2,600 tokens at least 104,000 (40 a token). Before, each
/// ran to its end and came back a 502 at the limit. What fits, and a stream (bounded per
/// event, not whole), go on.
#[tokio::test]
async fn logprobs_a_whole_answer_cannot_hold_are_refused_before_forwarding_with_the_numbers() {
    let (gw, backend) = gateway_with(FakeSpec::default(), |cfg| {
        cfg.backends[0].max_response_bytes = 100_000;
        cfg.tenants[0].decode_tokens_per_second = Some(1000.0);
    })
    .await;
    let mut too_many = chat("a", 100, false);
    too_many["n"] = json!(2);
    too_many["logprobs"] = json!(true);
    too_many["top_logprobs"] = json!(20);
    let r = gw.chat("sk-alice", &too_many).await;
    assert_eq!(
        (r.status, r.json()),
        (
            400,
            json!({"error": {
            "message": "an answer of 2 sequences of up to 100 tokens with `top_logprobs` 20 takes at least 154000 bytes (770 a token), more than the backends pass on whole (backends[].max_response_bytes: 100000); lower max_tokens, n or top_logprobs, or stream it",
            "type": "invalid_request_error", "param": "top_logprobs", "code": "invalid_request"}})
        )
    );
    let completion =
        json!({"model": "qwen3.5-27b", "prompt": "a", "max_tokens": 2600, "logprobs": 5});
    let r = post(&gw.url("/v1/completions"), "sk-alice", &completion).await;
    assert_eq!(
        (r.status, r.json()["error"]["param"].clone()),
        (400, json!("logprobs"))
    );
    assert_eq!(
        r.json()["error"]["message"],
        "an answer of 1 sequence of up to 2600 tokens with `logprobs` 5 takes at least 104000 bytes (40 a token), more than the backends pass on whole (backends[].max_response_bytes: 100000); lower max_tokens, n or logprobs, or stream it"
    );
    assert!(backend.seen.lock().unwrap().is_empty());
    assert_eq!(gw.bucket("alice", "prefill").await, 10_000.0);
    assert_eq!(gw.bucket("alice", "requests").await, 100.0);
    let mut fits = too_many.clone();
    fits["top_logprobs"] = json!(0);
    too_many["stream"] = json!(true);
    for body in [fits, too_many] {
        let r = gw.chat("sk-alice", &body).await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
}

/// A non-streamed answer whose headers (a 200) and first bytes came but whose rest never does
/// is a 504 after `body_read_timeout`, not a wait until the client gives up; one that never
/// ends is a 502 at `max_response_bytes`, the most of it the gateway holds; one whose
/// connection breaks mid-body is a 502. The backend answered each, so each is billable: its
/// prompt and the decode floor of the time it ran stay charged (5 TPOTs for the stalled one,
/// none for the two that end at once). Before, the endless and the broken one were the backend
/// failing and gave everything back: a 2xx whose body then failed was free.
#[tokio::test]
async fn a_non_streamed_answer_that_stalls_breaks_or_never_ends_fails_at_its_bound_and_is_billable()
{
    type Tweak = fn(&mut tokengate::config::Config);
    let stalled: Tweak = |cfg| {
        cfg.backends[0].body_read_timeout = RUNS;
        cfg.backends[0].tpot_slo_ms = Some(FLOOR_TPOT_MS);
    };
    let endless: Tweak = |cfg| {
        cfg.backends[0].max_response_bytes = 1 << 20;
        cfg.backends[0].tpot_slo_ms = Some(FLOOR_TPOT_MS);
    };
    let cases = [
        (Behaviour::StallMidBody, stalled, 504, "upstream_timeout",
            "the backend did not finish its answer within 2s 750ms of starting it (backends[].body_read_timeout)", 5),
        (Behaviour::EndlessBody, endless, 502, "upstream_error",
            "the backend's answer is larger than the gateway's limit of 1048576 bytes (backends[].max_response_bytes)", 0),
        (Behaviour::ResetAfter(2), endless, 502, "upstream_error",
            "the backend closed the connection mid-answer", 0),
    ];
    for (behaviour, tweak, status, code, message, decode) in cases {
        let spec = FakeSpec {
            behaviour,
            ..FakeSpec::default()
        };
        let (gw, _backend) = gateway_with(spec, tweak).await;
        let r = chat_within_10s(&gw, &chat("a", 10, false), message).await;
        assert_eq!(r.status, status);
        assert_eq!(
            r.json(),
            json!({"error": {"message": message, "type": "server_error", "param": null, "code": code}})
        );
        assert_prefill_and_decode_charged(&gw, chat_tokens("a"), decode).await;
        assert_failure_counted_once_refunding(&gw, code, 10 - decode).await;
    }
}

#[tokio::test]
async fn a_stream_event_over_the_bound_ends_the_stream_and_charges_what_streamed() {
    let (gw, _backend) = gateway_with(
        FakeSpec {
            behaviour: Behaviour::EndlessEvent,
            usage: false,
            ..FakeSpec::default()
        },
        |cfg| cfg.backends[0].max_event_bytes = 64 << 10,
    )
    .await;
    let r = chat_within_10s(
        &gw,
        &chat("a", 10, true),
        "the gateway stops reading an endless event",
    )
    .await;
    let message = "the backend sent a stream event larger than the gateway's limit of 65536 bytes (backends[].max_event_bytes)";
    assert_cut_short_after_one_token(&gw, &r, "upstream_error", message).await;
}

/// Sorted `(name, value)` pairs of a header map, for exact comparisons.
fn header_pairs(h: &http::HeaderMap) -> Vec<(String, String)> {
    let mut pairs: Vec<(String, String)> = h
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_string()))
        .collect();
    pairs.sort();
    pairs
}

/// Nothing of the client's headers reaches the backend (its request id is the gateway's); of
/// the backend's answer, the hop-by-hop headers (and those `connection` names) stay behind, and
/// the client gets its request id, not the backend's.
#[tokio::test]
async fn hop_by_hop_headers_stay_behind_and_the_request_id_crosses_both_ways() {
    let (gw, backend) = gateway(FakeSpec {
        answer_headers: &[
            ("connection", "x-backend-hop"),
            ("x-backend-hop", "1"),
            ("keep-alive", "timeout=5"),
            ("trailer", "x-checksum"),
            ("upgrade", "h2c"),
            ("te", "trailers"),
            ("proxy-authenticate", "Basic"),
            ("x-request-id", "backend-7"),
            ("x-backend-kept", "yes"),
        ],
        ..FakeSpec::default()
    })
    .await;
    let body = chat("a", 2, false).to_string().into_bytes();
    let r = send(
        &gw.url("/v1/chat/completions"),
        "POST",
        Some(body.clone()),
        &[
            ("content-type", "application/json"),
            ("authorization", "Bearer sk-alice"),
            ("x-request-id", "client-42"),
            ("connection", "x-client-hop"),
            ("x-client-hop", "1"),
            ("keep-alive", "timeout=5"),
            ("te", "trailers"),
            ("proxy-authorization", "Basic abc"),
            ("x-client-other", "1"),
        ],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let addr = backend.addr.to_string();
    let len = backend.seen.lock().unwrap()[0]
        .to_string()
        .len()
        .to_string();
    let pairs = |list: &[(&str, &str)]| -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    // The backend's id is the gateway's, never the client's.
    let seen = backend.seen_headers.lock().unwrap()[0].clone();
    let gateway_id = seen["x-request-id"].to_str().unwrap().to_owned();
    assert!(
        gateway_id.starts_with("tg-") && gateway_id.len() == 35,
        "{gateway_id}"
    );
    assert_eq!(
        header_pairs(&seen),
        pairs(&[
            ("content-length", &len),
            ("content-type", "application/json"),
            ("host", &addr),
            ("x-request-id", &gateway_id),
        ])
    );
    let mut names: Vec<&str> = r.headers.keys().map(|k| k.as_str()).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "content-length",
            "content-type",
            "date",
            "x-backend-kept",
            "x-ratelimit-limit-requests",
            "x-ratelimit-limit-tokens",
            "x-ratelimit-remaining-requests",
            "x-ratelimit-remaining-tokens",
            "x-ratelimit-reset-requests",
            "x-ratelimit-reset-tokens",
            "x-request-id",
        ]
    );
    assert_eq!(r.headers["x-request-id"], "client-42");
    assert_eq!(r.headers["content-length"], r.body.len().to_string());

    // Without a client id, the backend gets the one the gateway made, and so does the client.
    let r = gw.chat("sk-alice", &chat("a", 2, true)).await;
    assert_eq!(r.status, 200);
    let id = r.headers["x-request-id"].to_str().unwrap();
    assert!(id.starts_with("tg-"), "{id}");
    assert_eq!(backend.seen_headers.lock().unwrap()[1]["x-request-id"], id);
    for hop in [
        "connection",
        "keep-alive",
        "trailer",
        "upgrade",
        "te",
        "proxy-authenticate",
        "x-backend-hop",
    ] {
        assert!(r.headers.get(hop).is_none(), "{hop} crossed");
    }
}

#[tokio::test]
async fn a_wrong_method_is_405_with_allow() {
    let (gw, _backend) = gateway(FakeSpec::default()).await;
    let admin = format!("http://{}", gw.running.admin_addr);
    for (url, method, allow) in [
        (gw.url("/v1/chat/completions"), "GET", "POST"),
        (gw.url("/v1/completions"), "PUT", "POST"),
        (gw.url("/tokenize"), "GET", "POST"),
        (gw.url("/v1/models"), "POST", "GET"),
        (format!("{admin}/readyz"), "POST", "GET"),
    ] {
        let r = send(&url, method, None, &[("authorization", "Bearer sk-alice")]).await;
        assert_eq!(
            (r.status, r.code().as_str()),
            (405, "method_not_allowed"),
            "{method} {url}"
        );
        assert_eq!(r.headers["allow"], allow, "{method} {url}");
        let path = url.split_once("//").unwrap().1.split_once('/').unwrap().1;
        assert_eq!(
            r.json()["error"]["message"],
            format!("{method} is not allowed on /{path}; it answers {allow}")
        );
    }
    let r = send(&gw.url("/v1/nothing"), "GET", None, &[]).await;
    assert_eq!((r.status, r.headers.get("allow")), (404, None));
}

/// `/readyz` asks every backend at once, each bounded by its `health_timeout`: a dead backend
/// and one whose health path never answers do not hold it up for their request timeouts.
#[tokio::test]
async fn readyz_probes_every_backend_at_once_within_its_own_timeout() {
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let slow = FakeBackend::start(FakeSpec {
        stall_health: true,
        ..FakeSpec::default()
    })
    .await;
    let healthy = FakeBackend::start(FakeSpec::default()).await;
    let readyz = |backends: &[std::net::SocketAddr]| {
        let mut cfg = config(backends);
        for b in &mut cfg.backends {
            b.first_byte_timeout = Duration::from_secs(60);
            b.health_timeout = Duration::from_millis(100);
        }
        async move {
            let gw = TestGateway::start(cfg).await;
            let url = format!("http://{}/readyz", gw.running.admin_addr);
            tokio::time::timeout(Duration::from_secs(10), send(&url, "GET", None, &[]))
                .await
                .expect("/readyz answers within its probes' timeout")
        }
    };
    let state = |addr: std::net::SocketAddr, state: &str, detail: &str| json!({"url": format!("http://{addr}"), "state": state, "detail": detail});
    let dead_state = state(
        dead,
        "unreachable",
        "could not connect, or the connection broke",
    );
    let slow_state = state(
        slow.addr,
        "timeout",
        "/health did not answer within 100ms (backends[].health_timeout)",
    );
    let r = readyz(&[dead, slow.addr, healthy.addr]).await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.json(),
        json!({"status": "ready", "backends": [dead_state, slow_state,
            state(healthy.addr, "ready", "/health answered")]})
    );
    let r = readyz(&[dead, slow.addr]).await;
    assert_eq!(r.status, 503);
    assert_eq!(
        r.json(),
        json!({"status": "not ready", "backends": [dead_state, slow_state]})
    );
}

/// A backend that learns its cache from its engine is not ready until it has: its health path
/// answers, but it would refuse every request meanwhile. This one has no engine to read.
#[tokio::test]
async fn readyz_is_not_ready_while_a_backend_learns_its_engines_cache() {
    let backend = FakeBackend::start(FakeSpec::default()).await;
    let text = config_text(&[backend.addr]).replace(
        "kv_capacity_bytes = 8000000000\nmax_batch = 32\n",
        "kv = \"engine\"\n",
    );
    let gw = TestGateway::start(
        tokengate::config::Config::parse(&text)
            .unwrap()
            .into_inner(),
    )
    .await;
    let r = gw.admin_answer("/readyz").await;
    assert_eq!(r.status, 503);
    assert_eq!(
        r.json(),
        json!({"status": "not ready", "backends": [{"url": format!("http://{}", backend.addr),
            "state": "learning",
            "detail": "/health answered; its KV cache (backends[].kv = \"engine\") is not read \
                from the engine yet, and it admits nothing until it is"}]})
    );
}

/// An HTTP/1.1 connection of its own to `addr`, kept open for several requests.
async fn connection(
    addr: std::net::SocketAddr,
) -> (
    hyper::client::conn::http1::SendRequest<http_body_util::Full<bytes::Bytes>>,
    tokio::task::JoinHandle<()>,
) {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    let task = tokio::spawn(async move {
        let _ = conn.await;
    });
    (sender, task)
}

/// `GET /v1/models` on an open connection; its status.
async fn models_on(
    sender: &mut hyper::client::conn::http1::SendRequest<http_body_util::Full<bytes::Bytes>>,
) -> u16 {
    use http_body_util::BodyExt;
    sender.ready().await.unwrap();
    let req = http::Request::get("/v1/models")
        .header("host", "gateway")
        .header("authorization", "Bearer sk-alice")
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    resp.into_body().collect().await.unwrap();
    status
}

/// At `server.max_connections` the gateway stops accepting: a further connection waits in the
/// backlog, unserved, while the open ones are served, and is served once one of them closes.
#[tokio::test]
async fn at_the_connection_cap_a_new_connection_waits_until_one_closes() {
    let (gw, _backend) = gateway_with(FakeSpec::default(), |cfg| {
        cfg.server.max_connections = 2;
    })
    .await;
    let addr = gw.running.addr;
    let open = r#"tokengate_open_connections{listener="main"}"#;
    let (mut a, a_task) = connection(addr).await;
    let (mut b, _b_task) = connection(addr).await;
    assert_eq!(models_on(&mut a).await, 200);
    assert_eq!(models_on(&mut b).await, 200);
    assert_eq!(gw.metric(open).await.as_deref(), Some("2"));
    let (mut c, _c_task) = connection(addr).await;
    // The task hands the connection back, to keep it open.
    let waiting = tokio::spawn(async move { (models_on(&mut c).await, c) });
    // The open connections are served after the third sent its request; it is not.
    assert_eq!(models_on(&mut b).await, 200);
    assert!(!waiting.is_finished(), "a third connection was served");
    assert_eq!(gw.metric(open).await.as_deref(), Some("2"));
    drop(a);
    a_task.await.unwrap();
    let (status, _c) = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiting connection is served once one closed")
        .unwrap();
    assert_eq!(status, 200);
    assert_eq!(gw.metric(open).await.as_deref(), Some("2"));
}

/// With three workers, six connections open at once are all served (which worker takes which
/// is `server`'s unit tests'); once they close and the gateway shuts down, nothing is left
/// listening.
#[tokio::test]
async fn workers_serve_every_connection_and_stop_on_shutdown() {
    let (gw, _backend) = gateway_with(FakeSpec::default(), |cfg| {
        cfg.server.workers = Some(3);
    })
    .await;
    let addr = gw.running.addr;
    let open = r#"tokengate_open_connections{listener="main"}"#;
    let mut connections = Vec::new();
    for _ in 0..6 {
        connections.push(connection(addr).await);
    }
    for (sender, _) in &mut connections {
        assert_eq!(models_on(sender).await, 200);
    }
    assert_eq!(gw.metric(open).await.as_deref(), Some("6"));
    let r = gw.chat("sk-alice", &chat("hello world", 5, false)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    for (sender, task) in connections {
        drop(sender);
        task.await.unwrap();
    }
    gw.wait_metric(open, "0").await;
    gw.running.shutdown().await;
    let refused = tokio::net::TcpStream::connect(addr).await.unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
}

/// Bodies over 64 KiB are parsed and validated on the worker pool instead of the executor; this
/// checks that they get the same answers and errors as small ones.
#[tokio::test]
async fn large_bodies_get_the_answers_and_errors_small_ones_get() {
    let (gw, _backend) = gateway_with(FakeSpec::default(), |cfg| {
        cfg.server.max_body_bytes = 1 << 20;
        cfg.model.max_model_len = 1 << 20;
        cfg.tenants[0].prefill_tokens_per_second = Some(100_000.0);
    })
    .await;
    let content = ["word"; 40_000].join(" ");
    let r = gw.chat("sk-alice", &chat(&content, 3, false)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let charged = gw
        .metric(r#"tokengate_prefill_tokens_total{tenant="alice"}"#)
        .await;
    assert_eq!(charged, Some(chat_tokens(&content).to_string()));

    let url = gw.url("/v1/chat/completions");
    let headers = [
        ("content-type", "application/json"),
        ("authorization", "Bearer sk-alice"),
    ];
    for junk in [10, 200_000] {
        let body = format!(
            "{{\"model\": \"qwen3.5-27b\", \"x\": \"{}\" oops}}",
            "a".repeat(junk)
        );
        let r = send(&url, "POST", Some(body.into_bytes()), &headers).await;
        assert_eq!((r.status, r.code().as_str()), (400, "invalid_request"));
        assert!(
            r.json()["error"]["message"]
                .as_str()
                .unwrap()
                .starts_with("the request body is not valid JSON"),
            "{}",
            r.text()
        );
        // Valid JSON with an invalid field: refused by validation, on the pool for the large one.
        let mut body = chat(&"a".repeat(junk), 3, false);
        body["max_tokens"] = json!(0);
        let r = gw.chat("sk-alice", &body).await;
        assert_eq!(
            (r.status, r.json()["error"]["param"].as_str()),
            (400, Some("max_tokens"))
        );
    }
    // Nothing of the refused requests was charged: only the first request's prompt.
    let charged = gw
        .metric(r#"tokengate_prefill_tokens_total{tenant="alice"}"#)
        .await;
    assert_eq!(charged, Some(chat_tokens(&content).to_string()));
}

/// The backend is sent the client's very bytes when the rewrite changes nothing, and otherwise
/// the client's bytes with only the members the rewrite sets written again; a repeated key is
/// sent once, with the value that was counted. Hostile bodies are still refused with a 400
/// before anything is charged or forwarded.
#[tokio::test]
async fn the_backend_gets_the_clients_bytes_changed_only_where_the_rewrite_must() {
    let (gw, backend) = gateway(FakeSpec::default()).await;
    let url = gw.url("/v1/chat/completions");
    let headers = [
        ("content-type", "application/json"),
        ("authorization", "Bearer sk-alice"),
    ];
    let sent = |body: &str| send(&url, "POST", Some(body.as_bytes().to_vec()), &headers);
    let forwarded = |i: usize| String::from_utf8(backend.seen_bytes.lock().unwrap()[i].to_vec());

    let unchanged = r#"{ "model": "qwen3.5-27b", "messages": [{"role": "user", "content": "caf\u00e9 \"hi\""}], "max_tokens": 5, "temperature": 1.0e0 }"#;
    assert_eq!(sent(unchanged).await.status, 200);
    assert_eq!(forwarded(0).unwrap(), unchanged);

    // No max_tokens: the default reservation (100) is added at the end.
    let r = sent(
        r#"{"messages": [ {"role": "user", "content": "caf\u00e9"} ], "model": "qwen3.5-27b"}"#,
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(
        forwarded(1).unwrap(),
        r#"{"messages":[ {"role": "user", "content": "caf\u00e9"} ],"model":"qwen3.5-27b","max_tokens":100}"#
    );

    // A repeated key goes once, where it first came, with the value that was counted (the
    // last); the prompt charged is that one.
    let r = sent(r#"{"messages": [{"role": "user", "content": "a much longer prompt than the other"}], "model": "qwen3.5-27b", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}"#).await;
    assert_eq!(r.status, 200);
    assert_eq!(
        forwarded(2).unwrap(),
        r#"{"messages":[{"role": "user", "content": "hi"}],"model":"qwen3.5-27b","max_tokens":5}"#
    );
    let prefill = chat_tokens("caf\u{e9} \"hi\"") + chat_tokens("caf\u{e9}") + chat_tokens("hi");
    assert_eq!(
        gw.bucket("alice", "prefill").await,
        10_000.0 - prefill as f64
    );

    // Hostile bodies: refused, nothing charged, nothing forwarded.
    let deep = format!(
        r#"{{"model": "qwen3.5-27b", "messages": [{{"role": "user", "content": "hi"}}], "x": {}1{}}}"#,
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    let not_utf8 = b"{\"model\": \"qwen3.5-27b\", \"messages\": [{\"role\": \"user\", \"content\": \"\xff\"}]}";
    let lone = r#"{"model": "qwen3.5-27b", "messages": [{"role": "user", "content": "\ud800"}]}"#;
    for body in [
        deep.into_bytes(),
        not_utf8.to_vec(),
        lone.as_bytes().to_vec(),
        br#"[{"model": "qwen3.5-27b"}]"#.to_vec(),
        br#"{"model": "qwen3.5-27b", "messages": [{"role": "user", "content": "hi"}]} {}"#.to_vec(),
    ] {
        let r = send(&url, "POST", Some(body), &headers).await;
        assert_eq!(
            (r.status, r.code().as_str()),
            (400, "invalid_request"),
            "{}",
            r.text()
        );
    }
    assert_eq!(backend.seen_bytes.lock().unwrap().len(), 3);
    assert_eq!(
        gw.bucket("alice", "prefill").await,
        10_000.0 - prefill as f64
    );
    assert_eq!(gw.bucket("alice", "requests").await, 97.0);
}

/// How many prompts were tokenized: the count of the `tokengate_tokenize_seconds` histogram.
async fn prompts_tokenized(gw: &TestGateway) -> String {
    gw.metric("tokengate_tokenize_seconds_count")
        .await
        .expect("the tokenize histogram is exported")
}

/// A body of about 3.9 MB, as in the flood that starved other tenants: a chat of one message of
/// 650,000 times [`WORD`] (one token each) and 10 tokens of output, or such text not even JSON.
fn flood_body(json: bool) -> Vec<u8> {
    let content = WORD.repeat(650_000);
    if json {
        chat(&content, 10, false).to_string().into_bytes()
    } else {
        format!("{{\"model\": \"qwen3.5-27b\", \"x\": \"{content}\" oops}}").into_bytes()
    }
}

#[tokio::test]
async fn an_exhausted_tenant_is_refused_before_its_body_is_read_or_tokenized() {
    let (gw, backend) = gateway_with(FakeSpec::default(), |cfg| {
        cfg.server.max_body_bytes = 4 << 20;
        // One request per 10 s: a single request empties the bucket.
        cfg.tenants[0].requests_per_second = Some(0.1);
    })
    .await;
    assert_eq!(
        gw.chat("sk-alice", &chat("hi", 10, false)).await.status,
        200
    );
    assert_eq!(prompts_tokenized(&gw).await, "1");
    let url = gw.url("/v1/chat/completions");
    let headers = [
        ("content-type", "application/json"),
        ("authorization", "Bearer sk-alice"),
    ];
    for json in [true, false] {
        let r = send(&url, "POST", Some(flood_body(json)), &headers).await;
        assert_eq!((r.status, r.code().as_str()), (429, "rate_limit_exceeded"));
        assert_eq!(r.json()["error"]["type"], "requests");
        assert_eq!(
            r.json()["error"]["message"],
            "rate limit reached for requests: request needs 1 requests, 0 available; retry \
             after at least 10.000 s"
        );
        assert_eq!(r.headers["retry-after"], "10");
        assert_eq!(r.headers["x-ratelimit-remaining-requests"], "0");
        assert_eq!(r.headers["x-ratelimit-reset-requests"], "10s");
        assert_eq!(r.headers["x-ratelimit-remaining-tokens"], "990");
    }
    // Neither body was tokenized, nor even parsed (the second one is not JSON).
    assert_eq!(prompts_tokenized(&gw).await, "1");
    assert_eq!(gw.bucket("alice", "requests").await, 0.0);
    assert_eq!(backend.seen.lock().unwrap().len(), 1);

    // Once the bucket holds a request again, the same bodies are read and judged.
    gw.clock.advance(Duration::from_secs(10));
    let r = send(&url, "POST", Some(flood_body(false)), &headers).await;
    assert_eq!((r.status, r.code().as_str()), (400, "invalid_request"));
    assert_eq!(prompts_tokenized(&gw).await, "1");
    let r = send(&url, "POST", Some(flood_body(true)), &headers).await;
    assert_eq!(
        (r.status, r.code().as_str()),
        (400, "context_length_exceeded")
    );
    assert_eq!(prompts_tokenized(&gw).await, "2");
    assert_eq!(gw.bucket("alice", "requests").await, 1.0);
}

/// A flood of bodies refused only after reading: a tenant with budget sending bodies past the
/// context has every one read, parsed and counted to the ceiling before its 400. Past its
/// budget for refused bodies (four bodies of `server.max_body_bytes`), its bodies are read at
/// `server.refused_body_bytes_per_second`; another tenant's at once meanwhile, and an accepted
/// body, however long, is not counted as refused.
#[tokio::test]
async fn bodies_refused_after_reading_are_read_at_their_tenants_pace() {
    const RATE: u64 = 64 << 10;
    const MAX_BODY: u64 = 205_000;
    let (gw, backend) = gateway_with(FakeSpec::default(), |cfg| {
        cfg.server.max_body_bytes = MAX_BODY;
        cfg.server.refused_body_bytes_per_second = RATE;
    })
    .await;
    // 30,000 tokens of text in 180 KB, past the 4,096-token context.
    let body = chat(&WORD.repeat(30_000), 10, false)
        .to_string()
        .into_bytes();
    let len = body.len() as u64;
    let url = gw.url("/v1/chat/completions");
    let post = |key: &'static str, body: Vec<u8>| {
        let url = url.clone();
        let auth = format!("Bearer {key}");
        async move {
            let headers = [
                ("content-type", "application/json"),
                ("authorization", auth.as_str()),
            ];
            send(&url, "POST", Some(body), &headers).await
        }
    };
    let refused =
        |tenant: &str| format!("tokengate_refused_body_bytes_total{{tenant=\"{tenant}\"}}");
    // Seven bodies fill alice's budget but for 30 KB: each is charged what it has past its
    // first 64 KiB, and an eighth then owes more than the budget holds.
    let charged = len - (64 << 10);
    let started = tokio::time::Instant::now();
    for _ in 0..7 {
        let r = post("sk-alice", body.clone()).await;
        assert_eq!(
            (r.status, r.code().as_str()),
            (400, "context_length_exceeded")
        );
    }
    assert!(7 * charged <= 4 * MAX_BODY && 8 * charged > 4 * MAX_BODY);
    let eighth = tokio::spawn(post("sk-alice", body.clone()));
    // Bob's budget is his own: the same body is read, counted and refused at once.
    let r = post("sk-bob", body.clone()).await;
    assert_eq!(
        (r.status, r.code().as_str()),
        (400, "context_length_exceeded")
    );
    assert!(
        !eighth.is_finished(),
        "alice's eighth body was read at full speed"
    );
    let r = eighth.await.unwrap();
    assert_eq!(
        (r.status, r.code().as_str()),
        (400, "context_length_exceeded")
    );
    // It was read no sooner than its budget allowed: everything charged, less the budget,
    // refilled at the rate.
    let owed = Duration::from_secs_f64((8 * charged - 4 * MAX_BODY) as f64 / RATE as f64);
    assert!(
        started.elapsed() >= owed,
        "{:?} < {owed:?}",
        started.elapsed()
    );
    assert_eq!(
        gw.metric(&refused("alice")).await,
        Some((8 * len).to_string())
    );
    assert_eq!(gw.metric(&refused("bob")).await, Some(len.to_string()));
    // A long body that is accepted (a short chat padded to 150 KB) is not refused: its charge
    // goes back.
    let mut padded = chat("hi", 10, false).to_string().into_bytes();
    padded.splice(1..1, std::iter::repeat_n(b' ', 150_000));
    assert_eq!(post("sk-bob", padded).await.status, 200);
    assert_eq!(gw.metric(&refused("bob")).await, Some(len.to_string()));
    assert_eq!(backend.seen.lock().unwrap().len(), 1);
}

/// Reads what the gateway sends on `stream` until it closes the connection (an end of file or a
/// reset, after the answer), within 10 s: `None` if it is still open then.
async fn read_until_closed(stream: &mut tokio::net::TcpStream) -> Option<String> {
    use tokio::io::AsyncReadExt;
    let mut answer = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) => return,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return,
                Err(e) => panic!("reading the answer: {e}"),
            }
        }
    })
    .await;
    closed
        .ok()
        .map(|()| String::from_utf8_lossy(&answer).into_owned())
}

/// A tenant refused before its body is read, sending a body of unknown length: the gateway answers, says
/// `connection: close` and closes without waiting for the body (before, it read and dropped
/// the whole of it, at most `server.body_read_timeout`: 60 s here). A short refused body is
/// still read, and its connection serves the next request.
#[tokio::test]
async fn a_long_body_refused_unread_is_answered_and_its_connection_closed() {
    use tokio::io::AsyncWriteExt;
    let (gw, backend) = gateway_with(FakeSpec::default(), |cfg| {
        cfg.server.max_body_bytes = 4 << 20;
        cfg.server.body_read_timeout = Duration::from_secs(60);
        cfg.tenants[0].requests_per_second = Some(0.1);
    })
    .await;
    assert_eq!(
        gw.chat("sk-alice", &chat("hi", 10, false)).await.status,
        200
    );
    // A body of unknown length (chunked), of which only a first chunk of 16 KiB is sent: what
    // the gateway cannot bound is not read. (A declared length up to server.max_body_bytes is
    // drained, the short case below.)
    let mut stream = tokio::net::TcpStream::connect(gw.running.addr)
        .await
        .unwrap();
    let head = "POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\ncontent-type: \
         application/json\r\nauthorization: Bearer sk-alice\r\ntransfer-encoding: \
         chunked\r\n\r\n4000\r\n";
    // The head and the chunk in one write: the socket takes it at once, so the write is over
    // before the gateway answers.
    let mut sent = head.as_bytes().to_vec();
    sent.extend_from_slice(&[b' '; 16 << 10]);
    sent.extend_from_slice(b"\r\n");
    stream.write_all(&sent).await.unwrap();
    let answer = read_until_closed(&mut stream)
        .await
        .expect("the connection closes after the answer, the body unread");
    let (head, body) = answer.split_once("\r\n\r\n").expect("a whole answer");
    assert!(head.starts_with("HTTP/1.1 429 "), "{head}");
    assert!(head.lines().any(|l| l == "connection: close"), "{head}");
    let body: Value = serde_json::from_str(body).unwrap();
    assert_eq!(body["error"]["code"], "rate_limit_exceeded");
    assert_eq!(
        body["error"]["message"],
        "rate limit reached for requests: request needs 1 requests, 0 available; retry after \
         at least 10.000 s"
    );

    // A short one (declared within the body limit) is read and dropped: the connection stays open,
    // and its next request is answered on it.
    let (mut sender, _conn) = connection(gw.running.addr).await;
    for _ in 0..2 {
        use http_body_util::BodyExt;
        sender.ready().await.unwrap();
        let req = http::Request::post("/v1/chat/completions")
            .header("host", "gateway")
            .header("content-type", "application/json")
            .header("authorization", "Bearer sk-alice")
            .body(http_body_util::Full::new(bytes::Bytes::from(
                chat(&WORD.repeat(10_000), 10, false).to_string(),
            )))
            .unwrap();
        let resp = sender.send_request(req).await.unwrap();
        assert_eq!(resp.status(), 429);
        assert_eq!(resp.headers().get("connection"), None);
        resp.into_body().collect().await.unwrap();
    }
    assert_eq!(gw.bucket("alice", "requests").await, 0.0);
    assert_eq!(backend.seen.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn a_prompt_over_the_context_is_counted_only_up_to_the_ceiling() {
    let (gw, _backend) = gateway_with(FakeSpec::default(), |cfg| {
        cfg.server.max_body_bytes = 4 << 20;
    })
    .await;
    // 650,000 tokens of prompt; the context leaves room for 4,086 beside 10 of output.
    let r = send(
        &gw.url("/v1/chat/completions"),
        "POST",
        Some(flood_body(true)),
        &[
            ("content-type", "application/json"),
            ("authorization", "Bearer sk-alice"),
        ],
    )
    .await;
    assert_eq!(
        (r.status, r.code().as_str()),
        (400, "context_length_exceeded")
    );
    // Counting stopped at the first token past the ceiling: 4,087 of the 650,000.
    assert_eq!(
        r.json()["error"]["message"],
        "this model's maximum context length is 4096 tokens; the prompt is at least 4087 \
         tokens and 10 output tokens were requested (at least 4097 in all)"
    );
    assert_eq!(r.json()["error"]["param"], "max_tokens");
    assert_eq!(gw.bucket("alice", "prefill").await, 10000.0);
    assert_eq!(gw.bucket("alice", "requests").await, 100.0);

    // Within the context but past the prefill burst (10,000): counting stops at 10,001.
    let (gw, _backend) = gateway_with(FakeSpec::default(), |cfg| {
        cfg.server.max_body_bytes = 4 << 20;
        cfg.model.max_model_len = 1 << 20;
    })
    .await;
    let mut body = chat(&WORD.repeat(20_000), 10, false);
    body.as_object_mut().unwrap().remove("max_tokens");
    let r = gw.chat("sk-alice", &body).await;
    assert_eq!((r.status, r.code().as_str()), (400, "exceeds_tenant_burst"));
    assert_eq!(
        r.json()["error"]["message"],
        "request needs at least 10001 prefill tokens; the tenant's prefill burst is 10000"
    );
    assert_eq!(gw.bucket("alice", "prefill").await, 10000.0);
    // Exactly the burst is admitted, counted exactly.
    let fits = WORD.repeat(20_000 - (chat_tokens(&WORD.repeat(20_000)) as usize - 10_000));
    assert_eq!(chat_tokens(&fits), 10_000);
    let r = gw.chat("sk-alice", &chat(&fits, 10, false)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(gw.bucket("alice", "prefill").await, 0.0);
}

#[tokio::test]
async fn bad_input_is_refused_and_changes_nothing() {
    let (gw, backend) = gateway(FakeSpec::default()).await;
    let url = gw.url("/v1/chat/completions");
    let ok_msgs = json!([{"role": "user", "content": "hi"}]);
    let deep = "[".repeat(300) + &"]".repeat(300);
    let cases: Vec<(&str, Vec<u8>, &str, u16, &str)> = vec![
        ("not JSON", b"{not json".to_vec(), "application/json", 400, "invalid_request"),
        ("array body", b"[1,2]".to_vec(), "application/json", 400, "invalid_request"),
        ("no messages", json!({"model": "qwen3.5-27b"}).to_string().into_bytes(), "application/json", 400, "invalid_request"),
        ("empty messages", json!({"model": "qwen3.5-27b", "messages": []}).to_string().into_bytes(), "application/json", 400, "invalid_request"),
        ("messages wrong type", json!({"model": "qwen3.5-27b", "messages": {"role": "user"}}).to_string().into_bytes(), "application/json", 400, "invalid_request"),
        ("content wrong type", json!({"model": "qwen3.5-27b", "messages": [{"role": "user", "content": 5}]}).to_string().into_bytes(), "application/json", 400, "invalid_request"),
        ("max_tokens 0", json!({"model": "qwen3.5-27b", "messages": ok_msgs, "max_tokens": 0}).to_string().into_bytes(), "application/json", 400, "invalid_request"),
        ("max_tokens negative", json!({"model": "qwen3.5-27b", "messages": ok_msgs, "max_tokens": -5}).to_string().into_bytes(), "application/json", 400, "invalid_request"),
        ("max_tokens fractional", json!({"model": "qwen3.5-27b", "messages": ok_msgs, "max_tokens": 2.5}).to_string().into_bytes(), "application/json", 400, "invalid_request"),
        ("max_tokens absurd", json!({"model": "qwen3.5-27b", "messages": ok_msgs, "max_tokens": 1_000_000_000_000u64}).to_string().into_bytes(), "application/json", 400, "invalid_request"),
        ("unknown model", json!({"model": "gpt-9", "messages": ok_msgs}).to_string().into_bytes(), "application/json", 404, "model_not_found"),
        // vLLM's pydantic reads "true" as true: a wrong type is one it does not.
        ("stream wrong type", json!({"model": "qwen3.5-27b", "messages": ok_msgs, "stream": "maybe"}).to_string().into_bytes(), "application/json", 400, "invalid_request"),
        ("wrong content type", json!({"model": "qwen3.5-27b", "messages": ok_msgs}).to_string().into_bytes(), "text/plain", 415, "unsupported_media_type"),
        ("over the body limit", json!({"model": "qwen3.5-27b", "messages": [{"role": "user", "content": "x".repeat(70_000)}]}).to_string().into_bytes(), "application/json", 413, "payload_too_large"),
        ("not UTF-8", b"{\"model\": \"qwen3.5-27b\", \"messages\": [{\"role\": \"user\", \"content\": \"\xff\xfe\"}]}".to_vec(), "application/json", 400, "invalid_request"),
        ("deeply nested", deep.into_bytes(), "application/json", 400, "invalid_request"),
    ];
    for (what, body, ct, status, code) in cases {
        let r = send(
            &url,
            "POST",
            Some(body),
            &[("content-type", ct), ("authorization", "Bearer sk-alice")],
        )
        .await;
        assert_eq!(
            (r.status, r.code().as_str()),
            (status, code),
            "{what}: {}",
            r.text()
        );
        let err = &r.json()["error"];
        assert!(
            err["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{what}"
        );
        assert!(
            err.get("type").is_some() && err.get("param").is_some(),
            "{what}"
        );
    }
    let completions = [
        (json!({"model": "qwen3.5-27b"}), "missing prompt"),
        (
            json!({"model": "qwen3.5-27b", "prompt": ""}),
            "empty prompt",
        ),
        (
            json!({"model": "qwen3.5-27b", "prompt": 42}),
            "prompt wrong type",
        ),
    ];
    for (body, what) in completions {
        let r = post(&gw.url("/v1/completions"), "sk-alice", &body).await;
        assert_eq!(
            (r.status, r.code().as_str()),
            (400, "invalid_request"),
            "{what}"
        );
    }
    for key in ["", "sk-nobody"] {
        let r = post(&url, key, &chat("a", 1, false)).await;
        assert_eq!((r.status, r.code().as_str()), (401, "invalid_api_key"));
    }
    assert_eq!(gw.bucket("alice", "prefill").await, 10_000.0);
    assert_eq!(gw.bucket("alice", "decode").await, 1000.0);
    assert_eq!(gw.bucket("alice", "requests").await, 100.0);
    assert_eq!(gw.kv_reserved(0).await, 0);
    assert!(backend.seen.lock().unwrap().is_empty());
}

/// A follow-up turn carries the previous answer: the gateway counted it ahead when it came
/// back (streamed or not), so the follow-up tokenizes only its new question, and is still
/// charged exactly the count of its whole rendered prompt.
#[tokio::test]
async fn answers_are_counted_ahead_for_the_next_turn() {
    let (gw, _backend) = gateway(FakeSpec::default()).await;
    let cache = |what: &'static str| {
        let gw = &gw;
        async move {
            gw.metric(&format!("tokengate_tokenize_cache_{what}_total"))
                .await
                .unwrap()
        }
    };
    let prefill = || gw.metric("tokengate_prefill_tokens_total{tenant=\"alice\"}");
    let mut messages = vec![json!({"role": "user", "content": "question one"})];
    for (turn, stream) in [(1, true), (2, false), (3, false)] {
        let mut body = chat("", 4, stream);
        body["messages"] = json!(messages);
        let charged_before: u64 = prefill().await.map_or(0, |v| v.parse().unwrap());
        let r = gw.chat("sk-alice", &body).await;
        assert_eq!(r.status, 200);
        let rendered = tokengate::tokenize::chat::ChatTemplate::builtin_qwen35()
            .render(
                &serde_json::from_value(
                    json!({"messages": messages, "add_generation_prompt": true}),
                )
                .unwrap(),
            )
            .unwrap();
        let charged: u64 = prefill().await.unwrap().parse().unwrap();
        assert_eq!(
            charged - charged_before,
            tokenizer().count(&rendered) as u64
        );
        let answer = if stream {
            sse_data(&r.body)
                .iter()
                .filter_map(|d| serde_json::from_str::<Value>(d).ok())
                .filter_map(|c| {
                    c["choices"][0]["delta"]["content"]
                        .as_str()
                        .map(str::to_owned)
                })
                .collect::<String>()
        } else {
            r.json()["choices"][0]["message"]["content"]
                .as_str()
                .unwrap()
                .to_owned()
        };
        assert_eq!(answer, WORD.repeat(4));
        gw.wait_metric("tokengate_tokenize_cache_replies_total", &turn.to_string())
            .await;
        // Turn 1 misses its question and the generation prompt; every later turn misses only
        // its new question: the earlier answers were counted ahead.
        assert_eq!(cache("misses").await, (turn + 1).to_string(), "turn {turn}");
        assert_eq!(
            cache("hits").await,
            [0, 3, 8][turn - 1].to_string(),
            "turn {turn}"
        );
        messages.push(json!({"role": "assistant", "content": answer}));
        messages.push(json!({"role": "user", "content": format!("question {}", turn + 1)}));
    }
}

#[tokio::test]
async fn tokenize_answers_locally_in_vllm_shape() {
    let (gw, backend) = gateway(FakeSpec::default()).await;
    let r = post(
        &gw.url("/tokenize"),
        "sk-alice",
        &json!({"prompt": "hello world"}),
    )
    .await;
    assert_eq!(r.status, 200);
    let v = r.json();
    assert_eq!(v["count"], 2);
    assert_eq!(v["max_model_len"], 4096);
    assert_eq!(v["tokens"], json!(tokenizer().encode("hello world")));
    let r = post(
        &gw.url("/tokenize"),
        "sk-alice",
        &json!({"messages": [{"role": "user", "content": "hello world"}]}),
    )
    .await;
    assert_eq!(r.json()["count"], chat_tokens("hello world"));
    assert!(backend.seen.lock().unwrap().is_empty());
    let r = send(
        &gw.url("/v1/models"),
        "GET",
        None,
        &[("authorization", "Bearer sk-alice")],
    )
    .await;
    assert_eq!(r.json()["data"][0]["id"], "qwen3.5-27b");
}

#[tokio::test]
async fn admin_and_metrics_show_the_contract() {
    let (gw, _backend) = gateway(FakeSpec::default()).await;
    let t = gw.admin("/admin/tenants").await;
    assert_eq!(t["tenants"][0]["name"], "alice");
    assert_eq!(
        t["tenants"][0]["buckets"]["decode"]["rate_per_second"],
        100.0
    );
    assert_eq!(t["tenants"][0]["buckets"]["decode"]["capacity"], 1000.0);
    let b = gw.admin("/admin/backends").await;
    assert_eq!(b["backends"][0]["kv_capacity_bytes"], 8_000_000_000u64);
    assert_eq!(b["backends"][0]["max_batch"], 32);
    assert_eq!(b["backends"][0]["inflight"], 0);
    // No vLLM version declared, and no engine read to learn one from: refused past the context.
    assert_eq!(b["backends"][0]["vllm_version"], serde_json::Value::Null);
    assert_eq!(b["clamps_output_to_context"], false);
    assert_eq!(gw.admin("/healthz").await["status"], "ok");
    assert_eq!(gw.admin("/readyz").await["status"], "ready");
    let m = gw.metrics().await;
    for name in [
        "tokengate_kv_capacity_bytes",
        "tokengate_queue_depth",
        "tokengate_bucket_available_tokens",
    ] {
        assert!(m.contains(name), "{name} missing");
    }
}

#[tokio::test]
async fn speaks_h2c_with_prior_knowledge() {
    let (gw, _backend) = gateway(FakeSpec::default()).await;
    let stream = tokio::net::TcpStream::connect(gw.running.addr)
        .await
        .unwrap();
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let req = http::Request::builder()
        .method("POST")
        .uri(gw.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .header("authorization", "Bearer sk-alice")
        .body(http_body_util::Full::new(bytes::Bytes::from(
            chat("hi", 2, false).to_string(),
        )))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.version(), http::Version::HTTP_2);
    assert_eq!(resp.status(), 200);
    use http_body_util::BodyExt;
    let body: Value =
        serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(body["usage"]["completion_tokens"], 2);
}

#[tokio::test]
async fn shutdown_stops_accepting_and_lets_in_flight_streams_finish() {
    let (gw, backend) = held_gateway(FakeSpec::held(), 4, "10s").await;
    let addr = gw.running.addr;
    let inflight = spawn_post(
        &gw.url("/v1/chat/completions"),
        "sk-alice",
        chat("a", 3, true),
    );
    backend.wait_held(1).await;
    let shutdown = tokio::spawn(gw.running.shutdown());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while tokio::net::TcpStream::connect(addr).await.is_ok() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "listener still accepting"
        );
        tokio::task::yield_now().await;
    }
    backend.release.add_permits(1);
    let r = inflight.await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(sse_data(&r.body).len(), 4, "the whole stream arrived");
    shutdown.await.unwrap();
}

#[tokio::test]
async fn capacity_model_sizes_backends_and_tenant_shares() {
    let backend = FakeBackend::start(FakeSpec::default()).await;
    let text = format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
[tokenizer]
path = "unused"
[model]
served_names = ["qwen3.5-27b"]
max_model_len = 32768
default_max_tokens = 800
[workload]
avg_input_tokens = 3000
avg_output_tokens = 800
[[backends]]
url = "http://{}"
hardware = "910b3"
model = "qwen3.5-27b"
tp = 2
[[tenants]]
name = "alice"
api_keys = ["sk-alice"]
share = 0.25
requests_per_second = 2
"#,
        backend.addr
    );
    let cfg = tokengate::config::Config::parse(&text).unwrap();
    let gw = TestGateway::start(cfg.into_inner()).await;
    let b = &gw.admin("/admin/backends").await["backends"][0];
    // 2 x 64e9 B HBM - 54e9 B weights - 2 x 2e9 B reserve; 45 RAG 3000/800 sequences keep the
    // predicted step within the 50 ms TPOT SLO (docs/capacity.md).
    assert_eq!(b["kv_capacity_bytes"], 70_000_000_000u64);
    assert_eq!(b["max_batch"], 45);
    assert_eq!(
        (&b["kv_capacity_bytes_source"], &b["max_batch_source"]),
        (&json!("derived"), &json!("derived"))
    );
    let derived_decode = b["derived"]["decode_tps"].as_f64().unwrap();
    let derived_prefill = b["derived"]["prefill_tps"].as_f64().unwrap();
    let t = &gw.admin("/admin/tenants").await["tenants"][0]["buckets"];
    // equal to a millionth of a token per second (the two sides round differently)
    let rate = |bucket: &str| format!("{:.6}", t[bucket]["rate_per_second"].as_f64().unwrap());
    assert_eq!(rate("decode"), format!("{:.6}", 0.25 * derived_decode));
    assert_eq!(rate("prefill"), format!("{:.6}", 0.25 * derived_prefill));
    // 0.25 of the 492.7 decode and 1,847.8 prefill tokens/s the model sustains at batch 45
    assert_eq!(rate("decode"), "123.186131");
    assert_eq!(rate("prefill"), "461.947992");
    // The share derives the token rates; requests_per_second is the file's, beside what the
    // share would derive.
    let tenant = &gw.admin("/admin/tenants").await["tenants"][0];
    let sources: Vec<&Value> = ["prefill", "decode", "requests"]
        .iter()
        .map(|bucket| &tenant["buckets"][bucket]["rate_source"])
        .collect();
    assert_eq!(
        sources,
        [&json!("derived"), &json!("derived"), &json!("configured")]
    );
    assert_eq!(tenant["share"], 0.25);
    assert_eq!(t["requests"]["rate_per_second"], 2.0);
    let derived = &tenant["derived"];
    assert_eq!(
        derived["decode_tokens_per_second"],
        t["decode"]["rate_per_second"]
    );
    assert_eq!(
        format!("{:.6}", derived["requests_per_second"].as_f64().unwrap()),
        "0.153983"
    );

    // A max_batch set by hand is in force, and the derived one shown beside it.
    let hand_set = text.replace("tp = 2\n", "tp = 2\nmax_batch = 200\n");
    let cfg = tokengate::config::Config::parse(&hand_set).unwrap();
    let gw = TestGateway::start(cfg.into_inner()).await;
    let b = &gw.admin("/admin/backends").await["backends"][0];
    assert_eq!(
        (
            &b["kv_capacity_bytes"],
            &b["kv_capacity_bytes_source"],
            &b["derived"]["kv_capacity_bytes"]
        ),
        (
            &json!(70_000_000_000u64),
            &json!("derived"),
            &json!(70_000_000_000u64)
        )
    );
    assert_eq!(
        (
            &b["max_batch"],
            &b["max_batch_source"],
            &b["derived"]["max_batch"]
        ),
        (&json!(200), &json!("configured"), &json!(45))
    );
}

/// The base64 of a real 1024x1024 PNG file, from tests/fixtures/vision.jsonl (Pillow made it).
fn png_1024_base64() -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/vision.jsonl");
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|f| {
            f["variant"] == "png" && f["width"] == 1024 && f["height"] == 1024 && f["whole"] == true
        })
        .expect("a whole 1024x1024 PNG fixture")["data"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// A one-message chat with a question and an image part.
fn image_chat(url: &str, max_tokens: u64) -> Value {
    json!({"model": "qwen3.5-27b", "max_tokens": max_tokens, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": url}},
    ]}]})
}

/// A 1024x1024 PNG is not its 3 placeholder tokens: the backend runs 1,024 image tokens between
/// the vision start and end tokens, and `/tokenize`, the prefill charge and the KV footprint
/// all see them.
#[tokio::test]
async fn an_image_is_charged_the_tokens_the_backend_runs() {
    let (gw, backend) = gateway(FakeSpec::default()).await;
    let url = format!("data:image/png;base64,{}", png_1024_base64());
    let text = chat_tokens("What is this?<|vision_start|><|image_pad|><|vision_end|>");
    let expected = text - 1 + 1024;

    let r = post(&gw.url("/tokenize"), "sk-alice", &image_chat(&url, 5)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["count"], expected);
    let ids = v["tokens"].as_array().unwrap();
    assert_eq!(ids.len() as u64, expected);
    let pad = u64::from(tokenizer().token_id("<|image_pad|>").unwrap());
    assert_eq!(
        ids.iter().filter(|id| id.as_u64() == Some(pad)).count(),
        1024
    );

    let r = chat_within_10s(&gw, &image_chat(&url, 5), "image chat").await;
    assert_eq!(r.status, 200, "{}", r.text());
    // The chat, and the count `/tokenize` cost (a prefill token per 16 counted).
    assert_eq!(
        gw.bucket("alice", "prefill").await,
        10_000.0 - (expected + expected.div_ceil(16)) as f64
    );
    gw.wait_metric(
        "tokengate_prefill_tokens_total{tenant=\"alice\"}",
        &expected.to_string(),
    )
    .await;
    // Forwarded as sent: the backend gets the image, not the gateway's placeholder.
    let sent = backend.seen.lock().unwrap()[0].clone();
    assert_eq!(sent["messages"][0]["content"][1]["image_url"]["url"], url);

    // The KV footprint includes them too: with room for 1,000 tokens of KV (plus the
    // sequence state) the same chat can never fit.
    let (gw, _backend) = gateway_with(FakeSpec::default(), |cfg| {
        cfg.backends[0].kv_capacity_bytes =
            Some(cfg.model.state_bytes_per_sequence + 1000 * cfg.model.kv_bytes_per_token);
    })
    .await;
    let r = gw.chat("sk-alice", &image_chat(&url, 5)).await;
    assert_eq!((r.status, r.code().as_str()), (400, "exceeds_kv_capacity"));
    assert_eq!(gw.bucket("alice", "prefill").await, 10_000.0);
}

#[tokio::test]
async fn images_that_cannot_be_counted_are_refused_and_change_nothing() {
    let (gw, backend) = gateway(FakeSpec::default()).await;
    // A remote image is charged at the most an image can cost: 16,384 tokens, past the test
    // model's 4,096-token context (its count stops at the first token of text).
    let r = post(
        &gw.url("/tokenize"),
        "sk-alice",
        &image_chat("https://example.com/cat.png", 5),
    )
    .await;
    assert_eq!(
        (r.status, r.code().as_str()),
        (400, "context_length_exceeded")
    );
    assert_eq!(
        r.json()["error"]["message"],
        "this model's maximum context length is 4096 tokens; the prompt with the engine's expansion of its 1 image is at least 16384 tokens"
    );
    let r = gw
        .chat("sk-alice", &image_chat("https://example.com/cat.png", 5))
        .await;
    assert_eq!(
        (r.status, r.code().as_str()),
        (400, "context_length_exceeded")
    );

    let param = "messages[0].content[1].image_url";
    let cases = [
        ("data:image/png;base64,R0lGODdh", "`messages[0].content[1].image_url` is not an image the gateway can count: the GIF data ends inside its header"),
        ("data:image/png;base64,Qk02AAAA", "`messages[0].content[1].image_url` is not an image the gateway can count: unsupported image format (the data starts with bytes 42 4d 36 00 00 00); send PNG, JPEG, WebP or GIF"),
        ("ftp://example.com/a.png", "`messages[0].content[1].image_url` is not an image the gateway can count: the URL must be http(s) or a base64 data URL (`data:<type>;base64,<data>`)"),
    ];
    for (url, message) in cases {
        let r = gw.chat("sk-alice", &image_chat(url, 5)).await;
        assert_eq!(
            (r.status, r.code().as_str()),
            (400, "invalid_request"),
            "{url}"
        );
        assert_eq!(r.json()["error"]["param"], param);
        assert_eq!(r.json()["error"]["message"], message);
    }
    assert_eq!(gw.bucket("alice", "prefill").await, 10_000.0);
    assert_eq!(gw.bucket("alice", "requests").await, 100.0);
    assert!(backend.seen.lock().unwrap().is_empty());

    // A text-only deployment refuses images and video outright.
    let (gw, backend) = gateway_with(FakeSpec::default(), |cfg| cfg.vision.enabled = false).await;
    let url = format!("data:image/png;base64,{}", png_1024_base64());
    let r = gw.chat("sk-alice", &image_chat(&url, 5)).await;
    assert_eq!((r.status, r.code().as_str()), (400, "invalid_request"));
    assert_eq!(
        r.json()["error"]["message"],
        "`messages[0].content[1].image_url` is an image, but this deployment accepts text only (vision.enabled = false)"
    );
    let video = json!({"model": "qwen3.5-27b", "messages": [{"role": "user", "content": [
        {"type": "video_url", "video_url": {"url": "https://example.com/v.mp4"}}]}]});
    let r = gw.chat("sk-alice", &video).await;
    assert_eq!(
        r.json()["error"]["param"],
        "messages[0].content[0].video_url"
    );
    assert_eq!(gw.bucket("alice", "prefill").await, 10_000.0);
    assert!(backend.seen.lock().unwrap().is_empty());
}

#[path = "gateway/mindie.rs"]
mod mindie;

#[path = "gateway/cache_salt.rs"]
mod cache_salt;
#[path = "gateway/caps.rs"]
mod caps;
#[path = "gateway/diagnose.rs"]
mod diagnose;
#[path = "gateway/messages.rs"]
mod messages;
#[path = "gateway/otel.rs"]
mod otel;
#[path = "gateway/pooling.rs"]
mod pooling;
#[path = "gateway/priority.rs"]
mod priority;
#[path = "gateway/profile.rs"]
mod profile;
#[path = "gateway/quotas.rs"]
mod quotas;
#[path = "gateway/request_id.rs"]
mod request_id;
#[path = "gateway/responses.rs"]
mod responses;
#[path = "gateway/settle.rs"]
mod settle;
#[path = "gateway/tokenize.rs"]
mod tokenize;

#[tokio::test]
async fn an_address_in_use_is_named_with_its_setting() {
    let taken = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = taken.local_addr().unwrap();
    for setting in ["listen", "admin_listen"] {
        let mut cfg = config(&[addr]);
        match setting {
            "listen" => cfg.server.listen = addr,
            _ => cfg.server.admin_listen = addr,
        }
        let Err(e) = TestGateway::try_start(cfg).await else {
            panic!("started on {addr}, which is taken");
        };
        assert_eq!(
            e.to_string(),
            format!("listening on {addr} (server.{setting})"),
            "{e:#}"
        );
    }
}

#[tokio::test]
async fn tokenize_jsonl_counts_a_chat_as_the_gateway_charges_it() {
    use tokengate::cli::tokenize::count_line;
    use tokengate::tokenize::chat::ChatTemplate;
    let (gw, _backend) = gateway(FakeSpec::default()).await;
    let template = ChatTemplate::builtin_qwen35();
    let bodies = [
        json!({"model": "qwen3.5-27b", "messages": [{"role": "user", "content": "hello world"}], "max_tokens": 5}),
        json!({"model": "qwen3.5-27b", "messages": [{"role": "system", "content": "Be brief."}, {"role": "developer", "content": "Really."},
            {"role": "user", "content": "hi"}], "chat_template_kwargs": {"enable_thinking": false}, "max_tokens": 5}),
        json!({"model": "qwen3.5-27b", "messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "none", "max_tokens": 5}),
    ];
    for body in bodies {
        let prefill = gw.bucket("alice", "prefill").await;
        let r = gw.chat("sk-alice", &body).await;
        assert_eq!(r.status, 200, "{}", r.text());
        let charged = prefill - gw.bucket("alice", "prefill").await;
        let counted = count_line(&tokenizer(), &template, &body).unwrap();
        assert_eq!(counted as f64, charged, "{body}");
    }
    // The thinking switch goes where a request has it.
    let line = json!({"messages": [{"role": "user", "content": "hi"}], "enable_thinking": false});
    assert_eq!(
        count_line(&tokenizer(), &template, &line).unwrap_err(),
        "\"enable_thinking\" goes in \"chat_template_kwargs\", as in a request to the gateway"
    );
}

/// A template argument the Qwen3.5 template does not read is charged as if it had not been
/// sent (vLLM hands the template only those it reads); one it reads is a 400 naming it, and
/// nothing is charged.
#[tokio::test]
async fn template_arguments_are_charged_as_the_template_reads_them() {
    let (gw, backend) = gateway(FakeSpec::default()).await;
    let chat = |kwargs: Value| {
        json!({"model": "qwen3.5-27b", "messages": [{"role": "user", "content": "hi"}],
               "chat_template_kwargs": kwargs, "max_tokens": 5})
    };
    let mut charged = Vec::new();
    for kwargs in [
        json!({"enable_thinking": false}),
        json!({"enable_thinking": false, "thinking": false, "documents": [{"text": "d"}]}),
    ] {
        let prefill = gw.bucket("alice", "prefill").await;
        let r = gw.chat("sk-alice", &chat(kwargs)).await;
        assert_eq!(r.status, 200, "{}", r.text());
        charged.push(prefill - gw.bucket("alice", "prefill").await);
    }
    assert_eq!(charged[0], charged[1]);
    let forwarded = backend.max_tokens_seen().len();
    let before = (
        gw.bucket("alice", "prefill").await,
        gw.bucket("alice", "decode").await,
    );
    let r = gw
        .chat("sk-alice", &chat(json!({"tools": [{"type": "function"}]})))
        .await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["param"], "chat_template_kwargs.tools");
    assert_eq!(backend.max_tokens_seen().len(), forwarded);
    let after = (
        gw.bucket("alice", "prefill").await,
        gw.bucket("alice", "decode").await,
    );
    assert_eq!(after, before);
    assert_eq!(gw.kv_reserved(0).await, 0);
}

#[tokio::test]
async fn a_request_that_could_never_be_admitted_is_a_400_before_any_retry_advice() {
    let (gw, backend) = gateway(FakeSpec::default()).await;
    let url = gw.url("/v1/chat/completions");
    assert_eq!(
        post(&url, "sk-alice", &chat("a", 600, false)).await.status,
        200
    );
    let before = (
        gw.bucket("alice", "prefill").await,
        gw.bucket("alice", "decode").await,
        gw.bucket("alice", "requests").await,
    );
    assert_eq!(before.1, 400.0);
    // 33 choices of 20 tokens, lowered to sheddable: more than the 400 decode tokens left (a
    // 429 for a request that could run later), but also more sequences than the half of the
    // backend's batch of 32 a sheddable request may hold (more than a whole batch run in turns
    // only in a class that may hold all of it).
    let mut body = chat("a", 20, false);
    body["n"] = json!(33);
    let sheddable = |body| post_as(&url, "sk-alice", "sheddable", body);
    let r = sheddable(&body).await;
    assert_eq!(
        (r.status, r.code()),
        (400, "exceeds_kv_capacity".to_owned()),
        "{}",
        r.text()
    );
    assert_eq!(r.json()["error"]["param"], "n");
    assert_eq!(r.headers.get("retry-after"), None);
    // With the decode bucket full again the same 400 comes after counting, before any charge.
    gw.clock.advance(Duration::from_secs(10));
    let full = gw.bucket("alice", "decode").await;
    assert_eq!(full, 1000.0);
    let r = sheddable(&body).await;
    assert_eq!(
        (r.status, r.code()),
        (400, "exceeds_kv_capacity".to_owned())
    );
    assert_eq!(gw.bucket("alice", "decode").await, full);
    assert_eq!(gw.kv_reserved(0).await, 0);
    // Neither reached the backend, and the prefill bucket was never charged.
    assert_eq!(backend.seen.lock().unwrap().len(), 1);
    assert_eq!(
        gw.bucket("alice", "prefill").await,
        (before.0 + 10.0 * 1000.0).min(10_000.0)
    );
}
