//! Capacity room: the seed article's four-scenario capacity table set beside what its own
//! formula and the roofline give, with one line per scenario on why they differ.

use super::roofline::{Bottleneck, CapacityInputs};
use super::seed::{estimate_llm_performance_v3, SeedInputs, SEED_KV_BYTES_PER_TOKEN};
use super::CapacityError;
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

/// One scenario: the article's figure, its formula's, and the roofline's.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScenarioRow {
    /// The article's row.
    pub scenario: Scenario,
    /// `max_bs_by_memory` of `estimate_llm_performance_v3`.
    pub seed_safe_batch: u64,
    /// `estimated_qps` of the script run at that batch (the article's own derivation chain).
    pub seed_qps: f64,
    /// Roofline memory ceiling.
    pub roofline_max_batch_memory: u64,
    /// Roofline safe batch.
    pub roofline_safe_batch: u64,
    /// Roofline TPOT at the safe batch, ms.
    pub roofline_tpot_ms: f64,
    /// Roofline sustained requests/s at the safe batch.
    pub roofline_qps: f64,
    /// What binds the roofline's safe batch.
    pub roofline_bottleneck: Bottleneck,
    /// Why the three differ, in one line.
    pub why: String,
}

/// The table for `inputs` (its hardware, model, block size, state dtype and efficiency); the
/// seed columns run the script on the same hardware and parameter count.
pub fn scenario_table(
    inputs: &CapacityInputs,
    seed: &SeedInputs,
) -> Result<Vec<ScenarioRow>, CapacityError> {
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
            let r = inputs.report(s.input, s.output, None, None);
            let why = format!(
                "seed counts only {out} output tokens x {skv} B = {seed_mb:.1} MB per sequence \
                 and its TPS grows with batch squared; the roofline pins {in}+{out} tokens in \
                 {block}-token blocks x {kv} B + {state:.1} MB state = {fp:.1} MB of {budget:.2} \
                 GB, and every step reads all weights and resident cache; the article's \
                 {article} matches neither",
                out = s.output,
                in = s.input,
                skv = SEED_KV_BYTES_PER_TOKEN,
                seed_mb = (SEED_KV_BYTES_PER_TOKEN * s.output) as f64 / 1e6,
                block = inputs.block_tokens.max(1),
                kv = r.kv_bytes_per_token,
                state = r.state_bytes_per_sequence as f64 / 1e6,
                fp = r.footprint_bytes_per_sequence as f64 / 1e6,
                budget = r.kv_budget_bytes as f64 / 1e9,
                article = s.article_safe_batch,
            );
            Ok(ScenarioRow {
                scenario: *s,
                seed_safe_batch: seed_bs,
                seed_qps,
                roofline_max_batch_memory: r.max_batch_memory,
                roofline_safe_batch: r.safe_batch,
                roofline_tpot_ms: r.tpot_ms,
                roofline_qps: r.qps,
                roofline_bottleneck: r.bottleneck,
                why,
            })
        })
        .collect()
}
