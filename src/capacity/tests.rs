//! Pinned roofline, derivation and table figures (expected values computed independently from
//! DOMAIN.md's formulas), and property tests of the model's monotonicity.

use super::*;
use proptest::prelude::*;

fn qwen(block: u64, dtype: StateDtype) -> CapacityInputs {
    let mut inputs =
        CapacityInputs::from_names("910b3", "qwen3.5-27b", dtype, &ProfileOverrides::default())
            .unwrap();
    inputs.block_tokens = block;
    inputs
}

fn f6(x: f64) -> String {
    format!("{x:.6}")
}

const TABLE: [(u64, u64); 4] = [(200, 150), (3000, 800), (1500, 300), (6000, 1200)];

#[test]
fn budget_is_hbm_minus_weights_minus_reserve() {
    let inputs = qwen(128, StateDtype::Fp32);
    assert_eq!(inputs.kv_budget_bytes(), 8_000_000_000);
    let mut gib = inputs.clone();
    gib.hardware.hbm_bytes = 64 << 30;
    assert_eq!(gib.kv_budget_bytes(), 12_719_476_736);
}

#[test]
fn footprint_rounds_kv_to_blocks_and_adds_state() {
    assert_eq!(
        sequence_footprint_bytes(350, 1, 65_536, 153_944_064),
        176_881_664
    );
    assert_eq!(
        sequence_footprint_bytes(350, 0, 65_536, 153_944_064),
        176_881_664
    );
    assert_eq!(
        sequence_footprint_bytes(350, 128, 65_536, 153_944_064),
        179_109_888
    );
    assert_eq!(
        sequence_footprint_bytes(3800, 128, 65_536, 153_944_064),
        405_602_304
    );
    assert_eq!(sequence_footprint_bytes(256, 128, 65_536, 0), 16_777_216);
    assert_eq!(sequence_footprint_bytes(0, 128, 65_536, 7), 7);
}

#[test]
fn domain_table_memory_ceilings_and_tpot() {
    let unblocked = qwen(1, StateDtype::Fp32);
    let blocked = qwen(128, StateDtype::Fp32);
    let got = |inputs: &CapacityInputs| -> Vec<(u64, u64, String)> {
        TABLE
            .iter()
            .map(|&(i, o)| {
                let r = inputs.report(i, o, None, None);
                assert_eq!(r.bottleneck, Bottleneck::MemoryCapacity);
                assert_eq!(r.batch, r.safe_batch);
                assert_eq!(r.step_ms, r.tpot_ms);
                (r.max_batch_memory, r.safe_batch, f6(r.tpot_ms))
            })
            .collect()
    };
    let owned = |v: [(u64, u64, &str); 4]| -> Vec<(u64, u64, String)> {
        v.iter().map(|&(m, s, t)| (m, s, t.to_string())).collect()
    };
    assert_eq!(
        got(&unblocked),
        owned([
            (45, 45, "32.493943"),
            (19, 19, "32.188717"),
            (29, 29, "32.421198"),
            (12, 12, "32.125147"),
        ])
    );
    assert_eq!(
        got(&blocked),
        owned([
            (44, 44, "32.403434"),
            (19, 19, "32.188717"),
            (28, 28, "32.283262"),
            (12, 12, "32.125147"),
        ])
    );
    let sla: Vec<u64> = TABLE
        .iter()
        .map(|&(i, o)| blocked.max_batch_sla(mean_context_tokens(i, o)))
        .collect();
    assert_eq!(sla, vec![238, 108, 156, 69]);
}

#[test]
fn kv_only_and_bf16_state_ceilings() {
    let mut kv_only = qwen(1, StateDtype::Fp32);
    kv_only.model.state_bytes_per_sequence = 0;
    let bf16 = qwen(128, StateDtype::Bf16);
    let ceilings = |inputs: &CapacityInputs| -> Vec<u64> {
        TABLE
            .iter()
            .map(|&(i, o)| inputs.max_batch_memory(i, o))
            .collect()
    };
    assert_eq!(ceilings(&kv_only), vec![348, 32, 67, 16]);
    assert_eq!(ceilings(&bf16), vec![77, 24, 39, 14]);
}

