//! Backend feedback and `tokengate diagnose` against the simulated backend on real sockets: the
//! gateway scrapes the sim's vLLM and MindIE names, and a sim slowed in one phase, short of
//! cache or behind tight limits drives the decision tree into the branch that says so.

use super::*;
use std::sync::Arc;
use tokengate::admin_client::AdminArgs;
use tokengate::config::Config;
use tokengate::diagnose::cli::{fetch_inputs, DiagnoseArgs};
use tokengate::diagnose::{diagnose, Finding};
use tokengate::sim::engine::KvGeometry;
use tokengate::sim::timing::{Pace, Slowed};
use tokengate::sim::{self, SimConfig, SimHandle};

async fn start_sim(cfg: SimConfig) -> SimHandle {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    sim::start(cfg, tokenizer(), listener).await.unwrap()
}

/// The fixed-pace sim (1 ms passes) with prefill and decode slowed by the given factors and
/// short answers (4 tokens on average).
fn slowed(prefill: f64, decode: f64) -> SimConfig {
    SimConfig {
        mean_output_tokens: 4.0,
        timing: Arc::new(Slowed {
            inner: Arc::new(Pace(Duration::from_millis(1))),
            prefill,
            decode,
        }),
        ..SimConfig::pace(Duration::from_millis(1))
    }
}

/// The tests' config with backend 0 sized by the capacity model (Qwen3.5-27B on two 910B3s)
/// and `extra` lines added to it.
fn modelled(sim: &SimHandle, extra: &str) -> Config {
    let text = config_text(&[sim.addr()]).replace(
        "kv_capacity_bytes = 8000000000\nmax_batch = 32\n",
        &format!("hardware = \"910b3\"\nmodel = \"qwen3.5-27b\"\ntp = 2\n{extra}"),
    );
    Config::parse(&text).unwrap().into_inner()
}

/// Streams `n` chats at once and waits for every answer.
async fn burst(gw: &TestGateway, key: &'static str, n: usize, max_tokens: u64) -> Vec<Received> {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            spawn_post(
                &gw.url("/v1/chat/completions"),
                key,
                chat(&format!("question number {i}"), max_tokens, true),
            )
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

async fn findings(gw: &TestGateway, backend_metrics: Vec<String>) -> Vec<Finding> {
    let args = DiagnoseArgs {
        admin: AdminArgs {
            admin: format!("http://{}", gw.running.admin_addr),
            admin_token: None,
            timeout: Duration::from_secs(5),
        },
        backend_metrics,
        json: true,
        ttft_slo_ms: 800.0,
        tpot_slo_ms: 50.0,
    };
    diagnose(&fetch_inputs(&args).await.unwrap())
}

fn branch(f: &[Finding]) -> Vec<(&str, &str)> {
    f.iter()
        .map(|f| (f.symptom.as_str(), f.cause.as_str()))
        .collect()
}

