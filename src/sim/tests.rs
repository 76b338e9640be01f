//! Room `sim`: socket tests of the simulated backend's HTTP face (real sockets on 127.0.0.1:0,
//! the real Qwen3.5 tokenizer, the fixed-pace engine on paused tokio time).

use super::*;
use crate::tokenize::test_tokenizer as tokenizer;
use ::http::{Request, StatusCode};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::{json, Value};
use std::time::Duration;
use timing::StepTiming;

async fn sim(cfg: SimConfig) -> SimHandle {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    start(cfg, tokenizer(), listener).await.unwrap()
}

/// A whole exchange: status, body text, and whether the connection was cut mid-body.
#[derive(Debug)]
struct Answer {
    status: StatusCode,
    retry_after: Option<String>,
    content_type: Option<String>,
    body: String,
    cut: bool,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap()
    }

    /// The `data:` payloads of an SSE body.
    fn events(&self) -> Vec<String> {
        self.body
            .split("\n\n")
            .filter_map(|e| e.strip_prefix("data:"))
            .map(|d| d.trim().to_string())
            .collect()
    }
}

async fn call(addr: SocketAddr, method: &str, path: &str, body: Option<Value>) -> Answer {
    exchange(addr, method, path, body).await.unwrap()
}

/// One request on a fresh connection; `Err` when the connection dies before the head.
async fn exchange(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> Result<Answer, hyper::Error> {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "sim")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(
            body.map(|b| b.to_string()).unwrap_or_default(),
        )))
        .unwrap();
    let resp = sender.send_request(req).await?;
    let status = resp.status();
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_string())
    };
    let content_type = header("content-type");
    let retry_after = header("retry-after");
    let mut body = resp.into_body();
    let mut bytes = Vec::new();
    let mut cut = false;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(f) => bytes.extend_from_slice(f.data_ref().map_or(&[][..], |d| &d[..])),
            Err(_) => {
                cut = true;
                break;
            }
        }
    }
    Ok(Answer {
        status,
        retry_after,
        content_type,
        body: String::from_utf8(bytes).unwrap(),
        cut,
    })
}

async fn post(addr: SocketAddr, path: &str, body: Value) -> Answer {
    call(addr, "POST", path, Some(body)).await
}

