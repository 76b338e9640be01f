//! The pooling routes end to end: `/v1/embeddings`, `/pooling`, `/score`, `/rerank` and
//! Cohere's `/v2/embed` go only to the backends declared `runner = "pooling"` (a simulated one here, which
//! counts as vLLM's pooling runner does), are charged their prompts exactly and no decode, hold
//! KV on the pooling backend alone while they run, and are refused, with nothing charged, when
//! no pooling backend is declared, the input is bad or the backend fails.

use super::mindie::start_sim;
use super::*;
use tokengate::config::Config;
use tokengate::sim::{Faults, SimConfig};

/// A gateway whose first backend generates (`generate`) and whose second pools (`pool`).
async fn two_backends() -> (
    TestGateway,
    tokengate::sim::SimHandle,
    tokengate::sim::SimHandle,
) {
    let generate = start_sim(SimConfig::pace(Duration::from_millis(1))).await;
    let pool = start_sim(SimConfig::pace(Duration::from_millis(1))).await;
    let text = config_text(&[generate.addr(), pool.addr()]).replacen(
        &format!("[[backends]]\nurl = \"http://{}\"\n", pool.addr()),
        &format!(
            "[[backends]]\nurl = \"http://{}\"\nrunner = \"pooling\"\n",
            pool.addr()
        ),
        1,
    );
    let config = Config::parse(&text).unwrap().into_inner();
    (TestGateway::start(config).await, generate, pool)
}

/// Waits until alice's request settles with `counted` prefill tokens, then checks her bucket
/// was charged exactly those.
async fn assert_alice_charged_prefill(gw: &TestGateway, counted: u64) {
    gw.wait_metric(
        r#"tokengate_prefill_tokens_total{tenant="alice"}"#,
        &counted.to_string(),
    )
    .await;
    assert_eq!(
        gw.bucket("alice", "prefill").await,
        10_000.0 - counted as f64
    );
}

