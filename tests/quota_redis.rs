//! The shared quota store on a real Redis (`TOKENGATE_TEST_REDIS_URL`, which scripts/test
//! starts): every step gives what the local store gives, across a calendar day's local midnight
//! and with cost amounts past 2^53; the reservations of a replica that died come back once
//! their lease expires, and a late settle gives nothing back twice; three replicas reserving at
//! once never pass a limit and count exactly what was used; three gateways on one Redis spend
//! one tenant's day once between them.

mod common;
mod support;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redis::AsyncCommands;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use support::redis_server::{connect, prefix};
use support::*;
use tokengate::config::Config;
use tokengate::limiter::config::{LimiterConfig, StoreKind};
use tokengate::quota::ledger::{self, Meter, MeterState, Reading, Slice, Unit, PICO_PER_UNIT};
use tokengate::quota::redis::{RedisQuotaStore, Settled};
use tokengate::quota::store::{LocalQuotaStore, QuotaRefusal, QuotaStore, StoreDown};
use tokengate::quota::window::Window;
use tokio::time::Instant;

/// 2026-12-01T15:50:00Z: 23:50 in Shanghai, ten minutes before its midnight.
const BEFORE_SHANGHAI_MIDNIGHT: i64 = 1_796_140_200_000;
const MINUTE: i64 = 60_000;
/// The lease TTL of these tests' stores.
const LEASE_TTL: i64 = 60_000;

fn store_config(url: &str, prefix: &str) -> LimiterConfig {
    LimiterConfig {
        store: StoreKind::Redis,
        redis_url: Some(url.to_string()),
        key_prefix: prefix.to_string(),
        lease_ttl: Duration::from_millis(LEASE_TTL as u64),
        retry_interval: Duration::from_millis(100),
        ..LimiterConfig::default()
    }
}

fn store(url: &str, prefix: &str) -> RedisQuotaStore {
    RedisQuotaStore::new(&store_config(url, prefix)).unwrap()
}

fn meter(window: &str, zone: Option<&str>, unit: Unit, limit: u64) -> Meter {
    Meter {
        window: Window::parse(window, zone).unwrap(),
        unit,
        currency: (unit == Unit::Cost).then(|| "USD".to_string()),
        limit,
    }
}

/// `usd` dollars in pico-dollars.
fn usd(usd: f64) -> u64 {
    (usd * PICO_PER_UNIT) as u64
}

/// A local and a Redis store that every step is run on, the answers compared.
struct Both {
    local: LocalQuotaStore,
    redis: RedisQuotaStore,
}

const TENANT: &str = "alice";

impl Both {
    async fn reserve(
        &self,
        meters: &[Meter],
        amounts: &[u64],
        now: i64,
        lease: u64,
    ) -> Result<Vec<Reading>, QuotaRefusal> {
        let local = self
            .local
            .reserve(TENANT, meters, amounts, now, lease)
            .await;
        let redis = self
            .redis
            .reserve(TENANT, meters, amounts, now, lease)
            .await;
        assert_eq!(redis, local, "reserve {amounts:?} at {now}");
        local
    }

    async fn settle(&self, meters: &[Meter], reserved: &[u64], used: &[u64], now: i64, lease: u64) {
        self.local
            .settle(TENANT, meters, reserved, used, now, lease);
        let settled = self
            .redis
            .settle_now(TENANT, meters, used, now, lease)
            .await;
        assert_eq!(settled, Ok(Settled::Held));
    }

    async fn read(&self, meters: &[Meter], now: i64) -> Vec<Reading> {
        let local = self.local.read(TENANT, meters, now).await.unwrap();
        let redis = self.redis.read(TENANT, meters, now).await.unwrap();
        assert_eq!(redis, local, "read at {now}");
        local
    }

    async fn grant(&self, meter: &Meter, amount: u64, now: i64) -> Reading {
        let local = self.local.grant(TENANT, meter, amount, now).await.unwrap();
        let redis = self.redis.grant(TENANT, meter, amount, now).await.unwrap();
        assert_eq!(redis, local, "grant {amount} at {now}");
        local
    }

