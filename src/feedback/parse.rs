//! Backend feedback, pure: reading one scrape of a backend's Prometheus text into a
//! [`BackendReading`], under vLLM's / vLLM-ascend's names (`vllm:` prefix) or MindIE's (no
//! prefix), summed over label sets (one per served model). Values a backend should never report
//! are clamped, not trusted: NaN and infinities are dropped, negative counts and usages become
//! 0 (vLLM-ascend has reported negative cache usage), and a cache usage over 1 is read as a
//! percentage up to 100 and clamped to 100% past it.
//!
//! A text that is not Prometheus text (a line that is neither a comment nor a sample
//! `name[{labels}] value [timestamp]`) is refused whole, as Prometheus refuses such a scrape:
//! half a reading of a backend that serves something else is not a reading of it.

use super::engine::{draft_positions, CacheInfo};
use serde::{Deserialize, Serialize};

/// Which family of names a scrape used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Flavor {
    /// `vllm:num_requests_running`, `vllm:kv_cache_usage_perc`, ...
    Vllm,
    /// `num_requests_running`, `npu_cache_usage_perc`, ...
    Mindie,
}

/// What one scrape of a backend says, every figure clamped to a sane range.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BackendReading {
    /// The names found (`None` when the text had none of the known ones).
    pub flavor: Option<Flavor>,
    /// Requests in the engine's running batch.
    pub running: Option<u64>,
    /// Requests waiting in the engine's own queue.
    pub waiting: Option<u64>,
    /// Requests swapped out of the cache (MindIE).
    pub swapped: Option<u64>,
    /// Preemptions since the engine started.
    pub preemptions_total: Option<u64>,
    /// Share of the KV cache in use, 0..=1.
    pub kv_usage: Option<f64>,
    /// The cache's size in tokens (vLLM `cache_config_info`: blocks x block size).
    pub cache_tokens: Option<u64>,
    /// The engine's cache configuration (vLLM `cache_config_info`'s labels), when it reports one.
    pub cache: Option<CacheInfo>,
    /// Draft tokens of speculative decoding: the positions of vLLM's
    /// `spec_decode_num_accepted_tokens_per_pos` (0 without speculative decoding).
    pub draft_tokens: u64,
    /// Prefix-cache hits and queries (tokens) since start.
    pub prefix_cache_hits_total: Option<u64>,
    /// See `prefix_cache_hits_total`.
    pub prefix_cache_queries_total: Option<u64>,
    /// Time to first token: sum of seconds and count since start.
    pub ttft: Option<Moments>,
    /// Time per output token: sum of seconds and count since start.
    pub tpot: Option<Moments>,
    /// Time waiting in the engine's queue: sum of seconds and count since start (vLLM).
    pub queue_time: Option<Moments>,
    /// Values refused or clamped, by metric name (a backend misreporting shows here).
    pub clamped: Vec<String>,
}

/// A histogram's `_sum` and `_count`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Moments {
    /// Sum of the observations.
    pub sum: f64,
    /// Number of observations.
    pub count: u64,
}

impl Moments {
    /// The mean observation (`None` with none).
    pub fn mean(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum / self.count as f64)
    }
}

/// One sample line: name, labels, value.
struct Sample<'a> {
    name: &'a str,
    labels: &'a str,
    value: f64,
}

/// Why a scrape's text was refused: the first line that is not a comment, a blank or a sample.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line} is not a Prometheus sample ({why}): `{start}`")]
pub struct ParseError {
    /// The line, from 1.
    pub line: usize,
    /// What is wrong with it.
    pub why: &'static str,
    /// Its first [`QUOTED_CHARS`] characters (a backend's garbage is not logged whole).
    pub start: String,
}

/// The most of a refused line an error quotes.
pub const QUOTED_CHARS: usize = 64;

/// Whether `name` is a metric name: `[a-zA-Z_:][a-zA-Z0-9_:]*`.
fn is_metric_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_' || b == b':')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':')
}

