//! Tokenizer room benchmark: HuggingFace `tokenizers` encode (the baseline) against the fast
//! engine, single-threaded, on texts generated here; plus load time and resident memory of
//! each engine, each measured in a fresh child process.
//!
//! Run: `cargo bench --bench tokenize` (needs assets/qwen3.5/tokenizer.json from
//! scripts/fetch-tokenizer).

use std::hint::black_box;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use tokengate::tokenize::{Engine, EngineChoice, Tokenizer};

const CHILD_ENV: &str = "TOKENGATE_BENCH_LOAD";

fn tokenizer_path() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("assets/qwen3.5/tokenizer.json");
    assert!(
        path.is_file(),
        "{} is missing: run scripts/fetch-tokenizer first",
        path.display()
    );
    path
}

/// A small deterministic generator (xorshift), so the texts are the same on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[(self.next() % items.len() as u64) as usize]
    }
}

const ENGLISH: &[&str] = &[
    "The gateway counts every prompt before it reaches the accelerator. ",
    "A token bucket refills at a steady rate and spends tokens on each request. ",
    "Long prefills can stall everyone's decode if nobody limits them.\n",
    "We measured the latency twice: once at noon and once at midnight. ",
    "It's been three years since they'd last walked along that river, and nobody said a word. ",
    "Rate limits should be measured in tokens, not in requests per second.\n\n",
    "Version 2.0.1 was tagged at 09:45 on 2026-03-07 after 1,024 tests passed. ",
];

const CODE: &[&str] = &[
    "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!(\"{:?}\", v);\n}\n",
    "def fib(n: int) -> int:\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
    "const add = (a, b) => a + b;\nconsole.log(`sum: ${add(2, 3)}`);\n",
    "SELECT tenant, SUM(prompt_tokens) FROM requests GROUP BY tenant ORDER BY 2 DESC;\n",
    "{\"model\": \"qwen3.5-27b\", \"max_tokens\": 512, \"messages\": [{\"role\": \"user\"}]}\n",
];

const CHINESE: &[&str] = &[
    "今天天气很好，我们去公园散步吧。",
    "网关在请求到达加速卡之前先计算提示词的令牌数。",
    "长时间的预填充会拖慢所有用户的解码速度。",
    "模型的权重占用了五十四吉字节，剩下的留给键值缓存。",
    "如果队列没有上限，系统迟早会被压垮。\n",
    "第一季度的收入增长了百分之十二点五，北京和上海的集群都已上线。",
];

/// About `bytes` bytes of pieces drawn from `sources` in turn.
fn generate(rng: &mut Rng, sources: &[&[&str]], bytes: usize) -> String {
    let mut text = String::new();
    while text.len() < bytes {
        let source = sources[(rng.next() % sources.len() as u64) as usize];
        text.push_str(rng.pick(source));
    }
    text
}

fn texts() -> Vec<(&'static str, String)> {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let english_code = generate(&mut rng, &[ENGLISH, ENGLISH, CODE], 16 * 1024);
    let chinese = generate(&mut rng, &[CHINESE], 16 * 1024);
    let mut rag = String::new();
    for doc in 0..8 {
        rag.push_str(&format!("<document index=\"{doc}\">\n"));
        rag.push_str(&generate(
            &mut rng,
            &[ENGLISH, CHINESE, CODE],
            8 * 1024 - 40,
        ));
        rag.push_str("\n</document>\n");
    }
    vec![
        ("16 KB English + code", english_code),
        ("16 KB Chinese", chinese),
        ("64 KB mixed RAG context", rag),
    ]
}

/// Tokens per second of `count` on `text`, over at least `budget` of repetitions.
fn tokens_per_second(count: impl Fn(&str) -> usize, text: &str, budget: Duration) -> f64 {
    let tokens = count(text); // warm-up
    let start = Instant::now();
    let mut rounds = 0u32;
    while start.elapsed() < budget {
        black_box(count(black_box(text)));
        rounds += 1;
    }
    (tokens as f64 * f64::from(rounds)) / start.elapsed().as_secs_f64()
}

fn vm_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Child process: load one engine, print `seconds rss_kib peak_kib`.
fn load_child(choice: &str) {
    let choice = match choice {
        "fast" => EngineChoice::Auto,
        _ => EngineChoice::Hf,
    };
    let start = Instant::now();
    let tokenizer = Tokenizer::load_with(&tokenizer_path(), choice).unwrap();
    let seconds = start.elapsed().as_secs_f64();
    black_box(tokenizer.count("warm"));
    println!("{seconds} {} {}", vm_kib("VmRSS:"), vm_kib("VmHWM:"));
}

fn measure_load(choice: &str) -> (f64, f64, f64) {
    let output = Command::new(std::env::current_exe().unwrap())
        .env(CHILD_ENV, choice)
        .output()
        .expect("re-running the bench binary");
    assert!(output.status.success(), "load child failed: {output:?}");
    let line = String::from_utf8(output.stdout).unwrap();
    let v: Vec<f64> = line
        .split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect();
    (v[0], v[1] / 1024.0, v[2] / 1024.0)
}

fn main() {
    if let Ok(choice) = std::env::var(CHILD_ENV) {
        load_child(&choice);
        return;
    }
    // `cargo bench` passes `--bench`; accept and ignore libtest-style arguments.
    let budget = Duration::from_millis(1500);

    println!("tokenizer load (fresh process each, median of 3):");
    for choice in ["hf", "fast"] {
        let mut runs: Vec<(f64, f64, f64)> = (0..3).map(|_| measure_load(choice)).collect();
        runs.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (secs, rss, peak) = runs[1];
        println!("  {choice:>4}: {secs:.3} s, RSS {rss:.0} MiB (peak {peak:.0} MiB)");
    }

    let fast = Tokenizer::load(&tokenizer_path()).unwrap();
    assert_eq!(fast.engine(), Engine::Fast);
    let hf = Tokenizer::load_with(&tokenizer_path(), EngineChoice::Hf).unwrap();

    println!("count, single thread (tokens/s; ratio = fast / HF encode):");
    for (name, text) in texts() {
        let tokens = fast.count(&text);
        assert_eq!(tokens, hf.count(&text), "engines disagree on {name}");
        let base = tokens_per_second(|t| hf.count(t), &text, budget);
        let ours = tokens_per_second(|t| fast.count(t), &text, budget);
        println!(
            "  {name:<24} {tokens:>6} tokens  HF {:>6.2} M/s  fast {:>6.2} M/s  ratio {:.1}x",
            base / 1e6,
            ours / 1e6,
            ours / base
        );
    }
}