#[tokio::test]
async fn the_gateway_reads_the_sims_vllm_and_mindie_names() {
    let sim = start_sim(slowed(1.0, 1.0)).await;
    let url = sim.url();
    let text = config_text(&[sim.addr(), sim.addr()]);
    // Backend 0 reads `/metrics` (both sets: vLLM's are read), backend 1 MindIE's alone.
    let mut parts = text.splitn(3, "[[backends]]");
    let (head, b0, b1) = (
        parts.next().unwrap(),
        parts.next().unwrap(),
        parts.next().unwrap(),
    );
    let text = format!(
        "{head}[[backends]]{b0}[backends.feedback]\nenabled = true\ninterval = \"20ms\"\n\
         [[backends]]{}",
        b1.replacen(
            "\n[[tenants]]",
            &format!(
                "[backends.feedback]\nenabled = true\ninterval = \"20ms\"\n\
                 metrics_url = \"{url}/metrics?names=mindie\"\n\n[[tenants]]"
            ),
            1
        )
    );
    let gw = TestGateway::start(Config::parse(&text).unwrap().into_inner()).await;
    let r = gw.chat("sk-alice", &chat("hello", 5, false)).await;
    assert_eq!(r.status, 200);
    // Wait (bounded) until each backend has been scraped after that answer.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let backends = loop {
        let b = gw.admin("/admin/backends").await;
        let done = (0..2).all(|i| {
            b["backends"][i]["observed"]["reading"]["running"] == 0
                && b["backends"][i]["observed"]["scrapes"].as_u64() >= Some(2)
        });
        if done {
            break b;
        }
        assert!(tokio::time::Instant::now() < deadline, "never scraped: {b}");
        tokio::task::yield_now().await;
    };
    for (i, flavor, path) in [
        (0, "vllm", "/metrics"),
        (1, "mindie", "/metrics?names=mindie"),
    ] {
        let o = &backends["backends"][i]["observed"];
        assert_eq!(o["metrics_url"], format!("{url}{path}"));
        assert_eq!(o["reading"]["flavor"], flavor);
        assert_eq!(o["reading"]["waiting"], 0);
        assert_eq!(o["reading"]["preemptions_total"], 0);
        assert_eq!(o["reading"]["kv_usage"], 0.0);
        assert_eq!(o["capacity_scale_permille"], 1000);
        assert_eq!(o["failures"], 0);
        // The same answer's first token, seen under either name.
        assert_eq!(o["reading"]["ttft"]["count"], 1);
        assert_eq!(
            backends["backends"][i]["kv_effective_capacity_bytes"],
            8_000_000_000u64
        );
    }
    let exported = gw.metrics().await;
    assert!(exported.contains(&format!(
        "tokengate_kv_capacity_scale{{backend=\"{url}\"}} 1.0\n"
    )));
}

#[tokio::test]
async fn a_slow_prefill_reads_as_prefill_bound_and_scales_out() {
    // 1 ms x 900: every prefill pass takes 0.9 s; decode is not slowed.
    let sim = start_sim(slowed(900.0, 1.0)).await;
    let gw = TestGateway::start(modelled(&sim, "")).await;
    // One after another: a prefill arriving while another request decodes would stall it
    // (MindIE runs prefills alone) and make TPOT high too.
    for n in 0..3 {
        let r = gw
            .chat("sk-alice", &chat(&format!("question {n}"), 8, true))
            .await;
        assert_eq!(r.status, 200);
    }
    let f = findings(&gw, vec![]).await;
    assert_eq!(branch(&f), [("ttft_high", "prefill_bound")]);
    let c = f[0].change.as_ref().unwrap();
    // TTFT P95 ~ 1 s (its histogram bucket 0.512..1.024 s) over an 800 ms target.
    assert_eq!(
        (c.field.as_str(), c.from, c.to),
        ("backends[0].replicas", Some(1.0), 2.0)
    );
}

/// Sends four short chats and one of about 2,000 prompt tokens, one after another, each
/// asking for `max_tokens`; every answer must be a 200.
async fn short_chats_and_one_long(gw: &TestGateway, max_tokens: u64) {
    let long = "word ".repeat(2000);
    for text in [
        "question 0",
        "question 1",
        "question 2",
        &long,
        "question 3",
    ] {
        let r = gw.chat("sk-alice", &chat(text, max_tokens, true)).await;
        assert_eq!(r.status, 200);
    }
}

#[tokio::test]
async fn a_long_prompt_tail_behind_slow_prefills_reads_as_long_prefill_stall() {
    // Every prefill pass takes 0.9 s, so TTFT is high with nothing queued; the prompts' P99
    // (about 2,000 tokens) is over 4x their P50 and takes ~0.5 s to prefill on two 910B3s,
    // more than a quarter of the 800 ms target.
    let sim = start_sim(slowed(900.0, 1.0)).await;
    let gw = TestGateway::start(modelled(&sim, "")).await;
    short_chats_and_one_long(&gw, 8).await;
    let f = findings(&gw, vec![]).await;
    assert_eq!(branch(&f), [("ttft_high", "long_prefill_stall")]);
    let c = f[0].change.as_ref().unwrap();
    // The cap: the longest prompt two 910B3s prefill in 200 ms (as in the unit tests).
    assert_eq!(
        (c.field.as_str(), c.to),
        ("longest prompt admitted, tokens", 811.0)
    );
    let from = c.from.unwrap();
    assert!((1900.0..2100.0).contains(&from), "{c:?}");
}

