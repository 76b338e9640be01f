//! What the shared limiter store and the shared KV ledger add per request, against the local
//! ones in the same run: `cargo bench --bench redis_store` (starts its own `redis-server` on a
//! free loopback port, without persistence, and stops it). Each request does what the
//! gateway's path does with the limiter and the admission room: two peeks (before the body is
//! read, once `max_tokens` is known), the charge, the KV lease (`admit`), then the lease's
//! release and the settle when their guards drop (for Redis both on tasks, off the request
//! path). Five setups: local store + local ledger (the baseline), Redis store + local ledger
//! (the limiter's share), Redis store + shared ledger (a replica of a multi-replica
//! deployment), and both Redis ones again in local-first mode (`[limiter] local_first`, a slice
//! of about 12 requests' worth). Prints the latency of that path (p50, p99) one request at a
//! time, requests/s with 32 at once over 1000 tenants, counted until Redis has taken back
//! every settle and release, and the script calls Redis ran per request (its round trips);
//! each as a ratio to the baseline. Bounded: a fixed number of requests per measurement, and a
//! deadline on the drain.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;
use tokengate::admission::{
    Admission, BackendSpec, ClassShares, LedgerStore, Need, Priority, QueueSpec,
};
use tokengate::clock::SystemClock;
use tokengate::limiter::config::{LimiterConfig, LocalFirst, StoreKind};
use tokengate::limiter::redis::{RedisStore, StoreMetrics};
use tokengate::limiter::{BucketSpec, Cost, Limiter, LocalStore, TenantLimits};

const SEQUENTIAL: usize = 5_000;
const CONCURRENT: usize = 20_000;
const TASKS: usize = 32;
const TENANTS: usize = 1000;

fn limits() -> TenantLimits {
    // Large enough that no request of the run is ever denied (asserted).
    let spec = |rate_per_second, burst_seconds| BucketSpec {
        rate_per_second,
        burst_seconds,
    };
    TenantLimits {
        prefill: spec(1_000_000.0, 60.0),
        decode: spec(100_000.0, 60.0),
        requests: spec(1_000.0, 60.0),
    }
}

const COST: Cost = Cost {
    prefill: 100,
    decode: 100,
    requests: 1,
};

/// What one request holds in the KV ledger; the backend holds far more than the run's
/// requests in flight at once (asserted: none waits).
const NEED: Need = Need {
    bytes: 1 << 20,
    prompt_tokens: COST.prefill,
    output_tokens: COST.decode,
    sequences: 1,
    alone: None,
    in_turns: false,
};

/// One setup: a limiter on a store, an admission room on a ledger.
struct Setup {
    name: &'static str,
    limiter: Limiter,
    admission: Admission,
}