#[test]
fn full_report_for_rag() {
    let r = qwen(128, StateDtype::Fp32).report(3000, 800, None, Some(1.0));
    assert_eq!(r.kv_bytes_per_token, 65_536);
    assert_eq!(r.state_bytes_per_sequence, 153_944_064);
    assert_eq!(r.kv_budget_bytes, 8_000_000_000);
    assert_eq!(r.footprint_bytes_per_sequence, 405_602_304);
    assert_eq!(
        (r.max_batch_memory, r.max_batch_sla, r.safe_batch),
        (19, 108, 19)
    );
    assert_eq!(r.step_bound, StepBound::Bandwidth);
    assert_eq!(f6(r.weight_read_ms), "28.421053");
    assert_eq!(f6(r.ttft_ms), "506.250000");
    assert_eq!(f6(r.decode_tps), "265.621023");
    assert_eq!(f6(r.prefill_tps), "2666.666667");
    assert_eq!(f6(r.qps), "0.241732");
    assert_eq!(f6(r.sustained_decode_tps), "193.385734");
    assert_eq!(f6(r.sustained_prefill_tps), "725.196502");
    assert_eq!(r.ttft_within_slo, Some(true));
    // 1 s of prefill at 320 TFLOPS / (2 x 27e9) = 5925.9 tokens
    assert_eq!(r.max_input_ttft_slo, Some(5925));
}

#[test]
fn efficiency_scales_throughput_never_latency() {
    let base = qwen(128, StateDtype::Fp32);
    let mut half = base.clone();
    half.efficiency = base.efficiency / 2.0;
    let (a, b) = (
        base.report(200, 150, None, None),
        half.report(200, 150, None, None),
    );
    assert_eq!(
        (a.tpot_ms, a.ttft_ms, a.safe_batch),
        (b.tpot_ms, b.ttft_ms, b.safe_batch)
    );
    assert_eq!(f6(a.decode_tps / 2.0), f6(b.decode_tps));
    assert_eq!(f6(a.prefill_tps / 2.0), f6(b.prefill_tps));
    assert_eq!(f6(a.qps / 2.0), f6(b.qps));
}

#[test]
fn sla_and_engine_caps_bind_when_memory_does_not() {
    let mut inputs = qwen(128, StateDtype::Fp32);
    inputs.tpot_slo_seconds = 0.030;
    let s = inputs.safe_batch(200, 150);
    // (30 ms - 28.42 ms weight read) / 0.0905 ms per chat sequence = 17.4
    assert_eq!((s.memory, s.sla, s.batch), (44, 17, 17));
    assert_eq!(s.bottleneck, Bottleneck::Bandwidth);
    assert_eq!(inputs.bottleneck(200, 150), Bottleneck::Bandwidth);
    inputs.engine_max_batch = Some(8);
    let s = inputs.safe_batch(200, 150);
    assert_eq!((s.batch, s.bottleneck), (8, Bottleneck::EngineMaxBatch));
    assert_eq!(inputs.bottleneck(200, 150), Bottleneck::EngineMaxBatch);
    // below the weight-read floor no batch meets the target
    inputs.tpot_slo_seconds = 0.028;
    assert_eq!(inputs.safe_batch(200, 150).sla, 0);
}

#[test]
fn compute_binds_on_a_bandwidth_rich_card() {
    let mut inputs = qwen(128, StateDtype::Fp32);
    inputs.hardware.bandwidth_bytes_per_s = 100e12;
    inputs.hardware.hbm_bytes = 1_000_000_000_000;
    let s = inputs.safe_batch(200, 150);
    // 2 x 27e9 x B / 320e12 <= 50 ms  =>  B <= 296.3
    assert_eq!(
        (s.sla, s.batch, s.bottleneck),
        (296, 296, Bottleneck::Compute)
    );
}

#[test]
fn heterogeneous_step_matches_uniform_one() {
    let inputs = qwen(128, StateDtype::Fp32);
    // 3 sequences of 100, 200 and 300 cached tokens = 3 of 200
    assert_eq!(
        inputs.decode_step_seconds_resident(3, 600),
        inputs.decode_step_seconds(3, 200.0)
    );
    assert_eq!(
        f6(inputs.decode_step_seconds_resident(0, 0) * 1e3),
        "28.421053"
    );
    // a 2048-token prefill chunk in the pass: 2 x 27e9 x 2051 / 320e12 = 346.1 ms of compute
    assert_eq!(
        f6(inputs.mixed_pass_seconds(3, 600, 2048) * 1e3),
        "346.106250"
    );
    assert_eq!(
        inputs.mixed_pass_seconds(3, 600, 0),
        inputs.decode_step_seconds_resident(3, 600)
    );
}

