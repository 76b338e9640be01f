//! Target `metrics`: the backend feedback's reader of Prometheus text (`feedback::parse::parse`)
//! on scrapes built from the names vLLM and MindIE export (labels with braces, commas and quotes
//! inside their values, comments, blank lines, unknown metrics, timestamps, values of any float
//! including NaN, infinities, negatives and percentages), then corrupted by one line that is
//! not a sample (`}{ 1`, which once panicked the reader; an unclosed label set, a bad name, no
//! value, a value that is not a number), and by byte edits.
//!
//! Properties:
//! - nothing panics (integer overflow included: the fuzz profile checks it);
//! - a generated scrape is read exactly as its samples say: the flavor, every count summed after
//!   clamping (NaN and infinities dropped, negatives read as 0), the fullest cache usage (a
//!   fraction, a percentage up to 100, clamped past it), the cache size from `cache_config_info`,
//!   the histograms' sums and counts, and the exact list of what was clamped; samples of the
//!   other flavor, unknown metrics, comments and blank lines change nothing;
//! - the same text with CRLF line ends reads the same;
//! - a scrape with a bad line is refused at exactly that line (the first bad one), quoting its
//!   first 64 characters, and why is one of the reasons that kind of line gets;
//! - after any byte edit, a refusal names a line of the text and quotes its start.

use proptest::prelude::*;
use proptest::sample::{select, Index};
use proptest::test_runner::TestCaseError;
use tokengate::feedback::engine::CacheInfo;
use tokengate::feedback::parse::{parse, BackendReading, Flavor, Moments, QUOTED_CHARS};

/// What a known metric is, for the oracle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Running,
    Waiting,
    Swapped,
    Preemptions,
    Usage,
    CacheConfig,
    PrefixHits,
    PrefixQueries,
    TtftSum,
    TtftCount,
    TpotSum,
    TpotCount,
    QueueSum,
    QueueCount,
}

/// The names the parser knows, without the `vllm:` prefix.
const KNOWN: &[(&str, Kind)] = &[
    ("num_requests_running", Kind::Running),
    ("num_requests_waiting", Kind::Waiting),
    ("num_requests_swapped", Kind::Swapped),
    ("num_preemptions_total", Kind::Preemptions),
    ("kv_cache_usage_perc", Kind::Usage),
    ("gpu_cache_usage_perc", Kind::Usage),
    ("npu_cache_usage_perc", Kind::Usage),
    ("cache_config_info", Kind::CacheConfig),
    ("prefix_cache_hits_total", Kind::PrefixHits),
    ("prefix_cache_queries_total", Kind::PrefixQueries),
    ("time_to_first_token_seconds_sum", Kind::TtftSum),
    ("time_to_first_token_seconds_count", Kind::TtftCount),
    ("time_per_output_token_seconds_sum", Kind::TpotSum),
    ("inter_token_latency_seconds_sum", Kind::TpotSum),
    ("time_per_output_token_seconds_count", Kind::TpotCount),
    ("inter_token_latency_seconds_count", Kind::TpotCount),
    ("request_queue_time_seconds_sum", Kind::QueueSum),
    ("request_queue_time_seconds_count", Kind::QueueCount),
];

/// Valid names the parser does not read (some close to known ones).
const UNKNOWN: &[&str] = &[
    "vllm:prompt_tokens_total",
    "prompt_tokens_total",
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:num_requests_running_x",
    "num_requests",
    "_private",
    ":colon:",
    "process_resident_memory_bytes",
];

/// One line of a scrape.
#[derive(Debug, Clone)]
enum Line {
    /// `# HELP`, `# TYPE` or any comment.
    Comment(String),
    /// Whitespace only.
    Blank(String),
    /// A known metric: with `vllm:` or not, its labels, its value and how it is spelled.
    Known {
        vllm: bool,
        name: &'static str,
        kind: Kind,
        labels: Labels,
        value: f64,
        spelling: String,
        tail: String,
    },
    /// A metric the parser ignores.
    Unknown { text: String },
}

/// A label set as written, and for `cache_config_info` the figures it carries.
#[derive(Debug, Clone)]
struct Labels {
    text: Option<String>,
    cache: Option<(u64, u64)>,
}

fn float() -> impl Strategy<Value = f64> {
    prop_oneof![
        4 => (0u64..10_000).prop_map(|n| n as f64),
        2 => 0.0f64..1.0,
        1 => 1.0f64..150.0,
        1 => -1e6f64..0.0,
        1 => select(vec![
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            -0.0,
            1e300,
            f64::MAX,
            1.8446744073709552e19,
            100.0,
            1.0,
            f64::MIN_POSITIVE,
        ]),
        1 => any::<f64>(),
    ]
}