/// Splits a text-format sample line (`name{labels} value [timestamp]`): `None` for comments and
/// blank lines, why not for a line that is not a sample.
fn sample(line: &str) -> Result<Option<Sample<'_>>, &'static str> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return Ok(None);
    }
    let (name, labels, rest) = match line.find('{') {
        Some(open) => {
            // Label values may hold `}` only escaped inside quotes; the last `}` closes the set.
            let close = line
                .rfind('}')
                .filter(|&close| close > open)
                .ok_or("its `{` is not closed")?;
            (&line[..open], &line[open + 1..close], &line[close + 1..])
        }
        None => {
            let at = line.find(char::is_whitespace).ok_or("no value")?;
            (&line[..at], "", &line[at..])
        }
    };
    let name = name.trim();
    if !is_metric_name(name) {
        return Err("not a metric name");
    }
    let value = match rest.split_whitespace().next().ok_or("no value")? {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().map_err(|_| "its value is not a number")?,
    };
    Ok(Some(Sample {
        name,
        labels,
        value,
    }))
}

/// The pairs of a label set (`a="1",b="x,\"y\""`), values unescaped; reading stops at the first
/// pair that is not `name="value"`.
fn labels(set: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = set.trim_start();
    while let Some((name, after)) = rest.split_once('=') {
        let Some(quoted) = after.trim_start().strip_prefix('"') else {
            break;
        };
        let mut value = String::new();
        let mut chars = quoted.char_indices();
        let mut end = None;
        while let Some((i, c)) = chars.next() {
            match c {
                '"' => {
                    end = Some(i + 1);
                    break;
                }
                '\\' => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, other)) => value.push(other),
                    None => break,
                },
                c => value.push(c),
            }
        }
        let Some(end) = end else { break };
        out.push((
            name.trim().trim_start_matches(',').trim().to_string(),
            value,
        ));
        rest = quoted[end..]
            .trim_start()
            .trim_start_matches(',')
            .trim_start();
    }
    out
}

/// The value of label `key` in a label set (`a="1",b="2"`).
fn label(set: &str, key: &str) -> Option<String> {
    labels(set)
        .into_iter()
        .find_map(|(k, v)| (k == key).then_some(v))
}

/// The metrics read, by their name without the flavor's prefix.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Known {
    Running,
    Waiting,
    Swapped,
    Preemptions,
    KvUsage,
    CacheConfig,
    PrefixHits,
    PrefixQueries,
    TtftSum,
    TtftCount,
    TpotSum,
    TpotCount,
    QueueSum,
    QueueCount,
    DraftPosition,
}

/// A name without its `vllm:` prefix, and what it is.
fn known(name: &str) -> Option<(Flavor, Known)> {
    let (flavor, bare) = match name.strip_prefix("vllm:") {
        Some(bare) => (Flavor::Vllm, bare),
        None => (Flavor::Mindie, name),
    };
    let what = match bare {
        "num_requests_running" => Known::Running,
        "num_requests_waiting" => Known::Waiting,
        "num_requests_swapped" => Known::Swapped,
        "num_preemptions_total" => Known::Preemptions,
        // vLLM's current name, its deprecated one, and MindIE's.
        "kv_cache_usage_perc" | "gpu_cache_usage_perc" | "npu_cache_usage_perc" => Known::KvUsage,
        "cache_config_info" => Known::CacheConfig,
        "prefix_cache_hits_total" => Known::PrefixHits,
        "prefix_cache_queries_total" => Known::PrefixQueries,
        "time_to_first_token_seconds_sum" => Known::TtftSum,
        "time_to_first_token_seconds_count" => Known::TtftCount,
        "time_per_output_token_seconds_sum" | "inter_token_latency_seconds_sum" => Known::TpotSum,
        "time_per_output_token_seconds_count" | "inter_token_latency_seconds_count" => {
            Known::TpotCount
        }
        "request_queue_time_seconds_sum" => Known::QueueSum,
        "request_queue_time_seconds_count" => Known::QueueCount,
        "spec_decode_num_accepted_tokens_per_pos" => Known::DraftPosition,
        _ => return None,
    };
    Some((flavor, what))
}

/// A count (`None` for NaN or infinity, 0 for a negative one, whole part otherwise), noting in
/// `clamped` what was not a sane count.
fn count(name: &str, value: f64, clamped: &mut Vec<String>) -> Option<u64> {
    if !value.is_finite() {
        clamped.push(format!("{name}: {value} dropped"));
        return None;
    }
    if value < 0.0 {
        clamped.push(format!("{name}: {value} read as 0"));
        return Some(0);
    }
    // `as` saturates at u64::MAX; counts that large are nonsense read as "very many".
    Some(value as u64)
}

