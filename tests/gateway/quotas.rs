//! Quotas on the request path: a request reserves its most from every window of its tenant and
//! keeps what it used; refusals name the window, the limit, the spend and the reset; nothing a
//! refused or failed request did stays spent; many requests at once never pass the limit.

use super::*;
use tokengate::quota::config::QuotaConfig;
use tokengate::quota::ledger::Reading;

/// 2026-12-01T15:50:00Z: 23:50 in Shanghai, ten minutes before its midnight.
const BEFORE_SHANGHAI_MIDNIGHT: i64 = 1_796_140_200_000;

/// Alice with one calendar-day quota of `decode` output tokens in Shanghai's day, her buckets
/// large enough never to be what refuses; spend kept in `dir`.
fn shanghai_decode(cfg: &mut tokengate::config::Config, decode: u64, dir: &TempDir) {
    cfg.quotas.path = dir.0.join("quotas.redb");
    let alice = &mut cfg.tenants[0];
    alice.decode_tokens_per_second = Some(100_000.0);
    alice.requests_per_second = Some(1000.0);
    alice.quotas = vec![QuotaConfig {
        window: "calendar-day".into(),
        timezone: Some("Asia/Shanghai".into()),
        prefill: None,
        decode: Some(decode),
        total: None,
        weighted: None,
        prefill_weight: None,
        decode_weight: None,
        cached_weight: None,
        cost: None,
    }];
}

async fn quota_gateway(spec: FakeSpec, decode: u64, dir: &TempDir) -> (TestGateway, FakeBackend) {
    let backend = FakeBackend::start(spec).await;
    let mut cfg = config(&[backend.addr]);
    shanghai_decode(&mut cfg, decode, dir);
    let gw = TestGateway::start_at_wall(cfg, BEFORE_SHANGHAI_MIDNIGHT).await;
    (gw, backend)
}

/// Alice's quota meters now.
async fn readings(gw: &TestGateway) -> Vec<Reading> {
    let gateway = &gw.running.gateway;
    let live = gateway.live.current();
    let alice = live.tenants.named("alice").unwrap();
    gateway.quotas.read("alice", &alice.quotas).await.unwrap()
}

/// Waits until alice's one meter reads `(spent, reserved)`: a request settles when its answer
/// has gone, just after the client has read it.
async fn wait_spent(gw: &TestGateway, spent: u64, reserved: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let r = &readings(gw).await[0];
        if (r.spent, r.reserved) == (spent, reserved) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "alice's quota stayed at spent {} reserved {}, not {spent} and {reserved}",
            r.spent,
            r.reserved
        );
        tokio::task::yield_now().await;
    }
}

/// A chat that stops by itself (no `ignore_eos`) after the backend's natural length.
fn natural(max_tokens: u64) -> Value {
    let mut body = chat("hi", max_tokens, false);
    body.as_object_mut().unwrap().remove("ignore_eos");
    body
}