    async fn reset(&self, meter: &Meter, now: i64) -> Reading {
        let local = self.local.reset(TENANT, meter, now).await.unwrap();
        let redis = self.redis.reset(TENANT, meter, now).await.unwrap();
        assert_eq!(redis, local, "reset at {now}");
        local
    }
}

fn denied(refusal: Result<Vec<Reading>, QuotaRefusal>) -> Box<ledger::QuotaDenial> {
    match refusal {
        Err(QuotaRefusal::Denied(denial)) => denial,
        other => panic!("not a denial: {other:?}"),
    }
}

/// Shanghai's day in decode tokens, a rolling hour in all tokens and a calendar month in
/// dollars (20,000 of them: 2 x 10^16 pico-dollars, past the 2^53 a Lua number holds exactly),
/// through reservations, denials, settles, a grant, local midnight, a reset, a lowered limit
/// and the hour rolling on: the Redis store answers every step as the local store does.
#[tokio::test]
async fn every_step_gives_what_the_local_store_gives() {
    let url = support::redis_server::url();
    let both = Both {
        local: LocalQuotaStore::in_memory(),
        // Leases that outlive every step (the steps span 75 minutes).
        redis: RedisQuotaStore::new(&LimiterConfig {
            lease_ttl: Duration::from_secs(2 * 3600),
            ..store_config(&url, &prefix("quota-steps"))
        })
        .unwrap(),
    };
    let meters = [
        meter("calendar-day", Some("Asia/Shanghai"), Unit::Decode, 100),
        meter("1h", None, Unit::Total, 1000),
        meter("calendar-month", None, Unit::Cost, usd(20_000.0)),
    ];
    let t0 = BEFORE_SHANGHAI_MIDNIGHT;
    let fresh = both.read(&meters, t0).await;
    assert_eq!(
        (fresh[0].spent, fresh[0].reserved, fresh[0].limit),
        (0, 0, 100)
    );

    // Two amounts that differ from a multiple of 10^9 only below 2^53's precision.
    let first = [60, 300, usd(15_000.0) + 1];
    let readings = both.reserve(&meters, &first, t0, 1).await.unwrap();
    assert_eq!(readings[2].reserved, usd(15_000.0) + 1);
    // The day has 40 left: nothing is taken from any meter. What is held is in the way: a second.
    let d = denied(both.reserve(&meters, &[50, 10, 1], t0, 2).await);
    assert_eq!(
        (d.reading.meter.id().as_str(), d.needed, d.never),
        ("calendar-day@Asia/Shanghai|decode", 50, false)
    );
    assert_eq!(d.retry_after, Duration::from_secs(1));
    // So is the month, by one pico-dollar.
    let d = denied(both.reserve(&meters, &[0, 0, usd(5_000.0)], t0, 2).await);
    assert_eq!(
        (d.reading.meter.unit, d.reading.reserved),
        (Unit::Cost, usd(15_000.0) + 1)
    );
    both.reserve(&meters, &[0, 0, usd(5_000.0) - 1], t0, 3)
        .await
        .unwrap();
    both.settle(&meters, &[0, 0, usd(5_000.0) - 1], &[0, 0, 0], t0, 3)
        .await;

    let used = [25, 200, usd(12_000.0) + 7];
    both.settle(&meters, &first, &used, t0 + MINUTE, 1).await;
    // 25 spent: 80 more does not fit until Shanghai's midnight, eight minutes on.
    let d = denied(
        both.reserve(&meters, &[80, 100, usd(7_000.0)], t0 + 2 * MINUTE, 4)
            .await,
    );
    assert_eq!(d.retry_after, Duration::from_secs(8 * 60));
    // A grant of 10 makes room for it, in the day only.
    let granted = both.grant(&meters[0], 10, t0 + 3 * MINUTE).await;
    assert_eq!((granted.limit, granted.granted), (110, 10));
    let second = [80, 100, usd(7_000.0)];
    both.reserve(&meters, &second, t0 + 3 * MINUTE, 4)
        .await
        .unwrap();
    both.read(&meters, t0 + 3 * MINUTE).await;
    both.settle(&meters, &second, &second, t0 + 4 * MINUTE, 4)
        .await;
    let before = both.read(&meters, t0 + 10 * MINUTE - 1).await;
    assert_eq!((before[0].spent, before[0].limit), (105, 110));
    // More than the day's limit never fits: retry at the reset.
    let d = denied(
        both.reserve(&meters, &[111, 0, 0], t0 + 5 * MINUTE, 5)
            .await,
    );
    assert!(d.never);
    assert_eq!(d.retry_after, Duration::from_secs(5 * 60));

    // Shanghai's midnight: its day starts empty, its grant gone; the hour and month keep theirs.
    let after = both.read(&meters, t0 + 10 * MINUTE).await;
    assert_eq!((after[0].spent, after[0].limit), (0, 100));
    assert_eq!(after[1].spent, 300);
    assert_eq!(after[2].spent, usd(19_000.0) + 7);
    both.reserve(&meters, &[10, 10, 1], t0 + 11 * MINUTE, 6)
        .await
        .unwrap();
    both.settle(&meters, &[10, 10, 1], &[3, 3, 1], t0 + 11 * MINUTE, 6)
        .await;
    // A reset of the hour forgets its spend, what is held stays.
    both.reserve(&meters, &[1, 1, 1], t0 + 12 * MINUTE, 7)
        .await
        .unwrap();
    let reset = both.reset(&meters[1], t0 + 12 * MINUTE).await;
    assert_eq!((reset.spent, reset.reserved), (0, 1));
    both.settle(&meters, &[1, 1, 1], &[1, 1, 1], t0 + 13 * MINUTE, 7)
        .await;

    // A limit lowered below the spend (a reload): a request that needs nothing of that meter
    // still fits, one that needs anything does not.
    let lowered = [
        meter("calendar-day", Some("Asia/Shanghai"), Unit::Decode, 2),
        meters[1].clone(),
    ];
    both.reserve(&lowered, &[0, 5], t0 + 14 * MINUTE, 8)
        .await
        .unwrap();
    both.settle(&lowered, &[0, 5], &[0, 5], t0 + 14 * MINUTE, 8)
        .await;
    denied(both.reserve(&lowered, &[1, 5], t0 + 14 * MINUTE, 9).await);

    // The hour rolls on slice by slice: what was spent at 13 and 14 minutes leaves at 73 and 74.
    let rolled = both.read(&meters, t0 + 72 * MINUTE).await;
    assert_eq!(rolled[1].spent, 6);
    let rolled = both.read(&meters, t0 + 73 * MINUTE).await;
    assert_eq!(rolled[1].spent, 5);
    both.read(&meters, t0 + 75 * MINUTE).await;
}

