use super::*;
use crate::error::ErrorCode;
use crate::metrics::Outcome;
use crate::settled::Charged;

const MINUTE: Duration = Duration::from_secs(60);

fn ok(tenant: &str, prompt: u64, output: u64, reserved: u64, ttft_ms: u64) -> Settled {
    Settled {
        request_id: None,
        tenant: tenant.to_string(),
        model: Some("qwen3.5-27b".to_string()),
        outcome: Outcome::Ok,
        arrived: None,
        charge: Some(Charged {
            prompt_tokens: prompt,
            counted_prompt_tokens: prompt,
            cached_prompt_tokens: None,
            reserved_output_tokens: reserved,
            output_tokens: output,
            refunded_output_tokens: reserved - output,
            answered: true,
            billable: true,
            ttft: Some(Duration::from_millis(ttft_ms)),
            tpot: Some(Duration::from_millis(30)),
        }),
    }
}

fn refused(tenant: &str, code: ErrorCode) -> Settled {
    Settled {
        request_id: None,
        tenant: tenant.to_string(),
        model: None,
        outcome: Outcome::Failed(code),
        arrived: None,
        charge: None,
    }
}

fn tenant<'a>(r: &'a ProfileReport, name: &str) -> &'a TenantStats {
    r.tenants.iter().find(|t| t.name == name).expect("listed")
}

#[test]
fn the_window_slides_by_one_slot_and_since_start_keeps_everything() {
    let t0 = Instant::now();
    let p = Profile::new(15 * MINUTE, t0);
    p.record(t0, &ok("alice", 10, 5, 20, 100));
    p.record(t0 + 5 * MINUTE, &ok("alice", 20, 5, 20, 100));
    let last = t0 + 16 * MINUTE - Duration::from_nanos(1);
    p.record(last, &ok("alice", 30, 5, 20, 100));
    // Slot 15 is now: slots 0..=15 are in the window, the first request among them.
    let r = p.report(last);
    assert_eq!(tenant(&r, "alice").window.requests, 3);
    // Slot 16: slot 0 has left the window; its ring entry is reused for slot 16.
    let r = p.report(t0 + 16 * MINUTE);
    assert_eq!(tenant(&r, "alice").window.requests, 2);
    p.record(t0 + 16 * MINUTE, &ok("alice", 40, 5, 20, 100));
    let r = p.report(t0 + 16 * MINUTE);
    let a = tenant(&r, "alice");
    assert_eq!((a.window.requests, a.since_start.requests), (3, 4));
    // Small integers come back exactly (see the histogram's tests).
    assert_eq!(a.window.prompt_tokens.p50, Some(30.0));
    assert_eq!(a.since_start.prompt_tokens.p50, Some(20.0));
    // A day later nothing is in the window, everything since start.
    let r = p.report(t0 + 24 * 60 * MINUTE);
    let a = tenant(&r, "alice");
    assert_eq!((a.window.requests, a.since_start.requests), (0, 4));
    assert_eq!(a.window.prompt_tokens, Quantiles::default());
    assert_eq!(r.window_seconds, 900.0);
    assert_eq!(r.quantile_relative_error, 0.01);
}

#[test]
fn outcomes_refusals_lengths_and_the_reserved_ratio_add_up_exactly() {
    let t0 = Instant::now();
    let p = Profile::new(15 * MINUTE, t0);
    p.record(t0, &ok("alice", 12, 30, 100, 200));
    p.record(t0, &ok("alice", 14, 45, 100, 400));
    p.record(t0, &refused("alice", ErrorCode::RateLimitExceeded));
    p.record(t0, &refused("alice", ErrorCode::RateLimitExceeded));
    p.record(t0, &refused("unknown", ErrorCode::InvalidApiKey));
    // Disconnected before the answer: its prompt counts, it has no output.
    let mut gone = ok("bob", 40, 0, 100, 0);
    gone.outcome = Outcome::ClientDisconnect;
    gone.charge = Some(Charged {
        prompt_tokens: 40,
        reserved_output_tokens: 100,
        refunded_output_tokens: 100,
        ..Charged::default()
    });
    p.record(t0, &gone);
    let r = p.report(t0);
    assert_eq!(
        r.tenants
            .iter()
            .map(|t| t.name.as_str())
            .collect::<Vec<_>>(),
        ["alice", "bob", "unknown"]
    );
    let a = &tenant(&r, "alice").window;
    assert_eq!(a.requests, 4);
    assert_eq!(
        a.outcomes,
        BTreeMap::from([("ok".into(), 2), ("rate_limit_exceeded".into(), 2)])
    );
    assert_eq!(
        a.refusals,
        BTreeMap::from([("rate_limit_exceeded".into(), 2)])
    );
    assert_eq!(
        (a.output_generated_tokens, a.output_reserved_tokens),
        (75, 200)
    );
    assert_eq!(a.output_reserved_ratio, Some(0.375));
    assert_eq!(a.prompt_tokens.p50, Some(12.0));
    assert_eq!(a.prompt_tokens.p99, Some(14.0));
    assert_eq!(a.output_tokens.p50, Some(30.0));
    let ttft = a.ttft_ms.p99.expect("measured");
    assert!((ttft - 400.0).abs() <= 4.0, "{ttft}");
    let b = &tenant(&r, "bob").window;
    assert_eq!(
        b.outcomes,
        BTreeMap::from([("client_disconnect".into(), 1)])
    );
    assert!(b.refusals.is_empty());
    assert_eq!(b.prompt_tokens.p50, Some(40.0));
    assert_eq!(
        (b.output_tokens, b.output_reserved_ratio),
        (Quantiles::default(), None)
    );
    // Overall: every tenant merged.
    let all = &r.overall.window;
    assert_eq!(all.requests, 6);
    assert_eq!(
        all.refusals,
        BTreeMap::from([
            ("invalid_api_key".into(), 1),
            ("rate_limit_exceeded".into(), 2)
        ])
    );
    assert_eq!(all.prompt_tokens.p50, Some(14.0));
    assert_eq!(all.output_reserved_ratio, Some(0.375));
    assert_eq!(r.overall.since_start, r.overall.window);
}

