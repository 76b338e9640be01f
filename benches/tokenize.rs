//! Tokenizer room benchmark: HuggingFace `tokenizers` encode (the baseline) against the fast
//! engine, single-threaded, on texts generated here; plus load time and resident memory of
//! each engine, each measured in a fresh child process.
//!
//! Run: `cargo bench --bench tokenize` (needs assets/qwen3.5/tokenizer.json from
//! scripts/fetch-tokenizer).

use std::hint::black_box;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;
use tokengate::clock::SystemClock;

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

/// Chinese phrases; clauses of 3-8 of them rarely repeat, as in real prose (a pre-token is a
/// whole clause between punctuation).
const ZH_PHRASES: &[&str] = &[
    "网关",
    "请求",
    "到达",
    "加速卡",
    "之前",
    "先计算",
    "提示词",
    "令牌数",
    "长时间的",
    "预填充",
    "会拖慢",
    "所有用户",
    "解码速度",
    "模型权重",
    "占用了",
    "显存",
    "剩下的",
    "留给",
    "键值缓存",
    "如果",
    "队列",
    "没有上限",
    "系统",
    "迟早",
    "被压垮",
    "第一季度",
    "收入",
    "增长了",
    "北京",
    "上海",
    "集群",
    "已经上线",
    "我们",
    "明天",
    "讨论",
    "这个问题",
    "服务器",
    "每秒",
    "吞吐量",
    "延迟",
    "首字",
    "时间",
    "租户",
    "限流",
    "策略",
    "按令牌",
    "而不是",
    "按请求",
    "计费",
];

const ZH_PUNCTUATION: &[&str] = &["，", "。", "；", "！", "？", "、", "：", "“", "”", "\n"];

/// About `bytes` bytes of Chinese clauses of 3-8 random phrases.
fn chinese_prose(rng: &mut Rng, bytes: usize) -> String {
    let mut text = String::new();
    while text.len() < bytes {
        for _ in 0..3 + rng.next() % 6 {
            text.push_str(rng.pick(ZH_PHRASES));
        }
        text.push_str(rng.pick(ZH_PUNCTUATION));
    }
    text
}

/// About `bytes` bytes of pieces drawn from `sources` in turn.
fn generate(rng: &mut Rng, sources: &[&[&str]], bytes: usize) -> String {
    let mut text = String::new();
    while text.len() < bytes {
        let source = sources[(rng.next() % sources.len() as u64) as usize];
        text.push_str(rng.pick(source));
    }
    text
}

/// One 16 KB English + code text.
fn english_code(rng: &mut Rng) -> String {
    generate(rng, &[ENGLISH, ENGLISH, CODE], 16 * 1024)
}

/// One 64 KB RAG context: eight 8 KB documents, English + code and Chinese in turn.
fn rag_context(rng: &mut Rng) -> String {
    let mut rag = String::new();
    for doc in 0..8 {
        rag.push_str(&format!("<document index=\"{doc}\">\n"));
        if doc % 2 == 0 {
            rag.push_str(&generate(rng, &[ENGLISH, CODE], 8 * 1024 - 40));
        } else {
            rag.push_str(&chinese_prose(rng, 8 * 1024 - 40));
        }
        rag.push_str("\n</document>\n");
    }
    rag
}

/// The bench cases: each a list of distinct texts used in rotation, since a gateway rarely
/// sees the same text twice (HuggingFace caches up to 10,000 pre-tokens, which a loop over one
/// text would turn into a benchmark of its cache; the last case shows that effect).
fn cases() -> Vec<(&'static str, Vec<String>)> {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let variants = |rng: &mut Rng, n: usize, make: fn(&mut Rng) -> String| -> Vec<String> {
        (0..n).map(|_| make(rng)).collect()
    };
    vec![
        ("16 KB English + code", variants(&mut rng, 64, english_code)),
        (
            "16 KB Chinese",
            variants(&mut rng, 64, |r| chinese_prose(r, 16 * 1024)),
        ),
        (
            "64 KB mixed RAG context",
            variants(&mut rng, 16, rag_context),
        ),
        (
            "16 KB Chinese, same text",
            variants(&mut rng, 1, |r| chinese_prose(r, 16 * 1024)),
        ),
    ]
}

/// Tokens per second of each counter over `texts` in rotation. The counters run in alternating
/// slices, so a change in machine load during the run affects all alike.
fn tokens_per_second(
    counters: &[&dyn Fn(&str) -> usize],
    texts: &[String],
    slices: u32,
    slice: Duration,
) -> Vec<f64> {
    let mut totals = vec![(0.0, 0.0); counters.len()];
    for _ in 0..slices {
        for (count, total) in counters.iter().zip(&mut totals) {
            let start = SystemClock.instant();
            let mut tokens = 0;
            let mut i = 0;
            while start.elapsed() < slice {
                tokens += count(black_box(&texts[i % texts.len()]));
                i += 1;
            }
            total.0 += tokens as f64;
            total.1 += start.elapsed().as_secs_f64();
        }
    }
    totals.iter().map(|(tokens, secs)| tokens / secs).collect()
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
    let start = SystemClock.instant();
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
    // `cargo bench` passes `--bench`: libtest-style arguments are ignored.

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
    // A second HF object whose pre-token cache is emptied before every call: the cost of a
    // text whose pre-tokens were not seen before.
    let hf_cold = tokenizers::Tokenizer::from_file(tokenizer_path()).unwrap();
    let hf_cold_count = |text: &str| {
        if let tokenizers::ModelWrapper::BPE(bpe) = hf_cold.get_model() {
            bpe.clear_cache();
        }
        hf_cold.encode_fast(text, false).unwrap().len()
    };

    println!("count, single thread, distinct texts in rotation, M tokens/s:");
    println!(
        "  {:<26} {:>11}  {:>8} {:>9} {:>6}  {:>9} {:>9}",
        "case", "tokens/text", "HF", "HF cold", "fast", "fast/HF", "fast/cold"
    );
    for (name, texts) in cases() {
        for text in &texts {
            let n = fast.count(text);
            assert_eq!(n, hf.count(text), "engines disagree on {name}");
            assert_eq!(n, hf_cold_count(text), "engines disagree on {name}");
        }
        let per_text = texts.iter().map(|t| fast.count(t)).sum::<usize>() / texts.len();
        let rates = tokens_per_second(
            &[&|t| hf.count(t), &hf_cold_count, &|t| fast.count(t)],
            &texts,
            10,
            Duration::from_millis(150),
        );
        println!(
            "  {name:<26} {per_text:>11}  {:>8.2} {:>9.2} {:>6.2}  {:>8.1}x {:>8.1}x",
            rates[0] / 1e6,
            rates[1] / 1e6,
            rates[2] / 1e6,
            rates[2] / rates[0],
            rates[2] / rates[1]
        );
    }
}
