//! Capacity room: the model set against published measurements. Every published decode TPOT
//! of Qwen3-32B (bf16) on 910B cards found so far, and the output throughput of vLLM-ascend's
//! W8A8 CI baselines (Qwen3-32B; Qwen3.5-27B with MTP, the recipe's), each with its source and
//! setup, the model's prediction for the same deployment and workload, the pure roofline's,
//! and the error. The table in docs/capacity.md is [`validation_markdown`]'s output, and a test
//! keeps the two equal, so a change to the model shows up as a changed table.

use super::error::CapacityError;
use super::profile::{ProfileOverrides, StateDtype, WeightPrecision};
use super::roofline::{CapacityInputs, Efficiency, RooflineReport};
use super::speculation::Speculation;
use serde::Serialize;
use std::fmt::Write as _;

/// What a measurement measured.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Measured {
    /// Mean TPOT, ms.
    TpotMs(f64),
    /// Output tokens/s of the whole run (prefill and decode sharing the cards), as the
    /// benchmark reports it.
    OutputTokensPerSecond(f64),
}

impl Measured {
    /// The figure.
    pub fn value(self) -> f64 {
        match self {
            Measured::TpotMs(v) | Measured::OutputTokensPerSecond(v) => v,
        }
    }

    /// The same quantity in a report: its TPOT, or its sustained decode tokens/s.
    fn of(self, report: &RooflineReport) -> f64 {
        match self {
            Measured::TpotMs(_) => report.tpot_ms,
            Measured::OutputTokensPerSecond(_) => report.sustained_decode_tps,
        }
    }

    /// `v` in this quantity's unit: `34.05 ms`, `660.3 tok/s`.
    fn show(self, v: f64) -> String {
        match self {
            Measured::TpotMs(_) => format!("{v:.2} ms"),
            Measured::OutputTokensPerSecond(_) => format!("{v:.1} tok/s"),
        }
    }
}

/// One published measurement: a decode TPOT or an output throughput.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Published {
    /// Where it was published (repository, pull request / issue / document).
    pub source: &'static str,
    /// Engine, build and mode it was measured with.
    pub setup: &'static str,
    /// Whether the setup is the one the fitted efficiency describes (a current vLLM-ascend or
    /// MindIE build with its decode graph): rows outside it show how far other setups are.
    pub fitted_setup: bool,
    /// Hardware profile of the cards.
    pub hardware: &'static str,
    /// Model profile.
    pub model: &'static str,
    /// Precision of the weights.
    pub weights: WeightPrecision,
    /// Draft tokens per step of speculative decoding (0: none); their acceptance is the
    /// default, [`Speculation::DEFAULT_ACCEPTANCE`] (none is published).
    pub speculative_tokens: u32,
    /// Cards per replica.
    pub tp: u32,
    /// Prompt tokens per request.
    pub input: u64,
    /// Output tokens per request (0 where the source gives only the context).
    pub output: u64,
    /// Concurrent sequences per replica.
    pub batch: u64,
    /// What was measured.
    pub measured: Measured,
}

/// A Qwen3-32B bf16 row at TP4 on 910B (Atlas A2) cards.
const fn qwen3_32b_tp4(
    source: &'static str,
    setup: &'static str,
    fitted_setup: bool,
    (input, output): (u64, u64),
    batch: u64,
    measured_tpot_ms: f64,
) -> Published {
    Published {
        source,
        setup,
        fitted_setup,
        hardware: "910b3",
        model: "qwen3-32b",
        weights: WeightPrecision::Bf16,
        speculative_tokens: 0,
        tp: 4,
        input,
        output,
        batch,
        measured: Measured::TpotMs(measured_tpot_ms),
    }
}

const SUFFIX_TUTORIAL_SETUP: &str = "vLLM-ascend (Feb. 2026), default graph mode, Atlas 800T A2";