#[test]
fn twelve_answers_of_eight_tokens_have_every_quantile_eight() {
    let t0 = Instant::now();
    let p = Profile::new(15 * MINUTE, t0);
    for i in 0..12 {
        p.record(t0, &ok("alice", 20 + i, 8, 16, 100));
    }
    let r = p.report(t0);
    let a = &tenant(&r, "alice").window;
    let eight = Quantiles {
        p50: Some(8.0),
        p95: Some(8.0),
        p99: Some(8.0),
    };
    assert_eq!(a.output_tokens, eight);
    assert_eq!(r.overall.window.output_tokens, eight);
    // Prompts of 20..=31 tokens: ranks 6, 12 and 12 exactly.
    assert_eq!(
        a.prompt_tokens,
        Quantiles {
            p50: Some(25.0),
            p95: Some(31.0),
            p99: Some(31.0),
        }
    );
    let v = serde_json::to_value(&r).expect("serializable");
    assert_eq!(
        v["tenants"][0]["output_tokens"],
        serde_json::json!({"p50": 8.0, "p95": 8.0, "p99": 8.0})
    );
}

#[test]
fn the_json_is_flat_per_tenant_with_since_start_nested() {
    let t0 = Instant::now();
    let p = Profile::new(15 * MINUTE, t0);
    p.record(t0, &ok("alice", 12, 30, 100, 200));
    let v = serde_json::to_value(p.report(t0)).expect("serializable");
    let a = &v["tenants"][0];
    assert_eq!(a["name"], "alice");
    assert_eq!(a["requests"], 1);
    assert_eq!(a["since_start"]["requests"], 1);
    assert_eq!(a["output_reserved_ratio"], 0.3);
    assert!(a["prompt_tokens"]["p95"].is_f64());
    assert!(v["overall"]["window"]["ttft_ms"]["p50"].is_f64());
    let back: ProfileReport = serde_json::from_value(v).expect("reads back");
    assert_eq!(back, p.report(t0));
}

#[test]
fn a_window_outside_its_bounds_is_refused() {
    let bad = ProfileConfig {
        window: Duration::from_secs(14),
    };
    assert_eq!(
        bad.check().unwrap_err().to_string(),
        "profile.window is 14s; it must be from 15s to 24h"
    );
    assert!(ProfileConfig::default().check().is_ok());
}

#[test]
fn the_table_shows_each_tenant_and_all() {
    let t0 = Instant::now();
    let p = Profile::new(15 * MINUTE, t0);
    p.record(t0, &ok("alice", 12, 30, 100, 200));
    p.record(t0, &refused("alice", ErrorCode::RateLimitExceeded));
    let text = cli::render(&p.report(t0), false);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "workload profile, last 15m (quantiles within 1%)");
    assert!(lines[1].starts_with("tenant  requests  ok  refused  prompt p50/p95/p99"));
    assert!(
        lines[2].starts_with("alice   2         1   1        12 / 12 / 12"),
        "{}",
        lines[2]
    );
    assert!(lines[3].starts_with("(all)   2         1   1"));
    assert_eq!(lines[4], "refused alice: rate_limit_exceeded 1");
}

