//! Capacity room: the model set against published measurements. Every published decode TPOT
//! of Qwen3-32B (bf16) on 910B cards found so far, with its source and setup, the model's
//! prediction for the same deployment and workload, the pure roofline's, and the error. The
//! table in docs/capacity.md is [`validation_markdown`]'s output, and a test keeps the two
//! equal, so a change to the model shows up as a changed table.

use super::error::CapacityError;
use super::profile::{ProfileOverrides, StateDtype};
use super::roofline::{CapacityInputs, Efficiency};
use serde::Serialize;
use std::fmt::Write as _;

/// One published measurement of a decode TPOT.
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
    /// Cards per replica.
    pub tp: u32,
    /// Prompt tokens per request.
    pub input: u64,
    /// Output tokens per request (0 where the source gives only the context).
    pub output: u64,
    /// Concurrent sequences per replica.
    pub batch: u64,
    /// Measured mean TPOT, ms.
    pub measured_tpot_ms: f64,
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
        tp: 4,
        input,
        output,
        batch,
        measured_tpot_ms,
    }
}

const SUFFIX_TUTORIAL_SETUP: &str = "vLLM-ascend (Feb. 2026), default graph mode, Atlas 800T A2";

/// Qwen3-32B bf16 at TP4 on 910B (Atlas A2) cards, as published.
pub const PUBLISHED: [Published; 9] = [
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
];

/// One published measurement with the model's predictions for it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ValidationRow {
    /// The measurement.
    pub published: Published,
    /// Predicted TPOT with the fitted efficiency (what `tokengate capacity --json` reports as
    /// `tpot_ms`), ms.
    pub predicted_tpot_ms: f64,
    /// The pure roofline's TPOT (`--efficiency 1`), ms.
    pub ideal_tpot_ms: f64,
    /// (predicted / measured - 1) x 100.
    pub error_percent: f64,
}

/// The model's predictions for every row of [`PUBLISHED`], with the default profiles and the
/// fitted efficiency.
pub fn validation_table() -> Result<Vec<ValidationRow>, CapacityError> {
    PUBLISHED
        .iter()
        .map(|p| {
            let mut inputs = CapacityInputs::from_names(
                p.hardware,
                p.model,
                StateDtype::Fp32,
                &ProfileOverrides::default(),
            )?;
            inputs.tp = p.tp;
            let predicted = inputs.report(p.input, p.output, Some(p.batch), None);
            let ideal = inputs.with_efficiency(Efficiency::IDEAL).report(
                p.input,
                p.output,
                Some(p.batch),
                None,
            );
            Ok(ValidationRow {
                published: *p,
                predicted_tpot_ms: predicted.tpot_ms,
                ideal_tpot_ms: ideal.tpot_ms,
                error_percent: (predicted.tpot_ms / p.measured_tpot_ms - 1.0) * 100.0,
            })
        })
        .collect()
}

/// The table as docs/capacity.md shows it (Markdown).
pub fn validation_markdown(rows: &[ValidationRow]) -> String {
    let mut s = String::from(
        "| source | setup | TP | in / out | batch | measured TPOT | predicted | error | ideal (`--efficiency 1`) |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let p = &r.published;
        let fitted = if p.fitted_setup { "" } else { " (other setup)" };
        // writing to a String cannot fail
        let _ = writeln!(
            s,
            "| {} | {}{fitted} | {} | {} / {} | {} | {:.2} ms | {:.2} ms | {:+.0}% | {:.2} ms |",
            p.source,
            p.setup,
            p.tp,
            p.input,
            p.output,
            p.batch,
            p.measured_tpot_ms,
            r.predicted_tpot_ms,
            r.error_percent,
            r.ideal_tpot_ms,
        );
    }
    s
}