#[tokio::test]
async fn slow_decode_at_a_batch_fine_for_short_contexts_reads_as_long_context_decode() {
    // Decode steps of 100 ms, twice the TPOT target, with a batch cap of 2 (well under what the
    // target allows at the median context), no preemption and no queue: the long contexts.
    let sim = start_sim(slowed(1.0, 100.0)).await;
    let gw = TestGateway::start(modelled(&sim, "max_batch = 2\n")).await;
    short_chats_and_one_long(&gw, 6).await;
    let f = findings(&gw, vec![format!("{}/metrics", sim.url())]).await;
    assert_eq!(branch(&f), [("tpot_high", "long_context_decode")]);
    let c = f[0].change.as_ref().unwrap();
    assert_eq!(
        (c.field.as_str(), c.from, c.to),
        ("backends[0].max_batch", Some(2.0), 1.0)
    );
}

#[tokio::test]
async fn a_slow_prefill_behind_a_batch_of_one_reads_as_queueing() {
    let sim = start_sim(slowed(300.0, 1.0)).await;
    let gw = TestGateway::start(modelled(&sim, "max_batch = 1\n")).await;
    for r in burst(&gw, "sk-alice", 6, 4).await {
        assert_eq!(r.status, 200);
    }
    let f = findings(&gw, vec![]).await;
    assert_eq!(branch(&f), [("ttft_high", "queueing")]);
    let c = f[0].change.as_ref().unwrap();
    assert_eq!(c.field, "tenants[].decode_tokens_per_second (sum)");
    assert!(c.to > 0.0, "{c:?}");
}

#[tokio::test]
async fn a_slow_decode_with_a_batch_over_the_slo_batch_reads_as_batch_too_large() {
    // 1 ms x 100: every decode step takes 100 ms, twice the TPOT target.
    let sim = start_sim(slowed(1.0, 100.0)).await;
    let gw = TestGateway::start(modelled(&sim, "max_batch = 5000\n")).await;
    for r in burst(&gw, "sk-alice", 4, 6).await {
        assert_eq!(r.status, 200);
    }
    let f = findings(&gw, vec![]).await;
    assert_eq!(branch(&f), [("tpot_high", "batch_too_large")]);
    let c = f[0].change.as_ref().unwrap();
    assert_eq!(
        (c.field.as_str(), c.from),
        ("backends[0].max_batch", Some(5000.0))
    );
    assert!(c.to >= 1.0 && c.to < 5000.0, "{c:?}");
}

#[tokio::test]
async fn a_target_no_batch_of_one_910b3_meets_names_the_cards_or_the_slo_that_would() {
    // The quickstart's deployment (Qwen3.5-27B on one 910B3, where one sequence alone takes
    // 75 ms a decode step) behind a sim whose steps take 100 ms: no max_batch meets 50 ms per
    // token, so the finding says what would instead of a batch that cannot. Every answer is
    // its 6 tokens (a mean far above it) and every prompt the 14 of "question number N", so
    // the P50 lengths, and with them every figure, are exact.
    let sim = start_sim(SimConfig {
        mean_output_tokens: 1000.0,
        ..slowed(1.0, 100.0)
    })
    .await;
    let text = config_text(&[sim.addr()]).replace(
        "kv_capacity_bytes = 8000000000\n",
        "hardware = \"910b3\"\nmodel = \"qwen3.5-27b\"\ntpot_slo_ms = 100\n",
    );
    let gw = TestGateway::start(Config::parse(&text).unwrap().into_inner()).await;
    for r in burst(&gw, "sk-alice", 4, 6).await {
        assert_eq!(r.status, 200);
    }
    let f = findings(&gw, vec![]).await;
    assert_eq!(branch(&f), [("tpot_high", "target_unreachable")]);
    assert_eq!(
        f[0].advice,
        "no backends[0].max_batch of this deployment meets the TPOT target at the P50 context \
         (14 + 6/2 tokens): one sequence takes 75.32 ms a step, over the 50 ms TPOT SLO; it fits \
         with tpot_slo_ms = 100 (safe batch 49, bound: memory capacity (KV + state)) or tp = 2 \
         (safe batch 78, bound: HBM bandwidth (TPOT SLO))"
    );
    let c = f[0].change.as_ref().unwrap();
    assert_eq!(
        (c.field.as_str(), c.from, c.to),
        ("backends[0].tp", Some(1.0), 2.0)
    );
}

