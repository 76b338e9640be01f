//! The shared limiter store on a real Redis (`TOKENGATE_TEST_REDIS_URL`, which scripts/test
//! starts; tests that stop Redis start a server of their own): the bucket script decides
//! exactly as the Rust core, settles are idempotent, three gateway replicas on one Redis admit
//! one tenant's burst once, and each `on_store_error` policy holds while Redis is down and
//! gives way to Redis again when it returns.

mod common;
mod support;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redis::AsyncCommands;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use support::redis_server::{connect, prefix, time_us, OwnRedis};
use support::*;
use tokengate::clock::SystemClock;
use tokengate::config::Config;
use tokengate::limiter::config::{LimiterConfig, LocalFirst, OnStoreError, StoreKind};
use tokengate::limiter::redis::{RedisStore, StoreMetrics, StoreOpLabel};
use tokengate::limiter::BucketLabels;
use tokengate::limiter::{
    BucketSpec, BucketStore, Cost, Denial, LeaseId, LocalStore, TenantLimits,
};
use tokio::time::Instant;

fn store_config(url: &str, prefix: &str) -> LimiterConfig {
    LimiterConfig {
        store: StoreKind::Redis,
        redis_url: Some(url.to_string()),
        key_prefix: prefix.to_string(),
        retry_interval: Duration::from_millis(100),
        ..LimiterConfig::default()
    }
}

fn spec(rate: f64, burst: f64) -> BucketSpec {
    BucketSpec {
        rate_per_second: rate,
        burst_seconds: burst,
    }
}

/// Limits whose prefill capacity (2,098,765.413 tokens) is ~2 x 10^18 units, far past the
/// 2^53 a Lua number holds exactly.
fn big_limits() -> TenantLimits {
    TenantLimits {
        prefill: spec(123_456.789, 17.0),
        decode: spec(37.3, 11.0),
        requests: spec(30.0, 5.0),
    }
}

/// Sets a tenant's hash in Redis: levels (units) and last update `t_us`.
async fn set_state(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    t_us: u64,
    levels: [u128; 3],
) {
    let _: () = conn
        .hset_multiple(
            key,
            &[
                ("t", t_us.to_string()),
                ("p", levels[0].to_string()),
                ("d", levels[1].to_string()),
                ("r", levels[2].to_string()),
            ],
        )
        .await
        .unwrap();
}

async fn levels(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> (u64, [u128; 3]) {
    let v: Vec<String> = redis::cmd("HMGET")
        .arg(key)
        .arg(&["t", "p", "d", "r"])
        .query_async(conn)
        .await
        .unwrap();
    let n = |i: usize| v[i].parse::<u128>().unwrap();
    (v[0].parse().unwrap(), [n(1), n(2), n(3)])
}

/// With the tenant's last update an hour ahead of Redis's clock, the script's time stands
/// still (it never goes back before the last update), so the Redis store and a local store
/// at one fixed instant must agree on everything: every snapshot, every denial with its
/// exact retry-after, every refund.
#[tokio::test]
async fn the_script_decides_exactly_as_the_core() {
    let url = support::redis_server::url();
    let prefix = prefix("parity");
    let store = RedisStore::new(&store_config(&url, &prefix), StoreMetrics::default()).unwrap();
    let local = LocalStore::new();
    let limits = big_limits();
    let mut conn = connect(&url).await;
    let key = format!("{prefix}{{carol}}");
    let frozen = time_us(&mut conn).await + 3_600_000_000;
    let full = limits.units().map(|u| u.capacity);
    set_state(&mut conn, &key, frozen, full).await;

    let now = Instant::now();
    let mut rng = StdRng::seed_from_u64(14);
    let (mut admitted, mut denied) = (0, 0);
    for i in 0..300u64 {
        let cost = Cost {
            prefill: rng.gen_range(0..100_000),
            decode: rng.gen_range(0..20),
            requests: rng.gen_range(0..2),
        };
        let lease = LeaseId(i);
        let remote = store.charge("carol", &limits, cost, now, lease).await;
        let here = local.charge_now("carol", &limits, cost, now);
        assert_eq!(remote, here, "step {i}: {cost:?}");
        if remote.is_ok() {
            admitted += 1;
            if rng.gen_bool(0.5) {
                let back = Cost {
                    prefill: rng.gen_range(0..=cost.prefill),
                    decode: rng.gen_range(0..=cost.decode),
                    requests: rng.gen_range(0..=cost.requests),
                };
                assert!(store.settle("carol", lease, back).await.unwrap());
                local.refund("carol", lease, back);
            }
        } else {
            denied += 1;
        }
        assert_eq!(
            store.snapshot("carol", &limits, now).await,
            local.snapshot_now("carol", &limits, now),
            "step {i}"
        );
    }
    assert!(
        admitted > 20 && denied > 20,
        "{admitted} admitted, {denied} denied"
    );
    let (t, _) = levels(&mut conn, &key).await;
    assert_eq!(t, frozen, "the script's clock went back");
}

/// Refill over real time, exactly: the level the script writes is the level at the instant
/// it writes (`t`), refilled from the one set, in 128-bit arithmetic, and capped at capacity.
/// Set 5 s back, the prefill bucket (10 s of burst) is mid-refill and the decode bucket (3 s)
/// is full.
#[tokio::test]
async fn refill_is_exact_past_2_pow_53() {
    let url = support::redis_server::url();
    let prefix = prefix("refill");
    let store = RedisStore::new(&store_config(&url, &prefix), StoreMetrics::default()).unwrap();
    let limits = TenantLimits {
        prefill: spec(1_000_000.0, 10.0),
        decode: spec(123.457, 3.0),
        requests: spec(0.001, 1.0),
    };
    let mut conn = connect(&url).await;
    let key = format!("{prefix}{{dave}}");
    let set_at = time_us(&mut conn).await - 5_000_000;
    set_state(&mut conn, &key, set_at, [0, 0, 0]).await;
    store
        .charge("dave", &limits, Cost::default(), Instant::now(), LeaseId(0))
        .await
        .unwrap();
    let (t, got) = levels(&mut conn, &key).await;
    let elapsed_ns = u128::from(t - set_at) * 1000;
    assert!(elapsed_ns >= 5_000_000_000, "written {elapsed_ns} ns after");
    let [prefill, decode, requests] = limits.units();
    assert_eq!(
        got,
        [
            elapsed_ns * prefill.rate,
            decode.capacity,
            requests.capacity
        ]
    );
    // The prefill level is past 2^53 units (a float would have rounded it) and short of its
    // capacity, so the refill itself is what is held exact.
    assert!(got[0] > 1 << 53 && got[0] < prefill.capacity, "{}", got[0]);
}

/// A settle gives back at most what the lease charged, once; a lease that is gone (expired
/// with a replica that died) gives nothing back.
#[tokio::test]
async fn settles_are_idempotent_and_lost_leases_refund_nothing() {
    let url = support::redis_server::url();
    let prefix = prefix("settle");
    let mut config = store_config(&url, &prefix);
    config.lease_ttl = Duration::from_secs(90);
    let store = RedisStore::new(&config, StoreMetrics::default()).unwrap();
    let limits = big_limits();
    let mut conn = connect(&url).await;
    let key = format!("{prefix}{{erin}}");
    let full = limits.units().map(|u| u.capacity);
    let frozen = time_us(&mut conn).await + 3_600_000_000;
    set_state(&mut conn, &key, frozen, full).await;
    let now = Instant::now();
    let cost = Cost {
        prefill: 1000,
        decode: 4,
        requests: 1,
    };
    store
        .charge("erin", &limits, cost, now, LeaseId(1))
        .await
        .unwrap();
    let leases: Vec<String> = conn.keys(format!("{key}:lease:*")).await.unwrap();
    assert_eq!(leases.len(), 1);
    let ttl: i64 = conn.pttl(&leases[0]).await.unwrap();
    assert!(0 < ttl && ttl <= 90_000, "lease ttl {ttl} ms");

    let back = Cost {
        prefill: 0,
        decode: 3,
        requests: 0,
    };
    assert!(store.settle("erin", LeaseId(1), back).await.unwrap());
    assert!(!store.settle("erin", LeaseId(1), back).await.unwrap());
    let (_, after) = levels(&mut conn, &key).await;
    let unit = 1_000_000_000_000u128;
    assert_eq!(
        after,
        [full[0] - 1000 * unit, full[1] - unit, full[2] - unit]
    );
    // A settle asks back more than was charged: the lease caps it.
    store
        .charge("erin", &limits, cost, now, LeaseId(2))
        .await
        .unwrap();
    let greedy = Cost {
        prefill: 10_000,
        decode: 10,
        requests: 1,
    };
    assert!(store.settle("erin", LeaseId(2), greedy).await.unwrap());
    assert_eq!(levels(&mut conn, &key).await.1, after);
    // The lease vanished (its replica died and the TTL passed): nothing comes back.
    store
        .charge("erin", &limits, cost, now, LeaseId(3))
        .await
        .unwrap();
    let leases: Vec<String> = conn.keys(format!("{key}:lease:*")).await.unwrap();
    let _: () = conn.del(&leases).await.unwrap();
    assert!(!store.settle("erin", LeaseId(3), cost).await.unwrap());
    assert_eq!(
        levels(&mut conn, &key).await.1,
        [after[0] - 1000 * unit, after[1] - 4 * unit, after[2] - unit]
    );
}

/// A gateway config whose tenant alice has `alice` as limits, with `[limiter]` `limiter`.
fn gateway_config(backend: SocketAddr, alice: &str, limiter: &str) -> Config {
    let text = config_text(&[backend]).replacen(
        "prefill_tokens_per_second = 1000\ndecode_tokens_per_second = 100\nrequests_per_second = 10\nburst_seconds = 10",
        alice,
        1,
    );
    Config::parse(&format!("{text}\n[limiter]\n{limiter}"))
        .unwrap()
        .into_inner()
}

fn redis_limiter(url: &str, prefix: &str, policy: &str) -> String {
    format!(
        "store = \"redis\"\nredis_url = \"{url}\"\nkey_prefix = \"{prefix}\"\nretry_interval = \"100ms\"\ncommand_timeout = \"200ms\"\n{policy}\n"
    )
}

/// Three replicas on one Redis, hammered at once by one tenant: the decode tokens they admit
/// together stay within one burst plus the rate times the run, so the burst is admitted
/// once, not once per replica. The same in local-first mode (slices of 20 tokens): then up to
/// a slice per replica may idle, and each replica shut down gives its slices back, leaving in
/// Redis's slice records exactly what was admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_admit_one_burst_once() {
    for local_first in ["", "local_first = { slice = 0.1 }"] {
        three_replicas_hammered(local_first).await;
    }
}