/// What the Redis hash of `meter` keeps: its reserved, and its slices oldest first.
async fn meter_state(
    conn: &mut redis::aio::MultiplexedConnection,
    prefix: &str,
    meter: &Meter,
) -> MeterState {
    let key = format!("{prefix}{{{TENANT}}}:quota:{}", meter.id());
    let fields: Vec<(String, String)> = conn.hgetall(&key).await.unwrap();
    let (mut reserved, mut slices) = (0, std::collections::BTreeMap::<i64, Slice>::new());
    for (field, value) in fields {
        let value: u64 = value.parse().unwrap();
        let Some((kind, start)) = field.split_once(':') else {
            reserved = value;
            continue;
        };
        let start: i64 = start.parse().unwrap();
        let slice = slices.entry(start).or_insert(Slice {
            start,
            spent: 0,
            granted: 0,
        });
        *(if kind == "s" {
            &mut slice.spent
        } else {
            &mut slice.granted
        }) = value;
    }
    MeterState {
        slices: slices.into_values().collect(),
        reserved,
    }
}

/// A replica reserves and dies: another one sees the reservation until the lease's TTL has
/// passed, then not. The dead replica's settle, come late, spends what was used and gives back
/// nothing (its lease is gone), and a retry of it does nothing at all.
#[tokio::test]
async fn a_dead_replicas_lease_comes_back_after_its_ttl_and_a_late_settle_gives_back_nothing() {
    let url = support::redis_server::url();
    let prefix = prefix("quota-lease");
    let (dead, alive) = (store(&url, &prefix), store(&url, &prefix));
    assert_ne!(dead.replica_name(), alive.replica_name());
    let meters = [meter(
        "calendar-day",
        Some("Asia/Shanghai"),
        Unit::Decode,
        100,
    )];
    let t0 = BEFORE_SHANGHAI_MIDNIGHT - 3_600_000;
    dead.reserve(TENANT, &meters, &[40], t0, 1).await.unwrap();
    // The same lease number from another replica is another lease.
    alive
        .reserve(TENANT, &meters, &[30], t0 + 1000, 1)
        .await
        .unwrap();
    let reserved = |r: Vec<Reading>| r[0].reserved;
    assert_eq!(
        reserved(
            alive
                .read(TENANT, &meters, t0 + LEASE_TTL - 1)
                .await
                .unwrap()
        ),
        70
    );
    let d = denied(
        alive
            .reserve(TENANT, &meters, &[31], t0 + LEASE_TTL - 1, 2)
            .await,
    );
    assert_eq!(d.reading.reserved, 70);
    // The dead one's TTL has passed: its 40 are back, the live one's 30 stay.
    assert_eq!(
        reserved(alive.read(TENANT, &meters, t0 + LEASE_TTL).await.unwrap()),
        30
    );
    let mut conn = connect(&url).await;
    let leases: Vec<String> = conn
        .zrange(format!("{prefix}{{{TENANT}}}:quota:leases"), 0, -1)
        .await
        .unwrap();
    assert_eq!(
        leases,
        [format!(
            "{prefix}{{{TENANT}}}:quota:lease:{}:1",
            alive.replica_name()
        )]
    );
    alive
        .reserve(TENANT, &meters, &[70], t0 + LEASE_TTL, 2)
        .await
        .unwrap();

    // The dead replica's settle, late: its 35 used are spent, nothing is given back.
    let late = dead
        .settle_now(TENANT, &meters, &[35], t0 + LEASE_TTL + 1, 1)
        .await;
    assert_eq!(late, Ok(Settled::Expired));
    let r = &alive
        .read(TENANT, &meters, t0 + LEASE_TTL + 1)
        .await
        .unwrap()[0];
    assert_eq!((r.spent, r.reserved), (35, 100));
    // Again (a retry whose first answer was lost): nothing at all.
    let again = dead
        .settle_now(TENANT, &meters, &[35], t0 + LEASE_TTL + 2, 1)
        .await;
    assert_eq!(again, Ok(Settled::Again));
    // The live ones settle once each.
    let settled = alive
        .settle_now(TENANT, &meters, &[30], t0 + LEASE_TTL + 2, 1)
        .await;
    assert_eq!(settled, Ok(Settled::Held));
    let settled = alive
        .settle_now(TENANT, &meters, &[30], t0 + LEASE_TTL + 2, 1)
        .await;
    assert_eq!(settled, Ok(Settled::Again));
    alive
        .settle_now(TENANT, &meters, &[0], t0 + LEASE_TTL + 2, 2)
        .await
        .unwrap();
    assert_eq!(
        meter_state(&mut conn, &prefix, &meters[0]).await,
        MeterState {
            slices: vec![Slice {
                start: meters[0].window.slice_start(t0),
                spent: 65,
                granted: 0
            }],
            reserved: 0,
        }
    );
    // The meter's hash lives until its day has ended, and a lease's TTL more.
    let key = format!("{prefix}{{{TENANT}}}:quota:{}", meters[0].id());
    let ttl: i64 = redis::cmd("PTTL")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    let most = BEFORE_SHANGHAI_MIDNIGHT + 10 * MINUTE - t0 + LEASE_TTL;
    assert!(
        ttl > most - 10_000 && ttl <= most,
        "{ttl} of at most {most}"
    );
}

