//! Chat counting bench (tokenize room): turn 10 of a realistic conversation counted with a cold
//! span cache versus a warm one (turns 1-9 counted before; then also their answers counted
//! ahead, as the gateway does when they come back), with the plain render-and-count path as the
//! baseline, all in one run, with the gateway's tokenizer and with HuggingFace's.
//!
//! Needs `assets/qwen3.5/tokenizer.json` and `assets/qwen3.5/chat_template.jinja`
//! (scripts/fetch-tokenizer). Run:
//!     cargo bench --bench chat

use serde_json::{json, Value};
use std::hint::black_box;
use std::path::Path;
use std::time::Duration;
use tokengate::clock::SystemClock;
use tokengate::tokenize::cache::ChatCounter;
use tokengate::tokenize::chat::{spans, ChatPrompt, ChatTemplate, CountTokens};
use tokengate::tokenize::{EngineChoice, Tokenizer};

const TURNS: usize = 10;
const REPEATS: usize = 25;
const CACHE_BYTES: usize = 8 << 20;

const SYSTEM: &str = "You are the operations assistant of an inference platform that serves \
large language models on Ascend accelerators. Answer precisely and name units (GB versus GiB, \
tokens per second versus requests per second). When a question depends on configuration, ask \
for the relevant section instead of guessing. Prefer short paragraphs; use code blocks for \
commands and configuration. Never invent metric names: the gateway exports \
tokengate_requests_total, tokengate_prefill_tokens_total, tokengate_decode_tokens_total and \
histograms of time to first token and time per output token.";

const QUESTIONS: [&str; TURNS] = [
    "Our chat tenant sees 429s at 14:00 every day. Where do I start?",
    "The decode bucket is 2,000 tokens/s with a burst of 8,000. Is that too small for 40 users?",
    "How do I compute how many sequences fit in the KV cache of one 910B3 card for Qwen3.5-27B?",
    "What changes if the engine keeps the DeltaNet state in bf16 instead of fp32?",
    "Write the TOML for a tenant with 1,500 prefill tokens/s and 600 decode tokens/s.",
    "请用中文解释一下为什么长的prefill会拖慢所有人的decode。",
    "Can you give me a PromQL query for the P95 time to first token per tenant?",
    "What happens to reserved decode tokens when a client disconnects mid-stream?",
    "We have two gateway replicas. Do the limits add up or are they shared?",
    "Summarize the three changes you recommend, in priority order.",
];

const ANSWER_PARTS: [&str; 6] = [
    "Start from the metrics rather than the logs: compare tokengate_decode_tokens_total with the \
     reserved and refunded counters over the same window, per tenant.",
    "A burst of 8,000 tokens admits about four long answers at once; with forty users sending \
     follow-ups in the same minute the bucket empties and the next requests wait for refill.",
    "The footprint of one sequence is its prompt plus its maximum output, rounded up to the block \
     size of 128 tokens, times 64 KiB of KV per token, plus the fixed recurrent state.",
    "```toml\n[tenants.chat]\nprefill_tokens_per_second = 1500\ndecode_tokens_per_second = 600\n\
     burst_tokens = 6000\n```",
    "长的prefill会占用整张卡的算力几秒钟，同一批次里的其他序列在这段时间里拿不到新的token。",
    "Refunds happen when the response body ends, errors or is dropped, so a disconnect returns \
     the unused part of the reservation immediately.",
];

fn tools() -> Vec<Value> {
    ["get_metrics", "read_config", "set_tenant_limit"]
        .iter()
        .map(|name| {
            json!({"type": "function", "function": {
                "name": name,
                "description": format!("{name}: operates on the gateway of the named cluster."),
                "parameters": {"type": "object", "properties": {
                    "cluster": {"type": "string", "description": "Cluster name, e.g. hz-910b-02"},
                    "tenant": {"type": "string"},
                    "window": {"type": "string", "enum": ["5m", "1h", "24h"]},
                }, "required": ["cluster"]},
            }})
        })
        .collect()
}

/// The answer to question `turn`: four of the parts, opened by a line that makes every answer
/// distinct (repeated history would flatter the cache).
fn answer(turn: usize) -> String {
    let parts = (0..4).map(|i| ANSWER_PARTS[(turn + i) % ANSWER_PARTS.len()]);
    std::iter::once(format!("About question {turn}: {}", QUESTIONS[turn - 1]))
        .chain(parts.map(str::to_owned))
        .collect::<Vec<_>>()
        .join("\n\n")
}

