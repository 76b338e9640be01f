//! The workload profile end to end: requests answered, refused and over the burst through a
//! gateway in front of the fake backend, then `GET /admin/profile`.

use super::*;

#[tokio::test]
async fn the_profile_counts_every_outcome_once_with_its_lengths() {
    let (gw, _backend) = gateway(FakeSpec {
        natural_length: 5,
        ..FakeSpec::default()
    })
    .await;
    let mut body = chat("hi", 20, false);
    body["ignore_eos"] = json!(false);
    assert_eq!(gw.chat("sk-alice", &body).await.status, 200);
    body["stream"] = json!(true);
    assert_eq!(gw.chat("sk-alice", &body).await.status, 200);
    // Over alice's decode burst (100/s x 10 s): never admitted.
    assert_eq!(
        gw.chat("sk-alice", &chat("hi", 1001, false)).await.code(),
        "exceeds_tenant_burst"
    );
    assert_eq!(gw.chat("sk-nobody", &body).await.status, 401);
    gw.wait_metric(
        "tokengate_requests_total{tenant=\"alice\",outcome=\"ok\"}",
        "2",
    )
    .await;
    let p = gw.admin("/admin/profile").await;
    assert_eq!(p["window_seconds"], 900.0);
    let names: Vec<&str> = p["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["alice", "unknown"]);
    let alice = &p["tenants"][0];
    assert_eq!(alice["requests"], 3);
    assert_eq!(
        alice["outcomes"],
        json!({"ok": 2, "exceeds_tenant_burst": 1})
    );
    assert_eq!(alice["refusals"], json!({"exceeds_tenant_burst": 1}));
    // Both answers: 5 of the 20 reserved output tokens.
    assert_eq!(alice["output_generated_tokens"], 10);
    assert_eq!(alice["output_reserved_tokens"], 40);
    assert_eq!(alice["output_reserved_ratio"], 0.25);
    let round = |v: &Value| v.as_f64().unwrap().round() as u64;
    assert_eq!(round(&alice["prompt_tokens"]["p50"]), chat_tokens("hi"));
    assert_eq!(round(&alice["output_tokens"]["p99"]), 5);
    // The streamed answer has a TTFT and a TPOT; the JSON one neither.
    assert!(alice["ttft_ms"]["p50"].as_f64().unwrap() >= 0.0);
    assert!(alice["tpot_ms"]["p50"].as_f64().unwrap() >= 0.0);
    assert_eq!(alice["since_start"]["requests"], 3);
    assert_eq!(p["tenants"][1]["refusals"], json!({"invalid_api_key": 1}));
    assert_eq!(p["overall"]["window"]["requests"], 4);
    assert_eq!(
        p["overall"]["window"]["refusals"],
        json!({"exceeds_tenant_burst": 1, "invalid_api_key": 1})
    );
    // The window slides on the gateway's clock: 16 minutes on, only since_start remains.
    gw.clock.advance(Duration::from_secs(16 * 60));
    let p = gw.admin("/admin/profile").await;
    assert_eq!(p["overall"]["window"]["requests"], 0);
    assert_eq!(p["overall"]["since_start"]["requests"], 4);
}

/// `line` without the fields that vary from run to run, after checking their type: the request
/// id the gateway made, the timestamps, and the latencies named in `timed`.
pub(super) fn fixed(mut line: Value, timed: &[&str]) -> Value {
    let fields = line.as_object_mut().unwrap();
    let id = fields.remove("request_id").unwrap();
    assert!(id.as_str().unwrap().starts_with("tg-"), "{id}");
    for stamp in ["arrived", "settled"] {
        let at = fields.remove(stamp).unwrap();
        assert!(
            humantime::parse_rfc3339(at.as_str().unwrap()).is_ok(),
            "{at}"
        );
    }
    for latency in ["ttft_ms", "tpot_ms"] {
        let v = fields.remove(latency).unwrap();
        assert_eq!(v.is_f64(), timed.contains(&latency), "{latency}: {v}");
    }
    line
}

#[tokio::test]
async fn the_usage_log_has_one_line_per_settled_request() {
    let dir = TempDir::new("usage-log");
    let path = dir.0.join("usage.jsonl");
    let (gw, backend) = gateway_with(FakeSpec::held(), |cfg| {
        cfg.usage_log = Some(tokengate::usage_log::UsageLogConfig {
            path: path.display().to_string(),
            buffer_records: 16,
        });
    })
    .await;
    let url = gw.url("/v1/chat/completions");
    // Answered: streamed, held after its first token, then let go.
    let answered = spawn_post(&url, "sk-alice", chat("a", 4, true));
    backend.wait_held(1).await;
    backend.release.add_permits(1);
    assert_eq!(answered.await.unwrap().status, 200);
    // Gone: bob reads the first token and hangs up.
    let client = tokio::spawn(async move {
        let body = chat("b", 4, true).to_string().into_bytes();
        let headers = [
            ("content-type", "application/json"),
            ("authorization", "Bearer sk-bob"),
        ];
        let resp = start_request(&url, "POST", Some(body), &headers).await;
        let mut body = resp.into_body();
        use http_body_util::BodyExt;
        body.frame().await.unwrap().unwrap();
    });
    backend.wait_held(2).await;
    client.await.unwrap();
    // Refused: no such key.
    assert_eq!(gw.chat("sk-nobody", &chat("a", 4, false)).await.status, 401);
    // Refused after it was read: over alice's decode burst (1,000).
    assert_eq!(
        gw.chat("sk-alice", &chat("a", 1001, false)).await.code(),
        "exceeds_tenant_burst"
    );
    gw.wait_metric(
        "tokengate_requests_total{tenant=\"bob\",outcome=\"client_disconnect\"}",
        "1",
    )
    .await;
    gw.wait_metric(
        "tokengate_requests_total{tenant=\"alice\",outcome=\"ok\"}",
        "1",
    )
    .await;
    gw.running
        .gateway
        .recorder
        .flush(Duration::from_secs(10))
        .await;
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 4, "{text}");
    let by = |outcome: &str| {
        lines
            .iter()
            .find(|l| l["outcome"] == outcome)
            .unwrap_or_else(|| panic!("no {outcome} line in {text}"))
            .clone()
    };
    assert_eq!(
        fixed(by("ok"), &["ttft_ms", "tpot_ms"]),
        json!({"tenant": "alice", "model": "qwen3.5-27b", "outcome": "ok", "answered": true,
               "billable": true, "prompt_tokens": chat_tokens("a"),
               "counted_prompt_tokens": chat_tokens("a"), "cached_prompt_tokens": null, "reserved_output_tokens": 4,
               "output_tokens": 4, "refunded_output_tokens": 0,
               "cost": null, "currency": null})
    );
    // One token streamed before the hang-up: it stays charged, the other 3 come back.
    assert_eq!(
        fixed(by("client_disconnect"), &["ttft_ms"]),
        json!({"tenant": "bob", "model": "qwen3.5-27b", "outcome": "client_disconnect",
               "answered": true, "billable": true, "prompt_tokens": chat_tokens("b"),
               "counted_prompt_tokens": chat_tokens("b"), "cached_prompt_tokens": null,
               "reserved_output_tokens": 4, "output_tokens": 1, "refunded_output_tokens": 3,
               "cost": null, "currency": null})
    );
    assert_eq!(
        fixed(by("invalid_api_key"), &[]),
        json!({"tenant": "unknown", "model": null, "outcome": "invalid_api_key",
               "answered": false, "billable": false, "prompt_tokens": null,
               "counted_prompt_tokens": null, "cached_prompt_tokens": null, "reserved_output_tokens": null,
               "output_tokens": null, "refunded_output_tokens": null,
               "cost": null, "currency": null})
    );
    // Nothing charged, so nothing to bill; the model it named is on the line.
    assert_eq!(
        fixed(by("exceeds_tenant_burst"), &[]),
        json!({"tenant": "alice", "model": "qwen3.5-27b", "outcome": "exceeds_tenant_burst",
               "answered": false, "billable": false, "prompt_tokens": null,
               "counted_prompt_tokens": null, "cached_prompt_tokens": null, "reserved_output_tokens": null,
               "output_tokens": null, "refunded_output_tokens": null,
               "cost": null, "currency": null})
    );
    assert_eq!(
        gw.metric("tokengate_usage_log_dropped_total")
            .await
            .as_deref(),
        Some("0")
    );
}
