//! Priority classes end to end: a sheddable tenant holds at most its share of the backend, a
//! critical one starts at once beside its flood, and a request may lower its own class.

use super::*;
use tokengate::admission::Priority;

/// alice critical, bob sheddable (share 0.5 by default) in front of a backend that holds every
/// generation, with room for `max_batch` sequences.
async fn classes_gateway(spec: FakeSpec, max_batch: u32) -> (TestGateway, FakeBackend) {
    gateway_with(spec, |cfg| {
        cfg.backends[0].max_batch = Some(max_batch);
        cfg.tenants[0].priority = Priority::Critical;
        cfg.tenants[1].priority = Priority::Sheddable;
    })
    .await
}

/// Live leases of each class on backend 0: (sheddable, standard, critical).
async fn inflight_by_class(gw: &TestGateway) -> (u64, u64, u64) {
    let b = gw.admin("/admin/backends").await;
    let of = |class: &str| {
        b["backends"][0]["by_class"][class]["inflight"]
            .as_u64()
            .unwrap()
    };
    (of("sheddable"), of("standard"), of("critical"))
}

#[tokio::test]
async fn a_sheddable_flood_holds_its_share_and_a_critical_request_starts_beside_it() {
    let (gw, backend) = classes_gateway(FakeSpec::held(), 4).await;
    let url = gw.url("/v1/chat/completions");
    let mut tasks = Vec::new();
    for i in 0..2 {
        tasks.push(spawn_post(
            &url,
            "sk-bob",
            chat(&format!("flood {i}"), 4, true),
        ));
    }
    backend.wait_held(2).await;
    let b = gw.admin("/admin/backends").await;
    assert_eq!(
        b["backends"][0]["by_class"]["sheddable"]["max_batch"], 2,
        "half of 4 sequences"
    );
    // Two of the four slots are free, but not for bob: his third waits.
    tasks.push(spawn_post(&url, "sk-bob", chat("flood 2", 4, true)));
    gw.wait_queued(1).await;
    // alice lowering herself to sheddable waits in bob's share too.
    let lowered = {
        let url = url.clone();
        let body = chat("alice lowered", 4, true).to_string().into_bytes();
        tokio::spawn(async move {
            send(
                &url,
                "POST",
                Some(body),
                &[
                    ("content-type", "application/json"),
                    ("authorization", "Bearer sk-alice"),
                    ("x-tokengate-priority", "sheddable"),
                ],
            )
            .await
        })
    };
    gw.wait_queued(2).await;
    assert_eq!(
        gw.metric("tokengate_queue_depth_by_class{class=\"sheddable\"}")
            .await
            .as_deref(),
        Some("2")
    );
    // alice as herself, critical: both start at once in the room the flood may not take.
    for i in 0..2 {
        tasks.push(spawn_post(
            &url,
            "sk-alice",
            chat(&format!("alice {i}"), 4, true),
        ));
    }
    backend.wait_held(4).await;
    assert_eq!(inflight_by_class(&gw).await, (2, 0, 2));
    assert_eq!(gw.admin("/admin/backends").await["queued"], 2);
    backend.release.add_permits(10);
    for t in tasks {
        assert_eq!(t.await.unwrap().status, 200);
    }
    assert_eq!(lowered.await.unwrap().status, 200);
    assert_eq!(inflight_by_class(&gw).await, (0, 0, 0));
    assert_eq!(gw.kv_reserved(0).await, 0);
}

#[tokio::test]
async fn a_request_over_its_class_share_is_400_naming_it_and_changes_nothing() {
    // One chat of 211 tokens holds 170,721,280 bytes (two 128-token blocks of 65,536 bytes a
    // token, plus the 153,944,064-byte state); the backend holds 200,000,000, bob's half 1e8.
    let (gw, backend) = gateway_with(FakeSpec::default(), |cfg| {
        cfg.backends[0].kv_capacity_bytes = Some(200_000_000);
        cfg.tenants[1].priority = Priority::Sheddable;
    })
    .await;
    assert_eq!(chat_tokens("a"), 11);
    let r = gw.chat("sk-bob", &chat("a", 200, false)).await;
    assert_eq!((r.status, r.code().as_str()), (400, "exceeds_kv_capacity"));
    assert_eq!(
        r.json()["error"]["message"],
        "the request's KV footprint (211 tokens of prompt + max output = 170721280 bytes) is \
         larger than the share a sheddable request may hold of any backend \
         (admission.sheddable_share = 0.5; largest: 100000000 bytes); lower max_tokens or \
         shorten the prompt"
    );
    assert_eq!(gw.bucket("bob", "decode").await, 1000.0);
    assert_eq!(gw.bucket("bob", "requests").await, 100.0);
    assert!(backend.seen.lock().unwrap().is_empty());
    // alice, standard, may use the whole backend.
    assert_eq!(
        gw.chat("sk-alice", &chat("a", 200, false)).await.status,
        200
    );
    assert_eq!(gw.kv_reserved(0).await, 0);
}