/// The request of turn `n` (1-based): the whole history plus the new question.
fn turn(n: usize) -> ChatPrompt {
    let mut messages = vec![json!({"role": "system", "content": SYSTEM})];
    for (i, question) in QUESTIONS.iter().enumerate().take(n) {
        if i > 0 {
            messages.push(json!({"role": "assistant", "content": answer(i)}));
        }
        messages.push(json!({"role": "user", "content": question}));
    }
    ChatPrompt {
        messages,
        tools: Some(tools()),
        add_generation_prompt: true,
        ..ChatPrompt::default()
    }
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn main() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/assets/qwen3.5/tokenizer.json");
    let missing = |e: &dyn std::fmt::Display| -> ! {
        panic!("{path}: {e} (run scripts/fetch-tokenizer first)")
    };
    // The gateway's tokenizer (the fast engine for Qwen3.5), then HuggingFace's for reference.
    let fast = Tokenizer::load(Path::new(path)).unwrap_or_else(|e| missing(&e));
    // The gateway's own HuggingFace path (its fallback engine), not a plain `encode`.
    let hf =
        Tokenizer::load_with(Path::new(path), EngineChoice::Hf).unwrap_or_else(|e| missing(&e));
    let last = turn(TURNS);
    let template = ChatTemplate::builtin_qwen35();
    let rendered = template.render(&last).unwrap();
    let expected = fast.count(&rendered);
    assert_eq!(hf.count(&rendered), expected);
    let previous = template.render(&turn(TURNS - 1)).unwrap();
    let previous: Vec<&str> = spans(&previous).collect();
    let new: Vec<usize> = spans(&rendered)
        .filter(|s| !previous.contains(s))
        .map(|s| fast.count(s))
        .collect();
    println!(
        "chat counting, turn {TURNS}: {expected} tokens, {} bytes, {} spans; {} tokens new since \
         turn {} (answer {}: {}, question {TURNS}: {}); median of {REPEATS}",
        rendered.len(),
        spans(&rendered).count(),
        new.iter().sum::<usize>(),
        TURNS - 1,
        TURNS - 1,
        new[0],
        new[1]
    );
    for (name, tok) in [
        ("fast engine (the gateway's)", &fast as &dyn CountTokens),
        ("HuggingFace tokenizers", &hf),
    ] {
        println!("{name}:");
        measure(tok, &template, &last, expected);
    }
    compare_renderers(&template, &last, &rendered);
}

/// Cold, warm and repeated counts of `last` with `tok`, against render + count without a cache.
fn measure(tok: &dyn CountTokens, template: &ChatTemplate, last: &ChatPrompt, expected: usize) {
    let mut full = Vec::new();
    let mut cold = Vec::new();
    let mut warm = Vec::new();
    let mut ahead = Vec::new();
    let mut repeat = Vec::new();
    // A counter that has seen turns 1 to 9, and, with `answers`, each of their answers as the
    // gateway counts them ahead when they come back from the backend.
    let seen = |answers: bool| {
        let counter = ChatCounter::new(ChatTemplate::builtin_qwen35(), CACHE_BYTES);
        for k in 1..TURNS {
            counter.count(tok, &turn(k)).unwrap();
            if answers {
                assert!(counter.remember_reply(tok, &answer(k)));
            }
        }
        counter
    };
    for _ in 0..REPEATS {
        let t = SystemClock.instant();
        let n = tok.count(&template.render(black_box(last)).unwrap());
        full.push(t.elapsed());
        assert_eq!(n, expected);

        let counter = ChatCounter::new(ChatTemplate::builtin_qwen35(), CACHE_BYTES);
        let t = SystemClock.instant();
        let n = counter.count(tok, black_box(last)).unwrap();
        cold.push(t.elapsed());
        assert_eq!(n, expected);

        for (answers, samples, new_spans) in [(false, &mut warm, 2), (true, &mut ahead, 1)] {
            let counter = seen(answers);
            let before = counter.stats();
            let t = SystemClock.instant();
            let n = counter.count(tok, black_box(last)).unwrap();
            samples.push(t.elapsed());
            assert_eq!(n, expected);
            assert_eq!(counter.stats().misses - before.misses, new_spans);
        }

        // The same request again: every span hits, so this is render + hash + lookup alone.
        let counter = seen(false);
        counter.count(tok, last).unwrap();
        let t = SystemClock.instant();
        let n = counter.count(tok, black_box(last)).unwrap();
        repeat.push(t.elapsed());
        assert_eq!(n, expected);
    }
    let [full, cold, warm, ahead, repeat] = [full, cold, warm, ahead, repeat].map(median);
    println!("  render + count, no cache         : {full:>10.2?}");
    println!("  cold span cache                  : {cold:>10.2?}");
    println!("  warm, requests seen              : {warm:>10.2?}");
    println!("  warm, answers also counted ahead : {ahead:>10.2?}");
    println!("  same request again               : {repeat:>10.2?}");
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
    println!(
        "  speedup over cold: {:.1}x warm (requests seen), {:.1}x warm (answers counted ahead)",
        ratio(cold, warm),
        ratio(cold, ahead)
    );
}

/// The built-in renderer against the official Jinja template rendered by minijinja.
fn compare_renderers(builtin: &ChatTemplate, prompt: &ChatPrompt, rendered: &str) {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/assets/qwen3.5/chat_template.jinja"
    );
    let jinja = ChatTemplate::from_jinja_file(path)
        .unwrap_or_else(|e| panic!("{e} (run scripts/fetch-tokenizer first)"));
    assert_eq!(jinja.render(prompt).unwrap(), rendered);
    let time = |template: &ChatTemplate| {
        median(
            (0..REPEATS * 4)
                .map(|_| {
                    let t = SystemClock.instant();
                    black_box(template.render(black_box(prompt)).unwrap());
                    t.elapsed()
                })
                .collect(),
        )
    };
    let (b, j) = (time(builtin), time(&jinja));
    println!(
        "render turn {TURNS}: built-in {b:.2?}, jinja {j:.2?}: built-in {:.1}x faster",
        j.as_secs_f64() / b.as_secs_f64()
    );
}
