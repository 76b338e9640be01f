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

/// The seed article's 910B3 (320 TFLOPS, 1.9 TB/s) at the pure roofline: DOMAIN.md section 1.
fn seed_ideal(block: u64) -> CapacityInputs {
    let mut inputs = CapacityInputs::from_names(
        SEED_HARDWARE,
        "qwen3.5-27b",
        StateDtype::Fp32,
        &ProfileOverrides::default(),
    )
    .unwrap();
    inputs.block_tokens = block;
    inputs.efficiency = Efficiency::IDEAL;
    inputs
}

/// Qwen3.5-27B split over two 910B3s: the deployment that can hold a 50 ms TPOT.
fn qwen_tp2() -> CapacityInputs {
    let mut inputs = qwen(128, StateDtype::Fp32);
    inputs.tp = 2;
    inputs
}

/// Qwen3-32B on `tp` 910B3s.
fn qwen3_32b(tp: u32) -> CapacityInputs {
    let mut inputs = CapacityInputs::from_names(
        "910b3",
        "qwen3-32b",
        StateDtype::Fp32,
        &ProfileOverrides::default(),
    )
    .unwrap();
    inputs.tp = tp;
    inputs
}

/// vLLM-ascend's Qwen3.5-27B recipe, one engine: W8A8 weights on two 910B3s, MTP drafting 3
/// tokens a step at the default acceptance (0.7).
fn recipe() -> CapacityInputs {
    let mut inputs = CapacityInputs::from_names_with_weights(
        "910b3",
        "qwen3.5-27b",
        StateDtype::Fp32,
        WeightPrecision::W8a8,
        &ProfileOverrides::default(),
    )
    .unwrap();
    inputs.tp = 2;
    inputs.speculation = Speculation {
        draft_tokens: 3,
        ..Speculation::NONE
    };
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
    assert_eq!(qwen_tp2().kv_budget_bytes(), 70_000_000_000);
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
fn domain_table_memory_ceilings_and_tpot_on_the_seed_card() {
    let got = |inputs: &CapacityInputs| -> Vec<(u64, u64, String)> {
        TABLE
            .iter()
            .map(|&(i, o)| {
                let r = inputs.report(i, o, None, None);
                assert_eq!(r.bottleneck, Bottleneck::MemoryCapacity);
                assert_eq!(r.batch, r.safe_batch);
                assert_eq!(r.step_ms, r.tpot_ms);
                assert_eq!(r.tpot_ms, r.ideal_tpot_ms);
                (r.max_batch_memory, r.safe_batch, f6(r.tpot_ms))
            })
            .collect()
    };
    let owned = |v: [(u64, u64, &str); 4]| -> Vec<(u64, u64, String)> {
        v.iter().map(|&(m, s, t)| (m, s, t.to_string())).collect()
    };
    // (54e9 + B x (ctx x 65,536 + 2 x 153,944,064)) / 1.9e12: the state is read and written
    assert_eq!(
        got(&seed_ideal(1)),
        owned([
            (45, 45, "36.139986"),
            (19, 19, "33.728158"),
            (29, 29, "34.770870"),
            (12, 12, "33.097426"),
        ])
    );
    let blocked = seed_ideal(128);
    assert_eq!(
        got(&blocked),
        owned([
            (44, 44, "35.968454"),
            (19, 19, "33.728158"),
            (28, 28, "34.551911"),
            (12, 12, "33.097426"),
        ])
    );
    let sla: Vec<u64> = TABLE
        .iter()
        .map(|&(i, o)| blocked.max_batch_sla(mean_context_tokens(i, o)))
        .collect();
    assert_eq!(sla, vec![125, 77, 98, 55]);
}

#[test]
fn one_910b3_cannot_hold_50ms_with_bf16_qwen35() {
    // 54e9 B / (1.6e12 B/s x 0.45) = 75 ms of weight streaming before any sequence
    for &(i, o) in &TABLE {
        let r = qwen(128, StateDtype::Fp32).report(i, o, None, None);
        assert_eq!(f6(r.weight_read_ms), "75.000000");
        assert_eq!((r.max_batch_sla, r.safe_batch), (0, 0), "{i}/{o}");
        assert_eq!(r.bottleneck, Bottleneck::Bandwidth);
        assert!(r.max_batch_memory > 0);
    }
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
fn full_report_for_rag_on_two_cards() {
    let r = qwen_tp2().report(3000, 800, None, Some(1.0));
    assert_eq!(r.kv_bytes_per_token, 65_536);
    assert_eq!(r.state_bytes_per_sequence, 153_944_064);
    assert_eq!(r.kv_budget_bytes, 70_000_000_000);
    assert_eq!(r.footprint_bytes_per_sequence, 405_602_304);
    assert_eq!(
        (r.max_batch_memory, r.max_batch_sla, r.safe_batch),
        (172, 45, 45)
    );
    assert_eq!(r.bottleneck, Bottleneck::Bandwidth);
    assert_eq!(r.step_bound, StepBound::Bandwidth);
    // 54e9 / (2 x 1.6e12 x 0.45); 45 x (3,400 x 65,536 + 2 x 153,944,064) / (2 x 1.6e12 x 0.61)
    assert_eq!(f6(r.weight_read_ms), "37.500000");
    assert_eq!(f6(r.cache_read_ms), "12.234618");
    assert_eq!(f6(r.compute_ms), "11.090826");
    assert_eq!(f6(r.tpot_ms), "49.734618");
    assert_eq!(f6(r.ideal_tpot_ms), "24.338117");
    // 2 x 27e9 x 3000 / (2 x 313e12 x 0.35)
    assert_eq!(f6(r.ttft_ms), "739.388407");
    assert_eq!(f6(r.decode_tps), "904.802371");
    assert_eq!(f6(r.prefill_tps), "4057.407407");
    assert_eq!(f6(r.qps), "0.615931");
    assert_eq!(f6(r.sustained_decode_tps), "492.744525");
    assert_eq!(f6(r.sustained_prefill_tps), "1847.791969");
    assert_eq!(r.ttft_within_slo, Some(true));
    assert_eq!(r.max_input_ttft_slo, Some(4057));
}

#[test]
fn efficiency_divides_every_time() {
    let ideal = qwen(128, StateDtype::Fp32).with_efficiency(Efficiency::IDEAL);
    let half = ideal.with_efficiency(Efficiency::uniform(0.5));
    for (batch, ctx) in [(1, 275.0), (19, 3400.0), (300, 100.0)] {
        let (a, b) = (
            ideal.decode_step_terms(batch, ctx),
            half.decode_step_terms(batch, ctx),
        );
        assert_eq!(f6(2.0 * a.weights_seconds), f6(b.weights_seconds));
        assert_eq!(f6(2.0 * a.cache_seconds), f6(b.cache_seconds));
        assert_eq!(f6(2.0 * a.compute_seconds), f6(b.compute_seconds));
        assert_eq!(f6(2.0 * a.seconds()), f6(b.seconds()));
    }
    assert_eq!(
        f6(2.0 * ideal.prefill_seconds(3000)),
        f6(half.prefill_seconds(3000))
    );
    assert_eq!(f6(ideal.prefill_tps() / 2.0), f6(half.prefill_tps()));
}

#[test]
fn a_long_sequence_is_read_by_few_cores() {
    // Qwen3-32B at TP4: one 15,000-token sequence's 8 KV heads are 8 tasks for 4 x 20 cores;
    // each head (15,000 x 262,144 / 8 B) is read at 1/20 of 1.6e12 x 0.61
    let inputs = qwen3_32b(4);
    let one = inputs.decode_step_terms(1, 15_000.0);
    assert_eq!(f6(one.cache_seconds * 1e3), "10.072131");
    // eight such sequences take no longer: 16 of each card's 20 cores are busy
    assert_eq!(
        f6(inputs.decode_step_terms(8, 15_000.0).cache_seconds * 1e3),
        "10.072131"
    );
    // twelve fill them: then the card's whole cache rate binds
    let twelve = inputs.decode_step_terms(12, 15_000.0).cache_seconds;
    assert_eq!(
        f6(twelve * 1e3),
        f6(12.0 * 15_000.0 * 262_144.0 / (4.0 * 1.6e12 * 0.61) * 1e3)
    );
    // the pure roofline spreads even one sequence over the whole card
    let ideal = inputs.with_efficiency(Efficiency::IDEAL);
    assert_eq!(
        f6(ideal.decode_step_terms(1, 15_000.0).cache_seconds * 1e3),
        f6(15_000.0 * 262_144.0 / (4.0 * 1.6e12) * 1e3)
    );
}

#[test]
fn sla_and_engine_caps_bind_when_memory_does_not() {
    let mut inputs = seed_ideal(128);
    inputs.tpot_slo_seconds = 0.030;
    let s = inputs.safe_batch(200, 150);
    // (30 ms - 28.42 ms weight read) / 0.1715 ms per chat sequence (KV + state read and written)
    assert_eq!((s.memory, s.sla, s.batch), (44, 9, 9));
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
    let mut inputs = seed_ideal(128);
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
fn a_pass_reads_what_is_cached_and_computes_every_token() {
    let ideal = qwen(128, StateDtype::Fp32).with_efficiency(Efficiency::IDEAL);
    // at the pure roofline 3 sequences of 100, 200 and 300 cached tokens = 3 of 200
    assert_eq!(
        ideal.pass_terms(3, 600.0, 300.0, 0),
        ideal.decode_step_terms(3, 200.0)
    );
    let fitted = qwen(128, StateDtype::Fp32);
    // with attention parallel over (sequence, head) pairs the longest sequence counts
    assert_eq!(
        f6(fitted.pass_terms(3, 600.0, 300.0, 0).seconds() * 1e3),
        "76.047099"
    );
    assert_eq!(
        f6(fitted.decode_step_terms(3, 200.0).seconds() * 1e3),
        "76.013525"
    );
    assert_eq!(
        f6(fitted.decode_step_terms(0, 0.0).seconds() * 1e3),
        "75.000000"
    );
    // a 2048-token prefill chunk in the pass: 2 x 27e9 x 2051 / (313e12 x 0.35) = 1011 ms
    let chunked = fitted.pass_terms(3, 600.0, 300.0, 2048);
    assert_eq!(chunked.bound(), StepBound::Compute);
    assert_eq!(f6(chunked.seconds() * 1e3), "1010.990415");
}

#[test]
fn tensor_parallel_splits_weights_and_time() {
    let mut inputs = qwen3_32b(1);
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
        (58, 9, 9)
    );
    assert_eq!(f6(r.tpot_ms), "49.664985");
    assert_eq!(f6(r.sustained_decode_tps), "150.577314");
}

#[test]
fn calibration_reports_the_gap_and_the_efficiency_that_closes_it() {
    let inputs = qwen_tp2();
    let c = inputs.calibrate(0.060, 45, 3000, 800);
    assert_eq!(f6(c.predicted_tpot_ms), "49.734618");
    assert_eq!(f6(c.observed_over_predicted), "1.206403");
    assert_eq!(format!("{:.4}", c.gap_percent), "20.6403");
    assert_eq!(c.predicted_bound, StepBound::Bandwidth);
    // the step's bytes at peak bandwidth over the observed time
    assert_eq!(f6(c.implied_bandwidth_efficiency), "0.405635");
    assert_eq!(
        format!("{:.0}", c.implied_bandwidth_bytes_per_s / 1e6),
        "649016"
    );
    assert_eq!(f6(c.implied_compute_efficiency), "0.064696");
    assert_eq!(c.efficiency, Efficiency::FITTED);
    // both bandwidth fractions scaled by 49.73 / 60
    assert_eq!(f6(c.calibrated_efficiency.weights), "0.373010");
    assert_eq!(f6(c.calibrated_efficiency.cache), "0.505635");
    assert_eq!(c.calibrated_efficiency.compute, 0.35);
    assert!(!c.faster_than_peak);
    let calibrated = inputs.with_efficiency(c.calibrated_efficiency);
    assert_eq!(
        f6(calibrated.decode_step_seconds(45, 3400.0) * 1e3),
        "60.000000"
    );
    // with it the SLA ceiling falls from 45 to 14
    assert_eq!(calibrated.safe_batch(3000, 800).batch, 14);
    // an observation faster than the pure roofline caps the fractions at 1
    let c = inputs.calibrate(0.010, 45, 3000, 800);
    assert!(c.faster_than_peak);
    assert_eq!(c.calibrated_efficiency.weights, 1.0);
    assert_eq!(c.calibrated_efficiency.cache, 1.0);
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
    inputs.efficiency = Efficiency::uniform(1.5);
    assert_eq!(
        inputs.validate().unwrap_err().to_string(),
        "invalid weight_efficiency: must be in (0, 1], got 1.5"
    );
    inputs.efficiency = Efficiency {
        compute: 0.0,
        ..Efficiency::FITTED
    };
    assert_eq!(
        inputs.validate().unwrap_err().to_string(),
        "invalid compute_efficiency: must be in (0, 1], got 0"
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
fn efficiency_settings_resolve_from_the_fitted_default() {
    assert_eq!(EfficiencyOverrides::default().resolve(), Efficiency::FITTED);
    let uniform = EfficiencyOverrides {
        uniform: Some(1.0),
        ..EfficiencyOverrides::default()
    };
    assert_eq!(uniform.resolve(), Efficiency::IDEAL);
    let measured = EfficiencyOverrides {
        weights: Some(0.373),
        cache: Some(0.506),
        ..EfficiencyOverrides::default()
    };
    assert_eq!(
        measured.resolve(),
        Efficiency {
            weights: 0.373,
            cache: 0.506,
            ..Efficiency::FITTED
        }
    );
    let mixed = EfficiencyOverrides {
        uniform: Some(0.5),
        compute: Some(0.4),
        ..EfficiencyOverrides::default()
    };
    assert_eq!(
        mixed.resolve(),
        Efficiency {
            compute: 0.4,
            ..Efficiency::uniform(0.5)
        }
    );
    assert_eq!(
        Efficiency::FITTED.to_string(),
        "weights 0.45, cache 0.61, compute 0.35"
    );
    assert_eq!(Efficiency::uniform(0.5).to_string(), "0.5 (uniform)");
    assert_eq!(Efficiency::IDEAL.to_string(), "1 (pure roofline)");
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
    let mut inputs = qwen_tp2();
    let one = derive_backend(&inputs, Workload::default());
    assert_eq!(one.kv_capacity_bytes, 70_000_000_000);
    assert_eq!(one.max_batch, 45);
    assert_eq!(
        (
            one.kv_bytes_per_token,
            one.state_bytes_per_sequence,
            one.block_tokens
        ),
        (65_536, 153_944_064, 128)
    );
    assert_eq!(f6(one.decode_tps), "492.744525");
    assert_eq!(f6(one.prefill_tps), "1847.791969");
    assert_eq!(
        one.explanation,
        "910b3 x2 (TP) per replica, qwen3.5-27b: cache budget 2 x 64000000000 B HBM - \
         54000000000 B weights - 2 x 2000000000 B reserve = 70000000000 B; a 3000+800-token \
         request pins 30 x 128 tokens x 65536 B KV + 153944064 B state = 405602304 B; ceilings: \
         memory 172, TPOT 50 ms 45; safe batch 45 (HBM bandwidth (TPOT SLO)), step 49.7 ms; \
         at efficiency weights 0.45, cache 0.61, compute 0.35: 0.616 req/s = 1848 prefill + 493 \
         decode tokens/s per replica; x1 replica(s): kv_capacity_bytes 70000000000, max_batch \
         45, prefill 1848 + decode 493 tokens/s"
    );
    inputs.replicas = 2;
    let two = derive_backend(&inputs, Workload::default());
    assert_eq!(
        (two.kv_capacity_bytes, two.max_batch),
        (140_000_000_000, 90)
    );
    assert_eq!(f6(two.decode_tps), f6(2.0 * one.decode_tps));
    // the same replica, twice: only the deployment's totals differ
    assert_eq!(
        RooflineReport {
            deployment: one.per_replica.deployment,
            ..two.per_replica.clone()
        },
        one.per_replica
    );
    let d = two.per_replica.deployment;
    assert_eq!((d.engines, d.cards, d.safe_sequences), (2, 4, 90));
    assert_eq!(
        (f6(d.sustained_decode_tps), f6(d.sustained_prefill_tps)),
        (f6(two.decode_tps), f6(two.prefill_tps))
    );
    let json = serde_json::to_value(&two).unwrap();
    assert_eq!(json["kv_capacity_bytes"], 140_000_000_000u64);
    assert_eq!(
        json["workload"],
        serde_json::json!({"avg_input": 3000, "avg_output": 800})
    );
    assert_eq!(json["per_replica"]["bottleneck"], "bandwidth");
    assert_eq!(
        json["per_replica"]["efficiency"],
        serde_json::json!({"weights": 0.45, "cache": 0.61, "compute": 0.35, "head_parallel_attention": true})
    );
}

#[test]
fn derived_table_lists_each_backend() {
    let mut inputs = qwen_tp2();
    inputs.replicas = 2;
    let b = derive_backend(&inputs, Workload::default());
    assert_eq!(
        derived_table(&[("npu-a", &b)]),
        "derived for         kv_capacity_B max_batch prefill_t/s  decode_t/s  derived from\n\
         npu-a                140000000000        90      3695.6       985.5  910b3 x2 TP x2 \
         replicas, qwen3.5-27b, 3000/800 tokens, safe batch 45 per replica (HBM bandwidth \
         (TPOT SLO))\n"
    );
}

#[test]
fn tenant_rates_are_a_share_of_the_summed_rates() {
    let inputs = qwen_tp2();
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
    // 0.3 x (1330.225677 + 1847.791969), 0.3 x (997.669258 + 492.744525)
    assert_eq!(format!("{prefill:.4}"), "953.4053");
    assert_eq!(format!("{decode:.4}"), "447.1241");
    assert_eq!(tenant_rates(0.5, &[]), (0.0, 0.0));
}

#[test]
fn scenario_table_flips_from_memory_to_tpot_once_efficiency_is_real() {
    let inputs = qwen(128, StateDtype::Fp32);
    let seed = SeedInputs::default();
    let rows = scenario_table(&inputs, &seed).unwrap();
    let got: Vec<(&str, u64, u64, u64, Bottleneck, u64, Bottleneck)> = rows
        .iter()
        .map(|r| {
            (
                r.scenario.name,
                r.scenario.article_safe_batch,
                r.seed_safe_batch,
                r.ideal.safe_batch,
                r.ideal.bottleneck,
                r.expected.safe_batch,
                r.expected.bottleneck,
            )
        })
        .collect();
    use Bottleneck::{Bandwidth as T, MemoryCapacity as M};
    assert_eq!(
        got,
        vec![
            ("chat", 48, 813, 44, M, 0, T),
            ("rag", 6, 152, 19, M, 0, T),
            ("code", 18, 406, 28, M, 0, T),
            ("summary", 4, 101, 12, M, 0, T),
        ]
    );
    let tpot: Vec<(String, String)> = rows
        .iter()
        .map(|r| {
            (
                format!("{:.2}", r.ideal.tpot_ms),
                format!("{:.2}", r.expected.tpot_ms),
            )
        })
        .collect();
    assert_eq!(
        tpot,
        vec![
            ("42.71".into(), "75.41".into()),
            ("40.05".into(), "76.46".into()),
            ("41.03".into(), "75.87".into()),
            ("39.30".into(), "77.53".into()),
        ]
    );
    assert_eq!(
        rows[1].why,
        "seed counts only 800 output tokens x 65536 B = 52.4 MB per sequence and its TPS grows \
         with batch squared; the roofline pins 3000+800 tokens in 128-token blocks x 65536 B + \
         153.9 MB state = 405.6 MB of 8.00 GB, and every step streams all weights (33.8 ms at \
         peak, 75.0 ms as achieved) and the resident cache; ideal bound: memory capacity (KV + \
         state), expected bound: HBM bandwidth (TPOT SLO); the article's 6 matches none"
    );
    // the article's own chain (QPS of the script run at its memory ceiling), checked in Python
    let seed_qps: Vec<f64> = rows.iter().map(|r| r.seed_qps).collect();
    assert_eq!(seed_qps, vec![69700.18, 457.18, 8695.39, 134.58]);
    let unblocked = scenario_table(&qwen(1, StateDtype::Fp32), &seed).unwrap();
    let mem: Vec<u64> = unblocked.iter().map(|r| r.ideal.max_batch_memory).collect();
    assert_eq!(mem, vec![45, 19, 29, 12]);
}

#[test]
fn w8a8_weights_are_a_byte_a_parameter_but_embeddings_and_lm_head() {
    let bf16 = ModelProfile::lookup("qwen3.5-27b", StateDtype::Fp32).unwrap();
    // 248,320 x 5,120, untied: token embeddings and LM head
    assert_eq!(bf16.bf16_params, 2_542_796_800.0);
    assert_eq!(
        (bf16.weights, bf16.weight_bytes),
        (WeightPrecision::Bf16, 54_000_000_000)
    );
    let w8a8 = bf16.clone().with_weights(WeightPrecision::W8a8);
    // 24.457e9 parameters at 1 byte + 2.543e9 at 2 bytes: the recipe's "~30 GB"
    assert_eq!(
        (w8a8.weights, w8a8.weight_bytes),
        (WeightPrecision::W8a8, 29_542_796_800)
    );
    assert_eq!(w8a8.clone().with_weights(WeightPrecision::Bf16), bf16);
    let w8a8_of = |model: &str| {
        let m = ModelProfile::lookup(model, StateDtype::Fp32).unwrap();
        m.with_weights(WeightPrecision::W8a8).weight_bytes
    };
    // 151,936 x 5,120 and x 4,096, untied
    assert_eq!(w8a8_of("qwen3-32b"), 32_800_000_000 + 1_555_824_640);
    assert_eq!(w8a8_of("qwen3-8b"), 8_200_000_000 + 1_244_659_712);
    // two cards keep 94.5 GB for the cache instead of 70
    assert_eq!(recipe().kv_budget_bytes(), 94_457_203_200);
    // figures given by hand win; --params-b follows the precision
    let w8a8_with = |overrides: ProfileOverrides| {
        CapacityInputs::from_names_with_weights(
            "910b3",
            "qwen3.5-27b",
            StateDtype::Fp32,
            WeightPrecision::W8a8,
            &overrides,
        )
        .unwrap()
        .model
        .weight_bytes
    };
    let by_hand = ProfileOverrides {
        weights_gb: Some(31.0),
        ..ProfileOverrides::default()
    };
    assert_eq!(w8a8_with(by_hand), 31_000_000_000);
    let params = ProfileOverrides {
        params_b: Some(20.0),
        ..ProfileOverrides::default()
    };
    assert_eq!(w8a8_with(params), 22_542_796_800);
    assert_eq!(
        CapacityInputs::from_names("910b3", "qwen3.5-27b", StateDtype::Fp32, &params)
            .unwrap()
            .model
            .weight_bytes,
        40_000_000_000
    );
}

#[test]
fn a_speculative_sequence_holds_its_draft_slots_and_a_state_per_verified_token() {
    let spec = recipe();
    let plain = Speculation::default();
    assert_eq!(
        (
            plain.tokens_verified(),
            plain.tokens_per_step(),
            plain.state_copies()
        ),
        (1, 1.0, 1)
    );
    let s = spec.speculation;
    assert_eq!(
        (
            s.tokens_verified(),
            f6(s.tokens_per_step()),
            s.lookahead_tokens(),
            s.state_copies()
        ),
        (4, f6(3.1), 3, 4)
    );
    assert_eq!(spec.state_bytes_held_per_sequence(), 4 * 153_944_064);
    // 5,000 + 3 tokens still fit 40 blocks; the 4 states are 616 MB
    assert_eq!(
        spec.footprint_bytes(3500, 1500),
        40 * 128 * 65_536 + 4 * 153_944_064
    );
    let mut no_drafts = spec.clone();
    no_drafts.speculation = Speculation::NONE;
    assert_eq!(
        no_drafts.footprint_bytes(3500, 1500),
        40 * 128 * 65_536 + 153_944_064
    );
    // 5,118 tokens fill 40 blocks; their 3 draft slots take a 41st
    assert_eq!(
        no_drafts.footprint_bytes(5000, 118),
        40 * 128 * 65_536 + 153_944_064
    );
    assert_eq!(
        spec.footprint_bytes(5000, 118),
        41 * 128 * 65_536 + 4 * 153_944_064
    );
    // 94,457,203,200 B / 951,320,576 B
    assert_eq!(spec.max_batch_memory(3500, 1500), 99);
    assert_eq!(no_drafts.max_batch_memory(3500, 1500), 192);
}

#[test]
fn a_speculative_step_verifies_every_draft_and_keeps_the_accepted() {
    let spec = recipe();
    let ctx = mean_context_tokens(3500, 1500);
    let t = spec.decode_step_terms(32, ctx);
    // 29.54 GB over 2 x 1.6 TB/s x 0.45
    assert_eq!(f6(t.weights_seconds * 1e3), "20.515831");
    // 32 x 4,250 tokens of KV read once, each state read once and written after each of the
    // 4 tokens verified: 32 x 5 x 153,944,064 B, all over 2 x 1.6 TB/s x 0.61
    assert_eq!(f6(t.cache_seconds * 1e3), "17.184399");
    // 2 x 27e9 x 32 x 4 tokens over 2 x 313 TFLOPS x 0.35
    assert_eq!(f6(t.compute_seconds * 1e3), "31.547239");
    let r = spec.report(3500, 1500, Some(32), None);
    assert_eq!(f6(r.step_ms), "37.700230");
    // 3.1 tokens kept a step: 1 + 0.7 x 3
    assert_eq!(f6(r.tokens_per_step), "3.100000");
    assert_eq!(f6(r.tpot_ms), "12.161364");
    assert_eq!(f6(r.decode_tps), "2631.283696");
    // each request: 862.6 ms of prefill + 1,500 TPOTs shared by 32
    assert_eq!(f6(r.ttft_ms), "862.619808");
    assert_eq!(f6(r.sustained_decode_tps), "1046.986107");
    // the SLA ceiling is on TPOT, not on the step: at 157 the verification's arithmetic
    // (compute-bound by then) still keeps 49.93 ms a token, at 158 it does not
    assert_eq!(spec.max_batch_sla(ctx), 157);
    assert_eq!(f6(spec.tpot_seconds(157, ctx) * 1e3), "49.928594");
    assert_eq!(f6(spec.tpot_seconds(158, ctx) * 1e3), "50.246610");
    let safe = spec.safe_batch(3500, 1500);
    assert_eq!(
        (safe.memory, safe.sla, safe.batch, safe.bottleneck),
        (99, 157, 99, Bottleneck::MemoryCapacity)
    );
    // acceptance 0: the verification is paid and nothing is gained
    let mut none_kept = spec.clone();
    none_kept.speculation.acceptance = 0.0;
    assert_eq!(f6(none_kept.tpot_seconds(32, ctx) * 1e3), "37.700230");
    let mut plain = spec.clone();
    plain.speculation = Speculation::NONE;
    assert_eq!(f6(plain.tpot_seconds(32, ctx) * 1e3), "30.129210");
    assert_eq!(
        f6(plain
            .report(3500, 1500, Some(32), None)
            .sustained_decode_tps),
        "659.361950"
    );
    // acceptance is checked like the efficiencies
    none_kept.speculation.acceptance = 1.5;
    assert_eq!(
        none_kept.validate().unwrap_err().to_string(),
        "invalid acceptance: must be in [0, 1], got 1.5"
    );
    none_kept.speculation.acceptance = f64::NAN;
    assert_eq!(
        none_kept.validate().unwrap_err().to_string(),
        "invalid acceptance: must be in [0, 1], got NaN"
    );
}

#[test]
fn data_parallel_engines_add_up_side_by_side() {
    let mut four = recipe();
    four.replicas = 4;
    let one = recipe().report(3500, 1500, Some(32), None);
    let r = four.report(3500, 1500, Some(32), None);
    let d = r.deployment;
    assert_eq!(
        (d.engines, d.cards, d.sequences, d.safe_sequences),
        (4, 8, 128, 396)
    );
    assert_eq!(f6(d.decode_tps), "10525.134783");
    assert_eq!(f6(d.qps), "2.791963");
    assert_eq!(f6(d.sustained_decode_tps), "4187.944429");
    assert_eq!(
        f6(d.sustained_prefill_tps),
        f6(4.0 * one.sustained_prefill_tps)
    );
    // each engine is the one-engine report
    assert_eq!(
        RooflineReport {
            deployment: one.deployment,
            ..r.clone()
        },
        one
    );
    assert_eq!(
        (
            one.deployment.engines,
            one.deployment.cards,
            one.deployment.sequences
        ),
        (1, 2, 32)
    );
}

#[test]
fn a_speculative_calibration_sets_the_tpot_at_the_acceptance_assumed() {
    let spec = recipe();
    // what the CI baseline implies per token once its prefill is taken out
    let c = spec.calibrate(0.030_13, 32, 3500, 1500);
    assert_eq!(f6(c.predicted_tpot_ms), "12.161364");
    assert_eq!(f6(c.observed_over_predicted), "2.477518");
    // the observed step is 30.13 ms x 3.1 tokens kept
    assert_eq!(f6(c.calibrated_efficiency.weights), "0.181633");
    assert_eq!(f6(c.calibrated_efficiency.cache), "0.246214");
    let calibrated = spec.with_efficiency(c.calibrated_efficiency);
    assert_eq!(
        f6(calibrated.tpot_seconds(32, mean_context_tokens(3500, 1500)) * 1e3),
        "30.130000"
    );
}

#[test]
fn a_speculative_deployment_that_misses_the_slo_says_it_per_token() {
    let mut spec = recipe();
    spec.tpot_slo_seconds = 0.005;
    let r = spec.fits_with(3500, 1500).unwrap();
    assert_eq!(
        r.describe(Spelling::Flags),
        "one sequence takes 7.21 ms a token (3.1 tokens a step), over the 5 ms TPOT SLO; it fits \
         with --tpot-slo-ms 50 (safe batch 99, bound: memory capacity (KV + state)) or --tp 4 \
         (safe batch 19, bound: HBM bandwidth (TPOT SLO))"
    );
    // (20.52 ms of weights + 1.43 of one sequence's attention on 4 heads + 0.39 of its 5 state
    // passes) / 3.1; on four cards (10.26 + 1.43 + 0.20 x B) / 3.1 <= 5 ms up to B = 19.
    // The SLO held is on TPOT: 7.21 ms a token holds the article's 50 ms
    assert_eq!(spec.tpot_slo_held(3500, 1500), Some(0.05));
}

#[test]
fn the_recipe_backend_is_derived_in_the_engines_units() {
    let mut inputs = recipe();
    inputs.engine_max_batch = Some(32);
    let d = derive_backend(
        &inputs,
        Workload {
            avg_input: 3500,
            avg_output: 1500,
        },
    );
    assert_eq!(
        (d.kv_capacity_bytes, d.max_batch, d.lookahead_tokens),
        (94_457_203_200, 32, 3)
    );
    // the ledger charges every state copy
    assert_eq!(d.state_bytes_per_sequence, 4 * 153_944_064);
    assert_eq!(
        d.explanation,
        "910b3 x2 (TP) per replica, qwen3.5-27b (w8a8 weights), 3 draft tokens a step at \
         acceptance 0.7: cache budget 2 x 64000000000 B HBM - 29542796800 B weights - 2 x \
         2000000000 B reserve = 94457203200 B; a 3500+1500-token request (with 3 draft slots) \
         pins 40 x 128 tokens x 65536 B KV + 4 x 153944064 B state = 951320576 B; ceilings: \
         memory 99, TPOT 50 ms 157, engine cap 32; safe batch 32 (engine maxBatchSize), step \
         37.7 ms, TPOT 12.2 ms; at efficiency weights 0.45, cache 0.61, compute 0.35: 0.698 \
         req/s = 2443 prefill + 1047 decode tokens/s per replica; x1 replica(s): \
         kv_capacity_bytes 94457203200, max_batch 32, prefill 2443 + decode 1047 tokens/s"
    );
}

#[test]
fn a_deployment_reads_back_from_its_json_and_older_json_is_plain_bf16() {
    // `tokengate diagnose` reads a backend's inputs back from /admin/backends
    let recipe = recipe();
    let json = serde_json::to_value(&recipe).unwrap();
    assert_eq!(
        serde_json::from_value::<CapacityInputs>(json.clone()).unwrap(),
        recipe
    );
    // a gateway from before these inputs: bf16 weights, no speculation
    let mut old = serde_json::to_value(qwen_tp2()).unwrap();
    old.as_object_mut().unwrap().remove("speculation");
    let model = old["model"].as_object_mut().unwrap();
    model.remove("weights");
    model.remove("bf16_params");
    let read = serde_json::from_value::<CapacityInputs>(old).unwrap();
    assert_eq!(
        (
            read.model.weights,
            read.speculation,
            read.model.weight_bytes
        ),
        (WeightPrecision::Bf16, Speculation::NONE, 54_000_000_000)
    );
}

#[test]
fn validation_table_pins_every_published_row() {
    let rows = validation_table().unwrap();
    let got: Vec<(&str, f64, String, String, String)> = rows
        .iter()
        .map(|r| {
            (
                r.published.source,
                r.published.measured.value(),
                format!("{:.2}", r.predicted),
                format!("{:+.1}", r.error_percent),
                format!("{:.2}", r.ideal),
            )
        })
        .collect();
    let want: Vec<(&str, f64, &str, &str, &str)> = vec![
        (
            "vLLM-ascend PR 11266 (commit 070825300e)",
            34.05,
            "34.47",
            "+1.2",
            "15.95",
        ),
        ("vLLM-ascend issue 4167", 20.5, "23.47", "+14.5", "10.29"),
        ("vLLM-ascend issue 4167", 27.0, "23.47", "-13.1", "10.29"),
        ("vLLM-ascend issue 4656", 38.0, "32.85", "-13.6", "10.86"),
        ("vLLM-ascend PR 2783", 41.73, "32.68", "-21.7", "16.29"),
        ("vLLM-ascend PR 1811", 146.17, "35.98", "-75.4", "18.30"),
        (
            "vLLM-ascend suffix decoding tutorial, ARC baseline",
            52.8,
            "23.15",
            "-56.2",
            "10.27",
        ),
        (
            "vLLM-ascend suffix decoding tutorial, GSM8K baseline",
            63.9,
            "24.27",
            "-62.0",
            "11.16",
        ),
        (
            "vLLM-ascend suffix decoding tutorial, AGIEval baseline",
            70.0,
            "26.60",
            "-62.0",
            "12.58",
        ),
        // output tokens/s: W8A8 Qwen3-32B, then the Qwen3.5-27B recipe with MTP at the
        // acceptance assumed (0.7)
        (
            "vLLM-ascend CI baseline Qwen3-32B-Int8-A2.yaml",
            1065.179,
            "1249.43",
            "+17.3",
            "2696.18",
        ),
        (
            "vLLM-ascend CI baseline Qwen3.5-27B-w8a8-A2.yaml",
            660.296,
            "1046.99",
            "+58.6",
            "2499.91",
        ),
    ];
    let want: Vec<(&str, f64, String, String, String)> = want
        .into_iter()
        .map(|(s, m, p, e, i)| (s, m, p.to_string(), e.to_string(), i.to_string()))
        .collect();
    assert_eq!(got, want);
    // every row of the setup the efficiency is fitted to is within 30 %
    for r in rows.iter().filter(|r| r.published.fitted_setup) {
        assert!(r.error_percent.abs() < 30.0, "{:?}", r.published);
    }
    // docs/capacity.md shows exactly this table
    let doc = include_str!("../../docs/capacity.md");
    let table = validation_markdown(&rows);
    assert!(doc.contains(&table), "docs/capacity.md lacks:\n{table}");
}

#[test]
fn the_slo_held_is_the_article_target_or_its_least_multiple_met() {
    let held = |step: f64| f6(held_tpot_slo_seconds(step) * 1e3);
    assert_eq!(held(0.001), "50.000000");
    assert_eq!(held(0.050), "50.000000");
    assert_eq!(held(0.050_001), "100.000000");
    assert_eq!(held(0.100), "100.000000");
    assert_eq!(held(0.112_5), "150.000000");
    // A step so long that whole multiples of 50 ms are no longer apart in f64 (the config fuzz
    // found one that looped forever): the step itself, at once.
    for step in [1.23456789e20, 1e17, f64::MAX] {
        assert!(held_tpot_slo_seconds(step) >= step, "{step}");
    }
    // one 910B3: one RAG sequence steps in 75 + 1.14 (its KV heads, one core each) + 0.32
    // (its state read and written) ms; two cards hold the article's 50 ms
    let one = qwen(128, StateDtype::Fp32);
    assert_eq!(one.tpot_slo_held(3000, 800).map(f6), Some(f6(0.1)));
    assert_eq!(qwen_tp2().tpot_slo_held(3000, 800).map(f6), Some(f6(0.05)));
    // weights at 0.3 of peak: 54e9 / (1.6e12 x 0.3) = 112.5 ms a step
    let mut slow = one.clone();
    slow.efficiency.weights = 0.3;
    assert_eq!(slow.tpot_slo_held(200, 150).map(f6), Some(f6(0.15)));
    // Qwen3-32B's 65.6 GB leave one 64 GB card no cache: no SLO is held
    assert_eq!(qwen3_32b(1).tpot_slo_held(3000, 800), None);
}

#[test]
fn fits_with_names_the_slo_held_and_the_fewest_cards_holding_the_asked_one() {
    let one = qwen(128, StateDtype::Fp32);
    let r = one.fits_with(3000, 800).unwrap();
    let Shortfall::Tpot {
        one_sequence_tpot_ms,
        tpot_slo_ms,
        tokens_per_step,
    } = r.shortfall
    else {
        panic!("{r:?}")
    };
    assert_eq!(
        (f6(one_sequence_tpot_ms), tpot_slo_ms, tokens_per_step),
        (f6(76.456967), 50.0, 1.0)
    );
    assert_eq!(
        r.tpot_slo,
        Some(Remedy {
            tp: 1,
            tpot_slo_ms: 100.0,
            safe_batch: 19,
            bottleneck: Bottleneck::MemoryCapacity
        })
    );
    assert_eq!(
        r.tp,
        Some(Remedy {
            tp: 2,
            tpot_slo_ms: 50.0,
            safe_batch: 45,
            bottleneck: Bottleneck::Bandwidth
        })
    );
    assert_eq!(
        r.describe(Spelling::Config),
        "one sequence takes 76.46 ms a step, over the 50 ms TPOT SLO; it fits with tpot_slo_ms = \
         100 (safe batch 19, bound: memory capacity (KV + state)) or tp = 2 (safe batch 45, \
         bound: HBM bandwidth (TPOT SLO))"
    );
    assert_eq!(qwen_tp2().fits_with(3000, 800), None);
    // no cache at all: only cards help
    let r = qwen3_32b(1).fits_with(3000, 800).unwrap();
    assert_eq!(
        r.shortfall,
        Shortfall::Memory {
            footprint_bytes: 1_006_632_960,
            kv_budget_bytes: 0
        }
    );
    assert_eq!(r.tpot_slo, None);
    assert_eq!(r.tp.map(|t| (t.tp, t.safe_batch)), Some((2, 9)));
    // at the most cards proposed, 5 ms: only the SLO helps. One sequence steps in 9.375 ms of
    // weights + 1.14 ms of its KV heads (one core each, whatever the cards) + 0.04 ms of state;
    // at 50 ms each sequence adds 0.029 ms of KV and 0.039 of state: (50 - 9.375) / 0.068 = 597
    let mut eight = one.clone();
    eight.tp = MAX_TP;
    eight.tpot_slo_seconds = 0.005;
    let r = eight.fits_with(3000, 800).unwrap();
    assert_eq!(
        r.describe(Spelling::Flags),
        "one sequence takes 10.56 ms a step, over the 5 ms TPOT SLO; it fits with --tpot-slo-ms \
         50 (safe batch 597, bound: HBM bandwidth (TPOT SLO)) (no tp up to 8 holds 5 ms)"
    );
    // a card too small for the weights at any proposed count
    let mut tiny = one.clone();
    tiny.hardware.hbm_bytes = 4_000_000_000;
    assert_eq!(
        tiny.fits_with(3000, 800)
            .unwrap()
            .describe(Spelling::Config),
        "a 3000+800-token sequence pins 405602304 B, more than the 0 B cache budget; no tp up to \
         8 fits it"
    );
}

#[test]
fn a_backend_with_no_safe_batch_is_refused_with_what_fits() {
    let one = derive_backend(&qwen(128, StateDtype::Fp32), Workload::default());
    assert_eq!(
        one.refusal().unwrap(),
        format!(
            "no batch of the declared workload (3000 + 800 tokens) is safe (bound: HBM bandwidth \
             (TPOT SLO)): one sequence takes 76.46 ms a step, over the 50 ms TPOT SLO; it fits \
             with tpot_slo_ms = 100 (safe batch 19, bound: memory capacity (KV + state)) or tp = \
             2 (safe batch 45, bound: HBM bandwidth (TPOT SLO)). The derivation: {}",
            one.explanation
        )
    );
    assert_eq!(
        derive_backend(&qwen_tp2(), Workload::default()).refusal(),
        None
    );
}

fn arb_inputs() -> impl Strategy<Value = CapacityInputs> {
    (
        prop::sample::select(vec!["910b1", "910b3", "910b4", "atlas-300i-duo"]),
        prop::sample::select(vec!["qwen3.5-27b", "qwen3-32b", "qwen3-8b"]),
        prop::sample::select(vec![StateDtype::Fp32, StateDtype::Bf16]),
        1u32..=8,
        prop::sample::select(vec![0u64, 1, 16, 128]),
        prop::option::of(0.05f64..1.0),
        10.0f64..200.0,
        prop::sample::select(vec![WeightPrecision::Bf16, WeightPrecision::W8a8]),
        0u32..=4,
        0.0f64..=1.0,
    )
        .prop_map(
            |(hw, model, dtype, tp, block, uniform, slo_ms, weights, draft_tokens, acceptance)| {
                let mut inputs =
                    CapacityInputs::from_names(hw, model, dtype, &ProfileOverrides::default())
                        .unwrap();
                inputs.tp = tp;
                inputs.block_tokens = block;
                // none: the fitted efficiency
                inputs.efficiency = EfficiencyOverrides {
                    uniform,
                    ..EfficiencyOverrides::default()
                }
                .resolve();
                inputs.tpot_slo_seconds = slo_ms / 1e3;
                inputs.model = inputs.model.clone().with_weights(weights);
                inputs.speculation = Speculation {
                    draft_tokens,
                    acceptance,
                };
                inputs
            },
        )
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
    fn tpot_never_falls_with_batch(inputs in arb_inputs(), batch in 0u64..4_096, ctx in 1.0f64..100_000.0) {
        prop_assert!(inputs.tpot_seconds(batch + 1, ctx) >= inputs.tpot_seconds(batch, ctx));
    }

    #[test]
    fn acceptance_speeds_tokens_but_not_steps_nor_frees_cache(
        inputs in arb_inputs(),
        more in 0.0f64..=1.0,
        batch in 0u64..4_096,
        ctx in 1.0f64..100_000.0,
        input in 0u64..40_000,
        output in 0u64..8_000,
    ) {
        let mut better = inputs.clone();
        better.speculation.acceptance = inputs.speculation.acceptance.max(more);
        prop_assert!(better.tpot_seconds(batch, ctx) <= inputs.tpot_seconds(batch, ctx));
        prop_assert_eq!(better.decode_step_seconds(batch, ctx), inputs.decode_step_seconds(batch, ctx));
        prop_assert_eq!(better.footprint_bytes(input, output), inputs.footprint_bytes(input, output));
    }

    #[test]
    fn a_draft_token_more_never_shrinks_a_step_nor_a_footprint(
        inputs in arb_inputs(),
        batch in 0u64..4_096,
        ctx in 1.0f64..100_000.0,
        input in 0u64..40_000,
        output in 0u64..8_000,
    ) {
        let mut more = inputs.clone();
        more.speculation.draft_tokens += 1;
        prop_assert!(more.decode_step_seconds(batch, ctx) >= inputs.decode_step_seconds(batch, ctx));
        prop_assert!(more.footprint_bytes(input, output) >= inputs.footprint_bytes(input, output));
    }

    #[test]
    fn efficiency_never_makes_anything_faster(
        inputs in arb_inputs(),
        batch in 0u64..4_096,
        ctx in 1.0f64..100_000.0,
        prompt in 0u64..40_000,
    ) {
        let ideal = inputs.with_efficiency(Efficiency::IDEAL);
        prop_assert!(inputs.tpot_seconds(batch, ctx) >= ideal.tpot_seconds(batch, ctx));
        prop_assert!(inputs.prefill_seconds(prompt) >= ideal.prefill_seconds(prompt));
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
        prop_assert!(inputs.tpot_seconds(b + 1, ctx) > slo);
        prop_assert!(b == 0 || inputs.tpot_seconds(b, ctx) <= slo);
    }

    #[test]
    fn the_slo_held_gives_a_batch_and_the_multiple_below_it_none(
        inputs in arb_inputs(),
        input in 1u64..40_000,
        output in 1u64..8_000,
    ) {
        let at = |seconds: f64| CapacityInputs { tpot_slo_seconds: seconds, ..inputs.clone() }
            .safe_batch(input, output)
            .batch;
        match inputs.tpot_slo_held(input, output) {
            Some(held) => {
                prop_assert!(at(held) >= 1);
                let multiple = (held / DEFAULT_TPOT_SLO_SECONDS).round();
                prop_assert!(multiple >= 1.0);
                prop_assert!(multiple == 1.0 || at((multiple - 1.0) * DEFAULT_TPOT_SLO_SECONDS) == 0);
            }
            None => prop_assert_eq!(inputs.max_batch_memory(input, output), 0),
        }
        // every remedy proposed gives the batch it says
        if let Some(r) = inputs.fits_with(input, output) {
            for remedy in r.tpot_slo.iter().chain(&r.tp) {
                let changed = CapacityInputs {
                    tp: remedy.tp,
                    tpot_slo_seconds: remedy.tpot_slo_ms / 1e3,
                    ..inputs.clone()
                };
                prop_assert_eq!(changed.safe_batch(input, output).batch, remedy.safe_batch);
                prop_assert!(remedy.safe_batch >= 1);
            }
        }
    }

    #[test]
    fn block_one_is_the_unblocked_figure(
        inputs in arb_inputs(),
        input in 0u64..40_000,
        output in 0u64..8_000,
    ) {
        let mut exact = inputs.clone();
        exact.block_tokens = 1;
        let (m, s) = (&exact.model, exact.speculation);
        let unblocked = (input + output + s.lookahead_tokens()) * m.kv_bytes_per_token
            + s.state_copies() * m.state_bytes_per_sequence;
        prop_assert_eq!(exact.footprint_bytes(input, output), unblocked);
        prop_assert_eq!(exact.max_batch_memory(input, output), exact.kv_budget_bytes() / unblocked);
        // blocks only ever round up, by less than one block
        let blocked = inputs.footprint_bytes(input, output);
        prop_assert!(blocked >= unblocked);
        prop_assert!(blocked - unblocked < inputs.block_tokens.max(1) * m.kv_bytes_per_token);
    }
}