/// A 100-token cache (one byte a token) and slow decode: four answers of up to 30 tokens on
/// ~15-token prompts outgrow it and are preempted.
fn small_cache() -> SimConfig {
    SimConfig {
        engine: tokengate::sim::engine::EngineConfig {
            kv: KvGeometry {
                block_tokens: 1,
                kv_bytes_per_token: 1,
                state_bytes_per_seq: 0,
                budget_bytes: 100,
            },
            max_model_len: 100,
            ..slowed(1.0, 55.0).engine
        },
        mean_output_tokens: 30.0,
        ..slowed(1.0, 55.0)
    }
}

#[tokio::test]
async fn a_cache_too_small_preempts_and_reads_as_kv_pressure() {
    let sim = start_sim(small_cache()).await;
    let gw = TestGateway::start(modelled(&sim, "")).await;
    let answers = burst(&gw, "sk-alice", 4, 30).await;
    assert!(answers.iter().all(|r| r.status == 200));
    assert!(sim.stats().engine.preemptions > 0);
    let f = findings(&gw, vec![format!("{}/metrics", sim.url())]).await;
    assert_eq!(branch(&f), [("tpot_high", "kv_pressure")]);
    let c = f[0].change.as_ref().unwrap();
    assert_eq!(c.field, "backends[0].max_batch");
    assert!(c.to < c.from.unwrap(), "{c:?}");
}

/// The same burst through a backend that says only `kv = "engine"`: the gateway learns the
/// sim's cache (100 pages of one token, no state, its batch cap) from its metrics and
/// `/server_info`, holds the requests that would not fit, and the sim never preempts.
#[tokio::test]
async fn a_backend_that_learns_the_sims_cache_keeps_it_from_preempting() {
    let sim = start_sim(small_cache()).await;
    let text = config_text(&[sim.addr()]).replace(
        "kv_capacity_bytes = 8000000000\nmax_batch = 32\n",
        "kv = \"engine\"\n",
    );
    let gw = TestGateway::start(Config::parse(&text).unwrap().into_inner()).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let backend = loop {
        let b = gw.admin("/admin/backends").await["backends"][0].clone();
        if !b["observed"]["engine_kv"].is_null() {
            break b;
        }
        assert!(tokio::time::Instant::now() < deadline, "never learned: {b}");
        tokio::task::yield_now().await;
    };
    assert_eq!(
        backend["observed"]["engine_kv"],
        serde_json::json!({"page_tokens": 1, "page_bytes": 1, "pages": 100,
            "state_pages_per_sequence": 0, "prefix_state_pages_per_sequence": 0,
            "lookahead_tokens": 0, "prefix_caching": false, "max_model_len": 100,
            "max_num_seqs": 1024})
    );
    assert_eq!(
        (
            &backend["kv_capacity_bytes"],
            &backend["max_batch"],
            &backend["kv_capacity_bytes_source"]
        ),
        (
            &serde_json::json!(100),
            &serde_json::json!(1024),
            &serde_json::json!("engine")
        )
    );
    // The file's context (4,096) is not the sim's (100): said.
    assert_eq!(
        backend["observed"]["kv_differences"],
        serde_json::json!([{"key": "model.max_model_len", "configured": 4096, "engine": 100,
            "unit": "tokens"}])
    );
    // Learned, it is ready.
    assert_eq!(
        gw.admin("/readyz").await,
        serde_json::json!({"status": "ready", "backends": [{"url": sim.url(), "state": "ready",
            "detail": "/health answered"}]})
    );
    let answers = burst(&gw, "sk-alice", 4, 30).await;
    assert!(answers.iter().all(|r| r.status == 200));
    assert_eq!(sim.stats().engine.preemptions, 0);
}