async fn three_replicas_hammered(local_first: &str) {
    let url = support::redis_server::url();
    let prefix = prefix("replicas");
    let backend = FakeBackend::start(FakeSpec::default()).await;
    // Decode 20 tokens/s x 10 s = 200; each request reserves (and uses) 10.
    let alice = "prefill_tokens_per_second = 100000\ndecode_tokens_per_second = 20\nrequests_per_second = 1000\nburst_seconds = 10";
    let limiter = redis_limiter(&url, &prefix, local_first);
    let mut replicas = Vec::new();
    for _ in 0..3 {
        replicas.push(Arc::new(
            TestGateway::start(gateway_config(backend.addr, alice, &limiter)).await,
        ));
    }
    let mut conn = connect(&url).await;
    let started = time_us(&mut conn).await;
    let mut workers = Vec::new();
    for w in 0..12 {
        let gw = replicas[w % 3].clone();
        workers.push(tokio::spawn(async move {
            let mut statuses = Vec::new();
            for _ in 0..20 {
                let r = gw.chat("sk-alice", &chat("hi", 10, false)).await;
                if r.status == 429 {
                    assert_eq!(r.code(), "rate_limit_exceeded");
                    assert!(r.headers.contains_key("retry-after"));
                    assert_eq!(r.headers["x-ratelimit-limit-tokens"], "200");
                } else {
                    assert_eq!(r.status, 200, "{}", r.text());
                    assert_eq!(r.json()["usage"]["completion_tokens"], 10);
                }
                statuses.push(r.status);
            }
            statuses
        }));
    }
    let mut admitted = 0u64;
    let mut refused = 0u64;
    for w in workers {
        for status in w.await.unwrap() {
            match status {
                200 => admitted += 1,
                _ => refused += 1,
            }
        }
    }
    let elapsed_us = u128::from(time_us(&mut conn).await - started);
    let tokens = u128::from(admitted) * 10;
    // burst + rate x elapsed, in whole tokens: 200 + 20 tokens/s.
    let bound = 200 + 20 * elapsed_us / 1_000_000;
    assert!(
        tokens <= bound,
        "{local_first}: {tokens} tokens admitted in {elapsed_us} us: over {bound}"
    );
    // Local-first: a slice (20) per replica may idle.
    let idle = if local_first.is_empty() { 0 } else { 3 * 20 };
    assert!(
        tokens + idle >= 200,
        "{local_first}: the burst itself was admitted: {tokens}"
    );
    assert_eq!(admitted + refused, 240);
    assert!(refused > 0);
    // Replicas each with their own buckets would have admitted 200 each: 600 at least. The
    // bound stays under that for any run shorter than 20 s.
    assert!(
        bound < 600,
        "the run took {elapsed_us} us: too long to tell"
    );
    assert_eq!(backend.seen.lock().unwrap().len() as u64, admitted);
    if local_first.is_empty() {
        return;
    }
    // Each replica shut down gives back what its slices hold: the records keep what was
    // admitted (every request used all it reserved), nothing more.
    for gw in replicas {
        let gw = Arc::into_inner(gw).expect("the workers are done");
        gw.running.shutdown().await;
    }
    let records: Vec<String> = conn
        .keys(format!("{prefix}{{alice}}:slice:*"))
        .await
        .unwrap();
    let mut decode = 0u128;
    for key in records {
        let v: String = conn.get(key).await.unwrap();
        decode += v.split(' ').nth(1).unwrap().parse::<u128>().unwrap();
    }
    assert_eq!(decode, tokens * UNIT, "{local_first}");
}

/// One gateway on a Redis of its own, with `policy`: Alice may make 10 requests (0.1/s x 100
/// s: one more every 10 s of Redis's clock; the local fallback's clock is frozen). Its store is
/// marked down at its first failure: these tests stop Redis and watch the policy take over.
async fn gateway_on_own_redis(policy: &str, test: &str) -> (OwnRedis, TestGateway, FakeBackend) {
    let redis = OwnRedis::start().await;
    let backend = FakeBackend::start(FakeSpec::default()).await;
    let alice = "prefill_tokens_per_second = 1000\ndecode_tokens_per_second = 10\nrequests_per_second = 0.1\nburst_seconds = 100";
    let policy = format!("{policy}\nfailures_before_down = 1");
    let limiter = redis_limiter(&redis.url(), &prefix(test), &policy);
    let gw = TestGateway::start(gateway_config(backend.addr, alice, &limiter)).await;
    (redis, gw, backend)
}