fn chat(content: &str, extra: Value) -> Value {
    let mut body = json!({
        "model": DEFAULT_MODEL,
        "messages": [{"role": "user", "content": content}],
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// A user message costs its stripped content plus 5 tokens, the generation prompt 5
/// (DOMAIN.md 3); "Hello there, how are you?" is 7 tokens.
const HELLO: &str = "Hello there, how are you?";
const HELLO_CHAT_TOKENS: u64 = 7 + 5 + 5;

#[tokio::test(start_paused = true)]
async fn chat_answers_exactly_max_tokens_with_ignore_eos_and_reports_usage() {
    let s = sim(SimConfig::default()).await;
    assert_eq!(tokenizer().count(HELLO), 7);
    let a = post(
        s.addr(),
        "/v1/chat/completions",
        chat(HELLO, json!({"max_tokens": 12, "ignore_eos": true})),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
    let v = a.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(
        v["choices"][0]["message"]["content"],
        text::completion_text(0, 12)
    );
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": HELLO_CHAT_TOKENS, "total_tokens": HELLO_CHAT_TOKENS + 12, "completion_tokens": 12})
    );
    let stats = s.stats();
    assert_eq!(stats.requests, 1);
    assert_eq!(stats.max_tokens, vec![Some(12)]);
    assert_eq!(stats.prompt_tokens, HELLO_CHAT_TOKENS);
    assert_eq!(stats.generated_tokens, 12);
}

/// The prompts vLLM 0.32 counts (its usage.prompt_tokens, asked of the engine): a developer
/// message alone 17 tokens (rendered as system); a system and a later developer message
/// merged into one first system turn, 21; `reasoning` and `reasoning_content` of an answer in
/// the history rendered, 25 (21 without).
#[tokio::test(start_paused = true)]
async fn chats_are_counted_as_vllm_renders_them() {
    let s = sim(SimConfig::default()).await;
    let prompt = |messages: Value| {
        let addr = s.addr();
        async move {
            let body = json!({"model": DEFAULT_MODEL, "max_tokens": 1, "messages": messages});
            let a = post(addr, "/v1/chat/completions", body).await;
            assert_eq!(a.status, StatusCode::OK, "{}", a.body);
            a.json()["usage"]["prompt_tokens"].as_u64().unwrap()
        }
    };
    let developer =
        json!([{"role": "developer", "content": "D"}, {"role": "user", "content": "hi"}]);
    assert_eq!(prompt(developer).await, 17);
    let merged = json!([
        {"role": "system", "content": "S"},
        {"role": "user", "content": "hi"},
        {"role": "developer", "content": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}]},
    ]);
    assert_eq!(prompt(merged).await, 21);
    for key in ["reasoning", "reasoning_content"] {
        let history = json!([{"role": "user", "content": "Q"},
                             {"role": "assistant", "content": "A", key: "R R R"}]);
        assert_eq!(prompt(history).await, 25, "{key}");
    }
    let plain = json!([{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]);
    assert_eq!(prompt(plain).await, 21);
}

/// vLLM's batch of chats: each conversation a prompt of its own, rendered without the tools,
/// a choice for each, answered whole even when `stream` is asked, usage summed.
#[tokio::test(start_paused = true)]
async fn a_batch_of_chats_answers_a_choice_for_each_conversation() {
    let s = sim(SimConfig::default()).await;
    let tools = json!([{"type": "function", "function": {"name": "f"}}]);
    let hello = json!([{"role": "user", "content": HELLO}]);
    let body = json!({"model": DEFAULT_MODEL, "messages": [hello, hello], "max_tokens": 3,
                      "ignore_eos": true, "tools": tools, "stream": true});
    let a = post(s.addr(), "/v1/chat/completions/batch", body).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    let v = a.json();
    assert_eq!(v["object"], "chat.completion");
    let indices: Vec<_> = (v["choices"].as_array().unwrap().iter())
        .map(|c| c["index"].as_u64().unwrap())
        .collect();
    assert_eq!(indices, [0, 1]);
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": 2 * HELLO_CHAT_TOKENS, "total_tokens": 2 * HELLO_CHAT_TOKENS + 6, "completion_tokens": 6})
    );
    let flat = json!({"model": DEFAULT_MODEL, "messages": hello, "max_tokens": 3});
    let a = post(s.addr(), "/v1/chat/completions/batch", flat).await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST, "{}", a.body);
}

/// vLLM's generative scoring: a score per item, the query's tokens and each item's counted
/// apart and added, each prompt cut to the context less one token, one token generated each.
#[tokio::test(start_paused = true)]
async fn generative_scoring_answers_a_score_per_item() {
    let s = sim(SimConfig::default()).await;
    let body = json!({"query": HELLO, "items": ["yes", "no"], "label_token_ids": [9707]});
    let a = post(s.addr(), "/generative_scoring", body).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    let v = a.json();
    assert_eq!(v["object"], "list");
    let indices: Vec<_> = (v["data"].as_array().unwrap().iter())
        .map(|d| (d["index"].as_u64().unwrap(), d["object"].as_str().unwrap()))
        .collect();
    assert_eq!(indices, [(0, "score"), (1, "score")]);
    let tok = tokenizer();
    let prompt = 2 * 7 + (tok.count("yes") + tok.count("no")) as u64;
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": prompt, "total_tokens": prompt + 2, "completion_tokens": 2})
    );
    let max_model_len = SimConfig::default().engine.max_model_len;
    let long = "word ".repeat(max_model_len as usize);
    let body = json!({"query": long, "items": ["a"], "label_token_ids": [1]});
    let a = post(s.addr(), "/generative_scoring", body).await;
    assert_eq!(a.json()["usage"]["prompt_tokens"], max_model_len - 1);
    let none = json!({"query": "q", "items": [], "label_token_ids": [1]});
    let a = post(s.addr(), "/generative_scoring", none).await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST, "{}", a.body);
}

