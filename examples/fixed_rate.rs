//! The open-loop client of `scripts/bench-proxy --fixed-rate`: POSTs a JSON body to one URL at a
//! fixed rate, whatever the server does, and prints the latency percentiles of the answers (the
//! whole answer read, a stream to its end) as one JSON line.
//!
//! `cargo run --release --example fixed_rate -- URL BODY_FILE RATE SECONDS CONNECTIONS KEY FIRST`
//!
//! Request `i` is due at `i / RATE` seconds from the start and is sent on the first of the
//! `CONNECTIONS` keep-alive connections to be free. Its latency runs from when it was sent, or,
//! when every connection was still busy at its due time, from its due time: the wait for a
//! connection is the server's doing and is counted (as wrk2 counts it), while a timer that wakes
//! a little late is the client's and is not. A run of nine `#` in the body is replaced by the
//! request's number (from `FIRST`), so no two bodies are alike and no memo answers for the
//! tokenizer. Each connection runs on one thread: the machine's other cores are left to the
//! servers measured.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// What one connection saw.
#[derive(Default)]
struct Seen {
    latencies_us: Vec<u64>,
    non_2xx: u64,
    errors: u64,
}

struct Plan {
    uri: hyper::Uri,
    body: Vec<u8>,
    numbered: Option<usize>,
    key: String,
    first: u64,
    start: Instant,
    interval: Duration,
    total: u64,
    next: AtomicU64,
}

impl Plan {
    fn body(&self, i: u64) -> Bytes {
        let mut body = self.body.clone();
        if let Some(at) = self.numbered {
            body[at..at + 9].copy_from_slice(format!("{:09}", self.first + i).as_bytes());
        }
        Bytes::from(body)
    }

    fn due(&self, i: u64) -> Instant {
        self.start + self.interval.mul_f64(i as f64)
    }
}

/// One connection: takes the next request due, sends it at its time, reads its answer.
async fn connection(plan: Arc<Plan>, seen: Arc<Mutex<Seen>>) -> anyhow::Result<()> {
    let host = plan.uri.host().unwrap_or("127.0.0.1");
    let addr = format!("{host}:{}", plan.uri.port_u16().unwrap_or(80));
    let stream = tokio::net::TcpStream::connect(&addr).await?;
    stream.set_nodelay(true)?;
    let (mut sender, conn) = http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let authority = plan.uri.authority().map_or(addr.clone(), |a| a.to_string());
    let path = plan
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    let mut free_since = Instant::now();
    let mut mine = Seen::default();
    loop {
        let i = plan.next.fetch_add(1, Ordering::Relaxed);
        if i >= plan.total {
            break;
        }
        let due = plan.due(i);
        tokio::time::sleep_until(due).await;
        // Busy past its due time: the request waited for the server, and that counts.
        let sent = if free_since > due {
            due
        } else {
            Instant::now()
        };
        let req = http::Request::post(path.as_str())
            .header("host", authority.as_str())
            .header("content-type", "application/json")
            .header("authorization", format!("Bearer {}", plan.key))
            .body(Full::new(plan.body(i)))?;
        let answer = match sender.send_request(req).await {
            Ok(answer) => answer,
            Err(_) => {
                mine.errors += 1;
                break;
            }
        };
        let ok = answer.status().is_success();
        if answer.into_body().collect().await.is_err() {
            mine.errors += 1;
            break;
        }
        let done = Instant::now();
        free_since = done;
        if !ok {
            mine.non_2xx += 1;
        }
        mine.latencies_us
            .push(done.duration_since(sent).as_micros() as u64);
    }
    let mut all = seen
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    all.latencies_us.extend(mine.latencies_us);
    all.non_2xx += mine.non_2xx;
    all.errors += mine.errors;
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, body_file, rate, seconds, connections, key, first] = &args[..] else {
        anyhow::bail!("usage: fixed_rate URL BODY_FILE RATE SECONDS CONNECTIONS KEY FIRST");
    };
    let rate: f64 = rate.parse()?;
    let seconds: f64 = seconds.parse()?;
    let connections: usize = connections.parse()?;
    let body = std::fs::read(body_file)?;
    let numbered = body.windows(9).position(|w| w == b"#########");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let plan = Arc::new(Plan {
            uri: url.parse()?,
            body,
            numbered,
            key: key.clone(),
            first: first.parse()?,
            // The connections are made first.
            start: Instant::now() + Duration::from_millis(200),
            interval: Duration::from_secs_f64(1.0 / rate),
            total: (rate * seconds).round() as u64,
            next: AtomicU64::new(0),
        });
        let seen = Arc::new(Mutex::new(Seen::default()));
        let tasks: Vec<_> = (0..connections)
            .map(|_| tokio::spawn(connection(plan.clone(), seen.clone())))
            .collect();
        for task in tasks {
            task.await??;
        }
        let elapsed = plan.start.elapsed().as_secs_f64();
        let mut seen = seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        seen.latencies_us.sort_unstable();
        let l = &seen.latencies_us;
        let at = |q: f64| {
            l.get(((l.len() as f64 * q).ceil() as usize).saturating_sub(1))
                .copied()
        };
        println!(
            "{}",
            serde_json::json!({
                "requests": l.len(),
                "due": plan.total,
                "non_2xx": seen.non_2xx,
                "errors": seen.errors,
                "seconds": elapsed,
                "rps": l.len() as f64 / elapsed,
                "p50_us": at(0.50),
                "p99_us": at(0.99),
                "p999_us": at(0.999),
                "max_us": l.last(),
            })
        );
        Ok(())
    })
}