async fn statuses(gw: &TestGateway, n: usize) -> Vec<u16> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(gw.chat("sk-alice", &chat("hi", 5, false)).await.status);
    }
    out
}

/// Redis is back: the probe finds it, and charges land in it again.
async fn recovers(redis: &mut OwnRedis, gw: &TestGateway) {
    redis.restart().await;
    gw.wait_metric("tokengate_limiter_store_fallback", "0")
        .await;
    gw.wait_metric("tokengate_kv_ledger_fallback", "0").await;
    assert_eq!(statuses(gw, 1).await, [200]);
    let mut conn = connect(&redis.url()).await;
    let keys: Vec<String> = conn.keys("*{alice}").await.unwrap();
    assert_eq!(keys.len(), 1, "alice's buckets are in the restarted Redis");
}

#[tokio::test]
async fn fail_closed_refuses_with_503_until_redis_returns() {
    let (mut redis, gw, backend) = gateway_on_own_redis("", "closed").await;
    assert_eq!(statuses(&gw, 2).await, [200, 200]);
    redis.stop().await;
    let r = gw.chat("sk-alice", &chat("hi", 5, false)).await;
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.code(), "limiter_unavailable");
    assert_eq!(r.json()["error"]["type"], "server_error");
    let message = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(
        message.starts_with("the rate limiter's shared store cannot be reached (")
            && message.ends_with(
                "and limiter.on_store_error is fail_closed: no request is admitted until it answers; retry after 0.100 s"
            ),
        "{message}"
    );
    assert_eq!(r.headers["retry-after"], "1");
    gw.wait_metric("tokengate_limiter_store_fallback", "1")
        .await;
    let metrics = gw.metrics().await;
    assert!(
        // The first command to fail: a peek, or the previous request's settle on its task.
        metrics.contains("tokengate_limiter_store_errors_total{op=\"check\"} ")
            || metrics.contains("tokengate_limiter_store_errors_total{op=\"settle\"} "),
        "{metrics}"
    );
    assert_eq!(backend.seen.lock().unwrap().len(), 2, "nothing reached it");
    recovers(&mut redis, &gw).await;
}

#[tokio::test]
async fn fail_open_admits_without_limits_until_redis_returns() {
    let policy = "on_store_error = \"fail_open\"";
    let (mut redis, gw, _backend) = gateway_on_own_redis(policy, "open").await;
    assert_eq!(statuses(&gw, 10).await, [200; 10]);
    assert_eq!(statuses(&gw, 1).await, [429]);
    // Past the refusal's retry-after (its levels are no longer what refuses), the buckets full
    // again: 15 requests are more than they hold, so all 15 admitted means no limit applied.
    gw.clock.advance(std::time::Duration::from_secs(3600));
    redis.stop().await;
    assert_eq!(statuses(&gw, 15).await, [200; 15]);
    recovers(&mut redis, &gw).await;
}

#[tokio::test]
async fn local_limits_each_replica_to_its_share_until_redis_returns() {
    let policy = "on_store_error = \"local\"\nexpected_replicas = 2";
    let (mut redis, gw, _backend) = gateway_on_own_redis(policy, "local").await;
    redis.stop().await;
    // 10 requests / 2 replicas: this one admits 5.
    assert_eq!(statuses(&gw, 6).await, [200, 200, 200, 200, 200, 429]);
    let r = gw.chat("sk-alice", &chat("hi", 5, false)).await;
    assert_eq!(r.headers["x-ratelimit-limit-requests"], "5");
    // The KV ledger fell back too (admitting against half of each backend meanwhile).
    gw.wait_metric("tokengate_kv_ledger_fallback", "1").await;
    let v = gw.admin("/admin/backends").await;
    assert_eq!(v["shared_ledger"]["state"], "fallback", "{v}");
    recovers(&mut redis, &gw).await;
    let v = gw.admin("/admin/backends").await;
    assert_eq!(v["shared_ledger"]["state"], "redis", "{v}");
}

/// Leases given back while Redis is away wait for it, counted in `/admin/backends`, and all go
/// back once it answers again (600 of them, in calls of at most 256).
#[tokio::test]
async fn releases_made_while_redis_is_away_reach_it_when_it_returns() {
    let policy = "on_store_error = \"fail_open\"\nkv_lease_ttl = \"1s\"";
    let (mut redis, gw, _backend) = gateway_on_own_redis(policy, "unsent").await;
    let unsent = |v: &serde_json::Value| v["shared_ledger"]["releases_unsent"].as_u64().unwrap();
    let wait_unsent = |n: u64| {
        let gw = &gw;
        async move {
            let deadline = SystemClock.instant() + Duration::from_secs(10);
            loop {
                let v = gw.admin("/admin/backends").await;
                if unsent(&v) == n {
                    return v;
                }
                assert!(SystemClock.instant() < deadline, "{n} unsent: {v}");
                tokio::task::yield_now().await;
            }
        }
    };
    redis.stop().await;
    // The heartbeat (every third of the TTL) finds Redis gone before any request does.
    gw.wait_metric("tokengate_kv_ledger_fallback", "1").await;
    assert_eq!(statuses(&gw, 600).await, [200; 600]);
    let v = wait_unsent(600).await;
    assert_eq!(v["shared_ledger"]["here"][0]["inflight"], 0, "{v}");
    redis.restart().await;
    gw.wait_metric("tokengate_kv_ledger_fallback", "0").await;
    let v = wait_unsent(0).await;
    assert_eq!(v["shared_ledger"]["state"], "redis", "{v}");
}

/// The shared KV ledger's totals in Redis for `backend`: (reserved bytes, live leases).
async fn ledger_totals(
    conn: &mut redis::aio::MultiplexedConnection,
    prefix: &str,
    backend: SocketAddr,
) -> (u64, u64) {
    let (mut reserved, mut live) = (0, 0);
    // Kept per class (0 sheddable, 1 standard, 2 critical) as "CLASS URL".
    for class in 0..3 {
        let field = format!("{class} http://{backend}");
        let r: Option<u64> = conn
            .hget(format!("{prefix}{{kv-ledger}}:reserved"), &field)
            .await
            .unwrap();
        let l: Option<u64> = conn
            .hget(format!("{prefix}{{kv-ledger}}:live"), &field)
            .await
            .unwrap();
        reserved += r.unwrap_or(0);
        live += l.unwrap_or(0);
    }
    (reserved, live)
}

/// Waits (at most 10 s) until the ledger's totals for `backend` satisfy `done`.
async fn wait_totals(
    conn: &mut redis::aio::MultiplexedConnection,
    prefix: &str,
    backend: SocketAddr,
    done: impl Fn((u64, u64)) -> bool,
) -> (u64, u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let totals = ledger_totals(conn, prefix, backend).await;
        if done(totals) {
            return totals;
        }
        assert!(
            Instant::now() < deadline,
            "ledger totals stuck at {totals:?}"
        );
        tokio::task::yield_now().await;
    }
}

/// Requests queued for KV on each of `replicas`, summed.
async fn queued(replicas: &[TestGateway]) -> u64 {
    let mut n = 0;
    for r in replicas {
        n += r.admin("/admin/backends").await["queued"].as_u64().unwrap();
    }
    n
}