#[tokio::test]
async fn a_decode_quota_keeps_what_was_produced_and_refuses_naming_the_window_and_its_reset() {
    let dir = TempDir::new("quota-shanghai");
    let spec = FakeSpec {
        natural_length: 25,
        ..FakeSpec::default()
    };
    let (gw, _backend) = quota_gateway(spec, 100, &dir).await;
    let r = gw.chat("sk-alice", &natural(60)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    // Right after the reservation: 60 of 100 held, the day ends in 600 s.
    assert_eq!(
        r.headers["ratelimit-policy"],
        "\"decode-calendar-day@Asia/Shanghai\";q=100;w=86400;qu=\"tokens\""
    );
    assert_eq!(
        r.headers["ratelimit"],
        "\"decode-calendar-day@Asia/Shanghai\";r=40;t=600"
    );
    wait_spent(&gw, 25, 0).await;
    assert_eq!(gw.chat("sk-alice", &natural(60)).await.status, 200);
    wait_spent(&gw, 50, 0).await;
    let decode = gw.bucket("alice", "decode").await;
    // 50 spent: a request that may produce 60 does not fit.
    let r = gw.chat("sk-alice", &natural(60)).await;
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.code(), "quota_exceeded");
    assert_eq!(r.json()["error"]["type"], "insufficient_quota");
    assert_eq!(
        r.json()["error"]["message"],
        "tenant alice's decode quota over calendar-day@Asia/Shanghai is reached: limit 100 decode tokens, 50 decode tokens spent, 0 decode tokens held by requests in flight; this request may use up to 60 decode tokens (its prompt and all of its output limit); the window resets at 2026-12-02T00:00:00+08:00, retry after 600 s"
    );
    assert_eq!(r.headers["retry-after"], "600");
    assert_eq!(
        r.headers["ratelimit"],
        "\"decode-calendar-day@Asia/Shanghai\";r=50;t=600"
    );
    // Refused: nothing reserved, the buckets untouched.
    wait_spent(&gw, 50, 0).await;
    assert_eq!(gw.bucket("alice", "decode").await, decode);
    // Bob has no quota.
    assert_eq!(gw.chat("sk-bob", &natural(60)).await.status, 200);
    // Shanghai's midnight: a new day.
    gw.clock.advance(Duration::from_secs(600));
    let r = gw.chat("sk-alice", &natural(60)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    wait_spent(&gw, 25, 0).await;
    // More than the whole day's limit can never fit.
    let r = gw.chat("sk-alice", &natural(101)).await;
    assert_eq!((r.status, r.code().as_str()), (400, "exceeds_quota"));
    assert_eq!(
        r.json()["error"]["message"],
        "tenant alice's decode quota over calendar-day@Asia/Shanghai is 100 decode tokens; this request may use up to 101 decode tokens (its prompt and all of its output limit): lower max_tokens"
    );
}

#[tokio::test]
async fn a_request_refused_or_failed_by_the_backend_spends_nothing() {
    let dir = TempDir::new("quota-failed");
    let spec = FakeSpec {
        behaviour: Behaviour::Status(500, BACKEND_INTERNALS),
        ..FakeSpec::default()
    };
    let (gw, _backend) = quota_gateway(spec, 100, &dir).await;
    let r = gw.chat("sk-alice", &chat("hi", 60, false)).await;
    assert_eq!(r.status, 502, "{}", r.text());
    wait_spent(&gw, 0, 0).await;
    let bad = json!({"model": "qwen3.5-27b", "messages": "not a list", "max_tokens": 60});
    assert_eq!(gw.chat("sk-alice", &bad).await.status, 400);
    wait_spent(&gw, 0, 0).await;
}

#[tokio::test]
async fn many_requests_at_the_boundary_at_once_never_pass_the_limit() {
    let dir = TempDir::new("quota-boundary");
    let (gw, backend) = quota_gateway(FakeSpec::held(), 1000, &dir).await;
    // 40 requests that may each produce 100 tokens, all at once, against 1000: ten fit.
    let calls: Vec<_> = (0..40)
        .map(|_| {
            spawn_post(
                &gw.url("/v1/chat/completions"),
                "sk-alice",
                chat("hi", 100, false),
            )
        })
        .collect();
    backend.wait_held(10).await;
    wait_spent(&gw, 0, 1000).await;
    backend.release.add_permits(10);
    let mut answered = std::collections::BTreeMap::new();
    for call in calls {
        let r = call.await.unwrap();
        *answered.entry((r.status, r.code())).or_insert(0) += 1;
    }
    assert_eq!(
        answered,
        std::collections::BTreeMap::from([
            ((200, String::new()), 10),
            ((429, "quota_exceeded".to_string()), 30)
        ])
    );
    wait_spent(&gw, 1000, 0).await;
    assert_eq!(
        gw.chat("sk-alice", &chat("hi", 1, false)).await.code(),
        "quota_exceeded"
    );
}

#[tokio::test]
async fn a_cost_and_a_weighted_quota_charge_cached_tokens_at_their_price_and_the_usage_log_bills_it(
) {
    let dir = TempDir::new("quota-cost");
    let backend = FakeBackend::start(FakeSpec {
        natural_length: 10,
        prompt_tokens: Some(1000),
        cached_tokens: Some(600),
        ..FakeSpec::default()
    })
    .await;
    let mut cfg = config(&[backend.addr]);
    shanghai_decode(&mut cfg, 1_000_000, &dir);
    cfg.usage_log = Some(tokengate::usage_log::UsageLogConfig {
        path: dir.0.join("usage.jsonl").display().to_string(),
        buffer_records: 16,
    });
    let text = "[m]\ninput = 0.6\ncached_input = 0.06\noutput = 3.6\n";
    let prices: std::collections::BTreeMap<String, tokengate::quota::config::PriceConfig> =
        toml::from_str(&text.replace("[m]", "[\"qwen3.5-27b\"]")).unwrap();
    cfg.prices = prices;
    let quota = |t: &str| -> QuotaConfig { toml::from_str(t).unwrap() };
    cfg.tenants[0].prefill_tokens_per_second = Some(100_000.0);
    cfg.tenants[0].quotas = vec![
        quota("window = \"calendar-month\"\ncost = 1.0\n"),
        quota("window = \"1h\"\nweighted = 100000\ndecode_weight = 4\ncached_weight = 0.1\n"),
    ];
    let gw = TestGateway::start_at_wall(cfg, BEFORE_SHANGHAI_MIDNIGHT).await;
    let r = gw.chat("sk-alice", &natural(50)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    // The backend counted 1000 prompt tokens, 600 of them cached, and 10 output tokens.
    // Cost: 400 x $0.6 + 600 x $0.06 + 10 x $3.6 per million = $0.000312.
    // Weighted: 400 + 0.1 x 600 + 4 x 10 = 500.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let spent = loop {
        let spent: Vec<u64> = readings(&gw).await.iter().map(|r| r.spent).collect();
        if spent[0] > 0 || tokio::time::Instant::now() > deadline {
            break spent;
        }
        tokio::task::yield_now().await;
    };
    assert_eq!(spent, [312_000_000, 500]);
    gw.running
        .gateway
        .recorder
        .flush(Duration::from_secs(10))
        .await;
    let log = std::fs::read_to_string(dir.0.join("usage.jsonl")).unwrap();
    let line: Value = serde_json::from_str(log.lines().next().unwrap()).unwrap();
    assert_eq!(
        (line["cost"].as_f64(), line["currency"].as_str()),
        (Some(0.000312), Some("USD"))
    );
}

/// A backend that says it counted a trillion prompt tokens (broken, or not the engine it
/// claims to be) settles the quota on the most a prompt can be, the model's context (4,096
/// tokens here), not on its word: alice's total is 4,096 + 10, not a trillion. Before, one
/// answer spent any quota whole.
#[tokio::test]
async fn a_backends_prompt_count_settles_the_quota_within_the_context() {
    let dir = TempDir::new("quota-clamped-prompt");
    let backend = FakeBackend::start(FakeSpec {
        natural_length: 10,
        prompt_tokens: Some(1_000_000_000_000),
        ..FakeSpec::default()
    })
    .await;
    let mut cfg = config(&[backend.addr]);
    shanghai_decode(&mut cfg, 1_000_000, &dir);
    cfg.tenants[0].quotas = vec![toml::from_str("window = \"1h\"\ntotal = 1000000\n").unwrap()];
    let gw = TestGateway::start_at_wall(cfg, BEFORE_SHANGHAI_MIDNIGHT).await;
    let r = gw.chat("sk-alice", &natural(50)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    wait_spent(&gw, 4096 + 10, 0).await;
}
