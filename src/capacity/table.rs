//! Capacity room: the seed article's four-scenario capacity table set beside what its own
//! formula, the pure roofline and the roofline with achieved efficiency give, with one line per
//! scenario on why they differ.

use super::error::CapacityError;
use super::roofline::{Bottleneck, CapacityInputs, Efficiency};
use super::seed::{estimate_llm_performance_v3, SeedInputs, SEED_KV_BYTES_PER_TOKEN};
use serde::Serialize;

/// One row of the article's table, as printed there.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Scenario {
    /// Scenario name.
    pub name: &'static str,
    /// Mean prompt tokens.
    pub input: u64,
    /// Mean output tokens.
    pub output: u64,
    /// The article's "单卡最大安全BS".
    pub article_safe_batch: u64,
    /// The article's "单卡可支撑QPS".
    pub article_qps: f64,
    /// The article's "首要瓶颈".
    pub article_bottleneck: &'static str,
}

/// The article's table (910B3, Qwen3.5-27B, efficiency 0.45).
pub const SCENARIOS: [Scenario; 4] = [
    Scenario {
        name: "chat",
        input: 200,
        output: 150,
        article_safe_batch: 48,
        article_qps: 38.0,
        article_bottleneck: "Decode带宽 + KV Cache容量",
    },
    Scenario {
        name: "rag",
        input: 3000,
        output: 800,
        article_safe_batch: 6,
        article_qps: 3.0,
        article_bottleneck: "Prefill算力 + KV Cache容量",
    },
    Scenario {
        name: "code",
        input: 1500,
        output: 300,
        article_safe_batch: 18,
        article_qps: 13.0,
        article_bottleneck: "Decode带宽",
    },
    Scenario {
        name: "summary",
        input: 6000,
        output: 1200,
        article_safe_batch: 4,
        article_qps: 1.5,
        article_bottleneck: "KV Cache容量（极端受限）",
    },
];

/// What one roofline says about a scenario.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ScenarioFigures {
    /// Sequences that fit in the cache.
    pub max_batch_memory: u64,
    /// Largest batch meeting the TPOT target.
    pub max_batch_sla: u64,
    /// min(memory, SLA, engine cap).
    pub safe_batch: u64,
    /// What binds it.
    pub bottleneck: Bottleneck,
    /// TPOT at the safe batch (at batch 1 when no batch is safe), ms.
    pub tpot_ms: f64,
    /// Sustained requests/s at the safe batch.
    pub qps: f64,
}

impl ScenarioFigures {
    fn of(inputs: &CapacityInputs, s: &Scenario) -> Self {
        let r = inputs.report(s.input, s.output, None, None);
        let tpot_ms = if r.safe_batch == 0 {
            inputs.report(s.input, s.output, Some(1), None).tpot_ms
        } else {
            r.tpot_ms
        };
        ScenarioFigures {
            max_batch_memory: r.max_batch_memory,
            max_batch_sla: r.max_batch_sla,
            safe_batch: r.safe_batch,
            bottleneck: r.bottleneck,
            tpot_ms,
            qps: r.qps,
        }
    }
}

/// One scenario: the article's figure, its formula's, the ideal roofline's and the expected.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScenarioRow {
    /// The article's row.
    pub scenario: Scenario,
    /// `max_bs_by_memory` of `estimate_llm_performance_v3`.
    pub seed_safe_batch: u64,
    /// `estimated_qps` of the script run at that batch (the article's own derivation chain).
    pub seed_qps: f64,
    /// The pure roofline (efficiency 1) on the same card.
    pub ideal: ScenarioFigures,
    /// The roofline with the inputs' efficiency: what the card is expected to do.
    pub expected: ScenarioFigures,
    /// Why they differ, in one line.
    pub why: String,
}

/// The table for `inputs` (its hardware, model, block size, state dtype and efficiency); the
/// seed columns run the script with `seed`'s hardware and parameter count.
pub fn scenario_table(
    inputs: &CapacityInputs,
    seed: &SeedInputs,
) -> Result<Vec<ScenarioRow>, CapacityError> {
    let ideal_inputs = inputs.with_efficiency(Efficiency::IDEAL);
    SCENARIOS
        .iter()
        .map(|s| {
            let seed_inputs = SeedInputs {
                avg_input_len: s.input,
                avg_output_len: s.output,
                ..*seed
            };
            let seed_bs = estimate_llm_performance_v3(&seed_inputs)?.max_bs_by_memory;
            let seed_qps = estimate_llm_performance_v3(&SeedInputs {
                batch_size: seed_bs,
                ..seed_inputs
            })?
            .estimated_qps;
            let ideal = ScenarioFigures::of(&ideal_inputs, s);
            let expected = ScenarioFigures::of(inputs, s);
            let r = inputs.report(s.input, s.output, Some(1), None);
            let why = format!(
                "seed counts only {out} output tokens x {skv} B = {seed_mb:.1} MB per sequence \
                 and its TPS grows with batch squared; the roofline pins {in}+{out} tokens in \
                 {block}-token blocks x {kv} B + {state:.1} MB state = {fp:.1} MB of {budget:.2} \
                 GB, and every step streams all weights ({ideal_w:.1} ms at peak, {w:.1} ms as \
                 achieved) and the resident cache; ideal bound: {ib}, expected bound: {eb}; the \
                 article's {article} matches none",
                out = s.output,
                in = s.input,
                skv = SEED_KV_BYTES_PER_TOKEN,
                seed_mb = (SEED_KV_BYTES_PER_TOKEN * s.output) as f64 / 1e6,
                block = inputs.block_tokens.max(1),
                kv = r.kv_bytes_per_token,
                state = r.state_bytes_per_sequence as f64 / 1e6,
                fp = r.footprint_bytes_per_sequence as f64 / 1e6,
                budget = r.kv_budget_bytes as f64 / 1e9,
                ideal_w = ideal_inputs.decode_step_terms(0, 0.0).weights_seconds * 1e3,
                w = r.weight_read_ms,
                ib = ideal.bottleneck.label(),
                eb = expected.bottleneck.label(),
                article = s.article_safe_batch,
            );
            Ok(ScenarioRow {
                scenario: *s,
                seed_safe_batch: seed_bs,
                seed_qps,
                ideal,
                expected,
                why,
            })
        })
        .collect()
}