/// The earliest slice start the script keeps is exactly where the core's prune keeps from.
#[test]
fn the_slices_kept_are_those_the_core_keeps() {
    let mut rng = StdRng::seed_from_u64(7);
    let windows = [
        Window::parse("1m", None).unwrap(),
        Window::parse("1h", None).unwrap(),
        Window::parse("7d", None).unwrap(),
        Window::parse("calendar-day", None).unwrap(),
        Window::parse("calendar-day", Some("Europe/Berlin")).unwrap(),
        Window::parse("calendar-month", Some("America/New_York")).unwrap(),
    ];
    for window in &windows {
        for _ in 0..500 {
            let now = BEFORE_SHANGHAI_MIDNIGHT
                + rng.gen_range(-400..400) * 86_400_000
                + rng.gen_range(0..86_400_000);
            let since = ledger::kept_since(window, now);
            let spread = 2 * (window.leaves_at(window.slice_start(now)) - window.slice_start(now));
            for _ in 0..20 {
                let start = window.slice_start(now + rng.gen_range(-spread..spread / 4));
                assert_eq!(
                    window.leaves_at(start) > now,
                    start >= since,
                    "{window} at {now}: {start}"
                );
            }
        }
    }
}

/// A Redis that cannot be reached: a reservation is refused having taken nothing, the rest
/// fail naming why.
#[tokio::test]
async fn an_unreachable_redis_refuses_reservations_and_fails_the_rest() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut config = store_config(&format!("redis://127.0.0.1:{port}"), "gone:");
    config.connect_timeout = Duration::from_millis(200);
    let gone = RedisQuotaStore::new(&config).unwrap();
    let meters = [meter("1h", None, Unit::Decode, 100)];
    let t0 = BEFORE_SHANGHAI_MIDNIGHT;
    match gone.reserve(TENANT, &meters, &[1], t0, 1).await {
        Err(QuotaRefusal::Unavailable(why)) => assert!(!why.is_empty()),
        other => panic!("not unavailable: {other:?}"),
    }
    assert!(matches!(
        gone.read(TENANT, &meters, t0).await,
        Err(StoreDown(_))
    ));
    assert!(matches!(
        gone.grant(TENANT, &meters[0], 1, t0).await,
        Err(StoreDown(_))
    ));
    assert!(matches!(
        gone.reset(TENANT, &meters[0], t0).await,
        Err(StoreDown(_))
    ));
    assert!(gone.settle_now(TENANT, &meters, &[1], t0, 1).await.is_err());
}