/// A cache usage as a fraction: 0..=1 as is, (1, 100] as a percentage, clamped to 1 past it,
/// 0 below 0, `None` for NaN or infinity.
fn usage(name: &str, value: f64, clamped: &mut Vec<String>) -> Option<f64> {
    if !value.is_finite() {
        clamped.push(format!("{name}: {value} dropped"));
        return None;
    }
    let fraction = if value < 0.0 {
        0.0
    } else if value <= 1.0 {
        value
    } else if value <= 100.0 {
        value / 100.0
    } else {
        1.0
    };
    if !(0.0..=100.0).contains(&value) {
        clamped.push(format!("{name}: {value} read as {fraction}"));
    }
    Some(fraction)
}

fn add(slot: &mut Option<u64>, v: Option<u64>) {
    if let Some(v) = v {
        *slot = Some(slot.unwrap_or(0).saturating_add(v));
    }
}

fn moments_sum(slot: &mut Option<Moments>, name: &str, value: f64, clamped: &mut Vec<String>) {
    if !value.is_finite() || value < 0.0 {
        clamped.push(format!("{name}: {value} dropped"));
        return;
    }
    slot.get_or_insert_with(Moments::default).sum += value;
}

fn moments_count(slot: &mut Option<Moments>, name: &str, value: f64, clamped: &mut Vec<String>) {
    if let Some(n) = count(name, value, clamped) {
        let m = slot.get_or_insert_with(Moments::default);
        m.count = m.count.saturating_add(n);
    }
}

/// Reads one scrape, or refuses it at its first line that is not a sample. vLLM's names win
/// when a text has both families (a MindIE build that also exports vLLM-style names is read
/// once, not twice).
pub fn parse(text: &str) -> Result<BackendReading, ParseError> {
    let mut samples: Vec<(Flavor, Known, Sample<'_>)> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let read = sample(line).map_err(|why| ParseError {
            line: i + 1,
            why,
            start: line.chars().take(QUOTED_CHARS).collect(),
        })?;
        if let Some(s) = read {
            samples.extend(known(s.name).map(|(f, k)| (f, k, s)));
        }
    }
    let flavor = if samples.iter().any(|(f, ..)| *f == Flavor::Vllm) {
        Some(Flavor::Vllm)
    } else if samples.is_empty() {
        None
    } else {
        Some(Flavor::Mindie)
    };
    let mut r = BackendReading {
        flavor,
        ..BackendReading::default()
    };
    let mut usages = Vec::new();
    let mut positions = Vec::new();
    for (f, what, s) in samples {
        if Some(f) != flavor {
            continue;
        }
        let c = &mut r.clamped;
        match what {
            Known::Running => add(&mut r.running, count(s.name, s.value, c)),
            Known::Waiting => add(&mut r.waiting, count(s.name, s.value, c)),
            Known::Swapped => add(&mut r.swapped, count(s.name, s.value, c)),
            Known::Preemptions => add(&mut r.preemptions_total, count(s.name, s.value, c)),
            Known::PrefixHits => add(&mut r.prefix_cache_hits_total, count(s.name, s.value, c)),
            Known::PrefixQueries => {
                add(&mut r.prefix_cache_queries_total, count(s.name, s.value, c))
            }
            Known::KvUsage => usages.extend(usage(s.name, s.value, c)),
            Known::CacheConfig => {
                // One sample per engine behind the server (they agree): the last one read.
                let set = labels(s.labels);
                let field = |k: &str| {
                    (set.iter())
                        .find(|(key, _)| key == k)
                        .and_then(|(_, v)| v.parse::<u64>().ok())
                };
                if let (Some(blocks), Some(block)) = (field("num_gpu_blocks"), field("block_size"))
                {
                    r.cache_tokens = Some(blocks.saturating_mul(block));
                }
                r.cache = CacheInfo::from_labels(&set);
            }
            Known::DraftPosition => positions.extend(label(s.labels, "position")),
            Known::TtftSum => moments_sum(&mut r.ttft, s.name, s.value, c),
            Known::TtftCount => moments_count(&mut r.ttft, s.name, s.value, c),
            Known::TpotSum => moments_sum(&mut r.tpot, s.name, s.value, c),
            Known::TpotCount => moments_count(&mut r.tpot, s.name, s.value, c),
            Known::QueueSum => moments_sum(&mut r.queue_time, s.name, s.value, c),
            Known::QueueCount => moments_count(&mut r.queue_time, s.name, s.value, c),
        }
    }
    // One usage per served model: the engine's cache is shared, so the fullest is the figure.
    r.kv_usage = usages.into_iter().reduce(f64::max);
    r.draft_tokens = draft_positions(positions.iter().map(String::as_str));
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A text the parser must accept.
    fn read(text: &str) -> BackendReading {
        parse(text).expect("prometheus text")
    }

    const VLLM: &str = r#"# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="qwen3.5-27b"} 12.0