/// Qwen3-32B bf16 at TP4 on 910B (Atlas A2) cards, then vLLM-ascend's W8A8 CI baselines on
/// Atlas A2, as published.
pub const PUBLISHED: [Published; 11] = [
    qwen3_32b_tp4(
        "vLLM-ascend PR 11266 (commit 070825300e)",
        "vLLM-ascend on vLLM 0.24, full decode graph",
        true,
        (16_384, 2_048),
        8,
        34.05,
    ),
    qwen3_32b_tp4(
        "vLLM-ascend issue 4167",
        "vLLM-ascend 0.9.1, full graph",
        true,
        (1_024, 0),
        1,
        20.5,
    ),
    qwen3_32b_tp4(
        "vLLM-ascend issue 4167",
        "vLLM-ascend 0.11",
        true,
        (1_024, 0),
        1,
        27.0,
    ),
    qwen3_32b_tp4(
        "vLLM-ascend issue 4656",
        "vLLM-ascend 0.11.0rc2, FULL_DECODE_ONLY",
        true,
        (15_000, 0),
        1,
        38.0,
    ),
    qwen3_32b_tp4(
        "vLLM-ascend PR 2783",
        "vLLM-ascend (Sept. 2025), eager mode, async scheduling",
        false,
        (2_048, 2_048),
        48,
        41.73,
    ),
    qwen3_32b_tp4(
        "vLLM-ascend PR 1811",
        "vLLM-ascend 0.9.2rc1, eager mode",
        false,
        (1_024, 1_024),
        128,
        146.17,
    ),
    qwen3_32b_tp4(
        "vLLM-ascend suffix decoding tutorial, ARC baseline",
        SUFFIX_TUTORIAL_SETUP,
        false,
        (76, 960),
        1,
        52.8,
    ),
    qwen3_32b_tp4(
        "vLLM-ascend suffix decoding tutorial, GSM8K baseline",
        SUFFIX_TUTORIAL_SETUP,
        false,
        (67, 1_570),
        26,
        63.9,
    ),
    qwen3_32b_tp4(
        "vLLM-ascend suffix decoding tutorial, AGIEval baseline",
        SUFFIX_TUTORIAL_SETUP,
        false,
        (735, 1_880),
        34,
        70.0,
    ),
    // aisbench, GSM8K prompts of 3,500 tokens, 1,500 output tokens each (its performance
    // runs set ignore_eos), 288 requests 72 at a time; the same baseline for the full-graph
    // and the eager case
    Published {
        source: "vLLM-ascend CI baseline Qwen3-32B-Int8-A2.yaml",
        setup: "vLLM-ascend nightly (Aug. 2026), W8A8, full decode graph, no prefix caching",
        fitted_setup: false,
        hardware: "910b3",
        model: "qwen3-32b",
        weights: WeightPrecision::W8a8,
        speculative_tokens: 0,
        tp: 4,
        input: 3_500,
        output: 1_500,
        batch: 72,
        measured: Measured::OutputTokensPerSecond(1_065.179),
    },
    // the same benchmark, 128 requests 32 at a time; the baseline of commit 67b1ac5e7a (PR
    // 14553), earlier ones 604 to 687
    Published {
        source: "vLLM-ascend CI baseline Qwen3.5-27B-w8a8-A2.yaml",
        setup: "vLLM-ascend nightly (Aug. 2026), W8A8, MTP 3 draft tokens (drafter eager), full decode graph",
        fitted_setup: false,
        hardware: "910b3",
        model: "qwen3.5-27b",
        weights: WeightPrecision::W8a8,
        speculative_tokens: 3,
        tp: 2,
        input: 3_500,
        output: 1_500,
        batch: 32,
        measured: Measured::OutputTokensPerSecond(660.296),
    },
];

/// One published measurement with the model's predictions for it, in its unit.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ValidationRow {
    /// The measurement.
    pub published: Published,
    /// Predicted with the fitted efficiency: the TPOT (what `tokengate capacity --json`
    /// reports as `tpot_ms`) or the output throughput (`sustained_decode_tps`).
    pub predicted: f64,
    /// The pure roofline's (`--efficiency 1`).
    pub ideal: f64,
    /// (predicted / measured - 1) x 100.
    pub error_percent: f64,
}

/// The model's predictions for every row of [`PUBLISHED`], with the default profiles and the
/// fitted efficiency.
pub fn validation_table() -> Result<Vec<ValidationRow>, CapacityError> {
    PUBLISHED
        .iter()
        .map(|p| {
            let mut inputs = CapacityInputs::from_names_with_weights(
                p.hardware,
                p.model,
                StateDtype::Fp32,
                p.weights,
                &ProfileOverrides::default(),
            )?;
            inputs.tp = p.tp;
            inputs.speculation = Speculation {
                draft_tokens: p.speculative_tokens,
                ..Speculation::NONE
            };
            let predicted = inputs.report(p.input, p.output, Some(p.batch), None);
            let ideal = inputs.with_efficiency(Efficiency::IDEAL).report(
                p.input,
                p.output,
                Some(p.batch),
                None,
            );
            let predicted = p.measured.of(&predicted);
            Ok(ValidationRow {
                published: *p,
                predicted,
                ideal: p.measured.of(&ideal),
                error_percent: (predicted / p.measured.value() - 1.0) * 100.0,
            })
        })
        .collect()
}

/// The table as docs/capacity.md shows it (Markdown).
pub fn validation_markdown(rows: &[ValidationRow]) -> String {
    let mut s = String::from(
        "| source | setup | TP | in / out | batch | measured | predicted | error | ideal (`--efficiency 1`) |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let p = &r.published;
        let fitted = if p.fitted_setup { "" } else { " (other setup)" };
        let m = p.measured;
        // writing to a String cannot fail
        let _ = writeln!(
            s,
            "| {} | {}{fitted} | {} | {} / {} | {} | {} | {} | {:+.0}% | {} |",
            p.source,
            p.setup,
            p.tp,
            p.input,
            p.output,
            p.batch,
            m.show(m.value()),
            m.show(r.predicted),
            r.error_percent,
            m.show(r.ideal),
        );
    }
    s
}