/// Waits until every replica reads the meter with nothing reserved (the settles, on tasks of
/// their own, have landed): its readings.
async fn settled(stores: &[RedisQuotaStore], meters: &[Meter], now: i64) -> Vec<Reading> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut readings = Vec::new();
        for s in stores {
            readings.push(s.read(TENANT, meters, now).await.unwrap().remove(0));
        }
        if readings.iter().all(|r| r.reserved == 0) {
            return readings;
        }
        assert!(
            Instant::now() < deadline,
            "reservations never all settled: {readings:?}"
        );
        tokio::task::yield_now().await;
    }
}

/// Three replicas, fifty tasks each, reserving random amounts against one small limit at once
/// and settling (by the `Drop` path: on a task) random parts of them: no reading ever shows
/// more spent and held than the limit, and in the end exactly what was used is spent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_reserving_at_once_never_pass_the_limit() {
    let url = support::redis_server::url();
    let prefix = prefix("quota-replicas");
    let stores: Vec<RedisQuotaStore> = (0..3).map(|_| store(&url, &prefix)).collect();
    let limit = 300;
    let meters = Arc::new([meter(
        "calendar-day",
        Some("Asia/Shanghai"),
        Unit::Decode,
        limit,
    )]);
    let now = BEFORE_SHANGHAI_MIDNIGHT;
    let used_total = Arc::new(AtomicU64::new(0));
    let admitted = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for t in 0..150u64 {
        let store = stores[t as usize % 3].clone();
        let (meters, used_total, admitted) = (meters.clone(), used_total.clone(), admitted.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(t);
            for round in 0..3 {
                let lease = t * 10 + round;
                let amount = rng.gen_range(1..=60);
                match store
                    .reserve(TENANT, &meters[..], &[amount], now, lease)
                    .await
                {
                    Ok(readings) => {
                        let r = &readings[0];
                        assert!(r.spent + r.reserved <= limit, "{r:?}");
                        let read = &store.read(TENANT, &meters[..], now).await.unwrap()[0];
                        assert!(read.spent + read.reserved <= limit, "{read:?}");
                        let used = rng.gen_range(0..=amount);
                        used_total.fetch_add(used, Ordering::Relaxed);
                        admitted.fetch_add(1, Ordering::Relaxed);
                        store.settle(TENANT, &meters[..], &[amount], &[used], now, lease);
                    }
                    Err(QuotaRefusal::Denied(d)) => {
                        assert!(d.reading.spent + d.reading.reserved <= limit, "{d:?}");
                        assert!(d.reading.remaining() < amount);
                    }
                    Err(other) => panic!("{other:?}"),
                }
                tokio::task::yield_now().await;
            }
        }));
    }
    let all = async {
        for t in tasks {
            t.await.unwrap();
        }
    };
    tokio::time::timeout(Duration::from_secs(60), all)
        .await
        .expect("the tasks ended in time");
    let readings = settled(&stores, &meters[..], now).await;
    let used = used_total.load(Ordering::Relaxed);
    assert!(
        admitted.load(Ordering::Relaxed) > 10,
        "only {admitted:?} admitted"
    );
    for r in readings {
        assert_eq!(r.spent, used);
        assert!(r.spent <= limit);
    }
}

