//! What the gateway adds to a request's latency, measured against the same simulated backend
//! reached directly, in the same run: a 2 KB chat and a 4K-token chat through the full proxy
//! path (auth, parse, count, charge, admit, forward, meter), and `/tokenize` of the 4K-token chat
//! answered locally. Run: `cargo bench --bench gateway` (numbers in docs/performance.md).

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokengate::app::{self, Deps};
use tokengate::clock::SystemClock;
use tokengate::config::Config;
use tokengate::sim::{self, SimConfig};
use tokengate::tokenize::Tokenizer;

type HttpClient = Client<HttpConnector, Full<Bytes>>;

const ROUNDS: usize = 400;
const WARMUP: usize = 40;

fn prose(bytes: usize) -> String {
    let sentence = "The gateway counts every prompt with the model's own tokenizer before the \
                    accelerator sees it, and admits only what the KV cache can hold. ";
    sentence.repeat(bytes / sentence.len() + 1)[..bytes].to_string()
}

async fn post(client: &HttpClient, url: &str, body: &Value) -> Duration {
    let req = http::Request::post(url)
        .header("content-type", "application/json")
        .header("authorization", "Bearer sk-bench")
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("request builds");
    let started = SystemClock.instant();
    let resp = client.request(req).await.expect("request succeeds");
    assert!(resp.status().is_success(), "{url}: {}", resp.status());
    resp.into_body().collect().await.expect("body arrives");
    started.elapsed()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Interleaves direct and gateway requests so drift hits both alike; prints p50/p99 and the
/// added latency.
async fn compare(client: &HttpClient, label: &str, direct: &str, gateway: &str, body: &Value) {
    for _ in 0..WARMUP {
        post(client, direct, body).await;
        post(client, gateway, body).await;
    }
    let (mut d, mut g) = (Vec::with_capacity(ROUNDS), Vec::with_capacity(ROUNDS));
    for _ in 0..ROUNDS {
        d.push(post(client, direct, body).await);
        g.push(post(client, gateway, body).await);
    }
    d.sort();
    g.sort();
    let (d50, d99, g50, g99) = (
        percentile(&d, 50.0),
        percentile(&d, 99.0),
        percentile(&g, 50.0),
        percentile(&g, 99.0),
    );
    println!(
        "{label:<34} direct p50 {:>8.0} us p99 {:>8.0} us | gateway p50 {:>8.0} us p99 {:>8.0} us | added p50 {:>7.0} us p99 {:>7.0} us | ratio p50 {:.2}x",
        micros(d50),
        micros(d99),
        micros(g50),
        micros(g99),
        micros(g50) - micros(d50),
        micros(g99) - micros(d99),
        micros(g50) / micros(d50)
    );
}

async fn time_alone(client: &HttpClient, label: &str, url: &str, body: &Value) {
    for _ in 0..WARMUP {
        post(client, url, body).await;
    }
    let mut t: Vec<Duration> = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        t.push(post(client, url, body).await);
    }
    t.sort();
    println!(
        "{label:<34} p50 {:>8.0} us p99 {:>8.0} us",
        micros(percentile(&t, 50.0)),
        micros(percentile(&t, 99.0))
    );
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(run());
}

async fn run() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("assets/qwen3.5/tokenizer.json");
    let tokenizer = Arc::new(Tokenizer::load(&path).expect("run scripts/fetch-tokenizer first"));
    let mut sim_cfg = SimConfig::pace(Duration::ZERO);
    sim_cfg.served_names = vec!["qwen3.5-27b".to_string()];
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let backend = sim::start(sim_cfg, tokenizer.clone(), listener)
        .await
        .expect("sim starts");
    let cfg = Config::parse(&format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
[tokenizer]
path = "unused"
[model]
served_names = ["qwen3.5-27b"]
max_model_len = 32768
default_max_tokens = 16
[[backends]]
url = "{}"
kv_capacity_bytes = 1000000000000
max_batch = 1024
[[tenants]]
name = "bench"
api_keys = ["sk-bench"]
prefill_tokens_per_second = 1e12
decode_tokens_per_second = 1e12
requests_per_second = 1e9
"#,
        backend.url()
    ))
    .expect("config");
    let gateway = app::start(
        cfg,
        Deps {
            tokenizer: Some(tokenizer.clone()),
            ..Deps::default()
        },
    )
    .await
    .expect("gateway starts");
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: HttpClient = Client::builder(TokioExecutor::new()).build(connector);
    let direct = format!("{}/v1/chat/completions", backend.url());
    let through = format!("http://{}/v1/chat/completions", gateway.addr);

    let chat = |content: String| {
        json!({"model": "qwen3.5-27b", "messages": [{"role": "user", "content": content}],
               "max_tokens": 16, "ignore_eos": true})
    };
    let small = chat(prose(2048));
    let long_text = {
        let mut s = prose(16_000);
        while tokenizer.count(&s) < 4096 {
            s.push_str(&prose(512));
        }
        s
    };
    let long = chat(long_text.clone());
    println!(
        "gateway overhead vs direct-to-sim ({ROUNDS} requests each, interleaved, sequential, keep-alive; sim answers 16 tokens at once)"
    );
    compare(
        &client,
        "chat 2 KB, non-streamed",
        &direct,
        &through,
        &small,
    )
    .await;
    let mut small_stream = small.clone();
    small_stream["stream"] = json!(true);
    compare(
        &client,
        "chat 2 KB, streamed",
        &direct,
        &through,
        &small_stream,
    )
    .await;
    compare(
        &client,
        "chat 4K tokens, non-streamed",
        &direct,
        &through,
        &long,
    )
    .await;
    let tokenize = json!({"messages": [{"role": "user", "content": long_text}]});
    time_alone(
        &client,
        "/tokenize chat 4K tokens (local)",
        &format!("http://{}/tokenize", gateway.addr),
        &tokenize,
    )
    .await;
    gateway.shutdown().await;
}
