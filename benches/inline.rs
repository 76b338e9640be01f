//! Where to count a prompt: counting time against prompt length, next to what handing a job to
//! a tokenizer worker and its answer back costs, in one run. The cut-off of
//! `TokenizePool::run_maybe_inline` (`INLINE_BYTES`) is read from it: below it, counting here
//! takes less than the hop does.
//!
//! For each length, distinct English and Chinese texts (never the same text twice in a row) are
//! counted with the gateway's tokenizer, once on the calling thread and once through
//! `TokenizePool::run` from a two-thread tokio runtime (the gateway's shape); medians of
//! `ROUNDS`. Needs `assets/qwen3.5/tokenizer.json` (scripts/fetch-tokenizer). Run:
//!     cargo bench --bench inline

use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokengate::clock::SystemClock;
use tokengate::tokenize::pool::{TokenizePool, INLINE_BYTES};
use tokengate::tokenize::Tokenizer;

const ROUNDS: usize = 300;
const LENGTHS: [usize; 7] = [128, 256, 512, 1024, 2048, 4096, 8192];

const ENGLISH: &str = "The gateway counts every prompt with the model's own tokenizer before \
the accelerator sees it, and admits only what the KV cache can hold; ";
const CHINESE: &str =
    "网关在加速器看到请求之前，用模型自己的分词器计算每个提示的长度，只放行缓存装得下的请求；";

/// `n` distinct texts of about `bytes` bytes (cut on a character boundary).
fn texts(base: &str, bytes: usize, n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            let mut s = format!("Request {i}: ");
            while s.len() < bytes {
                s.push_str(base);
            }
            let mut end = bytes;
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            s.truncate(end);
            s
        })
        .collect()
}

fn median(mut t: Vec<Duration>) -> f64 {
    t.sort();
    t[t.len() / 2].as_secs_f64() * 1e6
}

fn main() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("assets/qwen3.5/tokenizer.json");
    let tok = Arc::new(Tokenizer::load(&path).expect("run scripts/fetch-tokenizer first"));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let pool = Arc::new(TokenizePool::new("bench", 2, 256));

    // The hop alone: a job that does nothing, through the pool and back.
    let hop = rt.block_on(async {
        let mut t = Vec::with_capacity(ROUNDS);
        for i in 0..ROUNDS {
            let started = SystemClock.instant();
            black_box(pool.run("bench", move || black_box(i)).await.expect("runs"));
            t.push(started.elapsed());
        }
        median(t)
    });
    println!("hop to a worker and back (empty job): {hop:.1} us median of {ROUNDS}");
    println!("INLINE_BYTES = {INLINE_BYTES}");
    println!(
        "{:<8} {:>6} | {:>10} {:>10} | {:>10} {:>10}",
        "bytes", "", "EN here", "EN pool", "ZH here", "ZH pool"
    );
    for bytes in LENGTHS {
        let mut row = Vec::new();
        for base in [ENGLISH, CHINESE] {
            let texts = Arc::new(texts(base, bytes, ROUNDS));
            let here: Vec<Duration> = texts
                .iter()
                .map(|text| {
                    let started = SystemClock.instant();
                    black_box(tok.count(black_box(text)));
                    started.elapsed()
                })
                .collect();
            let pooled = rt.block_on(async {
                let mut t = Vec::with_capacity(ROUNDS);
                for i in 0..ROUNDS {
                    let (tok, texts) = (tok.clone(), texts.clone());
                    let started = SystemClock.instant();
                    let n = pool.run("bench", move || tok.count(&texts[i])).await;
                    black_box(n.expect("runs"));
                    t.push(started.elapsed());
                }
                t
            });
            row.push((median(here), median(pooled)));
        }
        println!(
            "{bytes:<8} {:>6} | {:>7.1} us {:>7.1} us | {:>7.1} us {:>7.1} us",
            "", row[0].0, row[0].1, row[1].0, row[1].1
        );
    }
}
