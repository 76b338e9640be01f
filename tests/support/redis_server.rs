//! A real Redis for the shared limiter store's tests: the suite's server (scripts/test starts
//! one and exports `TOKENGATE_TEST_REDIS_URL`), or a server of a test's own that it can stop
//! and start again. Never a mock. A test that needs Redis and finds none fails saying how to
//! get one (CI must run these tests, so they never skip).

use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// The variable scripts/test sets to its Redis server's URL.
pub const URL_VAR: &str = "TOKENGATE_TEST_REDIS_URL";
/// The variable naming the `redis-server` binary for tests that start their own (default: the
/// one on `PATH`).
pub const SERVER_VAR: &str = "TOKENGATE_TEST_REDIS_SERVER";

/// The suite's Redis URL, or a panic telling how to get one.
pub fn url() -> String {
    std::env::var(URL_VAR).unwrap_or_else(|_| {
        panic!(
            "{URL_VAR} is not set: the shared limiter store's tests need a real Redis (or \
             Valkey) server. Run scripts/test, which starts one, or start one yourself \
             (`redis-server --port 6390 --save ''`) and export {URL_VAR}=redis://127.0.0.1:6390"
        )
    })
}

/// A key prefix of this test's own, so tests share one server without seeing each other's
/// keys (nor a former run's).
pub fn prefix(test: &str) -> String {
    use tokengate::clock::{Clock, SystemClock};
    let nanos = (SystemClock.wall())
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("test:{test}:{}:{nanos}:", std::process::id())
}

/// A plain connection, for the test's own reads and writes.
pub async fn connect(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|e| panic!("cannot reach the Redis at {url}: {e}"))
}

/// Redis's clock (`TIME`) in microseconds: the clock the bucket script refills by.
pub async fn time_us(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(conn).await.unwrap();
    secs * 1_000_000 + micros
}

/// A `redis-server` of a test's own on a free loopback port, without persistence: stopped and
/// started again on the same port by the test, killed when dropped.
pub struct OwnRedis {
    /// Its port.
    pub port: u16,
    child: Option<Child>,
}

impl OwnRedis {
    /// Starts one and waits until it says it accepts connections.
    pub async fn start() -> OwnRedis {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut own = OwnRedis { port, child: None };
        own.restart().await;
        own
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the server (as a crash would) and waits until it is gone.
    pub async fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().await.unwrap();
        }
    }

    /// Starts the server (again) on its port, empty, and waits until it is ready.
    pub async fn restart(&mut self) {
        self.stop().await;
        let binary = std::env::var(SERVER_VAR).unwrap_or_else(|_| "redis-server".to_string());
        let mut child = Command::new(&binary)
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--loglevel", "notice"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start `{binary}` ({e}): these tests start a Redis server of their \
                     own; install redis-server (scripts/test does) or set {SERVER_VAR}"
                )
            });
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let ready = async {
            while let Some(line) = lines.next_line().await.unwrap() {
                if line.contains("Ready to accept connections") {
                    return true;
                }
            }
            false
        };
        let ready = tokio::time::timeout(Duration::from_secs(10), ready).await;
        assert_eq!(
            ready,
            Ok(true),
            "redis-server on port {} did not become ready",
            self.port
        );
        // Keep reading its log so it never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        self.child = Some(child);
    }
}
