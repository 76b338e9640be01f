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
use tokengate::config::Config;
use tokengate::limiter::config::{LimiterConfig, StoreKind};
use tokengate::limiter::redis::{RedisStore, StoreMetrics};
use tokengate::limiter::{BucketSpec, BucketStore, Cost, LeaseId, LocalStore, TenantLimits};
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
/// it writes (`t`), refilled from the one set, in 128-bit arithmetic.
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
    let set_at = time_us(&mut conn).await - 2_000_000;
    set_state(&mut conn, &key, set_at, [0, 0, 0]).await;
    store
        .charge("dave", &limits, Cost::default(), Instant::now(), LeaseId(0))
        .await
        .unwrap();
    let (t, got) = levels(&mut conn, &key).await;
    let elapsed_ns = u128::from(t - set_at) * 1000;
    assert!(elapsed_ns >= 2_000_000_000);
    let expected = limits
        .units()
        .map(|u| (elapsed_ns * u.rate).min(u.capacity));
    assert_eq!(got, expected);
    // The prefill level is past 2^53 units: a float would have rounded it.
    assert!(got[0] > 1 << 53);
    // The decode bucket (370 tokens) filled in 3 s and is capped.
    assert!(got[1] < limits.units()[1].capacity || elapsed_ns >= 3_000_000_000);
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
/// once, not once per replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_admit_one_burst_once() {
    let url = support::redis_server::url();
    let prefix = prefix("replicas");
    let backend = FakeBackend::start(FakeSpec::default()).await;
    // Decode 20 tokens/s x 10 s = 200; each request reserves (and uses) 10.
    let alice = "prefill_tokens_per_second = 100000\ndecode_tokens_per_second = 20\nrequests_per_second = 1000\nburst_seconds = 10";
    let limiter = redis_limiter(&url, &prefix, "");
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
        "{tokens} tokens admitted in {elapsed_us} us: over {bound}"
    );
    assert!(tokens >= 200, "the burst itself was admitted: {tokens}");
    assert_eq!(admitted + refused, 240);
    assert!(refused > 0);
    // Replicas each with their own buckets would have admitted 200 each: 600 at least. The
    // bound stays under that for any run shorter than 20 s.
    assert!(
        bound < 600,
        "the run took {elapsed_us} us: too long to tell"
    );
    assert_eq!(backend.seen.lock().unwrap().len() as u64, admitted);
}

/// One gateway on a Redis of its own, with `policy`: Alice may make 10 requests (0.1/s x 100
/// s: one more every 10 s of Redis's clock; the local fallback's clock is frozen).
async fn gateway_on_own_redis(policy: &str, test: &str) -> (OwnRedis, TestGateway, FakeBackend) {
    let redis = OwnRedis::start().await;
    let backend = FakeBackend::start(FakeSpec::default()).await;
    let alice = "prefill_tokens_per_second = 1000\ndecode_tokens_per_second = 10\nrequests_per_second = 0.1\nburst_seconds = 100";
    let limiter = redis_limiter(&redis.url(), &prefix(test), policy);
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
    recovers(&mut redis, &gw).await;
}
