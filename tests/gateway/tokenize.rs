//! `/tokenize` bounded, since 3,000 remote-image parts in a 189 KB body were once answered with
//! 344 MB of ids. Media parts per chat are capped (on every route that reads
//! chats), a prompt past the context is a 400 before any id is made, and `/tokenize` costs a
//! request from the tenant's bucket.

use super::*;

/// A chat of `n` image parts given by http(s) URL, as a client flooding `/tokenize` sends them.
fn remote_images(n: usize) -> Value {
    let parts: Vec<Value> = (0..n)
        .map(|i| json!({"type": "image_url", "image_url": {"url": format!("https://example.com/{i}.png")}}))
        .collect();
    json!({"model": "qwen3.5-27b", "max_tokens": 5, "messages": [{"role": "user", "content": parts}]})
}

#[tokio::test]
async fn thousands_of_remote_images_are_refused_before_any_id_is_made() {
    let (gw, backend) = gateway_with(FakeSpec::default(), |cfg| {
        cfg.server.max_body_bytes = 1 << 20;
    })
    .await;
    let tokenize = gw.url("/tokenize");
    let body = remote_images(3000);
    assert_eq!(body.to_string().len(), 214_969);
    let r = post(&tokenize, "sk-alice", &body).await;
    assert_eq!((r.status, r.code().as_str()), (400, "invalid_request"));
    assert_eq!(r.json()["error"]["param"], "messages");
    assert_eq!(
        r.json()["error"]["message"],
        "`messages` carries 3000 images; at most 999 images may be sent in one request (vision.max_media_per_request)"
    );
    // The same chat to the generation route.
    let r = gw.chat("sk-alice", &body).await;
    assert_eq!(
        (r.status, r.json()["error"]["message"].clone()),
        (
            400,
            json!("`messages` carries 3000 images; at most 999 images may be sent in one request (vision.max_media_per_request)")
        )
    );
    // At the cap, 999 images of up to 16,384 tokens each are far past the 4,096-token
    // context: a 400 once their count passes it, without a single id made.
    let r = post(&tokenize, "sk-alice", &remote_images(999)).await;
    assert_eq!(
        (r.status, r.code().as_str()),
        (400, "context_length_exceeded")
    );
    assert_eq!(r.json()["error"]["param"], "messages");
    assert_eq!(
        r.json()["error"]["message"],
        format!(
            "this model's maximum context length is 4096 tokens; the prompt with the engine's expansion of its 999 images is at least {} tokens",
            999 * 16_383 + 1
        )
    );
    assert!(r.body.len() < 512, "{}", r.text());
    // Nothing was charged, nothing forwarded.
    assert_eq!(gw.bucket("alice", "requests").await, 100.0);
    assert_eq!(gw.bucket("alice", "prefill").await, 10_000.0);
    assert!(backend.seen.lock().unwrap().is_empty());
}

