//! OpenAI's `/v1/responses` end to end through the gateway to the simulated backend,
//! which counts prompts as vLLM does: the prompt charged equals the backend's count, the
//! output limit reserved and forwarded, what was not generated refunded, a stream metered from
//! its events, and stored state refused with nothing charged.

use super::mindie::start_sim;
use super::*;
use tokengate::sim::SimConfig;

#[tokio::test]
async fn responses_are_charged_the_backends_count_and_refunded_what_was_not_generated() {
    let sim = start_sim(SimConfig {
        mean_output_tokens: 4.0,
        ..SimConfig::pace(Duration::from_millis(1))
    })
    .await;
    let gw = TestGateway::start(config(&[sim.addr()])).await;
    let url = gw.url("/v1/responses");
    let body = json!({"model": "qwen3.5-27b", "instructions": "Be brief.",
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
        "max_output_tokens": 40, "ignore_eos": true});
    let r = post(&url, "sk-alice", &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let usage = r.json()["usage"].clone();
    assert_eq!(usage["output_tokens"], 40);
    let prompt = usage["input_tokens"].as_u64().unwrap();
    // The instructions are the system message vLLM renders first.
    let rendered = format!("<|im_start|>system\nBe brief.<|im_end|>\n{USER_FRAME}hi{GEN_PROMPT}");
    assert_eq!(prompt, tokenizer().count(&rendered) as u64);
    assert_eq!(sim.stats().max_tokens, [Some(40)]);
    gw.wait_metric(r#"tokengate_decode_tokens_total{tenant="alice"}"#, "40")
        .await;
    assert_eq!(
        gw.bucket("alice", "prefill").await,
        10_000.0 - prompt as f64
    );
    assert_eq!(gw.bucket("alice", "decode").await, 960.0);

    // Streamed, ending on its own before its limit: charged what it generated.
    let mut body = body.clone();
    body["stream"] = json!(true);
    body["ignore_eos"] = json!(false);
    body["max_output_tokens"] = json!(100);
    let r = post(&url, "sk-bob", &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let text = r.text();
    let deltas = text
        .matches("\"type\":\"response.output_text.delta\"")
        .count() as u64;
    assert!(deltas < 100, "{deltas}");
    assert!(text.contains("response.completed"));
    gw.wait_metric(
        r#"tokengate_decode_tokens_total{tenant="bob"}"#,
        &deltas.to_string(),
    )
    .await;
    gw.wait_bucket("bob", "decode", 1000.0 - deltas as f64)
        .await;
    assert_eq!(gw.kv_reserved(0).await, 0);
}

#[tokio::test]
async fn stored_state_is_refused_with_nothing_charged() {
    let sim = start_sim(SimConfig::pace(Duration::from_millis(1))).await;
    let gw = TestGateway::start(config(&[sim.addr()])).await;
    let url = gw.url("/v1/responses");
    for (extra, param) in [
        (
            json!({"previous_response_id": "resp_1"}),
            "previous_response_id",
        ),
        (json!({"background": true}), "background"),
        (
            json!({"input": [{"type": "item_reference", "id": "msg_1"}]}),
            "input[0].type",
        ),
    ] {
        let mut body = json!({"model": "qwen3.5-27b", "input": "hi"});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let r = post(&url, "sk-alice", &body).await;
        assert_eq!(
            (r.status, r.code().as_str()),
            (400, "invalid_request"),
            "{param}"
        );
        assert_eq!(r.json()["error"]["param"], param);
    }
    assert_eq!(gw.bucket("alice", "prefill").await, 10_000.0);
    assert_eq!(gw.bucket("alice", "decode").await, 1000.0);
    assert_eq!(gw.bucket("alice", "requests").await, 100.0);
    assert_eq!(sim.stats().requests, 0);
}

/// What a chat refuses, `/v1/responses` refuses with the same words (one list of the fields
/// that change the engine's work beyond what the gateway charged): a negative `priority`
/// (ahead of the request's class) and `mm_processor_kwargs` / `media_io_kwargs` (a 28x28 image
/// counted as a few tokens, ~16K to vLLM with a `min_pixels` of 16M), each with nothing
/// charged or forwarded. Before, both were forwarded.
#[tokio::test]
async fn responses_refuse_what_chat_refuses() {
    let sim = start_sim(SimConfig::pace(Duration::from_millis(1))).await;
    let gw = TestGateway::start(config(&[sim.addr()])).await;
    for (extra, param) in [
        (json!({"priority": -5}), "priority"),
        (
            json!({"mm_processor_kwargs": {"min_pixels": 16_777_216}}),
            "mm_processor_kwargs",
        ),
        (
            json!({"media_io_kwargs": {"video": {"num_frames": 512}}}),
            "media_io_kwargs",
        ),
    ] {
        let mut body = json!({"model": "qwen3.5-27b", "input": "hi"});
        let mut chat_body = chat("hi", 10, false);
        for b in [&mut body, &mut chat_body] {
            b.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
        }
        let chat = gw.chat("sk-alice", &chat_body).await;
        let r = post(&gw.url("/v1/responses"), "sk-alice", &body).await;
        assert_eq!(
            (r.status, r.code().as_str()),
            (400, "invalid_request"),
            "{param}"
        );
        assert_eq!(r.json()["error"]["param"], param);
        assert_eq!(
            r.json()["error"]["message"],
            chat.json()["error"]["message"]
        );
    }
    assert_eq!(gw.bucket("alice", "prefill").await, 10_000.0);
    assert_eq!(gw.bucket("alice", "requests").await, 100.0);
    assert_eq!(sim.stats().requests, 0);
}

/// `kv_transfer_params` (where vLLM pulls or pushes a request's KV in a disaggregated
/// deployment) and `vllm_xargs` (arguments for the engine's plugins) are the deployment's to
/// set, not a client's: refused on every generation route with a 400 naming them, nothing
/// charged or forwarded. Before, both passed unchecked.
#[tokio::test]
async fn engine_controls_are_refused_on_every_route() {
    let sim = start_sim(SimConfig::pace(Duration::from_millis(1))).await;
    let gw = TestGateway::start(config(&[sim.addr()])).await;
    let bodies = [
        ("/v1/chat/completions", chat("hi", 10, false)),
        (
            "/v1/completions",
            json!({"model": "qwen3.5-27b", "prompt": "hi", "max_tokens": 10}),
        ),
        (
            "/v1/responses",
            json!({"model": "qwen3.5-27b", "input": "hi"}),
        ),
        (
            "/v1/messages",
            json!({"model": "qwen3.5-27b", "max_tokens": 10,
            "messages": [{"role": "user", "content": "hi"}]}),
        ),
    ];
    for (field, value) in [
        (
            "kv_transfer_params",
            json!({"do_remote_prefill": true, "remote_host": "10.0.0.9"}),
        ),
        ("vllm_xargs", json!({"plugin": "x"})),
    ] {
        for (path, body) in &bodies {
            let mut body = body.clone();
            body[field] = value.clone();
            let r = post(&gw.url(path), "sk-alice", &body).await;
            assert_eq!(r.status, 400, "{path} {field}: {}", r.text());
            let message =
                format!("`{field}` is not accepted: the deployment sets it, not a client");
            // OpenAI's shape and Anthropic's both have the message in `error`.
            let said = r.json();
            assert_eq!(said["error"]["message"], message, "{path}: {said}");
        }
    }
    assert_eq!(gw.bucket("alice", "requests").await, 100.0);
    assert_eq!(sim.stats().requests, 0);
}