#[tokio::test]
async fn a_preempting_sim_shrinks_the_ledger_through_feedback_while_it_serves() {
    let sim = start_sim(small_cache()).await;
    // The ledger believes 8e9 bytes; the sim holds 100. Feedback scrapes every 20 ms.
    let text = config_text(&[sim.addr()]).replacen(
        "\n[[tenants]]",
        "[backends.feedback]\nenabled = true\ninterval = \"20ms\"\n\n[[tenants]]",
        1,
    );
    let gw = TestGateway::start(Config::parse(&text).unwrap().into_inner()).await;
    let answers = tokio::spawn({
        let url = gw.url("/v1/chat/completions");
        async move {
            let tasks: Vec<_> = (0..4)
                .map(|i| {
                    spawn_post(
                        &url,
                        "sk-alice",
                        chat(&format!("question number {i}"), 30, true),
                    )
                })
                .collect();
            let mut out = Vec::new();
            for t in tasks {
                out.push(t.await.unwrap().status);
            }
            out
        }
    });
    // While the answers decode, the sim preempts and a scrape sees it with leases live. (A
    // scrape may shrink the ledger before that: requests that reach the sim between two of
    // its steps wait, and two scrapes in a row that see a queue are pressure too.)
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let squeezed = loop {
        let b = gw.admin("/admin/backends").await;
        if b["backends"][0]["observed"]["last_adjustment"]["reason"]["why"] == "preempted" {
            break b;
        }
        assert!(tokio::time::Instant::now() < deadline, "never shrunk: {b}");
        tokio::task::yield_now().await;
    };
    let b = &squeezed["backends"][0];
    let scale = b["observed"]["capacity_scale_permille"].as_u64().unwrap();
    // x0.9 per scrape under pressure, never below the 0.5 floor.
    assert!(
        [900, 810, 729, 656, 590, 531, 500].contains(&scale),
        "{scale}"
    );
    assert_eq!(b["kv_effective_capacity_bytes"], 8_000_000 * scale);
    assert!(b["observed"]["reading"]["preemptions_total"].as_u64() > Some(0));
    assert_eq!(answers.await.unwrap(), [200; 4]);
    assert!(sim.stats().engine.preemptions > 0);
    // Live leases were never cut: every one gave back exactly what it held.
    assert_eq!(gw.kv_reserved(0).await, 0);
}

#[tokio::test]
async fn refusals_with_fine_latency_read_as_limits_too_tight() {
    let sim = start_sim(slowed(1.0, 1.0)).await;
    // Alice may send one request per 10 s, with a burst of one.
    let text = config_text(&[sim.addr()])
        .replace(
            "kv_capacity_bytes = 8000000000\nmax_batch = 32\n",
            "hardware = \"910b3\"\nmodel = \"qwen3.5-27b\"\ntp = 2\n",
        )
        .replacen(
            "requests_per_second = 10\nburst_seconds = 10",
            "requests_per_second = 0.1\nburst_seconds = 10",
            1,
        );
    let cfg = Config::parse(&text).unwrap().into_inner();
    let gw = TestGateway::start(cfg).await;
    let got = burst(&gw, "sk-alice", 10, 4).await;
    let refused = got.iter().filter(|r| r.status == 429).count();
    assert!(refused >= 5, "{refused} refused");
    let f = findings(&gw, vec![]).await;
    assert_eq!(branch(&f), [("refusals_high", "limits_too_tight")]);
    let c = f[0].change.as_ref().unwrap();
    assert_eq!(c.field, "tenants[].decode_tokens_per_second (sum)");
}