#[test]
fn tensor_parallel_splits_weights_and_time() {
    let mut inputs = CapacityInputs::from_names(
        "910b3",
        "qwen3-32b",
        StateDtype::Fp32,
        &ProfileOverrides::default(),
    )
    .unwrap();
    // 65.6 GB of weights do not fit one 64 GB card
    assert_eq!(inputs.kv_budget_bytes(), 0);
    assert_eq!(inputs.safe_batch(3000, 800).batch, 0);
    assert_eq!(inputs.report(3000, 800, None, None).qps, 0.0);
    inputs.tp = 2;
    let r = inputs.report(3000, 800, None, None);
    assert_eq!(r.kv_budget_bytes, 58_400_000_000);
    assert_eq!(r.footprint_bytes_per_sequence, 1_006_632_960);
    assert_eq!(
        (r.max_batch_memory, r.max_batch_sla, r.safe_batch),
        (58, 139, 58)
    );
    assert_eq!(f6(r.tpot_ms), "30.867052");
    assert_eq!(f6(r.sustained_decode_tps), "490.963250");
}

#[test]
fn calibration_reports_the_gap_and_keeps_the_coefficient() {
    let inputs = qwen(128, StateDtype::Fp32);
    let c = inputs.calibrate(0.040, 19, 3000, 800);
    assert_eq!(f6(c.predicted_tpot_ms), "32.188717");
    assert_eq!(f6(c.observed_over_predicted), "1.242671");
    assert_eq!(format!("{:.4}", c.gap_percent), "24.2671");
    assert_eq!(c.predicted_bound, StepBound::Bandwidth);
    assert_eq!(f6(c.implied_bandwidth_efficiency), "0.804718");
    assert_eq!(
        format!("{:.0}", c.implied_bandwidth_bytes_per_s / 1e6),
        "1528964"
    );
    assert_eq!(f6(c.implied_compute_efficiency), "0.080156");
    assert_eq!(c.efficiency_coefficient, inputs.efficiency);
}

#[test]
fn validation_names_the_field() {
    let mut inputs = qwen(128, StateDtype::Fp32);
    inputs.tp = 0;
    assert_eq!(
        inputs.validate().unwrap_err().to_string(),
        "invalid tp: must be >= 1"
    );
    let mut inputs = qwen(128, StateDtype::Fp32);
    inputs.efficiency = 1.5;
    assert_eq!(
        inputs.validate().unwrap_err().to_string(),
        "invalid efficiency: must be in (0, 1], got 1.5"
    );
    let mut inputs = qwen(128, StateDtype::Fp32);
    inputs.hardware.bandwidth_bytes_per_s = 0.0;
    assert_eq!(
        inputs.validate().unwrap_err().to_string(),
        "invalid bandwidth_bytes_per_s: must be > 0, got 0"
    );
    assert_eq!(qwen(128, StateDtype::Fp32).validate(), Ok(()));
}

#[test]
fn overrides_mirror_the_seed_arguments() {
    let overrides = ProfileOverrides {
        tflops: Some(313.0),
        bandwidth_gbs: Some(1600.0),
        hbm_gb: Some(64.0),
        params_b: Some(26.9),
        ..ProfileOverrides::default()
    };
    let inputs =
        CapacityInputs::from_names("910B3", "qwen3.5-27b", StateDtype::Fp32, &overrides).unwrap();
    assert_eq!(inputs.hardware.peak_flops, 313e12);
    assert_eq!(inputs.hardware.bandwidth_bytes_per_s, 1.6e12);
    assert_eq!(inputs.model.weight_bytes, 53_800_000_000);
    assert!(inputs.model.arch.is_some());
    let by_hand = ProfileOverrides {
        kv_bytes_per_token: Some(1000),
        weights_gb: Some(50.0),
        ..overrides
    };
    let inputs =
        CapacityInputs::from_names("910b3", "qwen3.5-27b", StateDtype::Fp32, &by_hand).unwrap();
    assert_eq!(inputs.model.kv_bytes_per_token, 1000);
    assert_eq!(inputs.model.weight_bytes, 50_000_000_000);
    assert_eq!(inputs.model.arch, None);
}

