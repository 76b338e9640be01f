use super::*;
use crate::capacity::{ProfileOverrides, StateDtype};

/// Qwen3.5-27B on two 910B3s (TP2), the fitted efficiency, one replica.
fn tp2() -> CapacityInputs {
    let mut m = CapacityInputs::from_names(
        "910b3",
        "qwen3.5-27b",
        StateDtype::Fp32,
        &ProfileOverrides::default(),
    )
    .expect("built-in profiles");
    m.tp = 2;
    m
}

fn backend(max_batch: u64, reading: Option<BackendReading>) -> BackendInputs {
    BackendInputs {
        index: 0,
        name: "http://npu0".into(),
        max_batch,
        model: Some(tp2()),
        reading,
    }
}

/// A RAG-like workload (prompt P50 3,000, P95 4,000, P99 6,000; output 800 / 1,000) with
/// latency within target and no refusals.
fn healthy() -> Inputs {
    Inputs {
        slo: Slo::default(),
        requests: 1000,
        refusals: BTreeMap::new(),
        prompt: Lengths {
            p50: 3000.0,
            p95: 4000.0,
            p99: 6000.0,
        },
        output: Lengths {
            p50: 800.0,
            p95: 1000.0,
            p99: 1200.0,
        },
        ttft_p95_ms: Some(500.0),
        tpot_p95_ms: Some(40.0),
        queue_wait_p95_ms: Some(0.0),
        backends: vec![backend(40, None)],
    }
}

fn reading(waiting: u64, running: u64, preemptions: u64, usage: f64) -> BackendReading {
    BackendReading {
        waiting: Some(waiting),
        running: Some(running),
        preemptions_total: Some(preemptions),
        kv_usage: Some(usage),
        ..BackendReading::default()
    }
}

fn one(i: &Inputs) -> Finding {
    let mut f = diagnose(i);
    assert_eq!(f.len(), 1, "{f:#?}");
    f.remove(0)
}

fn change(field: &str, from: Option<f64>, to: f64, formula: &str) -> Option<Change> {
    Some(Change {
        field: field.into(),
        from,
        to,
        formula: formula.into(),
    })
}

#[test]
fn within_target_nothing_is_found() {
    assert_eq!(diagnose(&healthy()), []);
}

#[test]
fn ttft_high_with_the_engine_queueing_lowers_max_batch_to_what_it_runs() {
    let mut i = healthy();
    i.ttft_p95_ms = Some(2000.0);
    i.backends = vec![backend(40, Some(reading(6, 24, 0, 0.8)))];
    let f = one(&i);
    assert_eq!(
        (f.symptom.as_str(), f.cause.as_str()),
        ("ttft_high", "queueing")
    );
    assert_eq!(
        f.change,
        change(
            "backends[0].max_batch",
            Some(40.0),
            24.0,
            "the engine's num_requests_running while it queues"
        )
    );
    assert_eq!(
        f.evidence,
        [
            "TTFT P95 2000.0 ms > target 800.0 ms",
            "gateway KV-queue wait P95 0.0 ms (0% of TTFT; queueing when >= 50%)",
            "http://npu0: 6 requests waiting in the engine beside 24 running",
        ]
    );
}

#[test]
fn ttft_high_with_the_gateway_queue_full_sizes_the_tenants_decode_rate() {
    let mut i = healthy();
    i.ttft_p95_ms = Some(2000.0);
    i.queue_wait_p95_ms = Some(1500.0);
    let f = one(&i);
    assert_eq!(f.cause, "queueing");
    let c = f.change.expect("a change");
    assert_eq!(c.field, "tenants[].decode_tokens_per_second (sum)");
    assert_eq!(c.to, DECODE_TPS_3000_800);
}

#[test]
fn ttft_high_with_a_long_prompt_tail_caps_prompts() {
    let mut i = healthy();
    i.ttft_p95_ms = Some(2000.0);
    i.prompt = Lengths {
        p50: 1000.0,
        p95: 8000.0,
        p99: 16000.0,
    };
    let f = one(&i);
    assert_eq!(f.cause, "long_prefill_stall");
    assert_eq!(
        f.change,
        change(
            "longest prompt admitted, tokens",
            Some(16000.0),
            PROMPT_CAP_200MS as f64,
            "largest L with 2 P L / (F e) <= 25% x TTFT target"
        )
    );
}