/// `truncate_prompt_tokens`, as vLLM: each prompt runs with at most that many tokens (`-1`, the
/// context less one); 0 would leave an empty prompt, which is refused.
#[tokio::test(start_paused = true)]
async fn truncate_prompt_tokens_cuts_each_prompt() {
    let s = sim(SimConfig::default()).await;
    let prompt_tokens = |truncate: i64, prompt: Value| {
        let addr = s.addr();
        async move {
            let body = json!({"model": DEFAULT_MODEL, "max_tokens": 1, "prompt": prompt,
                              "truncate_prompt_tokens": truncate});
            let a = post(addr, "/v1/completions", body).await;
            match a.status {
                StatusCode::OK => Ok(a.json()["usage"]["prompt_tokens"].as_u64().unwrap()),
                status => Err((status, a.json()["error"]["message"].clone())),
            }
        }
    };
    let long = "one two three four five six seven eight";
    assert_eq!(prompt_tokens(-1, json!(long)).await, Ok(8));
    assert_eq!(prompt_tokens(3, json!(long)).await, Ok(3));
    assert_eq!(prompt_tokens(3, json!([long, "one"])).await, Ok(4));
    assert_eq!(
        prompt_tokens(0, json!(long)).await,
        Err((
            StatusCode::BAD_REQUEST,
            json!("The decoder prompt cannot be empty")
        ))
    );
}

/// With `--reasoning-parser qwen3`, as vLLM 0.32: a chat that thinks (Qwen3.5's default) sends
/// the first half of its output in `delta.reasoning` / `message.reasoning` and the rest in
/// `content`; one with `enable_thinking: false` only content (not one with the text "false");
/// completions never reasoning.
/// Usage counts both.
#[tokio::test(start_paused = true)]
async fn a_reasoning_parser_splits_a_thinking_chat_into_reasoning_and_content() {
    let s = sim(SimConfig {
        reasoning_parser: true,
        ..SimConfig::default()
    })
    .await;
    let stream = json!({"max_tokens": 5, "ignore_eos": true, "stream": true,
                        "stream_options": {"include_usage": true}});
    let a = post(s.addr(), "/v1/chat/completions", chat(HELLO, stream)).await;
    let deltas: Vec<Value> = a.events()[1..6]
        .iter()
        .map(|e| serde_json::from_str::<Value>(e).unwrap()["choices"][0]["delta"].clone())
        .collect();
    let words = |from, n| text::completion_text(from, n);
    assert_eq!(
        deltas,
        [
            json!({"reasoning": words(0, 1)}),
            json!({"reasoning": words(1, 1)}),
            json!({"reasoning": words(2, 1)}),
            json!({"content": words(3, 1)}),
            json!({"content": words(4, 1)}),
        ]
    );
    let usage: Value = serde_json::from_str(&a.events()[6]).unwrap();
    assert_eq!(usage["usage"]["completion_tokens"], 5);

    let whole = json!({"max_tokens": 5, "ignore_eos": true});
    let a = post(s.addr(), "/v1/chat/completions", chat(HELLO, whole.clone())).await;
    assert_eq!(
        a.json()["choices"][0]["message"],
        json!({"role": "assistant", "reasoning": words(0, 3), "content": words(3, 2)})
    );
    // One token: all reasoning, no content.
    let one = json!({"max_tokens": 1, "ignore_eos": true});
    let a = post(s.addr(), "/v1/chat/completions", chat(HELLO, one)).await;
    assert_eq!(
        a.json()["choices"][0]["message"],
        json!({"role": "assistant", "reasoning": words(0, 1), "content": null})
    );
    let mut off = whole.clone();
    off["chat_template_kwargs"] = json!({"enable_thinking": false});
    let a = post(s.addr(), "/v1/chat/completions", chat(HELLO, off.clone())).await;
    assert_eq!(
        a.json()["choices"][0]["message"],
        json!({"role": "assistant", "content": words(0, 5)})
    );
    // The template tests `enable_thinking is false`: the text "false" thinks.
    off["chat_template_kwargs"] = json!({"enable_thinking": "false"});
    let a = post(s.addr(), "/v1/chat/completions", chat(HELLO, off)).await;
    assert_eq!(
        a.json()["choices"][0]["message"],
        json!({"role": "assistant", "reasoning": words(0, 3), "content": words(3, 2)})
    );
    let body = json!({"model": DEFAULT_MODEL, "prompt": "hi", "max_tokens": 5, "ignore_eos": true});
    let a = post(s.addr(), "/v1/completions", body).await;
    assert_eq!(a.json()["choices"][0]["text"], words(0, 5));
    // Without the parser the same chat is all content.
    let plain = sim(SimConfig::default()).await;
    let a = post(plain.addr(), "/v1/chat/completions", chat(HELLO, whole)).await;
    assert_eq!(
        a.json()["choices"][0]["message"],
        json!({"role": "assistant", "content": words(0, 5)})
    );
}