vllm:num_requests_waiting{model_name="qwen3.5-27b"} 3.0
vllm:kv_cache_usage_perc{model_name="qwen3.5-27b"} 0.87
vllm:num_preemptions_total{model_name="qwen3.5-27b"} 5.0
vllm:cache_config_info{block_size="128",cache_dtype="auto",num_gpu_blocks="954"} 1.0
vllm:prefix_cache_hits_total{model_name="qwen3.5-27b"} 4096.0
vllm:prefix_cache_queries_total{model_name="qwen3.5-27b"} 16384.0
vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="qwen3.5-27b"} 1.0
vllm:time_to_first_token_seconds_sum{model_name="qwen3.5-27b"} 12.5
vllm:time_to_first_token_seconds_count{model_name="qwen3.5-27b"} 25.0
vllm:inter_token_latency_seconds_sum{model_name="qwen3.5-27b"} 30.0
vllm:inter_token_latency_seconds_count{model_name="qwen3.5-27b"} 600.0
vllm:request_queue_time_seconds_sum{model_name="qwen3.5-27b"} 2.0
vllm:request_queue_time_seconds_count{model_name="qwen3.5-27b"} 25.0
"#;

    const MINDIE: &str = "# TYPE num_requests_running gauge
num_requests_running{model_name=\"qwen\"} 4
num_requests_waiting{model_name=\"qwen\"} 0
num_requests_swapped{model_name=\"qwen\"} 1
num_preemptions_total{model_name=\"qwen\"} 2
npu_cache_usage_perc{model_name=\"qwen\"} 45.5
prompt_tokens_total{model_name=\"qwen\"} 1000
time_to_first_token_seconds_sum{model_name=\"qwen\"} 3
time_to_first_token_seconds_count{model_name=\"qwen\"} 4
time_per_output_token_seconds_sum{model_name=\"qwen\"} 1.5
time_per_output_token_seconds_count{model_name=\"qwen\"} 30
";

    #[test]
    fn reads_vllm_names() {
        let r = read(VLLM);
        assert_eq!(
            r,
            BackendReading {
                flavor: Some(Flavor::Vllm),
                running: Some(12),
                waiting: Some(3),
                swapped: None,
                preemptions_total: Some(5),
                kv_usage: Some(0.87),
                cache_tokens: Some(954 * 128),
                cache: Some(CacheInfo {
                    block_size: 128,
                    num_gpu_blocks: 954,
                    kv_cache_max_concurrency: None,
                    kv_cache_memory_bytes: None,
                    num_gpu_blocks_override: None,
                    enable_prefix_caching: false,
                    mamba_cache_mode: "none".to_string(),
                }),
                draft_tokens: 0,
                prefix_cache_hits_total: Some(4096),
                prefix_cache_queries_total: Some(16384),
                ttft: Some(Moments {
                    sum: 12.5,
                    count: 25
                }),
                tpot: Some(Moments {
                    sum: 30.0,
                    count: 600
                }),
                queue_time: Some(Moments {
                    sum: 2.0,
                    count: 25
                }),
                clamped: vec![],
            }
        );
        assert_eq!(r.tpot.unwrap().mean(), Some(0.05));
    }

    #[test]
    fn reads_mindie_names_with_a_percentage_usage() {
        let r = read(MINDIE);
        assert_eq!(
            r,
            BackendReading {
                flavor: Some(Flavor::Mindie),
                running: Some(4),
                waiting: Some(0),
                swapped: Some(1),
                preemptions_total: Some(2),
                kv_usage: Some(0.455),
                ttft: Some(Moments { sum: 3.0, count: 4 }),
                tpot: Some(Moments {
                    sum: 1.5,
                    count: 30
                }),
                ..BackendReading::default()
            }
        );
    }

    #[test]
    fn sums_models_and_keeps_the_fullest_usage() {
        let r = read(
            "vllm:num_requests_running{model_name=\"a\"} 2\n\
             vllm:num_requests_running{model_name=\"b\"} 3\n\
             vllm:kv_cache_usage_perc{model_name=\"a\"} 0.25\n\
             vllm:kv_cache_usage_perc{model_name=\"b\"} 0.5\n\
             num_requests_running 100\n",
        );
        // The MindIE-style line is ignored once vLLM's names are present.
        assert_eq!((r.running, r.kv_usage), (Some(5), Some(0.5)));
    }

    #[test]
    fn clamps_nonsense() {
        let r = read(
            "vllm:kv_cache_usage_perc -0.3\n\
             vllm:num_requests_waiting -2\n\
             vllm:num_requests_running NaN\n\
             vllm:num_preemptions_total +Inf\n\
             vllm:time_to_first_token_seconds_sum -1\n\
             vllm:time_to_first_token_seconds_count 3\n",
        );
        assert_eq!(r.kv_usage, Some(0.0));
        assert_eq!(r.waiting, Some(0));
        assert_eq!((r.running, r.preemptions_total), (None, None));
        assert_eq!(r.ttft, Some(Moments { sum: 0.0, count: 3 }));
        assert_eq!(
            r.clamped,
            [
                "vllm:kv_cache_usage_perc: -0.3 read as 0",
                "vllm:num_requests_waiting: -2 read as 0",
                "vllm:num_requests_running: NaN dropped",
                "vllm:num_preemptions_total: inf dropped",
                "vllm:time_to_first_token_seconds_sum: -1 dropped",
            ]
        );
        assert_eq!(read("npu_cache_usage_perc 250").kv_usage, Some(1.0));
        assert_eq!(read("npu_cache_usage_perc 100").kv_usage, Some(1.0));
        assert_eq!(read("npu_cache_usage_perc 1").kv_usage, Some(1.0));
        assert_eq!(read("npu_cache_usage_perc NaN").kv_usage, None);
    }

    #[test]
    fn text_without_known_names_reads_as_nothing() {
        assert_eq!(read(""), BackendReading::default());
        assert_eq!(
            read("# HELP x\n# not even a HELP line\n\nsome_other_metric 3\nother{a=\"}\"} 1 1700000000\n"),
            BackendReading::default()
        );
    }

    #[test]
    fn a_text_that_is_not_prometheus_text_is_refused_at_its_first_bad_line() {
        let refused = |text: &str| parse(text).expect_err("refused").to_string();
        // `{` after `}` once sliced backwards and panicked the scraper.
        assert_eq!(
            refused("}{ 1"),
            "line 1 is not a Prometheus sample (its `{` is not closed): `}{ 1`"
        );
        assert_eq!(
            refused("vllm:num_requests_running 2\nvllm:x{a=\"1\" 3\n"),
            "line 2 is not a Prometheus sample (its `{` is not closed): `vllm:x{a=\"1\" 3`"
        );
        assert_eq!(
            refused("garbage line here"),
            "line 1 is not a Prometheus sample (its value is not a number): `garbage line here`"
        );
        assert_eq!(
            refused("{broken 1}"),
            "line 1 is not a Prometheus sample (not a metric name): `{broken 1}`"
        );
        assert_eq!(
            refused("\n9lives 1"),
            "line 2 is not a Prometheus sample (not a metric name): `9lives 1`"
        );
        assert_eq!(
            refused("vllm:num_requests_running"),
            "line 1 is not a Prometheus sample (no value): `vllm:num_requests_running`"
        );
        assert_eq!(
            refused("a{b=\"c\"}"),
            "line 1 is not a Prometheus sample (no value): `a{b=\"c\"}`"
        );
        // An HTML error page: quoted up to 64 characters.
        let page = format!("<html>{}</html>", "x".repeat(500));
        assert_eq!(
            refused(&page),
            format!(
                "line 1 is not a Prometheus sample (no value): `<html>{}`",
                "x".repeat(58)
            )
        );
        let e = parse("ok 1\n\u{e9}t\u{e9} {").expect_err("refused");
        assert_eq!((e.line, e.why), (2, "its `{` is not closed"));
    }
}