#[test]
fn ttft_high_without_queue_or_tail_is_prefill_bound_and_scales_out() {
    let mut i = healthy();
    i.ttft_p95_ms = Some(2000.0);
    let f = one(&i);
    assert_eq!(f.cause, "prefill_bound");
    assert_eq!(
        f.change,
        change(
            "backends[0].replicas",
            Some(1.0),
            3.0,
            "ceil(replicas x TTFT P95 / TTFT target)"
        )
    );
}

#[test]
fn tpot_high_with_preemptions_lowers_max_batch_to_the_kv_safe_batch() {
    let mut i = healthy();
    i.tpot_p95_ms = Some(90.0);
    i.backends = vec![backend(200, Some(reading(0, 60, 12, 0.99)))];
    let f = one(&i);
    assert_eq!(
        (f.symptom.as_str(), f.cause.as_str()),
        ("tpot_high", "kv_pressure")
    );
    assert_eq!(
        f.change,
        change(
            "backends[0].max_batch",
            Some(200.0),
            KV_SAFE_4000_1000 as f64,
            "replicas x floor(KV budget / footprint(prompt P95 + output P95))"
        )
    );
}

#[test]
fn tpot_high_with_a_batch_over_the_slo_batch_lowers_it() {
    let mut i = healthy();
    i.tpot_p95_ms = Some(90.0);
    i.backends = vec![backend(200, Some(reading(0, 60, 0, 0.5)))];
    let f = one(&i);
    assert_eq!(f.cause, "batch_too_large");
    assert_eq!(
        f.change.map(|c| (c.field, c.from, c.to)),
        Some((
            "backends[0].max_batch".to_string(),
            Some(200.0),
            SLA_3000_800 as f64
        ))
    );
}

#[test]
fn tpot_high_at_a_fine_median_batch_is_long_context_decode() {
    let mut i = healthy();
    i.tpot_p95_ms = Some(90.0);
    i.prompt.p95 = 30000.0;
    i.output.p95 = 4000.0;
    i.backends = vec![backend(SLA_3000_800, None)];
    let f = one(&i);
    assert_eq!(f.cause, "long_context_decode");
    assert_eq!(
        f.change.map(|c| (c.from, c.to)),
        Some((Some(SLA_3000_800 as f64), SLA_32000_4000 as f64))
    );
}

/// Qwen3.5-27B on one 910B3 (the quickstart's deployment): one sequence alone takes over 75 ms
/// a decode step, whatever the batch.
fn tp1() -> CapacityInputs {
    CapacityInputs { tp: 1, ..tp2() }
}

#[test]
fn tpot_high_where_one_sequence_alone_misses_the_target_names_what_would() {
    let mut i = healthy();
    i.tpot_p95_ms = Some(90.0);
    i.backends = vec![BackendInputs {
        model: Some(tp1()),
        ..backend(32, None)
    }];
    assert_eq!(
        one(&i),
        Finding {
            symptom: "tpot_high".into(),
            cause: "target_unreachable".into(),
            advice: "no backends[0].max_batch of this deployment meets the TPOT target at the \
                     P50 context (3000 + 800/2 tokens): one sequence takes 76.46 ms a step, over \
                     the 50 ms TPOT SLO; it fits with tpot_slo_ms = 100 (safe batch 19, bound: \
                     memory capacity (KV + state)) or tp = 2 (safe batch 45, bound: HBM \
                     bandwidth (TPOT SLO))"
                .into(),
            evidence: vec![
                "TPOT P95 90.0 ms > target 50.0 ms".into(),
                "no preemptions and no full KV cache reported".into(),
                "largest batch meeting 50.0 ms at the P50 context (3000 + 800/2 tokens): 0; \
                 backends[0].max_batch is 32"
                    .into(),
            ],
            change: change(
                "backends[0].tp",
                Some(1.0),
                2.0,
                "fewest cards per replica (a power of two up to 8) with a batch meeting the \
                 TPOT target at the P50 context"
            ),
        }
    );
}