/// Three gateways on one Redis (buckets, KV ledger and quotas shared), alice with a Shanghai
/// day of 200 decode tokens and sixty requests of 10 at once across them: exactly twenty are
/// answered, each spending its 10 (200 in all, as every replica reads), and the forty others
/// are refused with 429 `quota_exceeded` and a retry-after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_gateways_on_one_redis_spend_one_day_once() {
    let url = support::redis_server::url();
    let prefix = prefix("quota-gateways");
    let backend = FakeBackend::start(FakeSpec::default()).await;
    let text = config_text(&[backend.addr])
        .replacen(
            "prefill_tokens_per_second = 1000\ndecode_tokens_per_second = 100\nrequests_per_second = 10\nburst_seconds = 10",
            "prefill_tokens_per_second = 100000\ndecode_tokens_per_second = 100000\nrequests_per_second = 1000\nburst_seconds = 10\n[[tenants.quotas]]\nwindow = \"calendar-day\"\ntimezone = \"Asia/Shanghai\"\ndecode = 200",
            1,
        );
    let text = format!(
        "{text}\n[limiter]\nstore = \"redis\"\nredis_url = \"{url}\"\nkey_prefix = \"{prefix}\"\n\n[quotas]\nstore = \"redis\"\n"
    );
    let mut gateways = Vec::new();
    for _ in 0..3 {
        let config = Config::parse(&text).unwrap().into_inner();
        gateways.push(Arc::new(
            TestGateway::start_at_wall(config, BEFORE_SHANGHAI_MIDNIGHT).await,
        ));
    }
    let requests: Vec<_> = (0..60)
        .map(|i| {
            spawn_post(
                &gateways[i % 3].url("/v1/chat/completions"),
                "sk-alice",
                chat("hi", 10, false),
            )
        })
        .collect();
    let answers = async {
        let mut answers = Vec::new();
        for r in requests {
            answers.push(r.await.unwrap());
        }
        answers
    };
    let answers = tokio::time::timeout(Duration::from_secs(30), answers)
        .await
        .expect("every request answered in time");
    let mut ok = 0;
    for r in &answers {
        match r.status {
            200 => {
                assert_eq!(r.json()["usage"]["completion_tokens"], 10);
                ok += 1;
            }
            429 => {
                assert_eq!(r.code(), "quota_exceeded", "{}", r.text());
                let retry: u64 = r.headers["retry-after"].to_str().unwrap().parse().unwrap();
                assert!((1..=600).contains(&retry), "{retry}");
            }
            other => panic!("{other}: {}", r.text()),
        }
    }
    assert_eq!(ok, 20);
    let deadline = Instant::now() + Duration::from_secs(10);
    for gw in &gateways {
        loop {
            let gateway = &gw.running.gateway;
            let live = gateway.live.current();
            let alice = live.tenants.named("alice").unwrap();
            let r = gateway
                .quotas
                .read("alice", &alice.quotas)
                .await
                .unwrap()
                .remove(0);
            if r.reserved == 0 {
                assert_eq!(r.spent, ok * 10);
                assert!(r.spent <= r.limit);
                break;
            }
            assert!(
                Instant::now() < deadline,
                "alice's reservations never settled: {r:?}"
            );
            tokio::task::yield_now().await;
        }
    }
}