/// With `--enable-prompt-tokens-details`, as vLLM: usage carries
/// `prompt_tokens_details.cached_tokens`, the prompt's start served before in whole 16-token
/// blocks (never the whole prompt); 0 for a prompt the cache has not seen.
#[tokio::test(start_paused = true)]
async fn prompt_tokens_details_report_the_prefix_the_cache_held() {
    let s = sim(SimConfig {
        prompt_tokens_details: true,
        ..SimConfig::default()
    })
    .await;
    let usage = |prompt: String| {
        let addr = s.addr();
        async move {
            let body = json!({"model": DEFAULT_MODEL, "prompt": prompt, "max_tokens": 1});
            post(addr, "/v1/completions", body).await.json()["usage"].clone()
        }
    };
    // 40 one-token words, then the same 40 and 10 more.
    let first = usage(text::completion_text(0, 40)).await;
    assert_eq!(first["prompt_tokens"], 40);
    assert_eq!(first["prompt_tokens_details"], json!({"cached_tokens": 0}));
    let longer = usage(text::completion_text(0, 50)).await;
    assert_eq!(
        longer["prompt_tokens_details"],
        json!({"cached_tokens": 32})
    );
    let again = usage(text::completion_text(0, 48)).await;
    assert_eq!(again["prompt_tokens_details"], json!({"cached_tokens": 32}));
    // Without the flag, no details.
    let plain = sim(SimConfig::default()).await;
    let body = json!({"model": DEFAULT_MODEL, "prompt": "hi", "max_tokens": 1});
    let a = post(plain.addr(), "/v1/completions", body).await;
    assert_eq!(a.json()["usage"].get("prompt_tokens_details"), None);
}

#[tokio::test(start_paused = true)]
async fn chat_stream_sends_one_token_per_chunk_then_usage_like_vllm() {
    let s = sim(SimConfig::default()).await;
    let a = post(
        s.addr(),
        "/v1/chat/completions",
        chat(
            HELLO,
            json!({"max_tokens": 5, "ignore_eos": true, "stream": true,
                   "stream_options": {"include_usage": true}}),
        ),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.content_type.as_deref(), Some("text/event-stream"));
    let events = a.events();
    // Role chunk, 5 content chunks, usage chunk, [DONE].
    assert_eq!(events.len(), 8);
    let chunks: Vec<Value> = events[..7]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(
        chunks[0]["choices"][0]["delta"],
        json!({"role": "assistant", "content": ""})
    );
    let contents: Vec<&str> = chunks[1..6]
        .iter()
        .map(|c| c["choices"][0]["delta"]["content"].as_str().unwrap())
        .collect();
    assert_eq!(contents, vec![" the", " quick", " brown", " fox", " jumps"]);
    assert_eq!(chunks[4]["choices"][0]["finish_reason"], Value::Null);
    assert_eq!(chunks[5]["choices"][0]["finish_reason"], "length");
    assert_eq!(chunks[6]["choices"], json!([]));
    assert_eq!(chunks[6]["usage"]["completion_tokens"], 5);
    assert_eq!(chunks[6]["usage"]["prompt_tokens"], HELLO_CHAT_TOKENS);
    assert_eq!(events[7], "[DONE]");
}