impl Setup {
    /// The limiter's and the admission room's part of one request.
    async fn request(&self, tenant: &str, limits: &TenantLimits) {
        let least = Cost {
            prefill: 1,
            decode: 1,
            requests: 1,
        };
        let limiter = &self.limiter;
        limiter.check(tenant, limits, least).await.expect("peek");
        limiter.check(tenant, limits, COST).await.expect("peek");
        let mut r = limiter
            .reserve(tenant, limits, COST)
            .await
            .expect("never denied");
        let mut lease = (self.admission)
            .admit(tenant, Priority::Standard, NEED)
            .await
            .expect("never waits");
        assert!(lease.waited().is_zero(), "a request waited for KV space");
        lease.record_output(50);
        r.record_output(50);
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// (p50, p99) of one request at a time.
async fn sequential(
    setup: &Setup,
    names: &[String],
    limits: &TenantLimits,
) -> (Duration, Duration) {
    let mut took = Vec::with_capacity(SEQUENTIAL);
    for i in 0..SEQUENTIAL {
        let start = SystemClock.instant();
        setup.request(&names[i % TENANTS], limits).await;
        took.push(start.elapsed());
    }
    took.sort();
    (percentile(&took, 0.5), percentile(&took, 0.99))
}

/// Requests per second with `TASKS` at once, until Redis (`redis`) holds no lease of either
/// kind: the settles and releases off the request path are counted too.
async fn concurrent(
    setup: &Arc<Setup>,
    names: &Arc<Vec<String>>,
    limits: &TenantLimits,
    redis: &mut Drain,
) -> f64 {
    let start = SystemClock.instant();
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let (setup, names, limits) = (setup.clone(), names.clone(), limits.clone());
            tokio::spawn(async move {
                for i in (t..CONCURRENT).step_by(TASKS) {
                    setup.request(&names[i % TENANTS], &limits).await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("bench task");
    }
    redis.wait().await;
    CONCURRENT as f64 / start.elapsed().as_secs_f64()
}

/// Waits until Redis holds no limiter lease (every settle done) and the shared ledger no live
/// lease (every release done).
struct Drain {
    conn: redis::aio::MultiplexedConnection,
}

impl Drain {
    /// The script calls (`EVALSHA`, and `EVAL` when a script is loaded again) Redis has run.
    async fn script_calls(&mut self) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut self.conn)
            .await
            .expect("INFO");
        info.lines()
            .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
            .filter_map(|l| l.split(['=', ',']).nth(1)?.parse::<u64>().ok())
            .sum()
    }

    async fn wait(&mut self) {
        let deadline = SystemClock.instant() + Duration::from_secs(30);
        loop {
            let leases: Vec<String> = redis::cmd("KEYS")
                .arg("bench:*:lease:*")
                .query_async(&mut self.conn)
                .await
                .expect("KEYS");
            let live: Vec<i64> = redis::cmd("HVALS")
                .arg("bench:{kv-ledger}:live")
                .query_async(&mut self.conn)
                .await
                .expect("HVALS");
            if leases.is_empty() && live.iter().all(|&n| n == 0) {
                return;
            }
            assert!(
                SystemClock.instant() < deadline,
                "{} settles and {} releases still pending after 30 s",
                leases.len(),
                live.iter().sum::<i64>()
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

/// A `redis-server` on a free loopback port; killed when dropped.
struct Server(std::process::Child, u16);

impl Server {
    fn start() -> Server {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let mut child = Command::new(
            std::env::var("TOKENGATE_TEST_REDIS_SERVER").unwrap_or_else(|_| "redis-server".into()),
        )
        .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
        .args(["--save", "", "--appendonly", "no"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("redis-server (apt-get install redis-server)");
        let out = child.stdout.take().expect("piped");
        let mut lines = BufReader::new(out).lines();
        let ready = lines
            .by_ref()
            .take(200)
            .map_while(Result::ok)
            .any(|l| l.contains("Ready to accept connections"));
        assert!(ready, "redis-server did not start");
        // Keep reading its log so it never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        Server(child, port)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn backends() -> Vec<BackendSpec> {
    vec![BackendSpec {
        name: "http://127.0.0.1:8000".into(),
        kv_capacity_bytes: 1 << 40,
        max_batch: 100_000,
        engine: false,
    }]
}

fn queue() -> QueueSpec {
    QueueSpec {
        max_waiting: TASKS,
        deadline: Duration::from_secs(10),
        shares: ClassShares::FULL,
    }
}

fn main() {
    let server = Server::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let config = LimiterConfig {
            store: StoreKind::Redis,
            redis_url: Some(format!("redis://127.0.0.1:{}", server.1)),
            key_prefix: "bench:".into(),
            ..LimiterConfig::default()
        };
        let url = config.redis_url.clone().expect("set");
        let mut drain = Drain {
            conn: (redis::Client::open(url).expect("url"))
                .get_multiplexed_async_connection()
                .await
                .expect("redis-server answers"),
        };
        let redis = RedisStore::new(&config, StoreMetrics::default()).expect("store");
        let ledger = |c: &LimiterConfig| LedgerStore::new(c, "", StoreMetrics::default());
        // A slice of 12 requests' worth of the requests and decode buckets (120 of prefill's).
        let sliced = LimiterConfig {
            local_first: Some(LocalFirst {
                slice: 0.0002,
                return_after: Duration::from_secs(3600),
            }),
            ..config.clone()
        };
        let local_first = RedisStore::new(&sliced, StoreMetrics::default()).expect("store");
        let clock = Arc::new(SystemClock);
        let local_limiter = Limiter::new(Arc::new(LocalStore::new()), clock.clone());
        let redis_limiter = Limiter::new(Arc::new(redis.clone()), clock.clone());
        let sliced_limiter = Limiter::new(Arc::new(local_first.clone()), clock);
        let setups = [
            Setup {
                name: "local store, local ledger",
                limiter: local_limiter,
                admission: Admission::new(backends(), queue()),
            },
            Setup {
                name: "redis store, local ledger",
                limiter: redis_limiter.clone(),
                admission: Admission::new(backends(), queue()),
            },
            Setup {
                name: "redis store, shared ledger",
                limiter: redis_limiter,
                admission: Admission::shared(backends(), queue(), ledger(&config).expect("ledger")),
            },
            Setup {
                name: "local-first, local ledger",
                limiter: sliced_limiter.clone(),
                admission: Admission::new(backends(), queue()),
            },
            Setup {
                name: "local-first, shared ledger",
                limiter: sliced_limiter,
                admission: Admission::shared(backends(), queue(), ledger(&sliced).expect("ledger")),
            },
        ];
        let names = Arc::new(
            (0..TENANTS)
                .map(|i| format!("tenant-{i}"))
                .collect::<Vec<_>>(),
        );
        let limits = limits();
        let mut results = Vec::new();
        for setup in setups {
            let setup = Arc::new(setup);
            // Warm up: connection, scripts loaded, tenants' hashes made.
            for n in names.iter() {
                setup.request(n, &limits).await;
            }
            drain.wait().await;
            let calls = drain.script_calls().await;
            let (p50, p99) = sequential(&setup, &names, &limits).await;
            let rps = concurrent(&setup, &names, &limits, &mut drain).await;
            let calls = (drain.script_calls().await - calls) as f64;
            let per_request = calls / (SEQUENTIAL + CONCURRENT) as f64;
            results.push((setup.name, p50, p99, rps, per_request));
        }
        assert!(redis.is_healthy(), "Redis failed during the run");
        assert!(local_first.is_healthy(), "Redis failed during the run");
        let (_, base50, base99, base_rps, _) = results[0];
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        for (name, p50, p99, rps, per_request) in results {
            println!(
                "{name:26}  p50 {:8.1} us  p99 {:8.1} us  {rps:9.0} req/s with {TASKS} at once  \
                 {per_request:.3} script calls/request  \
                 (vs local: p50 +{:.1} us x{:.1}, p99 +{:.1} us x{:.1}, req/s x{:.3})",
                us(p50),
                us(p99),
                us(p50) - us(base50),
                us(p50) / us(base50),
                us(p99) - us(base99),
                us(p99) / us(base99),
                rps / base_rps,
            );
        }
    });
}
