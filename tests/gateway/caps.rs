//! A tenant's concurrency caps end to end: `max_inflight` and `max_queued` refuse one more with
//! 429 `concurrency_exceeded` and the numbers, charge nothing, and give each place back when its
//! request ends, so one tenant cannot hold the KV queue or the backend's batch alone.

use super::*;

/// The `/metrics` value of `series`, as a number (0 when it is not exported yet).
async fn gauge(gw: &TestGateway, series: &str) -> i64 {
    gw.metric(series)
        .await
        .map_or(0, |v| v.parse().expect("a number"))
}

#[tokio::test]
async fn max_inflight_refuses_the_next_request_with_the_numbers_and_a_disconnect_gives_its_place_back(
) {
    let (gw, backend) = gateway_with(FakeSpec::held(), |cfg| {
        cfg.tenants[0].max_inflight = Some(2);
    })
    .await;
    let url = gw.url("/v1/chat/completions");
    let first = spawn_post(&url, "sk-alice", chat("a", 4, true));
    let second = spawn_post(&url, "sk-alice", chat("a", 4, true));
    backend.wait_held(2).await;
    let r = gw.chat("sk-alice", &chat("a", 4, true)).await;
    assert_eq!(r.status, 429);
    assert_eq!(
        r.json()["error"],
        json!({
            "message": "tenant alice has 2 requests in flight; max_inflight is 2",
            "type": "requests",
            "param": null,
            "code": "concurrency_exceeded",
        })
    );
    assert_eq!(r.headers["retry-after"], "1");
    // Refused before the charge: only the two held requests are.
    assert_eq!(gw.bucket("alice", "requests").await, 98.0);
    assert_eq!(
        gauge(&gw, "tokengate_inflight_requests{tenant=\"alice\"}").await,
        2
    );
    gw.wait_metric(
        "tokengate_requests_total{tenant=\"alice\",outcome=\"concurrency_exceeded\"}",
        "1",
    )
    .await;
    // Another tenant is not capped by alice's requests.
    let bob = spawn_post(&url, "sk-bob", chat("b", 4, true));
    backend.wait_held(3).await;
    // A client that goes away gives its place back: the next one is admitted.
    first.abort();
    gw.wait_metric("tokengate_inflight_requests{tenant=\"alice\"}", "1")
        .await;
    let third = spawn_post(&url, "sk-alice", chat("a", 4, true));
    backend.wait_held(4).await;
    // One more than the three left: the gone client's backend request may still take one.
    backend.release.add_permits(4);
    for t in [second, third, bob] {
        assert_eq!(t.await.unwrap().status, 200);
    }
    gw.wait_metric("tokengate_inflight_requests{tenant=\"alice\"}", "0")
        .await;
    assert_eq!(gw.kv_reserved(0).await, 0);
}

#[tokio::test]
async fn max_queued_keeps_one_tenant_from_filling_the_kv_queue() {
    let (gw, backend) = gateway_with(FakeSpec::held(), |cfg| {
        cfg.backends[0].max_batch = Some(1);
        cfg.admission.queue_max_waiting = 4;
        cfg.admission.queue_deadline = Duration::from_secs(30);
        cfg.tenants[0].max_queued = Some(2);
    })
    .await;
    let url = gw.url("/v1/chat/completions");
    let mut tasks = vec![spawn_post(&url, "sk-alice", chat("a", 4, true))];
    backend.wait_held(1).await;
    for n in 1..=2 {
        tasks.push(spawn_post(&url, "sk-alice", chat("a", 4, true)));
        gw.wait_queued(n).await;
    }
    let r = gw.chat("sk-alice", &chat("a", 4, true)).await;
    assert_eq!((r.status, r.code().as_str()), (429, "concurrency_exceeded"));
    assert_eq!(
        r.json()["error"]["message"],
        "tenant alice has 2 requests waiting in the KV queue; max_queued is 2"
    );
    assert_eq!(r.headers["retry-after"], "1");
    // Everything it was charged came back: three requests hold their charge.
    assert_eq!(gw.bucket("alice", "requests").await, 97.0);
    assert_eq!(
        gauge(&gw, "tokengate_queue_depth_by_tenant{tenant=\"alice\"}").await,
        2
    );
    // The places alice may not take are bob's.
    for n in 3..=4 {
        tasks.push(spawn_post(&url, "sk-bob", chat("b", 4, true)));
        gw.wait_queued(n).await;
    }
    // Not a pressure refusal of the queue: counted under its code only.
    gw.wait_metric(
        "tokengate_requests_total{tenant=\"alice\",outcome=\"concurrency_exceeded\"}",
        "1",
    )
    .await;
    assert!(!gw
        .metrics()
        .await
        .contains("tokengate_queue_refusals_total{"));
    backend.release.add_permits(5);
    for t in tasks {
        assert_eq!(t.await.unwrap().status, 200);
    }
    assert_eq!(gw.kv_reserved(0).await, 0);
}
