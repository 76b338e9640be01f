//! Settlement end to end: what stays charged once a request was forwarded, however it ends,
//! and what the usage log bills for it.

use super::profile::fixed;
use super::*;

/// `cfg` writing its usage log to `dir`.
fn log_usage(cfg: &mut tokengate::config::Config, dir: &TempDir) {
    cfg.usage_log = Some(tokengate::usage_log::UsageLogConfig {
        path: dir.0.join("usage.jsonl").display().to_string(),
        buffer_records: 16,
    });
}

/// A gateway in front of a fake backend that writes its usage log to `dir`.
async fn logged_gateway(
    spec: FakeSpec,
    dir: &TempDir,
    tweak: impl FnOnce(&mut tokengate::config::Config),
) -> (TestGateway, FakeBackend) {
    gateway_with(spec, |cfg| {
        log_usage(cfg, dir);
        tweak(cfg);
    })
    .await
}

/// The usage log's lines, once everything settled so far is written.
async fn usage_lines(gw: &TestGateway, dir: &TempDir) -> Vec<Value> {
    gw.running
        .gateway
        .recorder
        .flush(Duration::from_secs(10))
        .await;
    let text = std::fs::read_to_string(dir.0.join("usage.jsonl")).unwrap();
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Buying prefill by hanging up: the backend has the request (its stream's headers sent, no
/// token yet) when the client goes. Its prompt stays charged and is billed; the decode
/// reserved comes back whole, since it left well within one TPOT (`tpot_slo_ms`, 60 s here:
/// the decode floor of what the backend ran is none).
#[tokio::test]
async fn a_stream_left_before_its_first_token_keeps_its_prefill_charged_and_billed() {
    let dir = TempDir::new("settle-left-early");
    let spec = FakeSpec {
        behaviour: Behaviour::StallAfterHeaders,
        ..FakeSpec::default()
    };
    let (gw, backend) = logged_gateway(spec, &dir, |cfg| {
        cfg.backends[0].tpot_slo_ms = Some(60_000.0);
    })
    .await;
    let client = spawn_post(
        &gw.url("/v1/chat/completions"),
        "sk-alice",
        chat("a", 10, true),
    );
    backend.wait_held(1).await;
    client.abort();
    gw.wait_metric(
        "tokengate_requests_total{tenant=\"alice\",outcome=\"client_disconnect\"}",
        "1",
    )
    .await;
    assert_only_prefill_charged(&gw, chat_tokens("a")).await;
    let refunded = r#"tokengate_decode_tokens_refunded_total{tenant="alice"}"#;
    assert_eq!(gw.metric(refunded).await.as_deref(), Some("10"));
    let lines = usage_lines(&gw, &dir).await;
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(
        fixed(lines[0].clone(), &[]),
        json!({"tenant": "alice", "model": "qwen3.5-27b", "outcome": "client_disconnect",
               "answered": false, "billable": true, "prompt_tokens": chat_tokens("a"),
               "counted_prompt_tokens": chat_tokens("a"), "cached_prompt_tokens": null,
               "reserved_output_tokens": 10, "output_tokens": 0, "refunded_output_tokens": 10,
               "cost": null, "currency": null})
    );
}

/// A whole answer of 2 choices the backend is still working on when `first_byte_timeout`
/// passes: a 504, and the prompt it was given stays charged, with the decode floor of the
/// time it ran: 2 sequences x 5 TPOTs = 10 of the 20 decode tokens reserved (before, all 20
/// went back: a tenant ran decode for the price of its prompts). Its usage-log line bills it
/// with that charge, and its outcome is counted once.
#[tokio::test]
async fn a_whole_answer_slower_than_the_first_byte_timeout_is_charged_its_prefill_and_decode_floor()
{
    let dir = TempDir::new("settle-first-byte");
    let (gw, backend) = logged_gateway(FakeSpec::held(), &dir, |cfg| {
        cfg.backends[0].first_byte_timeout = RUNS;
        cfg.backends[0].tpot_slo_ms = Some(FLOOR_TPOT_MS);
    })
    .await;
    let mut body = chat("a", 10, false);
    body["n"] = json!(2);
    let r = chat_within_10s(&gw, &body, "the gateway gives up").await;
    assert_eq!(
        r.json(),
        json!({"error": {"message": "the backend did not answer within 2s 750ms",
            "type": "server_error", "param": null, "code": "upstream_timeout"}})
    );
    assert_eq!(*backend.held.borrow(), 1, "the backend had the request");
    assert_prefill_and_decode_charged(&gw, chat_tokens("a"), 10).await;
    let lines = usage_lines(&gw, &dir).await;
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(
        fixed(lines[0].clone(), &[]),
        json!({"tenant": "alice", "model": "qwen3.5-27b", "outcome": "upstream_timeout",
               "answered": false, "billable": true, "prompt_tokens": chat_tokens("a"),
               "counted_prompt_tokens": chat_tokens("a"), "cached_prompt_tokens": null,
               "reserved_output_tokens": 20, "output_tokens": 10, "refunded_output_tokens": 10,
               "cost": null, "currency": null})
    );
    let counted = r#"tokengate_requests_total{tenant="alice",outcome="upstream_timeout"}"#;
    assert_eq!(gw.metric(counted).await.as_deref(), Some("1"));
}

/// A whole answer of 4 choices whose client leaves after 2.75 s, the backend still working: the
/// request settles as a disconnect with its prompt and the decode floor of the time the
/// backend ran charged, 4 sequences x 5 TPOTs = 20 of the 400 reserved (before: none).
#[tokio::test]
async fn a_whole_answer_left_by_its_client_is_charged_the_decode_floor_of_its_sequences() {
    let (gw, backend) = gateway_with(FakeSpec::held(), |cfg| {
        cfg.backends[0].tpot_slo_ms = Some(FLOOR_TPOT_MS);
    })
    .await;
    let mut body = chat("a", 100, false);
    body["n"] = json!(4);
    let left = tokio::time::timeout(RUNS, gw.chat("sk-alice", &body)).await;
    assert!(left.is_err(), "the backend holds the answer");
    assert_eq!(*backend.held.borrow(), 1, "the backend had the request");
    gw.wait_metric(
        r#"tokengate_requests_total{tenant="alice",outcome="client_disconnect"}"#,
        "1",
    )
    .await;
    assert_prefill_and_decode_charged(&gw, chat_tokens("a"), 20).await;
    let refunded = r#"tokengate_decode_tokens_refunded_total{tenant="alice"}"#;
    assert_eq!(gw.metric(refunded).await.as_deref(), Some("380"));
}

/// A backend that takes the request and breaks the connection before answering failed it:
/// forwarded or not, nothing stays charged or billed.
#[tokio::test]
async fn a_backend_that_breaks_before_answering_bills_nothing() {
    let dir = TempDir::new("settle-reset");
    let spec = FakeSpec {
        behaviour: Behaviour::ResetAfter(0),
        ..FakeSpec::default()
    };
    let (gw, backend) = logged_gateway(spec, &dir, |_| {}).await;
    let r = gw.chat("sk-alice", &chat("a", 10, true)).await;
    assert_eq!((r.status, r.code().as_str()), (502, "upstream_error"));
    assert_eq!(backend.seen.lock().unwrap().len(), 1, "it had the request");
    assert_nothing_charged(&gw).await;
    let lines = usage_lines(&gw, &dir).await;
    assert_eq!(
        (&lines[0]["answered"], &lines[0]["billable"]),
        (&json!(false), &json!(false))
    );
}

/// A stream cut by the client after 59 `delta.reasoning` events (vLLM 0.32 with
/// `--reasoning-parser qwen3` and thinking on sends the whole answer there, `content` absent):
/// no usage came, so the 59 tokens delivered are counted from their text, charged and billed.
#[tokio::test]
async fn a_reasoning_stream_cut_by_the_client_is_charged_what_it_delivered() {
    let dir = TempDir::new("settle-reasoning-cut");
    let spec = FakeSpec {
        reasoning: true,
        hold_after: 59,
        ..FakeSpec::held()
    };
    let (gw, _backend) = logged_gateway(spec, &dir, |_| {}).await;
    let url = gw.url("/v1/chat/completions");
    let client = tokio::spawn(async move {
        let body = chat("a", 100, true).to_string().into_bytes();
        let headers = [
            ("content-type", "application/json"),
            ("authorization", "Bearer sk-alice"),
        ];
        let resp = start_request(&url, "POST", Some(body), &headers).await;
        let mut body = resp.into_body();
        use http_body_util::BodyExt;
        let mut read = Vec::new();
        while sse_data(&read).len() < 59 {
            let frame = body.frame().await.unwrap().unwrap();
            read.extend_from_slice(&frame.into_data().unwrap());
        }
        sse_data(&read)
        // dropping `body` closes the connection
    });
    let data = client.await.unwrap();
    assert_eq!(data.len(), 59);
    let last: Value = serde_json::from_str(&data[58]).unwrap();
    assert_eq!(last["choices"][0]["delta"]["reasoning"], WORD);
    assert_eq!(tokenizer().count(&WORD.repeat(59)), 59);
    gw.wait_metric(
        "tokengate_requests_total{tenant=\"alice\",outcome=\"client_disconnect\"}",
        "1",
    )
    .await;
    assert_eq!(gw.bucket("alice", "decode").await, 941.0);
    let lines = usage_lines(&gw, &dir).await;
    assert_eq!(
        fixed(lines[0].clone(), &["ttft_ms", "tpot_ms"]),
        json!({"tenant": "alice", "model": "qwen3.5-27b", "outcome": "client_disconnect",
               "answered": true, "billable": true, "prompt_tokens": chat_tokens("a"),
               "counted_prompt_tokens": chat_tokens("a"), "cached_prompt_tokens": null,
               "reserved_output_tokens": 100, "output_tokens": 59, "refunded_output_tokens": 41,
               "cost": null, "currency": null})
    );
}

/// A client that closes as soon as it has read `[DONE]`, before the backend ended its body:
/// the answer was whole, so the request is answered and billed as such, not a disconnect.
#[tokio::test]
async fn a_client_that_closes_right_after_done_is_recorded_as_answered() {
    let dir = TempDir::new("settle-after-done");
    let spec = FakeSpec {
        behaviour: Behaviour::OpenAfterDone,
        ..FakeSpec::default()
    };
    let (gw, _backend) = logged_gateway(spec, &dir, |_| {}).await;
    let url = gw.url("/v1/chat/completions");
    let data = tokio::spawn(async move {
        let body = chat("a", 5, true).to_string().into_bytes();
        let headers = [
            ("content-type", "application/json"),
            ("authorization", "Bearer sk-alice"),
        ];
        let resp = start_request(&url, "POST", Some(body), &headers).await;
        let mut body = resp.into_body();
        use http_body_util::BodyExt;
        let mut read = Vec::new();
        while sse_data(&read).last().map(String::as_str) != Some("[DONE]") {
            let frame = body.frame().await.unwrap().unwrap();
            read.extend_from_slice(&frame.into_data().unwrap());
        }
        sse_data(&read)
        // dropping `body` closes the connection while the backend's is still open
    })
    .await
    .unwrap();
    // Five tokens and `[DONE]` (the usage the gateway asked for is not the client's).
    assert_eq!((data.len(), data[5].as_str()), (6, "[DONE]"));
    gw.wait_metric(
        "tokengate_requests_total{tenant=\"alice\",outcome=\"ok\"}",
        "1",
    )
    .await;
    assert_eq!(
        gw.metric("tokengate_requests_total{tenant=\"alice\",outcome=\"client_disconnect\"}")
            .await,
        None
    );
    assert_eq!(gw.bucket("alice", "decode").await, 995.0);
    let lines = usage_lines(&gw, &dir).await;
    assert_eq!(
        (
            &lines[0]["outcome"],
            &lines[0]["output_tokens"],
            &lines[0]["answered"]
        ),
        (&json!("ok"), &json!(5), &json!(true))
    );
}

/// A whole answer that is reasoning alone (`message.reasoning`, `content` null) from a backend
/// that sends no usage: its reasoning is the output counted.
#[tokio::test]
async fn a_whole_answer_of_reasoning_without_usage_is_counted_from_its_reasoning() {
    let (gw, _backend) = gateway(FakeSpec {
        reasoning: true,
        usage: false,
        ..FakeSpec::default()
    })
    .await;
    let r = gw.chat("sk-alice", &chat("a", 7, false)).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["choices"][0]["message"]["content"], Value::Null);
    gw.wait_metric(r#"tokengate_decode_tokens_total{tenant="alice"}"#, "7")
        .await;
    gw.wait_bucket("alice", "decode", 993.0).await;
}

/// `tokengate_count_error_tokens`' `_sum` and `_count` of `kind` for the gateway's backend.
async fn count_error(gw: &TestGateway, backend: &FakeBackend, kind: &str) -> (String, String) {
    let labels = format!(r#"{{backend="http://{}",kind="{kind}"}}"#, backend.addr);
    let sum = gw
        .metric(&format!("tokengate_count_error_tokens_sum{labels}"))
        .await;
    let count = gw
        .metric(&format!("tokengate_count_error_tokens_count{labels}"))
        .await;
    (sum.unwrap_or_default(), count.unwrap_or_default())
}

/// The backend counted the prompt 5 tokens longer than the gateway (a template that changed):
/// the 5 are charged after the fact, the line bills the backend's count, and the difference is
/// exported for the backend.
#[tokio::test]
async fn a_prompt_the_backend_counted_longer_is_charged_its_count_and_exported() {
    let dir = TempDir::new("settle-counted-longer");
    let counted = chat_tokens("a");
    let spec = FakeSpec {
        prompt_tokens: Some(counted + 5),
        ..FakeSpec::default()
    };
    let (gw, backend) = logged_gateway(spec, &dir, |_| {}).await;
    let r = gw.chat("sk-alice", &chat("a", 10, false)).await;
    assert_eq!(r.status, 200);
    gw.wait_metric(
        "tokengate_requests_total{tenant=\"alice\",outcome=\"ok\"}",
        "1",
    )
    .await;
    assert_eq!(
        gw.bucket("alice", "prefill").await,
        10_000.0 - (counted + 5) as f64
    );
    assert_eq!(gw.bucket("alice", "decode").await, 990.0);
    let sum_count = |s: &str, c: &str| (s.to_string(), c.to_string());
    assert_eq!(
        count_error(&gw, &backend, "prompt").await,
        sum_count("5.0", "1")
    );
    // A whole answer has no count of the gateway's own to compare its output with.
    assert_eq!(
        count_error(&gw, &backend, "output").await,
        sum_count("", "")
    );
    let lines = usage_lines(&gw, &dir).await;
    assert_eq!(
        (
            &lines[0]["prompt_tokens"],
            &lines[0]["counted_prompt_tokens"],
            &lines[0]["cached_prompt_tokens"]
        ),
        (&json!(counted + 5), &json!(counted), &Value::Null)
    );
}

/// The backend counted a streamed prompt 3 tokens shorter: they come back at settlement. Its
/// output count equals the events that carried text: exported as no difference.
#[tokio::test]
async fn a_prompt_the_backend_counted_shorter_gives_the_difference_back() {
    let counted = chat_tokens("a");
    let (gw, backend) = gateway(FakeSpec {
        prompt_tokens: Some(counted - 3),
        ..FakeSpec::default()
    })
    .await;
    let r = gw.chat("sk-alice", &chat("a", 10, true)).await;
    assert_eq!(r.status, 200);
    gw.wait_metric(
        "tokengate_requests_total{tenant=\"alice\",outcome=\"ok\"}",
        "1",
    )
    .await;
    assert_eq!(
        gw.bucket("alice", "prefill").await,
        10_000.0 - (counted - 3) as f64
    );
    let prompt = count_error(&gw, &backend, "prompt").await;
    assert_eq!((prompt.0.as_str(), prompt.1.as_str()), ("-3.0", "1"));
    let output = count_error(&gw, &backend, "output").await;
    assert_eq!((output.0.as_str(), output.1.as_str()), ("0.0", "1"));
}

/// vLLM with `--enable-prompt-tokens-details` says 96 of the prompt's tokens were in its
/// prefix cache (6 blocks of 16): they are charged at `limiter.cached_prefill_weight` (0.25
/// here: 24 tokens), the rest in full.
#[tokio::test]
async fn cached_prompt_tokens_are_charged_at_their_weight() {
    let dir = TempDir::new("settle-cached");
    let content = "a ".repeat(120).trim_end().to_string();
    let counted = chat_tokens(&content);
    assert!(counted > 96, "{counted}");
    let spec = FakeSpec {
        prompt_tokens: Some(counted),
        cached_tokens: Some(96),
        ..FakeSpec::default()
    };
    let (gw, _backend) = logged_gateway(spec, &dir, |cfg| {
        cfg.limiter.cached_prefill_weight = 0.25;
    })
    .await;
    let r = gw.chat("sk-alice", &chat(&content, 10, true)).await;
    assert_eq!(r.status, 200);
    gw.wait_metric(
        "tokengate_requests_total{tenant=\"alice\",outcome=\"ok\"}",
        "1",
    )
    .await;
    assert_eq!(
        gw.bucket("alice", "prefill").await,
        10_000.0 - (counted - 96 + 24) as f64
    );
    let lines = usage_lines(&gw, &dir).await;
    assert_eq!(
        (
            &lines[0]["prompt_tokens"],
            &lines[0]["counted_prompt_tokens"],
            &lines[0]["cached_prompt_tokens"]
        ),
        (&json!(counted), &json!(counted), &json!(96))
    );
}

/// The simulator started with vLLM's flags (`--reasoning-parser qwen3
/// --enable-prompt-tokens-details`) behind the gateway: a thinking chat's answer, half of it
/// `delta.reasoning`, is metered whole; the same chat again finds its prompt in the prefix cache
/// (all but its last token, in whole 16-token blocks) and is charged it at
/// `limiter.cached_prefill_weight`.
#[tokio::test]
async fn in_front_of_the_simulator_reasoning_is_metered_and_a_cached_prompt_charged_at_its_weight()
{
    use tokengate::sim::SimConfig;
    let dir = TempDir::new("settle-sim");
    let sim = super::mindie::start_sim(SimConfig {
        reasoning_parser: true,
        prompt_tokens_details: true,
        ..SimConfig::pace(Duration::from_millis(1))
    })
    .await;
    let mut cfg = config(&[sim.addr()]);
    log_usage(&mut cfg, &dir);
    let gw = TestGateway::start(cfg).await;
    let content = "a ".repeat(120).trim_end().to_string();
    let prompt = chat_tokens(&content);
    let mut body = chat(&content, 10, true);
    body["ignore_eos"] = json!(true);
    let r = gw.chat("sk-alice", &body).await;
    assert_eq!(r.status, 200);
    let deltas: Vec<Value> = sse_data(&r.body)
        .iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .map(|c| c["choices"][0]["delta"].clone())
        .filter(|d| d.get("role").is_none())
        .collect();
    let reasoning = deltas.iter().filter(|d| d.get("reasoning").is_some());
    assert_eq!((reasoning.count(), deltas.len()), (5, 10), "{deltas:?}");
    body["stream"] = json!(false);
    let r = gw.chat("sk-alice", &body).await;
    assert_eq!(r.status, 200);
    let cached = (prompt - 1) / 16 * 16;
    gw.wait_metric(
        "tokengate_requests_total{tenant=\"alice\",outcome=\"ok\"}",
        "2",
    )
    .await;
    let lines = usage_lines(&gw, &dir).await;
    let seen: Vec<_> = lines
        .iter()
        .map(|l| {
            (
                l["prompt_tokens"].clone(),
                l["cached_prompt_tokens"].clone(),
                l["output_tokens"].clone(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            (json!(prompt), json!(0), json!(10)),
            (json!(prompt), json!(cached), json!(10)),
        ]
    );
    // The second prompt: what was not cached, and a tenth of a token per cached one.
    let weighted = (cached as f64 * 0.1).ceil() as u64;
    assert_eq!(
        gw.bucket("alice", "prefill").await,
        10_000.0 - (prompt + prompt - cached + weighted) as f64
    );
}

/// `n` choices: the decode reservation and the KV footprint are `n` sequences', the
/// backend is asked for each choice's share, and what every choice generated is charged,
/// whole or streamed; more choices than any backend's batch is a 400 naming `n`.
#[tokio::test]
async fn n_choices_are_reserved_admitted_and_metered_as_n_sequences() {
    use tokengate::sim::SimConfig;
    let dir = TempDir::new("settle-n");
    let sim = super::mindie::start_sim(SimConfig::pace(Duration::from_millis(1))).await;
    let mut cfg = config(&[sim.addr()]);
    log_usage(&mut cfg, &dir);
    cfg.backends[0].max_batch = Some(4);
    let gw = TestGateway::start(cfg).await;
    let prompt = chat_tokens("hi");
    let mut body = chat("hi", 10, false);
    body["n"] = json!(3);
    body["ignore_eos"] = json!(true);
    let r = gw.chat("sk-alice", &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    // Charged 3 x 10 decode tokens up front.
    assert_eq!(r.headers["x-ratelimit-remaining-tokens"], "970");
    let answer = r.json();
    let indexes: Vec<Value> = (answer["choices"].as_array().unwrap().iter())
        .map(|c| c["index"].clone())
        .collect();
    assert_eq!(indexes, [json!(0), json!(1), json!(2)]);
    assert_eq!(answer["usage"]["completion_tokens"], 30);
    // Streamed: every choice's tokens are counted.
    body["stream"] = json!(true);
    body["n"] = json!(2);
    body["max_tokens"] = json!(5);
    let r = gw.chat("sk-alice", &body).await;
    assert_eq!(r.status, 200);
    let deltas = sse_data(&r.body)
        .iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .is_some_and(|t| !t.is_empty())
        })
        .count();
    assert_eq!(deltas, 10);
    gw.wait_metric(
        "tokengate_requests_total{tenant=\"alice\",outcome=\"ok\"}",
        "2",
    )
    .await;
    let lines = usage_lines(&gw, &dir).await;
    let seen: Vec<_> = (lines.iter())
        .map(|l| {
            (
                l["prompt_tokens"].clone(),
                l["reserved_output_tokens"].clone(),
                l["output_tokens"].clone(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            (json!(prompt), json!(30), json!(30)),
            (json!(prompt), json!(10), json!(10)),
        ]
    );
    // The backend was asked for each choice's share of the reservation.
    assert_eq!(sim.stats().max_tokens, [Some(10), Some(5)]);
    assert_eq!(gw.bucket("alice", "decode").await, 1000.0 - 40.0);
    assert_eq!(gw.kv_reserved(0).await, 0);
    // Five choices on a batch of four: the engine runs them in turns, the request holding
    // the whole batch while it runs.
    body["n"] = json!(5);
    let r = gw.chat("sk-alice", &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let choices: std::collections::BTreeSet<u64> = sse_data(&r.body)
        .iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|c| c["choices"][0]["index"].as_u64())
        .collect();
    assert_eq!(choices.len(), 5);
    gw.wait_metric(
        "tokengate_requests_total{tenant=\"alice\",outcome=\"ok\"}",
        "3",
    )
    .await;
    assert_eq!(gw.kv_reserved(0).await, 0);
    assert_eq!(gw.bucket("alice", "decode").await, 1000.0 - 40.0 - 25.0);
    // A sheddable request may hold half the batch: never, whatever the bytes.
    let r = post_as(
        &gw.url("/v1/chat/completions"),
        "sk-alice",
        "sheddable",
        &body,
    )
    .await;
    assert_eq!((r.status, r.code().as_str()), (400, "exceeds_kv_capacity"));
    assert_eq!(r.json()["error"]["param"], "n");
    assert_eq!(
        r.json()["error"]["message"],
        "the request runs 5 sequences (`n` choices), more than a sheddable request may run at once on any backend (largest: 2) (admission.sheddable_share = 0.5; more sequences than a backend's whole batch run in turns only in a class that may hold all of it); lower n"
    );
    assert_eq!(gw.bucket("alice", "decode").await, 1000.0 - 40.0 - 25.0);
}

/// A list of prompts to `/v1/completions`: each prompt counted and charged, every
/// prompt's choices reserved and admitted as sequences, the backend's usage for them all
/// settling the charge; a batch past the prefill burst is refused whole.
#[tokio::test]
async fn a_batch_of_prompts_is_counted_charged_and_admitted_prompt_by_prompt() {
    use tokengate::sim::SimConfig;
    let dir = TempDir::new("settle-batch");
    let sim = super::mindie::start_sim(SimConfig::pace(Duration::from_millis(1))).await;
    let mut cfg = config(&[sim.addr()]);
    log_usage(&mut cfg, &dir);
    cfg.backends[0].max_batch = Some(4);
    let gw = TestGateway::start(cfg).await;
    let prompts = ["Once upon a time", "The capital of France is"];
    let counts: Vec<u64> = prompts
        .iter()
        .map(|p| tokenizer().count(p) as u64)
        .collect();
    let body = json!({"model": "qwen3.5-27b", "prompt": prompts, "max_tokens": 5, "n": 2, "ignore_eos": true});
    let r = post(&gw.url("/v1/completions"), "sk-alice", &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    // 2 prompts x 2 choices x 5 tokens reserved.
    assert_eq!(r.headers["x-ratelimit-remaining-tokens"], "980");
    assert_eq!(r.json()["choices"].as_array().unwrap().len(), 4);
    assert_eq!(r.json()["usage"]["completion_tokens"], 20);
    gw.wait_metric(
        "tokengate_requests_total{tenant=\"alice\",outcome=\"ok\"}",
        "1",
    )
    .await;
    let line = &usage_lines(&gw, &dir).await[0];
    let total: u64 = counts.iter().sum();
    assert_eq!(
        (
            line["counted_prompt_tokens"].clone(),
            line["prompt_tokens"].clone(),
            line["reserved_output_tokens"].clone(),
            line["output_tokens"].clone()
        ),
        (json!(total), json!(total), json!(20), json!(20))
    );
    assert_eq!(gw.bucket("alice", "prefill").await, 10_000.0 - total as f64);
    assert_eq!(sim.stats().max_tokens, [Some(5)]);
    // Three prompts of two choices: six sequences, more than the batch of four. The engine
    // runs them in turns: admitted holding the whole batch, and served.
    let body = json!({"model": "qwen3.5-27b", "prompt": ["a", "b", "c"], "max_tokens": 5, "n": 2});
    let r = post(&gw.url("/v1/completions"), "sk-alice", &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["choices"].as_array().unwrap().len(), 6);
    let mut served = vec![r.json()["usage"].clone()];
    // Lowered to sheddable (half the batch may be held), they are refused: `n`, or, with one
    // choice of each prompt, the prompts are what to lower, and the refusal says so; so for
    // five conversations in a batch of chats, and five items to score.
    let sheddable = |path: &str, body: Value| {
        let url = gw.url(path);
        async move { post_as(&url, "sk-alice", "sheddable", &body).await }
    };
    let r = sheddable("/v1/completions", body).await;
    assert_eq!((r.status, r.code().as_str()), (400, "exceeds_kv_capacity"));
    assert_eq!(r.json()["error"]["param"], "n");
    let over = "more than a sheddable request may run at once on any backend (largest: 2) (admission.sheddable_share = 0.5; more sequences than a backend's whole batch run in turns only in a class that may hold all of it)";
    let five = ["a", "b", "c", "d", "e"];
    let body = json!({"model": "qwen3.5-27b", "prompt": five, "max_tokens": 5});
    let r = sheddable("/v1/completions", body).await;
    assert_eq!((r.status, r.code().as_str()), (400, "exceeds_kv_capacity"));
    assert_eq!(
        (&r.json()["error"]["param"], &r.json()["error"]["message"]),
        (
            &json!("prompt"),
            &json!(format!(
                "the request runs 5 sequences (its 5 prompts), {over}; send fewer prompts"
            ))
        )
    );
    let conversations: Vec<Value> = (five.iter())
        .map(|p| json!([{"role": "user", "content": p}]))
        .collect();
    let body = json!({"model": "qwen3.5-27b", "messages": conversations, "max_tokens": 5});
    let r = sheddable("/v1/chat/completions/batch", body.clone()).await;
    assert_eq!(
        (&r.json()["error"]["param"], &r.json()["error"]["message"]),
        (
            &json!("messages"),
            &json!(format!(
                "the request runs 5 sequences (its 5 conversations), {over}; send fewer conversations"
            ))
        )
    );
    // As a standard request, the five conversations run in turns.
    let r = post(&gw.url("/v1/chat/completions/batch"), "sk-alice", &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["choices"].as_array().unwrap().len(), 5);
    served.push(r.json()["usage"].clone());
    // The template's refusal of one conversation names its place in the batch.
    let late_system = json!([{"role": "user", "content": "a"}, {"role": "system", "content": "b"}]);
    let body = json!({"model": "qwen3.5-27b", "messages": [conversations[0], late_system], "max_tokens": 5});
    let r = post(&gw.url("/v1/chat/completions/batch"), "sk-alice", &body).await;
    assert_eq!(
        (
            r.status,
            &r.json()["error"]["param"],
            &r.json()["error"]["message"]
        ),
        (
            400,
            &json!("messages[1]"),
            &json!("System message must be at the beginning.")
        )
    );
    let body = json!({"model": "qwen3.5-27b", "query": "Is it?", "items": five, "label_token_ids": [9707]});
    let r = sheddable("/generative_scoring", body).await;
    assert_eq!(
        (r.status, r.code().as_str(), &r.json()["error"]["param"]),
        (400, "exceeds_kv_capacity", &json!("items")),
        "{}",
        r.text()
    );
    // Each prompt within the context, together past the prefill burst of 10,000: refused
    // before all are counted, nothing charged.
    let long = "hi ".repeat(3500);
    assert!((3500..4000).contains(&(tokenizer().count(&long) as u64)));
    let body = json!({"model": "qwen3.5-27b", "prompt": [long, long, long], "max_tokens": 5});
    let r = post(&gw.url("/v1/completions"), "sk-alice", &body).await;
    assert_eq!(
        (r.status, r.code().as_str()),
        (400, "exceeds_tenant_burst"),
        "{}",
        r.text()
    );
    // Charged what the backend counted of the batches served in turns, and nothing else.
    let used = |member: &str| {
        (served.iter())
            .map(|u| u[member].as_u64().unwrap())
            .sum::<u64>()
    };
    assert_eq!(
        gw.bucket("alice", "prefill").await,
        10_000.0 - (total + used("prompt_tokens")) as f64
    );
    assert_eq!(
        gw.bucket("alice", "decode").await,
        1000.0 - 20.0 - used("completion_tokens") as f64
    );
}