/// How `v` may be written in the text format (each reads back as `v`).
fn spelled(v: f64, style: u8) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "+Inf" } else { "-Inf" }.into();
    }
    match style % 4 {
        0 => format!("{v}"),
        1 => format!("{v:e}"),
        2 => format!("{v:?}"),
        _ => format!("{v:E}"),
    }
}

/// Label values that break naive readers: braces, commas, quotes, spaces.
fn label_value() -> impl Strategy<Value = String> {
    select(vec![
        "q",
        "qwen3.5-27b",
        "",
        "a}b",
        "{",
        "}",
        "a,b",
        "x=\\\"y\\\"",
        "} 5",
        "+Inf",
        " ",
        "a\\\\",
        "杭州",
    ])
    .prop_map(str::to_owned)
}

fn labels(kind: Kind) -> BoxedStrategy<Labels> {
    if kind == Kind::CacheConfig {
        // The two figures the parser reads, in any order among plain labels.
        return (
            0u64..100_000,
            select(vec![16u64, 32, 128, 256]),
            any::<bool>(),
        )
            .prop_map(|(blocks, block, first)| {
                let figures = format!("block_size=\"{block}\",num_gpu_blocks=\"{blocks}\"");
                let text = if first {
                    format!("{figures},cache_dtype=\"auto\"")
                } else {
                    format!("cache_dtype=\"auto\",{figures}")
                };
                Labels {
                    text: Some(text),
                    cache: Some((blocks, block)),
                }
            })
            .boxed();
    }
    prop_oneof![
        Just(None),
        Just(Some(String::new())),
        prop::collection::vec(("[a-z_]{1,8}", label_value()), 1..4).prop_map(|kv| {
            let set: Vec<String> = kv.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
            Some(set.join(","))
        }),
    ]
    .prop_map(|text| Labels { text, cache: None })
    .boxed()
}

fn known_line() -> impl Strategy<Value = Line> {
    (select(KNOWN.to_vec()), any::<bool>())
        .prop_flat_map(|((name, kind), vllm)| {
            (
                Just((name, kind, vllm)),
                labels(kind),
                float(),
                any::<u8>(),
                select(vec!["", " 1700000000000", "  ", "\t"]),
            )
        })
        .prop_map(
            |((name, kind, vllm), labels, value, style, tail)| Line::Known {
                vllm,
                name,
                kind,
                labels,
                value,
                spelling: spelled(value, style),
                tail: tail.to_owned(),
            },
        )
}

fn line() -> impl Strategy<Value = Line> {
    prop_oneof![
        6 => known_line(),
        1 => select(vec![
            "# HELP vllm:num_requests_running Number of requests in model execution batches.",
            "# TYPE vllm:num_requests_running gauge",
            "#",
            "# }{ 1",
            "#no space",
        ])
        .prop_map(|c| Line::Comment(c.to_owned())),
        1 => select(vec!["", " ", "\t", "  \t "]).prop_map(|b| Line::Blank(b.to_owned())),
        2 => (select(UNKNOWN.to_vec()), float(), any::<u8>(), labels(Kind::Running)).prop_map(
            |(name, v, style, labels)| {
                let set = labels.text.map(|t| format!("{{{t}}}")).unwrap_or_default();
                Line::Unknown {
                    text: format!("{name}{set} {}", spelled(v, style)),
                }
            }
        ),
    ]
}

impl Line {
    fn text(&self) -> String {
        match self {
            Line::Comment(t) | Line::Blank(t) => t.clone(),
            Line::Unknown { text } => text.clone(),
            Line::Known {
                vllm,
                name,
                labels,
                spelling,
                tail,
                ..
            } => {
                let prefix = if *vllm { "vllm:" } else { "" };
                let set = labels
                    .text
                    .as_ref()
                    .map(|t| format!("{{{t}}}"))
                    .unwrap_or_default();
                format!("{prefix}{name}{set} {spelling}{tail}")
            }
        }
    }
}

// ---- the oracle ---------------------------------------------------------------------------

fn count(name: &str, v: f64, clamped: &mut Vec<String>) -> Option<u64> {
    if !v.is_finite() {
        clamped.push(format!("{name}: {v} dropped"));
        None
    } else if v < 0.0 {
        clamped.push(format!("{name}: {v} read as 0"));
        Some(0)
    } else {
        Some(v as u64)
    }
}

fn add(slot: &mut Option<u64>, v: Option<u64>) {
    if let Some(v) = v {
        *slot = Some(slot.unwrap_or(0).saturating_add(v));
    }
}