/// The window's overall profile after `n` answered requests of `prompt` + `output` tokens.
fn observed(n: u64, prompt: u64, output: u64) -> Stats {
    let t0 = Instant::now();
    let p = Profile::new(15 * MINUTE, t0);
    for _ in 0..n {
        p.record(t0, &ok("alice", prompt, output, 800, 100));
    }
    p.report(t0).overall.window
}

fn config(backend: &str) -> crate::config::ValidConfig {
    crate::config::Config::parse(&format!(
        r#"
[tokenizer]
path = "unused"
[model]
served_names = ["qwen3.5-27b"]
max_model_len = 32768
default_max_tokens = 800
[[backends]]
url = "http://127.0.0.1:9"
{backend}
[[tenants]]
name = "alice"
api_keys = ["sk-alice"]
prefill_tokens_per_second = 1000
decode_tokens_per_second = 100
requests_per_second = 1
"#
    ))
    .expect("valid")
}

#[test]
fn advice_reruns_the_capacity_model_on_the_observed_lengths() {
    // 910B3 x2, the declared RAG workload 3000 + 800: memory 172, TPOT 45 (see capacity).
    let cfg = config("hardware = \"910b3\"\nmodel = \"qwen3.5-27b\"\ntp = 2");
    let a = advice::advise(&cfg, &observed(20, 3000, 212));
    assert_eq!(a.answered, 20);
    assert_eq!(a.observed_avg_output_tokens, Some(212.0));
    let b = &a.backends[0];
    assert_eq!(
        (
            b.configured.kv_safe_batch,
            b.configured.tpot_slo_batch,
            b.configured.max_batch
        ),
        (172, Some(45), 45)
    );
    // 3000 + 212 tokens pin 26 blocks of 128 x 65,536 B + 153,944,064 B of state =
    // 372,047,872 B: 70e9 / that = 188 in memory.
    assert_eq!(b.implied.kv_safe_batch, 188);
    assert_eq!(
        (b.implied.avg_input_tokens, b.implied.avg_output_tokens),
        (3000, 212)
    );
    let tpot = b.implied.tpot_slo_batch.expect("capacity model");
    assert_eq!(b.implied.max_batch, tpot.min(188));
    assert!(
        tpot > 45,
        "shorter contexts leave room for more sequences per step: {tpot}"
    );
    // Only the output length is off by more than 20%; its flag says what it does to the cap.
    assert_eq!(b.flags.len(), 1);
    let f = &b.flags[0];
    assert_eq!(
        (f.field.as_str(), f.configured, f.implied),
        ("workload.avg_output_tokens", 800.0, 212.0)
    );
    let ratio = b.implied.max_batch as f64 / 45.0;
    // The mean is exact; the percentiles come from the log-bucketed histogram, whose bucket
    // holding 212 reads 211 (within its 1%).
    assert_eq!(
        f.message,
        format!(
            "configured workload.avg_output_tokens 800, observed mean 212 (P50 211, P95 211): the batch cap the observed lengths imply is {} (configured 45: {ratio:.1}x too low)",
            b.implied.max_batch
        )
    );
}

#[test]
fn a_hand_sized_backend_gets_its_kv_batch_checked() {
    let cfg = config("kv_capacity_bytes = 8000000000\nmax_batch = 32");
    let a = advice::advise(&cfg, &observed(25, 212, 150));
    let b = &a.backends[0];
    // 3000 + 800 declared: 30 blocks x 128 x 65,536 + 153,944,064 = 405,602,304 B -> 19.
    assert_eq!(b.configured.kv_safe_batch, 19);
    // 212 + 150 observed: 3 blocks -> 179,109,888 B -> 44.
    assert_eq!((b.implied.kv_safe_batch, b.implied.max_batch), (44, 44));
    assert_eq!(b.implied.tpot_slo_batch, None);
    let fields: Vec<&str> = b.flags.iter().map(|f| f.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "workload.avg_input_tokens",
            "workload.avg_output_tokens",
            "backends[0].max_batch"
        ]
    );
    assert_eq!(
        b.flags[2].message,
        "backends[0].max_batch is 32; the observed lengths (212 + 150 tokens) imply 44: 1.4x too low"
    );
}

#[test]
fn advice_waits_for_enough_answers() {
    let cfg = config("kv_capacity_bytes = 8000000000\nmax_batch = 32");
    let a = advice::advise(&cfg, &observed(19, 212, 150));
    assert!(a.backends.is_empty());
    assert_eq!(
        a.note.as_deref(),
        Some("19 answered requests in the window; advice needs at least 20")
    );
    let a = advice::advise(&cfg, &Stats::default());
    assert_eq!(
        a.note.as_deref(),
        Some("no answered request in the window yet")
    );
}