#[tokio::test(start_paused = true)]
async fn completions_stream_without_include_usage_has_no_usage_chunk() {
    let s = sim(SimConfig::default()).await;
    let a = post(
        s.addr(),
        "/v1/completions",
        json!({"prompt": HELLO, "max_tokens": 3, "ignore_eos": true, "stream": true}),
    )
    .await;
    let events = a.events();
    assert_eq!(events.len(), 4);
    let last: Value = serde_json::from_str(&events[2]).unwrap();
    assert_eq!(last["object"], "text_completion");
    assert_eq!(last["choices"][0]["text"], " brown");
    assert_eq!(last["choices"][0]["finish_reason"], "length");
    assert_eq!(events[3], "[DONE]");
    assert_eq!(s.stats().prompt_tokens, 7);
}

#[tokio::test(start_paused = true)]
async fn mindie_generate_stream_reports_generated_tokens_in_details() {
    let s = sim(SimConfig::default()).await;
    let body = json!({"inputs": HELLO, "parameters": {"max_new_tokens": 4, "ignore_eos": true}});
    let a = post(s.addr(), "/generate_stream", body.clone()).await;
    let events = a.events();
    assert_eq!(events.len(), 4);
    let last: Value = serde_json::from_str(&events[3]).unwrap();
    assert_eq!(last["details"]["generated_tokens"], 4);
    assert_eq!(last["details"]["finish_reason"], "length");
    assert_eq!(last["generated_text"], text::completion_text(0, 4));
    let first: Value = serde_json::from_str(&events[0]).unwrap();
    assert_eq!(first["details"], Value::Null);

    let mut with_details = body.clone();
    with_details["parameters"]["details"] = json!(true);
    let g = post(s.addr(), "/generate", with_details).await.json();
    assert_eq!(g["details"]["generated_tokens"], 4);
    let infer = post(s.addr(), "/infer", body).await.json();
    assert_eq!(
        infer,
        json!({"generated_text": text::completion_text(0, 4)})
    );
    assert_eq!(s.stats().max_tokens, vec![Some(4); 3]);
}

#[tokio::test(start_paused = true)]
async fn missing_max_tokens_means_the_rest_of_the_context_and_overflow_is_400() {
    let mut cfg = SimConfig::default();
    cfg.engine.max_model_len = 40;
    let s = sim(cfg).await;
    let a = post(
        s.addr(),
        "/v1/completions",
        json!({"prompt": HELLO, "ignore_eos": true}),
    )
    .await;
    assert_eq!(a.json()["usage"]["completion_tokens"], 40 - 7);

    let over = post(
        s.addr(),
        "/v1/completions",
        json!({"prompt": HELLO, "max_tokens": 34}),
    )
    .await;
    assert_eq!(over.status, StatusCode::BAD_REQUEST);
    assert_eq!(over.json()["error"]["code"], "context_length_exceeded");
    assert_eq!(
        over.json()["error"]["message"],
        "This model's maximum context length is 40 tokens. However, you requested 41 tokens \
         (7 in the messages, 34 in the completion). Please reduce the length of the messages or \
         completion."
    );
    assert_eq!(s.stats().max_tokens, vec![None, Some(34)]);
}

#[tokio::test(start_paused = true)]
async fn sampled_lengths_are_seeded_and_capped_by_max_tokens() {
    let body = json!({"prompt": HELLO, "max_tokens": 40});
    let mut lengths = Vec::new();
    for _ in 0..2 {
        let s = sim(SimConfig::default()).await;
        let mut run = Vec::new();
        for _ in 0..5 {
            let v = post(s.addr(), "/v1/completions", body.clone()).await.json();
            let n = v["usage"]["completion_tokens"].as_u64().unwrap();
            let finish = if n == 40 { "length" } else { "stop" };
            assert_eq!(v["choices"][0]["finish_reason"], finish);
            assert!((1..=40).contains(&n));
            run.push(n);
        }
        lengths.push(run);
    }
    assert_eq!(lengths[0], lengths[1]);
    assert!(lengths[0].iter().any(|&n| n < 40));
}