/// What the samples of `lines` say, by the rules of `feedback::parse`'s module doc.
fn expected(lines: &[Line]) -> BackendReading {
    let known = || {
        lines.iter().filter_map(|l| match l {
            Line::Known {
                vllm,
                name,
                kind,
                labels,
                value,
                ..
            } => Some((*vllm, *name, *kind, labels, *value)),
            _ => None,
        })
    };
    let flavor = if known().any(|(vllm, ..)| vllm) {
        Some(Flavor::Vllm)
    } else if known().next().is_some() {
        Some(Flavor::Mindie)
    } else {
        None
    };
    let mut r = BackendReading {
        flavor,
        ..BackendReading::default()
    };
    let mut usages: Vec<f64> = Vec::new();
    for (vllm, bare, kind, labels, v) in known() {
        if vllm != (flavor == Some(Flavor::Vllm)) {
            continue;
        }
        let name = if vllm {
            format!("vllm:{bare}")
        } else {
            bare.to_owned()
        };
        let c = &mut r.clamped;
        let sum = |slot: &mut Option<Moments>, c: &mut Vec<String>| {
            if !v.is_finite() || v < 0.0 {
                c.push(format!("{name}: {v} dropped"));
            } else {
                slot.get_or_insert_with(Moments::default).sum += v;
            }
        };
        let n = |slot: &mut Option<Moments>, c: &mut Vec<String>| {
            if let Some(n) = count(&name, v, c) {
                let m = slot.get_or_insert_with(Moments::default);
                m.count = m.count.saturating_add(n);
            }
        };
        match kind {
            Kind::Running => add(&mut r.running, count(&name, v, c)),
            Kind::Waiting => add(&mut r.waiting, count(&name, v, c)),
            Kind::Swapped => add(&mut r.swapped, count(&name, v, c)),
            Kind::Preemptions => add(&mut r.preemptions_total, count(&name, v, c)),
            Kind::PrefixHits => add(&mut r.prefix_cache_hits_total, count(&name, v, c)),
            Kind::PrefixQueries => add(&mut r.prefix_cache_queries_total, count(&name, v, c)),
            Kind::Usage if !v.is_finite() => c.push(format!("{name}: {v} dropped")),
            Kind::Usage => {
                let fraction = match v {
                    v if v < 0.0 => 0.0,
                    v if v <= 1.0 => v,
                    v if v <= 100.0 => v / 100.0,
                    _ => 1.0,
                };
                if !(0.0..=100.0).contains(&v) {
                    c.push(format!("{name}: {v} read as {fraction}"));
                }
                usages.push(fraction);
            }
            Kind::CacheConfig => {
                let (blocks, block) = labels.cache.expect("figures");
                r.cache_tokens = Some(blocks.saturating_mul(block));
                // A cache of no pages is not sized yet: nothing to learn from.
                r.cache = (blocks > 0).then(|| CacheInfo {
                    block_size: block,
                    num_gpu_blocks: blocks,
                    kv_cache_max_concurrency: None,
                    kv_cache_memory_bytes: None,
                    num_gpu_blocks_override: None,
                    enable_prefix_caching: false,
                    mamba_cache_mode: "none".to_string(),
                });
            }
            Kind::TtftSum => sum(&mut r.ttft, c),
            Kind::TtftCount => n(&mut r.ttft, c),
            Kind::TpotSum => sum(&mut r.tpot, c),
            Kind::TpotCount => n(&mut r.tpot, c),
            Kind::QueueSum => sum(&mut r.queue_time, c),
            Kind::QueueCount => n(&mut r.queue_time, c),
        }
    }
    r.kv_usage = usages.into_iter().reduce(f64::max);
    r
}

/// Readings compared with NaN-free floats bit for bit (`-0.0` sums stay `-0.0` both ways).
fn same(a: &BackendReading, b: &BackendReading) -> bool {
    format!("{a:?}") == format!("{b:?}")
}

// ---- corruptions --------------------------------------------------------------------------