#[tokio::test]
async fn tokenize_costs_one_request_and_nothing_when_refused() {
    let (gw, _backend) = gateway_with(FakeSpec::default(), |cfg| {
        // One request per 10 s: a single request empties the bucket.
        cfg.tenants[0].requests_per_second = Some(0.1);
    })
    .await;
    let tokenize = gw.url("/tokenize");
    let r = post(&tokenize, "sk-alice", &json!({"prompt": "hello world"})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let ids = tokenizer().encode("hello world");
    let want =
        json!({"count": ids.len(), "max_model_len": 4096, "tokens": ids, "token_strs": null});
    assert_eq!(r.text(), want.to_string());
    assert_eq!(r.headers["content-type"], "application/json");
    assert_eq!(gw.bucket("alice", "requests").await, 0.0);
    // Empty: refused, its body unread (this one is not even JSON).
    let headers = [
        ("content-type", "application/json"),
        ("authorization", "Bearer sk-alice"),
    ];
    let r = send(&tokenize, "POST", Some(b"not json".to_vec()), &headers).await;
    assert_eq!((r.status, r.code().as_str()), (429, "rate_limit_exceeded"));
    assert_eq!(r.json()["error"]["type"], "requests");
    assert_eq!(
        r.json()["error"]["message"],
        "rate limit reached for requests: request needs 1 requests, 0 available; retry after 10.000 s"
    );
    assert_eq!(r.headers["retry-after"], "10");
    assert_eq!(r.headers["x-ratelimit-remaining-requests"], "0");
    // bob's bucket is his own.
    let r = post(&tokenize, "sk-bob", &json!({"prompt": "hello world"})).await;
    assert_eq!(r.status, 200);

    // Refusals of bad input cost nothing.
    gw.clock.advance(Duration::from_secs(10));
    assert_eq!(gw.bucket("alice", "requests").await, 1.0);
    let r = post(&tokenize, "sk-alice", &json!({"messages": []})).await;
    assert_eq!((r.status, r.code().as_str()), (400, "invalid_request"));
    // (vLLM's `/tokenize` takes a text prompt, not ids.)
    let r = post(
        &tokenize,
        "sk-alice",
        &json!({"prompt": " hello".repeat(4200)}),
    )
    .await;
    assert_eq!(
        (r.status, r.code().as_str()),
        (400, "context_length_exceeded")
    );
    assert_eq!(r.json()["error"]["param"], "prompt");
    assert_eq!(
        r.json()["error"]["message"],
        "this model's maximum context length is 4096 tokens; the prompt is at least 4097 tokens"
    );
    assert_eq!(gw.bucket("alice", "requests").await, 1.0);
    // A whole context is answered.
    let r = post(
        &tokenize,
        "sk-alice",
        &json!({"prompt": " hello".repeat(4096)}),
    )
    .await;
    assert_eq!((r.status, r.json()["count"].clone()), (200, json!(4096)));
    assert_eq!(gw.bucket("alice", "requests").await, 0.0);
}

#[tokio::test]
async fn images_past_the_cap_are_refused_before_any_is_read() {
    let (gw, backend) = gateway_with(FakeSpec::default(), |cfg| {
        cfg.server.max_body_bytes = 1 << 20;
        cfg.vision.max_media_per_request = 2;
    })
    .await;
    let png = format!("data:image/png;base64,{}", png_1024_base64());
    let image = |url: &str| json!({"type": "image_url", "image_url": {"url": url}});
    let chat_of = |parts: Vec<Value>| json!({"model": "qwen3.5-27b", "max_tokens": 5, "messages": [{"role": "user", "content": parts}]});
    let two = chat_of(vec![image(&png), image(&png)]);
    let r = chat_within_10s(&gw, &two, "two images").await;
    assert_eq!(r.status, 200, "{}", r.text());
    // A third image, not even readable: the count refuses it before its header is decoded.
    let three = chat_of(vec![
        image(&png),
        image(&png),
        image("data:image/png;base64,R0lGODdh"),
    ]);
    let message = "`messages` carries 3 images; at most 2 images may be sent in one request (vision.max_media_per_request)";
    for url in [gw.url("/v1/chat/completions"), gw.url("/tokenize")] {
        let r = post(&url, "sk-alice", &three).await;
        assert_eq!(
            (r.status, r.code().as_str()),
            (400, "invalid_request"),
            "{url}"
        );
        assert_eq!(r.json()["error"]["param"], "messages");
        assert_eq!(r.json()["error"]["message"], message);
    }
    assert_eq!(backend.seen.lock().unwrap().len(), 1);
    assert_eq!(gw.bucket("alice", "requests").await, 99.0);
}

#[tokio::test]
async fn detokenize_answers_locally_as_vllm_decodes_and_costs_one_request() {
    let (gw, backend) = gateway_with(FakeSpec::default(), |cfg| {
        // One request per 10 s: a single request empties the bucket.
        cfg.tenants[0].requests_per_second = Some(0.1);
    })
    .await;
    let detokenize = gw.url("/detokenize");
    let tok = tokenizer();
    // Special tokens kept, as vLLM's `tokenizer.decode` keeps them.
    let mut ids = tok.encode("hello world");
    ids.insert(0, tok.token_id("<|im_start|>").expect("a special token"));
    let r = post(&detokenize, "sk-alice", &json!({"tokens": ids})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json(), json!({"prompt": "<|im_start|>hello world"}));
    assert_eq!(gw.bucket("alice", "requests").await, 0.0);
    // Empty: refused before its body is read.
    let r = post(&detokenize, "sk-alice", &json!({"tokens": [1]})).await;
    assert_eq!((r.status, r.code().as_str()), (429, "rate_limit_exceeded"));

    // Bad input costs nothing.
    gw.clock.advance(Duration::from_secs(10));
    for (body, message) in [
        (json!({}), "`tokens` is required"),
        (
            json!({"tokens": "hi"}),
            "`tokens` must be a list of token ids, got a string",
        ),
        (
            json!({"tokens": [1, -2]}),
            "`tokens[1]` is -2: a token id is an integer from 0 to 4294967295",
        ),
    ] {
        let r = post(&detokenize, "sk-alice", &body).await;
        assert_eq!((r.status, r.code().as_str()), (400, "invalid_request"));
        assert_eq!(
            (
                r.json()["error"]["param"].clone(),
                r.json()["error"]["message"].clone()
            ),
            (json!("tokens"), json!(message))
        );
    }
    let r = post(
        &detokenize,
        "sk-alice",
        &json!({"model": "gpt-4", "tokens": []}),
    )
    .await;
    assert_eq!((r.status, r.code().as_str()), (404, "model_not_found"));
    assert_eq!(gw.bucket("alice", "requests").await, 1.0);
    // No tokens: no text.
    let r = post(&detokenize, "sk-alice", &json!({"tokens": []})).await;
    assert_eq!((r.status, r.json()), (200, json!({"prompt": ""})));
    assert!(backend.seen.lock().unwrap().is_empty());
}

/// What `/detokenize` answers is bounded like a body the gateway takes (`server.max_body_bytes`,
/// 64 KiB here): 2,000 ids of a 16-space token decode to 32,000 bytes and are answered; 5,000
/// (80,000 bytes) are refused with a 400 naming the numbers, before the text is made. Before, a
/// 4 MiB body of one long token came back as an answer of ~89 MB.
#[tokio::test]
async fn detokenize_answers_no_more_text_than_a_body_may_hold() {
    let (gw, _backend) = gateway(FakeSpec::default()).await;
    let detokenize = gw.url("/detokenize");
    let spaces = " ".repeat(16);
    let id = tokenizer().encode(&spaces);
    assert_eq!(id.len(), 1, "16 spaces are one token");
    let r = post(
        &detokenize,
        "sk-alice",
        &json!({"tokens": vec![id[0]; 2000]}),
    )
    .await;
    assert_eq!(
        (r.status, r.json()["prompt"].as_str().map(str::len)),
        (200, Some(32_000))
    );
    let r = post(
        &detokenize,
        "sk-alice",
        &json!({"tokens": vec![id[0]; 5000]}),
    )
    .await;
    assert_eq!(
        (r.status, r.json()["error"].clone()),
        (
            400,
            json!({"message": "the 5000 ids decode to more than 65536 bytes, the most text the gateway answers (server.max_body_bytes): detokenize fewer at a time", "type": "invalid_request_error", "param": "tokens", "code": "invalid_request"})
        )
    );
    // Only the answered one was charged.
    assert_eq!(gw.bucket("alice", "requests").await, 99.0);
}
