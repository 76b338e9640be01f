//! What the shared limiter store adds per request, against the local store in the same run:
//! `cargo bench --bench redis_store` (starts its own `redis-server` on a free loopback port,
//! without persistence, and stops it). Each request does what the gateway's path does with
//! the limiter: two peeks (before the body is read, once `max_tokens` is known), the charge,
//! then the settle when its guard drops (on a task, off the request path, for Redis).
//! Prints the latency of that path (p50, p99) one request at a time, and requests/s with
//! 32 at once, over 1000 tenants. Bounded: a fixed number of requests per measurement.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant as WallInstant};
use tokengate::clock::SystemClock;
use tokengate::limiter::config::{LimiterConfig, StoreKind};
use tokengate::limiter::redis::{RedisStore, StoreMetrics};
use tokengate::limiter::{BucketSpec, BucketStore, Cost, Limiter, LocalStore, TenantLimits};

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

/// The limiter's part of one request.
async fn request(limiter: &Limiter, tenant: &str, limits: &TenantLimits) {
    let least = Cost {
        prefill: 1,
        decode: 1,
        requests: 1,
    };
    limiter.check(tenant, limits, least).await.expect("peek");
    limiter.check(tenant, limits, COST).await.expect("peek");
    let mut r = limiter
        .reserve(tenant, limits, COST)
        .await
        .expect("never denied");
    r.record_output(50);
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// (p50, p99) of one request at a time.
async fn sequential(
    limiter: &Limiter,
    names: &[String],
    limits: &TenantLimits,
) -> (Duration, Duration) {
    let mut took = Vec::with_capacity(SEQUENTIAL);
    for i in 0..SEQUENTIAL {
        let start = WallInstant::now();
        request(limiter, &names[i % TENANTS], limits).await;
        took.push(start.elapsed());
    }
    took.sort();
    (percentile(&took, 0.5), percentile(&took, 0.99))
}

/// Requests per second with `TASKS` at once.
async fn concurrent(limiter: &Limiter, names: &Arc<Vec<String>>, limits: &TenantLimits) -> f64 {
    let start = WallInstant::now();
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let (limiter, names, limits) = (limiter.clone(), names.clone(), limits.clone());
            tokio::spawn(async move {
                for i in (t..CONCURRENT).step_by(TASKS) {
                    request(&limiter, &names[i % TENANTS], &limits).await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("bench task");
    }
    CONCURRENT as f64 / start.elapsed().as_secs_f64()
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
        let redis = RedisStore::new(&config, StoreMetrics::default()).expect("store");
        let stores: [(&str, Arc<dyn BucketStore>); 2] = [
            ("local", Arc::new(LocalStore::new())),
            ("redis", Arc::new(redis.clone())),
        ];
        let names = Arc::new((0..TENANTS).map(|i| format!("tenant-{i}")).collect::<Vec<_>>());
        let limits = limits();
        let mut results = Vec::new();
        for (name, store) in stores {
            let limiter = Limiter::new(store, Arc::new(SystemClock));
            // Warm up: connection, script loaded, tenants' hashes made.
            for n in names.iter() {
                request(&limiter, n, &limits).await;
            }
            let (p50, p99) = sequential(&limiter, &names, &limits).await;
            let rps = concurrent(&limiter, &names, &limits).await;
            results.push((name, p50, p99, rps));
        }
        assert!(redis.is_healthy(), "Redis failed during the run");
        let (_, base50, base99, base_rps) = results[0];
        for (name, p50, p99, rps) in results {
            println!(
                "limiter path ({name:5})  p50 {:8.1} us  p99 {:8.1} us  {rps:9.0} req/s with {TASKS} at once  \
                 (vs local: p50 +{:.1} us, p99 +{:.1} us, req/s x{:.3})",
                p50.as_secs_f64() * 1e6,
                p99.as_secs_f64() * 1e6,
                (p50.as_secs_f64() - base50.as_secs_f64()) * 1e6,
                (p99.as_secs_f64() - base99.as_secs_f64()) * 1e6,
                rps / base_rps,
            );
        }
    });
}