/// A gateway config with one backend whose batch cap is `max_batch`, on the shared store.
fn batch_config(backend: SocketAddr, max_batch: u32, limiter: &str) -> String {
    format!(
        "{}\n[limiter]\n{limiter}",
        config_text(&[backend])
            .replacen("max_batch = 32", &format!("max_batch = {max_batch}"), 1)
            .replacen("queue_deadline = \"5s\"", "queue_deadline = \"30s\"", 1)
    )
}

/// Three replicas in front of one backend that runs 2 sequences at once: 6 requests, 2 sent
/// to each replica, and only 2 reach the backend at any time, whichever replica admitted
/// them; as each finishes exactly one more is admitted (by whichever replica has a waiter),
/// and the ledger ends empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_share_one_kv_ledger() {
    let url = support::redis_server::url();
    let prefix = prefix("kv-shared");
    let backend = FakeBackend::start(FakeSpec::held()).await;
    let text = batch_config(backend.addr, 2, &redis_limiter(&url, &prefix, ""));
    let mut replicas = Vec::new();
    for _ in 0..3 {
        let config = Config::parse(&text).unwrap().into_inner();
        replicas.push(TestGateway::start(config).await);
    }
    let mut conn = connect(&url).await;
    let mut answers = Vec::new();
    for r in &replicas {
        for _ in 0..2 {
            answers.push(spawn_post(
                &r.url("/v1/chat/completions"),
                "sk-alice",
                chat("hi", 5, true),
            ));
        }
    }
    backend.wait_held(2).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while queued(&replicas).await != 4 {
        assert!(Instant::now() < deadline, "4 requests never queued");
        tokio::task::yield_now().await;
    }
    assert_eq!(backend.seen.lock().unwrap().len(), 2);
    let (reserved, live) = ledger_totals(&mut conn, &prefix, backend.addr).await;
    assert_eq!(live, 2);
    let mut here = 0;
    for r in &replicas {
        let v = r.admin("/admin/backends").await;
        assert_eq!(v["shared_ledger"]["state"], "redis", "{v}");
        here += v["shared_ledger"]["here"][0]["kv_reserved_bytes"]
            .as_u64()
            .unwrap();
    }
    assert_eq!(here, reserved, "the replicas' leases are the ledger's");
    for k in 0..4 {
        backend.release.add_permits(1);
        backend.wait_held(3 + k).await;
        assert_eq!(backend.seen.lock().unwrap().len(), 3 + k);
    }
    backend.release.add_permits(2);
    for a in answers {
        let r = a.await.unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
    }
    assert_eq!(backend.seen.lock().unwrap().len(), 6);
    wait_totals(&mut conn, &prefix, backend.addr, |t| t == (0, 0)).await;
}

/// A request of `n` choices holds `n` of the shared batch's slots: with a batch of 3 and one
/// replica's request of 2 choices held by the backend, another replica's request of 2 waits
/// (1 slot is free), and it runs once the first has finished; the ledger counts sequences, and
/// ends empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_of_n_choices_holds_n_slots_of_the_shared_batch() {
    let url = support::redis_server::url();
    let prefix = prefix("kv-seqs");
    let backend = FakeBackend::start(FakeSpec::held()).await;
    let text = batch_config(backend.addr, 3, &redis_limiter(&url, &prefix, ""));
    let mut replicas = Vec::new();
    for _ in 0..2 {
        let config = Config::parse(&text).unwrap().into_inner();
        replicas.push(TestGateway::start(config).await);
    }
    let mut conn = connect(&url).await;
    let mut body = chat("hi", 5, true);
    body["n"] = serde_json::json!(2);
    let first = spawn_post(
        &replicas[0].url("/v1/chat/completions"),
        "sk-alice",
        body.clone(),
    );
    backend.wait_held(1).await;
    assert_eq!(ledger_totals(&mut conn, &prefix, backend.addr).await.1, 2);
    let second = spawn_post(&replicas[1].url("/v1/chat/completions"), "sk-alice", body);
    let deadline = Instant::now() + Duration::from_secs(10);
    while queued(&replicas).await != 1 {
        assert!(Instant::now() < deadline, "the second request never queued");
        tokio::task::yield_now().await;
    }
    assert_eq!(backend.seen.lock().unwrap().len(), 1);
    backend.release.add_permits(1);
    backend.wait_held(2).await;
    assert_eq!(ledger_totals(&mut conn, &prefix, backend.addr).await.1, 2);
    backend.release.add_permits(1);
    for a in [first, second] {
        let r = a.await.unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
    }
    wait_totals(&mut conn, &prefix, backend.addr, |t| t == (0, 0)).await;
}

/// Two replicas on the shared store (key prefix for `test`, returned) in front of one held
/// backend of `max_batch` sequences, with `admission` in place of the queue's bound and alice
/// in class critical.
async fn critical_alice_on_two_replicas(
    test: &str,
    max_batch: u32,
    admission: &str,
) -> (FakeBackend, [TestGateway; 2], String) {
    let prefix = prefix(test);
    let backend = FakeBackend::start(FakeSpec::held()).await;
    let limiter = redis_limiter(&support::redis_server::url(), &prefix, "");
    let text = batch_config(backend.addr, max_batch, &limiter)
        .replacen("queue_max_waiting = 64", admission, 1)
        .replacen(
            "name = \"alice\"\n",
            "name = \"alice\"\npriority = \"critical\"\n",
            1,
        );
    let a = TestGateway::start(Config::parse(&text).unwrap().into_inner()).await;
    let b = TestGateway::start(Config::parse(&text).unwrap().into_inner()).await;
    (backend, [a, b], prefix)
}

/// A chat request of class `class` (alice's own is critical; the header lowers it), its
/// prompt naming it.
fn post_class(gw: &TestGateway, prompt: &str, class: &str) -> tokio::task::JoinHandle<Received> {
    let url = gw.url("/v1/chat/completions");
    let body = chat(prompt, 5, true).to_string().into_bytes();
    let class = class.to_string();
    tokio::spawn(async move {
        let headers = [
            ("content-type", "application/json"),
            ("authorization", "Bearer sk-alice"),
            ("x-tokengate-priority", class.as_str()),
        ];
        send(&url, "POST", Some(body), &headers).await
    })
}

/// Waits (at most 10 s) until `gw` has `n` requests queued for KV.
async fn until_queued(gw: &TestGateway, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while queued(std::slice::from_ref(gw)).await != n {
        assert!(Instant::now() < deadline, "{n} requests never queued");
        tokio::task::yield_now().await;
    }
}