#[test]
fn tpot_high_where_one_long_sequence_misses_the_target_on_any_cards_says_so() {
    // Fine at the median context on two cards; at the P95 one, one sequence alone takes 108 ms
    // a step, and no tensor-parallel degree up to 8 brings it to 50 ms: no change is proposed,
    // the SLO the deployment holds is named.
    let mut i = healthy();
    i.tpot_p95_ms = Some(120.0);
    i.prompt.p95 = 200_000.0;
    i.output.p95 = 20_000.0;
    i.backends = vec![backend(SLA_3000_800, None)];
    let f = one(&i);
    assert_eq!(
        (f.cause.as_str(), f.advice.as_str(), f.change),
        (
            "target_unreachable",
            "no backends[0].max_batch of this deployment meets the TPOT target at the P95 \
             context (200000 + 20000/2 tokens): one sequence takes 108.16 ms a step, over the \
             50 ms TPOT SLO; it fits with tpot_slo_ms = 150 (safe batch 4, bound: memory \
             capacity (KV + state)) (no tp up to 8 holds 50 ms)",
            None
        )
    );
}

#[test]
fn tpot_high_on_a_backend_sized_by_hand_scales_the_batch_and_says_what_it_assumes() {
    // The quickstart's backend before it named its hardware: 32 sequences, TPOT 75 ms.
    let mut i = healthy();
    i.tpot_p95_ms = Some(75.0);
    i.backends = vec![BackendInputs {
        model: None,
        ..backend(32, None)
    }];
    let f = one(&i);
    assert_eq!(
        (f.cause.as_str(), f.advice.as_str(), f.change),
        (
            "batch_too_large",
            "decode steps are too slow for the target: lower max_batch from 32 to 21 (no \
             capacity model: scaled by target / observed, as if a step took time in proportion \
             to the batch; one sequence alone may already miss the target: give the backend its \
             hardware and model so the tree can tell)",
            change(
                "backends[0].max_batch",
                Some(32.0),
                21.0,
                "floor(max_batch x TPOT target / TPOT P95)"
            )
        )
    );
}

#[test]
fn refusals_with_fine_latency_raise_the_limits_to_the_hardware() {
    let mut i = healthy();
    i.refusals = BTreeMap::from([("rate_limit_exceeded".to_string(), 200)]);
    let f = one(&i);
    assert_eq!(
        (f.symptom.as_str(), f.cause.as_str()),
        ("refusals_high", "limits_too_tight")
    );
    assert_eq!(
        f.change.map(|c| (c.field, c.to)),
        Some((
            "tenants[].decode_tokens_per_second (sum)".to_string(),
            DECODE_TPS_3000_800
        ))
    );
    // A KV queue that refuses (503) while the cards have room: the batch cap is the limit.
    let mut i = healthy();
    i.backends = vec![backend(10, None)];
    i.refusals = BTreeMap::from([("capacity_exhausted".to_string(), 100)]);
    let f = one(&i);
    assert_eq!(
        f.change.map(|c| (c.field, c.from, c.to)),
        Some((
            "backends[0].max_batch".to_string(),
            Some(10.0),
            SAFE_3000_800 as f64
        ))
    );
    // Under 5% refused is not high.
    let mut i = healthy();
    i.refusals = BTreeMap::from([("rate_limit_exceeded".to_string(), 49)]);
    assert_eq!(diagnose(&i), []);
}

#[test]
fn the_formulas_behind_the_expected_values() {
    let m = tp2();
    let (input, output) = (3000, 800);
    let r = m.report(input, output, None, None);
    assert_eq!(r.sustained_decode_tps.floor(), DECODE_TPS_3000_800);
    assert_eq!(r.safe_batch, SAFE_3000_800);
    assert_eq!(m.max_batch_sla(3400.0), SLA_3000_800);
    assert_eq!(m.max_batch_sla(32000.0), SLA_32000_4000);
    assert_eq!(m.max_batch_memory(4000, 1000), KV_SAFE_4000_1000);
    assert_eq!(m.max_input_for_ttft(0.2), PROMPT_CAP_200MS);
}

// The capacity model's figures for Qwen3.5-27B on two 910B3s at the fitted efficiency (checked
// against the formulas above; docs/capacity.md derives the same ones by hand).
const DECODE_TPS_3000_800: f64 = 492.0;
const SAFE_3000_800: u64 = 45;
const SLA_3000_800: u64 = 45;
const SLA_32000_4000: u64 = 10;
const KV_SAFE_4000_1000: u64 = 143;
const PROMPT_CAP_200MS: u64 = 811;
