//! The reading of a request body: `tokengate::api::request::read_json_body` (one pass over the
//! text, strings' plain bytes a block at a time) against serde_json reading the same bytes into
//! a map (what `read_json_body` did before, kept as the baseline), in the same run:
//! `cargo bench --bench request_body`. The bodies are chats of one user message, 2 KB and 64 KB,
//! as prose on one line and as prose with a newline (`\n` in the JSON) every 80 bytes. Prints
//! microseconds per body, MB/s and the ratio baseline / new. Bounded: a fixed number of bodies,
//! best of five passes.

use bytes::Bytes;
use serde_json::{Map, Value};
use std::hint::black_box;
use tokengate::api::request::read_json_body;
use tokengate::clock::SystemClock;

const PASSES: usize = 5;

/// A chat body of about `size` bytes whose message has a newline every `line` bytes.
fn chat(size: usize, line: Option<usize>) -> Bytes {
    let words = "the quick brown fox jumps over the lazy dog ";
    let text: String = (words.chars().cycle().take(size - 100).enumerate())
        .map(|(i, c)| match line {
            Some(n) if i % n == n - 1 => '\n',
            _ => c,
        })
        .collect();
    let body = serde_json::json!({
        "model": "qwen3.5-27b",
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 256,
    });
    Bytes::from(serde_json::to_vec(&body).expect("a map serializes"))
}

fn new_way(body: &Bytes) -> Map<String, Value> {
    read_json_body(body.clone()).expect("a JSON object").object
}

fn baseline_way(body: &Bytes) -> Map<String, Value> {
    let text = std::str::from_utf8(body).expect("UTF-8");
    serde_json::from_str(text).expect("a JSON object")
}

/// Best (lowest) microseconds per body over a few passes of `bodies` readings.
fn best_us(body: &Bytes, bodies: usize, way: fn(&Bytes) -> Map<String, Value>) -> f64 {
    (0..PASSES)
        .map(|_| {
            let start = SystemClock.instant();
            for _ in 0..bodies {
                black_box(way(black_box(body)));
            }
            start.elapsed().as_secs_f64() * 1e6 / bodies as f64
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    for (label, size, line, bodies) in [
        ("2 KB chat, one line", 2048, None, 20_000),
        ("2 KB chat, 80-byte lines", 2048, Some(80), 20_000),
        ("64 KB chat, one line", 65536, None, 1_000),
        ("64 KB chat, 80-byte lines", 65536, Some(80), 1_000),
    ] {
        let body = chat(size, line);
        assert_eq!(new_way(&body), baseline_way(&body), "both ways read alike");
        let old = best_us(&body, bodies, baseline_way);
        let new = best_us(&body, bodies, new_way);
        let mbps = |us: f64| body.len() as f64 / us;
        println!(
            "{label:<26} baseline {old:8.2} us ({:7.1} MB/s)  new {new:8.2} us ({:7.1} MB/s)  baseline/new {:.2}x",
            mbps(old),
            mbps(new),
            old / new
        );
    }
}