#[test]
fn derived_backend_for_the_rag_workload() {
    let mut inputs = qwen(128, StateDtype::Fp32);
    let one = derive_backend(&inputs, Workload::default());
    assert_eq!(one.kv_capacity_bytes, 8_000_000_000);
    assert_eq!(one.max_batch, 19);
    assert_eq!(
        (
            one.kv_bytes_per_token,
            one.state_bytes_per_sequence,
            one.block_tokens
        ),
        (65_536, 153_944_064, 128)
    );
    assert_eq!(f6(one.decode_tps), "193.385734");
    assert_eq!(f6(one.prefill_tps), "725.196502");
    assert_eq!(
        one.explanation,
        "910b3 x1 (TP) per replica, qwen3.5-27b: cache budget 1 x 64000000000 B HBM - \
         54000000000 B weights - 1 x 2000000000 B reserve = 8000000000 B; a 3000+800-token \
         request pins 30 x 128 tokens x 65536 B KV + 153944064 B state = 405602304 B; ceilings: \
         memory 19, TPOT 50 ms 108; safe batch 19 (memory capacity (KV + state)), step 32.2 ms; \
         at efficiency 0.45: 0.242 req/s = 725 prefill + 193 decode tokens/s per replica; \
         x1 replica(s): kv_capacity_bytes 8000000000, max_batch 19, prefill 725 + decode 193 \
         tokens/s"
    );
    inputs.replicas = 2;
    let two = derive_backend(&inputs, Workload::default());
    assert_eq!((two.kv_capacity_bytes, two.max_batch), (16_000_000_000, 38));
    assert_eq!(f6(two.decode_tps), f6(2.0 * one.decode_tps));
    assert_eq!(two.per_replica, one.per_replica);
    let json = serde_json::to_value(&two).unwrap();
    assert_eq!(json["kv_capacity_bytes"], 16_000_000_000u64);
    assert_eq!(
        json["workload"],
        serde_json::json!({"avg_input": 3000, "avg_output": 800})
    );
    assert_eq!(json["per_replica"]["bottleneck"], "memory_capacity");
}

#[test]
fn derived_table_lists_each_backend() {
    let mut inputs = qwen(128, StateDtype::Fp32);
    inputs.replicas = 2;
    let b = derive_backend(&inputs, Workload::default());
    assert_eq!(
        derived_table(&[("npu-a", &b)]),
        "backend             kv_capacity_B max_batch prefill_t/s  decode_t/s  derived from\n\
         npu-a                 16000000000        38      1450.4       386.8  910b3 x1 TP x2 \
         replicas, qwen3.5-27b, 3000/800 tokens, safe batch 19 per replica (memory capacity \
         (KV + state))\n"
    );
}

#[test]
fn tenant_rates_are_a_share_of_the_summed_rates() {
    let inputs = qwen(128, StateDtype::Fp32);
    let chat = derive_backend(
        &inputs,
        Workload {
            avg_input: 200,
            avg_output: 150,
        },
    );
    let rag = derive_backend(&inputs, Workload::default());
    let (prefill, decode) = tenant_rates(0.3, &[chat.clone(), rag.clone()]);
    assert_eq!(f6(prefill), f6(0.3 * (chat.prefill_tps + rag.prefill_tps)));
    assert_eq!(f6(decode), f6(0.3 * (chat.decode_tps + rag.decode_tps)));
    // 0.3 x (624.062814 + 725.196502), 0.3 x (468.047110 + 193.385734)
    assert_eq!(format!("{prefill:.4}"), "404.7778");
    assert_eq!(format!("{decode:.4}"), "198.4299");
    assert_eq!(tenant_rates(0.5, &[]), (0.0, 0.0));
}

#[test]
fn scenario_table_puts_article_seed_and_roofline_side_by_side() {
    let inputs = qwen(128, StateDtype::Fp32);
    let rows = scenario_table(&inputs, &SeedInputs::default()).unwrap();
    let got: Vec<(&str, u64, u64, u64, Bottleneck)> = rows
        .iter()
        .map(|r| {
            (
                r.scenario.name,
                r.scenario.article_safe_batch,
                r.seed_safe_batch,
                r.roofline_safe_batch,
                r.roofline_bottleneck,
            )
        })
        .collect();
    use Bottleneck::MemoryCapacity as M;
    assert_eq!(
        got,
        vec![
            ("chat", 48, 813, 44, M),
            ("rag", 6, 152, 19, M),
            ("code", 18, 406, 28, M),
            ("summary", 4, 101, 12, M),
        ]
    );
    assert_eq!(
        rows[1].why,
        "seed counts only 800 output tokens x 65536 B = 52.4 MB per sequence and its TPS grows \
         with batch squared; the roofline pins 3000+800 tokens in 128-token blocks x 65536 B + \
         153.9 MB state = 405.6 MB of 8.00 GB, and every step reads all weights and resident \
         cache; the article's 6 matches neither"
    );
    // the article's own chain (QPS of the script run at its memory ceiling), checked in Python
    let seed_qps: Vec<f64> = rows.iter().map(|r| r.seed_qps).collect();
    assert_eq!(seed_qps, vec![69700.18, 457.18, 8695.39, 134.58]);
    let unblocked = scenario_table(&qwen(1, StateDtype::Fp32), &SeedInputs::default()).unwrap();
    let mem: Vec<u64> = unblocked
        .iter()
        .map(|r| r.roofline_max_batch_memory)
        .collect();
    assert_eq!(mem, vec![45, 19, 29, 12]);
}