/// A line that is not a sample, and the reasons it may be refused for.
fn bad_line() -> impl Strategy<Value = (String, Vec<&'static str>)> {
    const UNCLOSED: &str = "its `{` is not closed";
    const NAME: &str = "not a metric name";
    const NO_VALUE: &str = "no value";
    const NAN: &str = "its value is not a number";
    prop_oneof![
        select(vec![
            ("}{ 1", vec![UNCLOSED]),
            ("}{", vec![UNCLOSED]),
            ("a}b{c 1", vec![UNCLOSED]),
            (
                "vllm:num_requests_running{model_name=\"q\" 3",
                vec![UNCLOSED]
            ),
            ("{model_name=\"q\"} 1", vec![NAME]),
            ("9lives 1", vec![NAME]),
            ("na-me 1", vec![NAME]),
            ("é 1", vec![NAME]),
            ("<html><body>502 Bad Gateway</body></html>", vec![NAME, NAN]),
            ("vllm:num_requests_running", vec![NO_VALUE]),
            ("num_requests_waiting{model_name=\"q\"}", vec![NO_VALUE]),
            ("num_requests_waiting{model_name=\"q\"}   ", vec![NO_VALUE]),
            ("vllm:kv_cache_usage_perc one", vec![NAN]),
            ("vllm:kv_cache_usage_perc 0,5", vec![NAN]),
            ("vllm:kv_cache_usage_perc 5%", vec![NAN]),
            ("garbage line here", vec![NAN]),
        ])
        .prop_map(|(l, why)| (l.to_owned(), why)),
        // Long garbage: quoted up to 64 characters. A last word that spells a float in
        // Prometheus' text format (`inf`, `nan`, `infinity`, any case: Go's ParseFloat) makes
        // the line a sample, not garbage: the campaign's first million found `a... inf`.
        "[a-z]{70,200}( [a-z]{1,5})?"
            .prop_filter("a float's spelling is a value", |l| {
                l.split_once(' ')
                    .is_none_or(|(_, v)| v.parse::<f64>().is_err())
            })
            .prop_map(|l| (l, vec![NO_VALUE, NAN])),
    ]
}

/// A byte edit of the text.
#[derive(Debug, Clone)]
enum Edit {
    Truncate(Index),
    Insert(Index, u8),
    Remove(Index),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        any::<Index>().prop_map(Edit::Truncate),
        (any::<Index>(), select(b"{}\" =,#\n\r\t0x\xff".to_vec()))
            .prop_map(|(i, b)| Edit::Insert(i, b)),
        any::<Index>().prop_map(Edit::Remove),
    ]
}

#[derive(Debug, Clone)]
struct Case {
    lines: Vec<Line>,
    bad: Option<(Index, String, Vec<&'static str>)>,
    edit: Option<Edit>,
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec(line(), 0..40),
        proptest::option::weighted(0.4, (any::<Index>(), bad_line())),
        proptest::option::weighted(0.2, edit()),
    )
        .prop_map(|(lines, bad, edit)| Case {
            lines,
            bad: bad.map(|(at, (line, why))| (at, line, why)),
            edit,
        })
}

fn check(case: Case) -> Result<(), TestCaseError> {
    let mut lines: Vec<String> = case.lines.iter().map(Line::text).collect();
    let want = expected(&case.lines);
    let text = lines.join("\n");
    let got = parse(&text).map_err(|e| TestCaseError::fail(format!("refused: {e}\n{text}")))?;
    prop_assert!(same(&got, &want), "read {got:?}\nexpected {want:?}\n{text}");
    let crlf = parse(&lines.join("\r\n")).expect("CRLF reads too");
    prop_assert!(same(&crlf, &got), "CRLF read {crlf:?}");

    if let Some((at, bad, why)) = &case.bad {
        let i = at.index(lines.len() + 1);
        lines.insert(i, bad.clone());
        let text = lines.join("\n");
        let e = parse(&text).expect_err("a bad line is refused");
        prop_assert_eq!(e.line, i + 1, "{}\n{}", e, text);
        prop_assert!(why.contains(&e.why), "{} not one of {:?}", e, why);
        let start: String = bad
            .trim_end_matches('\r')
            .chars()
            .take(QUOTED_CHARS)
            .collect();
        prop_assert_eq!(e.start, start);
    }

    if let Some(edit) = &case.edit {
        let mut bytes = lines.join("\n").into_bytes();
        match edit {
            Edit::Truncate(at) => bytes.truncate(at.index(bytes.len() + 1)),
            Edit::Insert(at, b) => bytes.insert(at.index(bytes.len() + 1), *b),
            Edit::Remove(at) if !bytes.is_empty() => {
                bytes.remove(at.index(bytes.len()));
            }
            Edit::Remove(_) => {}
        }
        let text = String::from_utf8_lossy(&bytes);
        if let Err(e) = parse(&text) {
            let line = text.lines().nth(e.line - 1);
            prop_assert!(line.is_some(), "{e} names no line of\n{text}");
            let start: String = line
                .unwrap_or_default()
                .chars()
                .take(QUOTED_CHARS)
                .collect();
            prop_assert_eq!(e.start, start);
        }
    }
    Ok(())
}

#[test]
fn metrics() {
    crate::fuzz(
        "metrics",
        "tests/fuzz/regressions/metrics.txt",
        case(),
        check,
    );
}