/// The queue is the local ledger's own over the shared one. Behind a backend of one sequence
/// held through replica A, replica B (queue bound 3) sheds a sheddable arrival at once while a
/// standard one waits; a second critical arrival takes the place of the newest standard
/// waiter in the full queue; and as A's lease goes (room another replica freed) and then each
/// of B's own, the critical waiters are granted first, in arrival order, and the standard one
/// that arrived before them last. The ledger ends empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priorities_hold_across_the_shared_ledger() {
    let (backend, [a, b], prefix) =
        critical_alice_on_two_replicas("kv-priority", 1, "queue_max_waiting = 3").await;
    let mut conn = connect(&support::redis_server::url()).await;
    let refused = |r: &Received, says: &str| {
        assert_eq!(
            (r.status, r.code()),
            (503, "capacity_exhausted".to_string())
        );
        assert!(r.text().contains(says), "{}", r.text());
    };
    let held = post_class(&a, "held", "standard");
    backend.wait_held(1).await;
    let standard = post_class(&b, "standard 1", "standard");
    until_queued(&b, 1).await;
    let shed = post_class(&b, "sheddable", "sheddable").await.unwrap();
    refused(&shed, "1 requests of a higher priority class wait");
    let newest_standard = post_class(&b, "standard 2", "standard");
    until_queued(&b, 2).await;
    let first = post_class(&b, "critical 1", "critical");
    until_queued(&b, 3).await;
    let second = post_class(&b, "critical 2", "critical");
    let displaced = newest_standard.await.unwrap();
    refused(&displaced, "gave its place to a critical request");
    until_queued(&b, 3).await;
    let prompts = || -> Vec<String> {
        let seen = backend.seen.lock().unwrap();
        (seen.iter())
            .map(|r| r["messages"][0]["content"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(prompts(), ["held"]);
    for n in 2..=4 {
        backend.release.add_permits(1);
        backend.wait_held(n).await;
    }
    backend.release.add_permits(1);
    for answer in [held, first, second, standard] {
        let r = answer.await.unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
    }
    assert_eq!(
        prompts(),
        ["held", "critical 1", "critical 2", "standard 1"]
    );
    assert_eq!(queued(&[a, b]).await, 0);
    wait_totals(&mut conn, &prefix, backend.addr, |t| t == (0, 0)).await;
}

/// Class shares count every replica's leases: with sheddable allowed half of a 2-sequence
/// backend, a sheddable request held through replica A leaves replica B's sheddable arrival
/// waiting although the backend has a free sequence, and B's critical arrival takes that
/// sequence at once; when A's request ends, B's sheddable one is admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn class_shares_hold_across_the_shared_ledger() {
    let (backend, [a, b], prefix) =
        critical_alice_on_two_replicas("kv-shares", 2, "sheddable_share = 0.5").await;
    let mut conn = connect(&support::redis_server::url()).await;
    let first = post_class(&a, "sheddable 1", "sheddable");
    backend.wait_held(1).await;
    let second = post_class(&b, "sheddable 2", "sheddable");
    until_queued(&b, 1).await;
    let critical = post_class(&b, "critical", "critical");
    backend.wait_held(2).await;
    assert_eq!(ledger_totals(&mut conn, &prefix, backend.addr).await.1, 2);
    let v = b.admin("/admin/backends").await;
    assert_eq!(v["queued"], 1, "{v}");
    // One sheddable and one critical lease in Redis, from two replicas.
    let live: Vec<Option<u64>> = redis::cmd("HMGET")
        .arg(format!("{prefix}{{kv-ledger}}:live"))
        .arg(
            (0..3)
                .map(|c| format!("{c} http://{}", backend.addr))
                .collect::<Vec<_>>(),
        )
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(live, [Some(1), None, Some(1)]);
    backend.release.add_permits(1);
    backend.wait_held(3).await;
    backend.release.add_permits(2);
    for answer in [first, critical, second] {
        let r = answer.await.unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let seen: Vec<String> = (backend.seen.lock().unwrap().iter())
        .map(|r| r["messages"][0]["content"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(seen, ["sheddable 1", "critical", "sheddable 2"]);
    wait_totals(&mut conn, &prefix, backend.addr, |t| t == (0, 0)).await;
}

/// A replica process killed (SIGKILL) while its request runs: it never gives its lease back,
/// but it stops renewing it, so within `kv_lease_ttl` the other replica's waiter is admitted;
/// the dead replica leaves the registry and the ledger holds the living one's lease only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_replicas_leases_expire_and_the_others_admit_again() {
    let url = support::redis_server::url();
    let prefix = prefix("kv-kill");
    let backend = FakeBackend::start(FakeSpec::held()).await;
    let limiter = redis_limiter(
        &url,
        &prefix,
        "connect_timeout = \"100ms\"\nkv_lease_ttl = \"1s\"",
    );
    let text = batch_config(backend.addr, 1, &limiter);
    let dir = TempDir::new("kv-kill");
    let (mut doomed, _) = spawn_serve(&dir, &text);
    let stderr = doomed.stderr.take().unwrap();
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stderr));
    let listening = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.contains("tokengate listening") {
                return line;
            }
        }
        panic!("the replica exited before listening");
    })
    .await
    .expect("the replica listens within 30 s");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let doomed_url = format!(
        "http://{}/v1/chat/completions",
        logged_addr(&listening, "addr=")
    );
    let survivor = TestGateway::start(Config::parse(&text).unwrap().into_inner()).await;
    let mut conn = connect(&url).await;

    // Streaming: answered (200) at its first token, then held at the backend.
    let orphan = start_request(
        &doomed_url,
        "POST",
        Some(chat("hi", 5, true).to_string().into_bytes()),
        &[
            ("content-type", "application/json"),
            ("authorization", "Bearer sk-alice"),
        ],
    )
    .await;
    assert_eq!(orphan.status(), 200);
    backend.wait_held(1).await;
    assert_eq!(ledger_totals(&mut conn, &prefix, backend.addr).await.1, 1);
    let registry = format!("{prefix}{{kv-ledger}}:replicas");
    let waiter = spawn_post(
        &survivor.url("/v1/chat/completions"),
        "sk-alice",
        chat("hi", 5, true),
    );
    survivor.wait_queued(1).await;
    let before: Vec<String> = conn.zrange(&registry, 0, -1).await.unwrap();
    assert_eq!(before.len(), 2, "{before:?}");

    doomed.start_kill().unwrap();
    doomed.wait().await.unwrap();
    // The survivor's waiter reaches the backend once the dead replica's lease expired.
    backend.wait_held(2).await;
    let after: Vec<String> = conn.zrange(&registry, 0, -1).await.unwrap();
    assert_eq!(
        after.len(),
        1,
        "the dead replica left the registry: {after:?}"
    );
    let v = survivor.admin("/admin/backends").await;
    assert_eq!(after[0], v["shared_ledger"]["replica"].as_str().unwrap());
    let here = v["shared_ledger"]["here"][0]["kv_reserved_bytes"]
        .as_u64()
        .unwrap();
    assert_eq!(
        ledger_totals(&mut conn, &prefix, backend.addr).await,
        (here, 1)
    );
    backend.release.add_permits(2);
    let r = waiter.await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    wait_totals(&mut conn, &prefix, backend.addr, |t| t == (0, 0)).await;
}

/// A replica's slice record of `tenant` in Redis (units per bucket; none: all zero).
async fn slice_record(
    conn: &mut redis::aio::MultiplexedConnection,
    prefix: &str,
    tenant: &str,
    store: &RedisStore,
) -> [u128; 3] {
    let keys: Vec<String> = conn
        .keys(format!("{prefix}{{{tenant}}}:slice:*"))
        .await
        .unwrap();
    let mine = keys
        .iter()
        .find(|k| k.ends_with(&store.replica_name()))
        .cloned();
    let Some(key) = mine else { return [0; 3] };
    let v: String = conn.get(key).await.unwrap();
    let n: Vec<u128> = v.split(' ').map(|p| p.parse().unwrap()).collect();
    [n[0], n[1], n[2]]
}

/// What `metrics` says the replica holds of `tenant`'s slices, in units.
fn held_gauge(metrics: &StoreMetrics, tenant: &str) -> [f64; 3] {
    ["prefill", "decode", "requests"].map(|bucket| {
        metrics
            .slice_held
            .get_or_create(&BucketLabels {
                tenant: tenant.into(),
                bucket: bucket.into(),
            })
            .get()
    })
}