fn arb_inputs() -> impl Strategy<Value = CapacityInputs> {
    (
        prop::sample::select(vec!["910b1", "910b3", "910b4", "atlas-300i-duo"]),
        prop::sample::select(vec!["qwen3.5-27b", "qwen3-32b", "qwen3-8b"]),
        prop::sample::select(vec![StateDtype::Fp32, StateDtype::Bf16]),
        1u32..=8,
        prop::sample::select(vec![0u64, 1, 16, 128]),
        0.05f64..1.0,
        10.0f64..200.0,
    )
        .prop_map(|(hw, model, dtype, tp, block, efficiency, slo_ms)| {
            let mut inputs =
                CapacityInputs::from_names(hw, model, dtype, &ProfileOverrides::default()).unwrap();
            inputs.tp = tp;
            inputs.block_tokens = block;
            inputs.efficiency = efficiency;
            inputs.tpot_slo_seconds = slo_ms / 1e3;
            inputs
        })
}

proptest! {
    #[test]
    fn more_hbm_never_lowers_the_ceilings(
        inputs in arb_inputs(),
        extra in 0u64..200_000_000_000,
        input in 1u64..40_000,
        output in 1u64..8_000,
    ) {
        let mut bigger = inputs.clone();
        bigger.hardware.hbm_bytes += extra;
        prop_assert!(bigger.max_batch_memory(input, output) >= inputs.max_batch_memory(input, output));
        prop_assert!(bigger.safe_batch(input, output).batch >= inputs.safe_batch(input, output).batch);
    }

    #[test]
    fn longer_requests_never_raise_the_ceilings(
        inputs in arb_inputs(),
        input in 1u64..40_000,
        output in 1u64..8_000,
        more_in in 0u64..10_000,
        more_out in 0u64..4_000,
    ) {
        let (a, b) = (inputs.safe_batch(input, output), inputs.safe_batch(input + more_in, output + more_out));
        prop_assert!(b.memory <= a.memory);
        prop_assert!(b.sla <= a.sla);
        prop_assert!(b.batch <= a.batch);
    }

    #[test]
    fn tpot_grows_with_batch(inputs in arb_inputs(), batch in 0u64..4_096, ctx in 1.0f64..100_000.0) {
        prop_assert!(inputs.decode_step_seconds(batch + 1, ctx) > inputs.decode_step_seconds(batch, ctx));
    }

    #[test]
    fn the_sla_ceiling_is_exactly_the_last_batch_meeting_the_target(
        inputs in arb_inputs(),
        input in 1u64..40_000,
        output in 1u64..8_000,
    ) {
        let ctx = mean_context_tokens(input, output);
        let b = inputs.max_batch_sla(ctx);
        let slo = inputs.tpot_slo_seconds;
        prop_assert!(inputs.decode_step_seconds(b + 1, ctx) > slo);
        prop_assert!(b == 0 || inputs.decode_step_seconds(b, ctx) <= slo);
    }

    #[test]
    fn block_one_is_the_unblocked_figure(
        inputs in arb_inputs(),
        input in 0u64..40_000,
        output in 0u64..8_000,
    ) {
        let mut exact = inputs.clone();
        exact.block_tokens = 1;
        let m = &exact.model;
        let unblocked = (input + output) * m.kv_bytes_per_token + m.state_bytes_per_sequence;
        prop_assert_eq!(exact.footprint_bytes(input, output), unblocked);
        prop_assert_eq!(exact.max_batch_memory(input, output), exact.kv_budget_bytes() / unblocked);
        // blocks only ever round up, by less than one block
        let blocked = inputs.footprint_bytes(input, output);
        prop_assert!(blocked >= unblocked);
        prop_assert!(blocked - unblocked < inputs.block_tokens.max(1) * m.kv_bytes_per_token);
    }
}