#[tokio::test(start_paused = true)]
async fn injected_reset_cuts_the_stream_after_n_tokens_and_status_answers() {
    let s = sim(SimConfig {
        faults: Faults {
            fail_after_tokens: Some(3),
            ..Faults::default()
        },
        ..SimConfig::default()
    })
    .await;
    let body = chat(
        HELLO,
        json!({"max_tokens": 10, "ignore_eos": true, "stream": true}),
    );
    let a = post(s.addr(), "/v1/chat/completions", body.clone()).await;
    assert!(a.cut);
    // The role chunk and exactly three content chunks made it.
    assert_eq!(a.events().len(), 4);
    // Not streamed: the connection dies before the response head.
    let whole = exchange(
        s.addr(),
        "POST",
        "/v1/chat/completions",
        Some(chat(HELLO, json!({"max_tokens": 10, "ignore_eos": true}))),
    )
    .await;
    assert!(whole.unwrap_err().is_incomplete_message());

    s.set_faults(Faults {
        status: Some(503),
        retry_after: Some(Duration::from_millis(1500)),
        ..Faults::default()
    });
    let a = post(s.addr(), "/v1/chat/completions", body).await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(a.retry_after.as_deref(), Some("2"));
    assert_eq!(a.json()["error"]["code"], "injected_failure");
    // MindIE's native routes answer in TGI's shape.
    let g = post(s.addr(), "/generate", json!({"inputs": HELLO})).await;
    assert_eq!(g.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        g.json(),
        json!({"error": "the simulated backend was told to answer 503", "error_type": "injected_failure"})
    );
}