const UNIT: u128 = 1_000_000_000_000;

/// Three replicas in local-first mode (slices of a tenth of each bucket) on one Redis,
/// hammered by one tenant from 12 tasks: the decode tokens admitted (charged less refunded)
/// stay within `burst + rate x elapsed` exactly (elapsed by Redis `TIME`), most charges make
/// no round trip, and each replica's held-idle gauge is exactly what its slice record in
/// Redis holds less what it admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_local_first_replicas_admit_one_burst_once_and_export_what_they_hold() {
    let url = support::redis_server::url();
    let prefix = prefix("slices");
    let mut config = store_config(&url, &prefix);
    config.local_first = Some(LocalFirst {
        slice: 0.1,
        return_after: Duration::from_secs(3600),
    });
    // Decode: 20 tokens/s x 10 s = 200, slices of 20; prefill and requests never short.
    let limits = TenantLimits {
        prefill: spec(1_000_000.0, 10.0),
        decode: spec(20.0, 10.0),
        requests: spec(1_000.0, 10.0),
    };
    let replicas: Vec<(RedisStore, StoreMetrics)> = (0..3)
        .map(|_| {
            let metrics = StoreMetrics::default();
            (RedisStore::new(&config, metrics.clone()).unwrap(), metrics)
        })
        .collect();
    let cost = Cost {
        prefill: 100,
        decode: 10,
        requests: 1,
    };
    let back = Cost {
        prefill: 0,
        decode: 6,
        requests: 0,
    };
    let mut conn = connect(&url).await;
    let started = time_us(&mut conn).await;
    let mut tasks = Vec::new();
    for (r, (store, _)) in replicas.iter().enumerate() {
        for t in 0..4u64 {
            let (store, limits) = (store.clone(), limits.clone());
            tasks.push(tokio::spawn(async move {
                // (replica, charges, units admitted net)
                let mut admitted = [0u128; 3];
                let mut charged = 0;
                for i in 0..60u64 {
                    let lease = LeaseId(t * 1000 + i);
                    if store
                        .charge("zoe", &limits, cost, Instant::now(), lease)
                        .await
                        .is_err()
                    {
                        continue;
                    }
                    charged += 1;
                    for (a, c) in admitted.iter_mut().zip(cost.units()) {
                        *a += c;
                    }
                    // Every other reservation used 4 of its 10 decode tokens.
                    if i % 2 == 0 {
                        store.refund("zoe", lease, back);
                        for (a, b) in admitted.iter_mut().zip(back.units()) {
                            *a -= b;
                        }
                    }
                }
                (r, charged, admitted)
            }));
        }
    }
    let mut admitted = [[0u128; 3]; 3];
    let mut charged = 0;
    for task in tasks {
        let (r, c, a) = task.await.unwrap();
        charged += c;
        for (sum, a) in admitted[r].iter_mut().zip(a) {
            *sum += a;
        }
    }
    let elapsed_ns = u128::from(time_us(&mut conn).await - started) * 1000;
    let decode = limits.units()[1];
    let total: u128 = admitted.iter().map(|a| a[1]).sum();
    assert!(
        total <= decode.capacity + decode.rate * elapsed_ns,
        "{total} units of decode admitted in {elapsed_ns} ns"
    );
    // The hammering spent the burst: at least half of it admitted (the rest may idle in
    // slices, a slice per replica, or wait in Redis for a charge that needs more).
    assert!(
        total >= decode.capacity / 2,
        "{total} units of decode admitted"
    );
    assert!(charged >= 20, "{charged} charges");
    // Each replica's gauge: leased (its record in Redis) and not admitted. The refunds' excess
    // goes back by a task: wait (bounded) until Redis has it.
    let deadline = Instant::now() + Duration::from_secs(10);
    for (r, (store, metrics)) in replicas.iter().enumerate() {
        loop {
            let record = slice_record(&mut conn, &prefix, "zoe", store).await;
            let held: [f64; 3] =
                std::array::from_fn(|i| (record[i] - admitted[r][i]) as f64 / UNIT as f64);
            if held_gauge(metrics, "zoe") == held {
                assert!(held[1] <= 20.0, "replica {r} holds {held:?}");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "replica {r}: gauge {:?}, record {record:?} less admitted {:?}",
                held_gauge(metrics, "zoe"),
                admitted[r]
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// While Redis is away a local-first replica still spends what its slice holds (it was taken
/// from the shared buckets before), and only then meets `on_store_error`.
#[tokio::test]
async fn slices_are_spent_while_redis_is_away_then_the_policy_decides() {
    for policy in [
        OnStoreError::FailClosed,
        OnStoreError::FailOpen,
        OnStoreError::Local,
    ] {
        let mut redis = OwnRedis::start().await;
        let mut config = store_config(&redis.url(), &prefix("slices-away"));
        config.on_store_error = policy;
        config.expected_replicas = (policy == OnStoreError::Local).then_some(2);
        config.failures_before_down = 1;
        config.local_first = Some(LocalFirst {
            slice: 0.5,
            return_after: Duration::from_secs(3600),
        });
        let metrics = StoreMetrics::default();
        let store = RedisStore::new(&config, metrics.clone()).unwrap();
        // Decode 4 tokens/s x 10 s = 40: slices of 20.
        let limits = TenantLimits {
            prefill: spec(1_000_000.0, 10.0),
            decode: spec(4.0, 10.0),
            requests: spec(1_000.0, 10.0),
        };
        let cost = Cost {
            prefill: 10,
            decode: 5,
            requests: 1,
        };
        let now = Instant::now();
        // The first charge leases its need and a slice: 20 decode tokens held after it.
        store
            .charge("yan", &limits, cost, now, LeaseId(0))
            .await
            .unwrap();
        assert_eq!(held_gauge(&metrics, "yan")[1], 20.0, "{policy:?}");
        redis.stop().await;
        for i in 1..=4 {
            store
                .charge("yan", &limits, cost, now, LeaseId(i))
                .await
                .unwrap_or_else(|e| panic!("{policy:?}: charge {i} from the slice: {e}"));
        }
        assert_eq!(held_gauge(&metrics, "yan")[1], 0.0, "{policy:?}");
        assert!(store.is_healthy(), "no round trip was needed so far");
        let past = store.charge("yan", &limits, cost, now, LeaseId(5)).await;
        assert!(!store.is_healthy(), "{policy:?}");
        let slice_errors = metrics
            .errors
            .get_or_create(&StoreOpLabel { op: "slice".into() })
            .get();
        assert_eq!(slice_errors, 1, "{policy:?}");
        match policy {
            OnStoreError::FailClosed => {
                assert!(matches!(past, Err(Denial::Unavailable { .. })), "{past:?}")
            }
            OnStoreError::FailOpen => assert!(past.is_ok(), "{past:?}"),
            // Alone with half the limits: 20 decode tokens, 4 charges of 5.
            OnStoreError::Local => {
                assert!(past.is_ok(), "{past:?}");
                for i in 6..=8 {
                    store
                        .charge("yan", &limits, cost, now, LeaseId(i))
                        .await
                        .unwrap();
                }
                let denied = store.charge("yan", &limits, cost, now, LeaseId(9)).await;
                assert!(
                    matches!(denied, Err(Denial::NotYet { needed: 5, .. })),
                    "{denied:?}"
                );
            }
        }
    }
}

/// A store in local-first mode with slices of half each bucket (idle ones given back after
/// `return_after`), on the test Redis under `test`'s prefix: (url, prefix, metrics, store).
fn half_sliced_store(
    test: &str,
    return_after: Duration,
) -> (String, String, StoreMetrics, RedisStore) {
    let url = support::redis_server::url();
    let prefix = prefix(test);
    let mut config = store_config(&url, &prefix);
    config.local_first = Some(LocalFirst {
        slice: 0.5,
        return_after,
    });
    let metrics = StoreMetrics::default();
    let store = RedisStore::new(&config, metrics.clone()).unwrap();
    (url, prefix, metrics, store)
}

/// The small charge the slice tests lease their slice with.
const SMALL: Cost = Cost {
    prefill: 1000,
    decode: 4,
    requests: 1,
};

/// A local-first replica stopping gives back what its slice holds (`Running::shutdown` calls
/// this once every request has settled): the shared level is then exactly the capacity less
/// what was admitted, and the slice record keeps only that.
#[tokio::test]
async fn a_stopping_replica_gives_its_slices_back() {
    let (url, prefix, metrics, store) = half_sliced_store("slices-back", Duration::from_secs(3600));
    let limits = big_limits();
    let mut conn = connect(&url).await;
    let key = format!("{prefix}{{una}}");
    // The tenant's clock an hour ahead: nothing refills during the test.
    let full = limits.units().map(|u| u.capacity);
    let frozen = time_us(&mut conn).await + 3_600_000_000;
    set_state(&mut conn, &key, frozen, full).await;
    let cost = SMALL;
    let now = Instant::now();
    store
        .charge("una", &limits, cost, now, LeaseId(0))
        .await
        .unwrap();
    let slice = full.map(|c| (c as f64 * 0.5).floor() as u128);
    let taken: [u128; 3] = std::array::from_fn(|i| cost.units()[i] + slice[i]);
    assert_eq!(
        levels(&mut conn, &key).await.1,
        std::array::from_fn(|i| full[i] - taken[i])
    );
    assert_eq!(slice_record(&mut conn, &prefix, "una", &store).await, taken);
    store.give_back_slices().await;
    assert_eq!(
        levels(&mut conn, &key).await.1,
        std::array::from_fn(|i| full[i] - cost.units()[i])
    );
    assert_eq!(
        slice_record(&mut conn, &prefix, "una", &store).await,
        cost.units()
    );
    assert_eq!(held_gauge(&metrics, "una"), [0.0; 3]);
    // Nothing is held any more: a second call gives nothing.
    store.give_back_slices().await;
    assert_eq!(
        levels(&mut conn, &key).await.1,
        std::array::from_fn(|i| full[i] - cost.units()[i])
    );
}

/// A charge the slice does not cover, cancelled while its lease is in flight (its client went
/// away), gives back what it claimed from the slice: the slice holds what it held before.
#[tokio::test]
async fn a_charge_cancelled_during_its_lease_gives_its_claim_back() {
    let (_, _, metrics, store) = half_sliced_store("slices-cancel", Duration::from_secs(3600));
    let limits = big_limits();
    let cost = SMALL;
    let now = Instant::now();
    store
        .charge("una", &limits, cost, now, LeaseId(0))
        .await
        .unwrap();
    let before = held_gauge(&metrics, "una");
    assert!(before.iter().all(|&t| t > 0.0), "{before:?}");
    // More decode than the slice holds: it claims the slice's and leases the rest. Polled once
    // (up to the round trip), then dropped.
    let more = Cost {
        prefill: 1,
        decode: before[1] as u64 + 1,
        requests: 1,
    };
    let charge = store.charge("una", &limits, more, now, LeaseId(1));
    assert!(futures_util::FutureExt::now_or_never(charge).is_none());
    assert_eq!(held_gauge(&metrics, "una"), before);
}

/// A local-first gateway exports what its slice holds, and its shutdown gives it back: one
/// request (10 decode tokens) leases its need and a slice of 20, the gauge reads 20, and after
/// `Running::shutdown` the slice record holds only the 10 admitted.
#[tokio::test]
async fn a_local_first_gateway_exports_its_slice_and_gives_it_back_at_shutdown() {
    let url = support::redis_server::url();
    let prefix = prefix("slices-gateway");
    let backend = FakeBackend::start(FakeSpec::default()).await;
    let alice = "prefill_tokens_per_second = 100000\ndecode_tokens_per_second = 20\nrequests_per_second = 1000\nburst_seconds = 10";
    let limiter = redis_limiter(&url, &prefix, "local_first = { slice = 0.1 }");
    let gw = TestGateway::start(gateway_config(backend.addr, alice, &limiter)).await;
    let r = gw.chat("sk-alice", &chat("hi", 10, false)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let series = "tokengate_limiter_slice_held_tokens{tenant=\"alice\",bucket=\"decode\"}";
    let held = gw.metric(series).await.expect("exported");
    assert_eq!(held.parse::<f64>().unwrap(), 20.0, "{series} {held}");
    let mut conn = connect(&url).await;
    let record = |v: String| v.split(' ').nth(1).unwrap().parse::<u128>().unwrap();
    let keys: Vec<String> = conn
        .keys(format!("{prefix}{{alice}}:slice:*"))
        .await
        .unwrap();
    assert_eq!(keys.len(), 1);
    assert_eq!(record(conn.get(&keys[0]).await.unwrap()), 30 * UNIT);
    gw.running.shutdown().await;
    assert_eq!(record(conn.get(&keys[0]).await.unwrap()), 10 * UNIT);
}

/// A slice left untouched for `return_after` goes back by itself: the record falls to what
/// was admitted and the gauge to 0 (waited for on Redis, bounded).
#[tokio::test]
async fn an_idle_slice_goes_back_by_itself() {
    let (url, prefix, metrics, store) =
        half_sliced_store("slices-idle", Duration::from_millis(200));
    let limits = big_limits();
    let cost = SMALL;
    store
        .charge("ivo", &limits, cost, Instant::now(), LeaseId(0))
        .await
        .unwrap();
    // The lease filled the slice to one slice: half of each capacity.
    let slice = limits
        .units()
        .map(|u| (u.capacity as f64 * 0.5).floor() as u128 as f64 / UNIT as f64);
    assert_eq!(held_gauge(&metrics, "ivo"), slice);
    let mut conn = connect(&url).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while slice_record(&mut conn, &prefix, "ivo", &store).await != cost.units() {
        assert!(
            Instant::now() < deadline,
            "the idle slice was not given back"
        );
        tokio::task::yield_now().await;
    }
    assert_eq!(held_gauge(&metrics, "ivo"), [0.0; 3]);
}

/// The bucket script's runs on `conn`'s server so far (`INFO commandstats`: `EVALSHA`, and
/// `EVAL` when it is loaded again): on a server of the test's own, every round trip a store
/// made for a charge, a check, a settle or a rebase.
async fn script_calls(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .map(|l| {
            let calls = l.split(['=', ',']).nth(1).unwrap();
            calls.parse::<u64>().unwrap()
        })
        .sum()
}

/// Waits until the server has run the script `n` times (a settle or a rebase runs on a task).
async fn wait_script_calls(conn: &mut redis::aio::MultiplexedConnection, n: u64) {
    let deadline = SystemClock.instant() + Duration::from_secs(10);
    while script_calls(conn).await != n {
        assert!(
            SystemClock.instant() < deadline,
            "the script never ran {n} times"
        );
        tokio::task::yield_now().await;
    }
}

fn retry_after(denial: Result<tokengate::limiter::TenantSnapshot, Denial>) -> Duration {
    match denial {
        Err(Denial::NotYet { retry_after, .. }) => retry_after,
        other => panic!("expected not yet, got {other:?}"),
    }
}

/// A tenant with empty buckets flooding requests: after Redis refuses one, each of its next
/// requests within the retry-after is refused from the levels of that answer, its retry-after
/// counted down exactly, without a round trip; past it, or after a refund, a rebase or with
/// other limits, Redis decides again.
#[tokio::test]
async fn a_refused_tenant_is_refused_again_from_its_last_levels_without_a_round_trip() {
    let redis = OwnRedis::start().await;
    let prefix = prefix("refused");
    let store = RedisStore::new(
        &store_config(&redis.url(), &prefix),
        StoreMetrics::default(),
    )
    .unwrap();
    let mut conn = connect(&redis.url()).await;
    // Decode 10 tokens/s; fay's hash frozen (its last update an hour ahead of Redis's clock,
    // so nothing refills there) with 2 decode tokens left.
    let limits = TenantLimits {
        prefill: spec(1000.0, 10.0),
        decode: spec(10.0, 10.0),
        requests: spec(1.0, 10.0),
    };
    let unit = 1_000_000_000_000u128;
    let full = limits.units().map(|u| u.capacity);
    let key = format!("{prefix}{{fay}}");
    let frozen = time_us(&mut conn).await + 3_600_000_000;
    set_state(&mut conn, &key, frozen, [full[0], 2 * unit, full[2]]).await;
    let cost = Cost {
        prefill: 10,
        decode: 5,
        requests: 1,
    };
    let now = Instant::now();
    let ms = Duration::from_millis;
    // 3 decode tokens short at 10 a second: 300 ms. (The first call also loads the script on
    // this fresh Redis: the count starts after it.)
    let first = store.charge("fay", &limits, cost, now, LeaseId(1)).await;
    assert_eq!(retry_after(first), ms(300));
    let calls = script_calls(&mut conn).await - 1;
    for i in 0..100 {
        let charge = store.charge("fay", &limits, cost, now + ms(100), LeaseId(2 + i));
        assert_eq!(retry_after(charge.await), ms(200));
        let peek = store.check("fay", &limits, cost, now + ms(250)).await;
        assert_eq!(retry_after(peek), ms(50));
    }
    assert_eq!(script_calls(&mut conn).await, calls + 1, "no round trip");
    // A request the levels let through by now goes to Redis, whose frozen levels refuse it.
    let smaller = Cost { decode: 4, ..cost };
    let e = store.charge("fay", &limits, smaller, now + ms(200), LeaseId(200));
    assert_eq!(retry_after(e.await), ms(200));
    assert_eq!(script_calls(&mut conn).await, calls + 2);
    // Refused again from that answer's levels, counted from its instant.
    let e = store.charge("fay", &limits, cost, now + ms(300), LeaseId(201));
    assert_eq!(retry_after(e.await), ms(200));
    let e = store.check("fay", &limits, cost, now + ms(400)).await;
    assert_eq!(retry_after(e), ms(100));
    assert_eq!(script_calls(&mut conn).await, calls + 2);
    // Other limits (a reload): Redis decides.
    let halved = TenantLimits {
        decode: spec(5.0, 20.0),
        ..limits.clone()
    };
    let e = store.check("fay", &halved, cost, now + ms(400)).await;
    assert_eq!(retry_after(e), ms(600));
    assert_eq!(script_calls(&mut conn).await, calls + 3);
    // A refund (its settle runs on a task) gives tokens back: Redis decides the next one.
    store.refund("fay", LeaseId(999), smaller);
    wait_script_calls(&mut conn, calls + 4).await;
    let e = store.check("fay", &limits, cost, now + ms(400)).await;
    assert_eq!(retry_after(e), ms(300));
    assert_eq!(script_calls(&mut conn).await, calls + 5);
    // So does a rebase (a reload that changed the tenant's limits).
    store.rebase("fay", &limits, now + ms(400));
    wait_script_calls(&mut conn, calls + 6).await;
    let e = store.check("fay", &limits, cost, now + ms(400)).await;
    assert_eq!(retry_after(e), ms(300));
    assert_eq!(script_calls(&mut conn).await, calls + 7);
    // Another tenant is not refused from fay's levels.
    store
        .charge("gus", &limits, cost, now, LeaseId(300))
        .await
        .unwrap();
}

/// Pauses every client of `conn`'s server for `ms` (the server answers nothing meanwhile),
/// then returns at once.
async fn pause_redis(conn: &mut redis::aio::MultiplexedConnection, ms: u64) {
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(ms)
        .arg("ALL")
        .query_async(conn)
        .await
        .unwrap();
}

/// Waits until `conn`'s server answers again (a paused server answers a command when the
/// pause ends).
async fn answers_again(conn: &mut redis::aio::MultiplexedConnection) {
    let _: () = redis::cmd("PING").query_async(conn).await.unwrap();
}

/// A Redis that times out once costs the request whose command it was the policy's answer,
/// not every tenant's: the store is marked down only after `failures_before_down` (3)
/// failures in a row, and an answer in between starts the count again.
#[tokio::test]
async fn one_timed_out_command_does_not_mark_the_store_down_three_in_a_row_do() {
    let redis = OwnRedis::start().await;
    let mut config = store_config(&redis.url(), &prefix("slow"));
    config.connect_timeout = Duration::from_millis(50);
    config.command_timeout = Duration::from_millis(100);
    assert_eq!(config.failures_before_down, 3, "the default");
    let metrics = StoreMetrics::default();
    let store = RedisStore::new(&config, metrics.clone()).unwrap();
    let mut conn = connect(&redis.url()).await;
    let limits = big_limits();
    let cost = Cost {
        prefill: 1,
        decode: 1,
        requests: 1,
    };
    let now = Instant::now();
    let (store, limits) = (&store, &limits);
    let mut lease = 0;
    let mut charge = move || {
        lease += 1;
        store.charge("hal", limits, cost, now, LeaseId(lease))
    };
    let charge_errors = || {
        (metrics.errors)
            .get_or_create(&StoreOpLabel {
                op: "charge".into(),
            })
            .get()
    };
    charge().await.unwrap();
    // A pause outlasting `failures` commands' timeouts (150 ms each, the connection's
    // included), then Redis answers again and the count starts over.
    for failures in [1, 2] {
        pause_redis(&mut conn, 150 * failures + 250).await;
        for _ in 0..failures {
            let slow = charge().await;
            assert!(matches!(slow, Err(Denial::Unavailable { .. })), "{slow:?}");
        }
        assert!(store.is_healthy(), "{failures} in a row");
        assert_eq!(metrics.fallback.get(), 0);
        answers_again(&mut conn).await;
        charge().await.unwrap();
    }
    assert_eq!(charge_errors(), 3);
    pause_redis(&mut conn, 700).await;
    for _ in 0..3 {
        assert!(matches!(charge().await, Err(Denial::Unavailable { .. })));
    }
    assert!(!store.is_healthy(), "three in a row");
    assert_eq!(metrics.fallback.get(), 1);
    assert_eq!(charge_errors(), 6);
    answers_again(&mut conn).await;
    // The probe (every retry_interval) finds it again.
    let deadline = SystemClock.instant() + Duration::from_secs(10);
    while !store.is_healthy() {
        assert!(
            SystemClock.instant() < deadline,
            "the probe never found Redis"
        );
        tokio::task::yield_now().await;
    }
    charge().await.unwrap();
}