#[tokio::test]
async fn embeddings_are_charged_their_prompts_on_the_pooling_backend_alone() {
    let (gw, generate, pool) = two_backends().await;
    let body =
        json!({"model": "qwen3.5-27b", "input": ["hello world", "What is the capital of France?"]});
    let r = post(&gw.url("/v1/embeddings"), "sk-alice", &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let tok = tokenizer();
    let counted = (tok.count("hello world") + tok.count("What is the capital of France?")) as u64;
    assert_eq!(r.json()["usage"]["prompt_tokens"], counted);
    assert_eq!(r.json()["data"].as_array().unwrap().len(), 2);
    assert_eq!((generate.stats().requests, pool.stats().requests), (0, 1));
    assert_alice_charged_prefill(&gw, counted).await;
    // Nothing is decoded: the decode bucket is untouched, and the lease is gone.
    assert_eq!(gw.bucket("alice", "decode").await, 1000.0);
    let backends = gw.admin("/admin/backends").await;
    let runners: Vec<_> = (backends["backends"].as_array().unwrap().iter())
        .map(|b| {
            (
                b["runner"].as_str().unwrap().to_owned(),
                b["kv_reserved_bytes"].as_u64(),
            )
        })
        .collect();
    assert_eq!(
        runners,
        [
            ("generate".to_owned(), Some(0)),
            ("pooling".to_owned(), Some(0))
        ]
    );

    // A conversation, rendered without an assistant turn; a chat still goes to the generator.
    let conv =
        json!({"model": "qwen3.5-27b", "messages": [{"role": "user", "content": "hello world"}]});
    let r = post(&gw.url("/pooling"), "sk-bob", &conv).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let rendered = format!("{USER_FRAME}hello world<|im_end|>\n");
    assert_eq!(
        r.json()["usage"]["prompt_tokens"],
        tok.count(&rendered) as u64
    );
    let r = gw.chat("sk-bob", &chat("hi", 5, false)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!((generate.stats().requests, pool.stats().requests), (1, 2));
}

#[tokio::test]
async fn a_rerank_is_charged_its_query_once_and_each_document() {
    let (gw, _generate, _pool) = two_backends().await;
    let body = json!({"model": "qwen3.5-27b", "query": "hello world",
        "documents": ["What is the capital of France?", "Paris"], "top_n": 1});
    let r = post(&gw.url("/v1/rerank"), "sk-alice", &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let tok = tokenizer();
    let counted = ["hello world", "What is the capital of France?", "Paris"]
        .map(|t| tok.count(t) as u64)
        .iter()
        .sum::<u64>();
    assert_eq!(r.json()["usage"]["prompt_tokens"], counted);
    assert_eq!(r.json()["results"].as_array().unwrap().len(), 1);
    assert_alice_charged_prefill(&gw, counted).await;
    // A cut prompt is charged the cut.
    let cut = json!({"model": "qwen3.5-27b", "input": "What is the capital of France?",
        "truncate_prompt_tokens": 3});
    let r = post(&gw.url("/v1/embeddings"), "sk-bob", &cut).await;
    assert_eq!(r.json()["usage"]["prompt_tokens"], 3);
    gw.wait_metric(r#"tokengate_prefill_tokens_total{tenant="bob"}"#, "3")
        .await;
}

#[tokio::test]
async fn a_score_is_charged_its_texts_as_the_engine_cuts_each() {
    let (gw, _generate, pool) = two_backends().await;
    // "hello there my friend" is 4 tokens, cut to 3; "東京から大阪まで新幹線で" to 4 tokens
    // ("東京から大阪まで"), "Paris" (1 token) is not cut.
    let body = json!({"model": "qwen3.5-27b", "queries": "hello there my friend",
        "documents": ["東京から大阪まで新幹線で", "Paris"], "max_tokens_per_query": 3,
        "max_tokens_per_doc": "4"});
    let r = post(&gw.url("/v1/score"), "sk-alice", &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let tok = tokenizer();
    assert_eq!(
        ["hello there my", "東京から大阪まで", "Paris"].map(|t| tok.count(t)),
        [3, 4, 1]
    );
    assert_eq!(r.json()["usage"]["prompt_tokens"], 8);
    assert_alice_charged_prefill(&gw, 8).await;
    // A document whose first token is part of a character is cut to nothing, which the engine
    // refuses: refused here, nothing charged, nothing sent.
    let to_nothing = json!({"model": "qwen3.5-27b", "query": "q",
        "documents": ["👩\u{200d}💻 at work"], "max_tokens_per_doc": 1});
    let r = post(&gw.url("/rerank"), "sk-bob", &to_nothing).await;
    assert_eq!(
        (r.status, r.json()["error"]["param"].as_str()),
        (400, Some("max_tokens_per_doc")),
        "{}",
        r.text()
    );
    assert_eq!(gw.bucket("bob", "prefill").await, 10_000.0);
    assert_eq!(pool.stats().requests, 1);
}

/// Cohere's embed (`/v2/embed`): each text, or each input's text parts as a user turn, is a
/// prompt; the answer's billed input tokens settle; `max_tokens` cuts each prompt, or, with
/// `truncate: "NONE"`, refuses a longer one before anything is charged or sent.
#[tokio::test]
async fn a_cohere_embed_is_charged_its_texts_and_refused_past_max_tokens_before_running() {
    let (gw, _generate, pool) = two_backends().await;
    let tok = tokenizer();
    let texts = ["hello world", "What is the capital of France?"];
    let body =
        json!({"model": "qwen3.5-27b", "texts": texts, "embedding_types": ["float", "ubinary"]});
    let r = post(&gw.url("/v2/embed"), "sk-alice", &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let counted = texts.map(|t| tok.count(t) as u64).iter().sum::<u64>();
    let answer = r.json();
    assert_eq!(
        (
            &answer["meta"]["billed_units"]["input_tokens"],
            answer["embeddings"]["float"].as_array().map(Vec::len),
            answer["embeddings"]["ubinary"].as_array().map(Vec::len),
            &answer["texts"],
        ),
        (&json!(counted), Some(2), Some(2), &json!(texts))
    );
    assert_alice_charged_prefill(&gw, counted).await;
    // An input of text parts is one user turn; cut to 3 tokens at the start.
    let input = json!({"model": "qwen3.5-27b", "inputs": [{"content": [
        {"type": "text", "text": "hello"}, {"type": "text", "text": "world"}]}],
        "truncate": "START", "max_tokens": 3});
    let r = post(&gw.url("/v2/embed"), "sk-bob", &input).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["meta"]["billed_units"]["input_tokens"], 3);
    gw.wait_metric(r#"tokengate_prefill_tokens_total{tenant="bob"}"#, "3")
        .await;
    // Not cut, and longer than max_tokens: refused as vLLM refuses it once it has run them,
    // here before anything is charged or sent.
    let sent = pool.stats().requests;
    let long = json!({"model": "qwen3.5-27b", "texts": texts, "truncate": "NONE", "max_tokens": 3});
    let r = post(&gw.url("/v2/embed"), "sk-bob", &long).await;
    let n = tok.count(texts[1]);
    assert_eq!(
        (r.status, &r.json()["error"]["message"], &r.json()["error"]["param"]),
        (
            400,
            &json!(format!("Input of {n} tokens exceeds max_tokens=3 with truncate=NONE. Set truncate to END or START to allow truncation.")),
            &json!("max_tokens")
        )
    );
    assert_eq!(gw.bucket("bob", "prefill").await, 10_000.0 - 3.0);
    assert_eq!(pool.stats().requests, sent);
}

#[tokio::test]
async fn pooling_is_refused_with_nothing_charged_without_a_pooling_backend_on_bad_input_or_a_failing_one(
) {
    let sim = start_sim(SimConfig::pace(Duration::from_millis(1))).await;
    let gw = TestGateway::start(config(&[sim.addr()])).await;
    let body = json!({"model": "qwen3.5-27b", "input": "hi"});
    let r = post(&gw.url("/v1/embeddings"), "sk-alice", &body).await;
    assert_eq!((r.status, r.code()), (404, "not_found".to_owned()));
    assert_eq!(
        r.json()["error"]["message"],
        "no backend serves /v1/embeddings: it needs a pooling backend (`runner = \"pooling\"` in [[backends]])"
    );
    assert_nothing_charged(&gw).await;
    assert_eq!(sim.stats().requests, 0);

    let (gw, _generate, pool) = two_backends().await;
    let uneven = json!({"model": "qwen3.5-27b", "queries": ["a", "b"], "documents": ["c"]});
    let r = post(&gw.url("/score"), "sk-alice", &uneven).await;
    assert_eq!(
        (r.status, r.json()["error"]["param"].as_str()),
        (400, Some("queries"))
    );
    let long = json!({"model": "qwen3.5-27b", "input": "hi ".repeat(5000)});
    let r = post(&gw.url("/v1/embeddings"), "sk-alice", &long).await;
    assert_eq!(
        (r.status, r.code()),
        (400, "context_length_exceeded".to_owned())
    );
    pool.set_faults(Faults {
        status: Some(500),
        ..Faults::default()
    });
    let r = post(&gw.url("/v1/embeddings"), "sk-alice", &body).await;
    assert_eq!(r.status, 502, "{}", r.text());
    assert_nothing_charged(&gw).await;
    assert_eq!(gw.kv_reserved(1).await, 0);
    assert_eq!(pool.stats().requests, 1);
}