#[tokio::test(start_paused = true)]
async fn models_health_metrics_and_unknown_routes() {
    let s = sim(SimConfig::default()).await;
    let models = call(s.addr(), "GET", "/v1/models", None).await.json();
    assert_eq!(models["data"][0]["id"], "qwen3.5-27b");
    assert_eq!(models["data"][1]["id"], "Qwen/Qwen3.5-27B");
    assert_eq!(models["data"][0]["max_model_len"], 65_536);
    assert_eq!(
        call(s.addr(), "GET", "/health", None).await.status,
        StatusCode::OK
    );
    let wrong_model = post(
        s.addr(),
        "/v1/completions",
        json!({"model": "gpt-4", "prompt": "x"}),
    )
    .await;
    assert_eq!(wrong_model.status, StatusCode::NOT_FOUND);
    let second_name = post(
        s.addr(),
        "/v1/completions",
        json!({"model": "Qwen/Qwen3.5-27B", "prompt": "x", "max_tokens": 1}),
    )
    .await;
    assert_eq!(second_name.json()["model"], "qwen3.5-27b");
    assert_eq!(
        call(s.addr(), "GET", "/nope", None).await.status,
        StatusCode::NOT_FOUND
    );

    post(
        s.addr(),
        "/v1/completions",
        json!({"prompt": HELLO, "max_tokens": 6, "ignore_eos": true}),
    )
    .await;
    let metrics = call(s.addr(), "GET", "/metrics", None).await.body;
    for line in [
        "vllm:generation_tokens_total 7",
        "vllm:prompt_tokens_total 8",
        "vllm:num_preemptions_total 0",
        "vllm:num_requests_running 0",
        "vllm:time_to_first_token_seconds_count 2",
        "vllm:time_per_output_token_seconds_count 5",
        // Each request alone: its first token after one pass of 1 ms.
        "vllm:time_to_first_token_seconds_sum 0.002",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "{line} not in\n{metrics}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn roofline_engine_reports_simulated_times_at_any_time_scale() {
    let mut cfg = SimConfig::roofline_910b3();
    cfg.time_scale = 50.0;
    let s = sim(cfg).await;
    let prompt = text::completion_text(0, 3000);
    let a = post(
        s.addr(),
        "/v1/completions",
        json!({"prompt": prompt, "max_tokens": 2, "ignore_eos": true}),
    )
    .await;
    assert_eq!(a.json()["usage"]["prompt_tokens"], 3000);
    let metrics = call(s.addr(), "GET", "/metrics", None).await.body;
    let ttft = timing::Roofline::qwen35_27b_on_910b3().prefill(&[3000]);
    let line = format!(
        "vllm:time_to_first_token_seconds_sum {}",
        ttft.as_secs_f64()
    );
    assert!(
        metrics.lines().any(|l| l == line),
        "{line} not in\n{metrics}"
    );
}

#[tokio::test(start_paused = true)]
async fn it_says_the_tpot_slo_it_holds() {
    async fn slo(addr: SocketAddr, query: &str) -> Answer {
        call(addr, "GET", &format!("/sim/tpot-slo?{query}"), None).await
    }
    // One 910B3: a chat alone steps in 75 ms of weights + 0.09 ms of its KV heads (275 tokens,
    // one core a head) + 0.32 ms of state, over the article's 50 ms: it holds 100 ms.
    let one = sim(SimConfig::roofline_910b3()).await;
    let a = slo(one.addr(), "input_tokens=200&output_tokens=150").await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(
        a.json(),
        json!({"input_tokens": 200, "output_tokens": 150, "one_sequence_tpot_ms": 75.407787, "tpot_slo_ms": 100.0})
    );
    // 2,000,000 tokens do not fit in its 8 GB
    let big = slo(one.addr(), "output_tokens=1&input_tokens=2000000").await;
    assert_eq!(big.json()["tpot_slo_ms"], Value::Null);
    let missing = slo(one.addr(), "input_tokens=200").await;
    assert_eq!(
        (missing.status, missing.json()["error"]["message"].clone()),
        (StatusCode::BAD_REQUEST, json!("output_tokens is required"))
    );
    let bad = slo(one.addr(), "input_tokens=2x&output_tokens=1").await;
    assert_eq!(
        bad.json()["error"]["message"],
        "input_tokens must be a whole number of tokens, got \"2x\""
    );
    // two cards hold the article's 50 ms; the 1 ms fixed pace too
    let two = sim(SimConfig::roofline(
        timing::Roofline::from_names("910b3", "qwen3.5-27b", crate::capacity::StateDtype::Fp32, 2)
            .unwrap(),
    ))
    .await;
    let a = slo(two.addr(), "input_tokens=200&output_tokens=150").await;
    assert_eq!(a.json()["tpot_slo_ms"], 50.0);
    let paced = sim(SimConfig::default()).await;
    let a = slo(paced.addr(), "input_tokens=200&output_tokens=150").await;
    assert_eq!(
        (&a.json()["one_sequence_tpot_ms"], &a.json()["tpot_slo_ms"]),
        (&json!(1.0), &json!(50.0))
    );
}

#[tokio::test(start_paused = true)]
async fn serves_http2_with_prior_knowledge() {
    let s = sim(SimConfig::default()).await;
    let stream = tokio::net::TcpStream::connect(s.addr()).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let body = json!({"prompt": HELLO, "max_tokens": 2, "ignore_eos": true});
    let req = Request::post(format!("{}/v1/completions", s.url()))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.version(), ::http::Version::HTTP_2);
    let v: Value =
        serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 2);
}

#[tokio::test(start_paused = true)]
async fn a_client_that_goes_away_frees_its_sequence() {
    let s = sim(SimConfig::default()).await;
    let stream = tokio::net::TcpStream::connect(s.addr()).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    let conn = tokio::spawn(conn);
    let body = json!({"prompt": HELLO, "max_tokens": 1000, "ignore_eos": true, "stream": true});
    let req = Request::post("/v1/completions")
        .header("host", "sim")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let mut resp = sender.send_request(req).await.unwrap().into_body();
    // Read the first token, then hang up.
    let first = resp.frame().await.unwrap().unwrap();
    assert!(first.data_ref().is_some());
    assert_eq!(s.stats().engine.running, 1);
    drop(resp);
    drop(sender);
    conn.abort();
    // Drive the paused clock: the engine notices at its next pass (1 ms) and cancels.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let stats = s.stats();
    assert_eq!((stats.engine.running, stats.engine.waiting), (0, 0));
    assert!(stats.generated_tokens < 1000, "{}", stats.generated_tokens);
}
